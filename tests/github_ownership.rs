//! Connecting an installation proves that the person administers the account it belongs to,
//! not only that they can see it: an outside collaborator, a member who is not an owner, an
//! owner whose invitation is pending, another user than a user account's own, and anyone for
//! a suspended installation are refused `403 NRY-0052` with nothing recorded. And one
//! organisation's refused requests spend at most its bucket of the App's calls to GitHub.
//! A real daemon, GitHub through its double (which speaks GitHub's shapes for installations on
//! users and organisations, `/user` and `/user/memberships/orgs/{org}`).

mod support;

use std::time::{Duration, Instant};

use hyper::StatusCode;
use narya::client::{Answer, Client};
use serde_json::json;
use support::e2e::{body, create, unique_id, Backend, Host};
use support::github::{assert_refused, connect_with_code, show, GitHubDouble};

/// What the daemon's bucket holds and how fast it refills (`narya::organisation`).
const BUCKET: usize = narya::organisation::BUCKET_SIZE as usize;
const REFILL: Duration = narya::organisation::REFILL;

/// Connects `client`'s organisation to `installation` with a fresh code of `login`'s.
async fn connect(double: &GitHubDouble, client: &Client, login: &str, installation: i64) -> Answer {
    connect_with_code(client, installation, &double.code_for(login)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn only_an_active_owner_of_the_organisation_connects_its_installation() {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    // Each sees installation 7 listed, as GitHub lists it to anyone with access to one of its
    // repositories.
    for login in ["carol", "mona", "pat", "olga"] {
        double.grant_access(login, &[7]);
    }
    double.set_membership("mona", "acme", "member", "active");
    double.set_membership("pat", "acme", "admin", "pending");
    double.set_membership("olga", "acme", "admin", "active");
    let Some(host) = Host::start_on(Backend::Containerd, &double.toml()).await else {
        return;
    };
    let globex = host.client("globex");
    for (login, why) in [
        ("carol", "not a member"),
        ("mona", "not an owner"),
        ("pat", "not accepted"),
    ] {
        let answer = connect(&double, &globex, login, 7).await;
        let message = assert_refused(&answer, StatusCode::FORBIDDEN, "NRY-0052");
        assert!(
            message.contains(why) && message.contains("acme"),
            "{login}: {message}"
        );
        assert_refused(&show(&globex).await, StatusCode::NOT_FOUND, "NRY-0030");
        let id = unique_id("unbound");
        let denied = create(&globex, json!({"id": id, "repository": "acme/app"})).await;
        assert_refused(&denied, StatusCode::FORBIDDEN, "NRY-0050");
    }
    let acme = host.acme();
    let owned = connect(&double, &acme, "olga", 7).await;
    assert_eq!(
        owned.status,
        StatusCode::NO_CONTENT,
        "{}",
        String::from_utf8_lossy(&owned.body)
    );
    assert_eq!(
        body(&show(&acme).await),
        json!({"installation_id": 7, "account": "acme"})
    );
    // Every user token was revoked, after the questions it was for.
    let tokens = double.user_tokens();
    assert_eq!(tokens.len(), 4, "{tokens:?}");
    assert!(tokens.iter().all(|t| t.revoked), "{tokens:?}");
    let asked = double.user_requests();
    assert!(
        asked.iter().any(|r| r == "GET /user/memberships/orgs/acme"),
        "{asked:?}"
    );

    // A suspended installation reaches nothing: not even its owner connects it.
    double.install(8, "acme-labs", &["lab"]);
    double.grant("olga", &[8]);
    double.suspend(8);
    let suspended = connect(&double, &globex, "olga", 8).await;
    let message = assert_refused(&suspended, StatusCode::FORBIDDEN, "NRY-0052");
    assert!(message.contains("suspended"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_accounts_installation_is_connected_by_that_user_only() {
    let double = GitHubDouble::start().await;
    double.install_on_user(11, "ursula", &["notes"]);
    // A collaborator on one of ursula's repositories sees her installation listed.
    double.grant_access("victor", &[11]);
    let Some(host) = Host::start_on(Backend::Containerd, &double.toml()).await else {
        return;
    };
    let globex = host.client("globex");
    let taken = connect(&double, &globex, "victor", 11).await;
    let message = assert_refused(&taken, StatusCode::FORBIDDEN, "NRY-0052");
    assert!(message.contains("another user"), "{message}");
    assert_refused(&show(&globex).await, StatusCode::NOT_FOUND, "NRY-0030");
    let acme = host.acme();
    let own = connect(&double, &acme, "ursula", 11).await;
    assert_eq!(
        own.status,
        StatusCode::NO_CONTENT,
        "{}",
        String::from_utf8_lossy(&own.body)
    );
    assert_eq!(
        body(&show(&acme).await),
        json!({"installation_id": 11, "account": "ursula"})
    );
}

/// One organisation creating, as fast as it can, environments of a repository its installation
/// did not select makes at most its bucket's calls to GitHub (then one per refill), is told
/// `429 NRY-0070` when to retry, and another organisation's connect and creates go on.
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_refused_creates_spends_at_most_the_organisations_bucket() {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    double.install(9, "globex", &["site"]);
    double.grant("olga", &[7]);
    double.grant("gus", &[9]);
    let Some(host) = Host::start_on(Backend::Containerd, &double.toml()).await else {
        return;
    };
    let acme = host.acme();
    let connected = connect(&double, &acme, "olga", 7).await;
    assert_eq!(connected.status, StatusCode::NO_CONTENT);

    let asked_of = |repository: &str| {
        double
            .api_requests()
            .iter()
            .filter(|r| *r == &format!("GET /repos/{repository}/installation"))
            .count()
    };
    let started = Instant::now();
    let mut answers = Vec::new();
    for _ in 0..40 {
        let id = unique_id("flood");
        let answer = create(&acme, json!({"id": id, "repository": "acme/secret"})).await;
        answers.push(answer.status);
        if answer.status == StatusCode::TOO_MANY_REQUESTS {
            let message = assert_refused(&answer, StatusCode::TOO_MANY_REQUESTS, "NRY-0070");
            assert!(message.contains("retry in"), "{message}");
        } else {
            assert_refused(&answer, StatusCode::FORBIDDEN, "NRY-0051");
        }
    }
    let elapsed = started.elapsed();
    let calls = asked_of("acme/secret");
    let allowed = BUCKET + (elapsed.as_secs_f64() / REFILL.as_secs_f64()).ceil() as usize;
    eprintln!(
        "40 refused creates in {} ms made {calls} calls to GitHub (the bucket allows {allowed})",
        elapsed.as_millis()
    );
    assert!(calls <= allowed, "{calls} calls, more than {allowed}");
    assert!(
        answers.contains(&StatusCode::TOO_MANY_REQUESTS),
        "the bucket ran dry: {answers:?}"
    );

    // globex's share is its own.
    let globex = host.client("globex");
    let theirs = connect(&double, &globex, "gus", 9).await;
    assert_eq!(
        theirs.status,
        StatusCode::NO_CONTENT,
        "{}",
        String::from_utf8_lossy(&theirs.body)
    );
    let id = unique_id("globex-refused");
    let refused_once = create(&globex, json!({"id": id, "repository": "globex/other"})).await;
    assert_refused(&refused_once, StatusCode::FORBIDDEN, "NRY-0051");
}

/// GitHub's own rate limit (a 403 with `retry-after`) answers `503 NRY-0060` saying when to
/// retry, with nothing made.
#[tokio::test(flavor = "multi_thread")]
async fn githubs_rate_limit_answers_503_saying_when_to_retry() {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    double.grant("olga", &[7]);
    let Some(host) = Host::start_on(Backend::Containerd, &double.toml()).await else {
        return;
    };
    let acme = host.acme();
    let connected = connect(&double, &acme, "olga", 7).await;
    assert_eq!(connected.status, StatusCode::NO_CONTENT);
    double.rate_limit(Some(42));
    let id = unique_id("limited");
    let limited = create(&acme, json!({"id": id, "repository": "acme/app"})).await;
    let message = assert_refused(&limited, StatusCode::SERVICE_UNAVAILABLE, "NRY-0060");
    assert!(message.contains("retry in 42 s"), "{message}");
    assert_eq!(host.machines_labelled(&id).await, 0, "nothing was made");
}
