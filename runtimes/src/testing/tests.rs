//! The fake runtime's own tests: it keeps the `Runtime` contract and obeys its controls.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::*;
use crate::{Network, User};

fn source(pinned: Option<Digest>) -> ImageSource {
    ImageSource {
        reference: "127.0.0.1:5000/narya/official:test".parse().unwrap(),
        pinned,
    }
}

async fn machine_spec(fake: &FakeRuntime, id: &str) -> MachineSpec {
    MachineSpec {
        id: id.to_owned(),
        environment: format!("{id}."),
        organisation: "acme".to_owned(),
        image: fake.ensure_image(&source(None)).await.unwrap(),
        workspace: PathBuf::from(format!("/srv/workspaces/{id}")),
        mount_point: "/workspace".to_owned(),
        user: User {
            uid: 1000,
            gid: 1000,
        },
        network: Network::None,
        limits: crate::Limits::default(),
        pool: None,
        labels: BTreeMap::new(),
        layer: None,
    }
}

/// A fake with machine `id` running.
async fn with_machine(id: &str) -> FakeRuntime {
    let fake = FakeRuntime::new();
    let spec = machine_spec(&fake, id).await;
    fake.create_machine(&spec).await.unwrap();
    fake
}

fn process(output: Option<mpsc::Sender<Vec<u8>>>, output_limit: usize) -> ProcessSpec {
    ProcessSpec {
        argv: vec!["/bin/sh".into(), "-c".into(), "true".into()],
        env: BTreeMap::from([("A".to_owned(), "1".to_owned())]),
        cwd: None,
        timeout: Duration::from_secs(60),
        output_limit,
        stdin: Some(b"input".to_vec()),
        output,
    }
}

fn says(output: &'static [u8]) -> impl Fn(&FakeProcess) -> FakeOutcome + Send + Sync {
    move |_| FakeOutcome::Exit {
        code: 0,
        output: output.to_vec(),
    }
}

#[tokio::test]
async fn a_new_fake_is_up_empty_and_pins_a_fixed_digest() {
    let fake = FakeRuntime::new();
    fake.version().await.unwrap();
    assert!(fake.list().await.unwrap().is_empty());
    let first = fake.ensure_image(&source(None)).await.unwrap();
    assert_eq!(first, fake.ensure_image(&source(None)).await.unwrap());
    let other = Digest::of(b"another image");
    fake.set_image_digest(other.clone());
    assert_eq!(
        fake.ensure_image(&source(None)).await.unwrap().digest,
        other
    );
    let pinned = fake.ensure_image(&source(Some(first.digest.clone()))).await;
    assert_eq!(pinned.unwrap().digest, first.digest);
    assert_eq!(fake.calls(Op::EnsureImage), 4);
}

#[tokio::test]
async fn create_keeps_the_spec_and_a_second_create_is_already_exists() {
    let fake = FakeRuntime::new();
    let spec = machine_spec(&fake, "env-a").await;
    let info = fake.create_machine(&spec).await.unwrap();
    assert_eq!(info.state, MachineState::Running);
    assert_eq!(info.digest.as_ref(), Some(&spec.image.digest));
    assert_eq!(fake.list().await.unwrap(), vec![info]);
    let kept = fake.machine_spec("env-a").unwrap();
    assert_eq!(kept.workspace, spec.workspace);
    let again = fake.create_machine(&spec).await.unwrap_err();
    assert_eq!(again.kind(), ErrorKind::AlreadyExists);
}

#[tokio::test]
async fn remove_is_idempotent_and_leaves_the_machine_missing() {
    let fake = with_machine("env-a").await;
    fake.remove("env-a").await.unwrap();
    fake.remove("env-a").await.unwrap();
    fake.remove("never-made").await.unwrap();
    assert_eq!(fake.inspect("env-a").await.unwrap(), MachineState::Missing);
    assert!(fake.machine_spec("env-a").is_none());
}

