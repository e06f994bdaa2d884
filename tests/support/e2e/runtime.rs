//! The end-to-end host's direct line to the runtime its daemon uses: environments' machines
//! found by their labels, commands run in them and kills from outside through the runtime's own
//! CLI, their removal, and the runtime's directories on disk.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use narya_runtimes::MachineState;
use serde_json::Value;

use super::{unique_id, Backend, Host, NAMESPACE};

/// The labels the contract says identify a machine (its runtime name is internal).
pub const LABEL_ENVIRONMENT: &str = "dev.narya.environment";
pub const LABEL_ORGANISATION: &str = "dev.narya.organisation";
pub const LABEL_DIGEST: &str = "dev.narya.image-digest";
/// Marks a clone's throwaway container, which carries the identifier too but is no machine.
pub const LABEL_THROWAWAY: &str = "dev.narya.throwaway";

impl Host {
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
        let run = super::super::cleanup::stdout_of;
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
