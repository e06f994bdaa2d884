//! The double's REST API as the App meets it: the App itself, its installations and the
//! repositories they select, and installation tokens minted and revoked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::wire::{
    bearer, check_headers, github_error, random_token, repository_json, rfc3339, verify_app_jwt,
};
use super::{MintedToken, Shared};

/// How long GitHub's installation tokens live.
const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);

pub(super) async fn not_found() -> Response {
    github_error(StatusCode::NOT_FOUND, "Not Found")
}

/// `GET /app`: the App the JWT authenticates as.
pub(super) async fn authenticated_app(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Response {
    shared
        .api_requests
        .lock()
        .unwrap()
        .push("GET /app".to_owned());
    if let Err((status, message)) = verify_app_jwt(&shared, &headers) {
        return github_error(status, message);
    }
    Json(json!({
        "id": shared.app_id,
        "slug": "narya-test",
        "name": "Narya (test)",
    }))
    .into_response()
}

pub(super) async fn installation(
    State(shared): State<Arc<Shared>>,
    UrlPath(id): UrlPath<i64>,
    headers: HeaderMap,
) -> Response {
    shared
        .api_requests
        .lock()
        .unwrap()
        .push(format!("GET /app/installations/{id}"));
    if let Err((status, message)) = verify_app_jwt(&shared, &headers) {
        return github_error(status, message);
    }
    let installations = shared.installations.lock().unwrap();
    let Some(found) = installations.get(&id) else {
        return github_error(StatusCode::NOT_FOUND, "Not Found");
    };
    Json(json!({
        "id": id,
        "account": {"login": found.account, "id": 1, "type": "Organization"},
        "repository_selection": "selected",
        "access_tokens_url": format!("{}/app/installations/{id}/access_tokens", shared.url),
        "repositories_url": format!("{}/installation/repositories", shared.url),
        "html_url": format!("https://github.com/organizations/{}/settings/installations/{id}", found.account),
        "app_id": shared.app_id,
        "target_id": 1,
        "target_type": "Organization",
        "permissions": {"contents": "read", "metadata": "read"},
        "events": [],
        "created_at": "2024-01-01T00:00:00Z",
        "updated_at": "2024-01-01T00:00:00Z",
        "single_file_name": null,
        "suspended_at": null,
    }))
    .into_response()
}

/// `GET /repos/{owner}/{repo}/installation` (App JWT): the installation that reaches the
/// repository, or 404 when none of the App's installations selected it.
pub(super) async fn repository_installation(
    State(shared): State<Arc<Shared>>,
    UrlPath((owner, repo)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Response {
    shared
        .api_requests
        .lock()
        .unwrap()
        .push(format!("GET /repos/{owner}/{repo}/installation"));
    if let Some(seconds) = *shared.rate_limit.lock().unwrap() {
        let mut limited = github_error(
            StatusCode::FORBIDDEN,
            "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
        );
        limited
            .headers_mut()
            .insert("retry-after", seconds.to_string().parse().unwrap());
        return limited;
    }
    if let Err((status, message)) = verify_app_jwt(&shared, &headers) {
        return github_error(status, message);
    }
    let installations = shared.installations.lock().unwrap();
    let found = installations.iter().find(|(_, i)| {
        i.account.eq_ignore_ascii_case(&owner)
            && i.selected.iter().any(|n| n.eq_ignore_ascii_case(&repo))
    });
    let Some((id, found)) = found else {
        return github_error(StatusCode::NOT_FOUND, "Not Found");
    };
    Json(json!({
        "id": id,
        "account": {"login": found.account, "id": 1, "type": "Organization"},
        "repository_selection": "selected",
        "access_tokens_url": format!("{}/app/installations/{id}/access_tokens", shared.url),
        "repositories_url": format!("{}/installation/repositories", shared.url),
        "app_id": shared.app_id,
        "target_type": "Organization",
        "permissions": {"contents": "read", "metadata": "read"},
    }))
    .into_response()
}

/// Permissions the App was granted: what an installation token may ask for.
fn granted(permission: &str, level: &Value) -> bool {
    matches!(permission, "contents" | "metadata") && level == "read"
}

pub(super) async fn mint_token(
    State(shared): State<Arc<Shared>>,
    UrlPath(id): UrlPath<i64>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    shared
        .api_requests
        .lock()
        .unwrap()
        .push(format!("POST /app/installations/{id}/access_tokens"));
    if let Err((status, message)) = verify_app_jwt(&shared, &headers) {
        return github_error(status, message);
    }
    let request: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(_) => return github_error(StatusCode::BAD_REQUEST, "Problems parsing JSON"),
        }
    };
    let installations = shared.installations.lock().unwrap();
    let Some(found) = installations.get(&id) else {
        return github_error(StatusCode::NOT_FOUND, "Not Found");
    };
    let repositories: Option<Vec<String>> = match &request["repositories"] {
        Value::Null => None,
        Value::Array(names) => Some(
            names
                .iter()
                .map(|n| n.as_str().unwrap_or_default().to_owned())
                .collect(),
        ),
        _ => return github_error(StatusCode::UNPROCESSABLE_ENTITY, "Invalid request."),
    };
    if let Some(names) = &repositories {
        if names.iter().any(|n| !found.selected.contains(n)) {
            return github_error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "There is at least one repository that does not exist or is not accessible to the parent installation.",
            );
        }
    }
    let permissions = match &request["permissions"] {
        Value::Null => json!({"contents": "read", "metadata": "read"}),
        Value::Object(asked) => {
            if !asked.iter().all(|(p, level)| granted(p, level)) {
                return github_error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "The permissions requested are not granted to this installation.",
                );
            }
            Value::Object(asked.clone())
        }
        _ => return github_error(StatusCode::UNPROCESSABLE_ENTITY, "Invalid request."),
    };
    let listed: Vec<Value> = found
        .selected
        .iter()
        .filter(|n| repositories.as_ref().is_none_or(|r| r.contains(n)))
        .map(|n| repository_json(&shared, &found.account, n))
        .collect();
    let minted_at = SystemTime::now();
    let token = random_token();
    shared.tokens.lock().unwrap().push(MintedToken {
        token: token.clone(),
        installation: id,
        repositories: repositories.clone(),
        permissions: permissions.clone(),
        minted_at,
        revoked_at: None,
    });
    (
        StatusCode::CREATED,
        Json(json!({
            "token": token,
            "expires_at": rfc3339(minted_at + TOKEN_LIFETIME),
            "permissions": permissions,
            "repository_selection": "selected",
            "repositories": listed,
        })),
    )
        .into_response()
}

