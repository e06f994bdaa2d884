//! Deleting an environment: its machine, writable layer and workspace destroyed, its
//! identifier freed.

use std::sync::Arc;

use super::{EnvironmentError, Environments};
use crate::auth::Principal;
use crate::model::EnvironmentId;

impl Environments {
    /// Destroys the machine, its writable layer and the workspace, and frees the identifier.
    /// Runs in its own task: a client that goes away does not leave it half done.
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
        let _guard = self.locks.lock(&id).await;
        let row = self.get(&principal, &id).await?;
        self.runtime.remove(row.id.as_str()).await?;
        self.remove_workspace(&row.id)
            .map_err(EnvironmentError::WorkspaceRemoval)?;
        self.store.delete(&row.organisation, &row.id).await?;
        tracing::info!("environment deleted");
        Ok(())
    }
}
