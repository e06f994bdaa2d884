//! Calls of the daemon's environments API as the end-to-end tests make them, and waits on
//! what it answers.

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use narya::client::{Answer, Client};
use serde_json::{json, Value};

/// A unique environment id for this test run.
pub fn unique_id(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

pub async fn create(client: &Client, body: Value) -> Answer {
    client
        .send_json(Method::POST, "/v1/environments", &body)
        .await
        .unwrap()
}

pub async fn get(client: &Client, id: &str) -> Answer {
    client
        .send(Method::GET, &format!("/v1/environments/{id}"), None)
        .await
        .unwrap()
}

pub async fn delete(client: &Client, id: &str) -> Answer {
    client
        .send(Method::DELETE, &format!("/v1/environments/{id}"), None)
        .await
        .unwrap()
}

/// The environments `LIST` answers.
pub async fn list(client: &Client) -> Vec<Value> {
    let answer = client
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    body(&answer)["environments"]
        .as_array()
        .expect("a list of environments")
        .clone()
}

/// Runs `argv` in environment `id` through the API.
pub async fn exec(client: &Client, id: &str, argv: &[&str]) -> Answer {
    client
        .send_json(
            Method::POST,
            &format!("/v1/environments/{id}/exec"),
            &json!({ "argv": argv }),
        )
        .await
        .unwrap()
}

/// What a create answered in `Narya-Create-Differs`, if it said anything.
pub fn differs(answer: &Answer) -> Option<String> {
    answer
        .headers
        .get("narya-create-differs")
        .map(|v| v.to_str().expect("a text header").to_owned())
}

/// Polls `GET` until `check` holds of the environment, within `within`; returns it.
pub async fn until(
    client: &Client,
    id: &str,
    within: Duration,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let answer = get(client, id).await;
        if answer.status == StatusCode::OK {
            let env = body(&answer);
            if check(&env) {
                return env;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{id} not {what} within {within:?}: {} {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn body(answer: &Answer) -> Value {
    serde_json::from_slice(&answer.body).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {:?}",
            String::from_utf8_lossy(&answer.body)
        )
    })
}

/// Polls `GET` until the environment is no longer provisioning.
pub async fn settled(client: &Client, id: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let answer = get(client, id).await;
        if answer.status == StatusCode::OK {
            let env = body(&answer);
            if env["status_detail"] != "provisioning" {
                return env;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{id} still provisioning after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