/// The live (unrevoked, unexpired) token `token`, if the double minted it.
pub(in super::super) fn live_token(shared: &Shared, token: &str) -> Option<MintedToken> {
    shared
        .tokens
        .lock()
        .unwrap()
        .iter()
        .find(|t| {
            t.token == token
                && t.revoked_at.is_none()
                && t.minted_at + TOKEN_LIFETIME > SystemTime::now()
        })
        .cloned()
}

pub(super) async fn list_repositories(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    shared
        .api_requests
        .lock()
        .unwrap()
        .push("GET /installation/repositories".to_owned());
    if let Err((status, message)) = check_headers(&headers) {
        return github_error(status, message);
    }
    let Some(token) = bearer(&headers).and_then(|t| live_token(&shared, t)) else {
        return github_error(StatusCode::UNAUTHORIZED, "Bad credentials");
    };
    let per_page: usize = query
        .get("per_page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(30)
        .clamp(1, 100);
    let page: usize = query
        .get("page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(1)
        .max(1);
    let installations = shared.installations.lock().unwrap();
    let Some(found) = installations.get(&token.installation) else {
        return github_error(StatusCode::UNAUTHORIZED, "Bad credentials");
    };
    let all: Vec<&String> = found
        .selected
        .iter()
        .filter(|n| token.repositories.as_ref().is_none_or(|r| r.contains(n)))
        .collect();
    let listed: Vec<Value> = all
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .map(|n| repository_json(&shared, &found.account, n))
        .collect();
    let last = all.len().div_ceil(per_page).max(1);
    let mut response = Json(json!({
        "total_count": all.len(),
        "repository_selection": "selected",
        "repositories": listed,
    }))
    .into_response();
    if page < last {
        let link = format!(
            "<{url}/installation/repositories?per_page={per_page}&page={next}>; rel=\"next\", <{url}/installation/repositories?per_page={per_page}&page={last}>; rel=\"last\"",
            url = shared.url,
            next = page + 1,
        );
        response
            .headers_mut()
            .insert(header::LINK, link.parse().unwrap());
    }
    response
}

pub(super) async fn revoke_token(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Response {
    shared
        .api_requests
        .lock()
        .unwrap()
        .push("DELETE /installation/token".to_owned());
    if let Err((status, message)) = check_headers(&headers) {
        return github_error(status, message);
    }
    let Some(token) = bearer(&headers).map(str::to_owned) else {
        return github_error(StatusCode::UNAUTHORIZED, "Bad credentials");
    };
    if live_token(&shared, &token).is_none() {
        return github_error(StatusCode::UNAUTHORIZED, "Bad credentials");
    }
    let mut tokens = shared.tokens.lock().unwrap();
    if let Some(t) = tokens.iter_mut().find(|t| t.token == token) {
        t.revoked_at = Some(SystemTime::now());
    }
    StatusCode::NO_CONTENT.into_response()
}
