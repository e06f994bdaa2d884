//! Development tokens and key sets from a local PEM key (`narya dev token`, `narya dev jwks`).
//! Never used by the daemon itself.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, PublicKeyUse, ThumbprintHash};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum DevKeyError {
    #[error("the key is not an RSA, P-256, P-384 or Ed25519 private key in PEM form")]
    UnsupportedKey,
    #[error("cannot sign or describe the key: {0}")]
    Crypto(#[from] jsonwebtoken::errors::Error),
}

/// One of jsonwebtoken's PEM readers.
type ParsePem = fn(&[u8]) -> jsonwebtoken::errors::Result<EncodingKey>;

/// A private key with the algorithm it signs with and its key id (the JWK thumbprint).
pub struct DevKey {
    pub algorithm: Algorithm,
    pub key: EncodingKey,
    pub kid: String,
    public: Jwk,
}

impl DevKey {
    /// Reads a PEM private key: EC (ES256 or ES384 by curve), RSA (RS256) or Ed25519 (EdDSA).
    pub fn from_pem(pem: &[u8]) -> Result<DevKey, DevKeyError> {
        let candidates: [(Algorithm, ParsePem); 4] = [
            (Algorithm::ES256, EncodingKey::from_ec_pem),
            (Algorithm::ES384, EncodingKey::from_ec_pem),
            (Algorithm::RS256, EncodingKey::from_rsa_pem),
            (Algorithm::EdDSA, EncodingKey::from_ed_pem),
        ];
        for (algorithm, parse) in candidates {
            let Ok(key) = parse(pem) else { continue };
            // The curve decides between ES256 and ES384: describing the key fails on the wrong one.
            let Ok(mut public) = Jwk::from_encoding_key(&key, algorithm) else {
                continue;
            };
            if jsonwebtoken::encode(&Header::new(algorithm), &json!({}), &key).is_err() {
                continue;
            }
            let kid = public.thumbprint(ThumbprintHash::SHA256)?;
            public.common.key_id = Some(kid.clone());
            public.common.public_key_use = Some(PublicKeyUse::Signature);
            return Ok(DevKey {
                algorithm,
                key,
                kid,
                public,
            });
        }
        Err(DevKeyError::UnsupportedKey)
    }

    /// The public key set an identity provider would publish for this key.
    pub fn jwks(&self) -> serde_json::Value {
        json!({ "keys": [self.public] })
    }

    /// Signs `claims` with this key, naming it by `kid`.
    pub fn sign(&self, claims: &serde_json::Value) -> Result<String, DevKeyError> {
        let mut header = Header::new(self.algorithm);
        header.kid = Some(self.kid.clone());
        Ok(jsonwebtoken::encode(&header, claims, &self.key)?)
    }
}

/// What a development token says.
pub struct TokenRequest<'a> {
    pub issuer: &'a str,
    pub audience: &'a str,
    pub person: &'a str,
    pub organisation: &'a str,
    pub person_claim: &'a str,
    pub organisation_claim: &'a str,
    pub ttl: Duration,
}

/// Mints a development token valid from now for `ttl`.
pub fn mint(key: &DevKey, request: &TokenRequest<'_>) -> Result<String, DevKeyError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut claims = serde_json::Map::new();
    claims.insert("iss".into(), json!(request.issuer));
    claims.insert("aud".into(), json!(request.audience));
    claims.insert("iat".into(), json!(now));
    claims.insert("nbf".into(), json!(now));
    claims.insert("exp".into(), json!(now + request.ttl.as_secs()));
    claims.insert(request.person_claim.into(), json!(request.person));
    claims.insert(
        request.organisation_claim.into(),
        json!(request.organisation),
    );
    key.sign(&serde_json::Value::Object(claims))
}
