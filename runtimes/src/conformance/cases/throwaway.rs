//! The throwaway group: a one-off container on a machine's workspace sees that workspace,
//! keeps its environment to itself and leaves nothing behind, also when it times out.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use super::{check, fail, text, CaseFn, Context, Outcome};
use crate::{MachineState, ProcessSpec, ThrowawaySpec};

pub(super) fn all() -> Vec<(&'static str, &'static str, CaseFn)> {
    vec![
        case!("throwaway", throwaway_sees_the_workspace_and_leaves_nothing),
        case!("throwaway", throwaway_time_out_is_reported_and_cleaned_up),
    ]
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