#[tokio::test]
async fn fail_next_fails_one_call_without_effect() {
    let fake = FakeRuntime::new();
    let spec = machine_spec(&fake, "env-a").await;
    fake.fail_next(Op::CreateMachine, ErrorKind::Other);
    fake.fail_next(Op::CreateMachine, ErrorKind::Unavailable);
    let first = fake.create_machine(&spec).await.unwrap_err();
    assert_eq!(first.kind(), ErrorKind::Other);
    let second = fake.create_machine(&spec).await.unwrap_err();
    assert_eq!(second.kind(), ErrorKind::Unavailable);
    assert!(fake.machines().is_empty());
    fake.create_machine(&spec).await.unwrap();
    assert_eq!(fake.calls(Op::CreateMachine), 3);
}

#[tokio::test]
async fn fail_always_fails_until_healed() {
    let fake = with_machine("env-a").await;
    fake.fail_always(Op::Inspect, ErrorKind::Unavailable);
    for _ in 0..3 {
        let failed = fake.inspect("env-a").await.unwrap_err();
        assert_eq!(failed.kind(), ErrorKind::Unavailable);
    }
    fake.heal(Op::Inspect);
    assert_eq!(fake.inspect("env-a").await.unwrap(), MachineState::Running);
    // Other operations were never touched.
    fake.list().await.unwrap();
}

#[tokio::test]
async fn a_fault_after_effect_leaves_the_effect_behind() {
    let fake = FakeRuntime::new();
    let spec = machine_spec(&fake, "env-a").await;
    fake.fail_next_after_effect(Op::CreateMachine, ErrorKind::Unavailable);
    let lost = fake.create_machine(&spec).await.unwrap_err();
    assert_eq!(lost.kind(), ErrorKind::Unavailable);
    assert_eq!(fake.inspect("env-a").await.unwrap(), MachineState::Running);
    fake.fail_next_after_effect(Op::Run, ErrorKind::Unavailable);
    let lost = fake.run("env-a", &process(None, 10)).await.unwrap_err();
    assert_eq!(lost.kind(), ErrorKind::Unavailable);
    assert_eq!(fake.processes().len(), 1);
}

#[tokio::test]
async fn a_stall_holds_calls_until_released() {
    let fake = Arc::new(FakeRuntime::new());
    let spec = machine_spec(&fake, "env-a").await;
    let stall = fake.stall(Op::CreateMachine);
    let create = tokio::spawn({
        let fake = Arc::clone(&fake);
        let spec = spec.clone();
        async move { fake.create_machine(&spec).await }
    });
    stall.reached().await;
    assert_eq!(fake.calls(Op::CreateMachine), 1);
    assert!(fake.machines().is_empty());
    assert!(!create.is_finished());
    stall.release();
    create.await.unwrap().unwrap();
    assert_eq!(fake.machines().len(), 1);
    // Released for good: later calls pass straight through.
    fake.remove("env-a").await.unwrap();
    fake.create_machine(&spec).await.unwrap();
}

#[tokio::test]
async fn dropping_a_stall_releases_it_and_faults_apply_after_it() {
    let fake = Arc::new(with_machine("env-a").await);
    let stall = fake.stall(Op::Remove);
    let remove = tokio::spawn({
        let fake = Arc::clone(&fake);
        async move { fake.remove("env-a").await }
    });
    stall.reached().await;
    // The runtime goes away while the call is held: the call sees it.
    fake.set_down(true);
    drop(stall);
    let failed = remove.await.unwrap().unwrap_err();
    assert_eq!(failed.kind(), ErrorKind::Unavailable);
    assert_eq!(fake.machines().len(), 1);
}

#[tokio::test]
async fn down_fails_every_call_unavailable_and_machines_survive() {
    let fake = with_machine("env-a").await;
    let spec = machine_spec(&fake, "env-b").await;
    fake.set_down(true);
    let errors = [
        fake.version().await.err(),
        fake.ensure_image(&source(None)).await.err(),
        fake.create_machine(&spec).await.err(),
        fake.run("env-a", &process(None, 10)).await.err(),
        fake.inspect("env-a").await.err(),
        fake.list().await.err(),
        fake.changes().await.err(),
        fake.start("env-a").await.err(),
        fake.remove("env-a").await.err(),
    ];
    for error in errors {
        assert_eq!(error.map(|e| e.kind()), Some(ErrorKind::Unavailable));
    }
    fake.set_down(false);
    assert_eq!(fake.inspect("env-a").await.unwrap(), MachineState::Running);
}

