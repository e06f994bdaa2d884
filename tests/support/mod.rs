//! Test support: an identity-provider double, keys, and a real `naryad` on temporary listeners.
#![allow(dead_code)]

pub mod cleanup;
pub mod e2e;
mod engines;
pub mod github;
pub mod github_git;
pub mod github_oauth;
pub mod idp;
pub mod images;
mod keys;
pub mod network;
pub mod private;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use narya::client::{Client, Endpoint};

pub use keys::{make_key, TestKey};

pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A `naryad` process on a temporary socket and a loopback TCP port.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub tcp: String,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    child: Option<Child>,
    pub network: network::TestNetwork,
}

/// The value of `variable`, which contrib/test.sh (as root) sets; without it the test skips
/// with a message, except under CI=true, where it fails.
pub fn required(variable: &str) -> Option<String> {
    match std::env::var(variable) {
        Ok(value) if !value.is_empty() => Some(value),
        _ => {
            let message = format!("{variable} is not set: run contrib/test.sh as root");
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{message} (CI=true: not skipping)"
            );
            eprintln!("skipped: {message}");
            None
        }
    }
}

/// A free loopback port (bound then released; the daemon binds it right after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `extra` laid over `base`, table by table: a test may add keys to `[listen]` or the top level
/// that the fixture already writes.
pub fn merged_toml(base: &str, extra: &str) -> String {
    fn merge(into: &mut toml::Table, from: toml::Table) {
        for (key, value) in from {
            match (into.get_mut(&key), value) {
                (Some(toml::Value::Table(inner)), toml::Value::Table(value)) => merge(inner, value),
                (_, value) => {
                    into.insert(key, value);
                }
            }
        }
    }
    let mut config: toml::Table = base.parse().expect("the fixture's TOML parses");
    merge(&mut config, extra.parse().expect("the test's TOML parses"));
    toml::to_string(&config).expect("TOML writes")
}

/// Limits every test daemon runs with: `nofile` within this host's hard limit (20000 on CI's
/// machines; the contract's default of 65536 is refused there), the rest small enough that a
/// test going past them does not strain a shared host. And no pool, so that every test counts
/// only the machines it made; a test that wants one sets `[pool] size` (laid over this).
/// The disk is unbounded here: these daemons' state directories may be anywhere; a daemon
/// [`Daemon::start`] puts on the quota filesystem ([`state_root`]) gets [`DISK`] instead.
pub const LIMITS: &str = "\n[limits]\nmemory = \"1GiB\"\ncpus = 1.0\npids = 1024\ntmp = \"64MiB\"\nnofile = 1024\ndisk = \"unbounded\"\n\n[pool]\nsize = 0\n";

/// The disk bound of test daemons whose state is on the quota filesystem.
pub const DISK: &str = "2GiB";

/// Where tests' state directories go so that `[limits] disk` can bound them: the runtimes'
/// btrfs filesystem with quotas (`contrib/dev/services.sh` mounts it, and names it in
/// `NARYA_TEST_STATE_ROOT`); `None` where there is none (not root, no services).
pub fn state_root() -> Option<PathBuf> {
    let root = PathBuf::from(std::env::var_os("NARYA_TEST_STATE_ROOT")?);
    narya_runtimes::disk::check_enforced(&root).ok()?;
    Some(root)
}

/// A temporary directory for a daemon's state: on the quota filesystem when there is one.
pub fn state_tempdir() -> tempfile::TempDir {
    match state_root() {
        Some(root) => tempfile::tempdir_in(root).unwrap(),
        None => tempfile::tempdir().unwrap(),
    }
}

impl Daemon {
    /// Starts `naryad` with an `[identity]` section (and anything else) given as TOML.
    pub fn start(identity_toml: &str) -> Daemon {
        let dir = state_tempdir();
        let socket = dir.path().join("run/narya.sock");
        Daemon::start_at(dir, socket, identity_toml)
    }

    pub fn start_at(dir: tempfile::TempDir, socket: PathBuf, identity_toml: &str) -> Daemon {
        let tcp = format!("127.0.0.1:{}", free_port());
        let config_path = dir.path().join("naryad.toml");
        let state_dir = dir.path().join("state");
        let network = network::TestNetwork::new(&state_dir);
        let bounded = narya_runtimes::disk::check_enforced(dir.path()).is_ok();
        let mut base = format!(
            "state_dir = {state:?}\n\n[listen]\nsocket = {socket:?}\ntcp = {tcp:?}\n{net}{LIMITS}",
            state = state_dir.display().to_string(),
            socket = socket.display().to_string(),
            net = network.toml(),
        );
        if bounded {
            base = merged_toml(&base, &format!("[limits]\ndisk = {DISK:?}\n"));
        }
        let config = merged_toml(&base, identity_toml);
        std::fs::write(&config_path, config).unwrap();
        let log_path = dir.path().join("naryad.log");
        let child = Daemon::spawn(&config_path, &log_path);
        let mut daemon = Daemon {
            dir,
            socket,
            tcp,
            config_path,
            log_path,
            child: Some(child),
            network,
        };
        daemon.wait_ready();
        daemon
    }

    pub fn spawn(config_path: &Path, log_path: &Path) -> Child {
        let log = std::fs::File::create(log_path).unwrap();
        Command::new(env!("CARGO_BIN_EXE_naryad"))
            .arg("--config")
            .arg(config_path)
            .env("RUST_LOG", "narya=debug,info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("naryad starts")
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let unix_up = std::os::unix::net::UnixStream::connect(&self.socket).is_ok();
            let tcp_up = std::net::TcpStream::connect(&self.tcp).is_ok();
            if unix_up && tcp_up {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "naryad exited with {status} before serving:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "naryad did not start listening in 60 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn unix(&self, token: Option<&str>) -> Client {
        Client::new(
            Endpoint::Unix(self.socket.clone()),
            token.map(str::to_owned),
        )
    }

    pub fn tcp(&self, token: Option<&str>) -> Client {
        Client::new(Endpoint::Tcp(self.tcp.clone()), token.map(str::to_owned))
    }

    /// Both transports, named, for tests that must hold on each.
    pub fn transports(&self, token: Option<&str>) -> [(&'static str, Client); 2] {
        [("unix", self.unix(token)), ("tcp", self.tcp(token))]
    }

    /// The daemon process's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the daemon with SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the daemon again on the same configuration and state.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the daemon is still running");
        let log = self.dir.path().join("naryad.restarted.log");
        self.log_path = log;
        self.child = Some(Daemon::spawn(&self.config_path, &self.log_path));
        self.wait_ready();
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("daemon running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "naryad ignored SIGTERM for 60 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Daemon {
    /// Stops the daemon; when the test is failing, prints what every start of it logged, so a
    /// failed assertion about a daemon answer always comes with the daemon's side of it.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.network.clean_up();
        if std::thread::panicking() {
            print_logs(self.dir.path(), "naryad");
        }
    }
}

/// Prints every `<stem>*.log` in `dir` (each start of a process writes its own) to stderr.
pub fn print_logs(dir: &Path, stem: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut logs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(stem) && n.ends_with(".log"))
        })
        .collect();
    // `naryad.log` before `naryad.restarted.log`: in the order the daemon was started.
    logs.sort_by_key(|p| p.as_os_str().len());
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        eprintln!(
            "----- {} -----\n{text}----- end of {} -----",
            log.display(),
            log.display()
        );
    }
}
