//! Authentication: every request's bearer JWT verified against the identity provider's key set.

mod jwks;

use std::collections::HashSet;
use std::time::Duration;

use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};

use crate::config::{self, Identity};
pub use jwks::{JwksError, KeyCache};

/// Who is asking: the person and the organisation their verified token names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub person: String,
    pub organisation: String,
}

/// Why a token was refused. Every kind answers the same `401 NRY-0011`; the kind is for logs.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("no bearer token in the Authorization header")]
    Missing,
    #[error("the token is not a well-formed JWT: {0}")]
    Malformed(String),
    #[error("the token's algorithm {0} is not allowed")]
    Algorithm(String),
    #[error("no key of the identity provider matches the token's key id")]
    UnknownKey,
    #[error("the token was refused: {0}")]
    Invalid(String),
    #[error("the token lacks a non-empty string claim {0:?}")]
    MissingClaim(String),
}

/// Verifies tokens for one configured issuer and audience.
pub struct Verifier {
    issuer: String,
    audience: String,
    person_claim: String,
    organisation_claim: String,
    algorithms: HashSet<Algorithm>,
    leeway: Duration,
    keys: KeyCache,
}

pub(crate) fn to_jwt_algorithm(a: config::Algorithm) -> Algorithm {
    match a {
        config::Algorithm::RS256 => Algorithm::RS256,
        config::Algorithm::RS384 => Algorithm::RS384,
        config::Algorithm::RS512 => Algorithm::RS512,
        config::Algorithm::PS256 => Algorithm::PS256,
        config::Algorithm::PS384 => Algorithm::PS384,
        config::Algorithm::PS512 => Algorithm::PS512,
        config::Algorithm::ES256 => Algorithm::ES256,
        config::Algorithm::ES384 => Algorithm::ES384,
        config::Algorithm::EdDSA => Algorithm::EdDSA,
    }
}

impl Verifier {
    pub fn new(identity: &Identity) -> Result<Verifier, JwksError> {
        let algorithms: HashSet<Algorithm> = identity
            .algorithms
            .iter()
            .copied()
            .map(to_jwt_algorithm)
            .collect();
        Ok(Verifier {
            issuer: identity.issuer.clone(),
            audience: identity.audience.clone(),
            person_claim: identity.person_claim.clone(),
            organisation_claim: identity.organisation_claim.clone(),
            leeway: identity.leeway.0,
            keys: KeyCache::new(identity, algorithms.clone())?,
            algorithms,
        })
    }

    /// Loads the key set once at start-up; a failure is logged and retried on first use.
    pub async fn preload(&self) {
        self.keys.preload().await;
    }

    /// Fetches the identity provider's key set once, for `naryad check-config`: the number of
    /// usable keys and the key set's URL.
    pub async fn check_key_set(&self) -> Result<(usize, String), JwksError> {
        self.keys.fetch_for_check().await
    }

    /// Verifies `token` and names who it speaks for.
    pub async fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| AuthError::Malformed(e.to_string()))?;
        if !self.algorithms.contains(&header.alg) {
            return Err(AuthError::Algorithm(format!("{:?}", header.alg)));
        }
        let key = self
            .keys
            .key_for(header.kid.as_deref(), header.alg)
            .await
            .ok_or(AuthError::UnknownKey)?;

        let mut validation = Validation::new(header.alg);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.validate_aud = true;
        validation.leeway = self.leeway.as_secs();

        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation)
            .map_err(|e| AuthError::Invalid(e.to_string()))?;
        let claims = data.claims;
        // jsonwebtoken also accepts an array of issuers that merely contains ours; a token has
        // one issuer, so anything but that exact string is refused.
        if claims.get("iss") != Some(&Value::String(self.issuer.clone())) {
            return Err(AuthError::Invalid(
                "the iss claim is not the configured issuer as a string".to_owned(),
            ));
        }
        let claim = |name: &str| match claims.get(name) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            _ => Err(AuthError::MissingClaim(name.to_owned())),
        };
        Ok(Principal {
            person: claim(&self.person_claim)?,
            organisation: claim(&self.organisation_claim)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use serde_json::json;

    use super::{AuthError, Verifier};
    use crate::config::Config;
    use crate::devkeys::DevKey;

    const ISSUER: &str = "https://id.example.com";

    /// A fresh P-256 key and a verifier trusting it through a `file://` key set.
    async fn verifier(dir: &std::path::Path) -> (DevKey, Verifier) {
        let pem = dir.join("key.pem");
        let status = Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .arg("-out")
            .arg(&pem)
            .status()
            .unwrap();
        assert!(status.success());
        let key = DevKey::from_pem(&std::fs::read(&pem).unwrap()).unwrap();
        let jwks = dir.join("jwks.json");
        std::fs::write(&jwks, key.jwks().to_string()).unwrap();
        let config = Config::parse(&format!(
            "[identity]\nissuer = {ISSUER:?}\naudience = \"narya\"\njwks_uri = \"file://{}\"\n",
            jwks.display()
        ))
        .unwrap();
        let verifier = Verifier::new(&config.identity).unwrap();
        verifier.preload().await;
        (key, verifier)
    }

    fn claims(iss: serde_json::Value) -> serde_json::Value {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        json!({"iss": iss, "aud": "narya", "sub": "alice", "org": "acme", "exp": now + 600})
    }

    #[tokio::test]
    async fn iss_must_be_the_issuer_as_a_string_not_an_array_holding_it() {
        let dir = tempfile::tempdir().unwrap();
        let (key, verifier) = verifier(dir.path()).await;
        let good = key.sign(&claims(json!(ISSUER))).unwrap();
        assert!(verifier.verify(&good).await.is_ok());
        for iss in [
            json!([ISSUER]),
            json!([ISSUER, "https://other.example.com"]),
        ] {
            let token = key.sign(&claims(iss.clone())).unwrap();
            assert!(
                matches!(verifier.verify(&token).await, Err(AuthError::Invalid(_))),
                "iss {iss} was accepted"
            );
        }
    }

    #[tokio::test]
    async fn rfc_9068_access_tokens_are_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let (key, verifier) = verifier(dir.path()).await;
        let mut header = jsonwebtoken::Header::new(key.algorithm);
        header.typ = Some("at+jwt".to_owned());
        header.kid = Some(key.kid.clone());
        let token = jsonwebtoken::encode(&header, &claims(json!(ISSUER)), &key.key).unwrap();
        assert!(verifier.verify(&token).await.is_ok());
    }
}
