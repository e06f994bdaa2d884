//! `network = "isolated"`: each machine in a network namespace of its own, routed through the
//! host. Outbound connections work (masqueraded); the host's own addresses, other machines and
//! link-local addresses (169.254.0.0/16, cloud metadata) are unreachable, by rules in chains this
//! daemon owns (`NARYA-IN-<tag>`, `NARYA-FWD-<tag>`, `NARYA-NAT-<tag>`). Nothing else of the host's
//! firewall is touched but the one jump into each chain.
//!
//! On containerd the daemon makes the namespace (a bind mount under its run directory) and wires
//! it with the CNI plugins (`ptp` + `host-local`, `loopback`); on Docker the engine makes it and
//! attaches it to a bridge network the daemon creates (`narya-<tag>`).

mod cni;
mod firewall;
pub(crate) mod netns;
mod overlap;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::{ErrorKind, Result, RuntimeError};

pub use cni::Leftovers;
pub use firewall::remove_now as remove_chains_of;

/// An IPv4 network, `a.b.c.d/n`, host bits zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subnet {
    network: Ipv4Addr,
    prefix: u8,
}

impl Subnet {
    /// The first host address: the machines' gateway.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + 1)
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - u32::from(self.prefix));
        u32::from(ip) & mask == u32::from(self.network)
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl FromStr for Subnet {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Subnet, String> {
        let (address, prefix) = s
            .split_once('/')
            .ok_or_else(|| format!("subnet {s:?} is not an IPv4 network like 10.89.0.0/16"))?;
        let network: Ipv4Addr = address
            .parse()
            .map_err(|_| format!("subnet {s:?}: {address:?} is not an IPv4 address"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| (8..=28).contains(p))
            .ok_or_else(|| format!("subnet {s:?}: the prefix length must be 8 to 28"))?;
        let subnet = Subnet { network, prefix };
        if !subnet.contains(network) || u32::from(network) & !(u32::MAX << (32 - prefix)) != 0 {
            return Err(format!("subnet {s:?} has host bits set"));
        }
        Ok(subnet)
    }
}

/// What isolated networking needs, as configured (`[network]`).
#[derive(Clone, Debug)]
pub struct NetworkConfig {
    /// Tells this daemon's chains, network, bridge and files from any other daemon's on the
    /// host: 1 to 8 of `[a-z0-9]`, stable across restarts of one installation ([`tag_for`]).
    pub tag: String,
    /// Addresses of machines; must not overlap a network the host already routes.
    pub subnet: Subnet,
    /// Resolvers written into machines' `/etc/resolv.conf`; empty: none (said at start).
    pub dns: Vec<IpAddr>,
    /// Where the CNI plugins are looked for, in order (containerd).
    pub cni_bin_dirs: Vec<PathBuf>,
    /// A private directory for namespaces, IPAM reservations and the resolver file.
    pub run_dir: PathBuf,
}

/// A stable tag for an installation, from something unique to it (its state directory): eight
/// hex digits of a 32-bit FNV-1a hash.
pub fn tag_for(seed: &str) -> String {
    let hash = seed.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("{hash:08x}")
}

/// The resolvers a `resolv.conf` names that work from another namespace: all but loopback ones.
pub fn non_loopback_resolvers(resolv_conf: &str) -> Vec<IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next())?
        })
        .filter_map(|word| word.parse::<IpAddr>().ok())
        .filter(|ip| !ip.is_loopback())
        .collect()
}

/// The contents of machines' `/etc/resolv.conf`.
pub fn resolv_conf(dns: &[IpAddr]) -> String {
    if dns.is_empty() {
        return "# naryad: no resolver configured ([network] dns) and the host names only \
                loopback ones, which a machine cannot reach\n"
            .to_owned();
    }
    dns.iter().map(|ip| format!("nameserver {ip}\n")).collect()
}

fn other(what: String, e: impl Into<crate::Cause>) -> RuntimeError {
    RuntimeError::caused(ErrorKind::Other, what, e)
}

/// Isolated networking of one daemon: its firewall chains, and on containerd its namespaces.
pub struct Isolation {
    config: NetworkConfig,
    /// Whether the chains were put in place by this process.
    firewall: tokio::sync::Mutex<bool>,
}

