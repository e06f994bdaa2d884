//! End-to-end fixtures: a real daemon on a real runtime with the official image, an
//! identity-provider double, and a direct line to the runtime to check what the daemon made.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use narya::client::{Answer, Client};
use std::sync::Arc;

use narya_runtimes::containerd::{Containerd, ContainerdConfig};
use narya_runtimes::docker::{Docker, DockerConfig};
use narya_runtimes::{MachineState, Runtime};
use serde_json::{json, Value};

use super::idp::IdentityProvider;
use super::{make_key, now, Daemon, TestKey};

/// The containerd namespace every end-to-end test shares; ids keep them apart.
pub const NAMESPACE: &str = "narya-e2e";

/// The labels the contract says identify a machine (its runtime name is internal).
pub const LABEL_ENVIRONMENT: &str = "dev.narya.environment";
pub const LABEL_ORGANISATION: &str = "dev.narya.organisation";
pub const LABEL_DIGEST: &str = "dev.narya.image-digest";
/// Marks a clone's throwaway container, which carries the identifier too but is no machine.
pub const LABEL_THROWAWAY: &str = "dev.narya.throwaway";

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

    /// The state of environment `id`'s machine, found by its label: `Missing` when there is
    /// none.
    pub async fn state(&self, id: &str) -> MachineState {
        let found = self.labelled(id).await;
        assert!(found.len() <= 1, "{} machines for {id}", found.len());
        match found.first() {
            None => MachineState::Missing,
            Some(machine) if machine.running => MachineState::Running,
            Some(_) => MachineState::Stopped,
        }
    }

    /// How many machines in the runtime carry environment id `id` in their label.
    pub async fn machines_labelled(&self, id: &str) -> usize {
        self.labelled(id).await.len()
    }

    /// The one machine of environment `id`, found by its label.
    pub async fn machine(&self, id: &str) -> LabelledMachine {
        let mut found = self.labelled(id).await;
        assert_eq!(found.len(), 1, "machines labelled {id}: {found:?}");
        found.remove(0)
    }

    /// Every machine (never a throwaway) whose `dev.narya.environment` label is `id`, whatever
    /// its organisation, as the runtime's own CLI reports it.
    pub async fn labelled(&self, id: &str) -> Vec<LabelledMachine> {
        let names = match self.backend {
            Backend::Containerd => {
                let filter = format!("labels.\"{LABEL_ENVIRONMENT}\"=={id}");
                self.cli(&["containers", "ls", "-q", &filter])
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
            }
            Backend::Docker | Backend::Podman => {
                let filter = format!("label={LABEL_ENVIRONMENT}={id}");
                self.cli(&["ps", "-a", "--filter", &filter, "--format", "{{.Names}}"])
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
            }
        };
        let running = match self.backend {
            Backend::Containerd => Some(
                self.cli(&["tasks", "ls"])
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
            ),
            Backend::Docker | Backend::Podman => None,
        };
        let mut found = Vec::new();
        for name in names.split_whitespace() {
            // A machine removed since the listing is no longer there to report.
            let (labels, is_running) = match self.backend {
                Backend::Containerd => {
                    let Ok(info) = self.cli(&["containers", "info", name]).await else {
                        continue;
                    };
                    let info: Value = serde_json::from_str(&info)
                        .unwrap_or_else(|e| panic!("ctr containers info {name}: {e}: {info}"));
                    let tasks = running.as_deref().unwrap_or_default();
                    let is_running = tasks.lines().any(|line| {
                        let mut fields = line.split_whitespace();
                        fields.next() == Some(name) && fields.nth(1) == Some("RUNNING")
                    });
                    (info["Labels"].clone(), is_running)
                }
                Backend::Docker | Backend::Podman => {
                    let Ok(info) = self.cli(&["inspect", name]).await else {
                        continue;
                    };
                    let info: Value = serde_json::from_str(&info)
                        .unwrap_or_else(|e| panic!("docker inspect {name}: {e}: {info}"));
                    let is_running = info[0]["State"]["Running"] == true;
                    (info[0]["Config"]["Labels"].clone(), is_running)
                }
            };
            let labels: BTreeMap<String, String> =
                serde_json::from_value(labels).unwrap_or_default();
            if labels.contains_key(LABEL_THROWAWAY) {
                continue;
            }
            found.push(LabelledMachine {
                name: name.to_owned(),
                labels,
                running: is_running,
            });
        }
        found
    }

    /// Runs the runtime's own CLI (`ctr` in the tests' namespace, or `docker`) against the
    /// runtime this host's daemon uses; its standard output, or why it failed.
    async fn cli(&self, args: &[&str]) -> Result<String, String> {
        let mut command = match self.backend {
            Backend::Containerd => {
                let mut ctr = tokio::process::Command::new("ctr");
                ctr.args(["--address", &self.socket, "--namespace", NAMESPACE]);
                ctr
            }
            Backend::Docker | Backend::Podman => {
                let mut docker = tokio::process::Command::new("docker");
                docker.args(["-H", &format!("unix://{}", self.socket)]);
                docker
            }
        };
        let out = command
            .args(args)
            .output()
            .await
            .expect("the runtime's CLI runs");
        if !out.status.success() {
            return Err(format!(
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs a shell command as root in environment `id`'s machine, through the runtime's CLI.
    pub async fn sh(&self, id: &str, script: &str) -> Ran {
        let name = self.machine(id).await.name;
        let exec_id = format!("e2e-{}", unique_id("sh"));
        let mut command = match self.backend {
            Backend::Containerd => {
                let mut ctr = tokio::process::Command::new("ctr");
                ctr.args(["--address", &self.socket, "--namespace", NAMESPACE])
                    .args(["tasks", "exec", "--exec-id", &exec_id, &name]);
                ctr
            }
            Backend::Docker | Backend::Podman => {
                let mut docker = tokio::process::Command::new("docker");
                docker
                    .args(["-H", &format!("unix://{}", self.socket)])
                    .args(["exec", &name]);
                docker
            }
        };
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            command.args(["/bin/sh", "-c", script]).output(),
        )
        .await
        .expect("the command ends within 30 s")
        .expect("the runtime's CLI runs");
        let mut output = out.stdout;
        output.extend_from_slice(&out.stderr);
        Ran {
            exit_code: out.status.code(),
            output,
        }
    }

    /// Removes every machine labelled as environment `id`, whatever the daemon thinks (test
    /// clean-up, or a machine lost from outside).
    pub async fn remove(&self, id: &str) {
        for machine in self.labelled(id).await {
            self.remove_machine(&machine).await;
        }
    }

    /// Kills every process of environment `id`'s machine from outside, through the runtime's
    /// own CLI, as the OOM killer or an admin would; the machine itself stays.
    pub async fn kill(&self, id: &str) {
        let name = self.machine(id).await.name;
        self.kill_machine(&name).await;
    }

    /// Kills every process of machine `name` from outside, through the runtime's own CLI.
    pub async fn kill_machine(&self, name: &str) {
        let name = name.to_owned();
        let killed = match self.backend {
            Backend::Containerd => {
                self.cli(&["tasks", "kill", "--signal", "SIGKILL", "--all", &name])
                    .await
            }
            Backend::Docker | Backend::Podman => self.cli(&["kill", &name]).await,
        };
        killed.unwrap_or_else(|e| panic!("{e}"));
    }

    /// Removes `machine` through the runtime, by its name.
    pub async fn remove_machine(&self, machine: &LabelledMachine) {
        let _ = self.runtime.remove(&machine.name).await;
    }
}

/// Removes environment `id`'s machines when dropped, also when the test failed: made by
/// [`Host::removal`], before anything can fail.
pub struct Removal {
    backend: Backend,
    socket: String,
    id: String,
}

impl Host {
    /// A guard that removes the machines labelled `id` when it is dropped.
    pub fn removal(&self, id: &str) -> Removal {
        Removal {
            backend: self.backend,
            socket: self.socket.clone(),
            id: id.to_owned(),
        }
    }
}

impl Drop for Removal {
    fn drop(&mut self) {
        let run = super::cleanup::stdout_of;
        match self.backend {
            Backend::Containerd => {
                let ctr = ["--address", &self.socket, "--namespace", NAMESPACE];
                let filter = format!("labels.\"{LABEL_ENVIRONMENT}\"=={}", self.id);
                // The test's daemon usually still runs (the guard is dropped before the host)
                // and starts a machine it sees stopped again, which may give it a new task
                // between ours going and the container's removal: look again until none is
                // left. (`docker rm -f` kills and removes in one call, so it cannot race.)
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let names = run(
                        "ctr",
                        &[&ctr[..], &["containers", "ls", "-q", &filter]].concat(),
                    );
                    if names.trim().is_empty() || Instant::now() > deadline {
                        break;
                    }
                    for name in names.split_whitespace() {
                        run(
                            "ctr",
                            &[&ctr[..], &["tasks", "kill", "-a", "-s", "KILL", name]].concat(),
                        );
                        run("ctr", &[&ctr[..], &["tasks", "rm", "-f", name]].concat());
                        run("ctr", &[&ctr[..], &["containers", "rm", name]].concat());
                    }
                }
            }
            Backend::Docker | Backend::Podman => {
                let host = format!("unix://{}", self.socket);
                let filter = format!("label={LABEL_ENVIRONMENT}={}", self.id);
                let names = run("docker", &["-H", &host, "ps", "-aq", "--filter", &filter]);
                for name in names.split_whitespace() {
                    run("docker", &["-H", &host, "rm", "-f", name]);
                }
            }
        }
    }
}

/// What a command run through the runtime's CLI gave.
#[derive(Debug)]
pub struct Ran {
    pub exit_code: Option<i32>,
    /// Standard output, then standard error.
    pub output: Vec<u8>,
}

/// A machine as the runtime's own tools report it. Its name is internal to the daemon and may
/// change; its labels say whose it is.
#[derive(Clone, Debug)]
pub struct LabelledMachine {
    /// The runtime's name for it.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub running: bool,
}

impl LabelledMachine {
    pub fn organisation(&self) -> Option<&str> {
        self.labels.get(LABEL_ORGANISATION).map(String::as_str)
    }

    pub fn digest(&self) -> Option<&str> {
        self.labels.get(LABEL_DIGEST).map(String::as_str)
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

pub async fn delete(client: &Client, id: &str) -> Answer {
    client
        .send(Method::DELETE, &format!("/v1/environments/{id}"), None)
        .await
        .unwrap()
}

/// The environments `LIST` answers.
pub async fn list(client: &Client) -> Vec<Value> {
    let answer = client
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    body(&answer)["environments"]
        .as_array()
        .expect("a list of environments")
        .clone()
}

/// Runs `argv` in environment `id` through the API.
pub async fn exec(client: &Client, id: &str, argv: &[&str]) -> Answer {
    client
        .send_json(
            Method::POST,
            &format!("/v1/environments/{id}/exec"),
            &json!({ "argv": argv }),
        )
        .await
        .unwrap()
}

/// What a create answered in `Narya-Create-Differs`, if it said anything.
pub fn differs(answer: &Answer) -> Option<String> {
    answer
        .headers
        .get("narya-create-differs")
        .map(|v| v.to_str().expect("a text header").to_owned())
}

/// Polls `GET` until `check` holds of the environment, within `within`; returns it.
pub async fn until(
    client: &Client,
    id: &str,
    within: Duration,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let answer = get(client, id).await;
        if answer.status == StatusCode::OK {
            let env = body(&answer);
            if check(&env) {
                return env;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{id} not {what} within {within:?}: {} {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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

/// Where the runtime keeps its root and state (contrib/dev/services.sh).
#[allow(dead_code)]
pub fn runtime_dirs(backend: Backend) -> Vec<PathBuf> {
    let dir = |variable: &str, default: &str| {
        PathBuf::from(std::env::var(variable).unwrap_or_else(|_| default.to_owned()))
    };
    let data = dir("NARYA_DATA_DIR", "/var/lib/narya-test");
    let run = dir("NARYA_RUN_DIR", "/run/narya-test");
    // The runtime matrix's runtimes keep theirs elsewhere (`services.sh env matrix` names them).
    let named = std::env::var(match backend {
        Backend::Containerd => "NARYA_TEST_CONTAINERD_DIRS",
        Backend::Docker => "NARYA_TEST_DOCKER_DIRS",
        Backend::Podman => "NARYA_TEST_PODMAN_DIRS",
    });
    let dirs = match (backend, named) {
        (_, Ok(named)) if !named.is_empty() => named.split(':').map(PathBuf::from).collect(),
        (Backend::Containerd, _) => vec![data.join("containerd"), run.join("containerd-state")],
        (Backend::Docker, _) => vec![data.join("docker"), run.join("docker-exec")],
        (Backend::Podman, _) => vec![data.join("podman"), run.join("podman-run")],
    };
    for d in &dirs {
        assert!(d.is_dir(), "no runtime directory {}", d.display());
    }
    dirs
}

/// The files under `dirs` that hold any of `forms`, by `grep` (regular files only).
#[allow(dead_code)]
pub fn files_holding(dirs: &[PathBuf], forms: &[String]) -> String {
    let patterns = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(patterns.path(), forms.join("\n") + "\n").unwrap();
    let out = std::process::Command::new("grep")
        .args(["-r", "-l", "-a", "-F", "--devices=skip", "-f"])
        .arg(patterns.path())
        .args(dirs)
        .output()
        .expect("grep runs");
    // 0: found; 1: not found; 2: some file could not be read (one going away while looked at).
    assert!(
        matches!(out.status.code(), Some(0..=2)),
        "grep: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
