//! The identity provider's key set: discovered or configured, cached, refetched on unknown keys.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

use crate::config::Identity;

/// The longest a key-set or discovery fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest key-set or discovery document accepted.
const FETCH_LIMIT: usize = 1 << 20;
/// Refetches on an unknown `kid` happen at most this often while keys are held...
const REFETCH_INTERVAL: Duration = Duration::from_secs(30);
/// ...and this often while none are (the provider was down when the daemon started).
const REFETCH_INTERVAL_EMPTY: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("cannot build the HTTP client for the identity provider: {0}")]
    Client(String),
    #[error("fetching {url}: {reason}")]
    Fetch { url: String, reason: String },
    #[error("{url} is not a usable document: {reason}")]
    Document { url: String, reason: String },
    #[error("discovery document at {url} names issuer {found:?}, not the configured {expected:?}")]
    IssuerMismatch {
        url: String,
        found: String,
        expected: String,
    },
}

/// One verification key, bound to the one algorithm it may verify.
#[derive(Clone)]
struct BoundKey {
    algorithm: Algorithm,
    key: DecodingKey,
}

#[derive(Default)]
struct KeySet {
    by_kid: HashMap<String, BoundKey>,
    without_kid: Vec<BoundKey>,
}

impl KeySet {
    fn find(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let matches = |k: &&BoundKey| k.algorithm == alg;
        match kid {
            Some(kid) => self.by_kid.get(kid).filter(matches).map(|k| k.key.clone()),
            // A token without `kid` may use a key only when exactly one key fits its algorithm.
            None => {
                let mut fitting = self
                    .by_kid
                    .values()
                    .chain(self.without_kid.iter())
                    .filter(matches);
                match (fitting.next(), fitting.next()) {
                    (Some(k), None) => Some(k.key.clone()),
                    _ => None,
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.by_kid.is_empty() && self.without_kid.is_empty()
    }
}

enum Source {
    Discovery { issuer: String },
    Uri(String),
}

struct FetchState {
    last_refetch: Option<Instant>,
}

/// Holds the current key set; misses trigger one merged, rate-limited refetch.
pub struct KeyCache {
    source: Source,
    allowed: HashSet<Algorithm>,
    http: reqwest::Client,
    keys: RwLock<Arc<KeySet>>,
    generation: std::sync::atomic::AtomicU64,
    fetch: tokio::sync::Mutex<FetchState>,
}

impl KeyCache {
    pub fn new(identity: &Identity, allowed: HashSet<Algorithm>) -> Result<KeyCache, JwksError> {
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .map_err(|e| JwksError::Client(e.to_string()))?;
        let source = match &identity.jwks_uri {
            Some(uri) => Source::Uri(uri.clone()),
            None => Source::Discovery {
                issuer: identity.issuer.clone(),
            },
        };
        Ok(KeyCache {
            source,
            allowed,
            http,
            keys: RwLock::new(Arc::new(KeySet::default())),
            generation: std::sync::atomic::AtomicU64::new(0),
            fetch: tokio::sync::Mutex::new(FetchState { last_refetch: None }),
        })
    }

    fn current(&self) -> Arc<KeySet> {
        match self.keys.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn replace(&self, set: KeySet) {
        let set = Arc::new(set);
        match self.keys.write() {
            Ok(mut guard) => *guard = set,
            Err(poisoned) => *poisoned.into_inner() = set,
        }
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The start-up load. It does not count against the refetch rate limit.
    pub async fn preload(&self) {
        let _guard = self.fetch.lock().await;
        match self.fetch_key_set().await {
            Ok(set) => {
                tracing::info!(
                    keys = set.by_kid.len() + set.without_kid.len(),
                    "identity provider keys loaded"
                );
                self.replace(set);
            }
            Err(e) => {
                tracing::warn!(error = %e, "identity provider keys not loaded yet; retrying on first request")
            }
        }
    }

    /// The key for a token's `kid` and `alg`, refetching the set once if it is unknown.
    pub async fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let seen = self.generation.load(std::sync::atomic::Ordering::SeqCst);
        if let Some(key) = self.current().find(kid, alg) {
            return Some(key);
        }
        let mut state = self.fetch.lock().await;
        // Someone else fetched while we waited: their result answers us too.
        if self.generation.load(std::sync::atomic::Ordering::SeqCst) != seen {
            return self.current().find(kid, alg);
        }
        let interval = if self.current().is_empty() {
            REFETCH_INTERVAL_EMPTY
        } else {
            REFETCH_INTERVAL
        };
        if state.last_refetch.is_some_and(|at| at.elapsed() < interval) {
            return None;
        }
        state.last_refetch = Some(Instant::now());
        match self.fetch_key_set().await {
            Ok(set) => {
                tracing::info!(
                    keys = set.by_kid.len() + set.without_kid.len(),
                    "identity provider keys refetched for an unknown key id"
                );
                self.replace(set);
            }
            Err(e) => {
                tracing::warn!(error = %e, "refetching identity provider keys failed; keeping the old ones");
            }
        }
        drop(state);
        self.current().find(kid, alg)
    }

    async fn fetch_key_set(&self) -> Result<KeySet, JwksError> {
        let uri = match &self.source {
            Source::Uri(uri) => uri.clone(),
            Source::Discovery { issuer } => self.discover(issuer).await?,
        };
        let document = self.fetch_json(&uri).await?;
        self.parse_key_set(&uri, &document)
    }

    async fn discover(&self, issuer: &str) -> Result<String, JwksError> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        let doc = self.fetch_json(&url).await?;
        let found = doc
            .get("issuer")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if found != issuer {
            return Err(JwksError::IssuerMismatch {
                url,
                found: found.to_owned(),
                expected: issuer.to_owned(),
            });
        }
        doc.get("jwks_uri")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| JwksError::Document {
                url,
                reason: "no jwks_uri".to_owned(),
            })
    }

    async fn fetch_json(&self, url: &str) -> Result<Value, JwksError> {
        let fetch_error = |reason: String| JwksError::Fetch {
            url: url.to_owned(),
            reason,
        };
        let bytes = if let Some(path) = url.strip_prefix("file://") {
            let bytes = tokio::fs::read(path)
                .await
                .map_err(|e| fetch_error(e.to_string()))?;
            if bytes.len() > FETCH_LIMIT {
                return Err(fetch_error(format!("larger than {FETCH_LIMIT} bytes")));
            }
            bytes
        } else {
            let mut response = self
                .http
                .get(url)
                .send()
                .await
                .map_err(|e| fetch_error(e.to_string()))?;
            if !response.status().is_success() {
                return Err(fetch_error(format!("status {}", response.status())));
            }
            let mut body = Vec::new();
            while let Some(chunk) = response
                .chunk()
                .await
                .map_err(|e| fetch_error(e.to_string()))?
            {
                body.extend_from_slice(&chunk);
                if body.len() > FETCH_LIMIT {
                    return Err(fetch_error(format!("larger than {FETCH_LIMIT} bytes")));
                }
            }
            body
        };
        serde_json::from_slice(&bytes).map_err(|e| JwksError::Document {
            url: url.to_owned(),
            reason: e.to_string(),
        })
    }

    fn parse_key_set(&self, url: &str, document: &Value) -> Result<KeySet, JwksError> {
        let keys = document
            .get("keys")
            .and_then(Value::as_array)
            .ok_or_else(|| JwksError::Document {
                url: url.to_owned(),
                reason: "no \"keys\" array".to_owned(),
            })?;
        let mut set = KeySet::default();
        for raw in keys {
            match self.bind_key(raw) {
                Ok((kid, key)) => match kid {
                    Some(kid) => {
                        set.by_kid.insert(kid, key);
                    }
                    None => set.without_kid.push(key),
                },
                Err(reason) => tracing::debug!(%reason, "skipping a key of the identity provider"),
            }
        }
        Ok(set)
    }

    /// Binds one JWK to the single algorithm it may verify, refusing symmetric and
    /// encryption keys.
    fn bind_key(&self, raw: &Value) -> Result<(Option<String>, BoundKey), String> {
        if raw.get("kty").and_then(Value::as_str) == Some("oct") {
            return Err("symmetric (oct) keys are never used".to_owned());
        }
        let jwk: Jwk = serde_json::from_value(raw.clone()).map_err(|e| e.to_string())?;
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            return Err("encryption keys are never used for signatures".to_owned());
        }
        let algorithm = match &jwk.common.key_algorithm {
            Some(declared) => Algorithm::from_str(&declared.to_string())
                .map_err(|_| format!("algorithm {declared} is not a signature algorithm"))?,
            None => match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Algorithm::RS256,
                AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                    EllipticCurve::P256 => Algorithm::ES256,
                    EllipticCurve::P384 => Algorithm::ES384,
                    _ => return Err("unsupported curve".to_owned()),
                },
                AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
                    Algorithm::EdDSA
                }
                _ => return Err("unsupported key type".to_owned()),
            },
        };
        if !self.allowed.contains(&algorithm) {
            return Err(format!("algorithm {algorithm:?} is not allowed"));
        }
        let family_fits = matches!(
            (&jwk.algorithm, algorithm),
            (
                AlgorithmParameters::RSA(_),
                Algorithm::RS256
                    | Algorithm::RS384
                    | Algorithm::RS512
                    | Algorithm::PS256
                    | Algorithm::PS384
                    | Algorithm::PS512
            ) | (
                AlgorithmParameters::EllipticCurve(_),
                Algorithm::ES256 | Algorithm::ES384
            ) | (AlgorithmParameters::OctetKeyPair(_), Algorithm::EdDSA)
        );
        if !family_fits {
            return Err(format!("algorithm {algorithm:?} does not fit the key type"));
        }
        let key = DecodingKey::from_jwk(&jwk).map_err(|e| e.to_string())?;
        Ok((jwk.common.key_id.clone(), BoundKey { algorithm, key }))
    }
}