impl Isolation {
    /// Checks the configuration and prepares the run directory; touches nothing of the host's
    /// network yet (the chains are put in place at the first isolated machine).
    pub fn new(config: NetworkConfig) -> Result<Isolation> {
        if config.tag.is_empty()
            || config.tag.len() > 8
            || !config
                .tag
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(RuntimeError::plain(
                ErrorKind::Other,
                format!("network tag {:?} must be 1 to 8 of [a-z0-9]", config.tag),
            ));
        }
        for dir in [config.run_dir.clone(), config.run_dir.join("netns")] {
            std::fs::create_dir_all(&dir)
                .map_err(|e| other(format!("cannot create {}", dir.display()), e))?;
        }
        let resolv = config.run_dir.join("resolv.conf");
        std::fs::write(&resolv, resolv_conf(&config.dns))
            .map_err(|e| other(format!("cannot write {}", resolv.display()), e))?;
        if config.dns.is_empty() {
            tracing::warn!("network: no resolver for isolated machines: the host names only loopback ones; set [network] dns");
        }
        Ok(Isolation {
            config,
            firewall: tokio::sync::Mutex::new(false),
        })
    }

    pub fn config(&self) -> &NetworkConfig {
        &self.config
    }

    /// The file bind-mounted as machines' `/etc/resolv.conf`.
    pub fn resolv_conf_path(&self) -> PathBuf {
        self.config.run_dir.join("resolv.conf")
    }

    /// The Docker network machines join.
    pub fn docker_network(&self) -> String {
        format!("narya-{}", self.config.tag)
    }

    /// The Linux bridge behind the Docker network (at most 15 characters).
    pub fn bridge(&self) -> String {
        format!("nry-{}", self.config.tag)
    }

    /// Puts this daemon's chains in place, atomically, once per process (a restarted daemon
    /// refills its chains from the configuration). `bridged`: machines share a Linux bridge, so
    /// bridged frames must pass the IP rules (`bridge-nf-call-iptables`).
    pub async fn ensure_firewall(&self, bridged: bool) -> Result<()> {
        let mut done = self.firewall.lock().await;
        if *done {
            return Ok(());
        }
        enable_sysctl(Path::new("/proc/sys/net/ipv4/ip_forward"))?;
        if bridged {
            enable_sysctl(Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables")).map_err(
                |e| {
                    RuntimeError::plain(
                        ErrorKind::Other,
                        format!("{e}: machines on one bridge could reach each other; the kernel needs br_netfilter"),
                    )
                },
            )?;
        }
        firewall::apply(&self.config.tag, self.config.subnet, bridged).await?;
        *done = true;
        Ok(())
    }

    /// Removes this daemon's chains and the jumps into them; what is gone already is fine.
    pub async fn remove_firewall(&self) {
        let mut done = self.firewall.lock().await;
        firewall::remove(&self.config.tag).await;
        *done = false;
    }
}

fn enable_sysctl(path: &Path) -> Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1") {
        return Ok(());
    }
    std::fs::write(path, "1").map_err(|e| other(format!("cannot set {} to 1", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_parse_and_refuse_host_bits() {
        let s: Subnet = "10.89.0.0/16".parse().unwrap();
        assert_eq!(s.to_string(), "10.89.0.0/16");
        assert_eq!(s.gateway(), Ipv4Addr::new(10, 89, 0, 1));
        assert!(s.contains(Ipv4Addr::new(10, 89, 255, 3)));
        assert!(!s.contains(Ipv4Addr::new(10, 90, 0, 1)));
        for bad in [
            "10.89.0.1/16",
            "10.89.0.0",
            "10.89.0.0/4",
            "10.89.0.0/31",
            "x/16",
        ] {
            assert!(bad.parse::<Subnet>().is_err(), "{bad}");
        }
    }

    #[test]
    fn resolvers_leave_out_loopback() {
        let text = "# c\nnameserver 127.0.0.53\nnameserver 10.0.0.2\nnameserver ::1\nsearch x\nnameserver fd00::1\n";
        let found: Vec<String> = non_loopback_resolvers(text)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(found, ["10.0.0.2", "fd00::1"]);
        assert!(resolv_conf(&[]).starts_with('#'));
    }

    #[test]
    fn a_subnet_that_leaves_reserved_addresses_outside_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let isolation = |subnet: &str| {
            Isolation::new(NetworkConfig {
                tag: "t1".to_owned(),
                subnet: subnet.parse().unwrap(),
                dns: Vec::new(),
                cni_bin_dirs: Vec::new(),
                run_dir: dir.path().to_owned(),
            })
            .unwrap()
        };
        let reserved = dir.path().join("ipam/narya-t1");
        std::fs::create_dir_all(&reserved).unwrap();
        std::fs::write(reserved.join("10.1.0.5"), "machine\neth0").unwrap();
        std::fs::write(reserved.join("lock"), "").unwrap();
        assert!(isolation("10.1.0.0/24").check_reservations().is_ok());
        let refused = isolation("10.2.0.0/24").check_reservations().unwrap_err();
        assert!(refused.to_string().contains("10.1.0.5"), "{refused}");
    }

    #[test]
    fn tags_are_short_stable_and_differ() {
        assert_eq!(tag_for("/var/lib/narya"), tag_for("/var/lib/narya"));
        assert_ne!(tag_for("/var/lib/narya"), tag_for("/tmp/x/state"));
        assert_eq!(tag_for("a").len(), 8);
    }
}
