//! After a create: delete, replace, the reconciler's verdicts, and exec's refusals.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use narya_runtimes::testing::{FakeOutcome, Op};
use narya_runtimes::{ErrorKind, MachineState};

use super::{acme, digest, id, person, Host};
use crate::environments::{EnvironmentError, ExecRequest, RUNTIME_UNREACHABLE};
use crate::model::{SetupState, SetupStep, Status};

impl Host {
    async fn reconcile(&self) -> Result<(), String> {
        self.environments.reconcile_once(&mut HashSet::new()).await
    }

    async fn status(&self, id: &str) -> (Status, Option<String>) {
        let row = self.row("acme", id).await.expect("a row");
        (row.status, row.status_detail)
    }
}

fn command(argv: &[&str]) -> ExecRequest {
    ExecRequest::validate(
        argv.iter().map(|a| a.to_string()).collect(),
        BTreeMap::new(),
        None,
        None,
        None,
        Duration::from_secs(60),
    )
    .unwrap()
}

#[tokio::test]
async fn delete_destroys_machine_and_workspace_and_keeps_the_record_gone() {
    let host = Host::new().await;
    host.create("demo", None).await;
    let foreign = host.environments.delete(person("globex"), id("demo")).await;
    assert!(matches!(foreign, Err(EnvironmentError::NotFound(_))));
    assert!(host.machine("demo").is_some());

    host.environments.delete(acme(), id("demo")).await.unwrap();
    assert_eq!(
        host.status("demo").await,
        (Status::Gone, Some("deleted".to_owned()))
    );
    assert!(host.machine("demo").is_none());
    assert!(!host.workspace_exists("demo"));
    host.environments.delete(acme(), id("demo")).await.unwrap();
    let exec = host
        .environments
        .exec(&acme(), id("demo"), command(&["true"]))
        .await;
    assert!(matches!(
        exec,
        Err(EnvironmentError::NotReady {
            status: Status::Gone,
            ..
        })
    ));
    let replace = host.environments.replace(acme(), id("demo")).await;
    assert!(matches!(replace, Err(EnvironmentError::Deleted(_))));
    host.fake.set_down(true);
    host.reconcile().await.unwrap_err();
    assert_eq!(host.status("demo").await.0, Status::Gone, "gone stays gone");
}

#[tokio::test]
async fn a_create_of_a_deleted_identifier_provisions_afresh() {
    let host = Host::new().await;
    host.create("demo", Some("make")).await;
    std::fs::write(host.config.workspaces_dir().join("demo/left.txt"), "x").unwrap();
    host.environments.delete(acme(), id("demo")).await.unwrap();
    let again = host.create("demo", None).await;
    assert!(again.is_new());
    assert_eq!(
        (again.record().status, again.record().deleted_at),
        (Status::Ready, None)
    );
    assert_eq!(again.record().setup_script, None);
    assert!(!host.config.workspaces_dir().join("demo/left.txt").exists());
    assert_eq!(host.fake.calls(Op::CreateMachine), 2);
}

#[tokio::test]
async fn a_deleted_record_is_forgotten_once_its_retention_passed() {
    let host = Host::new().await;
    host.create("demo", None).await;
    host.create("kept", None).await;
    host.environments.delete(acme(), id("demo")).await.unwrap();
    host.environments.delete(acme(), id("kept")).await.unwrap();
    host.reconcile().await.unwrap();
    assert!(
        host.row("acme", "demo").await.is_some(),
        "within the retention"
    );
    let mut old = host.row("acme", "demo").await.unwrap();
    old.deleted_at = Some(1);
    host.store.record(&old).await.unwrap();
    host.reconcile().await.unwrap();
    assert!(host.row("acme", "demo").await.is_none());
    assert!(host.row("acme", "kept").await.is_some());
}

#[tokio::test]
async fn a_delete_the_runtime_cannot_do_keeps_the_environment() {
    let host = Host::new().await;
    host.create("demo", None).await;
    host.fake.fail_next(Op::Remove, ErrorKind::Unavailable);
    let refused = host.environments.delete(acme(), id("demo")).await;
    assert!(matches!(refused, Err(EnvironmentError::Runtime(_))));
    assert_eq!(host.status("demo").await.0, Status::Ready);
    assert!(host.workspace_exists("demo"));
}

