//! A stop is bounded by `shutdown_timeout`: a setup that would run for minutes does not hold
//! the daemon, and what it interrupted is recorded before the daemon exits.

mod support;

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use narya::model::{EnvironmentId, SetupState, Status};
use narya::store::Store;
use serde_json::json;
use support::e2e::{body, get, unique_id, Backend, Host};

async fn a_stop_during_a_long_setup_exits_in_time_and_records_it_interrupted(backend: Backend) {
    let Some(mut host) = Host::start_on(backend, "shutdown_timeout = \"2s\"\n").await else {
        return;
    };
    let id = unique_id("stopped");
    let background = {
        let client = host.acme();
        let body = json!({"id": id, "setup": "echo begun > /workspace/begun; sleep 600"});
        tokio::spawn(async move {
            client
                .send_json(Method::POST, "/v1/environments", &body)
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !host.workspace(&id).join("begun").exists() {
        assert!(Instant::now() < deadline, "setup never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let stopping = Instant::now();
    let status = tokio::task::block_in_place(|| host.daemon.terminate());
    let took = stopping.elapsed();
    println!("SIGTERM during a setup: exited {status} after {took:?}");
    assert_eq!(status.code(), Some(0), "{}", host.daemon.log());
    assert!(
        took < Duration::from_secs(10),
        "took {took:?} with shutdown_timeout 2s:\n{}",
        host.daemon.log()
    );
    assert!(
        background.await.unwrap().is_err(),
        "the create in flight was ended, not answered"
    );

    // Recorded by the stopping daemon itself, not left for the next start to find.
    let store = Store::open(&host.daemon.dir.path().join("state/narya.db"))
        .await
        .unwrap();
    let environment_id: EnvironmentId = id.parse().unwrap();
    let row = store.get("acme", &environment_id).await.unwrap().unwrap();
    store.close().await;
    assert_eq!(row.status, Status::Unusable, "{row:?}");
    assert_eq!(
        row.setup.as_ref().map(|s| s.state),
        Some(SetupState::Interrupted),
        "{row:?}"
    );

    tokio::task::block_in_place(|| host.daemon.restart());
    let client = host.acme();
    let answer = get(&client, &id).await;
    assert_eq!(answer.status, StatusCode::OK);
    let env = body(&answer);
    assert_eq!(env["status"], "unusable", "{env}");
    assert_eq!(env["setup"]["state"], "interrupted", "{env}");

    let deleted = client
        .send(Method::DELETE, &format!("/v1/environments/{id}"), None)
        .await
        .unwrap();
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    host.remove(&id).await;
}

on_both_backends!(a_stop_during_a_long_setup_exits_in_time_and_records_it_interrupted);
