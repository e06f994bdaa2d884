//! The GitHub double's OAuth side, as a person connecting an installation meets it: the
//! one-time `code` GitHub hands them after installing the App, its exchange at
//! `{git_url}/login/oauth/access_token` for a `ghu_` user token (codes are single-use; a bad one
//! is answered 200 with an `error`, as GitHub does), `GET /user/installations` paginated by
//! `Link` header (accounts of organisations and of users, suspended installations), `GET /user`,
//! `GET /user/memberships/orgs/{org}` (owners, members, pending invitations; 404 for an outside
//! collaborator), and `DELETE /applications/{client_id}/token` with the client's Basic
//! credentials.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{json, Value};

use super::github::{bearer, check_headers, github_error, random_tail};

/// GitHub's page size when none is asked for.
const DEFAULT_PER_PAGE: usize = 30;

/// A user token the double issued, as it saw it.
#[derive(Clone, Debug)]
pub struct UserTokenSeen {
    pub token: String,
    pub login: String,
    pub revoked: bool,
}

pub(super) struct OAuthState {
    pub(super) client_id: String,
    pub(super) client_secret: String,
    api_url: String,
    /// Installation id → the account it belongs to.
    accounts: Mutex<HashMap<i64, String>>,
    /// Installations on a user's account (the rest are on organisations').
    on_users: Mutex<Vec<i64>>,
    /// Installations GitHub suspended.
    suspended: Mutex<Vec<i64>>,
    /// (person, organisation) → (role, state) of the person's membership.
    memberships: Mutex<HashMap<(String, String), (String, String)>>,
    /// Person → their GitHub id.
    ids: Mutex<HashMap<String, i64>>,
    /// Every `/user…` request a user token made, as `METHOD path`.
    pub(super) user_requests: Mutex<Vec<String>>,
    /// Person → the installations they can access.
    people: Mutex<HashMap<String, Vec<i64>>>,
    /// Unused code → its person.
    codes: Mutex<HashMap<String, String>>,
    user_tokens: Mutex<Vec<UserTokenSeen>>,
    max_per_page: AtomicUsize,
}

impl OAuthState {
    pub(super) fn new(api_url: &str) -> Arc<OAuthState> {
        Arc::new(OAuthState {
            client_id: "Iv1.d0ub1e0c11e47".to_owned(),
            client_secret: random_tail(),
            api_url: api_url.to_owned(),
            accounts: Mutex::new(HashMap::new()),
            on_users: Mutex::new(Vec::new()),
            suspended: Mutex::new(Vec::new()),
            memberships: Mutex::new(HashMap::new()),
            ids: Mutex::new(HashMap::new()),
            user_requests: Mutex::new(Vec::new()),
            people: Mutex::new(HashMap::new()),
            codes: Mutex::new(HashMap::new()),
            user_tokens: Mutex::new(Vec::new()),
            max_per_page: AtomicUsize::new(100),
        })
    }

    pub(super) fn note_installation(&self, id: i64, account: &str) {
        self.accounts.lock().unwrap().insert(id, account.to_owned());
    }

    /// Installation `id` is on user `login`'s own account.
    pub(super) fn note_user_installation(&self, id: i64, login: &str) {
        self.note_installation(id, login);
        self.on_users.lock().unwrap().push(id);
        self.grant_access(login, &[id]);
    }

    pub(super) fn suspend(&self, id: i64) {
        self.suspended.lock().unwrap().push(id);
    }

    /// `login`'s GitHub id: stable for the double's life.
    pub(super) fn user_id(&self, login: &str) -> i64 {
        let mut ids = self.ids.lock().unwrap();
        let next = 5000 + ids.len() as i64;
        *ids.entry(login.to_owned()).or_insert(next)
    }

    /// `login` sees `installations` listed (as anyone with access to one of their repositories
    /// does), and nothing more.
    pub(super) fn grant_access(&self, login: &str, installations: &[i64]) {
        let mut people = self.people.lock().unwrap();
        let seen = people.entry(login.to_owned()).or_default();
        seen.extend_from_slice(installations);
        seen.sort_unstable();
        seen.dedup();
    }

    /// `login` can access `installations` as an owner of each one's account: an active admin
    /// of the organisation (a user account's installation is its user's already).
    pub(super) fn grant(&self, login: &str, installations: &[i64]) {
        self.grant_access(login, installations);
        let accounts = self.accounts.lock().unwrap().clone();
        let on_users = self.on_users.lock().unwrap().clone();
        for id in installations {
            if let Some(account) = accounts.get(id).filter(|_| !on_users.contains(id)) {
                self.set_membership(login, account, "admin", "active");
            }
        }
    }

