//! Creates: first, repeated, joined, refused, adopted, and undone at every step.

use narya_runtimes::testing::{FakeOutcome, Op};
use narya_runtimes::{ErrorKind, MachineInfo, MachineState};

use super::{acme, digest, person, request, request_with, Host};
use crate::environments::{Differs, EnvironmentError, Progress};
use crate::model::{SetupState, SetupStep, Status};

#[tokio::test]
async fn a_first_create_without_setup_makes_a_ready_machine_and_runs_nothing() {
    let host = Host::new().await;
    let created = host.create("demo", None).await;
    assert!(created.is_new());
    let record = created.record();
    assert_eq!(
        (record.status, record.setup_recorded),
        (Status::Ready, true)
    );
    assert_eq!(record.setup, None);
    let machine = host.machine("demo").expect("a machine");
    assert_eq!(machine.state, MachineState::Running);
    assert_eq!(machine.digest.as_ref(), Some(&record.image_digest));
    assert!(host.fake.processes().is_empty());
    assert!(host.workspace_exists("demo"));
    assert_eq!(host.row("acme", "demo").await.as_ref(), Some(record));
}

#[tokio::test]
async fn a_setup_runs_once_in_the_machine_with_the_script_on_its_input() {
    let host = Host::new().await;
    host.fake.on_process(|_| FakeOutcome::Exit {
        code: 0,
        output: b"installing\n".to_vec(),
    });
    let created = host.create("demo", Some("make tools")).await;
    let setup = created.record().setup.clone().expect("a setup record");
    assert_eq!(
        (setup.state, setup.step),
        (SetupState::Succeeded, SetupStep::Setup)
    );
    assert_eq!(
        (setup.exit_code, setup.output.as_str()),
        (Some(0), "installing\n")
    );
    assert_eq!(created.record().status, Status::Ready);
    let processes = host.fake.processes();
    assert_eq!(processes.len(), 1);
    assert_eq!(processes[0].machine, host.name("demo"));
    assert!(!processes[0].throwaway);
    assert_eq!(processes[0].stdin.as_deref(), Some(&b"make tools"[..]));
}

#[tokio::test]
async fn a_failed_setup_is_unusable_with_its_exit_code_and_output() {
    let host = Host::new().await;
    host.fake.on_process(|_| FakeOutcome::Exit {
        code: 3,
        output: b"no such tool\n".to_vec(),
    });
    let created = host.create("demo", Some("install nothing")).await;
    let record = created.record();
    assert_eq!(record.status, Status::Unusable);
    let setup = record.setup.as_ref().unwrap();
    assert_eq!(setup.state, SetupState::Failed);
    assert_eq!(
        (setup.exit_code, setup.output.as_str()),
        (Some(3), "no such tool\n")
    );
    assert_eq!(
        host.row("acme", "demo").await.unwrap().status,
        Status::Unusable
    );
}

#[tokio::test]
async fn a_setup_past_its_bound_is_unusable_and_timed_out() {
    let host = Host::new().await;
    host.fake.on_process(|_| FakeOutcome::TimedOut {
        output: b"still going\n".to_vec(),
    });
    let created = host.create("demo", Some("sleep 1000")).await;
    let setup = created.record().setup.clone().unwrap();
    assert_eq!((setup.state, setup.exit_code), (SetupState::TimedOut, None));
    assert_eq!(created.record().status, Status::Unusable);
}

#[tokio::test]
async fn a_repeat_of_a_recorded_create_answers_as_it_stands_and_runs_nothing() {
    let host = Host::new().await;
    let first = host.create("demo", Some("make")).await;
    let again = host.create("demo", Some("make")).await;
    assert!(!again.is_new());
    assert_eq!(again.record(), first.record());
    assert_eq!(host.fake.calls(Op::CreateMachine), 1);
    assert_eq!(host.fake.processes().len(), 1);
}

#[tokio::test]
async fn a_repeat_with_another_setup_answers_what_exists_and_says_what_differs() {
    let host = Host::new().await;
    let first = host.create("demo", Some("make")).await;
    let again = host
        .environments
        .create(
            acme(),
            request_with("demo", Some("make all"), Some("acme/app")),
        )
        .await
        .unwrap();
    assert!(!again.is_new());
    assert_eq!(
        again.record(),
        first.record(),
        "the environment is as it was"
    );
    assert_eq!(
        again.differs(),
        Differs {
            setup: true,
            repository: true
        }
    );
    assert_eq!(host.fake.processes().len(), 1, "no script ran again");
    let same = host.create("demo", Some("make")).await;
    assert_eq!(same.differs(), Differs::default());
}

