//! GitHub's REST wire format as the double holds clients to it: the headers every request must
//! carry, the App's JWT, bearer tokens, the error body GitHub refuses with, and the form of the
//! tokens, timestamps and repositories it answers with.

use std::io::Read;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{json, Value};

use super::Shared;

/// The media type and API version GitHub's REST API is spoken in.
const MEDIA_TYPE: &str = "application/vnd.github+json";
const API_VERSION: &str = "2022-11-28";
/// What GitHub lets an App's JWT live for.
const JWT_MAX_LIFETIME: u64 = 600;

pub(in super::super) fn github_error(status: StatusCode, message: &str) -> Response {
    (
        status,
        Json(json!({
            "message": message,
            "documentation_url": "https://docs.github.com/rest",
            "status": status.as_u16().to_string(),
        })),
    )
        .into_response()
}

/// A refusal as GitHub words it: status and message.
pub(in super::super) type Refusal = (StatusCode, &'static str);

/// What GitHub requires of every REST request; the double also insists on the API version
/// Narya asks for, so a client that forgets it is caught.
pub(in super::super) fn check_headers(headers: &HeaderMap) -> Result<(), Refusal> {
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if value("user-agent").is_none_or(str::is_empty) {
        return Err((
            StatusCode::FORBIDDEN,
            "Request forbidden by administrative rules. Please make sure your request has a User-Agent header",
        ));
    }
    if value("x-github-api-version") != Some(API_VERSION) {
        return Err((
            StatusCode::BAD_REQUEST,
            "double: X-GitHub-Api-Version must be 2022-11-28",
        ));
    }
    if value("accept") != Some(MEDIA_TYPE) {
        return Err((
            StatusCode::BAD_REQUEST,
            "double: Accept must be application/vnd.github+json",
        ));
    }
    Ok(())
}

pub(in super::super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("token "))
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The App's JWT: RS256 over the App's key, `iss` the App id, `iat` not in the future, `exp` not
/// passed and at most ten minutes ahead.
pub(super) fn verify_app_jwt(shared: &Shared, headers: &HeaderMap) -> Result<(), Refusal> {
    check_headers(headers)?;
    let refused = || {
        (
            StatusCode::UNAUTHORIZED,
            "A JSON web token could not be decoded",
        )
    };
    let token = bearer(headers).ok_or_else(refused)?;
    let mut validation = Validation::new(Algorithm::RS256);
    // `iss` is checked below: GitHub takes the App id as an integer, which jsonwebtoken's own
    // issuer check (strings only) would call missing.
    validation.set_required_spec_claims(&["exp"]);
    validation.leeway = 0;
    let claims = jsonwebtoken::decode::<Value>(token, &shared.public_key, &validation)
        .map_err(|_| refused())?
        .claims;
    let iss_ok = match &claims["iss"] {
        Value::Number(n) => n.as_u64() == Some(shared.app_id),
        Value::String(s) => s == &shared.app_id.to_string(),
        _ => false,
    };
    let now = now_secs();
    let iat = claims["iat"].as_u64().unwrap_or(u64::MAX);
    let exp = claims["exp"].as_u64().unwrap_or(0);
    if !iss_ok {
        return Err((
            StatusCode::UNAUTHORIZED,
            "'Issuer' claim ('iss') must be an Integer",
        ));
    }
    if iat > now || exp > now + JWT_MAX_LIFETIME {
        return Err((
            StatusCode::UNAUTHORIZED,
            "'Expiration time' claim ('exp') is too far in the future",
        ));
    }
    Ok(())
}

pub(super) fn repository_json(shared: &Shared, account: &str, name: &str) -> Value {
    json!({
        "id": name.len(),
        "name": name,
        "full_name": format!("{account}/{name}"),
        "private": true,
        "owner": {"login": account, "type": "Organization"},
        "html_url": format!("https://github.com/{account}/{name}"),
        "clone_url": format!("{}/git/{account}/{name}.git", shared.url),
    })
}

pub(super) fn random_token() -> String {
    format!("ghs_{}", random_tail())
}

/// 36 random letters and digits, as GitHub's tokens end.
pub(in super::super) fn random_tail() -> String {
    let mut bytes = [0u8; 36];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let tail: String = bytes
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    tail
}

pub(super) fn rfc3339(at: SystemTime) -> String {
    time::OffsetDateTime::from(at)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}
