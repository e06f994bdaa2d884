//! Host-side process control: killing a process and every descendant it started.

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// Every descendant of `pid`, found through `/proc/<pid>/task/*/children`, deepest last.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(parent) = queue.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            for child in children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
            {
                if !found.contains(&child) {
                    found.push(child);
                    queue.push(child);
                }
            }
        }
    }
    found
}

/// Kills `pid`'s process group and every descendant, including those that left the group
/// with `setsid`. The tree is walked before anything is killed, so re-parented orphans are
/// still found.
pub fn kill_tree(pid: u32) {
    let tree = descendants(pid);
    let Ok(raw) = i32::try_from(pid) else { return };
    let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
    let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
    for child in tree {
        if let Ok(raw) = i32::try_from(child) {
            let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn kill_tree_takes_children_that_left_the_group() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 1000 & setsid sleep 1001 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut tree = Vec::new();
        for _ in 0..100 {
            tree = descendants(pid);
            if tree.len() >= 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(tree.len() >= 2, "children not seen: {tree:?}");
        kill_tree(pid);
        child.wait().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        for p in tree {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // Gone, or a zombie waiting for its reaper.
            assert!(
                stat.is_empty() || stat.contains(") Z "),
                "{p} survived: {stat}"
            );
        }
    }
}