#[tokio::test]
async fn another_organisations_identifier_is_refused_without_showing_it() {
    let host = Host::new().await;
    host.create("demo", None).await;
    host.environments
        .delete(acme(), "demo".parse().unwrap())
        .await
        .unwrap();
    let refused = host.try_create(person("globex"), "demo", None).await;
    assert!(matches!(refused, Err(EnvironmentError::IdInUse(_))));
    assert!(host.row("globex", "demo").await.is_none());
    assert_eq!(host.fake.calls(Op::CreateMachine), 1);
}

#[tokio::test]
async fn a_repeat_while_the_first_is_provisioning_joins_it() {
    let host = Host::new().await;
    let stall = host.fake.stall(Op::Run);
    let first = host.create_in_background("demo", Some("make"));
    stall.reached().await;
    let mut joined = host
        .environments
        .create_streamed(acme(), request("demo", Some("make")))
        .await
        .unwrap();
    assert!(!joined.is_new(), "a joined create answers 200");
    stall.release();
    let mut seen = Vec::new();
    while let Some(progress) = joined.next().await {
        seen.push(progress);
    }
    assert!(seen.contains(&Progress::finished("setup")), "{seen:?}");
    let joined = joined.outcome().await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert!(first.is_new() && !joined.is_new());
    assert_eq!(joined.record(), first.record());
    assert_eq!(host.fake.processes().len(), 1, "the setup ran once");
}

#[tokio::test]
async fn a_repeat_that_joined_a_create_that_failed_answers_its_failure_and_provisions_nothing() {
    let host = Host::new().await;
    let stall = host.fake.stall(Op::Run);
    let first = host.create_in_background("demo", Some("make"));
    stall.reached().await;
    let joined = host
        .environments
        .create_streamed(acme(), request("demo", Some("make")))
        .await
        .unwrap();
    let waiting = host.create_in_background("demo", Some("make"));
    tokio::task::yield_now().await;
    host.fake.fail_next(Op::Run, ErrorKind::Unavailable);
    stall.release();
    let first = first.await.unwrap();
    assert!(matches!(
        first.as_ref().map_err(EnvironmentError::cause),
        Err(EnvironmentError::Runtime(_))
    ));
    for answer in [joined.outcome().await, waiting.await.unwrap()] {
        match answer {
            Err(e) => assert!(matches!(e.cause(), EnvironmentError::Runtime(_)), "{e:?}"),
            Ok(created) => panic!("a joiner provisioned again: {created:?}"),
        }
    }
    assert_eq!(host.fake.calls(Op::CreateMachine), 1, "provisioned once");
    assert!(
        host.row("acme", "demo").await.is_none(),
        "the failed create was undone"
    );
}

#[tokio::test]
async fn a_streamed_create_reports_every_step_in_order_then_its_outcome() {
    let host = Host::new().await;
    host.fake.on_process(|_| FakeOutcome::Exit {
        code: 0,
        output: b"hi\n".to_vec(),
    });
    let mut run = host
        .environments
        .create_streamed(acme(), request("demo", Some("echo hi")))
        .await
        .unwrap();
    assert!(run.is_new());
    let mut seen = Vec::new();
    while let Some(progress) = run.next().await {
        seen.push(progress);
    }
    let output = Progress::Output {
        step: "setup",
        output: "hi\n".to_owned(),
    };
    let expected = [
        Progress::started("image"),
        Progress::finished("image"),
        Progress::started("machine"),
        Progress::finished("machine"),
        Progress::started("setup"),
        output,
        Progress::finished("setup"),
    ];
    assert_eq!(seen, expected);
    assert!(run.outcome().await.unwrap().is_new());
}

#[tokio::test]
async fn an_unrecorded_setup_refuses_a_setup_carrying_create() {
    let host = Host::new().await;
    host.interrupted("demo", &digest('a'), Some(MachineState::Running))
        .await;
    let refused = host.try_create(acme(), "demo", Some("make")).await;
    assert!(matches!(refused, Err(EnvironmentError::SetupUnrecorded(_))));
    assert!(!host.row("acme", "demo").await.unwrap().setup_recorded);
    assert!(host.fake.processes().is_empty());
}

