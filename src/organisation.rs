//! An organisation's link to GitHub: the App installation it connected, and which repositories
//! that installation lets this host clone for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::auth::Principal;
use crate::github::{GitHubApp, GitHubError, Installation, UserToken};
use crate::model::{now_rfc3339, Repository};
use crate::store::{ConnectedInstallation, Connecting, Store, StoreError};

/// Why an organisation's GitHub access was refused or could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum OrganisationError {
    #[error("this host has no GitHub App, which repository-carrying creates and connecting an installation need: add a [github] section (app_id, private_key, client_id, client_secret_file) to naryad's configuration and restart it; nothing was created")]
    GitHubNotConfigured,
    #[error("your organisation has connected no GitHub App installation: install Narya's GitHub App at {connect_url}, then connect it with `narya github connect INSTALLATION_ID --code CODE` (PUT /v1/organisation/github); nothing was created")]
    NotConnected { connect_url: String },
    #[error("GitHub knows no installation {installation} of Narya's GitHub App (it was never made, or was uninstalled): install the app at {connect_url}, then connect the installation with `narya github connect INSTALLATION_ID --code CODE` (PUT /v1/organisation/github); nothing was created")]
    InstallationNotFound {
        installation: u64,
        connect_url: String,
    },
    #[error("repository {repository} is not among the repositories your organisation's GitHub App installation {installation} selected: add it to the installation's repositories at {connect_url}, or connect another installation with `narya github connect INSTALLATION_ID --code CODE` (PUT /v1/organisation/github); nothing was created")]
    RepositoryNotSelected {
        repository: Repository,
        installation: i64,
        connect_url: String,
    },
    #[error("GitHub did not confirm that you can access installation {installation} of Narya's GitHub App: the code is not valid (it is used, expired, or not from this App), or the person it belongs to cannot access that installation; nothing was connected. Install the App at {connect_url} (or open its settings there); GitHub then hands you a fresh code to use with `narya github connect INSTALLATION_ID --code CODE`")]
    NotProved {
        installation: u64,
        connect_url: String,
    },
    #[error("you do not administer the GitHub account {account} that installation {installation} of Narya's GitHub App belongs to ({why}): only its owner connects it (for an organisation, one of its owners; for a user account, that user); nothing was connected. Ask an owner of {account} to connect it with `narya github connect {installation} --code CODE`, or install the App on an account you own at {connect_url}")]
    NotOwner {
        installation: u64,
        account: String,
        why: &'static str,
        connect_url: String,
    },
    #[error("your organisation's share of calls to GitHub is spent by refused requests ({BUCKET_SIZE} at most, one more every {} s): retry in {retry_after} s; nothing was created or connected", REFILL.as_secs())]
    GitHubShareSpent { retry_after: u64 },
    #[error("GitHub limits this host's calls: retry in {retry_after} s; nothing was created or connected")]
    GitHubRateLimited { retry_after: u64 },
    #[error("installation {installation} is connected to another organisation on this host; nothing was connected")]
    HeldByAnother { installation: u64 },
    #[error("your organisation has connected no GitHub App installation: install Narya's GitHub App at {connect_url}, then connect it with `narya github connect INSTALLATION_ID --code CODE` (PUT /v1/organisation/github)")]
    NoInstallation { connect_url: String },
    #[error("{0}; nothing was created, try again shortly")]
    GitHubUnavailable(#[source] GitHubError),
    #[error("talking to GitHub failed: {0}")]
    GitHub(#[source] GitHubError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<GitHubError> for OrganisationError {
    fn from(e: GitHubError) -> Self {
        match e {
            GitHubError::Unavailable(_) => OrganisationError::GitHubUnavailable(e),
            GitHubError::RateLimited { retry_after, .. } => {
                OrganisationError::GitHubRateLimited { retry_after }
            }
            other => OrganisationError::GitHub(other),
        }
    }
}

/// A repository checked against the organisation's installation: what a clone fetches, and
/// through which installation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloneSource {
    pub repository: Repository,
    pub installation: i64,
}