#[tokio::test]
async fn changes_nudge_on_every_machine_change_and_end_when_down() {
    let fake = with_machine("env-a").await;
    let mut changes = fake.changes().await.unwrap();
    fake.stop_machine("env-a");
    fake.start("env-a").await.unwrap();
    fake.lose_machine("env-a");
    let spec = machine_spec(&fake, "env-b").await;
    fake.create_machine(&spec).await.unwrap();
    fake.remove("env-b").await.unwrap();
    for id in ["env-a", "env-a", "env-a", "env-b", "env-b"] {
        assert_eq!(changes.next().await, Some(Change::Machine(id.to_owned())));
    }
    fake.set_down(true);
    assert_eq!(changes.next().await, None);
}

#[tokio::test]
async fn stopped_and_lost_machines_show_through_inspect_and_list() {
    let fake = with_machine("env-a").await;
    let spec = machine_spec(&fake, "env-b").await;
    fake.create_machine(&spec).await.unwrap();
    fake.stop_machine("env-a");
    fake.lose_machine("env-b");
    assert_eq!(fake.inspect("env-a").await.unwrap(), MachineState::Stopped);
    assert_eq!(fake.inspect("env-b").await.unwrap(), MachineState::Missing);
    let listed = fake.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].id.as_str(), listed[0].state),
        ("env-a", MachineState::Stopped)
    );
}

#[tokio::test]
async fn start_brings_a_stopped_machine_back_and_a_missing_one_is_not_found() {
    let fake = with_machine("env-a").await;
    fake.start("env-a").await.unwrap();
    fake.stop_machine("env-a");
    fake.start("env-a").await.unwrap();
    assert_eq!(fake.inspect("env-a").await.unwrap(), MachineState::Running);
    let missing = fake.start("env-b").await.unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);
}

#[tokio::test]
async fn run_in_a_stopped_or_missing_machine_is_not_found() {
    let fake = with_machine("env-a").await;
    fake.stop_machine("env-a");
    for id in ["env-a", "env-b"] {
        let failed = fake.run(id, &process(None, 10)).await.unwrap_err();
        assert_eq!(failed.kind(), ErrorKind::NotFound);
    }
    assert!(fake.processes().is_empty());
}

#[tokio::test]
async fn a_process_ends_as_scripted_and_is_recorded() {
    let fake = with_machine("env-a").await;
    let quiet = fake.run("env-a", &process(None, 10)).await.unwrap();
    assert_eq!((quiet.exit_code, quiet.output.len()), (Some(0), 0));
    fake.on_process(|p| FakeOutcome::Exit {
        code: if p.stdin.as_deref() == Some(b"input") {
            3
        } else {
            4
        },
        output: b"said\n".to_vec(),
    });
    let out = fake.run("env-a", &process(None, 10)).await.unwrap();
    assert_eq!(out.exit_code, Some(3));
    assert_eq!(out.output, b"said\n");
    assert!(!out.timed_out && !out.output_truncated);
    let ran = fake.processes();
    assert_eq!(ran.len(), 2);
    assert_eq!(ran[1].machine, "env-a");
    assert!(!ran[1].throwaway);
    assert_eq!(ran[1].env.get("A").map(String::as_str), Some("1"));
    assert_eq!(
        ran[1].workspace,
        Some(PathBuf::from("/srv/workspaces/env-a"))
    );
}

#[tokio::test]
async fn output_is_streamed_in_full_and_kept_to_its_tail() {
    let fake = with_machine("env-a").await;
    fake.on_process(says(b"first\nsecond\nthird\n"));
    let (tx, mut rx) = mpsc::channel(16);
    let out = fake.run("env-a", &process(Some(tx), 8)).await.unwrap();
    assert_eq!(out.output, b"d\nthird\n");
    assert!(out.output_truncated);
    let mut chunks = Vec::new();
    while let Some(chunk) = rx.recv().await {
        chunks.push(chunk);
    }
    assert_eq!(chunks, [&b"first\n"[..], b"second\n", b"third\n"]);
}

