//! The machine group: a machine's life cycle as the runtime reports it (create, inspect,
//! start, list, changes, remove), its workspace, the unprivileged user it runs as, and reaching
//! its processes from the host.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use super::{check, environment_of, fail, text, CaseFn, Context, Outcome};
use crate::{Change, MachineSpec, MachineState, RuntimeError};

pub(super) fn all() -> Vec<(&'static str, &'static str, CaseFn)> {
    vec![
        case!("machine", machine_runs_unprivileged),
        case!("machine", create_on_an_existing_id_is_already_exists),
        case!("machine", workspace_is_read_write_and_survives_remove),
        case!("machine", inspect_follows_running_stopped_missing),
        case!(
            "machine",
            start_brings_a_stopped_machine_back_with_its_workspace
        ),
        case!("machine", list_returns_exactly_our_machines),
        case!("machine", changes_report_a_machine_that_stopped),
        case!("machine", remove_is_idempotent),
        case!(
            "machine",
            init_pid_and_kill_marked_reach_the_machines_processes
        ),
    ]
}

/// Kills the machine's main process (`sleep infinity` under tini) from inside, as the OOM killer
/// would: init then exits and the machine stops. This shell and init itself are skipped (the
/// glob runs in lexical order, and this shell's own command line names what it looks for).
const KILL_MAIN_PROCESS: &str = "for p in /proc/[0-9]*; do n=${p#/proc/}; [ \"$n\" = 1 ] || [ \"$n\" = $$ ] && continue; case \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" in '/bin/sleep infinity '|'sleep infinity ') kill -KILL $n;; esac; done";

impl Context<'_> {
    async fn wait_for_state(&self, id: &str, want: MachineState) -> Result<(), Outcome> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let state = self.runtime.inspect(id).await?;
            if state == want {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(fail(format!("{id} stayed {state:?}, expected {want:?}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn machine_runs_unprivileged(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let ids = c.sh(&id, "id -u; id -g").await?;
    let want = format!("{}\n{}\n", c.fixture.user.uid, c.fixture.user.gid);
    check(text(&ids) == want, || {
        format!("id printed {:?}, expected {want:?}", text(&ids))
    })?;
    // The machine's own init as well as a process run in it.
    for pid in ["1", "self"] {
        let status = c.sh(&id, &format!("cat /proc/{pid}/status")).await?;
        let status = text(&status);
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
                .unwrap_or_default()
        };
        let uid = c.fixture.user.uid.to_string();
        check(field("Uid:").split(' ').all(|u| u == uid), || {
            format!("/proc/{pid}: Uid {}", field("Uid:"))
        })?;
        // gVisor's status has no such line: its process run here asks the kernel itself (its
        // init, started with the same `noNewPrivileges`, cannot be asked from outside it).
        let no_new_privs = match field("NoNewPrivs:") {
            absent if absent.is_empty() && c.gvisor() && pid == "self" => {
                c.no_new_privs(&id).await?
            }
            absent if absent.is_empty() && c.gvisor() => "1".to_owned(),
            seen => seen,
        };
        check(no_new_privs == "1", || {
            format!("/proc/{pid}: NoNewPrivs {no_new_privs:?}")
        })?;
        check(field("CapEff:") == "0000000000000000", || {
            format!("/proc/{pid}: CapEff {}", field("CapEff:"))
        })?;
        check(field("CapBnd:") == "0000000000000000", || {
            format!("/proc/{pid}: CapBnd {}", field("CapBnd:"))
        })?;
    }
    Ok(())
}

async fn create_on_an_existing_id_is_already_exists(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, workspace) = c.machine(0).await?;
    let spec = MachineSpec {
        id: id.clone(),
        environment: environment_of(&id),
        organisation: c.fixture.prefix.clone(),
        image: c.pinned().await?,
        workspace,
        mount_point: c.fixture.mount_point.clone(),
        user: c.fixture.user,
        network: c.fixture.network,
        limits: c.fixture.limits,
        pool: None,
        labels: BTreeMap::new(),
        layer: None,
    };
    match c.runtime.create_machine(&spec).await {
        Err(RuntimeError::AlreadyExists { .. }) => {}
        other => return Err(fail(format!("expected AlreadyExists, got {other:?}"))),
    }
    // The first machine is untouched.
    check(
        c.runtime.inspect(&id).await? == MachineState::Running,
        || "the first machine stopped".into(),
    )
}

async fn workspace_is_read_write_and_survives_remove(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, workspace) = c.machine(0).await?;
    let mount = &c.fixture.mount_point;
    let wrote = c
        .sh(&id, &format!("echo data > {mount}/made-inside && echo ok"))
        .await?;
    check(wrote.exit_code == Some(0), || {
        format!("writing failed: {}", text(&wrote))
    })?;
    let file = workspace.join("made-inside");
    let meta = std::fs::metadata(&file).map_err(|e| fail(format!("{}: {e}", file.display())))?;
    check(meta.uid() == c.fixture.user.uid, || {
        format!("file owned by {}", meta.uid())
    })?;
    std::fs::write(workspace.join("made-outside"), "hello\n")?;
    let read = c.sh(&id, &format!("cat {mount}/made-outside")).await?;
    check(text(&read) == "hello\n", || {
        format!("read {:?}", text(&read))
    })?;
    c.runtime.remove(&id).await?;
    check(file.exists(), || "remove deleted the workspace".into())
}

