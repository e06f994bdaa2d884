//! The cases of the conformance suite.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use narya_oci::Digest;

use super::network::{
    another_machine_is_unreachable, host_addresses_are_unreachable, ipv6_is_off,
    outbound_reaches_the_outside, resolv_conf_names_the_resolvers,
};
use super::{CaseFn, Context, Outcome};
use crate::{
    Change, ImageSource, MachineSpec, MachineState, PinnedImage, ProcessOutcome, ProcessSpec,
    RuntimeError, ThrowawaySpec,
};

macro_rules! case {
    ($group:literal, $name:ident) => {
        (
            $group,
            stringify!($name),
            (|c| Box::pin($name(c))) as CaseFn,
        )
    };
}

mod isolation;
mod output;
mod sandbox;

pub(super) fn all() -> Vec<(&'static str, &'static str, CaseFn)> {
    let mut cases = vec![
        case!("image", image_pinned_by_digest_is_idempotent),
        case!("image", unknown_digest_fails_as_an_image_error),
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
        case!("process", exit_code_env_cwd_and_output_come_through),
        case!("process", output_limit_keeps_the_tail),
        case!("process", stdin_is_passed_through),
        case!("process", output_streams_while_the_process_runs),
        case!("process", an_abandoned_stream_kills_the_process),
        case!("process", time_out_kills_the_process_and_its_descendants),
        case!("process", run_in_a_missing_machine_is_not_found),
        case!("throwaway", throwaway_sees_the_workspace_and_leaves_nothing),
        case!("throwaway", throwaway_time_out_is_reported_and_cleaned_up),
        case!("errors", unreachable_runtime_is_unavailable),
        case!("network", host_addresses_are_unreachable),
        case!("network", another_machine_is_unreachable),
        case!("network", outbound_reaches_the_outside),
        case!("network", ipv6_is_off),
        case!("network", resolv_conf_names_the_resolvers),
    ];
    cases.extend(output::all());
    cases.extend(isolation::all());
    cases.extend(sandbox::all());
    cases
}

/// Kills the machine's main process (`sleep infinity` under tini) from inside, as the OOM killer
/// would: init then exits and the machine stops. This shell and init itself are skipped (the
/// glob runs in lexical order, and this shell's own command line names what it looks for).
const KILL_MAIN_PROCESS: &str = "for p in /proc/[0-9]*; do n=${p#/proc/}; [ \"$n\" = 1 ] || [ \"$n\" = $$ ] && continue; case \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" in '/bin/sleep infinity '|'sleep infinity ') kill -KILL $n;; esac; done";

pub(super) fn fail(message: impl Into<String>) -> Outcome {
    Outcome::Fail(message.into())
}

pub(super) fn check(condition: bool, message: impl FnOnce() -> String) -> Result<(), Outcome> {
    if condition {
        Ok(())
    } else {
        Err(fail(message()))
    }
}

