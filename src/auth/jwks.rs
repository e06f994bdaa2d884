//! The identity provider's key set: cached, fetched again on a schedule and on unknown keys.

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
/// A failed scheduled refresh is tried again this soon (or sooner, when `jwks_refresh` is
/// shorter), not on every request while the provider is down.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(30);
/// The shortest refresh interval a `Cache-Control: max-age` may ask for: `max-age=0` would
/// otherwise mean one fetch per request.
const MIN_MAX_AGE: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("cannot build the HTTP client for the identity provider: {0}")]
    Client(String),
    #[error("fetching {url}: {reason}")]
    Fetch { url: String, reason: String },
    #[error("{url} is not a usable document: {reason}")]
    Document { url: String, reason: String },
    #[error("discovery document at {url} names jwks_uri {jwks_uri:?}: {reason}")]
    DiscoveredUri {
        url: String,
        jwks_uri: String,
        reason: &'static str,
    },
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
    /// The last refetch for an unknown key id, for its rate limit.
    last_refetch: Option<Instant>,
}

/// A fetched document and how long its answer said it may be cached.
struct Fetched {
    document: Value,
    max_age: Option<Duration>,
}

/// Holds the current key set; it is fetched again once `refresh` (or the answer's shorter
/// `max-age`) has passed, and misses trigger one merged, rate-limited refetch.
pub struct KeyCache {
    source: Source,
    allowed: HashSet<Algorithm>,
    http: reqwest::Client,
    keys: RwLock<Arc<KeySet>>,
    generation: std::sync::atomic::AtomicU64,
    refresh: Duration,
    /// When the held set is next fetched again; `None` until the first attempt.
    refresh_due: std::sync::Mutex<Option<Instant>>,
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
            refresh: identity.jwks_refresh.0,
            refresh_due: std::sync::Mutex::new(None),
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

    fn refresh_is_due(&self) -> bool {
        let due = match self.refresh_due.lock() {
            Ok(guard) => *guard,
            Err(poisoned) => *poisoned.into_inner(),
        };
        due.is_none_or(|at| Instant::now() >= at)
    }

    fn schedule_refresh(&self, after: Duration) {
        let at = Some(Instant::now() + after);
        match self.refresh_due.lock() {
            Ok(mut guard) => *guard = at,
            Err(poisoned) => *poisoned.into_inner() = at,
        }
    }

    /// Fetches the key set and schedules the next refresh; on failure the old keys stay and
    /// the fetch is tried again soon. The caller holds `fetch`.
    async fn reload(&self, why: &'static str) {
        match self.fetch_key_set().await {
            Ok((set, max_age, _)) => {
                tracing::info!(
                    keys = set.by_kid.len() + set.without_kid.len(),
                    why,
                    "identity provider keys fetched"
                );
                let next = max_age
                    .map(|age| age.max(MIN_MAX_AGE))
                    .map_or(self.refresh, |age| age.min(self.refresh));
                self.replace(set);
                self.schedule_refresh(next);
            }
            Err(e) => {
                tracing::warn!(error = %e, why, "fetching identity provider keys failed; keeping the old ones");
                self.schedule_refresh(RETRY_AFTER_FAILURE.min(self.refresh));
            }
        }
    }

    /// The start-up load. It does not count against the refetch rate limit.
    pub async fn preload(&self) {
        let _guard = self.fetch.lock().await;
        self.reload("start-up").await;
    }

    /// Fetches the key set now, without keeping it: how many keys of the allowed algorithms
    /// it holds, and where it came from. For `naryad check-config`.
    pub async fn fetch_for_check(&self) -> Result<(usize, String), JwksError> {
        let (set, _, uri) = self.fetch_key_set().await?;
        Ok((set.by_kid.len() + set.without_kid.len(), uri))
    }

    /// The key for a token's `kid` and `alg`: from the held set while it is fresh, else after
    /// fetching the set again; an unknown key refetches the set once (rate-limited).
    pub async fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let seen = self.generation.load(std::sync::atomic::Ordering::SeqCst);
        let held = self.current().find(kid, alg);
        let mut state = match held {
            Some(key) if !self.refresh_is_due() => return Some(key),
            // A refresh is due but someone is already fetching: answering from the held set
            // meanwhile delays a removal by at most one fetch's time-out, and no request waits.
            Some(key) => match self.fetch.try_lock() {
                Ok(state) => state,
                Err(_) => return Some(key),
            },
            None => self.fetch.lock().await,
        };
        // Someone else fetched while we waited: their result answers us too.
        if self.generation.load(std::sync::atomic::Ordering::SeqCst) != seen {
            return self.current().find(kid, alg);
        }
        if self.refresh_is_due() {
            self.reload("refresh due").await;
            drop(state);
            return self.current().find(kid, alg);
        }
        // A failed refresh just rescheduled itself; the held set still answers.
        if let Some(key) = self.current().find(kid, alg) {
            return Some(key);
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
        self.reload("unknown key id").await;
        drop(state);
        self.current().find(kid, alg)
    }

