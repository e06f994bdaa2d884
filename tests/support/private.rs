//! A containerd of a test's own, on private paths, that the test may stop and start without
//! disturbing any other test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct PrivateContainerd {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    /// Where its binaries are, when not on PATH (a containerd of another series).
    bin_dir: Option<PathBuf>,
    child: Option<Child>,
}

/// Where a private runtime keeps its root: the quota filesystem of the tests' state (so that
/// `[limits] disk` can hold for the daemons driving it), else `/var/tmp`.
fn private_root() -> std::path::PathBuf {
    super::state_root().unwrap_or_else(|| std::path::PathBuf::from("/var/tmp"))
}

impl PrivateContainerd {
    pub fn start() -> PrivateContainerd {
        PrivateContainerd::start_from(None)
    }

    /// A containerd from the binaries in `bin_dir` (its shims found beside it), or from PATH.
    pub fn start_from(bin_dir: Option<&Path>) -> PrivateContainerd {
        let dir = tempfile::Builder::new()
            .prefix("narya-ctd-")
            .tempdir_in(private_root())
            .unwrap();
        std::fs::write(dir.path().join("config.toml"), "version = 2\n").unwrap();
        let socket = dir.path().join("containerd.sock");
        let mut containerd = PrivateContainerd {
            dir,
            socket,
            bin_dir: bin_dir.map(Path::to_owned),
            child: None,
        };
        containerd.resume();
        containerd
    }

    /// Starts containerd (again) on the same root, state and socket.
    pub fn resume(&mut self) {
        assert!(self.child.is_none());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("containerd.log"))
            .unwrap();
        let mut command = match &self.bin_dir {
            None => Command::new("containerd"),
            Some(bin_dir) => {
                let mut command = Command::new(bin_dir.join("containerd"));
                let path = std::env::var("PATH").unwrap_or_default();
                command.env("PATH", format!("{}:{path}", bin_dir.display()));
                command
            }
        };
        let child = command
            .arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .arg("--root")
            .arg(self.dir.path().join("root"))
            .arg("--state")
            .arg(self.dir.path().join("state"))
            .arg("--address")
            .arg(&self.socket)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("containerd starts (is it installed?)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ctr_answers(&self.socket) {
            assert!(
                Instant::now() < deadline,
                "the private containerd did not answer in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops containerd (SIGTERM); its shims, and so the machines, keep running.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// `ctr` against this containerd, in namespace `namespace`.
    pub fn ctr(&self, namespace: &str, args: &[&str]) -> std::process::Output {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", namespace])
            .args(args)
            .output()
            .expect("ctr runs")
    }
}

/// Unmounts whatever a runtime left mounted under `dir`, deepest first.
fn unmount_under(dir: &Path) {
    let root = dir.display().to_string();
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
        .filter(|m| m.starts_with(&root))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        let _ = Command::new("umount").args(["-l", &m]).status();
    }
}

fn ctr_answers(socket: &Path) -> bool {
    Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        // Kill what the machines left: every shim of this containerd and its processes.
        let address = self.socket.display().to_string();
        if let Ok(procs) = std::fs::read_dir("/proc") {
            for entry in procs.flatten() {
                let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                    continue;
                };
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                if cmdline.contains("containerd-shim") && cmdline.contains(&address) {
                    if let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() {
                        narya_runtimes::host::kill_tree(pid);
                    }
                }
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        unmount_under(self.dir.path());
    }
}

/// A Docker engine of a test's own (with its own containerd), on private paths.
pub struct PrivateDockerd {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    child: Option<Child>,
}

impl PrivateDockerd {
    pub fn start() -> PrivateDockerd {
        let dir = tempfile::Builder::new()
            .prefix("narya-dkd-")
            .tempdir_in(private_root())
            .unwrap();
        let socket = dir.path().join("docker.sock");
        let mut dockerd = PrivateDockerd {
            dir,
            socket,
            child: None,
        };
        dockerd.resume();
        dockerd
    }

    /// Starts the engine (again) on the same data and socket.
    pub fn resume(&mut self) {
        assert!(self.child.is_none());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("dockerd.log"))
            .unwrap();
        let child = Command::new("dockerd")
            .arg("--data-root")
            .arg(self.dir.path().join("data"))
            .arg("--exec-root")
            .arg(self.dir.path().join("exec"))
            .arg("--pidfile")
            .arg(self.dir.path().join("dockerd.pid"))
            .arg("-H")
            .arg(format!("unix://{}", self.socket.display()))
            .args(["--iptables=false", "--ip-masq=false", "--bridge=none"])
            // On btrfs the engine would pick its btrfs driver, whose layers are no overlay.
            .args(["--storage-driver", "overlay2"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("dockerd starts (is it installed?)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.answers() {
            assert!(
                Instant::now() < deadline,
                "the private dockerd did not answer in 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn answers(&self) -> bool {
        self.docker(&["version"]).status.success()
    }

    /// Stops the engine (SIGTERM): it stops its containers, and brings back those whose
    /// restart policy says so when it starts again.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The docker CLI against this engine.
    pub fn docker(&self, args: &[&str]) -> std::process::Output {
        Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", self.socket.display()))
            .args(args)
            .output()
            .expect("docker runs")
    }
}

impl Drop for PrivateDockerd {
    fn drop(&mut self) {
        if self.child.is_some() {
            let ids = self.docker(&["ps", "-aq"]);
            for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
                let _ = self.docker(&["rm", "-f", id]);
            }
        }
        self.stop();
        unmount_under(self.dir.path());
    }
}

/// A runtime of a test's own that it may stop, start and tamper with.
pub enum PrivateRuntime {
    Containerd(PrivateContainerd),
    Docker(PrivateDockerd),
}

impl PrivateRuntime {
    pub fn start(backend: super::e2e::Backend) -> PrivateRuntime {
        match backend {
            super::e2e::Backend::Containerd => {
                PrivateRuntime::Containerd(PrivateContainerd::start())
            }
            super::e2e::Backend::Docker | super::e2e::Backend::Podman => {
                PrivateRuntime::Docker(PrivateDockerd::start())
            }
        }
    }

    pub fn socket(&self) -> &Path {
        match self {
            PrivateRuntime::Containerd(c) => &c.socket,
            PrivateRuntime::Docker(d) => &d.socket,
        }
    }

    pub fn stop(&mut self) {
        match self {
            PrivateRuntime::Containerd(c) => c.stop(),
            PrivateRuntime::Docker(d) => d.stop(),
        }
    }

    pub fn resume(&mut self) {
        match self {
            PrivateRuntime::Containerd(c) => c.resume(),
            PrivateRuntime::Docker(d) => d.resume(),
        }
    }

    /// Kills every process of the machine the runtime names `name` from outside, as the OOM
    /// killer or an admin would.
    pub fn kill_machine(&self, namespace: &str, name: &str) {
        let out = match self {
            PrivateRuntime::Containerd(c) => c.ctr(
                namespace,
                &["task", "kill", "--signal", "SIGKILL", "--all", name],
            ),
            PrivateRuntime::Docker(d) => d.docker(&["kill", name]),
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
