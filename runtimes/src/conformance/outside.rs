//! What a run of the network group needs on the host: a subnet no other run uses, and a
//! stand-in for the internet (a namespace on a veth of the run's own, with a listener).

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::fcntl::{Flock, FlockArg};
use nix::sched::{setns, CloneFlags};

use crate::network::{netns, Subnet};

/// A /24 held for as long as this lives (a lock file under the system's temporary directory):
/// parallel test processes, each with a daemon of its own, never share one.
pub struct SubnetLease {
    pub subnet: Subnet,
    _lock: Flock<File>,
}

/// Whether the host routes anything inside 10.`a`.`b`.0/24 (or the whole of it).
fn routed(a: u8, b: u8) -> bool {
    let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let ours: Subnet = match format!("10.{a}.{b}.0/24").parse() {
        Ok(s) => s,
        Err(_) => return true,
    };
    routes.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let parse = |i: usize| {
            fields
                .get(i)
                .and_then(|f| u32::from_str_radix(f, 16).ok())
                .map(|v| Ipv4Addr::from(v.swap_bytes()))
        };
        match (parse(1), parse(7)) {
            (Some(dest), Some(mask)) if u32::from(mask) != 0 => {
                ours.contains(dest)
                    || (u32::from(ours.gateway()) & u32::from(mask)) == u32::from(dest)
            }
            _ => false,
        }
    })
}

/// Leases a free /24 in 10.160.0.0/11, starting from one that depends on the process.
pub fn lease_subnet() -> io::Result<SubnetLease> {
    let dir = std::env::temp_dir().join("narya-test-subnets");
    std::fs::create_dir_all(&dir)?;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(37) + NEXT.fetch_add(1, Ordering::Relaxed) * 7;
    for i in 0..8192u32 {
        let n = (start + i) % 8192;
        let (a, b) = (160 + (n / 256) as u8, (n % 256) as u8);
        let file = File::create(dir.join(format!("10.{a}.{b}.0")))?;
        let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        if routed(a, b) {
            continue;
        }
        if let Ok(subnet) = format!("10.{a}.{b}.0/24").parse() {
            return Ok(SubnetLease {
                subnet,
                _lock: lock,
            });
        }
    }
    Err(io::Error::other("no free /24 left in 10.160.0.0/11"))
}

/// A stand-in for the internet: a network namespace on a veth pair of its own, addressed from
/// 198.18.0.0/15 (the benchmarking range), with a TCP listener in it. Removed on drop.
pub struct Outside {
    /// The listener, reachable from the host's routing (and so from isolated machines).
    pub addr: SocketAddr,
    /// The address on the host's end of the veth: an address of the host itself.
    pub host_addr: Ipv4Addr,
    namespace: PathBuf,
    host_end: String,
    _listener: TcpListener,
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Outside {
    /// Makes the namespace (its file under `dir`), the veth and the listener.
    pub fn start(dir: &Path) -> io::Result<Outside> {
        Outside::start_in(dir, Ipv4Addr::new(198, 18, 0, 0), 32768)
    }

    /// A stand-in for a link-local service such as a cloud's metadata server: the same, on a
    /// /30 in 169.254.100.0–169.254.163.255 (clear of 169.254.169.254 itself).
    pub fn start_link_local(dir: &Path) -> io::Result<Outside> {
        Outside::start_in(dir, Ipv4Addr::new(169, 254, 100, 0), 4096)
    }

    /// `start` on one of `slots` /30 networks from `first`, chosen by process and call.
    fn start_in(dir: &Path, first: Ipv4Addr, slots: u32) -> io::Result<Outside> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let index = (pid.wrapping_mul(8) + n) % slots;
        let base = u32::from(first) + index * 4;
        let (host_addr, inner_addr) = (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2));
        let tag = format!("{:x}", pid * 16 + n % 16);
        let host_end = format!("nyo{tag}");
        let inner_end = format!("nyi{tag}");
        let namespace = dir.join(format!("outside-{pid}-{n}"));
        netns::create(&namespace)?;
        let mut outside = Outside {
            addr: SocketAddr::from((inner_addr, 0)),
            host_addr,
            namespace: namespace.clone(),
            host_end: host_end.clone(),
            _listener: TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?,
        };
        ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", &inner_end,
        ])?;
        ip(&[
            "link",
            "set",
            &inner_end,
            "netns",
            &namespace.display().to_string(),
        ])?;
        ip(&["addr", "add", &format!("{host_addr}/30"), "dev", &host_end])?;
        ip(&["link", "set", &host_end, "up"])?;
        let ns = File::open(&namespace)?;
        let inner_end2 = inner_end.clone();
        let listener = std::thread::spawn(move || -> io::Result<TcpListener> {
            setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)?;
            // Processes this thread starts, and sockets it opens, are in the namespace.
            ip(&[
                "addr",
                "add",
                &format!("{inner_addr}/30"),
                "dev",
                &inner_end2,
            ])?;
            ip(&["link", "set", &inner_end2, "up"])?;
            ip(&["link", "set", "lo", "up"])?;
            TcpListener::bind((inner_addr, 0))
        })
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))??;
        outside.addr = listener.local_addr()?;
        outside._listener = listener;
        Ok(outside)
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        // Deleting one end of the pair deletes the other.
        let _ = ip(&["link", "del", &self.host_end]);
        let _ = netns::remove(&self.namespace);
    }
}