    /// `login`'s membership of organisation `org`: `role` `admin` or `member`, `state`
    /// `active` or `pending`.
    pub(super) fn set_membership(&self, login: &str, org: &str, role: &str, state: &str) {
        self.memberships.lock().unwrap().insert(
            (login.to_owned(), org.to_owned()),
            (role.to_owned(), state.to_owned()),
        );
    }

    /// A fresh one-time code of `login`'s, as GitHub hands it after an installation.
    pub(super) fn code_for(&self, login: &str) -> String {
        let code = random_tail()[..20].to_lowercase();
        self.codes
            .lock()
            .unwrap()
            .insert(code.clone(), login.to_owned());
        code
    }

    pub(super) fn user_tokens(&self) -> Vec<UserTokenSeen> {
        self.user_tokens.lock().unwrap().clone()
    }

    pub(super) fn set_max_per_page(&self, max: usize) {
        self.max_per_page.store(max, Ordering::SeqCst);
    }

    fn live_login(&self, token: &str) -> Option<String> {
        self.user_tokens
            .lock()
            .unwrap()
            .iter()
            .find(|t| t.token == token && !t.revoked)
            .map(|t| t.login.clone())
    }
}

/// The OAuth routes; `git_prefix` is the path `git_url` adds to the double's root.
pub(super) fn router(state: Arc<OAuthState>, git_prefix: &str) -> Router {
    Router::new()
        .route(
            &format!("{git_prefix}/login/oauth/access_token"),
            post(exchange),
        )
        .route("/user/installations", get(installations))
        .route("/user", get(user))
        .route("/user/memberships/orgs/{org}", get(membership))
        .route("/applications/{client_id}/token", delete(revoke))
        .with_state(state)
}

fn oauth_error(error: &str, description: &str) -> Response {
    Json(json!({
        "error": error,
        "error_description": description,
        "error_uri": "https://docs.github.com/apps/managing-oauth-apps/troubleshooting-oauth-app-access-token-request-errors",
    }))
    .into_response()
}

/// The exchange takes a form or JSON body, like GitHub.
fn fields(headers: &HeaderMap, body: &[u8]) -> HashMap<String, String> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if json {
        let value: Value = serde_json::from_slice(body).unwrap_or_default();
        value
            .as_object()
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    } else {
        let query = format!("http://form/?{}", String::from_utf8_lossy(body));
        reqwest::Url::parse(&query)
            .map(|u| u.query_pairs().into_owned().collect())
            .unwrap_or_default()
    }
}

async fn exchange(
    State(state): State<Arc<OAuthState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) != Some("application/json") {
        return (
            StatusCode::BAD_REQUEST,
            "double: ask for Accept: application/json",
        )
            .into_response();
    }
    let fields = fields(&headers, &body);
    let field = |name: &str| fields.get(name).map(String::as_str).unwrap_or_default();
    if field("client_id") != state.client_id || field("client_secret") != state.client_secret {
        return oauth_error(
            "incorrect_client_credentials",
            "The client_id and/or client_secret passed are incorrect.",
        );
    }
    // A code works once.
    let Some(login) = state.codes.lock().unwrap().remove(field("code")) else {
        return oauth_error(
            "bad_verification_code",
            "The code passed is incorrect or expired.",
        );
    };
    let token = format!("ghu_{}", random_tail());
    state.user_tokens.lock().unwrap().push(UserTokenSeen {
        token: token.clone(),
        login,
        revoked: false,
    });
    Json(json!({
        "access_token": token,
        "expires_in": 28800,
        "refresh_token": format!("ghr_{}", random_tail()),
        "refresh_token_expires_in": 15_811_200,
        "token_type": "bearer",
        "scope": "",
    }))
    .into_response()
}

