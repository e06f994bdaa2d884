//! End-to-end fixtures: a real daemon on a real runtime with the official image, an
//! identity-provider double, and a direct line to the runtime to check what the daemon made.
//! This file holds the back ends, the sandbox and the host; the direct line is in `runtime.rs`,
//! calls of the daemon's API in `api.rs`.

use std::path::PathBuf;
use std::sync::Arc;

use narya::client::Client;
use narya_runtimes::containerd::{Containerd, ContainerdConfig};
use narya_runtimes::docker::{Docker, DockerConfig};
use narya_runtimes::Runtime;
use serde_json::{json, Value};

use super::idp::IdentityProvider;
use super::{make_key, now, Daemon, TestKey};

mod api;
mod runtime;

// Each test binary uses its own few of these.
#[allow(unused_imports)]
pub use api::{body, create, delete, differs, exec, get, list, settled, unique_id, until};
#[allow(unused_imports)]
pub use runtime::{
    files_holding, runtime_dirs, LabelledMachine, Ran, Removal, LABEL_DIGEST, LABEL_ENVIRONMENT,
    LABEL_ORGANISATION, LABEL_THROWAWAY,
};

/// The containerd namespace every end-to-end test shares; ids keep them apart.
pub const NAMESPACE: &str = "narya-e2e";

/// The runtime back ends every end-to-end test body runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Containerd,
    Docker,
    /// The Docker back end against Podman's Docker-compatible service.
    Podman,
}

impl Backend {
    fn socket_variable(self) -> &'static str {
        match self {
            Backend::Containerd => "NARYA_TEST_CONTAINERD_SOCKET",
            Backend::Docker => "NARYA_TEST_DOCKER_SOCKET",
            Backend::Podman => "NARYA_TEST_PODMAN_SOCKET",
        }
    }
}

/// The sandbox the end-to-end daemons run machines in: `NARYA_TEST_SANDBOX` (`container`, the
/// default, or `gvisor`), so that one test body runs under each (contrib/test.sh runs the
/// gVisor half).
pub fn sandbox() -> String {
    std::env::var("NARYA_TEST_SANDBOX").unwrap_or_else(|_| "container".to_owned())
}

/// Whether the end-to-end daemons run machines under gVisor.
pub fn under_gvisor() -> bool {
    sandbox() == "gvisor"
}

/// What a process run in an environment reads of its own confinement: its seccomp line, its
/// `oom_score_adj`, and what `unshare -Ur id` makes of a new user namespace. Under gVisor these
/// are its known gaps (README, "Sandboxes"): no filter inside for a process run into a machine,
/// the oom score set on the sandbox's host process rather than shown inside, and user namespaces
/// that gVisor's own kernel grants.
pub fn confinement_read_inside() -> [&'static str; 3] {
    if under_gvisor() {
        ["Seccomp:\t0", "0", "uid=0(root) gid=0(root) groups=0(root)"]
    } else {
        ["Seccomp:\t2", "500", "refused"]
    }
}

/// Asserts what a run killed past the memory limit answers (`result`, the exec's JSON) on
/// `backend`: exit code 137 (SIGKILL) on runc. Under gVisor, whose kernel is one host process,
/// the host's OOM killer ends the whole sandbox (a known gap, README "Sandboxes"): runsc's exec
/// then reports 128 ("waiting on PID … failed: EOF"), or, on Docker and Podman, which sometimes
/// forget the exec with its stopped container before it is asked, the run answers as killed
/// (`null`, as the contract has it). The daemon then starts the machine again and the
/// environment recovers.
pub fn assert_killed_past_memory(backend: Backend, result: &Value) {
    let code = &result["exit_code"];
    if !under_gvisor() {
        assert_eq!(*code, json!(137), "{result}");
    } else if backend != Backend::Containerd {
        assert!(*code == json!(128) || code.is_null(), "{result}");
    } else {
        assert_eq!(*code, json!(128), "{result}");
    }
}

/// The `[runtime]` line that puts a daemon's machines in [`sandbox`].
fn sandbox_line() -> String {
    format!("sandbox = {:?}\n", sandbox())
}

/// What the end-to-end tests need from the environment on containerd, or `None` to skip
/// (never under CI).
pub fn requirements() -> Option<(String, String)> {
    requirements_for(Backend::Containerd)
}

/// The runtime socket and the official image layout for `backend`, or `None` to skip (never
/// under CI).
pub fn requirements_for(backend: Backend) -> Option<(String, String)> {
    let socket = std::env::var(backend.socket_variable()).ok();
    let layout = std::env::var("NARYA_TEST_IMAGE_LAYOUT").ok();
    match (socket, layout) {
        (Some(s), Some(l)) if !s.is_empty() && !l.is_empty() => Some((s, l)),
        _ => {
            let message = format!(
                "{} and NARYA_TEST_IMAGE_LAYOUT are not set: run contrib/test.sh as root",
                backend.socket_variable()
            );
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{message} (CI=true: not skipping)"
            );
            eprintln!("skipped: {message}");
            None
        }
    }
}

