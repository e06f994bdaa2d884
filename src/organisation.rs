//! An organisation's link to GitHub: the App installation it connected, and which repositories
//! that installation lets this host clone for it.

use std::sync::Arc;

use crate::auth::Principal;
use crate::github::{GitHubApp, GitHubError};
use crate::model::{now_rfc3339, Repository};
use crate::store::{Store, StoreError};

/// Why an organisation's GitHub access was refused or could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum OrganisationError {
    #[error("this host has no GitHub App, which repository-carrying creates and connecting an installation need: add a [github] section (app_id, private_key) to naryad's configuration and restart it; nothing was created")]
    GitHubNotConfigured,
    #[error("your organisation has connected no GitHub App installation: install Narya's GitHub App at {connect_url}, then connect it with `narya github connect INSTALLATION_ID` (PUT /v1/organisation/github); nothing was created")]
    NotConnected { connect_url: String },
    #[error("GitHub knows no installation {installation} of Narya's GitHub App (it was never made, or was uninstalled): install the app at {connect_url}, then connect the installation with `narya github connect INSTALLATION_ID` (PUT /v1/organisation/github); nothing was created")]
    InstallationNotFound {
        installation: u64,
        connect_url: String,
    },
    #[error("repository {repository} is not among the repositories your organisation's GitHub App installation {installation} selected: add it to the installation's repositories at {connect_url}, or connect another installation with `narya github connect INSTALLATION_ID` (PUT /v1/organisation/github); nothing was created")]
    RepositoryNotSelected {
        repository: Repository,
        installation: i64,
        connect_url: String,
    },
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
    /// GitHub has said that installation exists. Repeating it is safe; a new id replaces the old.
    pub async fn connect_github(
        &self,
        principal: &Principal,
        installation_id: u64,
    ) -> Result<(), OrganisationError> {
        let github = self.github()?;
        let not_found = || OrganisationError::InstallationNotFound {
            installation: installation_id,
            connect_url: github.connect_url().to_owned(),
        };
        // GitHub's ids are positive 64-bit integers; a larger one names nothing.
        let id = i64::try_from(installation_id).map_err(|_| not_found())?;
        let installation = github.installation(id).await.map_err(|e| match e {
            GitHubError::InstallationNotFound(_) => not_found(),
            other => other.into(),
        })?;
        self.store
            .connect_installation(&principal.organisation, installation.id, &now_rfc3339())
            .await?;
        tracing::info!(organisation = %principal.organisation, installation = installation.id, account = ?installation.account, "GitHub installation connected");
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
