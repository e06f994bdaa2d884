//! Replacing a `gone` environment: its machine made again from the digest it was pinned to,
//! its workspace kept, its recorded setup run once more.

use std::sync::Arc;

use narya_runtimes::ImageSource;

use super::{EnvironmentError, Environments, Progress};
use crate::auth::Principal;
use crate::model::{now_rfc3339, EnvironmentId, SetupState, Status};
use crate::store::EnvironmentRecord;

impl Environments {
    /// Makes a `gone` environment's machine again from its pinned digest, keeping its
    /// workspace, and runs its recorded setup once more.
    pub async fn replace(
        self: &Arc<Self>,
        principal: Principal,
        id: EnvironmentId,
    ) -> Result<EnvironmentRecord, EnvironmentError> {
        self.run_tracked("replace", principal, id, |this, principal, id| async move {
            this.replace_serialised(principal, id).await
        })
        .await
    }

    async fn replace_serialised(
        &self,
        principal: Principal,
        id: EnvironmentId,
    ) -> Result<EnvironmentRecord, EnvironmentError> {
        let _guard = self.locks.lock(&id).await;
        let mut row = self.get(&principal, &id).await?;
        // The store may lag the runtime by a poll: ask the runtime itself.
        let state = self.runtime.inspect(id.as_str()).await?;
        if row.status != Status::Gone || state != narya_runtimes::MachineState::Missing {
            return Err(EnvironmentError::NotGone {
                id,
                status: row.status,
            });
        }
        // The pinned digest, never a newer one; fetched again if the runtime lost it.
        let pinned = self
            .runtime
            .ensure_image(&ImageSource {
                reference: self.config.image.reference.clone(),
                pinned: Some(row.image_digest.clone()),
            })
            .await?;
        self.store
            .set_status(
                &row.organisation,
                &row.id,
                Status::Degraded,
                Some("replacing"),
                &now_rfc3339(),
            )
            .await?;
        self.runtime.remove(id.as_str()).await?;
        let workspace = self.prepare_workspace(&id, false)?;
        self.runtime
            .create_machine(&self.machine_spec(&id, pinned, workspace))
            .await?;
        tracing::info!("machine made again from the pinned digest");
        if let Some(script) = row.setup_script.clone() {
            let (events, _) = tokio::sync::broadcast::channel::<Progress>(1);
            let setup = self.run_setup(&id, &script, &events).await?;
            row.status = if setup.state == SetupState::Succeeded {
                Status::Ready
            } else {
                Status::Unusable
            };
            row.setup = Some(setup);
        } else {
            row.status = Status::Ready;
        }
        row.status_detail = None;
        row.updated_at = now_rfc3339();
        self.store.record(&row).await?;
        tracing::info!(status = row.status.as_str(), "environment replaced");
        Ok(row)
    }
}
