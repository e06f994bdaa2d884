//! Identifiers end to end, through the HTTP API of a real daemon on each real runtime: scoped by
//! organisation, a repeat (even a differing one) answering what exists, a deleted identifier
//! answering `gone` and then provisioned afresh or forgotten after its retention, every shape
//! the contract allows, and another organisation's orphan never taken over.

mod support;

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use narya_runtimes::MachineState;
use serde_json::json;
use support::e2e::{body, create, delete, differs, exec, get, list, unique_id, Backend, Host};

async fn identifiers_are_scoped_and_a_differing_repeat_answers_what_exists(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let acme = host.acme();
    let globex = host.daemon.tcp(Some(&host.token("globex")));
    let id = unique_id("owned");
    let created = create(&acme, json!({"id": id, "setup": "true"})).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let env = body(&created);

    assert_eq!(get(&globex, &id).await.status, StatusCode::NOT_FOUND);
    assert_eq!(delete(&globex, &id).await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        host.state(&id).await,
        MachineState::Running,
        "another organisation's delete changed nothing"
    );
    let theirs = create(&globex, json!({"id": id, "setup": "true"})).await;
    assert_eq!(theirs.status, StatusCode::CONFLICT);
    let error = theirs.error().unwrap();
    assert_eq!(error.code, "NRY-0040");
    assert!(
        !String::from_utf8_lossy(&theirs.body).contains("acme"),
        "nothing about the owner: {}",
        error.message
    );
    let listed = globex
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(body(&listed)["environments"], json!([]));

    // A repeat is answered with what exists, whatever it asked; the header says where it
    // differs, and nothing of it is applied.
    for (different, says) in [
        (json!({"id": id, "setup": "false"}), "setup"),
        (json!({"id": id}), "setup"),
        (
            json!({"id": id, "setup": "true", "repository": "acme/app"}),
            "repository",
        ),
        (
            json!({"id": id, "setup": "false", "repository": "acme/app"}),
            "setup, repository",
        ),
    ] {
        let answer = create(&acme, different.clone()).await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "{different}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        assert_eq!(differs(&answer).as_deref(), Some(says), "{different}");
        assert_eq!(body(&answer), env, "{different}");
    }
    let same = create(&acme, json!({"id": id, "setup": "true"})).await;
    assert_eq!(same.status, StatusCode::OK);
    assert_eq!(
        differs(&same),
        None,
        "an identical repeat differs in nothing"
    );
    assert_eq!(host.machines_labelled(&id).await, 1);
    host.remove(&id).await;
}

async fn a_repeat_with_another_setup_answers_what_exists_and_runs_nothing(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("regenerated");
    let setup = "echo run >> /workspace/runs";
    let created = create(&client, json!({"id": id, "setup": setup})).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let env = body(&created);
    assert_eq!(env["status"], "ready", "{env}");

    // A client that regenerated its script between attempts is answered with what exists.
    let regenerated = format!("{setup} # regenerated at {}", unique_id("t"));
    for request in [
        json!({"id": id, "setup": regenerated}),
        json!({"id": id, "setup": "echo other >> /workspace/runs"}),
    ] {
        let repeat = create(&client, request.clone()).await;
        assert_eq!(
            repeat.status,
            StatusCode::OK,
            "{request}: {}",
            String::from_utf8_lossy(&repeat.body)
        );
        assert_eq!(differs(&repeat).as_deref(), Some("setup"), "{request}");
        assert_eq!(body(&repeat), env, "the environment as it is: {request}");
    }
    assert_eq!(body(&get(&client, &id).await), env, "unchanged");
    let runs = std::fs::read_to_string(host.workspace(&id).join("runs")).unwrap();
    assert_eq!(runs, "run\n", "no script ran a second time");
    assert_eq!(host.machines_labelled(&id).await, 1);

    let theirs = create(
        &host.client("globex"),
        json!({"id": id, "setup": regenerated}),
    )
    .await;
    assert_eq!(theirs.status, StatusCode::CONFLICT);
    assert_eq!(theirs.error().unwrap().code, "NRY-0040");
    assert_eq!(differs(&theirs), None, "nothing about the owner's setup");
    host.remove(&id).await;
}

