//! The pool: creates served from started machines, which are never stale, never foreign, never
//! both pooled and claimed, across restarts and failures.

use narya_runtimes::testing::{FakeOutcome, Op};
use narya_runtimes::{MachineInfo, MachineState};

use super::{acme, person, request, Host};
use crate::model::Status;

/// A host with a pool of `size`, filled.
pub(super) async fn pooled_host(size: usize) -> Host {
    let host = Host::with_config(&format!("[pool]\nsize = {size}\n")).await;
    host.environments.recover_pool().await.unwrap();
    host.environments.fill_pool().await.unwrap();
    assert_eq!(host.environments.pooled(), size);
    host
}

/// The machines waiting in the pool, as the runtime lists them.
pub(super) fn pool_machines(host: &Host) -> Vec<MachineInfo> {
    host.fake
        .machines()
        .into_iter()
        .filter(|m| m.pool.is_some() && m.environment.is_none())
        .collect()
}

/// The machine labelled as `id`'s, once the label that follows a claim's answer is there.
pub(super) async fn labelled(host: &Host, id: &str) -> MachineInfo {
    for _ in 0..2000 {
        if let Some(machine) = host.machine(id) {
            return machine;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    panic!("no machine labelled {id}: {:?}", host.fake.machines());
}

pub(super) fn pool_link(host: &Host, machine: &str) -> std::path::PathBuf {
    host.config.workspaces_dir().join(".pool").join(machine)
}

#[tokio::test]
async fn a_pool_machine_is_started_ahead_unlabelled_with_the_environments_settings() {
    let host = pooled_host(2).await;
    let machines = pool_machines(&host);
    assert_eq!(machines.len(), 2);
    for machine in &machines {
        assert_eq!(machine.state, MachineState::Running);
        assert_eq!(machine.organisation, None, "serves no organisation yet");
        let spec = host.fake.machine_spec(&machine.id).unwrap();
        assert_eq!(spec.limits, host.config.limits.limits());
        assert_eq!(spec.user, host.config.environment.user);
        assert_eq!(spec.network, host.config.environment.network);
        assert_eq!(spec.mount_point, "/workspace");
        assert!(spec.workspace.is_dir());
        assert_eq!(std::fs::read_dir(&spec.workspace).unwrap().count(), 0);
    }
    let listed = host.environments.list(&acme()).await.unwrap();
    assert!(listed.is_empty(), "pool machines are no environments");
}

#[tokio::test]
async fn a_setup_less_create_claims_a_started_machine_and_starts_none() {
    let host = pooled_host(2).await;
    let pooled: Vec<String> = pool_machines(&host).into_iter().map(|m| m.id).collect();
    let made = host.fake.calls(Op::CreateMachine);
    let created = host.create("demo", None).await;
    assert!(created.is_new());
    let record = created.record();
    assert_eq!(
        (record.status, record.setup_recorded),
        (Status::Ready, true)
    );
    assert!(pooled.contains(&record.machine), "a pool machine");
    let first = record.machine.clone();
    assert_eq!(
        host.fake.calls(Op::CreateMachine),
        made,
        "no machine started"
    );
    let machine = labelled(&host, "demo").await;
    assert_eq!(machine.id, first);
    assert_eq!(machine.organisation.as_deref(), Some("acme"));
    assert_eq!(machine.pool, None);
    assert_eq!(machine.digest.as_ref(), Some(&record.image_digest));
    assert!(host.workspace_exists("demo"));
    let link = pool_link(&host, &first);
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        host.config.workspaces_dir().join("demo")
    );
    assert_eq!(host.environments.pooled(), 1);
    assert_eq!(host.row("acme", "demo").await.as_ref(), Some(record));

    let repeat = host.create("demo", None).await;
    assert!(!repeat.is_new(), "a repeat answers what exists");
    assert_eq!(repeat.record().machine, first);

    host.environments.fill_pool().await.unwrap();
    assert_eq!(host.environments.pooled(), 2, "refilled");
}

#[tokio::test]
async fn a_create_with_setup_runs_it_in_the_claimed_machine() {
    let host = pooled_host(1).await;
    let pooled = pool_machines(&host)[0].id.clone();
    host.fake.on_process(|_| FakeOutcome::Exit {
        code: 0,
        output: b"tools\n".to_vec(),
    });
    let created = host.create("demo", Some("make tools")).await;
    let record = created.record();
    assert_eq!(record.machine, pooled);
    assert_eq!(record.status, Status::Ready);
    assert_eq!(record.setup.as_ref().unwrap().output, "tools\n");
    let processes = host.fake.processes();
    assert_eq!(processes.len(), 1);
    assert_eq!(processes[0].machine, pooled);
    assert_eq!(host.machine("demo").unwrap().id, pooled);
}

#[tokio::test]
async fn a_failed_setup_on_a_claimed_machine_is_unusable_like_any_other() {
    let host = pooled_host(1).await;
    host.fake.on_process(|_| FakeOutcome::Exit {
        code: 3,
        output: b"no\n".to_vec(),
    });
    let record = host.create("demo", Some("false")).await.record().clone();
    assert_eq!(record.status, Status::Unusable);
    assert_eq!(record.setup.unwrap().exit_code, Some(3));
}

#[tokio::test]
async fn a_burst_larger_than_the_pool_is_served_by_normal_creates_after_it() {
    let host = pooled_host(2).await;
    let pooled: Vec<String> = pool_machines(&host).into_iter().map(|m| m.id).collect();
    let creates: Vec<_> = (0..6)
        .map(|n| host.create_in_background(&format!("burst-{n}"), None))
        .collect();
    let mut from_pool = 0;
    for create in creates {
        let created = create.await.unwrap().expect("no create fails");
        assert_eq!(created.record().status, Status::Ready);
        if pooled.contains(&created.record().machine) {
            from_pool += 1;
        }
    }
    assert_eq!(from_pool, 2);
    assert_eq!(host.environments.pooled(), 0);
}

#[tokio::test]
async fn the_pool_makes_no_machine_while_a_create_starts_its_own() {
    let host = pooled_host(1).await;
    host.create("first", None).await;
    assert_eq!(host.environments.pooled(), 0);
    let stall = host.fake.stall(Op::CreateMachine);
    let second = host.create_in_background("second", None);
    while host.fake.calls(Op::CreateMachine) < 2 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    host.environments.fill_pool().await.unwrap();
    assert_eq!(
        host.environments.pooled(),
        0,
        "nothing made while a create starts one"
    );
    drop(stall);
    second.await.unwrap().unwrap();
    host.environments.fill_pool().await.unwrap();
    assert_eq!(host.environments.pooled(), 1);
}

#[tokio::test]
async fn deleting_a_pooled_environment_removes_machine_workspace_and_link() {
    let host = pooled_host(1).await;
    let machine = host.create("demo", None).await.record().machine.clone();
    host.environments
        .delete(acme(), "demo".parse().unwrap())
        .await
        .unwrap();
    assert!(host.fake.machines().is_empty());
    assert!(!host.workspace_exists("demo"));
    assert!(std::fs::symlink_metadata(pool_link(&host, &machine)).is_err());
    let again = host.create("demo", None).await;
    assert!(again.is_new(), "a later create provisions afresh");
}

#[tokio::test]
async fn another_organisation_never_sees_or_takes_a_claimed_machine() {
    let host = pooled_host(2).await;
    host.create("demo", None).await;
    let globex = person("globex");
    let refused = host
        .environments
        .create(globex.clone(), request("demo", None))
        .await;
    assert!(refused.is_err(), "the identifier is acme's");
    assert!(host.environments.list(&globex).await.unwrap().is_empty());
    let theirs = host
        .environments
        .create(globex, request("theirs", None))
        .await
        .unwrap();
    assert_ne!(
        theirs.record().machine,
        host.row("acme", "demo").await.unwrap().machine
    );
}
