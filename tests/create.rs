//! Creating environments end to end: through the HTTP API of a real daemon, on each real
//! runtime, with the official image.

mod support;

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use narya_runtimes::MachineState;
use serde_json::json;
use support::e2e::{body, create, get, settled, unique_id, Backend, Host};

async fn a_create_without_setup_is_ready_pinned_and_idempotent(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("plain");
    let first = create(&client, json!({"id": id})).await;
    assert_eq!(
        first.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let env = body(&first);
    assert_eq!(env["id"], id.as_str());
    assert_eq!(env["status"], "ready");
    assert!(env.get("setup").is_none() && env.get("repository").is_none());
    let digest = env["image_digest"].as_str().unwrap();
    let layout_digest = narya_oci::layout::Layout::open(&host.layout)
        .unwrap()
        .resolve()
        .unwrap();
    assert_eq!(
        digest,
        layout_digest.to_string(),
        "pinned to the resolved manifest digest"
    );
    assert_eq!(host.state(&id).await, MachineState::Running);

    let repeat = create(&client, json!({"id": id})).await;
    assert_eq!(repeat.status, StatusCode::OK);
    assert_eq!(
        body(&repeat),
        env,
        "the repeat answers the environment as it stands"
    );
    assert_eq!(host.machines_labelled(&id).await, 1);

    let got = get(&client, &id).await;
    assert_eq!(body(&got), env);
    let list = client
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(body(&list)["environments"], json!([env]));

    let deleted = client
        .send(Method::DELETE, &format!("/v1/environments/{id}"), None)
        .await
        .unwrap();
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(host.state(&id).await, MachineState::Missing);
    assert!(!host.workspace(&id).exists(), "the workspace is destroyed");
    let gone = body(&get(&client, &id).await);
    assert_eq!(
        (gone["status"].as_str(), gone["status_detail"].as_str()),
        (Some("gone"), Some("deleted")),
        "a deleted environment answers gone: {gone}"
    );
    let again = create(&client, json!({"id": id})).await;
    assert_eq!(
        again.status,
        StatusCode::CREATED,
        "the id provisions afresh"
    );
    host.remove(&id).await;
}

async fn setup_runs_once_as_the_unprivileged_user_in_the_workspace(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("setup");
    let answer = create(
        &client,
        json!({"id": id, "setup": "echo hello; id -u; pwd; echo data > marker"}),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let env = body(&answer);
    assert_eq!(env["status"], "ready", "{env}");
    let setup = &env["setup"];
    assert_eq!(setup["state"], "succeeded");
    assert_eq!(setup["step"], "setup");
    assert_eq!(setup["exit_code"], 0);
    assert_eq!(setup["output"], "hello\n1000\n/workspace\n");
    assert_eq!(setup["output_truncated"], false);
    let marker = host.workspace(&id).join("marker");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "data\n");
    assert_eq!(std::fs::metadata(&marker).unwrap().uid(), 1000);
    host.remove(&id).await;
}

async fn a_failing_setup_leaves_the_environment_unusable_and_is_never_run_again(backend: Backend) {
    let Some(host) = Host::start_on(backend, "[environment]\noutput_limit = 2000\n").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("fails");
    let script = "echo run >> /workspace/runs; seq 1 1000; echo 'make: *** No rule to make target' >&2; seq 1 3 >&2; exit 3";
    let answer = create(&client, json!({"id": id, "setup": script})).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let env = body(&answer);
    assert_eq!(env["status"], "unusable");
    assert_eq!(env["setup"]["state"], "failed");
    assert_eq!(env["setup"]["exit_code"], 3);
    let output = env["setup"]["output"].as_str().unwrap();
    assert!(
        output.ends_with("make: *** No rule to make target\n1\n2\n3\n"),
        "the tail is kept: {output:?}"
    );
    assert!(output.len() <= 2000);
    assert_eq!(env["setup"]["output_truncated"], true);

    for _ in 0..2 {
        let repeat = create(&client, json!({"id": id, "setup": script})).await;
        assert_eq!(repeat.status, StatusCode::OK);
        assert_eq!(body(&repeat), env);
    }
    let runs = std::fs::read_to_string(host.workspace(&id).join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "the setup ran exactly once");
    host.remove(&id).await;
}

async fn a_setup_past_the_bound_is_timed_out_and_killed(backend: Backend) {
    let Some(host) = Host::start_on(backend, "[environment]\nsetup_timeout = \"2s\"\n").await
    else {
        return;
    };
    let client = host.acme();
    let id = unique_id("slow");
    let started = Instant::now();
    let answer = create(
        &client,
        json!({"id": id, "setup": "echo starting; sleep 1000 & setsid sleep 1001 & sleep 1002"}),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(answer.status, StatusCode::CREATED);
    let env = body(&answer);
    assert_eq!(env["status"], "unusable");
    assert_eq!(env["setup"]["state"], "timed_out");
    assert_eq!(env["setup"]["exit_code"], json!(null));
    assert_eq!(env["setup"]["output"], "starting\n");
    // Far below the 1000 s the script asks for: the bound ended it (with room for a loaded
    // machine's slow machine creation).
    assert!(took < Duration::from_secs(120), "answered after {took:?}");
    let ps = host
        .sh(
            &id,
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done",
        )
        .await;
    let listing = String::from_utf8_lossy(&ps.output);
    assert!(!listing.contains("sleep 100"), "left running: {listing}");
    host.remove(&id).await;
}

async fn concurrent_identical_creates_provision_once(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let id = unique_id("race");
    let script = "echo once >> /workspace/runs; sleep 1";
    let mut tasks = Vec::new();
    for i in 0..8 {
        let client = if i % 2 == 0 {
            host.acme()
        } else {
            host.daemon.tcp(Some(&host.token("acme")))
        };
        let body = json!({"id": id, "setup": script});
        tasks.push(tokio::spawn(async move { create(&client, body).await }));
    }
    let mut statuses = Vec::new();
    let mut bodies = Vec::new();
    for task in tasks {
        let answer = task.await.unwrap();
        statuses.push(answer.status);
        bodies.push(body(&answer));
    }
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        7,
        "{statuses:?}"
    );
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "every answer shows the same environment"
    );
    assert_eq!(bodies[0]["status"], "ready");
    assert_eq!(host.machines_labelled(&id).await, 1);
    let runs = std::fs::read_to_string(host.workspace(&id).join("runs")).unwrap();
    assert_eq!(runs, "once\n", "the setup ran exactly once");
    host.remove(&id).await;
}