async fn a_deleted_environment_answers_gone_and_its_identifier_provisions_afresh(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("deleted");
    let created = create(
        &client,
        json!({"id": id, "setup": "echo old > /workspace/marker"}),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let created = body(&created);

    assert_eq!(delete(&client, &id).await.status, StatusCode::NO_CONTENT);
    assert_eq!(
        host.machines_labelled(&id).await,
        0,
        "the machine is destroyed"
    );
    assert!(!host.workspace(&id).exists(), "the workspace is destroyed");
    let gone = get(&client, &id).await;
    assert_eq!(
        gone.status,
        StatusCode::OK,
        "a deleted environment is known"
    );
    let gone = body(&gone);
    assert_eq!(gone["id"], id.as_str());
    assert_eq!(
        (gone["status"].as_str(), gone["status_detail"].as_str()),
        (Some("gone"), Some("deleted")),
        "{gone}"
    );
    assert_eq!(gone["created_at"], created["created_at"]);
    let listed = list(&client).await;
    assert_eq!(listed, std::slice::from_ref(&gone), "LIST shows it too");
    let refused = exec(&client, &id, &["true"]).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert_eq!(refused.error().unwrap().code, "NRY-0042");
    assert_eq!(
        delete(&client, &id).await.status,
        StatusCode::NO_CONTENT,
        "deleting a deleted environment is done already"
    );
    assert_eq!(body(&get(&client, &id).await), gone);
    assert_eq!(
        get(&host.client("globex"), &id).await.status,
        StatusCode::NOT_FOUND,
        "another organisation still sees nothing"
    );

    let again = create(&client, json!({"id": id})).await;
    assert_eq!(
        again.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&again.body)
    );
    let again = body(&again);
    assert_eq!(again["status"], "ready", "{again}");
    assert!(again.get("setup").is_none(), "a new environment: {again}");
    let listing = exec(&client, &id, &["ls", "-A", "/workspace"]).await;
    assert_eq!(listing.status, StatusCode::OK);
    assert_eq!(body(&listing)["output"], "", "a fresh, empty workspace");
    assert_eq!(host.machines_labelled(&id).await, 1);

    for _ in 0..2 {
        assert_eq!(delete(&client, &id).await.status, StatusCode::NO_CONTENT);
    }
    assert_eq!(body(&get(&client, &id).await)["status"], "gone");
    assert_eq!(host.machines_labelled(&id).await, 0);
    host.remove(&id).await;
}

