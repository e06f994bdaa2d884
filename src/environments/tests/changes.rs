//! A change the runtime reports costs a look at the machine it names, not a pass over all.

use std::time::{Duration, Instant};

use narya_runtimes::testing::Op;

use super::Host;
use crate::model::Status;

async fn three_ready() -> Host {
    let host = Host::new().await;
    for name in ["one", "two", "three"] {
        host.create(name, None).await;
    }
    host
}

#[tokio::test]
async fn a_change_to_one_of_three_machines_costs_one_state_call_and_no_listing() {
    let host = three_ready().await;
    host.fake.stop_machine(&host.name("two"));
    let (lists, inspects) = (host.fake.calls(Op::List), host.fake.calls(Op::Inspect));

    host.environments
        .reconcile_machine(&host.name("two"))
        .await
        .unwrap();

    assert_eq!(host.fake.calls(Op::List), lists, "no listing");
    assert_eq!(host.fake.calls(Op::Inspect), inspects + 1, "one state call");
    assert_eq!(
        host.fake.calls(Op::Start),
        1,
        "the stopped machine started again"
    );
    let row = host.row("acme", "two").await.unwrap();
    assert_eq!(row.status, Status::Ready);
}

#[tokio::test]
async fn a_change_to_a_machine_the_store_does_not_know_costs_nothing() {
    let host = three_ready().await;
    let inspects = host.fake.calls(Op::Inspect);
    host.environments
        .reconcile_machine(&host.name("four"))
        .await
        .unwrap();
    assert_eq!(host.fake.calls(Op::Inspect), inspects);
}

#[tokio::test]
async fn a_lost_machine_named_by_a_change_reads_gone() {
    let host = three_ready().await;
    host.fake.lose_machine(&host.name("three"));
    host.environments
        .reconcile_machine(&host.name("three"))
        .await
        .unwrap();
    assert_eq!(
        host.row("acme", "three").await.unwrap().status,
        Status::Gone
    );
    assert_eq!(host.row("acme", "one").await.unwrap().status, Status::Ready);
}

#[tokio::test]
async fn the_reconciler_restarts_a_machine_a_change_names() {
    let host = three_ready().await;
    let reconciler = tokio::spawn(host.environments.clone().reconcile_forever());
    let deadline = Instant::now() + Duration::from_secs(30);
    while host.fake.calls(Op::Changes) == 0 {
        assert!(Instant::now() < deadline, "the reconciler never subscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The full pass the subscription followed is done; the next is POLL (2 s) away, so a
    // restart before any listing came from the change alone.
    let lists = host.fake.calls(Op::List);
    host.fake.stop_machine(&host.name("one"));
    while host.fake.calls(Op::Start) == 0 {
        assert!(
            Instant::now() < deadline,
            "the stopped machine was never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        host.fake.calls(Op::List),
        lists,
        "the restart waited for a full pass instead of following the change"
    );
    reconciler.abort();
}