async fn a_create_whose_client_disconnects_still_finishes(backend: Backend) {
    use tokio::io::AsyncWriteExt;
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let id = unique_id("gone");
    // The setup holds until the test has seen the create provisioning and gone away.
    let setup = "i=0; while [ ! -e /workspace/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; echo done > /workspace/finished";
    let request_body = serde_json::to_vec(&json!({"id": id, "setup": setup})).unwrap();
    {
        let mut stream = tokio::net::UnixStream::connect(&host.daemon.socket)
            .await
            .unwrap();
        let head = format!(
            "POST /v1/environments HTTP/1.1\r\nHost: naryad\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            host.token("acme"),
            request_body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&request_body).await.unwrap();
        // Once the create is provisioning (its row is there), the client goes away. The row
        // comes after the image is pinned, which on a loaded machine can take a while.
        let watcher = host.acme();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let during = get(&watcher, &id).await;
            if during.status == StatusCode::OK {
                let during = body(&during);
                assert_eq!(
                    (during["status"].as_str(), during["status_detail"].as_str()),
                    (Some("degraded"), Some("provisioning"))
                );
                break;
            }
            assert!(Instant::now() < deadline, "the create never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let workspace = host.workspace(&id);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !workspace.is_dir() {
        assert!(Instant::now() < deadline, "no workspace was made");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::write(workspace.join("go"), "").unwrap();
    let client = host.acme();
    let env = settled(&client, &id, Duration::from_secs(60)).await;
    assert_eq!(env["status"], "ready");
    assert_eq!(
        std::fs::read_to_string(host.workspace(&id).join("finished")).unwrap(),
        "done\n"
    );
    let repeat = create(&client, json!({"id": id, "setup": setup})).await;
    assert_eq!(repeat.status, StatusCode::OK);
    assert_eq!(body(&repeat), env);
    host.remove(&id).await;
}

async fn a_daemon_killed_during_setup_leaves_an_unrecorded_environment(backend: Backend) {
    let Some(mut host) = Host::start_on(backend, "").await else {
        return;
    };
    let id = unique_id("crash");
    let script = "echo begun > /workspace/begun; sleep 30";
    let background = {
        let client = host.acme();
        let body = json!({"id": id, "setup": script});
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
    tokio::task::block_in_place(|| host.daemon.kill());
    let _ = background.await;
    tokio::task::block_in_place(|| host.daemon.restart());
    let client = host.acme();
    let row = body(&get(&client, &id).await);
    assert_eq!(
        row["status"], "unusable",
        "an interrupted create is not waited for: {row}"
    );
    assert!(
        row["status_detail"]
            .as_str()
            .unwrap()
            .contains("interrupted"),
        "{row}"
    );
    assert_eq!(row["setup"]["state"], "interrupted", "{row}");
    assert_eq!(row["setup"]["step"], "setup", "{row}");
    assert_eq!(row["setup"]["exit_code"], json!(null), "{row}");

    let refused = create(&client, json!({"id": id, "setup": script})).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    let error = refused.error().unwrap();
    assert_eq!(error.code, "NRY-0041");
    assert!(error.message.contains("delete"), "{}", error.message);
    assert_eq!(host.machines_labelled(&id).await, 1, "no second machine");

    let adopted = create(&client, json!({"id": id})).await;
    assert_eq!(
        adopted.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&adopted.body)
    );
    let env = body(&adopted);
    assert_eq!(env["status"], "ready");
    assert!(env.get("setup").is_none());
    assert_eq!(host.machines_labelled(&id).await, 1);

    let deleted = client
        .send(Method::DELETE, &format!("/v1/environments/{id}"), None)
        .await
        .unwrap();
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let fresh = create(&client, json!({"id": id, "setup": "true"})).await;
    assert_eq!(fresh.status, StatusCode::CREATED);
    assert_eq!(body(&fresh)["status"], "ready");
    host.remove(&id).await;
}

async fn an_unanswering_runtime_or_unresolvable_image_provisions_nothing(backend: Backend) {
    let Some((socket, layout)) = support::e2e::requirements_for(backend) else {
        return;
    };
    let dead = Host::start_with_on(
        backend,
        "/nonexistent/runtime.sock",
        &format!("oci-layout:{layout}"),
        "",
        &socket,
        &layout,
    )
    .await;
    let id = unique_id("dead");
    let answer = create(&dead.acme(), json!({"id": id, "setup": "true"})).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.error().unwrap().code, "NRY-0060");
    let listed = dead
        .acme()
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(body(&listed)["environments"], json!([]));

    let missing = Host::start_with_on(
        backend,
        &socket,
        "oci-layout:/nonexistent/official",
        "",
        &socket,
        &layout,
    )
    .await;
    let answer = create(&missing.acme(), json!({"id": id})).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.error().unwrap().code, "NRY-0061");
    let listed = missing
        .acme()
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(body(&listed)["environments"], json!([]));
    assert_eq!(missing.state(&id).await, MachineState::Missing);
    assert!(!missing.workspace(&id).exists());
}

