//! What the conformance runs against each real back end share: the variables they need, the
//! fixture they make, and the verdict they print.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use narya_oci::ImageReference;
use narya_runtimes::conformance::{self, Fixture, Outside, SubnetLease};
use narya_runtimes::network::{tag_for, NetworkConfig};
use narya_runtimes::{
    ImageSource, Limits, MachineSpec, Network, PinnedImage, Runtime, Sandbox, User,
};

/// Whether this run is CI's, where nothing may skip.
fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// The value of `var`, or a skip (outside CI) / failure (under CI=true) naming what is missing.
/// A scratch directory for the suite's workspaces: on the test services' btrfs filesystem with
/// quotas (`NARYA_TEST_STATE_ROOT`) when there is one, so that the disk case runs; else anywhere.
pub fn scratch() -> tempfile::TempDir {
    let root = std::env::var_os("NARYA_TEST_STATE_ROOT")
        .map(std::path::PathBuf::from)
        .filter(|root| narya_runtimes::disk::check_enforced(root).is_ok());
    match root {
        Some(root) => tempfile::tempdir_in(root).unwrap(),
        None => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "no quota filesystem at NARYA_TEST_STATE_ROOT (CI=true: the disk case must run)"
            );
            tempfile::tempdir().unwrap()
        }
    }
}

pub fn required(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            let message = format!(
                "{var} is not set: start the services and build the image with contrib/test.sh"
            );
            assert!(!under_ci(), "{message} (CI=true: not skipping)");
            eprintln!("skipped: {message}");
            None
        }
    }
}

/// The runtime's version, or a skip (outside CI) / failure (under CI=true) when it does not
/// answer on `socket`.
pub async fn answering(runtime: &dyn Runtime, socket: &str) -> Option<String> {
    match runtime.version().await {
        Ok(version) => Some(version),
        Err(e) => {
            let name = runtime.name();
            assert!(!under_ci(), "{name} is not answering: {e}");
            eprintln!("skipped: {name} is not answering on {socket}: {e}");
            None
        }
    }
}

/// gVisor with `runsc` (the binary on containerd, the engine's runtime name on Docker), or a
/// skip (outside CI) / failure (under CI=true) when this host has no runsc.
pub fn gvisor(runsc: &str) -> Option<Sandbox> {
    if !Path::new("/usr/bin/runsc").exists() {
        let message =
            "no /usr/bin/runsc: install the runsc package (bookworm-backports), as .ci/run does";
        assert!(!under_ci(), "{message} (CI=true: not skipping)");
        eprintln!("skipped: {message}");
        return None;
    }
    Some(Sandbox::Gvisor {
        runsc: runsc.to_owned(),
    })
}

/// A resolver address written into machines' resolv.conf (never asked in these tests).
pub const TEST_DNS: &str = "192.0.2.53";

/// What an isolated run holds on the host: a subnet of its own, a stand-in for the internet,
/// and, on drop, the removal of the chains (and Docker network) a failed run left behind.
pub struct Isolated {
    pub config: NetworkConfig,
    pub outside: Outside,
    docker: Option<std::path::PathBuf>,
    _lease: SubnetLease,
}

impl Isolated {
    /// The network for a back end whose run keeps its files under `scratch`; `docker`: the
    /// engine's socket, for a Docker back end.
    pub fn new(scratch: &Path, docker: Option<&Path>) -> Isolated {
        let lease = conformance::lease_subnet().expect("a free test subnet");
        let outside = Outside::start(scratch).expect("a stand-in for the internet (as root)");
        Isolated {
            config: NetworkConfig {
                tag: tag_for(&scratch.display().to_string()),
                subnet: lease.subnet,
                dns: vec![TEST_DNS.parse().unwrap()],
                cni_bin_dirs: vec!["/usr/lib/cni".into(), "/opt/cni/bin".into()],
                run_dir: scratch.join("net"),
            },
            outside,
            docker: docker.map(Path::to_owned),
            _lease: lease,
        }
    }
}

