//! The raw runtime, driven through its own command-line client (`ctr`, `docker`): the floor the
//! daemon is measured against.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::process::Command;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Backend {
    Containerd,
    Docker,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Containerd => "containerd",
            Backend::Docker => "docker",
        }
    }

    /// The variable naming this back end's socket.
    pub fn socket_variable(self) -> &'static str {
        match self {
            Backend::Containerd => "NARYA_TEST_CONTAINERD_SOCKET",
            Backend::Docker => "NARYA_TEST_DOCKER_SOCKET",
        }
    }
}

/// The label the daemon puts on each machine, valued with its environment's identifier
/// (`narya_runtimes::LABEL_ENVIRONMENT`, spelled out so the benchmark stays a client of the
/// daemon and Cargo.lock unchanged).
const LABEL_ENVIRONMENT: &str = "dev.narya.environment";

/// How long a raw command may take before it counts as hung: a shim swamped by concurrent
/// execs can stop answering altogether, and the run must still end.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// How long a forced removal may take before the task's shim counts as wedged.
const REMOVE_LIMIT: Duration = Duration::from_secs(30);

/// The containerd namespace the benchmark's daemon and raw runs share.
pub const NAMESPACE: &str = "narya-bench";

/// A raw command killed for taking longer than its limit.
#[derive(Debug)]
pub struct Hung {
    command: String,
    limit: Duration,
}

impl std::fmt::Display for Hung {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` did not finish within {} s",
            self.command,
            self.limit.as_secs()
        )
    }
}

impl std::error::Error for Hung {}

pub struct Raw {
    pub backend: Backend,
    program: &'static str,
    base: Vec<String>,
    /// The daemon runs machines on the host's network (the bench sets `environment.network =
    /// "host"`); the raw side does the same.
    host_network: bool,
}

impl Raw {
    pub fn new(backend: Backend, socket: &str, host_network: bool) -> Raw {
        let (program, base) = match backend {
            Backend::Containerd => (
                "ctr",
                vec![
                    "--address".to_owned(),
                    socket.to_owned(),
                    "--namespace".to_owned(),
                    NAMESPACE.to_owned(),
                ],
            ),
            Backend::Docker => ("docker", vec!["-H".to_owned(), format!("unix://{socket}")]),
        };
        Raw {
            backend,
            program,
            base,
            host_network,
        }
    }

    /// Runs the client with `args`; its stdout, or an error naming the command and its stderr.
    async fn run(&self, args: &[&str]) -> Result<String> {
        self.run_within(args, COMMAND_LIMIT).await
    }

