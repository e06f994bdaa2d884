//! The GitHub App's REST client: GitHub's documented endpoints, shapes and headers, spoken to
//! `github.api_url` with the App's JWT or an installation token.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{GitHubError, Secret};
use crate::config;
use crate::model::Repository;

/// The REST API version every request asks for.
pub(super) const API_VERSION: &str = "2022-11-28";
pub(super) const MEDIA_TYPE: &str = "application/vnd.github+json";
/// GitHub refuses requests without a User-Agent.
const USER_AGENT: &str = concat!("narya-host/", env!("CARGO_PKG_VERSION"));
/// The App's JWT is dated a minute back against clock drift, and lives well inside the ten
/// minutes GitHub allows.
const JWT_BACKDATE: u64 = 60;
const JWT_LIFETIME: u64 = 8 * 60;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Narya's GitHub App as this host is configured with it.
pub struct GitHubApp {
    app_id: u64,
    key: EncodingKey,
    /// The App's OAuth client, which exchanges the code of a person connecting an installation.
    pub(super) client_id: String,
    pub(super) client_secret: Secret,
    pub(super) api_url: String,
    git_url: String,
    connect_url: String,
    pub(super) http: reqwest::Client,
}

impl std::fmt::Debug for GitHubApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitHubApp")
            .field("app_id", &self.app_id)
            .field("key", &"[redacted]")
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret)
            .field("api_url", &self.api_url)
            .field("git_url", &self.git_url)
            .finish()
    }
}

/// An installation of the App, as GitHub describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installation {
    pub id: i64,
    /// The account (organisation or user) that installed the App.
    pub account: Option<String>,
    /// `all` or `selected`.
    pub repository_selection: Option<String>,
    /// GitHub's id of that account.
    pub account_id: Option<i64>,
    /// Whether that account is a user (not an organisation).
    pub on_user: bool,
    /// GitHub suspended the installation: it reaches nothing until it is unsuspended.
    pub suspended: bool,
}

/// An installation access token; it prints as `[redacted]`.
#[derive(Debug)]
pub struct InstallationToken {
    pub token: Secret,
    pub expires_at: Option<String>,
}

/// What `GET /repos/{owner}/{name}/installation` says: which installation reaches it.
#[derive(Deserialize)]
struct InstallationBody {
    id: i64,
}

/// Deliberately without `Debug`: it holds the token.
#[derive(Deserialize)]
struct TokenBody {
    token: String,
    expires_at: Option<String>,
}

/// How to authenticate one request.
pub(super) enum Credential<'a> {
    /// The App's own JWT.
    App,
    /// An installation token, or a person's user token.
    Token(&'a Secret),
}

impl GitHubApp {
    /// Reads the App's private key and prepares the client. Errors: `Key` when the key cannot
    /// be read or is not an RSA private key in PEM form (GitHub's download is one).
    pub fn new(config: &config::GitHub) -> Result<GitHubApp, GitHubError> {
        let key_error = |reason: String| GitHubError::Key {
            path: config.private_key.display().to_string(),
            reason,
        };
        let pem = std::fs::read(&config.private_key).map_err(|e| key_error(e.to_string()))?;
        let client_secret = read_client_secret(&config.client_secret_file)?;
        let key = EncodingKey::from_rsa_pem(&pem).map_err(|_| {
            key_error("it is not an RSA private key in PEM form, as GitHub gives it".to_owned())
        })?;
        let http = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            // A redirect would carry a credential somewhere nobody configured.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| GitHubError::Unavailable(format!("cannot build the HTTP client: {e}")))?;
        let app = GitHubApp {
            app_id: config.app_id,
            key,
            client_id: config.client_id.clone(),
            client_secret,
            api_url: config.api_url.trim_end_matches('/').to_owned(),
            git_url: config.git_url.trim_end_matches('/').to_owned(),
            connect_url: config.connect_url.clone(),
            http,
        };
        // A key that cannot sign is found now, not at the first create.
        app.app_jwt()
            .map_err(|_| key_error("it cannot sign an RS256 JWT".to_owned()))?;
        Ok(app)
    }

    /// Where an organisation installs the App; named in refusals.
    pub fn connect_url(&self) -> &str {
        &self.connect_url
    }

    /// The git host, without a trailing slash.
    pub fn git_url(&self) -> &str {
        &self.git_url
    }

    /// `{git_url}/{owner}/{name}.git`.
    pub fn clone_url(&self, repository: &Repository) -> String {
        format!(
            "{}/{}/{}.git",
            self.git_url,
            repository.owner(),
            repository.name()
        )
    }

