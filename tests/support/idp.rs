//! A double of an OpenID identity provider: discovery and JWKS over real HTTP on loopback.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

#[derive(Default)]
struct Shared {
    issuer: Mutex<String>,
    discovered_issuer: Mutex<Option<String>>,
    keys: Mutex<Vec<Value>>,
    jwks_hits: AtomicUsize,
    failing: AtomicBool,
    max_age: Mutex<Option<u64>>,
}

/// The double; it serves until dropped with the test's runtime.
pub struct IdentityProvider {
    pub issuer: String,
    shared: Arc<Shared>,
}

impl IdentityProvider {
    /// Starts serving on a free loopback port; `issuer` is `http://127.0.0.1:PORT`.
    pub async fn start() -> IdentityProvider {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared::default());
        *shared.issuer.lock().unwrap() = issuer.clone();
        let app = Router::new()
            .route("/.well-known/openid-configuration", get(discovery))
            .route("/jwks", get(jwks))
            .with_state(shared.clone());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        IdentityProvider { issuer, shared }
    }

    pub fn jwks_uri(&self) -> String {
        format!("{}/jwks", self.issuer)
    }

    /// Publishes the public half of `key` (as its JWK, kid = thumbprint).
    pub fn publish(&self, key: &narya::devkeys::DevKey) {
        let jwks = key.jwks();
        let jwk = jwks["keys"][0].clone();
        self.shared.keys.lock().unwrap().push(jwk);
    }

    /// Publishes a raw JWK as given.
    pub fn publish_raw(&self, jwk: Value) {
        self.shared.keys.lock().unwrap().push(jwk);
    }

    /// Takes the key with id `kid` out of the published set.
    pub fn withdraw(&self, kid: &str) {
        self.shared
            .keys
            .lock()
            .unwrap()
            .retain(|jwk| jwk["kid"].as_str() != Some(kid));
    }

    /// While set, the key set is answered with `Cache-Control: max-age=SECONDS`.
    pub fn set_max_age(&self, seconds: Option<u64>) {
        *self.shared.max_age.lock().unwrap() = seconds;
    }

    /// How many times the key set was fetched.
    pub fn jwks_hits(&self) -> usize {
        self.shared.jwks_hits.load(Ordering::SeqCst)
    }

    /// While set, the key set answers 500.
    pub fn set_failing(&self, failing: bool) {
        self.shared.failing.store(failing, Ordering::SeqCst);
    }

    /// Makes discovery name another issuer than the one tokens are checked against.
    pub fn set_discovered_issuer(&self, issuer: &str) {
        *self.shared.discovered_issuer.lock().unwrap() = Some(issuer.to_owned());
    }

    /// The `[identity]` section of a daemon configuration trusting this provider.
    pub fn identity_toml(&self, extra: &str) -> String {
        format!(
            "[identity]\nissuer = {:?}\naudience = \"narya\"\n{extra}\n",
            self.issuer
        )
    }
}

async fn discovery(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let issuer = shared.issuer.lock().unwrap().clone();
    let named = shared
        .discovered_issuer
        .lock()
        .unwrap()
        .clone()
        .unwrap_or_else(|| issuer.clone());
    Json(json!({
        "issuer": named,
        "jwks_uri": format!("{issuer}/jwks"),
        "id_token_signing_alg_values_supported": ["RS256", "ES256"],
    }))
}

async fn jwks(State(shared): State<Arc<Shared>>) -> Response {
    shared.jwks_hits.fetch_add(1, Ordering::SeqCst);
    if shared.failing.load(Ordering::SeqCst) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "down").into_response();
    }
    let keys = shared.keys.lock().unwrap().clone();
    let mut response = Json(json!({ "keys": keys })).into_response();
    if let Some(seconds) = *shared.max_age.lock().unwrap() {
        response.headers_mut().insert(
            axum::http::header::CACHE_CONTROL,
            format!("public, max-age={seconds}").parse().unwrap(),
        );
    }
    response
}
