//! An organisation's link to GitHub: the App installation it connected, and which repositories
//! that installation lets this host clone for it.

use std::sync::Arc;

use crate::auth::Principal;
use crate::github::{GitHubApp, GitHubError};
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

/// The organisations of this host, as far as GitHub is concerned.
pub struct Organisations {
    store: Store,
    /// The host's GitHub App; `None` without a `[github]` section.
    github: Option<Arc<GitHubApp>>,
}

impl Organisations {
    pub fn new(store: Store, github: Option<Arc<GitHubApp>>) -> Organisations {
        Organisations { store, github }
    }

    /// The host's GitHub App, or the refusal that says how to configure one.
    pub fn github(&self) -> Result<&GitHubApp, OrganisationError> {
        self.github
            .as_deref()
            .ok_or(OrganisationError::GitHubNotConfigured)
    }

    /// Connects `principal`'s organisation to GitHub App installation `installation_id`, once
    /// the person's one-time OAuth `code` proves they can access it: the code is exchanged for
    /// their user token, which lists their installations and is then revoked. Repeating it is
    /// safe; a new id replaces the old; one another organisation holds is refused.
    pub async fn connect_github(
        &self,
        principal: &Principal,
        installation_id: u64,
        code: &str,
    ) -> Result<(), OrganisationError> {
        let github = self.github()?;
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
        let listed = github.user_installations(&token).await;
        // The user token was for this one question.
        if let Err(e) = github.revoke_user_token(token).await {
            tracing::warn!(error = %e, "could not revoke the person's user token");
        }
        let listed = listed.map_err(|e| match e {
            GitHubError::BadCode(_) => not_proved(),
            other => other.into(),
        })?;
        let Some(installation) = listed
            .into_iter()
            .find(|i| u64::try_from(i.id).ok() == Some(installation_id))
        else {
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
        match github.selects(installation, repository).await {
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
