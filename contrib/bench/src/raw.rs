//! The raw runtime, driven through its own command-line client (`ctr`, `docker`): the floor the
//! daemon is measured against.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::AsyncWriteExt;
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

/// The network the raw side's machines get: the same as the daemon's.
pub enum RawNetwork {
    /// The host's (`--net-host`, `--network host`).
    Host,
    /// containerd: `ctr run --cni` with the daemon's own CNI network list. `ctr` reads its
    /// configuration only from `/etc/cni/net.d`, so `ctr run` runs in a private mount namespace
    /// where that directory is this one's `net.d`, holding a copy of the list the daemon wrote
    /// (and, for a `ctr` that finds plugins only in `/opt/cni/bin`, `/opt` is its `opt`, where
    /// `cni/bin` leads to Debian's plugins). `ctr` 1.6 never releases what `run --cni` took
    /// (1.7's `task rm` does, so `task rm` runs in that namespace too): the removal calls the
    /// plugins' DEL itself, as 1.7 would, untimed like every removal.
    Cni(tempfile::TempDir),
    /// Docker: the daemon's bridge network, by name.
    Bridge(String),
}

/// Where Debian's `containernetworking-plugins` puts the plugins (bookworm's `ctr` looks there
/// too; sid's only in `/opt/cni/bin`).
const CNI_PLUGINS: &str = "/usr/lib/cni";

/// The network list's file, in the raw side's `net.d`.
const CNI_LIST: &str = "10-narya-bench.conflist";

/// Releases what `ctr run --cni` took for machines `ids` (CNI DEL of the network list in `dir`,
/// as `ctr` 1.7's `task rm` does): their addresses, and whatever of the interface is left.
async fn release_addresses(dir: &Path, ids: &[&str]) -> Result<()> {
    let path = dir.join("net.d").join(CNI_LIST);
    let text = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let list: serde_json::Value =
        serde_json::from_slice(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let plugins = list["plugins"].as_array().cloned().unwrap_or_default();
    for id in ids {
        // In reverse order, as CNI deletes a list.
        for plugin in plugins.iter().rev() {
            let mut conf = plugin.clone();
            conf["name"] = list["name"].clone();
            conf["cniVersion"] = list["cniVersion"].clone();
            let kind = conf["type"].as_str().unwrap_or_default().to_owned();
            let mut child = Command::new(Path::new(CNI_PLUGINS).join(&kind))
                .env("CNI_COMMAND", "DEL")
                // `ctr` names a machine to CNI as NAMESPACE-ID.
                .env("CNI_CONTAINERID", format!("{NAMESPACE}-{id}"))
                .env("CNI_NETNS", "")
                .env("CNI_IFNAME", "eth0")
                .env("CNI_PATH", CNI_PLUGINS)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("cannot run the CNI plugin {kind}"))?;
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(conf.to_string().as_bytes()).await?;
            }
            let out = child.wait_with_output().await?;
            if !out.status.success() {
                bail!(
                    "CNI DEL of {id} by {kind} failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout).trim()
                );
            }
        }
    }
    Ok(())
}

/// The wrapper that shows `ctr` a directory of the benchmark's as `/etc/cni/net.d`: `$0` is
/// the directory holding it (as `net.d`), the rest the command.
const CNI_WRAPPER: &str = "mount --bind \"$0/net.d\" /etc/cni/net.d && exec \"$@\"";

/// [`CNI_WRAPPER`] for a `ctr` that finds CNI plugins only in `/opt/cni/bin` (sid's): `/opt`
/// is the directory's `opt` too, where `cni/bin` leads to Debian's plugins. Nothing of the
/// host's `/opt` changes: the mount is in the wrapper's namespace alone.
const CNI_WRAPPER_OPT: &str = "mount --bind \"$0/net.d\" /etc/cni/net.d && \
    mount --bind \"$0/opt\" /opt && exec \"$@\"";

pub struct Raw {
    pub backend: Backend,
    program: String,
    base: Vec<String>,
    /// The client finds CNI plugins only in `/opt/cni/bin`: its wrapper is [`CNI_WRAPPER_OPT`].
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

