//! Isolated networking end to end, on both back ends: what an environment reaches and what it
//! does not. Every address used is one the test made: its own listeners on the host's loopback
//! and on a dummy interface it adds, and a namespace on a veth of its own standing in for the
//! internet.

mod support;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use hyper::StatusCode;
use narya_runtimes::conformance::Outside;
use std::time::Duration;

use support::e2e::{body, create, delete, exec, unique_id, until, Backend, Host};
use support::network::{address_of, connect, DROPPED};

/// An extra interface with one address of TEST-NET-3 on the host: an address of the host
/// itself that no service of anyone else's listens on. A veth pair with both ends on the host
/// (this kernel has no dummy driver); removed on drop.
struct Dummy {
    name: String,
    address: Ipv4Addr,
}

impl Dummy {
    fn add() -> Dummy {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let dummy = Dummy {
            name: format!("nyd{:x}", pid * 16 + n % 16),
            address: Ipv4Addr::new(203, 0, 113, (pid % 250) as u8 + 1),
        };
        let ip = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().unwrap();
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let peer = format!("{}p", dummy.name);
        ip(&[
            "link",
            "add",
            &dummy.name,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
        ]);
        ip(&["link", "set", &peer, "up"]);
        ip(&[
            "addr",
            "add",
            &format!("{}/32", dummy.address),
            "dev",
            &dummy.name,
        ]);
        ip(&["link", "set", &dummy.name, "up"]);
        dummy
    }
}

impl Drop for Dummy {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.name])
            .output();
    }
}

async fn an_environment_reaches_the_outside_but_not_the_host_nor_another(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let outside = Outside::start(scratch.path()).expect("a stand-in for the internet");
    let metadata =
        Outside::start_link_local(scratch.path()).expect("a stand-in for a metadata service");
    // The host itself reaches it: a drop from the environment is the firewall's doing.
    std::net::TcpStream::connect_timeout(&metadata.addr, Duration::from_secs(5))
        .expect("the host reaches the link-local stand-in");
    let dummy = Dummy::add();
    let loopback = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let on_dummy = TcpListener::bind((dummy.address, 0)).unwrap();
    let client = host.acme();
    let (first, second) = (unique_id("net-a"), unique_id("net-b"));
    let _removals = [host.removal(&first), host.removal(&second)];
    for id in [&first, &second] {
        let answer = create(&client, serde_json::json!({ "id": id })).await;
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
    }

    assert_eq!(
        connect(&client, &first, outside.addr).await,
        0,
        "the outside is reachable"
    );
    let status = connect(&client, &first, loopback.local_addr().unwrap()).await;
    assert_ne!(status, 0, "the host's loopback listener was reached");
    let status = connect(&client, &first, on_dummy.local_addr().unwrap()).await;
    assert_eq!(status, DROPPED, "the host's own address {}", dummy.address);
    let status = connect(&client, &first, SocketAddr::from((outside.host_addr, 9))).await;
    assert_eq!(status, DROPPED, "the host's end of the outside's veth");
    let status = connect(&client, &first, metadata.addr).await;
    assert_eq!(status, DROPPED, "the link-local address {}", metadata.addr);
    let other = address_of(&client, &second).await;
    let status = connect(&client, &first, SocketAddr::new(other, 9)).await;
    assert_eq!(status, DROPPED, "the other environment at {other}");
    for listener in [&loopback, &on_dummy] {
        listener.set_nonblocking(true).unwrap();
        assert!(listener.accept().is_err(), "a host listener was reached");
    }

    for id in [&first, &second] {
        assert_eq!(delete(&client, id).await.status, StatusCode::NO_CONTENT);
        host.remove(id).await;
    }
}

async fn none_gives_loopback_only(backend: Backend) {
    let Some(host) = Host::start_on(backend, "[environment]\nnetwork = \"none\"\n").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("net-none");
    let _removal = host.removal(&id);
    let answer = create(&client, serde_json::json!({ "id": id })).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    // The kernel's own list of interfaces (gVisor keeps no /sys/class/net): under gVisor on
    // containerd and Podman, the wrapper's loopback-only network (a new namespace's loopback is down, and
    // gVisor's netstack would take no interface from it).
    let script = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '";
    let result = body(&exec(&client, &id, &["sh", "-c", script]).await);
    assert_eq!(result["output"], "lo\n", "{result}");
    // Loopback answers: a server and its client in the machine talk over it.
    let script = "python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); \
                  s.listen(); c = socket.create_connection(s.getsockname()); print(\"up\")'";
    let result = body(&exec(&client, &id, &["sh", "-c", script]).await);
    assert_eq!(result["output"], "up\n", "{result}");
    assert_eq!(delete(&client, &id).await.status, StatusCode::NO_CONTENT);
    host.remove(&id).await;
}

/// Rules put at the top of the host's FORWARD chain, taken out on drop.
struct AboveOurs(Vec<Vec<String>>);