async fn inspect_follows_running_stopped_missing(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    check(
        c.runtime.inspect(&id).await? == MachineState::Running,
        || "not running after create".into(),
    )?;
    // The machine's main process dies (as on OOM or a kill from outside): its init exits.
    let _ = c.sh(&id, KILL_MAIN_PROCESS).await;
    c.wait_for_state(&id, MachineState::Stopped).await?;
    c.runtime.remove(&id).await?;
    check(
        c.runtime.inspect(&id).await? == MachineState::Missing,
        || "not missing after remove".into(),
    )
}

async fn start_brings_a_stopped_machine_back_with_its_workspace(
    c: &Context<'_>,
) -> Result<(), Outcome> {
    let (id, workspace) = c.machine(0).await?;
    std::fs::write(workspace.join("kept"), "still here\n")?;
    let _ = c.sh(&id, KILL_MAIN_PROCESS).await;
    c.wait_for_state(&id, MachineState::Stopped).await?;
    c.runtime.start(&id).await?;
    check(
        c.runtime.inspect(&id).await? == MachineState::Running,
        || "not running after start".into(),
    )?;
    c.runtime.start(&id).await?;
    let read = c
        .sh(&id, &format!("cat {}/kept", c.fixture.mount_point))
        .await?;
    check(text(&read) == "still here\n", || {
        format!("read {:?}", text(&read))
    })
}

async fn list_returns_exactly_our_machines(c: &Context<'_>) -> Result<(), Outcome> {
    let (a, _) = c.machine(0).await?;
    let (b, _) = c.machine(1).await?;
    let digest = c.pinned().await?.digest;
    let ours = |list: Vec<crate::MachineInfo>| -> Vec<crate::MachineInfo> {
        list.into_iter()
            .filter(|m| m.id.starts_with(&format!("{}-", c.fixture.prefix)))
            .collect()
    };
    let listed = ours(c.runtime.list().await?);
    let ids: Vec<&str> = listed.iter().map(|m| m.id.as_str()).collect();
    check(ids == [a.as_str(), b.as_str()], || {
        format!("listed {ids:?}")
    })?;
    check(
        listed
            .iter()
            .all(|m| m.digest.as_ref() == Some(&digest) && m.state == MachineState::Running),
        || format!("listed {listed:?}"),
    )?;
    // Identifier and organisation come back from the labels exactly, whatever their shape.
    let labelled: Vec<(Option<&str>, Option<&str>)> = listed
        .iter()
        .map(|m| (m.environment.as_deref(), m.organisation.as_deref()))
        .collect();
    let (first, second) = (environment_of(&a), environment_of(&b));
    let organisation = Some(c.fixture.prefix.as_str());
    check(
        labelled
            == [
                (Some(first.as_str()), organisation),
                (Some(second.as_str()), organisation),
            ],
        || format!("labels read back as {labelled:?}"),
    )?;
    let of_second: Vec<String> = c
        .runtime
        .machines_of(&second)
        .await?
        .into_iter()
        .map(|m| m.id)
        .collect();
    check(of_second == [b.clone()], || {
        format!("machines_of({second:?}) answered {of_second:?}")
    })?;
    c.runtime.remove(&a).await?;
    let ids: Vec<String> = ours(c.runtime.list().await?)
        .into_iter()
        .map(|m| m.id)
        .collect();
    check(ids == [b.clone()], || {
        format!("after removing {a}: {ids:?}")
    })
}

