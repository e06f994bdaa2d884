//! The pool's machines as the tests see them: in the daemon's pool directory, in the runtime
//! under the daemon's pool mark, and removed with the host even when a test fails.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use narya_runtimes::MachineState;

use crate::support::e2e::{Backend, Host};

/// How long a refill may take on a loaded, shared CI machine (Podman, starting one machine at a
/// time while other tests start theirs, once took more than 30 s).
pub(super) const REFILLED_WITHIN: Duration = Duration::from_secs(60);

pub(super) fn pool_dir(host: &Host) -> PathBuf {
    host.daemon.dir.path().join("state/workspaces/.pool")
}

/// This daemon's pool mark and its dash: the beginning of every `dev.narya.pool` label it
/// writes.
pub(super) fn owner(host: &Host) -> String {
    let workspaces = host.daemon.dir.path().join("state/workspaces");
    format!("{}-", narya::environments::pool_owner_mark(&workspaces))
}

/// The runtime's machines this daemon made for its pool, claimed or not, by name.
pub(super) async fn pool_machines(host: &Host) -> BTreeSet<String> {
    let owner = owner(host);
    // Podman reports a container it is stopping as `stopped`, which the engine API's client
    // cannot read; such a listing fails until the container is gone or `exited`.
    let deadline = Instant::now() + REFILLED_WITHIN;
    let listed = loop {
        match host.runtime.list().await {
            Ok(listed) => break listed,
            Err(e) if Instant::now() < deadline => {
                eprintln!("listing again: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the runtime lists: {e}"),
        }
    };
    let mut names = BTreeSet::new();
    for machine in listed {
        let ours = machine
            .pool
            .as_deref()
            .is_some_and(|p| p.starts_with(&owner))
            || pool_entry_is_link(host, &machine.id);
        if ours {
            names.insert(machine.id);
        }
    }
    names
}

pub(super) fn pool_entry_is_link(host: &Host, name: &str) -> bool {
    std::fs::symlink_metadata(pool_dir(host).join(name)).is_ok_and(|m| m.file_type().is_symlink())
}

/// The pool machines waiting to be claimed: an empty workspace of their own, running.
pub(super) async fn unclaimed(host: &Host) -> BTreeSet<String> {
    let Ok(entries) = std::fs::read_dir(pool_dir(host)) else {
        return BTreeSet::new();
    };
    let mut names = BTreeSet::new();
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if host.runtime.inspect(&name).await.ok() == Some(MachineState::Running) {
            names.insert(name);
        }
    }
    names
}

/// The pool machine environment `id` was served, found by the link its workspace left.
pub(super) fn claimed_machine(host: &Host, id: &str) -> Option<String> {
    let entries = std::fs::read_dir(pool_dir(host)).ok()?;
    entries.flatten().find_map(|entry| {
        let target = std::fs::read_link(entry.path()).ok()?;
        (target == host.workspace(id)).then(|| entry.file_name().to_string_lossy().into_owned())
    })
}

/// Waits until `size` machines wait in the pool and answers them.
pub(super) async fn full_pool(host: &Host, size: usize) -> BTreeSet<String> {
    let deadline = Instant::now() + REFILLED_WITHIN;
    loop {
        let ready = unclaimed(host).await;
        if ready.len() >= size {
            // Started and running; give the daemon a moment to count the last one in.
            tokio::time::sleep(Duration::from_millis(300)).await;
            return ready;
        }
        assert!(
            Instant::now() < deadline,
            "the pool held {} of {size} after {REFILLED_WITHIN:?}:\n{}",
            ready.len(),
            host.daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A host whose pool machines go with it even when the test fails: pool machines outlive
/// their daemon on purpose, so a panicking test would leave them running. On drop the daemon
/// is stopped first (it would start new ones), then every machine named in its pool directory
/// (claimed ones leave a link there) or labelled with its pool mark is removed with the
/// runtime's own client, and then its network and firewall chains (a Podman network left
/// behind holds its subnet, which a later test may lease).
pub(super) struct PoolHost(pub(super) Option<Host>);

impl std::ops::Deref for PoolHost {
    type Target = Host;
    fn deref(&self) -> &Host {
        self.0.as_ref().expect("the host is there until drop")
    }
}

impl std::ops::DerefMut for PoolHost {
    fn deref_mut(&mut self) -> &mut Host {
        self.0.as_mut().expect("the host is there until drop")
    }
}

impl Drop for PoolHost {
    fn drop(&mut self) {
        let Some(host) = self.0.take() else {
            return;
        };
        let (backend, socket, owner) = (host.backend, host.socket.clone(), owner(&host));
        // The daemon keeps its network and chains while machines of its remain (its pool's do).
        let tag = narya_runtimes::network::tag_for(
            &host.daemon.dir.path().join("state").display().to_string(),
        );
        let mut names: BTreeSet<String> = std::fs::read_dir(pool_dir(&host))
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        drop(host);
        let run = crate::support::cleanup::stdout_of;
        match backend {
            Backend::Containerd => {
                let ctr = [
                    "--address",
                    &socket,
                    "--namespace",
                    crate::support::e2e::NAMESPACE,
                ];
                let filter = format!("labels.\"dev.narya.pool\"~=\"^{owner}\"");
                let listed = run(
                    "ctr",
                    &[&ctr[..], &["containers", "ls", "-q", &filter]].concat(),
                );
                names.extend(listed.split_whitespace().map(str::to_owned));
                for name in &names {
                    run("ctr", &[&ctr[..], &["tasks", "rm", "-f", name]].concat());
                    run("ctr", &[&ctr[..], &["containers", "rm", name]].concat());
                }
            }
            Backend::Docker | Backend::Podman => {
                let host = format!("unix://{socket}");
                let listed = run(
                    "docker",
                    &[
                        "-H",
                        &host,
                        "ps",
                        "-a",
                        "--filter",
                        "label=dev.narya.pool",
                        "--format",
                        "{{.Names}} {{.Label \"dev.narya.pool\"}}",
                    ],
                );
                names.extend(listed.lines().filter_map(|line| {
                    let (name, mark) = line.split_once(' ')?;
                    mark.starts_with(&owner).then(|| name.to_owned())
                }));
                for name in &names {
                    run("docker", &["-H", &host, "rm", "-f", name]);
                }
                run(
                    "docker",
                    &["-H", &host, "network", "rm", &format!("narya-{tag}")],
                );
            }
        }
        narya_runtimes::network::remove_chains_of(&tag);
    }
}

/// Stops the daemon and removes every machine it made for its pool: pool machines outlive
/// the daemon on purpose.
pub(super) async fn clean_up(mut host: PoolHost) {
    tokio::task::block_in_place(|| host.daemon.terminate());
    for name in pool_machines(&host).await {
        let _ = host.runtime.remove(&name).await;
    }
}
