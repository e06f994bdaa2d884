//! What gVisor's runsc would do to the host, and Narya's wrapper keeps it from: runsc's delete
//! kills the pids it recorded for a sandbox and its gofer whether or not they are still theirs.
//! Through the real containerd, whose removal comes when the daemon asks (Docker and Podman
//! delete a task the moment it ends, so nothing can take its pids first in a test; they run the
//! same wrapper), and through the wrapper and runsc alone, for every state a delete can find a
//! sandbox in.

// Only some of the shared helpers serve this binary.
#[allow(dead_code)]
mod support;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use narya_runtimes::containerd::{Containerd, ContainerdConfig};
use narya_runtimes::{ImageSource, MachineState, Network, Runtime};

/// Shared with the other runtime tests (the image stays for the next); machines are named by
/// this process.
const NAMESPACE: &str = "narya-runtime-tests";

/// Held while a test waits for pids to be freed and takes them through `ns_last_pid`, which
/// sets where the whole host's next pid comes from: two tests doing it at once would hand each
/// other's pids to whatever process starts next.
static NEXT_PID: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every host process: its pid and its arguments.
fn processes() -> Vec<(i32, Vec<String>)> {
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    entries
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, args))
        })
        .collect()
}

/// Whether `args` are those of runsc's process `kind` (`runsc-sandbox`, `runsc-gofer`).
fn is_runsc(args: &[String], kind: &str) -> bool {
    args.first().is_some_and(|a| a == kind)
}

/// The host processes of machine `id`'s sandbox: runsc's sandbox (`runsc-sandbox … ID`) and
/// its gofer (`runsc-gofer … --bundle=…/ID`).
fn sandbox_processes(id: &str) -> (Option<i32>, Option<i32>) {
    let bundle_suffix = format!("/{id}");
    let all = processes();
    let sandbox = all
        .iter()
        .find(|(_, args)| is_runsc(args, "runsc-sandbox") && args.last().is_some_and(|a| a == id));
    let gofer = all.iter().find(|(_, args)| {
        is_runsc(args, "runsc-gofer")
            && args.iter().any(|a| {
                a.strip_prefix("--bundle=")
                    .is_some_and(|b| b.ends_with(&bundle_suffix))
            })
    });
    (sandbox.map(|(pid, _)| *pid), gofer.map(|(pid, _)| *pid))
}

