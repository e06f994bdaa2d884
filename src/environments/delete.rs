//! Deleting an environment: its machine, writable layer and workspace destroyed, its record
//! kept as `gone` ("deleted") for the host's retention so a session can tell destroyed from
//! never-existed; a later create of the identifier makes a new one.

use std::sync::Arc;

use super::{EnvironmentError, Environments};
use crate::auth::Principal;
use crate::model::{now_rfc3339, EnvironmentId, Status};

/// The status detail of a deleted environment's record.
pub const DELETED: &str = "deleted";

/// Seconds since the epoch, as deletion times are kept.
pub(super) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Environments {
    /// Destroys the machine, its writable layer and the workspace, and records the environment
    /// `gone`. Deleting a deleted one is done already. Runs in its own task: a client that goes
    /// away does not leave it half done.
    pub async fn delete(
        self: &Arc<Self>,
        principal: Principal,
        id: EnvironmentId,
    ) -> Result<(), EnvironmentError> {
        self.run_tracked("delete", principal, id, |this, principal, id| async move {
            this.delete_serialised(principal, id).await
        })
        .await
    }

    async fn delete_serialised(
        &self,
        principal: Principal,
        id: EnvironmentId,
    ) -> Result<(), EnvironmentError> {
        let _guard = self.locks.lock(&principal.organisation, &id).await;
        let mut row = self.get(&principal, &id).await?;
        if row.deleted_at.is_some() {
            return Ok(());
        }
        self.runtime.remove(&row.machine).await?;
        self.remove_workspace(&row)
            .map_err(EnvironmentError::WorkspaceRemoval)?;
        row.status = Status::Gone;
        row.status_detail = Some(DELETED.to_owned());
        row.deleted_at = Some(unix_now());
        row.updated_at = now_rfc3339();
        self.store.record(&row).await?;
        tracing::info!("environment deleted");
        Ok(())
    }
}
