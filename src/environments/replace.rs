//! Replacing a `gone` environment: its machine made again from the digest it was pinned to,
//! its workspace kept, its recorded setup run once more.

use std::sync::Arc;

use narya_runtimes::{ErrorKind, ImageSource};

use super::{EnvironmentError, Environments, Progress};
use crate::auth::Principal;
use crate::model::{now_rfc3339, EnvironmentId, SetupState, SetupStep, Status};

/// The status detail while a replace runs.
const REPLACING: &str = "replacing";
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
        let _guard = self.locks.lock(&principal.organisation, &id).await;
        let mut row = self.get(&principal, &id).await?;
        if row.deleted_at.is_some() {
            return Err(EnvironmentError::Deleted(id));
        }
        // The store may lag the runtime by a poll: ask the runtime itself.
        let state = self.runtime.inspect(&row.machine).await?;
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
        // Unrecorded until the setup has run again: a daemon stop from here on reads as an
        // interrupted setup, never as last time's record.
        let mut replacing = EnvironmentRecord {
            setup_recorded: false,
            setup: None,
            status: Status::Degraded,
            status_detail: Some(REPLACING.to_owned()),
            updated_at: now_rfc3339(),
            ..row.clone()
        };
        self.store.record(&replacing).await?;
        self.store
            .set_step(&row.organisation, &id, SetupStep::Setup, &now_rfc3339())
            .await?;
        // Made from a prebuild that is still kept: made from it again, its setup not run.
        let prebuild = match self.store.prebuild_of(&id).await? {
            Some(key) => self.take_prebuild(&row, &key).await?,
            None => None,
        };
        let remade = async {
            self.runtime.remove(&row.machine).await?;
            let workspace = self.prepare_workspace(&id, false)?;
            let mut spec = self.machine_spec(&row, pinned, workspace);
            if let Some(prebuild) = prebuild {
                spec.layer = Some(prebuild.layer.clone());
                match self.runtime.create_machine(&spec).await {
                    Ok(_) => {
                        tracing::info!(prebuild = %prebuild.key, "machine made again from its prebuild");
                        return Ok(Some(prebuild.setup));
                    }
                    // Its layer is gone from the runtime: forgotten, and the machine made from
                    // the digest with the setup run again, as once the prebuild is evicted.
                    Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Image) => {
                        tracing::warn!(prebuild = %prebuild.key, error = %e, "the runtime cannot start a machine from the prebuild; replacing from the digest");
                        self.forget_lost_prebuild(&prebuild).await;
                        self.runtime.remove(&row.machine).await?;
                        spec.layer = None;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            self.runtime.create_machine(&spec).await?;
            tracing::info!("machine made again from the pinned digest");
            match row.setup_script.clone() {
                Some(script) => {
                    let (events, _) = tokio::sync::broadcast::channel::<Progress>(1);
                    self.run_setup(&row.machine, &script, &events)
                        .await
                        .map(Some)
                }
                None => Ok(None),
            }
        }
        .await;
        match remade {
            Ok(Some(setup)) => {
                row.status = if setup.state == SetupState::Succeeded {
                    Status::Ready
                } else {
                    Status::Unusable
                };
                row.setup = Some(setup);
            }
            Ok(None) => row.status = Status::Ready,
            Err(e) => {
                // Back to gone as it was, with no machine a later pass could take for ready.
                tracing::warn!(error = %e, "replacing failed; the environment stays gone");
                if let Err(e) = self.runtime.remove(&row.machine).await {
                    tracing::warn!(error = %e, "could not remove the half-made machine");
                }
                replacing = row;
                replacing.updated_at = now_rfc3339();
                self.store.record(&replacing).await?;
                return Err(e);
            }
        }
        row.status_detail = None;
        row.updated_at = now_rfc3339();
        self.store.record(&row).await?;
        tracing::info!(status = row.status.as_str(), "environment replaced");
        Ok(row)
    }
}
