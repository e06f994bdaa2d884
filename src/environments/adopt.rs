//! Adopting what an interrupted create or a lost store left: a row left unrecorded, or a
//! Narya machine the store does not know, met by a create without setup.

use narya_runtimes::{ImageSource, MachineInfo, MachineState};

use super::{EnvironmentError, Environments};
use crate::auth::Principal;
use crate::model::{now_rfc3339, EnvironmentId, Status};
use crate::store::EnvironmentRecord;

impl Environments {
    /// A row left unrecorded by a daemon that died, met by a create without setup: the machine
    /// is made sure of and the row recorded as a setup-less environment.
    pub(super) async fn adopt_row(
        &self,
        mut row: EnvironmentRecord,
        fingerprint: &str,
    ) -> Result<EnvironmentRecord, EnvironmentError> {
        tracing::info!("adopting an environment whose creation was interrupted");
        match self.runtime.inspect(&row.machine).await? {
            // Running, or busy and not known to be stopped: adopted as it is.
            MachineState::Running | MachineState::Unknown => {}
            MachineState::Stopped => self.runtime.start(&row.machine).await?,
            MachineState::Missing => {
                let pinned = self
                    .runtime
                    .ensure_image(&ImageSource {
                        reference: self.config.image.reference.clone(),
                        pinned: Some(row.image_digest.clone()),
                    })
                    .await?;
                let workspace = self.prepare_workspace(&row.id, false)?;
                self.runtime
                    .create_machine(&self.machine_spec(&row, pinned, workspace))
                    .await?;
            }
        }
        row.fingerprint = fingerprint.to_owned();
        row.setup_script = None;
        row.repository = None;
        row.setup = None;
        row.setup_recorded = true;
        row.status = Status::Ready;
        row.status_detail = None;
        row.updated_at = now_rfc3339();
        self.store.record(&row).await?;
        Ok(row)
    }

    /// A Narya machine the store does not know, met by a create without setup: recorded.
    pub(super) async fn adopt_orphan(
        &self,
        principal: &Principal,
        id: &EnvironmentId,
        machine: MachineInfo,
        fingerprint: &str,
    ) -> Result<EnvironmentRecord, EnvironmentError> {
        tracing::warn!(machine = %machine.id, "adopting a Narya machine the store did not know");
        let digest = machine
            .digest
            .ok_or_else(|| EnvironmentError::MachineUnlabelled(id.clone()))?;
        if machine.state == MachineState::Stopped {
            self.runtime.start(&machine.id).await?;
        }
        self.prepare_workspace(id, false)?;
        let now = now_rfc3339();
        let row = EnvironmentRecord {
            id: id.clone(),
            organisation: principal.organisation.clone(),
            person: principal.person.clone(),
            fingerprint: fingerprint.to_owned(),
            setup_script: None,
            repository: None,
            image_digest: digest,
            setup_recorded: true,
            status: Status::Ready,
            status_detail: None,
            setup: None,
            created_at: now.clone(),
            updated_at: now,
            deleted_at: None,
            machine: machine.id,
        };
        self.insert_row(&row).await?;
        Ok(row)
    }
}