impl Context<'_> {
    /// Whether machines run under gVisor, whose kernel keeps some of its `/proc` differently.
    pub(super) fn gvisor(&self) -> bool {
        matches!(self.fixture.sandbox, crate::Sandbox::Gvisor { .. })
    }

    /// `prctl(PR_GET_NO_NEW_PRIVS)` of a process run in machine `id`, for a kernel whose
    /// `/proc/<pid>/status` has no `NoNewPrivs` line (gVisor's).
    pub(super) async fn no_new_privs(&self, id: &str) -> Result<String, Outcome> {
        let out = self
            .sh(id, r#"perl -e 'print syscall(157, 39, 0, 0, 0, 0), "\n"'"#)
            .await?;
        Ok(text(&out).trim().to_owned())
    }

    /// The id of machine `n` of this case.
    pub(super) fn machine_id(&self, n: u32) -> String {
        let short: String = self
            .case
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(24)
            .collect();
        format!("{}-{short}-{n}", self.fixture.prefix)
    }

    pub(super) fn workspace(&self, id: &str) -> Result<PathBuf, Outcome> {
        let dir = self.fixture.scratch.join(id);
        std::fs::create_dir_all(&dir)?;
        nix::unistd::chown(
            &dir,
            Some(nix::unistd::Uid::from_raw(self.fixture.user.uid)),
            Some(nix::unistd::Gid::from_raw(self.fixture.user.gid)),
        )?;
        Ok(dir)
    }

    pub(super) async fn pinned(&self) -> Result<PinnedImage, Outcome> {
        Ok(self.runtime.ensure_image(&self.fixture.image).await?)
    }

    /// Makes and starts machine `n` with a fresh workspace.
    pub(super) async fn machine(&self, n: u32) -> Result<(String, PathBuf), Outcome> {
        let workspace = self.workspace(&self.machine_id(n))?;
        self.machine_on(n, workspace).await
    }

    /// Makes and starts machine `n` on `workspace`, a directory the case made.
    pub(super) async fn machine_on(
        &self,
        n: u32,
        workspace: PathBuf,
    ) -> Result<(String, PathBuf), Outcome> {
        let id = self.machine_id(n);
        let spec = MachineSpec {
            id: id.clone(),
            environment: environment_of(&id),
            organisation: self.fixture.prefix.clone(),
            image: self.pinned().await?,
            workspace: workspace.clone(),
            mount_point: self.fixture.mount_point.clone(),
            user: self.fixture.user,
            network: self.fixture.network,
            limits: self.fixture.limits,
            pool: None,
            labels: BTreeMap::new(),
            layer: None,
        };
        self.runtime.create_machine(&spec).await?;
        Ok((id, workspace))
    }

    pub(super) async fn sh(&self, id: &str, script: &str) -> Result<ProcessOutcome, Outcome> {
        self.run(
            id,
            script,
            BTreeMap::new(),
            None,
            Duration::from_secs(60),
            1 << 20,
        )
        .await
    }

    async fn run(
        &self,
        id: &str,
        script: &str,
        env: BTreeMap<String, String>,
        cwd: Option<&str>,
        timeout: Duration,
        output_limit: usize,
    ) -> Result<ProcessOutcome, Outcome> {
        Ok(self
            .runtime
            .run(
                id,
                &ProcessSpec {
                    argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
                    env,
                    cwd: cwd.map(str::to_owned),
                    timeout,
                    output_limit,
                    stdin: None,
                    output: None,
                },
            )
            .await?)
    }

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

pub(super) fn text(outcome: &ProcessOutcome) -> String {
    String::from_utf8_lossy(&outcome.output).into_owned()
}

/// Removes whatever machines a case made, whether it passed or not.
pub(super) async fn clean_up(context: &Context<'_>) {
    for n in 0..4 {
        let _ = context.runtime.remove(&context.machine_id(n)).await;
        let _ = std::fs::remove_dir_all(context.fixture.scratch.join(context.machine_id(n)));
    }
}

async fn image_pinned_by_digest_is_idempotent(c: &Context<'_>) -> Result<(), Outcome> {
    let first = c.pinned().await?;
    let again = c
        .runtime
        .ensure_image(&ImageSource {
            reference: c.fixture.image.reference.clone(),
            pinned: Some(first.digest.clone()),
        })
        .await?;
    check(again.digest == first.digest, || {
        format!("pinned {} then {}", first.digest, again.digest)
    })?;
    // Two callers at once both succeed with the same digest.
    let (a, b) = tokio::join!(
        c.runtime.ensure_image(&c.fixture.image),
        c.runtime.ensure_image(&c.fixture.image)
    );
    check(
        a?.digest == first.digest && b?.digest == first.digest,
        || "concurrent pins disagreed".to_owned(),
    )
}

async fn unknown_digest_fails_as_an_image_error(c: &Context<'_>) -> Result<(), Outcome> {
    let unknown: Digest = format!("sha256:{}", "0".repeat(64)).parse()?;
    match c
        .runtime
        .ensure_image(&ImageSource {
            reference: c.fixture.image.reference.clone(),
            pinned: Some(unknown),
        })
        .await
    {
        Err(RuntimeError::Image { .. }) => Ok(()),
        other => Err(fail(format!("expected an Image error, got {other:?}"))),
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

/// The environment identifier machine `id` serves: a shape no container name allows, so that
/// every identifier the contract allows must travel in a label, never in the machine's name.
fn environment_of(id: &str) -> String {
    format!("{id}..A_b-")
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

async fn exit_code_env_cwd_and_output_come_through(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let out = c.sh(&id, "echo out; echo err >&2; exit 7").await?;
    check(out.exit_code == Some(7) && !out.timed_out, || {
        format!("{out:?}")
    })?;
    let t = text(&out);
    check(t.contains("out\n") && t.contains("err\n"), || {
        format!("output {t:?}")
    })?;
    let env = BTreeMap::from([(
        "NARYA_CONFORMANCE".to_owned(),
        "a value with spaces".to_owned(),
    )]);
    let seen = c
        .run(
            &id,
            "echo \"$NARYA_CONFORMANCE\"; pwd",
            env,
            Some("/tmp"),
            Duration::from_secs(30),
            4096,
        )
        .await?;
    check(text(&seen) == "a value with spaces\n/tmp\n", || {
        format!("{:?}", text(&seen))
    })?;
    let default_cwd = c.sh(&id, "pwd").await?;
    check(text(&default_cwd).trim() == c.fixture.mount_point, || {
        format!("default cwd {:?}", text(&default_cwd))
    })
}

async fn output_limit_keeps_the_tail(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let out = c
        .run(
            &id,
            "i=0; while [ $i -lt 5000 ]; do i=$((i+1)); echo line-$i; done",
            BTreeMap::new(),
            None,
            Duration::from_secs(60),
            100,
        )
        .await?;
    check(out.output.len() <= 100 && out.output_truncated, || {
        format!(
            "{} bytes, truncated {}",
            out.output.len(),
            out.output_truncated
        )
    })?;
    check(text(&out).ends_with("line-5000\n"), || {
        format!("tail {:?}", text(&out))
    })?;
    let small = c.sh(&id, "echo short").await?;
    check(!small.output_truncated && text(&small) == "short\n", || {
        format!("{small:?}")
    })
}

async fn stdin_is_passed_through(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    // More than a pipe buffer, so the writer has to wait for the reader.
    let input: Vec<u8> = (0..200_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let out = c
        .runtime
        .run(
            &id,
            &ProcessSpec {
                argv: vec!["/bin/sh".into(), "-c".into(), "wc -c; echo done".into()],
                env: BTreeMap::new(),
                cwd: None,
                timeout: Duration::from_secs(30),
                output_limit: 4096,
                stdin: Some(input),
                output: None,
            },
        )
        .await?;
    check(
        text(&out).split_whitespace().collect::<Vec<_>>() == ["200000", "done"],
        || format!("{out:?}"),
    )?;
    let none = c.sh(&id, "cat; echo end").await?;
    check(text(&none) == "end\n", || {
        format!("without input: {:?}", text(&none))
    })
}

fn streamed(
    argv: &str,
    timeout: Duration,
    sink: tokio::sync::mpsc::Sender<Vec<u8>>,
) -> ProcessSpec {
    ProcessSpec {
        argv: vec!["/bin/sh".into(), "-c".into(), argv.into()],
        env: BTreeMap::new(),
        cwd: None,
        timeout,
        output_limit: 4096,
        stdin: None,
        output: Some(sink),
    }
}

async fn output_streams_while_the_process_runs(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let spec = streamed(
        "echo first; sleep 2; echo second",
        Duration::from_secs(30),
        tx,
    );
    let run = c.runtime.run(&id, &spec);
    tokio::pin!(run);
    let started = Instant::now();
    let first = tokio::select! {
        chunk = rx.recv() => chunk,
        outcome = &mut run => return Err(fail(format!("ended before any chunk arrived: {outcome:?}"))),
    };
    let first_at = started.elapsed();
    check(first.as_deref() == Some(b"first\n".as_slice()), || {
        format!("first chunk {first:?}")
    })?;
    let outcome = run.await?;
    let ended_at = started.elapsed();
    check(first_at + Duration::from_secs(1) < ended_at, || {
        format!("first chunk at {first_at:?}, end at {ended_at:?}: not streamed")
    })?;
    // Every chunk was sent before `run` returned.
    let mut rest = Vec::new();
    while let Ok(chunk) = rx.try_recv() {
        rest.extend(chunk);
    }
    check(rest == b"second\n", || {
        format!("rest {:?}", String::from_utf8_lossy(&rest))
    })?;
    check(
        text(&outcome) == "first\nsecond\n" && outcome.exit_code == Some(0),
        || format!("{outcome:?}"),
    )
}

async fn an_abandoned_stream_kills_the_process(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let spec = streamed(
        "echo up; sleep 1000 & sleep 1001",
        Duration::from_secs(60),
        tx,
    );
    let run = c.runtime.run(&id, &spec);
    tokio::pin!(run);
    tokio::select! {
        _ = rx.recv() => {}
        outcome = &mut run => return Err(fail(format!("ended early: {outcome:?}"))),
    }
    let started = Instant::now();
    drop(rx);
    let outcome = run.await?;
    check(outcome.exit_code.is_none() && !outcome.timed_out, || {
        format!("{outcome:?}")
    })?;
    check(started.elapsed() < Duration::from_secs(10), || {
        format!("killed after {:?}", started.elapsed())
    })?;
    let ps = c
        .sh(
            &id,
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done",
        )
        .await?;
    let listing = text(&ps);
    check(!listing.contains("sleep 100"), || {
        format!("still running: {listing}")
    })
}

async fn time_out_kills_the_process_and_its_descendants(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let started = Instant::now();
    let out = c
        .run(
            &id,
            "sleep 1000 & setsid sleep 1001 & echo started; sleep 1002",
            BTreeMap::new(),
            None,
            Duration::from_secs(1),
            4096,
        )
        .await?;
    let took = started.elapsed();
    check(out.timed_out && out.exit_code.is_none(), || {
        format!("{out:?}")
    })?;
    check(took < Duration::from_secs(10), || {
        format!("returned after {took:?}")
    })?;
    check(text(&out).contains("started"), || {
        format!("output {:?}", text(&out))
    })?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ps = c
        .sh(
            &id,
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done",
        )
        .await?;
    let listing = text(&ps);
    let left: Vec<&str> = listing
        .lines()
        .filter(|l| l.contains("sleep 100"))
        .collect();
    check(left.is_empty(), || {
        format!("still running in the machine: {left:?}")
    })
}

async fn run_in_a_missing_machine_is_not_found(c: &Context<'_>) -> Result<(), Outcome> {
    match c.sh(&c.machine_id(3), "true").await {
        Err(Outcome::Fail(_)) => {}
        other => {
            return Err(fail(format!(
                "expected NotFound, got {:?}",
                other.map(|o| o.exit_code)
            )))
        }
    }
    match c
        .runtime
        .run(
            &c.machine_id(3),
            &ProcessSpec {
                argv: vec!["true".into()],
                env: BTreeMap::new(),
                cwd: None,
                timeout: Duration::from_secs(5),
                output_limit: 10,
                stdin: None,
                output: None,
            },
        )
        .await
    {
        Err(RuntimeError::NotFound { .. }) => Ok(()),
        other => Err(fail(format!("expected NotFound, got {other:?}"))),
    }
}

async fn throwaway_sees_the_workspace_and_leaves_nothing(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, workspace) = c.machine(0).await?;
    std::fs::write(workspace.join("before"), "seen\n")?;
    let name = c.machine_id(2);
    let secret = "conformance-secret-7f3a";
    let out = c
        .runtime
        .run_throwaway(&ThrowawaySpec {
            name: name.clone(),
            image: c.pinned().await?,
            workspace: workspace.clone(),
            mount_point: c.fixture.mount_point.clone(),
            user: c.fixture.user,
            network: c.fixture.network,
            environment: name.clone(),
            organisation: "conformance".to_owned(),
            limits: c.fixture.limits,
            process: ProcessSpec {
                argv: vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    "cat before; id -u; echo made > from-throwaway; test -n \"$SECRET\" && echo has-secret".into(),
                ],
                env: BTreeMap::from([("SECRET".to_owned(), secret.to_owned())]),
                cwd: None,
                timeout: Duration::from_secs(60),
                output_limit: 4096,
                stdin: None,
                output: None,
            },
        })
        .await?;
    let t = text(&out);
    check(out.exit_code == Some(0), || {
        format!("throwaway failed: {out:?}")
    })?;
    check(
        t == format!("seen\n{}\nhas-secret\n", c.fixture.user.uid),
        || format!("output {t:?}"),
    )?;
    let made = workspace.join("from-throwaway");
    let meta = std::fs::metadata(&made).map_err(|e| fail(format!("{}: {e}", made.display())))?;
    check(meta.uid() == c.fixture.user.uid, || {
        format!("owned by {}", meta.uid())
    })?;
    let seen = c
        .sh(
            &id,
            &format!("cat {}/from-throwaway", c.fixture.mount_point),
        )
        .await?;
    check(text(&seen) == "made\n", || {
        format!("machine read {:?}", text(&seen))
    })?;
    let environ = c
        .sh(&id, "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'")
        .await?;
    check(!text(&environ).contains(secret), || {
        "the throwaway's secret is visible in the machine".into()
    })?;
    check(
        c.runtime.inspect(&name).await? == MachineState::Missing,
        || format!("throwaway {name} left behind"),
    )?;
    check(
        !c.runtime.list().await?.iter().any(|m| m.id == name),
        || "throwaway listed as a machine".into(),
    )?;
    check(
        !c.runtime
            .list_throwaways()
            .await?
            .iter()
            .any(|t| t.name == name),
        || format!("throwaway {name} still listed"),
    )
}

async fn throwaway_time_out_is_reported_and_cleaned_up(c: &Context<'_>) -> Result<(), Outcome> {
    let id = c.machine_id(0);
    let workspace = c.workspace(&id)?;
    let name = c.machine_id(2);
    let started = Instant::now();
    let out = c
        .runtime
        .run_throwaway(&ThrowawaySpec {
            name: name.clone(),
            image: c.pinned().await?,
            workspace,
            mount_point: c.fixture.mount_point.clone(),
            user: c.fixture.user,
            network: c.fixture.network,
            environment: name.clone(),
            organisation: "conformance".to_owned(),
            limits: c.fixture.limits,
            process: ProcessSpec {
                argv: vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    "echo begun; sleep 1000 & sleep 1000".into(),
                ],
                env: BTreeMap::new(),
                cwd: None,
                timeout: Duration::from_secs(1),
                output_limit: 4096,
                stdin: None,
                output: None,
            },
        })
        .await?;
    check(out.timed_out && out.exit_code.is_none(), || {
        format!("{out:?}")
    })?;
    check(text(&out).contains("begun"), || {
        format!("output {:?}", text(&out))
    })?;
    check(started.elapsed() < Duration::from_secs(15), || {
        format!("took {:?}", started.elapsed())
    })?;
    check(
        c.runtime.inspect(&name).await? == MachineState::Missing,
        || format!("throwaway {name} left behind"),
    )
}

async fn unreachable_runtime_is_unavailable(c: &Context<'_>) -> Result<(), Outcome> {
    let Some(unreachable) = c.fixture.unreachable.as_deref() else {
        return Err(Outcome::Skip(
            "the fixture gives no unreachable runtime".into(),
        ));
    };
    match unreachable.inspect(&c.machine_id(0)).await {
        Err(RuntimeError::Unavailable { .. }) => {}
        other => {
            return Err(fail(format!(
                "inspect: expected Unavailable, got {other:?}"
            )))
        }
    }
    match unreachable.list().await {
        Err(RuntimeError::Unavailable { .. }) => {}
        other => return Err(fail(format!("list: expected Unavailable, got {other:?}"))),
    }
    match unreachable.remove(&c.machine_id(0)).await {
        Err(RuntimeError::Unavailable { .. }) => Ok(()),
        other => Err(fail(format!("remove: expected Unavailable, got {other:?}"))),
    }
}