async fn a_deleted_environment_is_forgotten_after_its_retention(backend: Backend) {
    let Some(host) = Host::start_on(backend, "[environment]\ngone_retention = \"2s\"\n").await
    else {
        return;
    };
    let client = host.acme();
    let id = unique_id("retained");
    assert_eq!(
        create(&client, json!({"id": id})).await.status,
        StatusCode::CREATED
    );
    assert_eq!(delete(&client, &id).await.status, StatusCode::NO_CONTENT);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = get(&client, &id).await;
        if answer.status == StatusCode::NOT_FOUND {
            assert_eq!(answer.error().unwrap().code, "NRY-0030");
            break;
        }
        let env = body(&answer);
        assert_eq!(
            env["status"],
            "gone",
            "until it is forgotten: {env}\n{}",
            host.daemon.log()
        );
        assert!(
            Instant::now() < deadline,
            "still known 60 s after a 2 s retention: {env}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(list(&client).await, Vec::<serde_json::Value>::new());
    assert_eq!(
        delete(&client, &id).await.status,
        StatusCode::NOT_FOUND,
        "a forgotten environment is unknown"
    );
}

/// Every shape of identifier the contract allows, on its own daemon: these identifiers are the
/// same in every run, so they live under an organisation of this run's own.
async fn every_identifier_the_contract_allows_works(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let organisation = unique_id("shapes");
    let longest = format!("{}{}", "a".repeat(32), "-b".repeat(16));
    assert_eq!(longest.len(), 64);
    let ids = ["a", "a-", "a..b", "x_-y", "A.b_c-d", longest.as_str()];
    let mut creates = Vec::new();
    for id in ids {
        let client = host.client(&organisation);
        let id = id.to_owned();
        creates.push(tokio::spawn(async move {
            let answer = create(&client, json!({ "id": id })).await;
            (id, answer)
        }));
    }
    let mut failures = Vec::new();
    let client = host.client(&organisation);
    for task in creates {
        let (id, answer) = task.await.unwrap();
        if answer.status != StatusCode::CREATED {
            failures.push(format!(
                "{id:?}: create answered {}: {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            ));
            continue;
        }
        let env = body(&answer);
        if env["status"] != "ready" {
            failures.push(format!("{id:?}: created {env}"));
        }
        let ran = exec(&client, &id, &["echo", "ok"]).await;
        if ran.status != StatusCode::OK || body(&ran)["output"] != "ok\n" {
            failures.push(format!(
                "{id:?}: exec answered {}: {}",
                ran.status,
                String::from_utf8_lossy(&ran.body)
            ));
        }
        let deleted = delete(&client, &id).await;
        if deleted.status != StatusCode::NO_CONTENT {
            failures.push(format!(
                "{id:?}: delete answered {}: {}",
                deleted.status,
                String::from_utf8_lossy(&deleted.body)
            ));
        }
        if host.workspace(&id).exists() {
            failures.push(format!("{id:?}: the workspace is left after delete"));
        }
    }
    for id in ids {
        // Another run's machine of the same identifier carries its own organisation.
        for machine in host.labelled(id).await {
            if machine.organisation().is_none_or(|o| o == organisation) {
                failures.push(format!("{id:?}: machine {} is left", machine.name));
                host.remove_machine(&machine).await;
            }
        }
    }
    let workspaces = host.daemon.dir.path().join("state/workspaces");
    // Deleted workspaces go to the trash at once and from there off the disk, in the
    // background: the trash empties, and nothing else is left.
    let left = |dir: &std::path::Path| -> Vec<_> {
        std::fs::read_dir(dir)
            .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !left(&workspaces.join(".trash")).is_empty() {
        assert!(Instant::now() < deadline, "the trash did not empty");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left: Vec<_> = left(&workspaces)
        .into_iter()
        .filter(|name| name != ".trash")
        .collect();
    assert!(left.is_empty(), "workspaces left: {left:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// After a store loss, a machine labelled with another organisation is never taken over.
async fn another_organisations_orphan_is_adopted_only_by_it(backend: Backend) {
    let Some(mut host) = Host::start_on(backend, "").await else {
        return;
    };
    let id = unique_id("orphan");
    let made = create(&host.client("globex"), json!({"id": id})).await;
    assert_eq!(made.status, StatusCode::CREATED);
    let digest = body(&made)["image_digest"].clone();

    tokio::task::block_in_place(|| assert_eq!(host.daemon.terminate().code(), Some(0)));
    let database = host.daemon.dir.path().join("state/narya.db");
    let store = narya::store::Store::open(&database).await.unwrap();
    assert!(store.delete("globex", &id.parse().unwrap()).await.unwrap());
    store.close().await;
    tokio::task::block_in_place(|| host.daemon.restart());

    let acme = host.acme();
    let refused = create(&acme, json!({"id": id})).await;
    if refused.status != StatusCode::CONFLICT {
        host.remove(&id).await;
        panic!(
            "another organisation's machine was adopted: {} {}",
            refused.status,
            String::from_utf8_lossy(&refused.body)
        );
    }
    assert_eq!(refused.error().unwrap().code, "NRY-0040");
    assert_eq!(get(&acme, &id).await.status, StatusCode::NOT_FOUND);
    assert_eq!(list(&acme).await, Vec::<serde_json::Value>::new());
    let machine = host.machine(&id).await;
    assert_eq!(machine.organisation(), Some("globex"), "{machine:?}");
    assert!(machine.running, "untouched: {machine:?}");

    let globex = host.client("globex");
    let adopted = create(&globex, json!({"id": id})).await;
    assert_eq!(
        adopted.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&adopted.body)
    );
    let env = body(&adopted);
    assert_eq!(env["status"], "ready", "{env}");
    assert_eq!(env["image_digest"], digest, "the machine's own digest");
    let ran = exec(&globex, &id, &["true"]).await;
    assert_eq!(ran.status, StatusCode::OK);
    assert_eq!(
        host.machine(&id).await.name,
        machine.name,
        "the same machine"
    );
    assert_eq!(delete(&globex, &id).await.status, StatusCode::NO_CONTENT);
    assert_eq!(host.machines_labelled(&id).await, 0);
}

on_every_engine!(
    identifiers_are_scoped_and_a_differing_repeat_answers_what_exists,
    a_repeat_with_another_setup_answers_what_exists_and_runs_nothing,
    a_deleted_environment_answers_gone_and_its_identifier_provisions_afresh,
    a_deleted_environment_is_forgotten_after_its_retention,
    every_identifier_the_contract_allows_works,
    another_organisations_orphan_is_adopted_only_by_it,
);
