//! A double of GitHub as Narya's GitHub App meets it, on loopback and speaking the real wire
//! formats: the REST API (the App's JWT verified against its public key, installations and their
//! selected repositories, installation tokens minted and revoked, 404/422 as GitHub answers them)
//! and git's smart HTTP for real bare repositories through `git http-backend` (`github_git.rs`),
//! which takes only a live installation token as `x-access-token` Basic credentials, for the
//! repositories it covers; the OAuth side a person connecting an installation meets is in
//! `github_oauth.rs`.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::{Json, Router};
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{json, Value};

use narya::client::{Answer, Client};

use super::github_git;
use super::github_oauth::{self, OAuthState, UserTokenSeen};
use super::make_key;

/// The media type and API version GitHub's REST API is spoken in.
const MEDIA_TYPE: &str = "application/vnd.github+json";
const API_VERSION: &str = "2022-11-28";
/// What GitHub lets an App's JWT live for.
const JWT_MAX_LIFETIME: u64 = 600;
/// How long GitHub's installation tokens live.
const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);

/// A token the double minted, as it saw it.
#[derive(Clone, Debug)]
pub struct MintedToken {
    pub token: String,
    pub installation: i64,
    /// The repository names the token was limited to; `None`: all the installation selected.
    pub repositories: Option<Vec<String>>,
    pub permissions: Value,
    pub minted_at: SystemTime,
    pub revoked_at: Option<SystemTime>,
}

/// One request to the git server.
#[derive(Clone, Debug)]
pub struct GitRequest {
    pub path: String,
    pub at: SystemTime,
    pub authorization: Option<String>,
    pub status: u16,
}

pub(super) struct InstallationState {
    pub(super) account: String,
    pub(super) selected: Vec<String>,
}

pub(super) struct Shared {
    pub(super) url: String,
    pub(super) app_id: u64,
    pub(super) public_key: DecodingKey,
    pub(super) repositories: PathBuf,
    pub(super) installations: Mutex<HashMap<i64, InstallationState>>,
    pub(super) tokens: Mutex<Vec<MintedToken>>,
    pub(super) git_requests: Mutex<Vec<GitRequest>>,
    pub(super) api_requests: Mutex<Vec<String>>,
    pub(super) refuse_git: AtomicBool,
    /// `Some(seconds)`: the REST API answers as GitHub's secondary rate limit does (403 with
    /// `retry-after`).
    pub(super) rate_limit: Mutex<Option<u64>>,
    pub(super) git_delay: Mutex<Duration>,
    pub(super) oauth: Arc<OAuthState>,
}

/// The double; it serves until dropped with the test's runtime.
pub struct GitHubDouble {
    /// `http://127.0.0.1:PORT`: the REST API's root.
    pub url: String,
    pub app_id: u64,
    /// The App's private key as GitHub hands it out (PKCS#1 PEM).
    pub key_path: PathBuf,
    shared: Arc<Shared>,
    _dir: tempfile::TempDir,
}

/// Writes `files` (path, content) under `dir`.
fn write_files(dir: &Path, files: &[(&str, &str)]) {
    for (path, content) in files {
        let file = dir.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, content).unwrap();
    }
}

/// Runs git in `dir` as the double's author; answers its standard output, which must succeed.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=Double",
            "-c",
            "user.email=double@example.com",
        ])
        .args(args)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

impl GitHubDouble {
    pub async fn start() -> GitHubDouble {
        let dir = tempfile::tempdir().unwrap();
        let key = make_key(dir.path(), "app", "RSA");
        let key_path = dir.path().join("app.private-key.pem");
        let converted = Command::new("openssl")
            .args(["rsa", "-traditional", "-in"])
            .arg(&key.private_path)
            .arg("-out")
            .arg(&key_path)
            .output()
            .expect("openssl runs");
        assert!(
            converted.status.success(),
            "openssl rsa -traditional failed"
        );
        let repositories = dir.path().join("repositories");
        std::fs::create_dir_all(&repositories).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app_id = 4242;
        let shared = Arc::new(Shared {
            url: url.clone(),
            app_id,
            public_key: DecodingKey::from_rsa_pem(&key.public_pem).unwrap(),
            repositories,
            installations: Mutex::new(HashMap::new()),
            tokens: Mutex::new(Vec::new()),
            git_requests: Mutex::new(Vec::new()),
            api_requests: Mutex::new(Vec::new()),
            refuse_git: AtomicBool::new(false),
            rate_limit: Mutex::new(None),
            git_delay: Mutex::new(Duration::ZERO),
            oauth: OAuthState::new(&url),
        });
        std::fs::write(
            dir.path().join("client-secret"),
            format!("{}\n", shared.oauth.client_secret),
        )
        .unwrap();
        let app = Router::new()
            .route("/app", get(authenticated_app))
            .route("/app/installations/{id}", get(installation))
            .route("/app/installations/{id}/access_tokens", post(mint_token))
            .route("/installation/repositories", get(list_repositories))
            .route(
                "/repos/{owner}/{repo}/installation",
                get(repository_installation),
            )
            .route("/installation/token", delete(revoke_token))
            .route("/git/{*path}", any(github_git::git))
            .fallback(not_found)
            .with_state(shared.clone())
            .merge(github_oauth::router(shared.oauth.clone(), "/git"));
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        GitHubDouble {
            url,
            app_id,
            key_path,
            shared,
            _dir: dir,
        }
    }