pub struct Host {
    pub idp: IdentityProvider,
    pub key: TestKey,
    pub daemon: Daemon,
    pub backend: Backend,
    /// A direct line to the same runtime, to check what the daemon made.
    pub runtime: Arc<dyn Runtime>,
    pub socket: String,
    pub layout: String,
    _keys: tempfile::TempDir,
}

impl Host {
    /// A daemon on containerd with `extra` TOML added to its configuration (e.g. an
    /// `[environment]` section); `None` when the test must skip.
    pub async fn start(extra: &str) -> Option<Host> {
        Host::start_on(Backend::Containerd, extra).await
    }

    /// As `start`, on `backend`.
    pub async fn start_on(backend: Backend, extra: &str) -> Option<Host> {
        let (socket, layout) = requirements_for(backend)?;
        let reference = format!("oci-layout:{layout}");
        Some(Host::start_with_on(backend, &socket, &reference, extra, &socket, &layout).await)
    }

    /// As `start`, with the daemon's containerd socket and image reference given.
    pub async fn start_with(
        daemon_socket: &str,
        reference: &str,
        extra: &str,
        socket: &str,
        layout: &str,
    ) -> Host {
        Host::start_with_on(
            Backend::Containerd,
            daemon_socket,
            reference,
            extra,
            socket,
            layout,
        )
        .await
    }

    /// A daemon on `backend` reached at `daemon_socket`, with a direct line to `socket`.
    pub async fn start_with_on(
        backend: Backend,
        daemon_socket: &str,
        reference: &str,
        extra: &str,
        socket: &str,
        layout: &str,
    ) -> Host {
        let keys = tempfile::tempdir().unwrap();
        let idp = IdentityProvider::start().await;
        let key = make_key(keys.path(), "k", "P-256");
        idp.publish(&key.dev);
        let runtime_section = match backend {
            Backend::Containerd => format!(
                "[runtime]\ncontainerd_socket = {daemon_socket:?}\ncontainerd_namespace = {NAMESPACE:?}\n"
            ),
            Backend::Docker | Backend::Podman => {
                format!("[runtime]\nbackend = \"docker\"\ndocker_socket = {daemon_socket:?}\n")
            }
        } + &sandbox_line();
        // `extra` first, so that its top-level keys stay top-level.
        // The test's TOML is laid over the fixture's, table by table, so it may add keys to
        // `[image]` or the top level as well as sections of its own.
        let config = super::merged_toml(
            &format!(
                "{identity}\n{runtime_section}\n[image]\nreference = {reference:?}\n",
                identity = idp.identity_toml(""),
            ),
            extra,
        );
        let daemon = tokio::task::spawn_blocking(move || Daemon::start(&config))
            .await
            .unwrap();
        let runtime: Arc<dyn Runtime> = match backend {
            Backend::Containerd => Arc::new(
                Containerd::new(ContainerdConfig {
                    socket: PathBuf::from(socket),
                    namespace: NAMESPACE.to_owned(),
                    snapshotter: "overlayfs".to_owned(),
                    insecure_registries: Vec::new(),
                    fifo_dir: daemon.dir.path().join("test-fifo"),
                    network: None,
                    sandbox: narya_runtimes::Sandbox::Container,
                })
                .unwrap(),
            ),
            Backend::Docker | Backend::Podman => Arc::new(
                Docker::new(DockerConfig {
                    socket: PathBuf::from(socket),
                    insecure_registries: Vec::new(),
                    network: None,
                    sandbox: narya_runtimes::Sandbox::Container,
                    profile_dir: daemon.dir.path().join("test-profiles"),
                })
                .unwrap(),
            ),
        };
        Host {
            idp,
            key,
            daemon,
            backend,
            runtime,
            socket: socket.to_owned(),
            layout: layout.to_owned(),
            _keys: keys,
        }
    }

    pub fn token(&self, organisation: &str) -> String {
        self.key
            .dev
            .sign(&json!({
                "iss": self.idp.issuer, "aud": "narya", "sub": "alice",
                "org": organisation, "exp": now() + 3600,
            }))
            .unwrap()
    }

    /// A client of organisation `acme` over the unix socket.
    pub fn acme(&self) -> Client {
        self.client("acme")
    }

    /// A client of `organisation` over the unix socket.
    pub fn client(&self, organisation: &str) -> Client {
        self.daemon.unix(Some(&self.token(organisation)))
    }

    pub fn workspace(&self, id: &str) -> PathBuf {
        self.daemon.dir.path().join("state/workspaces").join(id)
    }
}
