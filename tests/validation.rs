//! The create body's rules, each with its exact status and NRY code, through a real daemon.

mod support;

use hyper::{Method, StatusCode};
use narya::client::Client;
use serde_json::{json, Value};
use support::idp::IdentityProvider;
use support::{make_key, now, Daemon};

async fn daemon_and_token() -> (tempfile::TempDir, IdentityProvider, Daemon, String) {
    let dir = tempfile::tempdir().unwrap();
    let idp = IdentityProvider::start().await;
    let key = make_key(dir.path(), "k", "P-256");
    idp.publish(&key.dev);
    let identity = idp.identity_toml("");
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&identity))
        .await
        .unwrap();
    let token = key
        .dev
        .sign(&json!({
            "iss": idp.issuer, "aud": "narya", "sub": "alice", "org": "acme",
            "exp": now() + 600,
        }))
        .unwrap();
    (dir, idp, daemon, token)
}

/// Sends a raw body and returns status and NRY code.
async fn create_raw(client: &Client, body: &[u8]) -> (StatusCode, String, String) {
    let answer = client
        .send(Method::POST, "/v1/environments", Some(body.to_vec()))
        .await
        .unwrap();
    let error = answer.error().expect("an error body");
    (answer.status, error.code, error.message)
}

async fn create(client: &Client, body: Value) -> (StatusCode, String, String) {
    create_raw(client, &serde_json::to_vec(&body).unwrap()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn create_body_rules_answer_their_exact_codes() {
    let (_dir, _idp, daemon, token) = daemon_and_token().await;
    let client = daemon.unix(Some(&token));

    let bad_ids: Vec<(&str, Value)> = vec![
        ("length 0", json!("")),
        ("length 65", json!("a".repeat(65))),
        ("leading .", json!(".env")),
        ("leading -", json!("-env")),
        ("leading _", json!("_env")),
        ("contains /", json!("a/b")),
        ("contains ?", json!("a?b")),
        ("contains #", json!("a#b")),
        ("contains space", json!("a b")),
        ("non-ASCII", json!("café")),
        ("only a dot", json!(".")),
    ];
    for (case, id) in bad_ids {
        let (status, code, message) = create(&client, json!({"id": id})).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::BAD_REQUEST, "NRY-0021"),
            "id {case}"
        );
        assert!(message.contains("identifier"), "id {case}: {message}");
    }

    let (status, code, message) =
        create(&client, json!({"id": "demo", "setup": "x".repeat(65537)})).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::BAD_REQUEST, "NRY-0022"),
        "setup 65537"
    );
    assert!(message.contains("65537"), "{message}");

    let long_repository = format!("{}/{}", "o".repeat(100), "n".repeat(100));
    let bad_repositories = [
        ("201 characters", long_repository.as_str()),
        ("no slash", "acme"),
        ("two slashes", "acme/app/extra"),
        ("empty owner", "/app"),
        ("empty name", "acme/"),
        ("leading dot in name", "acme/.app"),
        ("space", "acme/my app"),
        ("URL", "https://github.com/acme/app"),
    ];
    for (case, repository) in bad_repositories {
        let (status, code, _) =
            create(&client, json!({"id": "demo", "repository": repository})).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::BAD_REQUEST, "NRY-0023"),
            "repository {case}"
        );
    }

    let malformed: Vec<(&str, Vec<u8>)> = vec![
        (
            "unknown field",
            br#"{"id": "demo", "setpu": "make"}"#.to_vec(),
        ),
        ("id of wrong type", br#"{"id": 7}"#.to_vec()),
        (
            "setup of wrong type",
            br#"{"id": "demo", "setup": ["make"]}"#.to_vec(),
        ),
        (
            "repository of wrong type",
            br#"{"id": "demo", "repository": true}"#.to_vec(),
        ),
        ("missing id", br#"{"setup": "make"}"#.to_vec()),
        ("not JSON", b"id=demo".to_vec()),
        ("a JSON array", b"[]".to_vec()),
        ("empty body", Vec::new()),
    ];
    for (case, body) in malformed {
        let (status, code, message) = create_raw(&client, &body).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::BAD_REQUEST, "NRY-0020"),
            "{case}"
        );
        assert!(!message.is_empty(), "{case}");
    }
    let (_, _, message) = create_raw(&client, br#"{"id": "demo", "setpu": "make"}"#).await;
    assert!(
        message.contains("setpu"),
        "the unknown field is named: {message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_at_the_limits_pass_validation() {
    let (_dir, _idp, daemon, token) = daemon_and_token().await;
    let client = daemon.unix(Some(&token));
    let at_limits = [
        json!({"id": "a"}),
        json!({"id": "a".repeat(64)}),
        json!({"id": "A.b_c-9"}),
        json!({"id": "demo", "setup": "x".repeat(65536)}),
        json!({"id": "demo", "setup": "é".repeat(65536)}),
        json!({"id": "demo", "repository": format!("{}/{}", "o".repeat(100), "n".repeat(99))}),
    ];
    for body in at_limits {
        let (status, code, _) = create(&client, body.clone()).await;
        assert_ne!(status, StatusCode::BAD_REQUEST, "{code} for a valid body");
        // No runtime back end is built yet: the daemon says so instead of pretending.
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "NRY-0060")
        );
    }
    let listed = client
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&listed.body).unwrap(),
        json!({"environments": []}),
        "a refused create leaves nothing behind"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn path_identifiers_follow_the_same_rule() {
    let (_dir, _idp, daemon, token) = daemon_and_token().await;
    let client = daemon.tcp(Some(&token));
    for path in [
        "/v1/environments/.hidden",
        "/v1/environments/a%20b",
        "/v1/environments/a%2Fb",
        "/v1/environments/caf%C3%A9",
        &format!("/v1/environments/{}", "a".repeat(65)),
    ] {
        let answer = client.send(Method::GET, path, None).await.unwrap();
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(answer.error().unwrap().code, "NRY-0021", "{path}");
    }
    for (method, path) in [
        (Method::GET, "/v1/environments/nope"),
        (Method::DELETE, "/v1/environments/nope"),
        (Method::POST, "/v1/environments/nope/replace"),
    ] {
        let answer = client.send(method.clone(), path, None).await.unwrap();
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(answer.error().unwrap().code, "NRY-0030");
    }
    let exec = client
        .send_json(
            Method::POST,
            "/v1/environments/nope/exec",
            &json!({"argv": ["true"]}),
        )
        .await
        .unwrap();
    assert_eq!(exec.status, StatusCode::NOT_FOUND);
    let empty_argv = client
        .send_json(
            Method::POST,
            "/v1/environments/nope/exec",
            &json!({"argv": []}),
        )
        .await
        .unwrap();
    assert_eq!(empty_argv.error().unwrap().code, "NRY-0020");
    let long_timeout = client
        .send_json(
            Method::POST,
            "/v1/environments/nope/exec",
            &json!({"argv": ["true"], "timeout": "2h"}),
        )
        .await
        .unwrap();
    assert_eq!(long_timeout.error().unwrap().code, "NRY-0020");
}