#[tokio::test]
async fn a_setup_less_create_adopts_an_interrupted_row_and_starts_its_stopped_machine() {
    let host = Host::new().await;
    host.interrupted("demo", &digest('a'), Some(MachineState::Stopped))
        .await;
    let adopted = host.create("demo", None).await;
    assert!(!adopted.is_new());
    let record = adopted.record();
    assert_eq!(
        (record.status, record.setup_recorded),
        (Status::Ready, true)
    );
    assert_eq!(
        (record.setup_script.as_deref(), &record.setup),
        (None, &None)
    );
    assert_eq!(host.fake.calls(Op::Start), 1);
    assert_eq!(host.machine("demo").unwrap().state, MachineState::Running);
}

#[tokio::test]
async fn adopting_a_row_whose_machine_is_gone_remakes_it_from_the_pinned_digest() {
    let host = Host::new().await;
    host.interrupted("demo", &digest('a'), None).await;
    host.fake.set_image_digest(digest('b'));
    let adopted = host.create("demo", None).await;
    assert_eq!(adopted.record().image_digest, digest('a'));
    let spec = host
        .fake
        .machine_spec(&host.name("demo"))
        .expect("the machine made again");
    assert_eq!(spec.image.digest, digest('a'), "never a newer digest");
}

#[tokio::test]
async fn a_setup_less_create_adopts_a_machine_the_store_does_not_know() {
    let host = Host::new().await;
    host.fake.add_machine(MachineInfo {
        id: host.name("demo"),
        environment: Some("demo".to_owned()),
        organisation: Some("acme".to_owned()),
        digest: Some(digest('c')),
        state: MachineState::Running,
        pool: None,
    });
    let refused = host.try_create(acme(), "demo", Some("make")).await;
    assert!(matches!(refused, Err(EnvironmentError::SetupUnrecorded(_))));
    let adopted = host.create("demo", None).await;
    assert!(!adopted.is_new());
    assert_eq!(adopted.record().image_digest, digest('c'));
    assert_eq!(host.fake.calls(Op::CreateMachine), 0);
}

#[tokio::test]
async fn another_organisations_machine_is_never_adopted() {
    let host = Host::new().await;
    host.fake.add_machine(MachineInfo {
        id: super::super::machine_name("globex", &"demo".parse().unwrap()),
        environment: Some("demo".to_owned()),
        organisation: Some("globex".to_owned()),
        digest: Some(digest('c')),
        state: MachineState::Running,
        pool: None,
    });
    let refused = host.try_create(acme(), "demo", None).await;
    assert!(matches!(refused, Err(EnvironmentError::IdInUse(_))));
    assert!(host.row("acme", "demo").await.is_none());
    let adopted = host
        .try_create(person("globex"), "demo", None)
        .await
        .unwrap();
    assert!(!adopted.is_new());
    assert_eq!(adopted.record().organisation, "globex");
    assert_eq!(host.fake.calls(Op::CreateMachine), 0);
}

