//! Authentication on every request, on both listeners, against a real identity-provider double.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hyper::{Method, StatusCode};
use jsonwebtoken::{EncodingKey, Header};
use narya::client::{Answer, Client};
use serde_json::{json, Value};
use support::idp::IdentityProvider;
use support::{make_key, now, Daemon, TestKey};

fn claims(issuer: &str) -> serde_json::Map<String, Value> {
    let now = now();
    let Value::Object(map) = json!({
        "iss": issuer,
        "aud": "narya",
        "sub": "alice",
        "org": "acme",
        "iat": now,
        "nbf": now,
        "exp": now + 600,
    }) else {
        unreachable!()
    };
    map
}

fn sign(key: &TestKey, claims: &serde_json::Map<String, Value>) -> String {
    key.dev.sign(&Value::Object(claims.clone())).unwrap()
}

fn assert_refused(answer: &Answer, case: &str) {
    assert_eq!(
        answer.status,
        StatusCode::UNAUTHORIZED,
        "{case}: {answer:?}"
    );
    assert_eq!(
        answer
            .headers
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap()),
        Some("Bearer"),
        "{case}"
    );
    let error = answer
        .error()
        .unwrap_or_else(|| panic!("{case}: no error body"));
    assert_eq!(error.code, "NRY-0011", "{case}");
}

async fn list(client: &Client) -> Answer {
    client
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap()
}

struct Setup {
    _dir: tempfile::TempDir,
    idp: IdentityProvider,
    rsa: TestKey,
    ec: TestKey,
    outsider: TestKey,
    daemon: Daemon,
}

async fn setup(identity_extra: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let idp = IdentityProvider::start().await;
    let rsa = make_key(dir.path(), "rsa", "RSA");
    let ec = make_key(dir.path(), "ec", "P-256");
    let outsider = make_key(dir.path(), "outsider", "RSA");
    idp.publish(&rsa.dev);
    idp.publish(&ec.dev);
    let identity = idp.identity_toml(identity_extra);
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&identity))
        .await
        .unwrap();
    Setup {
        _dir: dir,
        idp,
        rsa,
        ec,
        outsider,
        daemon,
    }
}