    /// The App's own JWT: RS256, `iss` the App id, dated back a minute, short-lived.
    fn app_jwt(&self) -> Result<Secret, GitHubError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let claims = json!({
            "iat": now.saturating_sub(JWT_BACKDATE),
            "exp": now + JWT_LIFETIME,
            "iss": self.app_id,
        });
        jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &self.key)
            .map(Secret::new)
            .map_err(|e| GitHubError::Key {
                path: "(loaded)".to_owned(),
                reason: format!("cannot sign the App's JWT: {e}"),
            })
    }

    /// One request with GitHub's headers; a GitHub that cannot be reached or answers 5xx is
    /// `Unavailable`, any other answer is the caller's to read.
    pub(super) async fn call(
        &self,
        what: &'static str,
        method: Method,
        path: &str,
        credential: Credential<'_>,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Vec<u8>), GitHubError> {
        let request = self.request(method, path, credential)?;
        let request = match body {
            Some(body) => request.json(body),
            None => request,
        };
        let (status, _, bytes) = send(what, request).await?;
        Ok((status, bytes))
    }

    /// `call` without a body, answering the response's headers too (for `Link`).
    pub(super) async fn call_with_headers(
        &self,
        what: &'static str,
        method: Method,
        path: &str,
        credential: Credential<'_>,
    ) -> Result<(StatusCode, HeaderMap, Vec<u8>), GitHubError> {
        send(what, self.request(method, path, credential)?).await
    }

    /// The HTTP client, which follows no redirect.
    pub(super) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// A request to `{api_url}{path}` with GitHub's headers and `credential`.
    fn request(
        &self,
        method: Method,
        path: &str,
        credential: Credential<'_>,
    ) -> Result<reqwest::RequestBuilder, GitHubError> {
        let bearer = match credential {
            Credential::App => self.app_jwt()?,
            Credential::Token(token) => token.clone(),
        };
        Ok(self
            .http
            .request(method, format!("{}{path}", self.api_url))
            .header(reqwest::header::ACCEPT, MEDIA_TYPE)
            .header("X-GitHub-Api-Version", API_VERSION)
            .bearer_auth(bearer.expose()))
    }

    /// `POST /app/installations/{id}/access_tokens`: a token limited to `repositories` (names
    /// within the installation's account; `None`: all it selected) and `permissions`.
    /// Errors: `InstallationNotFound`; `RepositoryNotAccessible` on GitHub's 422 (a repository
    /// the installation does not reach); `Unavailable`; `Refused`; `Unexpected`.
    pub async fn mint_token(
        &self,
        installation: i64,
        repositories: Option<&[&str]>,
        permissions: Value,
    ) -> Result<InstallationToken, GitHubError> {
        const WHAT: &str = "minting an installation token";
        let mut request = json!({ "permissions": permissions });
        if let Some(repositories) = repositories {
            request["repositories"] = json!(repositories);
        }
        let (status, body) = self
            .call(
                WHAT,
                Method::POST,
                &format!("/app/installations/{installation}/access_tokens"),
                Credential::App,
                Some(&request),
            )
            .await?;
        match status {
            StatusCode::CREATED => {
                let minted: TokenBody = parse(WHAT, &body)?;
                if minted.token.is_empty() {
                    return Err(GitHubError::Unexpected {
                        what: WHAT,
                        reason: "an empty token".to_owned(),
                    });
                }
                Ok(InstallationToken {
                    token: Secret::new(minted.token),
                    expires_at: minted.expires_at,
                })
            }
            StatusCode::NOT_FOUND => Err(GitHubError::InstallationNotFound(installation)),
            StatusCode::UNPROCESSABLE_ENTITY => {
                Err(GitHubError::RepositoryNotAccessible(message_of(&body)))
            }
            other => Err(refused(WHAT, other, &body)),
        }
    }

    /// `DELETE /installation/token`: the token stops working now. A token GitHub no longer
    /// takes (401) is already as good as revoked. Errors: `Unavailable`; `Refused`.
    pub async fn revoke(&self, token: &Secret) -> Result<(), GitHubError> {
        const WHAT: &str = "revoking an installation token";
        let (status, body) = self
            .call(
                WHAT,
                Method::DELETE,
                "/installation/token",
                Credential::Token(token),
                None,
            )
            .await?;
        match status {
            StatusCode::NO_CONTENT | StatusCode::UNAUTHORIZED => Ok(()),
            other => Err(refused(WHAT, other, &body)),
        }
    }

    /// `GET /app` with the App's own JWT: whether GitHub accepts it, and the App's name.
    /// Errors: `Refused` (GitHub rejects the JWT: wrong App id or key); `Unavailable`;
    /// `Unexpected`.
    pub async fn check_app(&self) -> Result<String, GitHubError> {
        const WHAT: &str = "checking the App's JWT";
        #[derive(Deserialize)]
        struct AppBody {
            slug: Option<String>,
            name: Option<String>,
        }
        let (status, body) = self
            .call(WHAT, Method::GET, "/app", Credential::App, None)
            .await?;
        match status {
            StatusCode::OK => {
                let app: AppBody = parse(WHAT, &body)?;
                Ok(app.slug.or(app.name).unwrap_or_default())
            }
            other => Err(refused(WHAT, other, &body)),
        }
    }

    /// Whether `installation` selected `repository`: `GET /repos/{owner}/{name}/installation`
    /// with the App's own JWT names the installation that reaches the repository (404 when
    /// none does), so no installation token is minted to find out.
    /// Errors: `Unavailable`; `Refused`; `Unexpected`.
    pub async fn selects(
        &self,
        installation: i64,
        repository: &Repository,
    ) -> Result<bool, GitHubError> {
        const WHAT: &str = "looking up the repository's installation";
        let (status, body) = self
            .call(
                WHAT,
                Method::GET,
                &format!(
                    "/repos/{}/{}/installation",
                    repository.owner(),
                    repository.name()
                ),
                Credential::App,
                None,
            )
            .await?;
        match status {
            StatusCode::OK => {
                let found: InstallationBody = parse(WHAT, &body)?;
                Ok(found.id == installation)
            }
            StatusCode::NOT_FOUND => Ok(false),
            other => Err(refused(WHAT, other, &body)),
        }
    }
}

