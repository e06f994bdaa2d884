//! Truthful status and recovery: against a runtime of each test's own that the test stops,
//! starts and tampers with from outside, and across daemon crashes.

mod support;

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use narya::client::Client;
use serde_json::json;
use support::e2e::Backend;
use support::e2e::{
    body, create, delete, exec, get, requirements, unique_id, until, Host, NAMESPACE,
};
use support::private::{PrivateContainerd, PrivateRuntime};

async fn exec_output(client: &Client, id: &str, script: &str) -> String {
    let answer = client
        .send_json(
            Method::POST,
            &format!("/v1/environments/{id}/exec"),
            &json!({"argv": ["sh", "-c", script]}),
        )
        .await
        .unwrap();
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    body(&answer)["output"].as_str().unwrap().to_owned()
}

async fn host_on_runtime(backend: Backend, runtime: &PrivateRuntime) -> Option<Host> {
    let (_, layout) = support::e2e::requirements_for(backend)?;
    let socket = runtime.socket().display().to_string();
    let reference = format!("oci-layout:{layout}");
    Some(Host::start_with_on(backend, &socket, &reference, "", &socket, &layout).await)
}

async fn host_on(containerd: &PrivateContainerd) -> Option<Host> {
    let (_, layout) = requirements()?;
    let socket = containerd.socket.display().to_string();
    Some(
        Host::start_with(
            &socket,
            &format!("oci-layout:{layout}"),
            "",
            &socket,
            &layout,
        )
        .await,
    )
}

async fn a_runtime_that_stops_makes_environments_degraded_until_it_is_back(backend: Backend) {
    if support::e2e::requirements_for(backend).is_none() {
        return;
    }
    let mut containerd = tokio::task::block_in_place(|| PrivateRuntime::start(backend));
    let Some(host) = host_on_runtime(backend, &containerd).await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("outage");
    let created = create(
        &client,
        json!({"id": id, "setup": "echo kept > /workspace/data"}),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let digest = body(&created)["image_digest"].clone();

    tokio::task::block_in_place(|| containerd.stop());
    let env = until(&client, &id, Duration::from_secs(60), "degraded", |e| {
        e["status"] == "degraded"
    })
    .await;
    assert!(
        env["status_detail"]
            .as_str()
            .unwrap()
            .contains("not answering"),
        "{env}"
    );
    let list = client
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(
        body(&list)["environments"][0]["status"],
        "degraded",
        "LIST tells the truth too"
    );

    tokio::task::block_in_place(|| containerd.resume());
    let env = until(&client, &id, Duration::from_secs(60), "ready", |e| {
        e["status"] == "ready"
    })
    .await;
    assert_eq!(env["image_digest"], digest, "the same pinned digest");
    assert!(env.get("status_detail").is_none());
    assert_eq!(
        exec_output(&client, &id, "cat /workspace/data").await,
        "kept\n"
    );
    host.remove(&id).await;
}

async fn a_machine_killed_from_outside_is_started_again(backend: Backend) {
    if support::e2e::requirements_for(backend).is_none() {
        return;
    }
    let containerd = tokio::task::block_in_place(|| PrivateRuntime::start(backend));
    let Some(host) = host_on_runtime(backend, &containerd).await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("killed");
    assert_eq!(
        create(
            &client,
            json!({"id": id, "setup": "echo kept > /workspace/data"})
        )
        .await
        .status,
        StatusCode::CREATED
    );
    // When the machine's init started, in clock ticks since boot: a new start is a new init.
    let init_started = "cut -d' ' -f22 /proc/1/stat";
    let before = exec_output(&client, &id, init_started).await;

    let machine = host.machine(&id).await.name;
    tokio::task::block_in_place(|| containerd.kill_machine(NAMESPACE, &machine));
    // The host notices and starts it again: ready, with a fresh task and the workspace intact.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let env = body(&get(&client, &id).await);
        if env["status"] == "ready" {
            let answer = client
                .send_json(
                    Method::POST,
                    &format!("/v1/environments/{id}/exec"),
                    &json!({"argv": ["sh", "-c", init_started]}),
                )
                .await
                .unwrap();
            if answer.status == StatusCode::OK && body(&answer)["output"] != before.as_str() {
                break;
            }
        }
        assert!(Instant::now() < deadline, "not restarted: {env}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        exec_output(&client, &id, "cat /workspace/data").await,
        "kept\n"
    );
    host.remove(&id).await;
}

async fn a_machine_removed_from_outside_is_gone_until_replaced(backend: Backend) {
    if support::e2e::requirements_for(backend).is_none() {
        return;
    }
    let containerd = tokio::task::block_in_place(|| PrivateRuntime::start(backend));
    let Some(host) = host_on_runtime(backend, &containerd).await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("lost");
    let setup = "echo ran >> /workspace/runs";
    let created = create(&client, json!({"id": id, "setup": setup})).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let digest = body(&created)["image_digest"].clone();

    let replace_path = format!("/v1/environments/{id}/replace");
    let refused = client
        .send(Method::POST, &replace_path, None)
        .await
        .unwrap();
    assert_eq!(
        refused.status,
        StatusCode::CONFLICT,
        "replace of a ready environment"
    );
    assert_eq!(refused.error().unwrap().code, "NRY-0042");

    host.remove(&id).await;
    let env = until(&client, &id, Duration::from_secs(60), "gone", |e| {
        e["status"] == "gone"
    })
    .await;
    assert!(
        env["status_detail"].as_str().unwrap().contains("replace"),
        "{env}"
    );
    let exec = client
        .send_json(
            Method::POST,
            &format!("/v1/environments/{id}/exec"),
            &json!({"argv": ["true"]}),
        )
        .await
        .unwrap();
    assert_eq!(
        exec.error().unwrap().code,
        "NRY-0042",
        "no commands in a gone environment"
    );

    let replaced = client
        .send(Method::POST, &replace_path, None)
        .await
        .unwrap();
    assert_eq!(
        replaced.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&replaced.body)
    );
    let env = body(&replaced);
    assert_eq!(env["status"], "ready");
    assert_eq!(
        env["image_digest"], digest,
        "replaced from the pinned digest"
    );
    assert_eq!(
        std::fs::read_to_string(host.workspace(&id).join("runs")).unwrap(),
        "ran\nran\n",
        "workspace kept, setup run once more"
    );
    assert_eq!(body(&get(&client, &id).await), env);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        body(&get(&client, &id).await)["status"],
        "ready",
        "the reconciler agrees"
    );
    host.remove(&id).await;
}

