//! How a person proves which installations of the App they can access: the one-time OAuth
//! `code` GitHub hands them after installing it, exchanged for their user token, which lists
//! their installations and is then revoked.

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::app::{message_of, parse, refused, send, Credential, API_VERSION, MEDIA_TYPE};
use super::{GitHubApp, GitHubError, Installation, Secret};

/// Installations asked for per page: GitHub's most.
const PER_PAGE: u32 = 100;
/// A bound on pages followed, against a `Link` that never ends.
const MAX_PAGES: usize = 100;

/// A person's user token (`ghu_…`); it prints as `[redacted]`.
#[derive(Debug)]
pub struct UserToken(Secret);

/// Deliberately without `Debug`: it holds the token.
#[derive(Deserialize)]
struct ExchangeBody {
    access_token: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

#[derive(Deserialize)]
struct InstallationsPage {
    installations: Vec<ListedInstallation>,
}

#[derive(Deserialize)]
struct ListedInstallation {
    id: i64,
    account: Option<Account>,
    repository_selection: Option<String>,
    suspended_at: Option<String>,
}

#[derive(Deserialize)]
struct Account {
    login: String,
    id: Option<i64>,
    #[serde(rename = "type")]
    kind: Option<String>,
}

/// `GET /user`: who the token's person is.
#[derive(Deserialize)]
struct UserBody {
    id: i64,
    login: String,
}

/// `GET /user/memberships/orgs/{org}`: the person's membership of an organisation.
#[derive(Deserialize)]
struct MembershipBody {
    state: String,
    role: String,
}

/// A person as GitHub names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Person {
    pub id: i64,
    pub login: String,
}

/// What the person is in an organisation: `role` `admin` (an owner) or `member`, `state`
/// `active` or `pending` (invited, not yet joined).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    pub role: String,
    pub state: String,
}

impl Membership {
    /// An owner who has joined: who administers the organisation's installations.
    pub fn is_active_owner(&self) -> bool {
        self.role == "admin" && self.state == "active"
    }
}

impl GitHubApp {
    /// Exchanges a person's one-time OAuth `code` at `{git_url}/login/oauth/access_token` for
    /// their user token. Errors: `BadCode` when GitHub does not take it (wrong, used, expired);
    /// `Unavailable`; `Refused`; `Unexpected`.
    pub async fn exchange_code(&self, code: &str) -> Result<UserToken, GitHubError> {
        const WHAT: &str = "exchanging the OAuth code";
        let request = self
            .http
            .post(format!("{}/login/oauth/access_token", self.git_url()))
            .header(reqwest::header::ACCEPT, "application/json")
            .form(&[
                ("client_id", self.client_id.as_str()),
                ("client_secret", self.client_secret.expose()),
                ("code", code),
            ]);
        let (status, _, body) = send(WHAT, request).await?;
        if !status.is_success() {
            return Err(refused(WHAT, status, &body));
        }
        // GitHub answers a code it does not take with 200 and an `error`.
        let answer: ExchangeBody = parse(WHAT, &body)?;
        match (answer.access_token, answer.error) {
            (Some(token), None) if !token.is_empty() => Ok(UserToken(Secret::new(token))),
            // The host's fault, not the person's: said so, never taken for a bad code.
            (_, Some(error)) if error == "incorrect_client_credentials" => {
                Err(GitHubError::Refused {
                    what: WHAT,
                    status: status.as_u16(),
                    message: "GitHub does not take this host's OAuth client: check [github] \
                              client_id and the secret in client_secret_file"
                        .to_owned(),
                })
            }
            (_, Some(error)) => Err(GitHubError::BadCode(
                answer.error_description.unwrap_or(error),
            )),
            _ => Err(GitHubError::Unexpected {
                what: WHAT,
                reason: "neither a token nor an error".to_owned(),
            }),
        }
    }

    /// `GET /user/installations`: every installation of the App the token's person can access,
    /// following `Link: <…>; rel="next"` over all pages (never off `api_url`).
    /// Errors: `BadCode` when GitHub no longer takes the token; `Unavailable`; `Refused`;
    /// `Unexpected`.
    pub async fn user_installations(
        &self,
        token: &UserToken,
    ) -> Result<Vec<Installation>, GitHubError> {
        const WHAT: &str = "listing the person's installations";
        let mut found = Vec::new();
        let mut next = Some(format!("/user/installations?per_page={PER_PAGE}"));
        let mut pages = 0;
        while let Some(path) = next.take() {
            pages += 1;
            if pages > MAX_PAGES {
                return Err(GitHubError::Unexpected {
                    what: WHAT,
                    reason: format!("more than {MAX_PAGES} pages"),
                });
            }
            let (status, headers, body) = self
                .call_with_headers(WHAT, Method::GET, &path, Credential::Token(&token.0))
                .await?;
            match status {
                StatusCode::OK => {}
                StatusCode::UNAUTHORIZED => return Err(GitHubError::BadCode(message_of(&body))),
                other => return Err(refused(WHAT, other, &body)),
            }
            let page: InstallationsPage = parse(WHAT, &body)?;
            found.extend(page.installations.into_iter().map(|i| {
                let on_user = i.account.as_ref().and_then(|a| a.kind.as_deref()) == Some("User");
                Installation {
                    id: i.id,
                    account_id: i.account.as_ref().and_then(|a| a.id),
                    account: i.account.map(|a| a.login),
                    repository_selection: i.repository_selection,
                    on_user,
                    suspended: i.suspended_at.is_some(),
                }
            }));
            next = next_link(&headers)
                .map(|url| {
                    url.strip_prefix(&self.api_url)
                        .filter(|p| p.starts_with('/'))
                        .map(str::to_owned)
                        .ok_or_else(|| GitHubError::Unexpected {
                            what: WHAT,
                            reason: "a next page off the API's URL".to_owned(),
                        })
                })
                .transpose()?;
        }
        Ok(found)
    }

