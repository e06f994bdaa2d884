//! What a create must find before anything is made for it: room on the host's disk (`[host]
//! reserve_disk`), and its organisation below its share of the host (`[organisation]
//! max_environments`, checked again atomically when the row is inserted).

use super::{EnvironmentError, Environments};
use crate::auth::Principal;
use crate::store::EnvironmentRecord;

impl Environments {
    /// Refuses a create that the host or the organisation has no room for.
    pub(super) async fn admit(&self, principal: &Principal) -> Result<(), EnvironmentError> {
        self.admit_on_disk()?;
        let max = self.config.organisation.max_environments;
        if self.store.recorded_count(&principal.organisation).await? >= max {
            return Err(EnvironmentError::AtEnvironmentLimit { max });
        }
        Ok(())
    }

    /// Refuses when the free space on `state_dir`'s filesystem is below `[host] reserve_disk`
    /// (and says so in the metrics either way).
    fn admit_on_disk(&self) -> Result<(), EnvironmentError> {
        let reserve = self.config.host.reserve_disk;
        let free = crate::disk::free_bytes(&self.config.state_dir).map_err(|source| {
            EnvironmentError::Workspace {
                path: self.config.state_dir.clone(),
                source,
            }
        })?;
        self.metrics.host_free(free);
        if free < reserve {
            tracing::warn!(
                free,
                reserve,
                "refusing a create: the host is short of disk"
            );
            return Err(EnvironmentError::HostShortOfDisk { free, reserve });
        }
        Ok(())
    }

    /// Inserts the row of a new environment: an identifier another organisation took first is
    /// in use, and an organisation at its share is refused.
    pub(super) async fn insert_row(&self, row: &EnvironmentRecord) -> Result<(), EnvironmentError> {
        self.store
            .insert_within(row, self.config.organisation.max_environments)
            .await
            .map_err(EnvironmentError::inserting(&row.id))
    }
}
