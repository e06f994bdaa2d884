//! How an operation on an environment failed; `api::ApiError` alone turns these into answers.

use std::path::PathBuf;
use std::sync::Arc;

use narya_runtimes::{ErrorKind, RuntimeError};

use crate::model::{EnvironmentId, Status};
use crate::organisation::OrganisationError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum EnvironmentError {
    #[error("identifier \"{0}\" is in use; choose another identifier")]
    IdInUse(EnvironmentId),
    #[error("environment \"{0}\" has a machine whose setup state was never recorded (its creation was interrupted), so nobody can say whether its toolchain exists; delete it (narya env delete {0}) and create it again")]
    SetupUnrecorded(EnvironmentId),
    #[error("no environment \"{0}\" in your organisation")]
    NotFound(EnvironmentId),
    #[error("environment {id} is {status}{}; commands run only in a ready environment", .detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    NotReady {
        id: EnvironmentId,
        status: Status,
        detail: Option<String>,
    },
    #[error("environment {id} is {status}; replace re-provisions only a gone environment (one whose machine the runtime no longer has)")]
    NotGone { id: EnvironmentId, status: Status },
    #[error("environment {0} was deleted; create it again (narya env create {0}) for a new one")]
    Deleted(EnvironmentId),
    #[error("environment {id} has no running machine right now ({source}); wait for it to come back or replace it")]
    NoRunningMachine {
        id: EnvironmentId,
        #[source]
        source: RuntimeError,
    },
    #[error(transparent)]
    GitHub(#[from] OrganisationError),
    #[error("{}", runtime_failure(.0))]
    Runtime(#[from] RuntimeError),
    #[error("cannot prepare the workspace {}: {source}", .path.display())]
    Workspace {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the machine is gone but the workspace could not be removed: {0}")]
    WorkspaceRemoval(#[source] std::io::Error),
    #[error("machine {0} vanished while being adopted")]
    MachineVanished(EnvironmentId),
    #[error("machine {0} carries no {label} label", label = narya_runtimes::LABEL_DIGEST)]
    MachineUnlabelled(EnvironmentId),
    #[error("the {what} task failed: {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error(transparent)]
    Store(StoreError),
    #[error("your organisation holds {max} environments, its limit on this host (`[organisation] max_environments`); delete one (narya env delete ID) before creating another")]
    AtEnvironmentLimit { max: usize },
    #[error("the host is short of disk: {free} bytes are free on its state directory's filesystem, below the {reserve} it keeps for itself (`[host] reserve_disk`); nothing was provisioned; an operator must free space, or delete environments")]
    HostShortOfDisk { free: u64, reserve: u64 },
    /// The failure of a create that this request joined while it was provisioning.
    #[error(transparent)]
    Joined(Arc<EnvironmentError>),
    #[error("the create of {0} that this request joined ended without an outcome; ask again")]
    JoinedWithoutOutcome(EnvironmentId),
}

impl From<StoreError> for EnvironmentError {
    fn from(e: StoreError) -> EnvironmentError {
        EnvironmentError::Store(e)
    }
}

impl EnvironmentError {
    /// A store failure while inserting `id`'s row: another organisation's create that took the
    /// identifier first makes it in use, as if it had been there all along.
    pub(super) fn inserting(
        id: &EnvironmentId,
    ) -> impl FnOnce(StoreError) -> EnvironmentError + '_ {
        move |e| match e {
            StoreError::Held(_) => EnvironmentError::IdInUse(id.clone()),
            StoreError::AtLimit(max) => EnvironmentError::AtEnvironmentLimit { max },
            e => EnvironmentError::Store(e),
        }
    }
}

/// What a person should read when the runtime failed: whether waiting helps, and that nothing
/// was left half-made.
fn runtime_failure(e: &RuntimeError) -> String {
    match e.kind() {
        ErrorKind::Unavailable => format!(
            "the container runtime is not answering ({e}); nothing was provisioned, try again shortly"
        ),
        ErrorKind::Image => {
            format!("the official image could not be resolved or fetched ({e}); nothing was provisioned")
        }
        _ => format!("the container runtime failed: {e}"),
    }
}

impl EnvironmentError {
    /// The failure itself, whether this request met it or joined a create that did.
    pub fn cause(&self) -> &EnvironmentError {
        match self {
            EnvironmentError::Joined(shared) => shared.cause(),
            other => other,
        }
    }

    /// An error shared with joiners, back in one owner's hands when nobody joined.
    pub(super) fn unshare(shared: Arc<EnvironmentError>) -> EnvironmentError {
        Arc::try_unwrap(shared).unwrap_or_else(EnvironmentError::Joined)
    }

    /// A task of ours that panicked or was cancelled.
    pub(super) fn task(what: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Self {
        move |source| EnvironmentError::Task { what, source }
    }
}
