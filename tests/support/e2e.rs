//! End-to-end fixtures: a real daemon on the real containerd with the official image, an
//! identity-provider double, and a direct line to containerd to check what the daemon made.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use narya::client::{Answer, Client};
use std::sync::Arc;

use narya_runtimes::containerd::{Containerd, ContainerdConfig};
use narya_runtimes::docker::{Docker, DockerConfig};
use narya_runtimes::{MachineState, ProcessOutcome, ProcessSpec, Runtime};
use serde_json::{json, Value};

use super::idp::IdentityProvider;
use super::{make_key, now, Daemon, TestKey};

/// The containerd namespace every end-to-end test shares; ids keep them apart.
pub const NAMESPACE: &str = "narya-e2e";

/// The runtime back ends every end-to-end test body runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Containerd,
    Docker,
}

impl Backend {
    fn socket_variable(self) -> &'static str {
        match self {
            Backend::Containerd => "NARYA_TEST_CONTAINERD_SOCKET",
            Backend::Docker => "NARYA_TEST_DOCKER_SOCKET",
        }
    }
}

/// Generates, for an `async fn name(backend: Backend)`, one test per back end.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::support::e2e::Backend;

            #[tokio::test(flavor = "multi_thread")]
            async fn containerd() {
                super::$name(Backend::Containerd).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn docker() {
                super::$name(Backend::Docker).await
            }
        }
    )*};
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
            Backend::Docker => {
                format!("[runtime]\nbackend = \"docker\"\ndocker_socket = {daemon_socket:?}\n")
            }
        };
        let config = format!(
            "{identity}\n{runtime_section}\n[image]\nreference = {reference:?}\n\n{extra}\n",
            identity = idp.identity_toml(""),
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
                })
                .unwrap(),
            ),
            Backend::Docker => Arc::new(
                Docker::new(DockerConfig {
                    socket: PathBuf::from(socket),
                    insecure_registries: Vec::new(),
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
        self.daemon.unix(Some(&self.token("acme")))
    }

    pub fn workspace(&self, id: &str) -> PathBuf {
        self.daemon.dir.path().join("state/workspaces").join(id)
    }

    /// Runs a shell command in machine `id` directly through containerd.
    pub async fn sh(&self, id: &str, script: &str) -> ProcessOutcome {
        self.runtime
            .run(
                id,
                &ProcessSpec {
                    argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
                    env: Default::default(),
                    cwd: None,
                    timeout: Duration::from_secs(30),
                    output_limit: 1 << 20,
                    stdin: None,
                    output: None,
                },
            )
            .await
            .expect("running in the machine")
    }

    pub async fn state(&self, id: &str) -> MachineState {
        self.runtime.inspect(id).await.expect("containerd answers")
    }

    /// How many machines in containerd carry environment id `id`.
    pub async fn machines_named(&self, id: &str) -> usize {
        self.runtime
            .list()
            .await
            .expect("containerd answers")
            .iter()
            .filter(|m| m.id == id)
            .count()
    }

    /// Removes machine `id` whatever the daemon thinks (test clean-up).
    pub async fn remove(&self, id: &str) {
        let _ = self.runtime.remove(id).await;
    }
}

/// A unique environment id for this test run.
pub fn unique_id(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

pub async fn create(client: &Client, body: Value) -> Answer {
    client
        .send_json(Method::POST, "/v1/environments", &body)
        .await
        .unwrap()
}

pub async fn get(client: &Client, id: &str) -> Answer {
    client
        .send(Method::GET, &format!("/v1/environments/{id}"), None)
        .await
        .unwrap()
}

pub fn body(answer: &Answer) -> Value {
    serde_json::from_slice(&answer.body).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {:?}",
            String::from_utf8_lossy(&answer.body)
        )
    })
}

/// Polls `GET` until the environment is no longer provisioning.
pub async fn settled(client: &Client, id: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let answer = get(client, id).await;
        if answer.status == StatusCode::OK {
            let env = body(&answer);
            if env["status_detail"] != "provisioning" {
                return env;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{id} still provisioning after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