    /// `GET /user`: the person the token is theirs. Errors: `BadCode` when GitHub no longer
    /// takes the token; `RateLimited`; `Unavailable`; `Refused`; `Unexpected`.
    pub async fn user(&self, token: &UserToken) -> Result<Person, GitHubError> {
        const WHAT: &str = "asking who the person is";
        let (status, _, body) = self
            .call_with_headers(WHAT, Method::GET, "/user", Credential::Token(&token.0))
            .await?;
        match status {
            StatusCode::OK => {}
            StatusCode::UNAUTHORIZED => return Err(GitHubError::BadCode(message_of(&body))),
            other => return Err(refused(WHAT, other, &body)),
        }
        let user: UserBody = parse(WHAT, &body)?;
        Ok(Person {
            id: user.id,
            login: user.login,
        })
    }

    /// `GET /user/memberships/orgs/{org}`: the person's membership of organisation `org`;
    /// `None` when they have none (GitHub answers 404, or 403 when the App may not read
    /// memberships: said in the log, since the App then needs *Organization members: read*).
    pub async fn membership(
        &self,
        token: &UserToken,
        org: &str,
    ) -> Result<Option<Membership>, GitHubError> {
        const WHAT: &str = "asking for the person's membership of the organisation";
        if org.is_empty() || !org.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Ok(None);
        }
        let path = format!("/user/memberships/orgs/{org}");
        let (status, _, body) = self
            .call_with_headers(WHAT, Method::GET, &path, Credential::Token(&token.0))
            .await?;
        match status {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Ok(None),
            StatusCode::FORBIDDEN => {
                tracing::warn!(org, message = %message_of(&body), "GitHub would not show the person's membership: give the App the Organization members (read) permission");
                return Ok(None);
            }
            StatusCode::UNAUTHORIZED => return Err(GitHubError::BadCode(message_of(&body))),
            other => return Err(refused(WHAT, other, &body)),
        }
        let membership: MembershipBody = parse(WHAT, &body)?;
        Ok(Some(Membership {
            role: membership.role,
            state: membership.state,
        }))
    }

    /// `DELETE /applications/{client_id}/token`: the user token stops working now. One GitHub
    /// no longer takes is as good as revoked. Errors: `Unavailable`; `Refused`.
    pub async fn revoke_user_token(&self, token: UserToken) -> Result<(), GitHubError> {
        const WHAT: &str = "revoking the person's user token";
        let request = self
            .http
            .delete(format!(
                "{}/applications/{}/token",
                self.api_url, self.client_id
            ))
            .header(reqwest::header::ACCEPT, MEDIA_TYPE)
            .header("X-GitHub-Api-Version", API_VERSION)
            .basic_auth(&self.client_id, Some(self.client_secret.expose()))
            .json(&json!({ "access_token": token.0.expose() }));
        let (status, _, body) = send(WHAT, request).await?;
        match status {
            StatusCode::NO_CONTENT | StatusCode::NOT_FOUND | StatusCode::UNPROCESSABLE_ENTITY => {
                Ok(())
            }
            other => Err(refused(WHAT, other, &body)),
        }
    }
}

/// The `rel="next"` target of a `Link` header, if any.
fn next_link(headers: &reqwest::header::HeaderMap) -> Option<String> {
    headers
        .get_all(reqwest::header::LINK)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|part| {
            let (target, params) = part.trim().split_once(';')?;
            let is_next = params
                .split(';')
                .any(|p| p.trim().replace(' ', "") == "rel=\"next\"");
            let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
            is_next.then(|| target.to_owned())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_read_from_the_link_header() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::LINK,
            "<https://api.github.com/user/installations?per_page=1&page=1>; rel=\"prev\", \
             <https://api.github.com/user/installations?per_page=1&page=3>; rel=\"next\", \
             <https://api.github.com/user/installations?per_page=1&page=9>; rel=\"last\""
                .parse()
                .unwrap(),
        );
        assert_eq!(
            next_link(&headers).as_deref(),
            Some("https://api.github.com/user/installations?per_page=1&page=3")
        );
        headers.insert(
            reqwest::header::LINK,
            "<https://api.github.com/x?page=1>; rel=\"first\""
                .parse()
                .unwrap(),
        );
        assert_eq!(next_link(&headers), None);
        assert_eq!(next_link(&reqwest::header::HeaderMap::new()), None);
    }

    #[test]
    fn user_tokens_never_print() {
        let token = UserToken(Secret::new("ghu_secret".to_owned()));
        assert_eq!(format!("{token:?}"), "UserToken([redacted])");
    }
}
