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
