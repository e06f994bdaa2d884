//! The pool: creates served from started machines, which are never stale, never foreign, never
//! both pooled and claimed, across restarts and failures.

use std::sync::Arc;

use narya_runtimes::testing::{FakeOutcome, Op};
use narya_runtimes::{ErrorKind, MachineInfo, MachineState};

use super::{acme, digest, id, person, request, Host};
use crate::environments::Environments;
use crate::model::Status;

/// A host with a pool of `size`, filled.
async fn pooled_host(size: usize) -> Host {
    let host = Host::with_config(&format!("[pool]\nsize = {size}\n")).await;
    host.environments.recover_pool().await.unwrap();
    host.environments.fill_pool().await.unwrap();
    assert_eq!(host.environments.pooled(), size);
    host
}

/// The machines waiting in the pool, as the runtime lists them.
fn pool_machines(host: &Host) -> Vec<MachineInfo> {
    host.fake
        .machines()
        .into_iter()
        .filter(|m| m.pool.is_some() && m.environment.is_none())
        .collect()
}

/// The machine labelled as `id`'s, once the label that follows a claim's answer is there.
async fn labelled(host: &Host, id: &str) -> MachineInfo {
    for _ in 0..2000 {
        if let Some(machine) = host.machine(id) {
            return machine;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    panic!("no machine labelled {id}: {:?}", host.fake.machines());
}

fn pool_link(host: &Host, machine: &str) -> std::path::PathBuf {
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
async fn a_stopped_pool_machine_is_never_served_and_is_replaced() {
    let host = pooled_host(2).await;
    let machines = pool_machines(&host);
    host.fake.stop_machine(&machines[0].id);
    let created = host.create("demo", None).await;
    assert_eq!(created.record().machine, machines[1].id, "the running one");
    // Taken and found stopped at the claim, or found by the pool's next look.
    host.environments.look_at_pool().await;
    assert!(
        !host.fake.machines().iter().any(|m| m.id == machines[0].id),
        "the stopped one is removed"
    );
    assert!(!pool_link(&host, &machines[0].id).exists());
    host.environments.fill_pool().await.unwrap();
    assert_eq!(host.environments.pooled(), 2);
}

#[tokio::test]
async fn a_new_digest_replaces_every_pool_machine_before_one_is_served() {
    let host = pooled_host(2).await;
    let old = host.create("old", None).await.record().clone();
    host.environments.fill_pool().await.unwrap();
    host.fake.set_image_digest(digest('e'));
    // After a restart the image is resolved before anything is pooled.
    let restarted = host.restarted();
    restarted.recover_pool().await.unwrap();
    assert_eq!(restarted.pooled(), 0, "nothing of the old digest is kept");
    assert!(pool_machines(&host).is_empty(), "and it is removed");
    restarted.fill_pool().await.unwrap();
    for machine in pool_machines(&host) {
        assert_eq!(machine.digest, Some(digest('e')));
    }
    let created = restarted
        .create(acme(), request("new", None))
        .await
        .unwrap();
    assert_eq!(created.record().image_digest, digest('e'));
    let kept = host.row("acme", "old").await.unwrap();
    assert_eq!(
        kept.image_digest, old.image_digest,
        "an existing environment keeps its digest"
    );
    assert_eq!(labelled(&host, "old").await.digest, Some(old.image_digest));
}

#[tokio::test]
async fn a_restart_reuses_fresh_pool_machines_and_removes_those_of_another_configuration() {
    let host = pooled_host(2).await;
    let before: Vec<String> = pool_machines(&host).into_iter().map(|m| m.id).collect();
    let restarted = host.restarted();
    restarted.recover_pool().await.unwrap();
    assert_eq!(restarted.pooled(), 2);
    let created = restarted
        .create(acme(), request("demo", None))
        .await
        .unwrap();
    assert!(before.contains(&created.record().machine));

    // The same state directory with other limits: the machines left are not served.
    let mut config = (*host.config).clone();
    config.limits.cpus = 0.5;
    let reconfigured = Arc::new(Environments::new(
        host.store.clone(),
        host.fake.clone(),
        Arc::new(config),
        Arc::new(crate::organisation::Organisations::new(
            host.store.clone(),
            None,
        )),
    ));
    reconfigured.recover_pool().await.unwrap();
    assert_eq!(reconfigured.pooled(), 0);
    assert!(pool_machines(&host).is_empty());
    assert_eq!(
        labelled(&host, "demo").await.state,
        MachineState::Running,
        "claimed: kept"
    );
}

#[tokio::test]
async fn another_daemons_pool_machines_are_left_alone() {
    let host = pooled_host(1).await;
    let other = pooled_host(1).await;
    // Two daemons' machines in one runtime: the other's, made in the other fake, added here.
    for machine in other.fake.machines() {
        host.fake.add_machine(machine);
    }
    let restarted = host.restarted();
    restarted.recover_pool().await.unwrap();
    assert_eq!(restarted.pooled(), 1);
    assert_eq!(
        pool_machines(&host).len(),
        2,
        "the other daemon's is still there"
    );
}

#[tokio::test]
async fn a_daemon_that_died_mid_claim_leaves_the_environment_recorded_with_its_machine_or_absent() {
    let host = pooled_host(2).await;
    let machines = pool_machines(&host);
    let (claimed, untouched) = (machines[0].clone(), machines[1].clone());
    // The claim's one store write went in; the daemon died before the machine was labelled
    // or its workspace moved.
    let mut row = super::row_for("demo", "acme", claimed.digest.as_ref().unwrap());
    row.machine = claimed.id.clone();
    host.store.insert(&row).await.unwrap();

    let restarted = host.restarted();
    restarted.recover_pool().await.unwrap();
    assert_eq!(
        restarted.pooled(),
        1,
        "the claimed one is never pooled again"
    );
    let machine = host.machine("demo").expect("labelled as demo's now");
    assert_eq!(machine.id, claimed.id);
    assert_eq!(
        (machine.pool, machine.organisation.as_deref()),
        (None, Some("acme"))
    );
    assert!(host.workspace_exists("demo"));
    assert!(pool_link(&host, &claimed.id).is_symlink());
    let record = restarted
        .get(&acme(), &"demo".parse().unwrap())
        .await
        .unwrap();
    assert_eq!(
        (record.status, record.machine.as_str()),
        (Status::Ready, claimed.id.as_str())
    );
    // Died before the write: the machine is still a pool machine, served to the next create.
    let next = restarted
        .create(acme(), request("next", None))
        .await
        .unwrap();
    assert_eq!(next.record().machine, untouched.id);
    assert_eq!(host.fake.machines().len(), 2, "nothing leaks");
}

#[tokio::test]
async fn a_workspace_that_cannot_move_takes_the_claim_back_and_leaks_nothing() {
    let host = pooled_host(1).await;
    let pooled = pool_machines(&host)[0].id.clone();
    // The pool machine's workspace vanished from under it (an operator, a full disk's fsck):
    // there is nothing to move.
    std::fs::remove_dir(pool_link(&host, &pooled)).unwrap();
    let failed = host.try_create(acme(), "demo", None).await;
    assert!(failed.is_err());
    assert_eq!(host.row("acme", "demo").await, None);
    assert!(!host.fake.machines().iter().any(|m| m.id == pooled));
    let pool_dir = host.config.workspaces_dir().join(".pool");
    assert_eq!(std::fs::read_dir(pool_dir).unwrap().count(), 0);
}

#[tokio::test]
async fn a_label_that_fails_after_the_answer_is_finished_at_the_next_start() {
    let host = pooled_host(1).await;
    host.fake.fail_next(Op::Claim, ErrorKind::Unavailable);
    let created = host.create("demo", None).await;
    assert_eq!(
        created.record().status,
        Status::Ready,
        "the store already says whose"
    );
    while host.fake.calls(Op::Claim) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert!(host.machine("demo").is_none(), "the label failed");
    let restarted = host.restarted();
    restarted.recover_pool().await.unwrap();
    assert_eq!(restarted.pooled(), 0, "claimed, never pooled again");
    assert_eq!(labelled(&host, "demo").await.id, created.record().machine);
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

#[tokio::test]
async fn a_pool_of_size_zero_removes_what_an_earlier_configuration_left() {
    let host = pooled_host(2).await;
    let off = Host::with_config("[pool]\nsize = 0\n").await;
    assert_eq!(off.environments.pooled(), 0);
    let mut config = (*host.config).clone();
    config.pool.size = 0;
    let restarted = Arc::new(Environments::new(
        host.store.clone(),
        host.fake.clone(),
        Arc::new(config),
        Arc::new(crate::organisation::Organisations::new(
            host.store.clone(),
            None,
        )),
    ));
    restarted.recover_pool().await.unwrap();
    assert!(host.fake.machines().is_empty());
    let created = restarted
        .create(acme(), request("demo", None))
        .await
        .unwrap();
    assert!(!created.record().machine.starts_with("narya-pool-"));
}

#[tokio::test]
async fn a_pool_machine_the_runtime_cannot_look_at_stays_pooled_and_the_create_goes_the_usual_way()
{
    let host = pooled_host(1).await;
    host.fake.fail_next(Op::Inspect, ErrorKind::Unavailable);
    let created = host.create("demo", None).await;
    assert!(!created.record().machine.starts_with("narya-pool-"));
    assert_eq!(host.environments.pooled(), 1, "still pooled");
    let next = host.create("next", None).await;
    assert!(next.record().machine.starts_with("narya-pool-"));
}

#[tokio::test]
async fn a_pool_machine_whose_workspace_another_environment_holds_is_never_served() {
    let host = pooled_host(1).await;
    // As on Docker, whose labels cannot change: the claimed machine keeps its pool labels.
    host.fake.fail_always(Op::Claim, ErrorKind::Unavailable);
    let created = host.create("demo", None).await;
    let machine = created.record().machine.clone();
    std::fs::write(host.config.workspaces_dir().join("demo/secret"), "acme's").unwrap();
    // The store loses the row (an older backup restored): nothing names the machine now.
    host.store.delete("acme", &id("demo")).await.unwrap();

    let restarted = host.restarted();
    restarted.recover_pool().await.unwrap();
    assert_eq!(
        restarted.pooled(),
        0,
        "a machine with another's workspace is not pooled"
    );
    assert!(
        !host.fake.machines().iter().any(|m| m.id == machine),
        "and is removed"
    );
    assert_eq!(
        std::fs::read_to_string(host.config.workspaces_dir().join("demo/secret")).unwrap(),
        "acme's",
        "removing it leaves the workspace its link pointed to alone"
    );
    restarted.fill_pool().await.unwrap();
    let other = restarted
        .create(person("globex"), request("other", None))
        .await
        .unwrap();
    assert_ne!(other.record().machine, machine);
    let workspace = host.config.workspaces_dir().join("other");
    assert_eq!(std::fs::read_dir(workspace).unwrap().count(), 0);
}

#[tokio::test]
async fn a_pool_machine_between_states_stays_pooled_and_the_create_goes_the_usual_way() {
    let host = pooled_host(1).await;
    let pooled = pool_machines(&host)[0].id.clone();
    host.fake.hide_state(&pooled);
    let created = host.create("demo", None).await;
    assert_ne!(created.record().machine, pooled);
    assert!(
        host.fake.machines().iter().any(|m| m.id == pooled),
        "a machine the runtime cannot place is not removed"
    );
    assert_eq!(host.environments.pooled(), 1, "still pooled");
    host.fake.tell_state(&pooled);
    let next = host.create("next", None).await;
    assert_eq!(next.record().machine, pooled);
}

#[tokio::test]
async fn a_pool_machine_that_could_not_be_removed_is_removed_at_the_next_look() {
    let host = pooled_host(1).await;
    let pooled = pool_machines(&host)[0].id.clone();
    host.fake.stop_machine(&pooled);
    host.fake.fail_next(Op::Remove, ErrorKind::Unavailable);
    host.environments.look_at_pool().await;
    assert_eq!(host.environments.pooled(), 0);
    assert!(
        host.fake.machines().iter().any(|m| m.id == pooled),
        "the removal failed"
    );
    host.environments.look_at_pool().await;
    assert!(
        !host.fake.machines().iter().any(|m| m.id == pooled),
        "removed at the next look, not left running until a restart"
    );
}

#[tokio::test]
async fn a_claim_taken_back_whose_machine_cannot_be_removed_is_never_ready() {
    let host = pooled_host(1).await;
    let pooled = pool_machines(&host)[0].id.clone();
    std::fs::remove_dir(pool_link(&host, &pooled)).unwrap();
    host.fake.fail_next(Op::Remove, ErrorKind::Unavailable);
    let failed = host.try_create(acme(), "demo", None).await;
    assert!(failed.is_err());
    let row = host.row("acme", "demo").await.expect("left unrecorded");
    assert_eq!(row.status, Status::Degraded);
    assert!(!row.setup_recorded);
}

#[test]
fn a_change_of_resolvers_makes_pool_machines_stale() {
    let config = |dns: &str| {
        crate::config::Config::parse(&format!(
            "state_dir = \"/var/lib/narya\"\n\n[identity]\nissuer = \"https://id.test\"\naudience = \"narya\"\n\n[network]\ndns = [{dns}]\n"
        ))
        .unwrap()
    };
    let mark = |dns: &str| {
        crate::environments::pool::Pool::new(&config(dns))
            .configuration_mark()
            .to_owned()
    };
    assert_ne!(mark("\"192.0.2.53\""), mark("\"192.0.2.54\""));
    assert_eq!(mark("\"192.0.2.53\""), mark("\"192.0.2.53\""));
}