#[tokio::test]
async fn every_identifier_the_contract_allows_gets_a_machine_of_its_own() {
    let host = Host::new().await;
    let long = "a".repeat(64);
    for id in ["a", "a-", "a..b", "x_-y", "A.b_c-d", long.as_str()] {
        host.create(id, None).await;
        let machine = host
            .machine(id)
            .unwrap_or_else(|| panic!("no machine for {id}"));
        assert!(
            machine.id.starts_with("narya-") && machine.id.len() <= 63,
            "{}",
            machine.id
        );
        assert!(machine
            .id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
    }
    let names: std::collections::HashSet<String> =
        host.fake.machines().into_iter().map(|m| m.id).collect();
    assert_eq!(names.len(), 6);
}

/// After a create failed at `op`, nothing of it is left: no row, no machine, no workspace.
async fn nothing_is_left(host: &Host) {
    assert!(host.row("acme", "demo").await.is_none());
    assert!(host.machine("demo").is_none());
    assert!(!host.workspace_exists("demo"));
}

#[tokio::test]
async fn an_image_that_cannot_be_fetched_refuses_the_create_before_anything_is_made() {
    let host = Host::new().await;
    host.fake.fail_next(Op::EnsureImage, ErrorKind::Image);
    let refused = host.try_create(acme(), "demo", Some("make")).await;
    match refused {
        Err(EnvironmentError::Runtime(e)) => assert_eq!(e.kind(), ErrorKind::Image),
        other => panic!("expected an image failure, got {other:?}"),
    }
    nothing_is_left(&host).await;
    assert_eq!(host.fake.calls(Op::CreateMachine), 0);
}

#[tokio::test]
async fn a_machine_the_runtime_cannot_make_is_undone() {
    let host = Host::new().await;
    host.fake
        .fail_next_after_effect(Op::CreateMachine, ErrorKind::Unavailable);
    let refused = host.try_create(acme(), "demo", Some("make")).await;
    assert!(
        matches!(refused, Err(EnvironmentError::Runtime(ref e)) if e.kind() == ErrorKind::Unavailable)
    );
    nothing_is_left(&host).await;
    assert!(host.fake.processes().is_empty());
}

#[tokio::test]
async fn a_setup_the_runtime_could_not_run_is_undone() {
    let host = Host::new().await;
    host.fake.fail_next(Op::Run, ErrorKind::Unavailable);
    let refused = host.try_create(acme(), "demo", Some("make")).await;
    assert!(refused.is_err());
    nothing_is_left(&host).await;
    assert_eq!(host.fake.calls(Op::Remove), 1);
}

#[tokio::test]
async fn an_undo_the_runtime_refuses_is_finished_by_the_reconciler_and_reads_unusable() {
    let host = Host::new().await;
    host.fake.fail_next(Op::Run, ErrorKind::Unavailable);
    host.fake.fail_next(Op::Remove, ErrorKind::Unavailable);
    let refused = host.try_create(acme(), "demo", Some("make")).await;
    assert!(refused.is_err());
    let row = host.row("acme", "demo").await.expect("the row stays");
    assert!(!row.setup_recorded);
    let detail = row.status_detail.unwrap_or_default();
    assert!(detail.starts_with("provisioning failed: "), "{detail}");
    assert!(host.machine("demo").is_some(), "the machine could not go");
    let again = host.try_create(acme(), "demo", Some("make")).await;
    assert!(matches!(again, Err(EnvironmentError::SetupUnrecorded(_))));

    host.environments
        .reconcile_once(&mut Default::default())
        .await
        .unwrap();
    assert!(host.machine("demo").is_none(), "the undo is finished");
    let row = host.row("acme", "demo").await.unwrap();
    assert_eq!((row.status, row.setup_recorded), (Status::Unusable, true));
    let setup = row.setup.expect("a setup record saying why");
    assert_eq!(setup.state, SetupState::Failed);
    assert!(
        setup.output.starts_with("narya: provisioning failed"),
        "{}",
        setup.output
    );
}

#[tokio::test]
async fn another_organisation_is_refused_at_once_while_the_holder_provisions() {
    let host = Host::new().await;
    let stall = host.fake.stall(Op::Run);
    let first = host.create_in_background("demo", Some("make"));
    stall.reached().await;
    // acme's create holds its lock through the setup; globex's asks never wait for it.
    let refused = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        host.try_create(person("globex"), "demo", None),
    )
    .await
    .expect("globex's create does not queue behind acme's");
    assert!(matches!(refused, Err(EnvironmentError::IdInUse(_))));
    stall.release();
    assert!(first.await.unwrap().unwrap().is_new());
    assert!(host.row("globex", "demo").await.is_none());
}

#[tokio::test]
async fn an_organisation_at_its_share_is_refused_and_another_is_not() {
    let host = Host::with_config("[organisation]\nmax_environments = 2\n").await;
    host.create("one", None).await;
    host.create("two", Some("make")).await;
    let refused = host.try_create(acme(), "three", None).await;
    assert!(
        matches!(
            refused,
            Err(EnvironmentError::AtEnvironmentLimit { max: 2 })
        ),
        "{refused:?}"
    );
    assert!(
        host.row("acme", "three").await.is_none(),
        "nothing recorded"
    );
    // A repeat of one it holds still answers; another organisation has its own share.
    assert!(!host.create("one", None).await.is_new());
    assert!(host
        .try_create(person("globex"), "elsewhere", None)
        .await
        .unwrap()
        .is_new());
    // A deleted environment (gone) no longer counts.
    host.environments
        .delete(acme(), "two".parse().unwrap())
        .await
        .unwrap();
    assert!(host.create("three", None).await.is_new());
}

#[tokio::test]
async fn a_host_short_of_disk_refuses_creates_before_anything_is_made() {
    // No filesystem has an exabyte free.
    let host = Host::with_config("[host]\nreserve_disk = \"1048576TiB\"\n").await;
    let refused = host.try_create(acme(), "demo", Some("make")).await;
    assert!(
        matches!(refused, Err(EnvironmentError::HostShortOfDisk { .. })),
        "{refused:?}"
    );
    assert!(host.row("acme", "demo").await.is_none());
    assert_eq!(host.fake.calls(Op::CreateMachine), 0);
    assert_eq!(host.fake.calls(Op::EnsureImage), 0);
}