async fn changes_report_a_machine_that_stopped(c: &Context<'_>) -> Result<(), Outcome> {
    use futures_util::StreamExt;
    let (id, _) = c.machine(0).await?;
    let mut changes = c.runtime.changes().await?;
    let _ = c.sh(&id, KILL_MAIN_PROCESS).await;
    // Other machines (other tests') report too; the stop is among the changes that arrive
    // within a few seconds, naming the machine, and the runtime may answer a moment later
    // than it reports.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut heard = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, changes.next()).await {
            Ok(Some(Change::Machine(named))) if named == id => {
                for _ in 0..50 {
                    if c.runtime.inspect(&id).await? == MachineState::Stopped {
                        return Ok(());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                return Err(fail(
                    "a change named the machine, but it never read stopped",
                ));
            }
            Ok(Some(other)) => {
                if heard.len() < 20 {
                    heard.push(other);
                }
            }
            Ok(None) => return Err(fail("the change stream ended")),
            Err(_) => {
                return Err(fail(format!(
                    "no change naming {id} within 30 s of it stopping; heard {heard:?}"
                )))
            }
        }
    }
}

async fn init_pid_and_kill_marked_reach_the_machines_processes(
    c: &Context<'_>,
) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let Some(init) = c.runtime.init_pid(&id).await? else {
        return Err(fail("a running machine has no init pid"));
    };
    let namespace = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    check(namespace(&init.to_string()).is_some(), || {
        format!("init pid {init} is no process on this host")
    })?;
    // Under gVisor the init pid is the sandbox's own host process; the machine's processes are
    // gVisor's, in no namespace of the host's.
    check(
        c.gvisor() || namespace(&init.to_string()) != namespace("self"),
        || format!("init pid {init} shares the host's pid namespace"),
    )?;
    // A process run in the machine, and one it left in the background, are killed by their
    // mark; a process without it lives on.
    let entry = format!("NARYA_CONFORMANCE={id}");
    let env = BTreeMap::from([("NARYA_CONFORMANCE".to_owned(), id.clone())]);
    let script = "(setsid sleep 30 &); echo started; sleep 20";
    let running = c.run(&id, script, env, None, Duration::from_secs(60), 1024);
    let unmarked = c.run(
        &id,
        "sleep 25; echo lived",
        BTreeMap::new(),
        None,
        Duration::from_secs(60),
        1024,
    );
    let killing = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let killed = c.runtime.kill_marked(&id, &entry).await;
            if !matches!(killed, Ok(n) if n < 3) || Instant::now() >= deadline {
                return killed;
            }
        }
    };
    let (ran, lived, killed) = tokio::join!(running, unmarked, killing);
    let killed = killed?;
    check(killed >= 3, || {
        format!("kill_marked killed {killed} processes, expected the shell and its two sleeps")
    })?;
    let ran = ran?;
    check(ran.exit_code != Some(0), || {
        format!("the marked process ran to its end: {ran:?}")
    })?;
    let lived = lived?;
    check(text(&lived).contains("lived"), || {
        format!("a process without the mark was killed: {lived:?}")
    })?;
    let left = c.runtime.kill_marked(&id, &entry).await?;
    check(left == 0, || {
        format!("{left} marked processes outlived the kill")
    })?;
    c.runtime.remove(&id).await?;
    let after = c.runtime.init_pid(&id).await?;
    check(after.is_none(), || {
        format!("a removed machine still has init pid {after:?}")
    })?;
    let gone = c.runtime.kill_marked(&id, &entry).await?;
    check(gone == 0, || {
        format!("kill_marked in a removed machine killed {gone}")
    })
}

async fn remove_is_idempotent(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    c.runtime.remove(&id).await?;
    c.runtime.remove(&id).await?;
    c.runtime.remove(&c.machine_id(3)).await?;
    check(
        c.runtime.inspect(&id).await? == MachineState::Missing,
        || "still there".into(),
    )
}
