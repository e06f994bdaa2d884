//! A `naryad` of the benchmark's own: a temporary configuration, state directory and socket.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hyper::{Method, StatusCode};
use narya::client::{Client, Endpoint};
use tokio::process::{Child, Command};

use crate::raw::{Backend, NAMESPACE};

/// What the daemon's configuration needs besides the back end.
#[derive(Clone)]
pub struct Setup<'a> {
    pub naryad: &'a Path,
    pub jwks: &'a Path,
    pub containerd_socket: &'a str,
    pub docker_socket: &'a str,
    pub layout: &'a str,
    /// Where the daemon's stderr goes; `None`: into its temporary directory.
    pub log: Option<PathBuf>,
    /// `[pool] size`: 0 for every row but the pool's.
    pub pool: usize,
    /// `[limits] disk`; `None`: the contract's default where the host can hold it (the state
    /// on the quota filesystem, [`state_root`]), else `"unbounded"`.
    pub disk: Option<&'a str>,
    /// Deleted environments with large rows written into the store before the daemon starts
    /// (`bench::rows`); 0 for every row but the memory-with-rows one.
    pub rows: usize,
    /// TOML added to the configuration (sections of its own): empty for every row but the
    /// prebuilds' and gVisor's.
    pub extra: &'a str,
    /// `[runtime] sandbox`: "container" (runc) for every row but gVisor's.
    pub sandbox: &'a str,
}

/// The btrfs filesystem with quotas the test services mount (`NARYA_TEST_STATE_ROOT`), where
/// a daemon's state must be for `[limits] disk` to hold; `None` when there is none.
pub fn state_root() -> Option<PathBuf> {
    let root = PathBuf::from(std::env::var_os("NARYA_TEST_STATE_ROOT")?);
    narya_runtimes::disk::check_enforced(&root).ok()?;
    Some(root)
}

pub struct Daemon {
    child: Child,
    pub pid: u32,
    pub socket: PathBuf,
    pub log: PathBuf,
    /// Its `state_dir`.
    pub state: PathBuf,
    /// The engine's socket, on Docker: its network is removed once the daemon stops.
    docker_socket: Option<String>,
    _dir: tempfile::TempDir,
}

/// `setup.extra`, with a `[network] subnet` of each daemon's own where it names none: Docker
/// 20.10 sometimes keeps an endpoint of a removed machine, so that a daemon's network cannot be
/// removed and holds its subnet against every later daemon's, on either back end.
fn extra_with_subnet(setup: &Setup<'_>) -> String {
    static DAEMONS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    if setup.extra.contains("[network]") {
        return setup.extra.to_string();
    }
    let n = DAEMONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 100;
    format!(
        "{}\n[network]\nsubnet = \"10.{}.0.0/16\"\n",
        setup.extra,
        120 + n
    )
}

