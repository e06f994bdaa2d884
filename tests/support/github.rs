//! A double of GitHub as Narya's GitHub App meets it, on loopback and speaking the real wire
//! formats: the REST API (the App's JWT verified against its public key, installations and their
//! selected repositories, installation tokens minted and revoked, 404/422 as GitHub answers them)
//! and git's smart HTTP for real bare repositories through `git http-backend` (`github_git.rs`),
//! which takes only a live installation token as `x-access-token` Basic credentials, for the
//! repositories it covers; the OAuth side a person connecting an installation meets is in
//! `github_oauth.rs`. This file holds the double's state and what tests drive it with; the REST
//! API's routes are in `github/rest.rs`, what GitHub demands of requests and how it words its
//! answers in `github/wire.rs`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::routing::{any, delete, get, post};
use axum::Router;
use base64::Engine as _;
use jsonwebtoken::DecodingKey;
use serde_json::{json, Value};

use narya::client::{Answer, Client};

use super::github_git;
use super::github_oauth::{self, OAuthState, UserTokenSeen};
use super::make_key;

// `contrib/bench` includes this file by `#[path]`, which makes its own `mod`s resolve beside it
// rather than in `github/`: these paths name the same files either way.
#[path = "github/rest.rs"]
mod rest;
#[path = "github/wire.rs"]
mod wire;

pub(super) use rest::live_token;
pub(super) use wire::{bearer, check_headers, github_error, random_tail};

use rest::{
    authenticated_app, installation, list_repositories, mint_token, not_found,
    repository_installation, revoke_token,
};

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