    /// Where clones come from: `{git_url}/{owner}/{name}.git`.
    pub fn git_url(&self) -> String {
        format!("{}/git", self.url)
    }

    pub fn connect_url(&self) -> &'static str {
        "https://github.com/apps/narya-test/installations/new"
    }

    /// The daemon's `[github]` section for this double.
    pub fn toml(&self) -> String {
        format!(
            "[github]\napp_id = {}\nprivate_key = {:?}\nclient_id = {:?}\nclient_secret_file = {:?}\n\
             api_url = {:?}\ngit_url = {:?}\nconnect_url = {:?}\n",
            self.app_id,
            self.key_path.display().to_string(),
            self.shared.oauth.client_id,
            self._dir.path().join("client-secret").display().to_string(),
            self.url,
            self.git_url(),
            self.connect_url(),
        )
    }

    /// Person `login` can access `installations` as an owner of their accounts (an active
    /// admin of each organisation).
    pub fn grant(&self, login: &str, installations: &[i64]) {
        self.shared.oauth.grant(login, installations);
    }

    /// Person `login` sees `installations` listed, as an outside collaborator on one of their
    /// repositories does, without any membership of their accounts.
    pub fn grant_access(&self, login: &str, installations: &[i64]) {
        self.shared.oauth.grant_access(login, installations);
    }

    /// Person `login`'s membership of organisation `org` (`role` `admin` or `member`, `state`
    /// `active` or `pending`).
    pub fn set_membership(&self, login: &str, org: &str, role: &str, state: &str) {
        self.shared.oauth.set_membership(login, org, role, state);
    }

    /// An installation of the App on user `login`'s own account, selecting `selected`.
    pub fn install_on_user(&self, id: i64, login: &str, selected: &[&str]) {
        self.install(id, login, selected);
        self.shared.oauth.note_user_installation(id, login);
    }

    /// GitHub suspends installation `id`.
    pub fn suspend(&self, id: i64) {
        self.shared.oauth.suspend(id);
    }

    /// A fresh one-time OAuth code of `login`'s, as GitHub hands it after an installation.
    pub fn code_for(&self, login: &str) -> String {
        self.shared.oauth.code_for(login)
    }

    /// Every user token issued so far.
    pub fn user_tokens(&self) -> Vec<UserTokenSeen> {
        self.shared.oauth.user_tokens()
    }

    /// Connects `client`'s organisation to `installation` as person `login`, who can access it,
    /// with a fresh code of theirs.
    pub async fn connect_as(&self, client: &Client, login: &str, installation: i64) -> Answer {
        self.grant(login, &[installation]);
        connect_with_code(client, installation, &self.code_for(login)).await
    }

    /// The most installations `GET /user/installations` answers per page.
    pub fn set_max_per_page(&self, max: usize) {
        self.shared.oauth.set_max_per_page(max);
    }

    /// An installation of the App on `account`, selecting the repositories `selected` (names).
    pub fn install(&self, id: i64, account: &str, selected: &[&str]) {
        self.shared.oauth.note_installation(id, account);
        self.shared.installations.lock().unwrap().insert(
            id,
            InstallationState {
                account: account.to_owned(),
                selected: selected.iter().map(|s| s.to_string()).collect(),
            },
        );
    }

    /// A bare repository `owner/name` on the git server with one commit of `files`; answers the
    /// commit's hash.
    pub fn create_repository(&self, full_name: &str, files: &[(&str, &str)]) -> String {
        let work = tempfile::tempdir().unwrap();
        git(work.path(), &["init", "-q", "-b", "main"]);
        write_files(work.path(), files);
        git(work.path(), &["add", "-A"]);
        git(
            work.path(),
            &["commit", "-q", "-m", "First commit of the double"],
        );
        let bare = self.shared.repositories.join(format!("{full_name}.git"));
        std::fs::create_dir_all(bare.parent().unwrap()).unwrap();
        git(
            work.path(),
            &["clone", "-q", "--bare", ".", bare.to_str().unwrap()],
        );
        git(work.path(), &["rev-parse", "HEAD"]).trim().to_owned()
    }

    /// A new commit of `files` on `full_name`'s default branch (made by `create_repository`);
    /// answers its hash.
    #[allow(dead_code)]
    pub fn push_commit(&self, full_name: &str, files: &[(&str, &str)]) -> String {
        let work = tempfile::tempdir().unwrap();
        let bare = self.shared.repositories.join(format!("{full_name}.git"));
        git(work.path(), &["clone", "-q", bare.to_str().unwrap(), "."]);
        write_files(work.path(), files);
        git(work.path(), &["add", "-A"]);
        git(
            work.path(),
            &["commit", "-q", "-m", "Another commit of the double"],
        );
        git(work.path(), &["push", "-q", "origin", "HEAD"]);
        git(work.path(), &["rev-parse", "HEAD"]).trim().to_owned()
    }

    /// Every token minted so far.
    pub fn tokens(&self) -> Vec<MintedToken> {
        self.shared.tokens.lock().unwrap().clone()
    }

    /// Every form a clone could be given a token in: each token, and its Basic credentials.
    pub fn token_forms(&self) -> Vec<String> {
        self.tokens()
            .iter()
            .flat_map(|t| {
                [
                    t.token.clone(),
                    base64::engine::general_purpose::STANDARD
                        .encode(format!("x-access-token:{}", t.token)),
                ]
            })
            .collect()
    }

    /// Every request to the git server so far.
    pub fn git_requests(&self) -> Vec<GitRequest> {
        self.shared.git_requests.lock().unwrap().clone()
    }

    /// Every REST request so far, as `METHOD path`.
    pub fn api_requests(&self) -> Vec<String> {
        self.shared.api_requests.lock().unwrap().clone()
    }

    /// Every `/user…` request (who the person is, their memberships), as `METHOD path`.
    pub fn user_requests(&self) -> Vec<String> {
        self.shared.oauth.user_requests.lock().unwrap().clone()
    }

    /// Makes the REST API answer as GitHub's secondary rate limit does, asking for `seconds`
    /// of rest (`None`: answers again).
    pub fn rate_limit(&self, seconds: Option<u64>) {
        *self.shared.rate_limit.lock().unwrap() = seconds;
    }

    /// Makes the git server refuse every token, as it would a forged or expired one.
    pub fn refuse_git_tokens(&self, refuse: bool) {
        self.shared.refuse_git.store(refuse, Ordering::SeqCst);
    }

    /// Makes the git server wait this long before answering.
    pub fn delay_git(&self, delay: Duration) {
        *self.shared.git_delay.lock().unwrap() = delay;
    }
}