    /// The CNI wrapper this client needs.
    fn wrapper(&self) -> &'static str {
        match self.plugins_in_opt {
            true => CNI_WRAPPER_OPT,
            false => CNI_WRAPPER,
        }
    }

    /// Gives the raw side's machines `network` from now on; the first call wins.
    pub fn adopt(&self, network: RawNetwork) {
        let _ = self.network.set(network);
    }

    /// The directory of the CNI configuration `ctr run` and `ctr task rm` must see (`net.d`,
    /// and `opt`), when there is one.
    fn cni_dir(&self) -> Option<&Path> {
        match self.network.get() {
            Some(RawNetwork::Cni(dir)) => Some(dir.path()),
            _ => None,
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
                // In the CNI wrapper: from 1.7 on, `task rm` releases what `run --cni` took.
                let mut tasks = self.run_as(&task, REMOVE_LIMIT, true).await;
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
                let released = match self.cni_dir() {
                    Some(dir) => release_addresses(dir, &ids).await,
                    None => Ok(()),
                };
                tasks.and(containers).and(released).map(|_| ())
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

    /// The network the daemon gave environment `environment`'s machine, for the raw side to
    /// use too: on containerd its CNI network list (written under `state_dir/net`), on Docker
    /// the network the machine joined.
    pub async fn network_like(&self, environment: &str, state_dir: &Path) -> Result<RawNetwork> {
        match self.backend {
            Backend::Containerd => {
                let net = state_dir.join("net");
                let lists: Vec<_> = match std::fs::read_dir(&net) {
                    Ok(entries) => entries
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|x| x == "conflist"))
                        .collect(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                    Err(e) => return Err(e).context(format!("cannot read {}", net.display())),
                };
                match lists.as_slice() {
                    [] => Ok(RawNetwork::Host),
                    [list] => {
                        let dir = tempfile::Builder::new()
                            .prefix("narya-bench-cni-")
                            .tempdir()
                            .context("cannot make the raw side's CNI directory")?;
                        let net_d = dir.path().join("net.d");
                        std::fs::create_dir(&net_d)?;
                        std::fs::copy(list, net_d.join(CNI_LIST))
                            .with_context(|| format!("cannot copy {}", list.display()))?;
                        if self.plugins_in_opt {
                            let opt = dir.path().join("opt/cni");
                            std::fs::create_dir_all(&opt)?;
                            std::os::unix::fs::symlink(CNI_PLUGINS, opt.join("bin"))?;
                        }
                        if !Path::new("/etc/cni/net.d").is_dir() {
                            // Only the mount point: what `ctr` reads there is the bench's.
                            std::fs::create_dir_all("/etc/cni/net.d")
                                .context("cannot make /etc/cni/net.d to mount over")?;
                        }
                        Ok(RawNetwork::Cni(dir))
                    }
                    _ => bail!(
                        "{} holds {} network lists, not one",
                        net.display(),
                        lists.len()
                    ),
                }
            }
            Backend::Docker => {
                let machine = self.machine_of(environment).await?;
                let format = "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}";
                let out = self.run(&["inspect", "--format", format, &machine]).await?;
                match out.split_whitespace().collect::<Vec<_>>().as_slice() {
                    ["host"] => Ok(RawNetwork::Host),
                    [name] => Ok(RawNetwork::Bridge((*name).to_owned())),
                    names => bail!("machine {machine} is on {names:?}, not on one network"),
                }
            }
        }
    }

    /// What the CNI wrapper alone costs: one run of it around `true`. `None` without CNI.
    pub async fn wrapper_alone(&self) -> Result<Option<Duration>> {
        let Some(dir) = self.cni_dir() else {
            return Ok(None);
        };
        let start = std::time::Instant::now();
        let status = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(self.wrapper())
            .arg(dir)
            .arg("true")
            .stdin(Stdio::null())
            .status()
            .await
            .context("cannot run unshare")?;
        let took = start.elapsed();
        if !status.success() {
            bail!("the CNI wrapper around `true` failed ({status})");
        }
        Ok(Some(took))
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
        self.server_version()
            .await
            .unwrap_or_else(|e| format!("unknown ({e})"))
    }

    /// The runtime's server version, or why it did not answer.
    pub async fn server_version(&self) -> Result<String> {
        match self.backend {
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
        }
    }
}