/// The calls to GitHub an organisation may have in flight or spent on refusals: a repository
/// create GitHub refuses, or a connect that fails, keeps its call; one that succeeds gives it
/// back. So one organisation's flood of refused requests spends at most this many of the App's
/// shared rate limit, then one more every [`REFILL`], and never holds up another's.
pub const BUCKET_SIZE: u32 = 8;
/// How often a spent call comes back to an organisation's bucket.
pub const REFILL: Duration = Duration::from_secs(5);

/// One organisation's calls to GitHub: a token bucket.
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// Each organisation's [`Bucket`].
#[derive(Default)]
struct Buckets(Mutex<HashMap<String, Bucket>>);

impl Buckets {
    /// Takes a call from `organisation`'s bucket; when it is empty, answers how many seconds
    /// until one comes back.
    fn take(&self, organisation: &str) -> Result<(), OrganisationError> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let bucket = all.entry(organisation.to_owned()).or_insert(Bucket {
            tokens: f64::from(BUCKET_SIZE),
            updated: now,
        });
        let refilled = now.duration_since(bucket.updated).as_secs_f64() / REFILL.as_secs_f64();
        bucket.tokens = (bucket.tokens + refilled).min(f64::from(BUCKET_SIZE));
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - bucket.tokens) * REFILL.as_secs_f64();
        Err(OrganisationError::GitHubShareSpent {
            retry_after: wait.ceil().max(1.0) as u64,
        })
    }

    /// Gives back the call an organisation's request took: it succeeded.
    fn give_back(&self, organisation: &str) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bucket) = all.get_mut(organisation) {
            bucket.tokens = (bucket.tokens + 1.0).min(f64::from(BUCKET_SIZE));
        }
    }
}

/// The organisations of this host, as far as GitHub is concerned.
pub struct Organisations {
    store: Store,
    /// The host's GitHub App; `None` without a `[github]` section.
    github: Option<Arc<GitHubApp>>,
    buckets: Buckets,
}

impl Organisations {
    pub fn new(store: Store, github: Option<Arc<GitHubApp>>) -> Organisations {
        Organisations {
            store,
            github,
            buckets: Buckets::default(),
        }
    }

    /// The host's GitHub App, or the refusal that says how to configure one.
    pub fn github(&self) -> Result<&GitHubApp, OrganisationError> {
        self.github
            .as_deref()
            .ok_or(OrganisationError::GitHubNotConfigured)
    }

    /// Connects `principal`'s organisation to GitHub App installation `installation_id`, once
    /// the person's one-time OAuth `code` proves they administer the account it belongs to: the
    /// code is exchanged for their user token, which lists their installations and says who
    /// they are and what they are in the account, and is then revoked. Repeating it is safe; a
    /// new id replaces the old; one another organisation holds is refused. A connect that fails
    /// keeps the GitHub call it took from the organisation's bucket.
    pub async fn connect_github(
        &self,
        principal: &Principal,
        installation_id: u64,
        code: &str,
    ) -> Result<(), OrganisationError> {
        let github = self.github()?;
        self.buckets.take(&principal.organisation)?;
        let connected = self
            .prove_and_connect(github, principal, installation_id, code)
            .await;
        if connected.is_ok() {
            self.buckets.give_back(&principal.organisation);
        }
        connected
    }

    async fn prove_and_connect(
        &self,
        github: &GitHubApp,
        principal: &Principal,
        installation_id: u64,
        code: &str,
    ) -> Result<(), OrganisationError> {
        let not_proved = || OrganisationError::NotProved {
            installation: installation_id,
            connect_url: github.connect_url().to_owned(),
        };
        let token = github.exchange_code(code).await.map_err(|e| match e {
            GitHubError::BadCode(reason) => {
                tracing::info!(organisation = %principal.organisation, %reason, "GitHub did not take the code");
                not_proved()
            }
            other => other.into(),
        })?;
        let proved = self.prove(github, &token, installation_id).await;
        // The user token was for these questions only.
        if let Err(e) = github.revoke_user_token(token).await {
            tracing::warn!(error = %e, "could not revoke the person's user token");
        }
        let installation = proved.map_err(|e| match e {
            OrganisationError::GitHub(GitHubError::BadCode(_)) => not_proved(),
            other => other,
        })?;
        let Some(installation) = installation else {
            tracing::info!(organisation = %principal.organisation, installation = installation_id, "the code's person cannot access the installation");
            return Err(not_proved());
        };
        let connected = ConnectedInstallation {
            installation_id: installation.id,
            account: installation.account,
        };
        match self
            .store
            .connect_installation(&principal.organisation, &connected, &now_rfc3339())
            .await?
        {
            Connecting::Connected => {
                tracing::info!(organisation = %principal.organisation, installation = connected.installation_id, account = ?connected.account, "GitHub installation connected");
                Ok(())
            }
            Connecting::HeldByAnother => Err(OrganisationError::HeldByAnother {
                installation: installation_id,
            }),
        }
    }