/// Fails naming `what` when `bytes` hold any of `forms`.
pub fn assert_holds_no_token(what: &str, bytes: &[u8], forms: &[String]) {
    for form in forms {
        assert!(
            !bytes.windows(form.len()).any(|w| w == form.as_bytes()),
            "{what} holds an installation token"
        );
    }
}

/// `PUT /v1/organisation/github` with `installation` and `code`.
pub async fn connect_with_code(client: &Client, installation: i64, code: &str) -> Answer {
    client
        .send_json(
            axum::http::Method::PUT,
            "/v1/organisation/github",
            &json!({ "installation_id": installation, "code": code }),
        )
        .await
        .unwrap()
}

pub(super) fn github_error(status: StatusCode, message: &str) -> Response {
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

async fn not_found() -> Response {
    github_error(StatusCode::NOT_FOUND, "Not Found")
}

/// What GitHub requires of every REST request; the double also insists on the API version
/// Narya asks for, so a client that forgets it is caught.
/// A refusal as GitHub words it: status and message.
pub(super) type Refusal = (StatusCode, &'static str);

pub(super) fn check_headers(headers: &HeaderMap) -> Result<(), Refusal> {
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

pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
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
fn verify_app_jwt(shared: &Shared, headers: &HeaderMap) -> Result<(), Refusal> {
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

fn repository_json(shared: &Shared, account: &str, name: &str) -> Value {
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

/// `GET /app`: the App the JWT authenticates as.
async fn authenticated_app(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
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

async fn installation(
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
async fn repository_installation(
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

fn random_token() -> String {
    format!("ghs_{}", random_tail())
}

/// 36 random letters and digits, as GitHub's tokens end.
pub(super) fn random_tail() -> String {
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

fn rfc3339(at: SystemTime) -> String {
    time::OffsetDateTime::from(at)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

async fn mint_token(
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
pub(super) fn live_token(shared: &Shared, token: &str) -> Option<MintedToken> {
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

async fn list_repositories(
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

async fn revoke_token(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
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

/// `GET /v1/organisation/github` as `client`'s organisation.
pub async fn show(client: &Client) -> Answer {
    client
        .send(hyper::Method::GET, "/v1/organisation/github", None)
        .await
        .unwrap()
}

/// Asserts that `answer` is the refusal `status` with NRY code `code`; answers its message.
pub fn assert_refused(answer: &Answer, status: hyper::StatusCode, code: &str) -> String {
    assert_eq!(
        answer.status,
        status,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let error = answer.error().unwrap();
    assert_eq!(error.code, code, "{}", error.message);
    error.message
}