    /// `run`, the client killed if it has not finished within `limit`.
    async fn run_within(&self, args: &[&str], limit: Duration) -> Result<String> {
        let running = Command::new(self.program)
            .args(&self.base)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let Ok(output) = tokio::time::timeout(limit, running).await else {
            return Err(Hung {
                command: format!("{} {}", self.program, args.join(" ")),
                limit,
            }
            .into());
        };
        let output = output.with_context(|| format!("cannot run {}", self.program))?;
        if !output.status.success() {
            bail!(
                "`{} {}` failed ({}): {}",
                self.program,
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The command line a create runs, for the report.
    pub fn create_command(&self, image: &str, id: &str) -> String {
        let args = self.create_args(image, id);
        format!(
            "{} {} {}",
            self.program,
            self.base.join(" "),
            args.join(" ")
        )
    }

    fn create_args<'a>(&self, image: &'a str, id: &'a str) -> Vec<&'a str> {
        let mut args = match self.backend {
            Backend::Containerd => vec!["run", "-d", "--null-io"],
            Backend::Docker => vec!["run", "-d", "--name", id],
        };
        if self.host_network {
            args.extend(match self.backend {
                Backend::Containerd => ["--net-host"].as_slice(),
                Backend::Docker => ["--network", "host"].as_slice(),
            });
        }
        args.push(image);
        if self.backend == Backend::Containerd {
            args.push(id);
        }
        args.extend(["/usr/bin/tini", "-s", "--", "/bin/sleep", "infinity"]);
        args
    }

    /// Starts a machine `id` of `image` whose main process keeps running.
    pub async fn create(&self, image: &str, id: &str) -> Result<()> {
        self.run(&self.create_args(image, id)).await.map(|_| ())
    }

    /// Removes the machines `ids`, running or not.
    pub async fn remove(&self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        match self.backend {
            Backend::Containerd => {
                // `task rm -f` kills the task with SIGKILL and deletes it; then the container
                // and its snapshot go.
                let mut task = vec!["task", "rm", "-f"];
                task.extend(&ids);
                let mut tasks = self.run_within(&task, REMOVE_LIMIT).await;
                let hung = tasks.as_ref().is_err_and(|e| e.is::<Hung>());
                if hung && self.kill_shims(&ids).await > 0 {
                    // A wedged shim answers not even a forced removal; once it is gone,
                    // containerd cleans its task up itself.
                    tasks = Ok(String::new());
                }
                let mut container = vec!["container", "rm"];
                container.extend(&ids);
                let mut containers = self.run(&container).await;
                for _ in 0..5 {
                    if containers.is_ok() {
                        break;
                    }
                    // containerd's clean-up after a killed shim takes a moment.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    containers = self.run(&container).await;
                }
                tasks.and(containers).map(|_| ())
            }
            Backend::Docker => {
                let mut args = vec!["rm", "-f"];
                args.extend(&ids);
                self.run(&args).await.map(|_| ())
            }
        }
    }

    /// Kills the containerd shims serving the benchmark's own tasks `ids`; how many it found.
    /// Only for removal: the bench made these tasks, and nothing else reaches a shim that no
    /// longer answers.
    async fn kill_shims(&self, ids: &[&str]) -> usize {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return 0;
        };
        let mut pids = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let value_of = |flag: &str| {
                args.iter()
                    .position(|a| *a == flag.as_bytes())
                    .and_then(|i| args.get(i + 1))
                    .and_then(|v| std::str::from_utf8(v).ok())
            };
            let is_shim = args
                .first()
                .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"));
            if is_shim
                && value_of("-namespace") == Some(NAMESPACE)
                && value_of("-id").is_some_and(|id| ids.contains(&id))
            {
                pids.push(pid);
            }
        }
        for pid in &pids {
            eprintln!("  killing the wedged shim {pid} of a raw machine");
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()
                .await;
        }
        pids.len()
    }

    /// Removes each of `ids` on its own, ignoring failures: the last sweep.
    pub async fn remove_quietly(&self, ids: &[String]) {
        for id in ids {
            let _ = self.remove(std::slice::from_ref(id)).await;
        }
    }

    /// Runs `true` in machine `id`.
    pub async fn exec(&self, id: &str, exec_id: &str) -> Result<()> {
        self.exec_output(id, exec_id, &["true"], COMMAND_LIMIT)
            .await
            .map(|_| ())
    }

    /// Runs `argv` in machine `id`; its stdout, unless it took longer than `limit`. `exec_id`
    /// names the process to containerd, which refuses two live processes of one name in a task.
    pub async fn exec_output(
        &self,
        id: &str,
        exec_id: &str,
        argv: &[&str],
        limit: Duration,
    ) -> Result<String> {
        let mut args = match self.backend {
            Backend::Containerd => vec!["task", "exec", "--exec-id", exec_id, id],
            Backend::Docker => vec!["exec", id],
        };
        args.extend(argv);
        self.run_within(&args, limit).await
    }

    /// The runtime's name of the one machine labelled as environment `environment`'s: the
    /// daemon names machines itself, and the label is what it promises to set.
    pub async fn machine_of(&self, environment: &str) -> Result<String> {
        let out = match self.backend {
            Backend::Containerd => {
                let filter = format!("labels.\"{LABEL_ENVIRONMENT}\"=={environment}");
                self.run(&["containers", "ls", "-q", &filter]).await?
            }
            Backend::Docker => {
                let filter = format!("label={LABEL_ENVIRONMENT}={environment}");
                self.run(&["ps", "-a", "--filter", &filter, "--format", "{{.Names}}"])
                    .await?
            }
        };
        let names: Vec<&str> = out.split_whitespace().collect();
        match names.as_slice() {
            [name] => Ok((*name).to_owned()),
            _ => bail!(
                "{} holds {} machines labelled {LABEL_ENVIRONMENT}={environment}, not one: {names:?}",
                self.backend.name(),
                names.len()
            ),
        }
    }

    /// How many machines whose name starts with `prefix` are running.
    pub async fn running(&self, prefix: &str) -> Result<usize> {
        match self.backend {
            Backend::Containerd => Ok(self
                .running_tasks()
                .await?
                .iter()
                .filter(|id| id.starts_with(prefix))
                .count()),
            Backend::Docker => {
                let out = self.run(&["ps", "--format", "{{.Names}}"]).await?;
                Ok(out.lines().filter(|n| n.starts_with(prefix)).count())
            }
        }
    }

    /// How many of the daemon's machines are running for environments whose identifier starts
    /// with `prefix`: the daemon names its machines itself, so they are found by label.
    pub async fn running_for_environments(&self, prefix: &str) -> Result<usize> {
        match self.backend {
            Backend::Containerd => {
                let filter = format!("labels.\"{LABEL_ENVIRONMENT}\"~=\"^{prefix}\"");
                let machines = self.run(&["containers", "ls", "-q", &filter]).await?;
                let running = self.running_tasks().await?;
                Ok(machines
                    .split_whitespace()
                    .filter(|m| running.contains(*m))
                    .count())
            }
            Backend::Docker => {
                let filter = format!("label={LABEL_ENVIRONMENT}");
                let format = format!("{{{{.Label \"{LABEL_ENVIRONMENT}\"}}}}");
                let out = self
                    .run(&["ps", "--filter", &filter, "--format", &format])
                    .await?;
                Ok(out.lines().filter(|e| e.starts_with(prefix)).count())
            }
        }
    }

    /// The names of containerd's running tasks.
    async fn running_tasks(&self) -> Result<BTreeSet<String>> {
        let out = self.run(&["task", "ls"]).await?;
        Ok(out
            .lines()
            .skip(1)
            .filter_map(
                |line| match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                    [id, _pid, "RUNNING", ..] => Some((*id).to_owned()),
                    _ => None,
                },
            )
            .collect())
    }