/// Sends `request`; a GitHub that cannot be reached or answers 5xx or 429 is `Unavailable`.
pub(super) async fn send(
    what: &'static str,
    request: reqwest::RequestBuilder,
) -> Result<(StatusCode, HeaderMap, Vec<u8>), GitHubError> {
    let response = request.send().await.map_err(unreachable(what))?;
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.map_err(unreachable(what))?.to_vec();
    match not_answering(what, status, &headers, &bytes) {
        Some(e) => Err(e),
        None => Ok((status, headers, bytes)),
    }
}

/// A GitHub that could not be reached while `what`: `Unavailable`, with the whole cause.
pub(super) fn unreachable(what: &'static str) -> impl Fn(reqwest::Error) -> GitHubError {
    move |e| GitHubError::Unavailable(format!("{what}: {}", chain(&e)))
}

/// The error of an answer that says GitHub is not answering now (rate limited, 5xx, 429), if
/// it is one.
pub(super) fn not_answering(
    what: &'static str,
    status: StatusCode,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Option<GitHubError> {
    if let Some(retry_after) = super::rate::rate_limited(status, headers) {
        return Some(GitHubError::RateLimited {
            what,
            retry_after: retry_after.as_secs(),
        });
    }
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        return Some(GitHubError::Unavailable(format!(
            "{what}: {status}: {}",
            message_of(bytes)
        )));
    }
    None
}

/// The OAuth client secret: the file's first line, which must not be empty.
fn read_client_secret(path: &std::path::Path) -> Result<Secret, GitHubError> {
    let error = |reason: String| GitHubError::ClientSecret {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    let secret = text.lines().next().unwrap_or_default().trim();
    if secret.is_empty() {
        return Err(error("it is empty".to_owned()));
    }
    Ok(Secret::new(secret.to_owned()))
}

pub(super) fn parse<T: serde::de::DeserializeOwned>(
    what: &'static str,
    body: &[u8],
) -> Result<T, GitHubError> {
    serde_json::from_slice(body).map_err(|e| GitHubError::Unexpected {
        what,
        reason: e.to_string(),
    })
}

pub(super) fn refused(what: &'static str, status: StatusCode, body: &[u8]) -> GitHubError {
    GitHubError::Refused {
        what,
        status: status.as_u16(),
        message: message_of(body),
    }
}

/// GitHub's error `message`, or the start of whatever it sent.
pub(super) fn message_of(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct ErrorBody {
        message: String,
    }
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => e.message,
        Err(_) => String::from_utf8_lossy(body).chars().take(200).collect(),
    }
}

/// An error with its causes, which say what actually went wrong (refused, timed out, …).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_githubs_message() {
        assert_eq!(
            message_of(br#"{"message":"Not Found","documentation_url":"https://docs.github.com"}"#),
            "Not Found"
        );
        assert_eq!(message_of(b"plain"), "plain");
    }

    #[test]
    fn a_key_that_is_not_rsa_pem_is_refused_without_printing_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        std::fs::write(
            &path,
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s3cr3t\n").unwrap();
        let config = config::GitHub {
            app_id: 1,
            private_key: path,
            client_id: "Iv1.test".to_owned(),
            client_secret_file: secret,
            api_url: "https://api.github.com".to_owned(),
            git_url: "https://github.com".to_owned(),
            connect_url: "https://github.com/apps/narya/installations/new".to_owned(),
        };
        let error = GitHubApp::new(&config).unwrap_err().to_string();
        assert!(error.contains("key.pem"), "{error}");
        assert!(!error.contains("c2VjcmV0"), "{error}");
    }
}