impl AboveOurs {
    /// Inserts `rules` at the top of FORWARD, the first of them ending first, each with a
    /// comment naming `owner`: a deletion matches the whole rule, and another test's
    /// `-j DOCKER-USER` must not take this one's away.
    fn insert(owner: &str, rules: &[&[&str]]) -> AboveOurs {
        let mut inserted = AboveOurs(Vec::new());
        let comment = format!("narya test {owner}");
        for rule in rules.iter().rev() {
            let rule: Vec<String> = ["-m", "comment", "--comment", &comment]
                .iter()
                .chain(rule.iter())
                .map(|a| (*a).to_owned())
                .collect();
            let mut insert = vec!["-I".to_owned(), "FORWARD".to_owned(), "1".to_owned()];
            insert.extend(rule.iter().cloned());
            assert!(iptables(&insert), "iptables {insert:?}");
            inserted.0.push(rule);
        }
        inserted
    }
}

impl Drop for AboveOurs {
    fn drop(&mut self) {
        for rule in &self.0 {
            let _ = Command::new("iptables")
                .args(["-w", "-D", "FORWARD"])
                .args(rule)
                .output();
        }
    }
}

fn iptables<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> bool {
    let out = Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .expect("iptables runs");
    out.status.success()
}

/// A Docker Engine that restarts (or makes a network) puts its own rules at the top of
/// FORWARD, above the daemon's jump, with an ACCEPT of whatever leaves its bridges, and its
/// `DOCKER-USER` chain first; so does CNI's firewall plugin (Podman 4's networks) the first time
/// it starts a container on a host, with an ACCEPT of everything from each container, and its
/// `CNI-ADMIN` chain first. The daemon's jump from that chain keeps the environment's bounds.
/// Stood in for by putting such rules above ours, accepting whatever comes from the
/// environments' subnet (on containerd there is no bridge to name); then, to show the
/// stand-in opens what it should, by taking that jump away.
async fn an_engine_putting_its_rules_above_ours_opens_nothing(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    // The daemon makes CNI-ADMIN itself on an engine's networks; DOCKER-USER is dockerd's.
    let user = match backend {
        Backend::Podman => "CNI-ADMIN",
        Backend::Containerd | Backend::Docker => "DOCKER-USER",
    };
    if !iptables(&["-S", user]) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no {user} chain: CI's dockerd runs with its own iptables rules"
        );
        eprintln!("skipped: no {user} chain on this host");
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let metadata =
        Outside::start_link_local(scratch.path()).expect("a stand-in for a metadata service");
    let client = host.acme();
    let id = unique_id("net-above");
    let _removal = host.removal(&id);
    let answer = create(&client, serde_json::json!({ "id": id })).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{:?}", body(&answer));
    let (tag, subnet) = (
        &host.daemon.network.tag,
        host.daemon.network.lease.subnet.to_string(),
    );
    let _above = AboveOurs::insert(tag, &[&["-j", user], &["-s", &subnet, "-j", "ACCEPT"]]);
    let status = connect(&client, &id, metadata.addr).await;
    assert_eq!(
        status, DROPPED,
        "the link-local address {} with the engine's rules on top",
        metadata.addr
    );
    let jump = format!("NARYA-FWD-{tag}");
    assert!(
        iptables(&["-D", user, "-j", &jump]),
        "the daemon jumps into {jump} from {user}"
    );
    // On an engine's networks it jumps from the other chain too, which another test's stand-in
    // (running meanwhile, for the other engine) may have put above ours.
    let other = match user {
        "CNI-ADMIN" => "DOCKER-USER",
        _ => "CNI-ADMIN",
    };
    while iptables(&["-D", other, "-j", &jump]) {}
    let status = connect(&client, &id, metadata.addr).await;
    assert_eq!(
        status, 0,
        "without that jump the engine's ACCEPT lets it out"
    );
    assert_eq!(delete(&client, &id).await.status, StatusCode::NO_CONTENT);
}

/// A machine removed behind the daemon's back: the reconciler records the environment `gone`
/// and releases the namespace (with its veth and address) the machine held.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_machine_leaves_no_namespace_behind() {
    let Some(host) = Host::start_on(Backend::Containerd, "").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("net-lost");
    let answer = create(&client, serde_json::json!({ "id": id })).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let namespaces = host.daemon.dir.path().join("state/net/netns");
    let count = || std::fs::read_dir(&namespaces).map_or(0, |d| d.count());
    assert_eq!(count(), 1, "the machine's namespace");
    // The test's own line to the runtime removes the machine and nothing of the network.
    host.remove(&id).await;
    until(&client, &id, Duration::from_secs(60), "gone", |env| {
        env["status"] == "gone"
    })
    .await;
    assert_eq!(count(), 0, "the lost machine's namespace was released");
}

on_every_engine!(
    an_environment_reaches_the_outside_but_not_the_host_nor_another,
    none_gives_loopback_only,
    an_engine_putting_its_rules_above_ours_opens_nothing,
);