/// Waits until no process has pid `pid` (not even an unreaped one).
fn wait_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while PathBuf::from(format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "pid {pid} did not go");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `signal` (`-KILL`, `-STOP`) to `pid`; whether it was delivered.
fn signal(pid: i32, signal: &str) -> bool {
    Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// A process with a pid an ended sandbox once had, reaped the moment it ends (an unreaped one
/// would still answer to its pid).
struct Occupant {
    pid: i32,
    ended: std::thread::JoinHandle<()>,
}

impl Occupant {
    /// A `sleep` started with pid `pid`, through the kernel's `ns_last_pid` (the host's next
    /// pid follows it), trying again while other processes take the pid first.
    fn of(pid: i32) -> Occupant {
        for _ in 0..2000 {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
                .expect("root writes ns_last_pid");
            let mut child: Child = Command::new("sleep")
                .arg("600")
                .spawn()
                .expect("sleep runs");
            if i32::try_from(child.id()) == Ok(pid) {
                let ended = std::thread::spawn(move || {
                    let _ = child.wait();
                });
                return Occupant { pid, ended };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start a process with pid {pid}");
    }

    /// Whether it still runs (it is ended when dropped).
    fn runs(&self) -> bool {
        !self.ended.is_finished()
    }

    /// Whether it is still running a second from now: a SIGKILL sent just before lands, and
    /// its process is reaped, well within that.
    fn survives(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            if !self.runs() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.runs()
    }
}

impl Drop for Occupant {
    fn drop(&mut self) {
        // Not once it ended: its pid is free for anyone again.
        if self.runs() {
            signal(self.pid, "-KILL");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_a_machine_whose_sandbox_ended_kills_nothing_that_took_its_pids() {
    let Some(layout) = support::required("NARYA_TEST_IMAGE_LAYOUT") else {
        return;
    };
    let Some(socket) = support::required("NARYA_TEST_CONTAINERD_SOCKET") else {
        return;
    };
    let Some(gvisor) = support::gvisor("/usr/bin/runsc") else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let runtime = Containerd::new(ContainerdConfig {
        socket: PathBuf::from(&socket),
        namespace: NAMESPACE.to_owned(),
        snapshotter: "overlayfs".to_owned(),
        insecure_registries: Vec::new(),
        fifo_dir: scratch.path().join("fifo"),
        network: None,
        sandbox: gvisor,
    })
    .expect("the containerd back end builds");
    if support::answering(&runtime, &socket).await.is_none() {
        return;
    }
    let image = runtime
        .ensure_image(&ImageSource {
            reference: format!("oci-layout:{layout}").parse().unwrap(),
            pinned: None,
        })
        .await
        .expect("the official image");
    let id = format!("ended-{}", std::process::id());
    let _removal = support::Removal {
        socket: socket.clone(),
        namespace: NAMESPACE.to_owned(),
        id: id.clone(),
    };
    let _next_pid = NEXT_PID.lock().await;
    let spec = support::machine_spec(&id, NAMESPACE, image, scratch.path(), Network::Host);
    runtime.create_machine(&spec).await.unwrap();
    let (Some(sandbox), Some(gofer)) = sandbox_processes(&id) else {
        panic!("machine {id} runs no runsc sandbox and gofer on this host");
    };

    // The sandbox ends (as one killed past its pids or memory limit does), and its gofer with it;
    // then two processes that have nothing to do with the machine take their pids.
    assert!(signal(sandbox, "-KILL"));
    wait_gone(sandbox);
    wait_gone(gofer);
    let bystanders = [Occupant::of(sandbox), Occupant::of(gofer)];

    // Unguarded, runsc's delete either kills them (forced) or takes one for the sandbox still
    // running and refuses to delete (not forced, as containerd's shim asks first).
    let removed = runtime.remove(&id).await;
    for bystander in &bystanders {
        assert!(
            bystander.survives(),
            "removing the machine killed pid {}, which its ended sandbox once had",
            bystander.pid
        );
    }
    drop(bystanders);
    removed.expect("a machine whose sandbox ended is removed");
    assert_eq!(runtime.inspect(&id).await.unwrap(), MachineState::Missing);
    assert_eq!(sandbox_processes(&id), (None, None));
    // runsc removed the machine's cgroup (cgroup v1, as on these hosts) from its own pid
    // namespace all the same.
    let cgroup = PathBuf::from(format!("/sys/fs/cgroup/pids/{NAMESPACE}/{id}"));
    assert!(
        !cgroup.exists(),
        "the sandbox's cgroup {} is left",
        cgroup.display()
    );
}

/// runsc through the wrapper with no engine around it: a bundle of its own (the host's root,
/// read-only, running `sleep`) in a state directory of its own, so that each way a delete can
/// find a sandbox is set up exactly.
struct Direct {
    _dir: tempfile::TempDir,
    wrapper: PathBuf,
    root: PathBuf,
    bundle: PathBuf,
}

impl Drop for Direct {
    /// Also when the test failed: every container it made is deleted, and any runsc process
    /// of its state directory still left (a stopped gofer, say) is killed.
    fn drop(&mut self) {
        let (_, listed) = self.run(&["list", "--quiet"]);
        for id in listed.split_whitespace() {
            self.run(&["delete", "--force", id]);
        }
        let ours = format!("--root={}", self.root.display());
        for (pid, args) in processes() {
            if args.first().is_some_and(|a| a.starts_with("runsc")) && args.contains(&ours) {
                signal(pid, "-KILL");
            }
        }
    }
}

impl Direct {
    fn new() -> Option<Direct> {
        support::gvisor("/usr/bin/runsc")?;
        let dir = tempfile::tempdir().unwrap();
        let wrapper = narya_runtimes::sandbox::write_wrapper(
            std::path::Path::new("/usr/bin/runsc"),
            &dir.path().join("narya-runsc"),
        )
        .expect("the wrapper is written");
        let bundle = dir.path().join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        let config = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {
                "user": {"uid": 0, "gid": 0},
                "args": ["/bin/sleep", "600"],
                "env": ["PATH=/usr/bin:/bin"],
                "cwd": "/"
            },
            "root": {"path": "/", "readonly": true},
            "hostname": "direct",
            "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]}
        });
        std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
        Some(Direct {
            root: dir.path().join("state"),
            _dir: dir,
            wrapper,
            bundle,
        })
    }

    /// `wrapper --root ROOT args…`: whether it succeeded within a minute, and what it said. Its
    /// output goes to a file: a container's processes keep the output they were started with
    /// open.
    fn run(&self, args: &[&str]) -> (bool, String) {
        let said = self.root.with_extension("said");
        let file = std::fs::File::create(&said).unwrap();
        let mut child = Command::new(&self.wrapper)
            .arg("--root")
            .arg(&self.root)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("the wrapper runs");
        // A delete that hangs (runsc asking a stopped sandbox) fails the test, not the run.
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let said = std::fs::read_to_string(&said).unwrap_or_default();
        match status {
            Some(status) => (status.success(), said),
            None => (
                false,
                format!("{args:?} did not finish within 60 s: {said}"),
            ),
        }
    }

    /// Starts container `id`; its sandbox's and gofer's host pids.
    fn up(&self, id: &str) -> (i32, i32) {
        let bundle = self.bundle.display().to_string();
        let (created, said) = self.run(&["create", "--bundle", &bundle, id]);
        assert!(created, "runsc create: {said}");
        let (started, said) = self.run(&["start", id]);
        assert!(started, "runsc start: {said}");
        let sandbox = sandbox_processes(id)
            .0
            .expect("the container's sandbox runs");
        let gofer = gofer_of(&self.bundle).expect("the container's gofer runs");
        (sandbox, gofer)
    }

    /// What runsc lists in this state directory.
    fn listed(&self) -> String {
        let (_, said) = self.run(&["list", "--quiet"]);
        said.trim().to_owned()
    }
}

/// The gofer serving `bundle`.
fn gofer_of(bundle: &std::path::Path) -> Option<i32> {
    let wanted = format!("--bundle={}", bundle.display());
    processes()
        .into_iter()
        .find(|(_, args)| is_runsc(args, "runsc-gofer") && args.contains(&wanted))
        .map(|(pid, _)| pid)
}

/// Whether `pid` is a process that has not ended (an unreaped one has ended).
fn runs(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z' && state != 'X')
        })
        .unwrap_or(false)
}

/// Every way a delete can find a sandbox, with runsc alone: nothing but the sandbox's own
/// processes is ever killed, what is still the sandbox's is ended, and a running container is
/// still refused a delete without `--force`.
#[test]
fn the_wrapper_deletes_a_sandbox_in_every_state_without_reaching_other_processes() {
    let Some(direct) = Direct::new() else {
        return;
    };
    let tag = std::process::id();
    let _next_pid = NEXT_PID.blocking_lock();

    // Ended, sandbox and gofer both, and their pids taken by others.
    let id = format!("ended-{tag}");
    let (sandbox, gofer) = direct.up(&id);
    assert!(signal(sandbox, "-KILL"));
    wait_gone(sandbox);
    wait_gone(gofer);
    let occupants = [Occupant::of(sandbox), Occupant::of(gofer)];
    let (deleted, said) = direct.run(&["delete", "--force", &id]);
    for occupant in &occupants {
        assert!(
            occupant.survives(),
            "the delete killed pid {}",
            occupant.pid
        );
    }
    drop(occupants);
    assert!(deleted, "{said}");

    // The sandbox lives on (stopped, so that it cannot follow), its gofer ended and its pid is
    // taken: forced, the sandbox goes and the other process stays.
    let id = format!("goferless-{tag}");
    let (sandbox, gofer) = direct.up(&id);
    assert!(signal(sandbox, "-STOP") && signal(gofer, "-KILL"));
    wait_gone(gofer);
    let occupant = Occupant::of(gofer);
    assert!(runs(sandbox), "the sandbox outlived its gofer");
    let (deleted, said) = direct.run(&["delete", "--force", &id]);
    assert!(occupant.survives(), "the delete killed pid {gofer}");
    drop(occupant);
    assert!(deleted, "{said}");
    assert!(!runs(sandbox), "the forced delete left the sandbox running");

    // Running: refused without --force, and nothing is killed; with it, sandbox and gofer go.
    let id = format!("running-{tag}");
    let (sandbox, gofer) = direct.up(&id);
    let (deleted, said) = direct.run(&["delete", &id]);
    assert!(!deleted && said.contains("--force"), "{said}");
    assert!(runs(sandbox) && runs(gofer));
    let (deleted, said) = direct.run(&["delete", "--force", &id]);
    assert!(deleted, "{said}");
    assert!(!runs(sandbox) && !runs(gofer));

    // The sandbox ended and its gofer is left (stopped, so it cannot follow): the gofer goes.
    let id = format!("gofer-left-{tag}");
    let (sandbox, gofer) = direct.up(&id);
    assert!(signal(gofer, "-STOP") && signal(sandbox, "-KILL"));
    wait_gone(sandbox);
    let (deleted, said) = direct.run(&["delete", "--force", &id]);
    assert!(deleted, "{said}");
    assert!(!runs(gofer), "the gofer the ended sandbox left still runs");

    assert_eq!(direct.listed(), "", "runsc still lists containers");
}
