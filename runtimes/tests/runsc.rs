//! What gVisor's runsc would do to the host, and Narya's wrapper keeps it from: runsc's delete
//! kills the pids it recorded for a sandbox and its gofer whether or not they are still theirs.
//! Against the real containerd, whose removal comes when the daemon asks (Docker and Podman
//! delete a task the moment it ends, so nothing can take its pids first in a test; they run the
//! same wrapper).

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

/// The host processes of machine `id`'s sandbox: runsc's sandbox (`runsc-sandbox … ID`) and
/// its gofer (`runsc-gofer … --bundle=…/ID`).
fn sandbox_processes(id: &str) -> (Option<i32>, Option<i32>) {
    let (mut sandbox, mut gofer) = (None, None);
    let bundle_suffix = format!("/{id}");
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        match args.first().map(String::as_str) {
            Some("runsc-sandbox") if args.last().is_some_and(|a| a == id) => sandbox = Some(pid),
            Some("runsc-gofer")
                if args.iter().any(|a| {
                    a.strip_prefix("--bundle=")
                        .is_some_and(|b| b.ends_with(&bundle_suffix))
                }) =>
            {
                gofer = Some(pid)
            }
            _ => {}
        }
    }
    (sandbox, gofer)
}

/// Waits until no process has pid `pid` (not even an unreaped one).
fn wait_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while PathBuf::from(format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "pid {pid} did not go");
        std::thread::sleep(Duration::from_millis(50));
    }
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

    /// Whether it still runs; it is ended either way afterwards.
    fn still_ran(self) -> bool {
        let ran = !self.ended.is_finished();
        // Not once it ended: its pid is free for anyone again.
        if ran {
            let _ = Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .status();
        }
        let _ = self.ended.join();
        ran
    }
}

/// Removes machine `id` with containerd's own CLI when dropped, also when the test failed.
struct Removal {
    socket: String,
    id: String,
}

impl Drop for Removal {
    fn drop(&mut self) {
        let ctr = ["--address", &self.socket, "--namespace", NAMESPACE];
        for args in [
            &["tasks", "kill", "--signal", "SIGKILL", &self.id][..],
            &["tasks", "delete", "--force", &self.id],
            &["containers", "delete", &self.id],
            &["snapshots", "remove", &self.id],
        ] {
            let _ = Command::new("ctr").args(ctr).args(args).output();
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
    let _removal = Removal {
        socket: socket.clone(),
        id: id.clone(),
    };
    let spec = support::machine_spec(&id, NAMESPACE, image, scratch.path(), Network::Host);
    runtime.create_machine(&spec).await.unwrap();
    let (Some(sandbox), Some(gofer)) = sandbox_processes(&id) else {
        panic!("machine {id} runs no runsc sandbox and gofer on this host");
    };

    // The sandbox ends (as one killed past its pids or memory limit does), and its gofer with it;
    // then two processes that have nothing to do with the machine take their pids.
    let killed = Command::new("kill")
        .args(["-KILL", &sandbox.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    wait_gone(sandbox);
    wait_gone(gofer);
    let bystanders = [Occupant::of(sandbox), Occupant::of(gofer)];

    // Unguarded, runsc's delete either kills them (forced) or takes one for the sandbox still
    // running and refuses to delete (not forced, as containerd's shim asks first).
    let removed = runtime.remove(&id).await;
    for bystander in bystanders {
        let pid = bystander.pid;
        assert!(
            bystander.still_ran(),
            "removing the machine killed pid {pid}, which its ended sandbox once had"
        );
    }
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