async fn installations(
    State(state): State<Arc<OAuthState>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if let Err((status, message)) = check_headers(&headers) {
        return github_error(status, message);
    }
    let Some(login) = bearer(&headers).and_then(|t| state.live_login(t)) else {
        return github_error(StatusCode::UNAUTHORIZED, "Bad credentials");
    };
    let seen = state
        .people
        .lock()
        .unwrap()
        .get(&login)
        .cloned()
        .unwrap_or_default();
    let accounts = state.accounts.lock().unwrap().clone();
    let on_users = state.on_users.lock().unwrap().clone();
    let suspended = state.suspended.lock().unwrap().clone();
    let all: Vec<Value> = seen
        .iter()
        .filter_map(|id| {
            let account = accounts.get(id)?;
            let (kind, account_id) = match on_users.contains(id) {
                true => ("User", state.user_id(account)),
                false => ("Organization", 1000 + id),
            };
            let (suspended_at, suspended_by) = match suspended.contains(id) {
                true => (
                    json!("2026-11-30T12:00:00Z"),
                    json!({"login": "github-staff", "id": 1, "type": "User"}),
                ),
                false => (Value::Null, Value::Null),
            };
            Some(json!({
                "id": id,
                "account": {"login": account, "id": account_id, "type": kind},
                "repository_selection": "selected",
                "app_id": 4242,
                "target_type": kind,
                "permissions": {"contents": "read", "metadata": "read", "members": "read"},
                "suspended_at": suspended_at,
                "suspended_by": suspended_by,
            }))
        })
        .collect();
    let number = |name: &str, default: usize| {
        query
            .get(name)
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(default)
    };
    let per_page =
        number("per_page", DEFAULT_PER_PAGE).clamp(1, state.max_per_page.load(Ordering::SeqCst));
    let page = number("page", 1).max(1);
    let last = all.len().div_ceil(per_page).max(1);
    let items: Vec<Value> = all
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .cloned()
        .collect();
    let link = |n: usize, rel: &str| {
        format!(
            "<{}/user/installations?per_page={per_page}&page={n}>; rel=\"{rel}\"",
            state.api_url
        )
    };
    let mut links = Vec::new();
    if page > 1 {
        links.push(link(page - 1, "prev"));
    }
    if page < last {
        links.push(link(page + 1, "next"));
        links.push(link(last, "last"));
    }
    if page > 1 {
        links.push(link(1, "first"));
    }
    let mut response =
        Json(json!({"total_count": all.len(), "installations": items})).into_response();
    if !links.is_empty() {
        response
            .headers_mut()
            .insert(header::LINK, links.join(", ").parse().unwrap());
    }
    response
}

/// `GET /user`: the token's person.
async fn user(State(state): State<Arc<OAuthState>>, headers: HeaderMap) -> Response {
    state
        .user_requests
        .lock()
        .unwrap()
        .push("GET /user".to_owned());
    if let Err((status, message)) = check_headers(&headers) {
        return github_error(status, message);
    }
    let Some(login) = bearer(&headers).and_then(|t| state.live_login(t)) else {
        return github_error(StatusCode::UNAUTHORIZED, "Bad credentials");
    };
    let id = state.user_id(&login);
    Json(json!({
        "login": login,
        "id": id,
        "node_id": format!("U_{id}"),
        "type": "User",
        "site_admin": false,
        "url": format!("{}/users/{login}", state.api_url),
    }))
    .into_response()
}

/// `GET /user/memberships/orgs/{org}`: the token's person's membership, 404 when they have
/// none (an outside collaborator has none).
async fn membership(
    State(state): State<Arc<OAuthState>>,
    UrlPath(org): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    state
        .user_requests
        .lock()
        .unwrap()
        .push(format!("GET /user/memberships/orgs/{org}"));
    if let Err((status, message)) = check_headers(&headers) {
        return github_error(status, message);
    }
    let Some(login) = bearer(&headers).and_then(|t| state.live_login(t)) else {
        return github_error(StatusCode::UNAUTHORIZED, "Bad credentials");
    };
    let found = state
        .memberships
        .lock()
        .unwrap()
        .get(&(login.clone(), org.clone()))
        .cloned();
    let Some((role, membership_state)) = found else {
        return github_error(StatusCode::NOT_FOUND, "Not Found");
    };
    let id = state.user_id(&login);
    Json(json!({
        "url": format!("{}/orgs/{org}/memberships/{login}", state.api_url),
        "state": membership_state,
        "role": role,
        "organization_url": format!("{}/orgs/{org}", state.api_url),
        "organization": {"login": org, "type": "Organization"},
        "user": {"login": login, "id": id, "type": "User"},
    }))
    .into_response()
}

async fn revoke(
    State(state): State<Arc<OAuthState>>,
    UrlPath(client_id): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err((status, message)) = check_headers(&headers) {
        return github_error(status, message);
    }
    let expected = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", state.client_id, state.client_secret));
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "));
    if client_id != state.client_id || basic != Some(expected.as_str()) {
        return github_error(StatusCode::NOT_FOUND, "Not Found");
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or_default();
    let Some(token) = body["access_token"].as_str() else {
        return github_error(StatusCode::UNPROCESSABLE_ENTITY, "Invalid request.");
    };
    let mut tokens = state.user_tokens.lock().unwrap();
    match tokens.iter_mut().find(|t| t.token == token && !t.revoked) {
        Some(found) => {
            found.revoked = true;
            StatusCode::NO_CONTENT.into_response()
        }
        None => github_error(StatusCode::NOT_FOUND, "Not Found"),
    }
}