#[test]
fn the_cli_shows_an_unusable_environment_with_its_output_and_fails() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(host) = runtime.block_on(Host::start("")) else {
        return;
    };
    let id = unique_id("cli");
    let script = host.daemon.dir.path().join("setup.sh");
    std::fs::write(
        &script,
        "echo compiling; echo 'error: no toolchain' >&2; exit 2\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_narya"))
        .arg("--socket")
        .arg(&host.daemon.socket)
        .args(["env", "create", &id, "--setup"])
        .arg(&script)
        .env("NARYA_TOKEN", host.token("acme"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("unusable"), "{stdout}");
    assert!(stdout.contains("error: no toolchain"), "{stdout}");
    let ok = std::process::Command::new(env!("CARGO_BIN_EXE_narya"))
        .arg("--socket")
        .arg(&host.daemon.socket)
        .args(["env", "get", &id])
        .env("NARYA_TOKEN", host.token("acme"))
        .output()
        .unwrap();
    assert_eq!(
        ok.status.code(),
        Some(0),
        "get succeeds in showing an unusable environment"
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("error: no toolchain"));
    runtime.block_on(host.remove(&id));
}

on_every_engine!(
    a_create_without_setup_is_ready_pinned_and_idempotent,
    setup_runs_once_as_the_unprivileged_user_in_the_workspace,
    a_failing_setup_leaves_the_environment_unusable_and_is_never_run_again,
    a_setup_past_the_bound_is_timed_out_and_killed,
    concurrent_identical_creates_provision_once,
    a_create_whose_client_disconnects_still_finishes,
    a_daemon_killed_during_setup_leaves_an_unrecorded_environment,
    an_unanswering_runtime_or_unresolvable_image_provisions_nothing,
);