    /// The local name of the image the daemon pinned to `digest` (`sha256:…`).
    pub async fn image_for(&self, digest: &str) -> Result<String> {
        let (listing, wanted) = match self.backend {
            Backend::Containerd => (
                self.run(&["images", "ls", "-q"]).await?,
                format!("narya.local/official@{digest}"),
            ),
            Backend::Docker => (
                self.run(&["images", "--format", "{{.Repository}}:{{.Tag}}"])
                    .await?,
                format!(
                    "narya.local/official:{}",
                    digest.strip_prefix("sha256:").unwrap_or(digest)
                ),
            ),
        };
        if listing.lines().any(|l| l.trim() == wanted) {
            Ok(wanted)
        } else {
            bail!(
                "the daemon pinned {digest}, but {} holds no image {wanted}",
                self.backend.name()
            )
        }
    }

    /// The runtime's server version, for the report.
    pub async fn version(&self) -> String {
        let answer = match self.backend {
            Backend::Containerd => self.run(&["version"]).await.map(|out| {
                // The second "Version:" is the server's.
                out.lines()
                    .filter_map(|l| l.trim().strip_prefix("Version:"))
                    .nth(1)
                    .unwrap_or("?")
                    .trim()
                    .to_owned()
            }),
            Backend::Docker => self
                .run(&["version", "--format", "{{.Server.Version}}"])
                .await
                .map(|out| out.trim().to_owned()),
        };
        answer.unwrap_or_else(|e| format!("unknown ({e})"))
    }
}
