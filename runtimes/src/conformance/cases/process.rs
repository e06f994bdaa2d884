//! The process group: a process run in a machine, its exit code, environment, working
//! directory, output (limited, streamed) and stdin, and its killing, with its descendants, on a
//! time-out or an abandoned stream.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{check, fail, text, CaseFn, Context, Outcome};
use crate::{ProcessSpec, RuntimeError};

pub(super) fn all() -> Vec<(&'static str, &'static str, CaseFn)> {
    vec![
        case!("process", exit_code_env_cwd_and_output_come_through),
        case!("process", output_limit_keeps_the_tail),
        case!("process", stdin_is_passed_through),
        case!("process", output_streams_while_the_process_runs),
        case!("process", an_abandoned_stream_kills_the_process),
        case!("process", time_out_kills_the_process_and_its_descendants),
        case!(
            "process",
            a_child_holding_the_output_does_not_hold_the_answer
        ),
        case!("process", run_in_a_missing_machine_is_not_found),
    ]
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

/// A process that ends leaving a child that keeps writing to its output (a server it started)
/// answers with its own exit code and output, not at the child's end or at its own bound (on
/// Docker the engine may keep the stream open after the process ended: the back end asks the
/// engine instead). The child dies of the closed output once nobody reads it.
async fn a_child_holding_the_output_does_not_hold_the_answer(
    c: &Context<'_>,
) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let started = Instant::now();
    let out = c
        .run(
            &id,
            "(while :; do echo tick; sleep 0.2; done) & echo parent; exit 3",
            BTreeMap::new(),
            None,
            Duration::from_secs(240),
            4096,
        )
        .await?;
    let took = started.elapsed();
    check(out.exit_code == Some(3) && !out.timed_out, || {
        format!("{out:?}")
    })?;
    check(text(&out).contains("parent"), || {
        format!("output {:?}", text(&out))
    })?;
    // The child writes for ever and the bound is 240 s: anything near a minute waited for one.
    check(took < Duration::from_secs(60), || {
        format!("answered after {took:?}")
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
