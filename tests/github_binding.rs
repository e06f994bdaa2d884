//! An installation is bound to the organisation that proves a person of it can access it (the
//! OAuth code GitHub hands them after installing the App), and to that one organisation only.
//! A real daemon on a real runtime, GitHub through its double.

mod support;

use std::process::Command;

use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use support::e2e::{body, create, unique_id, Backend, Host};
use support::github::{assert_refused, connect_with_code, show, GitHubDouble};

/// `narya github ARGS…` as `organisation`.
fn cli(host: &Host, organisation: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_narya"))
        .arg("--socket")
        .arg(&host.daemon.socket)
        .arg("github")
        .args(args)
        .env("NARYA_TOKEN", host.token(organisation))
        .output()
        .expect("narya runs")
}

async fn a_code_of_a_person_who_cannot_see_the_installation_proves_nothing(backend: Backend) {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    double.install(9, "globex", &["site"]);
    double.grant("wile", &[9]);
    let Some(host) = Host::start_on(backend, &double.toml()).await else {
        return;
    };
    let globex = host.client("globex");
    let refused = connect_with_code(&globex, 7, &double.code_for("wile")).await;
    let message = assert_refused(&refused, StatusCode::FORBIDDEN, "NRY-0052");
    assert!(message.contains(double.connect_url()), "{message}");
    assert!(message.contains("--code"), "{message}");
    // Nothing was recorded: globex's create of an acme repository is refused as unconnected.
    let id = unique_id("globex");
    let create = create(&globex, json!({"id": id, "repository": "acme/app"})).await;
    assert_refused(&create, StatusCode::FORBIDDEN, "NRY-0050");
    assert_refused(&show(&globex).await, StatusCode::NOT_FOUND, "NRY-0030");
    // A code nobody was given, and no code at all.
    let forged = connect_with_code(&globex, 9, "not-a-code").await;
    assert_refused(&forged, StatusCode::FORBIDDEN, "NRY-0052");
    let without = globex
        .send_json(
            Method::PUT,
            "/v1/organisation/github",
            &json!({"installation_id": 9}),
        )
        .await
        .unwrap();
    assert_refused(&without, StatusCode::BAD_REQUEST, "NRY-0020");
    // The user token was asked nothing else and is revoked.
    let tokens = double.user_tokens();
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    assert!(tokens[0].token.starts_with("ghu_"));
    assert!(tokens.iter().all(|t| t.revoked), "{tokens:?}");
    assert!(
        double.tokens().is_empty(),
        "no installation token was minted"
    );
}

async fn a_code_works_once_and_an_installation_belongs_to_one_organisation(backend: Backend) {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    // A person who sees more installations than fit a page: all pages are read.
    for id in 1..6 {
        double.install(id, &format!("other-{id}"), &[]);
    }
    // Listed by id, 7 comes on the last page.
    double.grant("road-runner", &[1, 2, 3, 4, 5, 7]);
    double.grant("acme-admin", &[7]);
    double.set_max_per_page(2);
    let Some(host) = Host::start_on(backend, &double.toml()).await else {
        return;
    };
    let acme = host.acme();
    let globex = host.client("globex");
    let code = double.code_for("road-runner");
    let connected = connect_with_code(&acme, 7, &code).await;
    assert_eq!(
        connected.status,
        StatusCode::NO_CONTENT,
        "{}",
        String::from_utf8_lossy(&connected.body)
    );
    assert_eq!(
        body(&show(&acme).await),
        json!({"installation_id": 7, "account": "acme"})
    );
    let again = connect_with_code(&acme, 7, &code).await;
    assert_refused(&again, StatusCode::FORBIDDEN, "NRY-0052");
    // Connecting again with a fresh code is idempotent.
    let fresh = connect_with_code(&acme, 7, &double.code_for("acme-admin")).await;
    assert_eq!(fresh.status, StatusCode::NO_CONTENT);

    // globex, with a valid code of a person who can see acme's installation, while acme holds it.
    let taken = connect_with_code(&globex, 7, &double.code_for("road-runner")).await;
    let message = assert_refused(&taken, StatusCode::CONFLICT, "NRY-0053");
    assert!(!message.contains("acme"), "it names the holder: {message}");
    assert_refused(&show(&globex).await, StatusCode::NOT_FOUND, "NRY-0030");

    // The CLI: show, disconnect, connect.
    let out = cli(&host, "acme", &["show"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "GitHub installation 7 of acme\n"
    );
    let out = cli(&host, "acme", &["disconnect"]);
    assert!(out.status.success(), "{out:?}");
    assert_refused(&show(&acme).await, StatusCode::NOT_FOUND, "NRY-0030");
    let id = unique_id("disconnected");
    let refused = create(&acme, json!({"id": id, "repository": "acme/app"})).await;
    let message = assert_refused(&refused, StatusCode::FORBIDDEN, "NRY-0050");
    assert!(message.contains("narya github connect"), "{message}");
    let out = cli(&host, "acme", &["show"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NRY-0030"));

    // Let go by acme, it is globex's to connect.
    let code = double.code_for("road-runner");
    let out = cli(&host, "globex", &["connect", "7", "--code", &code]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "connected GitHub installation 7\n"
    );
    let out = cli(&host, "acme", &["connect", "7", "--code", &code]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NRY-0052"));

    // Every user token was revoked; the listing was read page by page.
    let tokens = double.user_tokens();
    assert!(tokens.iter().all(|t| t.revoked), "{tokens:?}");
    let openapi = body(
        &acme
            .send(Method::GET, "/v1/openapi.json", None)
            .await
            .unwrap(),
    );
    let operations = &openapi["paths"]["/v1/organisation/github"];
    for method in ["put", "get", "delete"] {
        assert!(operations[method].is_object(), "{method}: {operations}");
    }
    assert!(operations["put"]["responses"]["409"].is_object());
    assert_ne!(openapi["components"]["schemas"]["GitHubView"], Value::Null);
}

async fn a_host_whose_oauth_client_github_refuses_says_so(backend: Backend) {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    let keys = tempfile::tempdir().unwrap();
    let wrong = keys.path().join("wrong-secret");
    std::fs::write(&wrong, "not-the-secret\n").unwrap();
    let toml = format!(
        "{}client_secret_file = {:?}\n",
        double
            .toml()
            .lines()
            .filter(|l| !l.starts_with("client_secret_file"))
            .map(|l| format!("{l}\n"))
            .collect::<String>(),
        wrong.display().to_string()
    );
    let Some(host) = Host::start_on(backend, &toml).await else {
        return;
    };
    let answer = double.connect_as(&host.acme(), "acme-admin", 7).await;
    let message = assert_refused(&answer, StatusCode::INTERNAL_SERVER_ERROR, "NRY-0099");
    assert!(message.contains("client_id"), "{message}");
    assert!(!message.contains("not-the-secret"), "{message}");
    assert!(!host.daemon.log().contains("not-the-secret"));
}

on_every_engine!(
    a_host_whose_oauth_client_github_refuses_says_so,
    a_code_of_a_person_who_cannot_see_the_installation_proves_nothing,
    a_code_works_once_and_an_installation_belongs_to_one_organisation,
);