async fn a_daemon_killed_during_a_replace_leaves_it_interrupted_never_ready(backend: Backend) {
    let Some(mut host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("rekilled");
    // Holds while /workspace/hold exists: not on the first run, on the replace's.
    let setup = "echo ran >> /workspace/runs; while [ -e /workspace/hold ]; do sleep 0.1; done";
    let created = create(&client, json!({"id": id, "setup": setup})).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(body(&created)["status"], "ready");
    std::fs::write(host.workspace(&id).join("hold"), "").unwrap();

    host.remove(&id).await;
    until(&client, &id, Duration::from_secs(60), "gone", |e| {
        e["status"] == "gone"
    })
    .await;
    let replacing = {
        let client = host.acme();
        let path = format!("/v1/environments/{id}/replace");
        tokio::spawn(async move { client.send(Method::POST, &path, None).await })
    };
    let runs = host.workspace(&id).join("runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&runs).unwrap_or_default() != "ran\nran\n" {
        // The replace holds in its setup until the kill: one that answered has failed.
        if replacing.is_finished() {
            let answer = replacing.await.unwrap();
            panic!(
                "the replace answered before its setup ran: {:?} {}\n{}",
                answer.map(|a| (a.status, String::from_utf8_lossy(&a.body).into_owned())),
                std::fs::read_to_string(&runs).unwrap_or_default(),
                host.daemon.log()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the replace's setup never started within 60 s: runs {:?}\n{}",
            std::fs::read_to_string(&runs).unwrap_or_default(),
            host.daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::task::block_in_place(|| {
        host.daemon.kill();
        host.daemon.restart();
    });
    let _ = replacing.await;

    let client = host.acme();
    let env = body(&get(&client, &id).await);
    assert_eq!(env["status"], "unusable", "{env}");
    assert_eq!(env["setup"]["state"], "interrupted", "{env}");
    assert_eq!(env["setup"]["step"], "setup", "{env}");
    // The machine the replace made is there and running: the reconciler must not take it
    // for ready on any pass (it looks every two seconds, and at once on runtime events).
    let watched_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < watched_until {
        let now = body(&get(&client, &id).await);
        assert_eq!(now["status"], "unusable", "{now}");
        assert_eq!(now["setup"]["state"], "interrupted", "{now}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let refused = exec(&client, &id, &["true"]).await;
    assert_eq!(refused.error().unwrap().code, "NRY-0042");
    let _ = std::fs::remove_file(host.workspace(&id).join("hold"));
    host.remove(&id).await;
}

async fn a_create_whose_undo_the_runtime_refused_ends_unusable_once_it_is_back(backend: Backend) {
    if support::e2e::requirements_for(backend).is_none() {
        return;
    }
    let mut runtime = tokio::task::block_in_place(|| PrivateRuntime::start(backend));
    let Some(host) = host_on_runtime(backend, &runtime).await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("undone");
    let pending = {
        let client = host.acme();
        let request = json!({"id": id, "setup": "touch /workspace/begun; sleep 120"});
        tokio::spawn(async move { create(&client, request).await })
    };
    // A fresh runtime fetches the image first.
    wait_for_file(&host.workspace(&id).join("begun"), Duration::from_secs(120)).await;
    // The setup's run fails with the runtime gone, and so does the undo's removal.
    tokio::task::block_in_place(|| runtime.stop());
    let answer = pending.await.unwrap();
    assert!(
        !answer.status.is_success(),
        "the create answered {}: {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    assert_ne!(
        body(&get(&client, &id).await)["status"],
        "ready",
        "a create whose setup never finished looks healthy"
    );

    tokio::task::block_in_place(|| runtime.resume());
    let env = until(
        &client,
        &id,
        Duration::from_secs(30),
        "unusable, saying why",
        |e| e["status"] == "unusable" && e.get("setup").is_some(),
    )
    .await;
    assert_ne!(env["setup"]["state"], "succeeded", "{env}");
    assert_eq!(host.machines_labelled(&id).await, 0, "the undo is finished");
    assert!(!host.workspace(&id).exists(), "the undo is finished");
    let refused = exec(&client, &id, &["true"]).await;
    assert_eq!(refused.error().unwrap().code, "NRY-0042");
    host.remove(&id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn environments_keep_their_digest_when_the_tag_moves_and_everything_restarts() {
    let Some((_, layout)) = requirements() else {
        return;
    };
    let Some(registry) = support::required("NARYA_TEST_REGISTRY") else {
        return;
    };
    let mut containerd = tokio::task::block_in_place(PrivateContainerd::start);
    let scratch = tempfile::tempdir().unwrap();
    let reference = format!("{registry}/narya-test/moving-{}:v", std::process::id());
    support::images::push(std::path::Path::new(&layout), &reference);
    let old = narya_oci::layout::Layout::open(&layout)
        .unwrap()
        .resolve()
        .unwrap()
        .to_string();

    let socket = containerd.socket.display().to_string();
    let mut host = Host::start_with(
        &socket,
        &reference,
        &format!("[image]\ninsecure_registries = [{registry:?}]"),
        &socket,
        &layout,
    )
    .await;
    let client = host.acme();
    let first = unique_id("pinned");
    let created = create(
        &client,
        json!({"id": first, "setup": "echo v1 > /workspace/data"}),
    )
    .await;
    assert_eq!(
        created.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    assert_eq!(body(&created)["image_digest"], old);

    let newer_dir = scratch.path().join("newer");
    let new = tokio::task::block_in_place(|| {
        support::images::another_image(&layout, &newer_dir, "2030-01-01T00:00:00Z")
    });
    assert_ne!(new, old);
    tokio::task::block_in_place(|| support::images::push(&newer_dir, &reference));

    // Everything stops and starts again: the daemon and the runtime.
    tokio::task::block_in_place(|| {
        assert_eq!(host.daemon.terminate().code(), Some(0));
        containerd.stop();
        containerd.resume();
        host.daemon.restart();
    });
    let client = host.acme();
    let env = until(&client, &first, Duration::from_secs(60), "ready", |e| {
        e["status"] == "ready"
    })
    .await;
    assert_eq!(
        env["image_digest"], old,
        "an existing environment keeps the digest it was pinned to"
    );
    assert_eq!(
        exec_output(&client, &first, "cat /workspace/data").await,
        "v1\n"
    );
    assert_eq!(host.machine(&first).await.digest(), Some(old.as_str()));

    let second = unique_id("newer");
    let created = create(&client, json!({"id": second})).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(
        body(&created)["image_digest"],
        new,
        "a new environment gets what the tag names now"
    );
    host.remove(&first).await;
    host.remove(&second).await;
}

/// Waits for a file the setup writes into the workspace.
async fn wait_for_file(path: &std::path::Path, within: Duration) {
    let deadline = Instant::now() + within;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Invariants after a crash: at most one machine, never a row claiming ready without one, never
/// an unusable row that does not say why, and the identifier either refused (unrecorded,
/// interrupted) or answered as recorded.
async fn check_after_crash(host: &Host, id: &str, setup: &str) {
    let client = host.acme();
    let machines = host.machines_labelled(id).await;
    assert!(machines <= 1, "{machines} machines for {id}");
    let row = get(&client, id).await;
    let interrupted = row.status == StatusCode::OK && {
        let env = body(&row);
        if env["status"] == "ready" {
            assert_eq!(machines, 1, "a row claims ready without a machine: {env}");
        }
        if env["status"] == "unusable" {
            assert!(
                env.get("setup").is_some(),
                "unusable, not saying why: {env}"
            );
        }
        env["setup"]["state"] == "interrupted"
    };
    if interrupted {
        let env = body(&row);
        assert_eq!(env["status"], "unusable", "{env}");
        assert_eq!(env["setup"]["step"], "setup", "{env}");
    }
    let repeat = create(&client, json!({"id": id, "setup": setup})).await;
    match repeat.status {
        // Recorded before the crash: answered as it stands, nothing ran again.
        StatusCode::OK => {
            assert!(!interrupted, "an interrupted create answered as recorded");
            assert_eq!(body(&repeat)["status"], "ready");
        }
        // Never recorded: refused, and deleting frees the id.
        StatusCode::CONFLICT => {
            assert_eq!(repeat.error().unwrap().code, "NRY-0041");
            assert!(interrupted, "refused, but GET did not say interrupted");
            assert_eq!(delete(&client, id).await.status, StatusCode::NO_CONTENT);
            assert_eq!(host.machines_labelled(id).await, 0);
            assert_eq!(body(&get(&client, id).await)["status_detail"], "deleted");
            assert_eq!(
                create(&client, json!({"id": id, "setup": setup}))
                    .await
                    .status,
                StatusCode::CREATED
            );
        }
        // Nothing was made before the crash: a fresh create.
        StatusCode::CREATED => assert_eq!(body(&repeat)["status"], "ready"),
        other => panic!(
            "after a crash the create answered {other}: {}",
            String::from_utf8_lossy(&repeat.body)
        ),
    }
    assert_eq!(host.machines_labelled(id).await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_killed_at_any_point_of_a_create_leaves_consistent_state() {
    if requirements().is_none() {
        return;
    }
    let containerd = tokio::task::block_in_place(PrivateContainerd::start);
    let Some(mut host) = host_on(&containerd).await else {
        return;
    };
    let setup = "echo ran >> /workspace/runs; touch /workspace/almost; sleep 0.3";

    // While the image is still being pulled into this fresh containerd: before any machine.
    let early = unique_id("early");
    let client = host.acme();
    let request = json!({"id": early, "setup": setup});
    let pending = tokio::spawn(async move { create(&client, request).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    tokio::task::block_in_place(|| {
        host.daemon.kill();
        host.daemon.restart();
    });
    let _ = pending.await;
    check_after_crash(&host, &early, setup).await;

    // During the setup, and just after it (before or after the outcome is recorded).
    for (name, marker, pause) in [
        ("during", "runs", Duration::ZERO),
        ("after", "almost", Duration::from_millis(300)),
    ] {
        let id = unique_id(name);
        let client = host.acme();
        let request = json!({"id": id, "setup": setup});
        let pending = tokio::spawn(async move { create(&client, request).await });
        wait_for_file(&host.workspace(&id).join(marker), Duration::from_secs(30)).await;
        tokio::time::sleep(pause).await;
        tokio::task::block_in_place(|| {
            host.daemon.kill();
            host.daemon.restart();
        });
        let _ = pending.await;
        check_after_crash(&host, &id, setup).await;
        let runs = std::fs::read_to_string(host.workspace(&id).join("runs")).unwrap_or_default();
        assert_eq!(
            runs.lines().count(),
            1,
            "{name}: the setup ran once for what exists: {runs:?}"
        );
        host.remove(&id).await;
    }
    host.remove(&early).await;
}

on_both_backends!(
    a_runtime_that_stops_makes_environments_degraded_until_it_is_back,
    a_machine_killed_from_outside_is_started_again,
    a_machine_removed_from_outside_is_gone_until_replaced,
    a_daemon_killed_during_a_replace_leaves_it_interrupted_never_ready,
    a_create_whose_undo_the_runtime_refused_ends_unusable_once_it_is_back,
);
