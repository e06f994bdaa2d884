//! Host-side process control: killing a process and every descendant it started, and finding
//! the processes in a machine that carry a mark in their environment.

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

/// The pid namespace of process `pid`, as `/proc/<pid>/ns/pid` names it.
fn pid_namespace(pid: u32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// The processes in the pid namespace of `init` (the machine's init, itself excluded) whose
/// environment has the entry `entry` (`KEY=VALUE`) as they were started. Reading another
/// process's environment takes the rights of its owner or root; what cannot be read is passed.
pub fn marked(init: u32, entry: &str) -> Vec<u32> {
    let Some(namespace) = pid_namespace(init) else {
        return Vec::new();
    };
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    processes
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != init && pid_namespace(*pid).as_ref() == Some(&namespace))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|environ| environ.split(|b| *b == 0).any(|e| e == entry.as_bytes()))
        })
        .collect()
}

/// Kills every process in `init`'s pid namespace marked with `entry` (see [`marked`]), looking
/// again until none is left (a marked process may fork while it is being killed), a few times
/// at most. Returns how many were killed.
pub fn kill_marked(init: u32, entry: &str) -> usize {
    // A process killed in one round may not have ended by the next: it is signalled again but
    // counted once.
    let mut killed = std::collections::BTreeSet::new();
    for _ in 0..5 {
        let found = marked(init, entry);
        let alive: Vec<u32> = found.into_iter().filter(|p| !is_zombie(*p)).collect();
        if alive.is_empty() {
            break;
        }
        for pid in alive {
            if let Ok(raw) = i32::try_from(pid) {
                if kill(Pid::from_raw(raw), Signal::SIGKILL).is_ok() {
                    killed.insert(pid);
                }
            }
        }
    }
    killed.len()
}

/// Whether `pid` has ended and waits for its parent to reap it.
fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state == 'Z' || state == 'X')
        })
        .unwrap_or(true)
}

/// This process's hard limit of open files (`RLIMIT_NOFILE`): what a runtime started like it
/// can give its containers at most. `None` when it cannot be read.
pub fn hard_nofile() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(_, hard)| hard)
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

    #[test]
    fn kill_marked_takes_only_processes_with_the_mark_even_outside_the_tree() {
        let mark = format!("NARYA_TEST_MARK={}.1", std::process::id());
        let other = format!("NARYA_TEST_MARK={}.2", std::process::id());
        let spawn = |entry: &str| {
            let (key, value) = entry.split_once('=').unwrap();
            std::process::Command::new("setsid")
                .args(["sleep", "1000"])
                .env(key, value)
                .spawn()
                .unwrap()
        };
        let mut marked_child = spawn(&mark);
        let mut other_child = spawn(&other);
        // Our own pid stands for the machine's init: same namespace, and never itself killed.
        let me = std::process::id();
        let mut found = Vec::new();
        for _ in 0..250 {
            found = marked(me, &mark);
            if !found.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(found, vec![marked_child.id()]);
        assert_eq!(kill_marked(me, &mark), 1);
        marked_child.wait().unwrap();
        assert!(marked(me, &mark).is_empty());
        assert_eq!(marked(me, &other), vec![other_child.id()]);
        let _ = other_child.kill();
        let _ = other_child.wait();
    }
}