#[tokio::test]
async fn a_dropped_output_receiver_kills_the_process() {
    let fake = with_machine("env-a").await;
    fake.on_process(says(b"never read\n"));
    let (tx, rx) = mpsc::channel(16);
    drop(rx);
    let out = fake.run("env-a", &process(Some(tx), 100)).await.unwrap();
    assert_eq!(out.exit_code, None);
    assert!(!out.timed_out);
}

#[tokio::test]
async fn a_receiver_dropped_while_the_run_is_stalled_kills_it() {
    let fake = Arc::new(with_machine("env-a").await);
    let stall = fake.stall(Op::Run);
    let (tx, rx) = mpsc::channel(16);
    let run = tokio::spawn({
        let fake = Arc::clone(&fake);
        async move { fake.run("env-a", &process(Some(tx), 100)).await }
    });
    stall.reached().await;
    drop(rx);
    stall.release();
    let out = run.await.unwrap().unwrap();
    assert_eq!((out.exit_code, out.timed_out), (None, false));
}

#[tokio::test]
async fn a_timed_out_process_has_no_exit_code() {
    let fake = with_machine("env-a").await;
    fake.on_process(|_| FakeOutcome::TimedOut {
        output: b"started\n".to_vec(),
    });
    let out = fake.run("env-a", &process(None, 100)).await.unwrap();
    assert_eq!((out.exit_code, out.timed_out), (None, true));
    assert_eq!(out.output, b"started\n");
}

#[tokio::test]
async fn output_nobody_reads_times_the_process_out() {
    let fake = with_machine("env-a").await;
    fake.on_process(says(b"one\ntwo\nthree\n"));
    let (tx, _rx) = mpsc::channel(1);
    let mut spec = process(Some(tx), 100);
    spec.timeout = Duration::from_millis(50);
    let out = fake.run("env-a", &spec).await.unwrap();
    assert_eq!((out.exit_code, out.timed_out), (None, true));
    assert_eq!(out.output, b"one\ntwo\n");
}

#[tokio::test]
async fn a_throwaway_is_recorded_and_leaves_nothing() {
    let fake = FakeRuntime::new();
    let image = fake.ensure_image(&source(None)).await.unwrap();
    let spec = ThrowawaySpec {
        name: "env-a-clone".to_owned(),
        image,
        workspace: PathBuf::from("/srv/workspaces/env-a"),
        mount_point: "/workspace".to_owned(),
        user: User {
            uid: 1000,
            gid: 1000,
        },
        network: Network::Host,
        environment: "env-a".to_owned(),
        organisation: "acme".to_owned(),
        limits: crate::Limits::default(),
        process: process(None, 100),
    };
    let out = fake.run_throwaway(&spec).await.unwrap();
    assert_eq!(out.exit_code, Some(0));
    let ran = fake.processes();
    assert_eq!(
        (ran[0].machine.as_str(), ran[0].throwaway),
        ("env-a-clone", true)
    );
    assert_eq!(
        fake.inspect("env-a-clone").await.unwrap(),
        MachineState::Missing
    );
    assert!(fake.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_added_machine_is_listed_as_given() {
    let fake = FakeRuntime::new();
    let orphan = MachineInfo {
        id: "env-orphan".to_owned(),
        environment: Some("orphan".to_owned()),
        organisation: Some("globex".to_owned()),
        digest: Some(Digest::of(b"an older image")),
        state: MachineState::Stopped,
        pool: None,
    };
    fake.add_machine(orphan.clone());
    assert_eq!(fake.list().await.unwrap(), vec![orphan]);
    assert!(fake.machine_spec("env-orphan").is_none());
    fake.start("env-orphan").await.unwrap();
    let ran = fake.run("env-orphan", &process(None, 10)).await.unwrap();
    assert_eq!(ran.exit_code, Some(0));
    assert_eq!(fake.processes()[0].workspace, None);
}

#[test]
fn the_fake_serves_as_a_shared_runtime() {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<FakeRuntime>();
    let runtime: Arc<dyn Runtime> = Arc::new(FakeRuntime::new());
    assert_eq!(runtime.name(), "fake");
}
