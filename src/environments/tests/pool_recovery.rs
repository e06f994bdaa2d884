//! The pool on the fake runtime when things go wrong: stale, stopped or unreachable machines,
//! restarts, a daemon that died mid-claim, removals that fail, another daemon's machines.

use std::sync::Arc;

use narya_runtimes::testing::Op;
use narya_runtimes::{ErrorKind, MachineState};

use super::pool::{labelled, pool_link, pool_machines, pooled_host};
use super::{acme, digest, id, person, request, Host};
use crate::environments::Environments;
use crate::model::Status;

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