    /// The installation `installation_id` among those the token's person can access, once it
    /// is seen that they administer its account: for a user account, they are that user; for
    /// an organisation, an active owner of it (a member, an invited owner or an outside
    /// collaborator with access to one repository sees the installation too, and proves
    /// nothing). `None`: they cannot access it at all.
    async fn prove(
        &self,
        github: &GitHubApp,
        token: &UserToken,
        installation_id: u64,
    ) -> Result<Option<Installation>, OrganisationError> {
        let listed = github.user_installations(token).await?;
        let Some(installation) = listed
            .into_iter()
            .find(|i| u64::try_from(i.id).ok() == Some(installation_id))
        else {
            return Ok(None);
        };
        let account = installation.account.clone().unwrap_or_default();
        let refuse = |why| OrganisationError::NotOwner {
            installation: installation_id,
            account: account.clone(),
            why,
            connect_url: github.connect_url().to_owned(),
        };
        if installation.suspended {
            return Err(refuse("GitHub has suspended the installation"));
        }
        if installation.on_user {
            let person = github.user(token).await?;
            return match Some(person.id) == installation.account_id {
                true => Ok(Some(installation)),
                false => Err(refuse("it is another user's account")),
            };
        }
        match github.membership(token, &account).await? {
            Some(membership) if membership.is_active_owner() => Ok(Some(installation)),
            Some(membership) if membership.role == "admin" => Err(refuse(
                "your invitation to own the organisation is not accepted yet",
            )),
            Some(_) => Err(refuse("you are a member of the organisation, not an owner")),
            None => Err(refuse("you are not a member of the organisation")),
        }
    }

    /// The organisation's connected installation.
    pub async fn github_connection(
        &self,
        principal: &Principal,
    ) -> Result<ConnectedInstallation, OrganisationError> {
        let github = self.github()?;
        self.store
            .connected_installation(&principal.organisation)
            .await?
            .ok_or_else(|| OrganisationError::NoInstallation {
                connect_url: github.connect_url().to_owned(),
            })
    }

    /// Disconnects the organisation's installation (none connected is fine): its
    /// repository-carrying creates are refused from then on.
    pub async fn disconnect_github(&self, principal: &Principal) -> Result<(), OrganisationError> {
        if self
            .store
            .disconnect_installation(&principal.organisation)
            .await?
        {
            tracing::info!(organisation = %principal.organisation, "GitHub installation disconnected");
        }
        Ok(())
    }

    /// The organisation's installation, and `repository` among those it selected: the source a
    /// clone may fetch. Asked before anything is made, so a refusal costs nothing to undo.
    pub async fn clone_source(
        &self,
        principal: &Principal,
        repository: &Repository,
    ) -> Result<CloneSource, OrganisationError> {
        let github = self.github()?;
        let connect_url = github.connect_url().to_owned();
        let Some(installation) = self.store.installation(&principal.organisation).await? else {
            return Err(OrganisationError::NotConnected { connect_url });
        };
        self.buckets.take(&principal.organisation)?;
        let selects = github.selects(installation, repository).await;
        if matches!(selects, Ok(true)) {
            self.buckets.give_back(&principal.organisation);
        }
        match selects {
            Ok(true) => Ok(CloneSource {
                repository: repository.clone(),
                installation,
            }),
            Ok(false) => Err(OrganisationError::RepositoryNotSelected {
                repository: repository.clone(),
                installation,
                connect_url,
            }),
            Err(GitHubError::InstallationNotFound(_)) => {
                Err(OrganisationError::InstallationNotFound {
                    installation: installation.unsigned_abs(),
                    connect_url,
                })
            }
            Err(e) => Err(e.into()),
        }
    }
}
