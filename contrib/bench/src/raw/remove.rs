//! Removing raw machines: tasks, containers and what CNI gave them, and the shims of machines
//! that no longer answer even a forced removal.

use std::time::Duration;

use anyhow::Result;
use tokio::process::Command;

use super::cni::release_addresses;
use super::{Backend, Hung, Raw, NAMESPACE, REMOVE_LIMIT};

impl Raw {
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
}
