//! The raw runtime, driven through its own command-line client (`ctr`, `docker`): the floor the
//! daemon is measured against.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::process::Command;

mod cni;
mod inspect;
mod remove;

pub use cni::RawNetwork;

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

    /// The variable naming the socket of this back end's newer runtime in the test matrix
    /// (`contrib/dev/services.sh start matrix`).
    pub fn matrix_variable(self) -> &'static str {
        match self {
            Backend::Containerd => "NARYA_MATRIX_CONTAINERD_SOCKET",
            Backend::Docker => "NARYA_MATRIX_DOCKER_SOCKET",
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
    program: String,
    base: Vec<String>,
    /// The client finds CNI plugins only in `/opt/cni/bin`: its wrapper is [`CNI_WRAPPER_OPT`](cni::CNI_WRAPPER_OPT).
    plugins_in_opt: bool,
    /// Set once the daemon's network is known (after its first create).
    network: OnceLock<RawNetwork>,
}

impl Raw {
    /// The host's own client of `backend` (`ctr`, `docker` on the PATH) on `socket`.
    pub fn new(backend: Backend, socket: &str) -> Raw {
        Raw::with_client(backend, socket, None)
    }

    /// The raw side of a newer runtime of the test matrix on `socket`: on containerd its own
    /// `ctr` in `bin` (sid's, which finds CNI plugins only in `/opt/cni/bin`), on Docker the
    /// host's `docker` (a client of any engine).
    pub fn newer(backend: Backend, socket: &str, bin: &Path) -> Raw {
        match backend {
            Backend::Containerd => Raw::with_client(backend, socket, Some(bin.join("ctr"))),
            Backend::Docker => Raw::new(backend, socket),
        }
    }

    /// `ctr` or `docker` as `client` (default: the one on the PATH), on `socket`.
    fn with_client(backend: Backend, socket: &str, client: Option<PathBuf>) -> Raw {
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
        let plugins_in_opt = client.is_some() && backend == Backend::Containerd;
        Raw {
            backend,
            program: client.map_or(program.to_owned(), |c| c.display().to_string()),
            base,
            plugins_in_opt,
            network: OnceLock::new(),
        }
    }

    /// The client with `args`; with `cni`, inside the wrapper that shows it the CNI directory.
    fn command(&self, args: &[&str], cni: bool) -> Command {
        let mut command = match self.cni_dir().filter(|_| cni) {
            Some(dir) => {
                let mut c = Command::new("unshare");
                c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                    .arg(self.wrapper())
                    .arg(dir)
                    .arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        command.args(&self.base).args(args);
        command
    }

    /// Runs the client with `args`; its stdout, or an error naming the command and its stderr.
    async fn run(&self, args: &[&str]) -> Result<String> {
        self.run_within(args, COMMAND_LIMIT).await
    }

    /// `run`, the client killed if it has not finished within `limit`.
    async fn run_within(&self, args: &[&str], limit: Duration) -> Result<String> {
        self.run_as(args, limit, false).await
    }

    /// `run_within`; with `cni`, `ctr` sees the daemon's CNI network list (and its plugins).
    async fn run_as(&self, args: &[&str], limit: Duration, cni: bool) -> Result<String> {
        let running = self
            .command(args, cni)
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
        let wrapper = match self.cni_dir() {
            Some(_) => format!(
                "unshare --mount --propagation private -- sh -c '{}' DIR ",
                self.wrapper()
            ),
            None => String::new(),
        };
        format!(
            "{wrapper}{} {} {}",
            self.program,
            self.base.join(" "),
            args.join(" ")
        )
    }

    fn create_args<'a>(&'a self, image: &'a str, id: &'a str) -> Vec<&'a str> {
        // The daemon's machines carry a seccomp filter like the Docker Engine's default, which
        // `docker run` applies by itself and `ctr run` only when asked: runc loads it into
        // every process it starts, a cost both sides must pay.
        let mut args = match self.backend {
            Backend::Containerd => vec!["run", "-d", "--null-io", "--seccomp"],
            Backend::Docker => vec!["run", "-d", "--name", id],
        };
        match (self.network.get(), self.backend) {
            (None | Some(RawNetwork::Host), Backend::Containerd) => args.push("--net-host"),
            (None | Some(RawNetwork::Host), Backend::Docker) => {
                args.extend(["--network", "host"]);
            }
            (Some(RawNetwork::Cni(_)), _) => args.push("--cni"),
            (Some(RawNetwork::Bridge(name)), _) => args.extend(["--network", name.as_str()]),
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
        self.run_as(&self.create_args(image, id), COMMAND_LIMIT, true)
            .await
            .map(|_| ())
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
}