    /// The key set, how long its answer may be cached, and where it came from.
    async fn fetch_key_set(&self) -> Result<(KeySet, Option<Duration>, String), JwksError> {
        let uri = match &self.source {
            Source::Uri(uri) => uri.clone(),
            Source::Discovery { issuer } => self.discover(issuer).await?,
        };
        let fetched = self.fetch_json(&uri).await?;
        let set = self.parse_key_set(&uri, &fetched.document)?;
        Ok((set, fetched.max_age, uri))
    }

    async fn discover(&self, issuer: &str) -> Result<String, JwksError> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        let doc = self.fetch_json(&url).await?.document;
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
        let jwks_uri =
            doc.get("jwks_uri")
                .and_then(Value::as_str)
                .ok_or_else(|| JwksError::Document {
                    url: url.clone(),
                    reason: "no jwks_uri".to_owned(),
                })?;
        check_discovered_uri(jwks_uri).map_err(|reason| JwksError::DiscoveredUri {
            url,
            jwks_uri: jwks_uri.to_owned(),
            reason,
        })?;
        Ok(jwks_uri.to_owned())
    }

    async fn fetch_json(&self, url: &str) -> Result<Fetched, JwksError> {
        let fetch_error = |reason: String| JwksError::Fetch {
            url: url.to_owned(),
            reason,
        };
        let (bytes, max_age) = if let Some(path) = url.strip_prefix("file://") {
            let bytes = tokio::fs::read(path)
                .await
                .map_err(|e| fetch_error(e.to_string()))?;
            if bytes.len() > FETCH_LIMIT {
                return Err(fetch_error(format!("larger than {FETCH_LIMIT} bytes")));
            }
            (bytes, None)
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
            let max_age = response
                .headers()
                .get_all(reqwest::header::CACHE_CONTROL)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find_map(max_age);
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
            (body, max_age)
        };
        let document = serde_json::from_slice(&bytes).map_err(|e| JwksError::Document {
            url: url.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Fetched { document, max_age })
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

/// The `max-age` of one `Cache-Control` header value, if it has one.
fn max_age(header: &str) -> Option<Duration> {
    header.split(',').find_map(|directive| {
        let (name, value) = directive.trim().split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("max-age") {
            return None;
        }
        let seconds: u64 = value.trim().trim_matches('"').parse().ok()?;
        Some(Duration::from_secs(seconds))
    })
}

/// Refuses a key-set URL named by a discovery document that the daemon must not follow: a
/// `file://` URL would let whoever answers discovery make the daemon read local files, and
/// plain HTTP off loopback lets the network swap the keys.
fn check_discovered_uri(uri: &str) -> Result<(), &'static str> {
    let scheme = uri
        .split_once(':')
        .map(|(scheme, _)| scheme.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("https") => Ok(()),
        Some("http") if !crate::config::is_plain_http_off_loopback(uri) => Ok(()),
        Some("http") => Err("plain http:// is accepted only on loopback hosts"),
        Some("file") => Err("a discovered key set is never read from a file"),
        _ => Err("only https:// (or http:// on loopback) is accepted"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{check_discovered_uri, max_age};

    #[test]
    fn max_age_is_read_from_any_directive_position() {
        assert_eq!(max_age("max-age=60"), Some(Duration::from_secs(60)));
        assert_eq!(
            max_age("public, Max-Age=5, must-revalidate"),
            Some(Duration::from_secs(5))
        );
        assert_eq!(max_age("no-store"), None);
        assert_eq!(max_age("max-age=soon"), None);
    }

    #[test]
    fn a_discovered_jwks_uri_is_never_a_file() {
        assert!(check_discovered_uri("file:///etc/passwd").is_err());
        assert!(check_discovered_uri("FILE:///etc/passwd").is_err());
        assert!(check_discovered_uri("http://id.example.com/jwks").is_err());
        assert!(check_discovered_uri("ftp://id.example.com/jwks").is_err());
        assert!(check_discovered_uri("https://id.example.com/jwks").is_ok());
        assert!(check_discovered_uri("http://127.0.0.1:8080/jwks").is_ok());
    }
}