impl Drop for Isolated {
    fn drop(&mut self) {
        let tag = &self.config.tag;
        if let Some(socket) = &self.docker {
            let _ = std::process::Command::new("docker")
                .arg("-H")
                .arg(format!("unix://{}", socket.display()))
                .args(["network", "rm", &format!("narya-{tag}")])
                .output();
        }
        narya_runtimes::network::remove_chains_of(tag);
    }
}

/// The back end under test: the version it reports and the sandbox its machines run in.
pub struct Engine {
    pub version: String,
    pub sandbox: Sandbox,
}

/// The suite's fixture: the official image from `reference`, workspaces under `scratch`, the
/// unprivileged user 1000:1000 on `network`, machines named from `prefix` and the process id.
pub fn fixture(
    reference: ImageReference,
    scratch: &Path,
    prefix: String,
    unreachable: Arc<dyn Runtime>,
    network: Network,
    outside: Option<std::net::SocketAddr>,
    engine: Engine,
) -> Fixture {
    let Engine { version, sandbox } = engine;
    let fixture = Fixture {
        image: ImageSource {
            reference,
            pinned: None,
        },
        scratch: scratch.join("workspaces"),
        user: User {
            uid: 1000,
            gid: 1000,
        },
        network,
        limits: test_limits(),
        mount_point: "/workspace".to_owned(),
        // The process id keeps two runs (or a machine a crashed run leaked) from ever sharing a
        // prefix: the list case asserts exactly the machines named from it.
        prefix: format!("{prefix}-{}", std::process::id()),
        unreachable: Some(unreachable),
        outside,
        known_gaps: conformance::known_gaps(&version, &sandbox),
        sandbox,
    };
    std::fs::create_dir_all(&fixture.scratch).unwrap();
    fixture
}

/// Small limits, quick to exceed, and a nofile within this host's hard limit.
pub fn test_limits() -> Limits {
    Limits {
        memory: 256 << 20,
        cpus: 1.0,
        pids: 128,
        tmp: 16 << 20,
        nofile: 1024,
    }
}

/// Test machine `id` of the official image, its workspace made under `scratch`.
pub fn machine_spec(
    id: &str,
    organisation: &str,
    image: PinnedImage,
    scratch: &std::path::Path,
    network: Network,
) -> MachineSpec {
    let workspace = scratch.join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    MachineSpec {
        id: id.to_owned(),
        environment: id.to_owned(),
        organisation: organisation.to_owned(),
        image,
        workspace,
        mount_point: "/workspace".to_owned(),
        user: User {
            uid: 1000,
            gid: 1000,
        },
        network,
        limits: test_limits(),
        pool: None,
        labels: BTreeMap::new(),
        layer: None,
    }
}

/// A machine-name prefix unique to this test process and `suite`: several test binaries (and
/// other runs) share the runtime, and a fixed prefix would let them remove each other's.
pub fn prefix(suite: &str) -> String {
    format!("{suite}{}", std::process::id())
}

/// Runs every case against `runtime` and fails the test unless all passed.
pub async fn run_and_judge(runtime: &dyn Runtime, fixture: &Fixture) {
    let reports = conformance::run(runtime, fixture).await;
    if let Err(failed) = conformance::print_and_judge(
        &reports,
        // Straight to the process's stderr, past the test harness's capture: CI's log names
        // every case, passed or not.
        &mut std::io::stderr(),
    ) {
        panic!("conformance against {}:\n{failed}", runtime.name());
    }
}

/// Removes machine `id` of `namespace` with containerd's own CLI when dropped, also when the
/// test failed: task, container record, writable layer. (The Docker binary has no use for it.)
#[allow(dead_code)]
pub struct Removal {
    pub socket: String,
    pub namespace: String,
    pub id: String,
}

impl Drop for Removal {
    fn drop(&mut self) {
        let ctr = ["--address", &self.socket, "--namespace", &self.namespace];
        for args in [
            &["tasks", "kill", "--signal", "SIGKILL", &self.id][..],
            &["tasks", "delete", "--force", &self.id],
            &["containers", "delete", &self.id],
            &["snapshots", "remove", &self.id],
        ] {
            let _ = std::process::Command::new("ctr")
                .args(ctr)
                .args(args)
                .output();
        }
    }
}