#[tokio::test]
async fn a_delete_during_a_create_waits_for_it_then_removes_what_it_made() {
    let host = Host::new().await;
    let stall = host.fake.stall(Op::Run);
    let create = host.create_in_background("demo", Some("make"));
    stall.reached().await;
    let environments = host.environments.clone();
    let delete = tokio::spawn(async move { environments.delete(acme(), id("demo")).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !delete.is_finished(),
        "the delete waits for the create's lock"
    );
    assert_eq!(host.fake.calls(Op::Remove), 0);
    stall.release();
    assert!(create.await.unwrap().unwrap().is_new());
    delete.await.unwrap().unwrap();
    assert_eq!(host.status("demo").await.0, Status::Gone);
    assert!(host.machine("demo").is_none());
}

#[tokio::test]
async fn a_lost_machine_is_gone_and_replace_remakes_it_from_the_pinned_digest() {
    let host = Host::new().await;
    let pinned = host
        .create("demo", Some("make"))
        .await
        .record()
        .image_digest
        .clone();
    host.fake.set_image_digest(digest('f'));
    host.fake.lose_machine(&host.name("demo"));
    host.reconcile().await.unwrap();
    assert_eq!(host.status("demo").await.0, Status::Gone);

    let replaced = host.environments.replace(acme(), id("demo")).await.unwrap();
    assert_eq!(replaced.status, Status::Ready);
    assert_eq!(replaced.image_digest, pinned);
    assert_eq!(
        host.fake
            .machine_spec(&host.name("demo"))
            .unwrap()
            .image
            .digest,
        pinned
    );
    let scripts: Vec<_> = host.fake.processes().into_iter().map(|p| p.stdin).collect();
    assert_eq!(scripts, [Some(b"make".to_vec()), Some(b"make".to_vec())]);
    assert_eq!(host.status("demo").await, (Status::Ready, None));
}

#[tokio::test]
async fn a_replace_keeps_the_setup_unrecorded_until_its_setup_has_run_again() {
    let host = Host::new().await;
    host.create("demo", Some("make")).await;
    host.fake.lose_machine(&host.name("demo"));
    host.reconcile().await.unwrap();
    let stall = host.fake.stall(Op::Run);
    let environments = host.environments.clone();
    let replace = tokio::spawn(async move { environments.replace(acme(), id("demo")).await });
    stall.reached().await;
    let row = host.row("acme", "demo").await.unwrap();
    assert_eq!(
        (row.setup_recorded, row.setup, row.status),
        (false, None, Status::Degraded)
    );
    // What a daemon restarted now would make of it: interrupted, never ready.
    host.environments.mark_interrupted().await.unwrap();
    let row = host.row("acme", "demo").await.unwrap();
    assert_eq!(row.status, Status::Unusable);
    assert_eq!(row.setup.unwrap().state, SetupState::Interrupted);
    stall.release();
    replace.await.unwrap().unwrap();
}

#[tokio::test]
async fn replace_refuses_an_environment_that_is_not_gone() {
    let host = Host::new().await;
    host.create("demo", None).await;
    let refused = host.environments.replace(acme(), id("demo")).await;
    assert!(matches!(
        refused,
        Err(EnvironmentError::NotGone {
            status: Status::Ready,
            ..
        })
    ));
    assert_eq!(host.fake.calls(Op::CreateMachine), 1);
}

#[tokio::test]
async fn a_replace_whose_setup_fails_is_unusable() {
    let host = Host::new().await;
    host.create("demo", Some("make")).await;
    host.fake.lose_machine(&host.name("demo"));
    host.reconcile().await.unwrap();
    host.fake.on_process(|_| FakeOutcome::Exit {
        code: 1,
        output: b"the mirror is down\n".to_vec(),
    });
    let replaced = host.environments.replace(acme(), id("demo")).await.unwrap();
    assert_eq!(replaced.status, Status::Unusable);
    assert_eq!(host.status("demo").await.0, Status::Unusable);
}

#[tokio::test]
async fn the_reconciler_starts_a_stopped_machine_again() {
    let host = Host::new().await;
    host.create("demo", None).await;
    host.fake.stop_machine(&host.name("demo"));
    host.reconcile().await.unwrap();
    assert_eq!(host.fake.calls(Op::Start), 1);
    assert_eq!(host.machine("demo").unwrap().state, MachineState::Running);
    assert_eq!(host.status("demo").await, (Status::Ready, None));
}

#[tokio::test]
async fn a_machine_whose_state_cannot_be_told_is_left_alone_and_keeps_serving() {
    let host = Host::new().await;
    host.create("demo", None).await;
    host.fake.hide_state(&host.name("demo"));
    host.reconcile().await.unwrap();
    assert_eq!(
        host.fake.calls(Op::Start),
        0,
        "never restarted on an untold state"
    );
    assert_eq!(host.status("demo").await, (Status::Ready, None));
    let run = host
        .environments
        .exec(&acme(), id("demo"), command(&["true"]))
        .await
        .unwrap();
    assert_eq!(run.outcome().await.unwrap().exit_code, Some(0));
    host.fake.tell_state(&host.name("demo"));
    host.reconcile().await.unwrap();
    assert_eq!(host.fake.calls(Op::Start), 0);
}

#[tokio::test]
async fn a_stopped_machine_is_not_restarted_while_its_environment_is_held() {
    let host = Host::new().await;
    host.create("demo", None).await;
    host.fake.stop_machine(&host.name("demo"));
    let stall = host.fake.stall(Op::Remove);
    let environments = host.environments.clone();
    let delete = tokio::spawn(async move { environments.delete(acme(), id("demo")).await });
    stall.reached().await;
    host.reconcile().await.unwrap();
    assert_eq!(
        host.fake.calls(Op::Start),
        0,
        "the delete holds the environment"
    );
    stall.release();
    delete.await.unwrap().unwrap();
    host.reconcile().await.unwrap();
    assert_eq!(host.fake.calls(Op::Start), 0);
    assert!(host.machine("demo").is_none());
}

#[tokio::test]
async fn a_runtime_away_degrades_every_recorded_environment_until_it_answers() {
    let host = Host::new().await;
    host.create("demo", None).await;
    host.fake.on_process(|_| FakeOutcome::Exit {
        code: 1,
        output: Vec::new(),
    });
    host.create("broken", Some("false")).await;
    host.fake.set_down(true);
    assert!(host.reconcile().await.is_err());
    assert_eq!(
        host.status("demo").await,
        (Status::Degraded, Some(RUNTIME_UNREACHABLE.to_owned()))
    );
    assert_eq!(
        host.status("broken").await.0,
        Status::Unusable,
        "unusable stays"
    );
    host.fake.set_down(false);
    host.reconcile().await.unwrap();
    assert_eq!(host.status("demo").await, (Status::Ready, None));
}

#[tokio::test]
async fn the_reconciler_leaves_an_environment_being_created_alone() {
    let host = Host::new().await;
    let stall = host.fake.stall(Op::Run);
    let create = host.create_in_background("demo", Some("make"));
    stall.reached().await;
    host.reconcile().await.unwrap();
    let row = host.row("acme", "demo").await.unwrap();
    assert_eq!((row.status, row.setup_recorded), (Status::Degraded, false));
    stall.release();
    assert_eq!(
        create.await.unwrap().unwrap().record().status,
        Status::Ready
    );
}

#[tokio::test]
async fn a_create_a_daemon_stop_interrupted_reads_unusable_after_a_restart() {
    let host = Host::new().await;
    host.interrupted("demo", &digest('a'), Some(MachineState::Running))
        .await;
    host.environments.mark_interrupted().await.unwrap();
    let row = host.row("acme", "demo").await.unwrap();
    assert_eq!((row.status, row.setup_recorded), (Status::Unusable, false));
    let setup = row.setup.expect("a setup record saying why");
    assert_eq!(
        (setup.state, setup.step),
        (SetupState::Interrupted, SetupStep::Setup)
    );
    host.reconcile().await.unwrap();
    assert_eq!(host.status("demo").await.0, Status::Unusable);
}

#[tokio::test]
async fn exec_runs_in_a_ready_environment_and_refuses_every_other() {
    let host = Host::new().await;
    host.create("demo", None).await;
    // The command runs bounded inside the machine too, and marked as this daemon's run.
    host.fake.on_process(|p| FakeOutcome::Exit {
        code: 7,
        output: format!(
            "{} {}",
            p.argv.join(" "),
            p.env.contains_key(crate::environments::RUN_MARK)
        )
        .into_bytes(),
    });
    let run = host
        .environments
        .exec(&acme(), id("demo"), command(&["echo", "hi"]))
        .await
        .unwrap();
    let outcome = run.outcome().await.unwrap();
    assert_eq!(
        (outcome.exit_code, outcome.output),
        (
            Some(7),
            b"/usr/bin/timeout -s KILL 65.000s echo hi true".to_vec()
        )
    );

    let foreign = host
        .environments
        .exec(&person("globex"), id("demo"), command(&["true"]))
        .await;
    assert!(matches!(foreign, Err(EnvironmentError::NotFound(_))));

    host.fake.lose_machine(&host.name("demo"));
    let lost = host
        .environments
        .exec(&acme(), id("demo"), command(&["true"]))
        .await
        .unwrap()
        .outcome()
        .await;
    assert!(matches!(
        lost,
        Err(EnvironmentError::NoRunningMachine { .. })
    ));
    host.reconcile().await.unwrap();
    let gone = host
        .environments
        .exec(&acme(), id("demo"), command(&["true"]))
        .await;
    assert!(matches!(
        gone,
        Err(EnvironmentError::NotReady {
            status: Status::Gone,
            ..
        })
    ));
}

#[tokio::test]
async fn exec_output_arrives_as_text_before_the_outcome() {
    let host = Host::new().await;
    host.create("demo", None).await;
    host.fake.on_process(|_| FakeOutcome::Exit {
        code: 0,
        output: "héllo\n".as_bytes().to_vec(),
    });
    let mut run = host
        .environments
        .exec(&acme(), id("demo"), command(&["greet"]))
        .await
        .unwrap();
    let mut text = String::new();
    while let Some(chunk) = run.next_output().await {
        text.push_str(&chunk);
    }
    assert_eq!(text, "héllo\n");
    assert_eq!(run.outcome().await.unwrap().exit_code, Some(0));
}
