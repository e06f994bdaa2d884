//! Each test daemon's isolated network: a /24 no other test process uses, and on drop the
//! removal of whatever a killed daemon left on the host (chains, namespace mounts, its network
//! on the shared Docker and Podman engines). Only names made from the daemon's own tag are
//! touched. And what an environment reaches, asked from inside it.

use std::path::{Path, PathBuf};
use std::process::Command;

use std::net::{IpAddr, SocketAddr};

use hyper::StatusCode;
use narya::client::Client;
use narya_runtimes::conformance::{lease_subnet, SubnetLease};
use narya_runtimes::network::tag_for;

use super::e2e::{body, exec};

/// The test engines that make networks (Docker and Podman) whose sockets are set.
fn engine_sockets() -> Vec<String> {
    ["NARYA_TEST_DOCKER_SOCKET", "NARYA_TEST_PODMAN_SOCKET"]
        .iter()
        .filter_map(|variable| std::env::var(variable).ok())
        .collect()
}

/// The docker CLI against the engine on `socket`; `None` when it could not run.
fn engine_cli(socket: &str, args: &[&str]) -> Option<std::process::Output> {
    Command::new("docker")
        .args(["-H", &format!("unix://{socket}")])
        .args(args)
        .output()
        .ok()
}

/// The subnets of every network on the test engines, as they write them.
fn engine_subnets() -> Vec<String> {
    let mut subnets = Vec::new();
    for socket in engine_sockets() {
        // A network removed between the listing and the inspect fails the inspect, which still
        // prints the others.
        let stdout = |args: &[&str]| {
            engine_cli(&socket, args)
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        let ids = stdout(&["network", "ls", "-q"]);
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if ids.is_empty() {
            continue;
        }
        let format = ["--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}"];
        let said = stdout(&[&["network", "inspect"], &format[..], &ids[..]].concat());
        subnets.extend(said.split_whitespace().map(str::to_owned));
    }
    subnets
}

/// What `timeout` exits with when a connect hung: the packets were dropped.
pub const DROPPED: i64 = 124;

/// The exit status of a TCP connect to `to` from environment `id`, bounded by five seconds.
pub async fn connect(client: &Client, id: &str, to: SocketAddr) -> i64 {
    let script = format!(
        "timeout 5 bash -c 'exec 3<>/dev/tcp/{}/{}' 2>/dev/null; echo $?",
        to.ip(),
        to.port()
    );
    let answer = exec(client, id, &["sh", "-c", &script]).await;
    assert_eq!(answer.status, StatusCode::OK);
    let result = body(&answer);
    let output = result["output"].as_str().unwrap_or_default().trim();
    output
        .parse()
        .unwrap_or_else(|_| panic!("no exit status from {id}: {result}"))
}

/// Environment `id`'s own address: from the kernel's routing trie, or where that file is not
/// kept (gVisor) as the source address of a UDP socket connected to its gateway (a UDP connect
/// sends nothing).
pub async fn address_of(client: &Client, id: &str) -> IpAddr {
    let script = r#"if [ -r /proc/net/fib_trie ]; then
  awk '/32 host/ { print f } { f = $2 }' /proc/net/fib_trie | grep -v '^127\.' | head -n 1
else
  perl -MSocket -e 'open(R, "/proc/net/route") or die; while (<R>) { @f = split; if ($f[1] eq "00000000") { $g = inet_ntoa(pack("V", hex $f[2])); last } } socket(S, PF_INET, SOCK_DGRAM, 0) or die; connect(S, pack_sockaddr_in(9, inet_aton($g))) or die; print inet_ntoa((unpack_sockaddr_in(getsockname(S)))[1])'
fi"#;
    let result = body(&exec(client, id, &["sh", "-c", script]).await);
    let output = result["output"].as_str().unwrap_or_default().trim();
    output
        .parse()
        .unwrap_or_else(|_| panic!("no address in {id}: {result}"))
}

pub struct TestNetwork {
    pub lease: SubnetLease,
    /// The daemon's tag, as it derives it from its state directory.
    pub tag: String,
    state_dir: PathBuf,
}

impl TestNetwork {
    pub fn new(state_dir: &Path) -> TestNetwork {
        // The lease sees the subnets the host routes; an engine's network with no container on
        // it (one a killed run left on Podman, say) holds its subnet without a route.
        let taken = engine_subnets();
        let mut passed_over = Vec::new();
        let lease = loop {
            let lease = lease_subnet().expect("a free test subnet");
            if !taken.contains(&lease.subnet.to_string()) {
                break lease;
            }
            passed_over.push(lease);
        };
        TestNetwork {
            lease,
            tag: tag_for(&state_dir.display().to_string()),
            state_dir: state_dir.to_owned(),
        }
    }

    /// The `[network]` section giving the daemon its subnet.
    pub fn toml(&self) -> String {
        format!("\n[network]\nsubnet = \"{}\"\n", self.lease.subnet)
    }

    /// Removes what a daemon that did not stop cleanly left behind.
    pub fn clean_up(&self) {
        let tag = &self.tag;
        let network = format!("narya-{tag}");
        let mut engine_keeps_it = false;
        // Docker and Podman alike keep a network after its daemon was killed; a Podman
        // network left behind holds its subnet without a route on the host, so the next lease
        // could not see it was taken.
        for socket in engine_sockets() {
            let succeeds =
                |args: &[&str]| engine_cli(&socket, args).is_some_and(|o| o.status.success());
            succeeds(&["network", "rm", &network]);
            engine_keeps_it |= succeeds(&["network", "inspect", &network]);
        }
        // A private engine killed with the daemon's network on it leaves the bridge behind.
        if !engine_keeps_it {
            let _ = Command::new("ip")
                .args(["link", "del", &format!("nry-{tag}")])
                .output();
        }
        narya_runtimes::network::remove_chains_of(tag);
        // A namespace file stays mounted while its daemon is away; the machine (if any) keeps
        // the namespace itself until it is removed.
        if let Ok(entries) = std::fs::read_dir(self.state_dir.join("net/netns")) {
            for entry in entries.flatten() {
                let _ = Command::new("umount").arg("-l").arg(entry.path()).output();
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}
