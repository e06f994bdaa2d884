//! A double of GitHub as Narya's GitHub App meets it, on loopback and speaking the real wire
//! formats: the REST API (the App's JWT verified against its public key, installations and their
//! selected repositories, installation tokens minted and revoked, 404/422 as GitHub answers them)
//! and git's smart HTTP for real bare repositories through `git http-backend`, which takes only a
//! live installation token as `x-access-token` Basic credentials, for the repositories it covers.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::{Json, Router};
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

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

struct InstallationState {
    account: String,
    selected: Vec<String>,
}

struct Shared {
    url: String,
    app_id: u64,
    public_key: DecodingKey,
    repositories: PathBuf,
    installations: Mutex<HashMap<i64, InstallationState>>,
    tokens: Mutex<Vec<MintedToken>>,
    git_requests: Mutex<Vec<GitRequest>>,
    api_requests: Mutex<Vec<String>>,
    refuse_git: AtomicBool,
    git_delay: Mutex<Duration>,
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
            git_delay: Mutex::new(Duration::ZERO),
        });
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
            .route("/git/{*path}", any(git))
            .fallback(not_found)
            .with_state(shared.clone());
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
            "[github]\napp_id = {}\nprivate_key = {:?}\napi_url = {:?}\ngit_url = {:?}\nconnect_url = {:?}\n",
            self.app_id,
            self.key_path.display().to_string(),
            self.url,
            self.git_url(),
            self.connect_url(),
        )
    }

    /// An installation of the App on `account`, selecting the repositories `selected` (names).
    pub fn install(&self, id: i64, account: &str, selected: &[&str]) {
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
        let git = |dir: &Path, args: &[&str]| {
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
        };
        git(work.path(), &["init", "-q", "-b", "main"]);
        for (path, content) in files {
            let file = work.path().join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, content).unwrap();
        }
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

    /// Every token minted so far.
    pub fn tokens(&self) -> Vec<MintedToken> {
        self.shared.tokens.lock().unwrap().clone()
    }

    /// Every request to the git server so far.
    pub fn git_requests(&self) -> Vec<GitRequest> {
        self.shared.git_requests.lock().unwrap().clone()
    }

    /// Every REST request so far, as `METHOD path`.
    pub fn api_requests(&self) -> Vec<String> {
        self.shared.api_requests.lock().unwrap().clone()
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

fn github_error(status: StatusCode, message: &str) -> Response {
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
type Refusal = (StatusCode, &'static str);

fn check_headers(headers: &HeaderMap) -> Result<(), Refusal> {
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

fn bearer(headers: &HeaderMap) -> Option<&str> {
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
    format!("ghs_{tail}")
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
fn live_token(shared: &Shared, token: &str) -> Option<MintedToken> {
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

/// Whether `authorization` is `Basic x-access-token:TOKEN` for a live token that may read
/// `owner/name`.
fn git_authorised(shared: &Shared, authorization: Option<&str>, owner: &str, name: &str) -> bool {
    if shared.refuse_git.load(Ordering::SeqCst) {
        return false;
    }
    let Some(encoded) = authorization.and_then(|a| a.strip_prefix("Basic ")) else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    let Ok(decoded) = String::from_utf8(decoded) else {
        return false;
    };
    let Some(token) = decoded
        .strip_prefix("x-access-token:")
        .and_then(|t| live_token(shared, t))
    else {
        return false;
    };
    if token.permissions["contents"] != "read" {
        return false;
    }
    let installations = shared.installations.lock().unwrap();
    let Some(found) = installations.get(&token.installation) else {
        return false;
    };
    found.account == owner
        && found.selected.iter().any(|n| n == name)
        && token
            .repositories
            .as_ref()
            .is_none_or(|r| r.iter().any(|n| n == name))
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain")], text).into_response()
}

/// git's smart HTTP, served by `git http-backend` as CGI.
async fn git(
    State(shared): State<Arc<Shared>>,
    UrlPath(path): UrlPath<String>,
    method: Method,
    headers: HeaderMap,
    query: axum::extract::RawQuery,
    body: Bytes,
) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let delay = *shared.git_delay.lock().unwrap();
    let answer = async {
        tokio::time::sleep(delay).await;
        let mut segments = path.splitn(3, '/');
        let (Some(owner), Some(repository)) = (segments.next(), segments.next()) else {
            return plain(StatusCode::NOT_FOUND, "Not Found");
        };
        let name = repository.trim_end_matches(".git");
        if !git_authorised(&shared, authorization.as_deref(), owner, name) {
            let mut refused = plain(StatusCode::UNAUTHORIZED, "");
            refused.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                "Basic realm=\"GitHub\"".parse().unwrap(),
            );
            return refused;
        }
        if !shared
            .repositories
            .join(owner)
            .join(format!("{name}.git"))
            .is_dir()
        {
            return plain(StatusCode::NOT_FOUND, "Repository not found.");
        }
        http_backend(&shared, &path, &method, &headers, query.0.as_deref(), body).await
    }
    .await;
    shared.git_requests.lock().unwrap().push(GitRequest {
        path: path.clone(),
        at: SystemTime::now(),
        authorization,
        status: answer.status().as_u16(),
    });
    answer
}

async fn http_backend(
    shared: &Shared,
    path: &str,
    method: &Method,
    headers: &HeaderMap,
    query: Option<&str>,
    body: Bytes,
) -> Response {
    let header_value = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let mut command = tokio::process::Command::new("git");
    command
        .arg("http-backend")
        .env("GIT_PROJECT_ROOT", &shared.repositories)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", format!("/{path}"))
        .env("QUERY_STRING", query.unwrap_or_default())
        .env("REQUEST_METHOD", method.as_str())
        .env("CONTENT_TYPE", header_value(header::CONTENT_TYPE))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("REMOTE_USER", "x-access-token")
        .env("REMOTE_ADDR", "127.0.0.1")
        .env(
            "HTTP_CONTENT_ENCODING",
            header_value(header::CONTENT_ENCODING),
        )
        .env(
            "GIT_PROTOCOL",
            headers
                .get("git-protocol")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default(),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("git http-backend starts");
    let mut stdin = child.stdin.take().unwrap();
    let feed = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let output = child
        .wait_with_output()
        .await
        .expect("git http-backend ran");
    let _ = feed.await;
    cgi_response(&output.stdout)
}

/// A CGI answer: header lines (`Status:` among them), a blank line, the body.
fn cgi_response(stdout: &[u8]) -> Response {
    let (head, body) = match find(stdout, b"\r\n\r\n") {
        Some(at) => (&stdout[..at], &stdout[at + 4..]),
        None => match find(stdout, b"\n\n") {
            Some(at) => (&stdout[..at], &stdout[at + 2..]),
            None => (&stdout[..0], stdout),
        },
    };
    let mut response = Response::builder().status(StatusCode::OK);
    for line in String::from_utf8_lossy(head).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().unwrap_or("500");
            response = response.status(code.parse::<u16>().unwrap_or(500));
        } else {
            response = response.header(name.trim(), value);
        }
    }
    response.body(Body::from(body.to_vec())).unwrap()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