/// TOML's basic string: JSON's escaping is a subset of it.
fn quote(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

impl Daemon {
    /// Starts a daemon whose machines get `network` (`environment.network`: "isolated",
    /// the default, or "host"); `log_name` tells its log from another's.
    pub async fn start(
        setup: &Setup<'_>,
        backend: Backend,
        token: &str,
        network: &str,
    ) -> Result<Daemon> {
        let root = state_root();
        let mut builder = tempfile::Builder::new();
        builder.prefix("narya-bench-");
        let dir = match &root {
            Some(root) => builder.tempdir_in(root),
            None => builder.tempdir(),
        }
        .context("cannot make the daemon's temporary directory")?;
        let disk = setup
            .disk
            .unwrap_or(if root.is_some() { "10GiB" } else { "unbounded" });
        let state = dir.path().join("state");
        let socket = dir.path().join("narya.sock");
        // Deleted environments are forgotten at once, not after a day: the run deletes hundreds
        // before it lists the environments it keeps, and the list is measured at its size.
        // `nofile` stays within any CI host's hard limit (the default 65536 is refused above it).
        // No pool but for the pool's rows: the others measure a create that starts its machine.
        // The one organisation measuring holds hundreds of environments at once: its share is
        // raised past them.
        let config = format!(
            "state_dir = {state}\n\n\
             [listen]\nsocket = {socket}\n\n\
             [identity]\nissuer = \"narya-bench\"\naudience = \"narya\"\njwks_uri = {jwks}\n\
             algorithms = [\"ES256\"]\n\n\
             [runtime]\nbackend = {backend}\ncontainerd_socket = {containerd}\n\
             containerd_namespace = {namespace}\ndocker_socket = {docker}\nsandbox = {sandbox}\n\n\
             [image]\nreference = {image}\n\n\
             [environment]\ngone_retention = \"1s\"\nnetwork = {network}\n\n\
             [limits]\nnofile = 1024\ndisk = {disk}\n\n\
             [organisation]\nmax_environments = 100000\n\n\
             [pool]\nsize = {pool}\n\n{extra}",
            state = quote(&state.display().to_string()),
            socket = quote(&socket.display().to_string()),
            jwks = quote(&format!("file://{}", setup.jwks.display())),
            backend = quote(backend.name()),
            containerd = quote(setup.containerd_socket),
            namespace = quote(NAMESPACE),
            docker = quote(setup.docker_socket),
            sandbox = quote(setup.sandbox),
            image = quote(&format!("oci-layout:{}", setup.layout)),
            network = quote(network),
            pool = setup.pool,
            disk = quote(disk),
            extra = extra_with_subnet(setup),
        );
        if setup.rows > 0 {
            crate::bench::seed_rows(&state.join("narya.db"), setup.rows).await?;
            std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        }
        let config_path = dir.path().join("naryad.toml");
        std::fs::write(&config_path, config).context("cannot write the daemon's configuration")?;
        let log = setup.log.as_ref().map_or_else(
            || dir.path().join("naryad.log"),
            |base| base.with_extension(format!("{network}.{disk}.log")),
        );
        let log_file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create the daemon's log {}", log.display()))?;
        let child = Command::new(setup.naryad)
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", setup.naryad.display()))?;
        let pid = child.id().context("naryad exited at once")?;
        let mut daemon = Daemon {
            child,
            pid,
            socket,
            log,
            state,
            docker_socket: (backend == Backend::Docker).then(|| setup.docker_socket.to_owned()),
            _dir: dir,
        };
        daemon.wait_ready(token).await?;
        Ok(daemon)
    }

    /// Environment `id`'s workspace on the host (a directory of its own: no pool serves it).
    pub fn workspace(&self, id: &str) -> PathBuf {
        self.state.join("workspaces").join(id)
    }

    /// The daemon's store.
    pub fn database(&self) -> PathBuf {
        self.state.join("narya.db")
    }

    /// Where the daemon keeps its pool machines' workspaces (and links to claimed ones').
    pub fn pool_dir(&self) -> PathBuf {
        self.state.join("workspaces/.pool")
    }

    pub fn client(&self, token: &str) -> Client {
        Client::new(Endpoint::Unix(self.socket.clone()), Some(token.to_owned()))
    }

    /// The last lines of the daemon's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    async fn wait_ready(&mut self, token: &str) -> Result<()> {
        let client = self.client(token);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "naryad exited ({status}) before answering; its log:\n{}",
                    self.log_tail()
                );
            }
            if let Ok(answer) = client.send(Method::GET, "/v1/environments", None).await {
                if answer.status == StatusCode::OK {
                    return Ok(());
                }
                bail!(
                    "naryad answered {} to a list: {}",
                    answer.status,
                    String::from_utf8_lossy(&answer.body)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "naryad did not answer on {} within 60 s; its log:\n{}",
                    self.socket.display(),
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Resident and peak resident memory in KiB (VmRSS, VmHWM).
    pub fn memory_kib(&self) -> Result<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .context("cannot read the daemon's /proc status")?;
        let field = |name: &str| -> Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("no {name} in /proc/{}/status", self.pid))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// SIGTERM, then SIGKILL after 30 s; then, on Docker, its network.
    pub async fn stop(mut self) -> Result<()> {
        let stopped = self.terminate().await;
        self.remove_network().await;
        stopped
    }

    async fn terminate(&mut self) -> Result<()> {
        if self.child.try_wait()?.is_none() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.pid.to_string()])
                .status()
                .await;
            match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
                Ok(status) => {
                    let status = status?;
                    if !status.success() {
                        bail!("naryad exited with {status} on SIGTERM");
                    }
                }
                Err(_) => {
                    self.child.kill().await?;
                    bail!("naryad did not stop within 30 s of SIGTERM");
                }
            }
        }
        Ok(())
    }

    /// The daemon keeps its Docker network at shutdown while machines are on it (the raw side's
    /// joined it too, and may still be going away): left behind, it would hold the default
    /// subnet against the next section's daemon. Tried for up to 10 s; gone already is fine.
    async fn remove_network(&self) {
        let Some(socket) = &self.docker_socket else {
            return;
        };
        let tag = narya_runtimes::network::tag_for(&self.state.display().to_string());
        let name = format!("narya-{tag}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = Command::new("docker")
                .args(["-H", &format!("unix://{socket}"), "network", "rm", &name])
                .stdout(Stdio::null())
                .output()
                .await;
            let Ok(out) = out else { return };
            let said = String::from_utf8_lossy(&out.stderr);
            if out.status.success() || said.contains("not found") || Instant::now() > deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