/// A token whose header and payload are given as JSON and whose signature is `signature`.
fn forge(header: Value, payload: &serde_json::Map<String, Value>, signature: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header).unwrap()),
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(payload).unwrap()),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn every_bad_token_is_refused_and_a_good_one_passes_on_both_listeners() {
    let s = setup("").await;
    let issuer = s.idp.issuer.clone();
    let good = claims(&issuer);

    let mut refused: Vec<(&str, Option<String>)> = vec![
        ("no header", None),
        ("not a JWT", Some("not-a-jwt".to_owned())),
        ("empty bearer", Some(String::new())),
    ];

    // Signed by a key the provider never published, but claiming a published key's id.
    let mut header = Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some(s.rsa.dev.kid.clone());
    let bad_signature = jsonwebtoken::encode(&header, &good, &s.outsider.dev.key).unwrap();
    refused.push(("bad signature", Some(bad_signature)));

    refused.push((
        "alg none",
        Some(forge(
            json!({"alg": "none", "typ": "JWT", "kid": s.rsa.dev.kid}),
            &good,
            b"",
        )),
    ));

    let mut hs_header = Header::new(jsonwebtoken::Algorithm::HS256);
    hs_header.kid = Some(s.rsa.dev.kid.clone());
    let hs = jsonwebtoken::encode(
        &hs_header,
        &good,
        &EncodingKey::from_secret(&s.rsa.public_pem).unwrap(),
    )
    .unwrap();
    refused.push(("HS256 keyed with the RSA public key", Some(hs)));

    let mut expired = good.clone();
    expired.insert("exp".into(), json!(now() - 3600));
    expired.insert("nbf".into(), json!(now() - 7200));
    refused.push(("expired", Some(sign(&s.rsa, &expired))));

    let mut early = good.clone();
    early.insert("nbf".into(), json!(now() + 3600));
    refused.push(("not yet valid", Some(sign(&s.rsa, &early))));

    let mut wrong_issuer = good.clone();
    wrong_issuer.insert("iss".into(), json!(format!("{issuer}/other")));
    refused.push(("wrong issuer", Some(sign(&s.rsa, &wrong_issuer))));

    let mut issuer_in_an_array = good.clone();
    issuer_in_an_array.insert("iss".into(), json!([issuer]));
    refused.push((
        "issuer inside an array",
        Some(sign(&s.rsa, &issuer_in_an_array)),
    ));

    let mut no_issuer = good.clone();
    no_issuer.remove("iss");
    refused.push(("no issuer", Some(sign(&s.rsa, &no_issuer))));

    let mut wrong_audience = good.clone();
    wrong_audience.insert("aud".into(), json!("someone-else"));
    refused.push(("wrong audience", Some(sign(&s.rsa, &wrong_audience))));

    let mut no_audience = good.clone();
    no_audience.remove("aud");
    refused.push(("no audience", Some(sign(&s.rsa, &no_audience))));

    let mut no_expiry = good.clone();
    no_expiry.remove("exp");
    refused.push(("no expiry", Some(sign(&s.rsa, &no_expiry))));

    let mut no_person = good.clone();
    no_person.remove("sub");
    refused.push(("missing person claim", Some(sign(&s.rsa, &no_person))));

    let mut empty_person = good.clone();
    empty_person.insert("sub".into(), json!(""));
    refused.push(("empty person claim", Some(sign(&s.rsa, &empty_person))));

    let mut no_org = good.clone();
    no_org.remove("org");
    refused.push(("missing organisation claim", Some(sign(&s.rsa, &no_org))));

    let mut numeric_org = good.clone();
    numeric_org.insert("org".into(), json!(42));
    refused.push((
        "non-string organisation claim",
        Some(sign(&s.rsa, &numeric_org)),
    ));

    let mut unknown_kid = Header::new(jsonwebtoken::Algorithm::RS256);
    unknown_kid.kid = Some("no-such-key".to_owned());
    refused.push((
        "unknown kid",
        Some(jsonwebtoken::encode(&unknown_kid, &good, &s.outsider.dev.key).unwrap()),
    ));

    // The EC key is published for ES256; a token claiming RS256 with its kid must not pass.
    let mut mismatched = Header::new(jsonwebtoken::Algorithm::RS256);
    mismatched.kid = Some(s.ec.dev.kid.clone());
    refused.push((
        "algorithm differs from the key's",
        Some(jsonwebtoken::encode(&mismatched, &good, &s.rsa.dev.key).unwrap()),
    ));

    for (transport, _) in s.daemon.transports(None) {
        for (case, token) in &refused {
            let client = match transport {
                "unix" => s.daemon.unix(token.as_deref()),
                _ => s.daemon.tcp(token.as_deref()),
            };
            assert_refused(&list(&client).await, &format!("{case} over {transport}"));
        }
    }

    let mut within_leeway = good.clone();
    within_leeway.insert("exp".into(), json!(now() - 5));
    let accepted = [
        ("valid RS256", sign(&s.rsa, &good)),
        ("valid ES256", sign(&s.ec, &good)),
        ("expired within the leeway", sign(&s.rsa, &within_leeway)),
    ];
    for (case, token) in &accepted {
        for (transport, client) in s.daemon.transports(Some(token)) {
            let answer = list(&client).await;
            assert_eq!(
                answer.status,
                StatusCode::OK,
                "{case} over {transport}: {answer:?}"
            );
            let body: Value = serde_json::from_slice(&answer.body).unwrap();
            assert_eq!(body, json!({"environments": []}));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn no_route_is_exempt_from_authentication() {
    let s = setup("").await;
    let token = sign(&s.rsa, &claims(&s.idp.issuer));
    let routes = [
        (Method::GET, "/v1/openapi.json"),
        (Method::GET, "/no/such/path"),
        (Method::GET, "/"),
        (Method::POST, "/v1/environments"),
        (Method::GET, "/v1/environments/demo"),
        (Method::DELETE, "/v1/environments/demo"),
        (Method::POST, "/v1/environments/demo/exec"),
        (Method::POST, "/v1/environments/demo/replace"),
        (Method::PUT, "/v1/organisation/github"),
        (Method::GET, "/v1/events"),
        (Method::GET, "/metrics"),
        (Method::PATCH, "/v1/environments"),
    ];
    for (transport, client) in s.daemon.transports(None) {
        for (method, path) in &routes {
            let answer = client.send(method.clone(), path, None).await.unwrap();
            assert_refused(&answer, &format!("{method} {path} over {transport}"));
        }
    }
    for (transport, client) in s.daemon.transports(Some(&token)) {
        let answer = client
            .send(Method::GET, "/v1/openapi.json", None)
            .await
            .unwrap();
        assert_eq!(answer.status, StatusCode::OK, "{transport}");
        let doc: Value = serde_json::from_slice(&answer.body).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
        for path in [
            "/v1/environments",
            "/v1/environments/{id}",
            "/v1/environments/{id}/exec",
            "/v1/environments/{id}/replace",
            "/v1/organisation/github",
            "/v1/events",
            "/v1/openapi.json",
        ] {
            assert!(
                doc["paths"][path].is_object(),
                "{path} missing from the OpenAPI document"
            );
        }
        assert!(
            doc["components"]["schemas"]["EventLine"]["properties"]["status"].is_object(),
            "the events line schema is documented"
        );
        let unknown = client
            .send(Method::GET, "/no/such/path", None)
            .await
            .unwrap();
        assert_eq!(unknown.status, StatusCode::NOT_FOUND);
        assert_eq!(unknown.error().unwrap().code, "NRY-0030");
        let wrong_method = client
            .send(Method::PATCH, "/v1/environments", None)
            .await
            .unwrap();
        assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(wrong_method.error().unwrap().code, "NRY-0020");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_key_is_accepted_after_one_refetch() {
    let s = setup("").await;
    let hits_at_start = s.idp.jwks_hits();
    let rotated = make_key(s._dir.path(), "rotated", "P-256");
    s.idp.publish(&rotated.dev);
    let token = sign(&rotated, &claims(&s.idp.issuer));
    for (transport, client) in s.daemon.transports(Some(&token)) {
        let answer = list(&client).await;
        assert_eq!(answer.status, StatusCode::OK, "{transport}: {answer:?}");
    }
    assert_eq!(
        s.idp.jwks_hits(),
        hits_at_start + 1,
        "the rotated key needs exactly one refetch"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_kid_refetches_are_merged_and_rate_limited() {
    let s = Arc::new(setup("").await);
    let hits_at_start = s.idp.jwks_hits();
    let mut header = Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("never-published".to_owned());
    let token = jsonwebtoken::encode(&header, &claims(&s.idp.issuer), &s.outsider.dev.key).unwrap();

    let mut tasks = Vec::new();
    for i in 0..24 {
        let s = s.clone();
        let token = token.clone();
        tasks.push(tokio::spawn(async move {
            let client = if i % 2 == 0 {
                s.daemon.unix(Some(&token))
            } else {
                s.daemon.tcp(Some(&token))
            };
            list(&client).await
        }));
    }
    for task in tasks {
        assert_refused(&task.await.unwrap(), "unknown kid under load");
    }
    assert_eq!(
        s.idp.jwks_hits(),
        hits_at_start + 1,
        "24 concurrent misses must cause exactly one refetch"
    );
    // A further miss soon after is answered from the cache, without asking the provider.
    assert_refused(
        &list(&s.daemon.unix(Some(&token))).await,
        "unknown kid again",
    );
    assert_eq!(s.idp.jwks_hits(), hits_at_start + 1);
}

/// Asks with `token` until it is refused, for at most `bound`; returns how long that took.
async fn until_refused(s: &Setup, token: &str, bound: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let answer = list(&s.daemon.unix(Some(token))).await;
        if answer.status == StatusCode::UNAUTHORIZED {
            assert_refused(&answer, "withdrawn key");
            return started.elapsed();
        }
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert!(
            started.elapsed() < bound,
            "a withdrawn key still verifies after {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_removed_from_the_jwks_stops_verifying_within_jwks_refresh() {
    let s = setup("jwks_refresh = \"2s\"").await;
    let withdrawn = sign(&s.rsa, &claims(&s.idp.issuer));
    let kept = sign(&s.ec, &claims(&s.idp.issuer));
    for (transport, client) in s.daemon.transports(Some(&withdrawn)) {
        assert_eq!(list(&client).await.status, StatusCode::OK, "{transport}");
    }
    s.idp.withdraw(&s.rsa.dev.kid);
    until_refused(&s, &withdrawn, Duration::from_secs(60)).await;
    for (transport, client) in s.daemon.transports(Some(&withdrawn)) {
        assert_refused(&list(&client).await, &format!("withdrawn over {transport}"));
    }
    for (transport, client) in s.daemon.transports(Some(&kept)) {
        assert_eq!(list(&client).await.status, StatusCode::OK, "{transport}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shorter_cache_control_max_age_brings_the_refresh_forward() {
    let dir = tempfile::tempdir().unwrap();
    let idp = IdentityProvider::start().await;
    idp.set_max_age(Some(1));
    let rsa = make_key(dir.path(), "rsa", "RSA");
    let ec = make_key(dir.path(), "ec", "P-256");
    idp.publish(&rsa.dev);
    idp.publish(&ec.dev);
    // jwks_refresh stays at its 15-minute default: only max-age can make this pass in time.
    let identity = idp.identity_toml("");
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&identity))
        .await
        .unwrap();
    let outsider = make_key(dir.path(), "outsider", "RSA");
    let s = Setup {
        _dir: dir,
        idp,
        rsa,
        ec,
        outsider,
        daemon,
    };
    let token = sign(&s.rsa, &claims(&s.idp.issuer));
    assert_eq!(
        list(&s.daemon.unix(Some(&token))).await.status,
        StatusCode::OK
    );
    s.idp.withdraw(&s.rsa.dev.kid);
    until_refused(&s, &token, Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_are_kept_when_a_refetch_fails() {
    let s = setup("").await;
    let good = sign(&s.rsa, &claims(&s.idp.issuer));
    assert_eq!(
        list(&s.daemon.unix(Some(&good))).await.status,
        StatusCode::OK
    );

    s.idp.set_failing(true);
    let mut header = Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("triggers-a-refetch".to_owned());
    let unknown =
        jsonwebtoken::encode(&header, &claims(&s.idp.issuer), &s.outsider.dev.key).unwrap();
    let hits = s.idp.jwks_hits();
    assert_refused(
        &list(&s.daemon.unix(Some(&unknown))).await,
        "unknown kid while the provider fails",
    );
    assert_eq!(s.idp.jwks_hits(), hits + 1, "the refetch was attempted");

    for (transport, client) in s.daemon.transports(Some(&good)) {
        assert_eq!(
            list(&client).await.status,
            StatusCode::OK,
            "{transport}: old keys still serve"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_configured_jwks_uri_is_used_without_discovery() {
    let dir = tempfile::tempdir().unwrap();
    let idp = IdentityProvider::start().await;
    let key = make_key(dir.path(), "k", "P-256");
    idp.publish(&key.dev);
    // Discovery would name a foreign issuer; with jwks_uri set it is never consulted.
    idp.set_discovered_issuer("https://elsewhere.example.com");
    let identity = idp.identity_toml(&format!("jwks_uri = {:?}", idp.jwks_uri()));
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&identity))
        .await
        .unwrap();
    let token = sign(&key, &claims(&idp.issuer));
    for (transport, client) in daemon.transports(Some(&token)) {
        assert_eq!(list(&client).await.status, StatusCode::OK, "{transport}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn discovery_naming_another_issuer_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let idp = IdentityProvider::start().await;
    let key = make_key(dir.path(), "k", "RSA");
    idp.publish(&key.dev);
    idp.set_discovered_issuer("https://impostor.example.com");
    let identity = idp.identity_toml("");
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&identity))
        .await
        .unwrap();
    let token = sign(&key, &claims(&idp.issuer));
    for (transport, client) in daemon.transports(Some(&token)) {
        assert_refused(
            &list(&client).await,
            &format!("mismatched discovery over {transport}"),
        );
    }
    assert_eq!(
        idp.jwks_hits(),
        0,
        "keys named by an untrusted discovery document are never fetched"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn symmetric_and_encryption_keys_in_the_set_are_never_used() {
    let dir = tempfile::tempdir().unwrap();
    let idp = IdentityProvider::start().await;
    let secret = b"a-shared-secret-that-must-not-work";
    idp.publish_raw(
        json!({"kty": "oct", "kid": "hmac", "alg": "HS256", "k": URL_SAFE_NO_PAD.encode(secret)}),
    );
    let rsa = make_key(dir.path(), "enc", "RSA");
    let mut enc = rsa.dev.jwks()["keys"][0].clone();
    enc["use"] = json!("enc");
    enc["kid"] = json!("enc-key");
    idp.publish_raw(enc);
    let identity = idp.identity_toml("algorithms = [\"RS256\", \"ES256\"]");
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&identity))
        .await
        .unwrap();

    let mut hs = Header::new(jsonwebtoken::Algorithm::HS256);
    hs.kid = Some("hmac".to_owned());
    let hmac_token = jsonwebtoken::encode(
        &hs,
        &claims(&idp.issuer),
        &EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap();
    let mut rs = Header::new(jsonwebtoken::Algorithm::RS256);
    rs.kid = Some("enc-key".to_owned());
    let enc_token = jsonwebtoken::encode(&rs, &claims(&idp.issuer), &rsa.dev.key).unwrap();
    for (case, token) in [("oct key", hmac_token), ("encryption key", enc_token)] {
        for (transport, client) in daemon.transports(Some(&token)) {
            assert_refused(&list(&client).await, &format!("{case} over {transport}"));
        }
    }
}
