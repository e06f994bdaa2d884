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
        // Far below the 600 s the setup asks for, with room for a loaded machine.
        took < Duration::from_secs(30),
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

/// Reads `answer` until its end (or 60 s): every line as JSON.
async fn read_to_end(answer: &mut narya::client::Streamed) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = answer.next_line().await {
            lines.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}")));
        }
    })
    .await;
    assert!(read.is_ok(), "the stream did not end: {lines:?}");
    lines
}

async fn streams_cut_at_the_shutdown_timeout_end_with_an_error_line(backend: Backend) {
    let Some(mut host) = Host::start_on(backend, "shutdown_timeout = \"2s\"\n").await else {
        return;
    };
    let ready = unique_id("cut-exec");
    let provisioning = unique_id("cut-create");
    let _removals = (host.removal(&ready), host.removal(&provisioning));
    let client = host.acme();
    let created = support::e2e::create(&client, json!({ "id": ready })).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let mut exec = client
        .stream_json(
            Method::POST,
            &format!("/v1/environments/{ready}/exec"),
            &json!({"argv": ["sh", "-c", "echo before; sleep 600"]}),
        )
        .await
        .unwrap();
    assert!(exec.streaming);
    let first = tokio::time::timeout(Duration::from_secs(60), exec.next_line())
        .await
        .expect("the exec's first line within 60 s")
        .unwrap()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&first).unwrap()["output"],
        "before\n"
    );
    let mut create = client
        .stream_json(
            Method::POST,
            "/v1/environments",
            &json!({"id": provisioning, "setup": "echo begun > /workspace/begun; sleep 600"}),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !host.workspace(&provisioning).join("begun").exists() {
        assert!(Instant::now() < deadline, "setup never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let status = tokio::task::block_in_place(|| host.daemon.terminate());
    assert_eq!(status.code(), Some(0), "{}", host.daemon.log());
    for (what, answer) in [("exec", &mut exec), ("create", &mut create)] {
        let lines = read_to_end(answer).await;
        let last = lines.last().unwrap_or_else(|| panic!("{what}: no line"));
        assert_eq!(last["error"]["code"], "NRY-0099", "{what}: {lines:?}");
        assert!(
            last["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("shutting down")),
            "{what}: {lines:?}"
        );
        if what == "create" {
            // What it had produced before the cut came first.
            assert!(
                lines
                    .iter()
                    .any(|l| l["step"] == "setup" && l["state"] == "started"),
                "{lines:?}"
            );
        }
    }
}

on_every_engine!(
    a_stop_during_a_long_setup_exits_in_time_and_records_it_interrupted,
    streams_cut_at_the_shutdown_timeout_end_with_an_error_line,
);
