//! A claimed pool machine made the environment's: its workspace moved, its labels rewritten.

use std::sync::Arc;

use crate::environments::{EnvironmentError, Environments};
use crate::store::EnvironmentRecord;

impl Environments {
    /// Binds the pool machine `row` names to `row`'s environment: its workspace becomes the
    /// environment's (a link left where the machine's mount points), and its labels say whose
    /// it is where the runtime can change them. Repeat-safe, so a start after a crash in the
    /// middle finishes it.
    pub(in crate::environments) async fn bind_pooled(
        &self,
        row: &EnvironmentRecord,
    ) -> Result<(), EnvironmentError> {
        self.move_pool_workspace(&row.machine, &row.id)?;
        self.runtime
            .claim(&row.machine, row.id.as_str(), &row.organisation)
            .await?;
        Ok(())
    }

    /// Labels the machine `row` claimed as `row`'s once its create has answered (containerd's
    /// label update is a write to its database, the slowest part of a claim). The store
    /// already says whose the machine is; the labels follow within milliseconds, under the
    /// environment's lock, so a delete or repeat that comes first acts on the store's truth.
    /// A failure is left to the next start, which finishes every claim the store names.
    pub(in crate::environments) fn label_claimed_later(self: &Arc<Self>, row: &EnvironmentRecord) {
        let this = self.clone();
        let (id, organisation, machine) = (
            row.id.clone(),
            row.organisation.clone(),
            row.machine.clone(),
        );
        let span = tracing::info_span!("label", environment.id = %id, organisation = %organisation);
        let label = async move {
            let _guard = this.locks.lock(&organisation, &id).await;
            match this.store.get(&organisation, &id).await {
                Ok(Some(row)) if row.deleted_at.is_none() && row.machine == machine => {}
                // Deleted (or made anew) meanwhile: nothing of this claim to label.
                _ => return,
            }
            if let Err(e) = this
                .runtime
                .claim(&machine, id.as_str(), &organisation)
                .await
            {
                tracing::warn!(machine = %machine, error = %e, "cannot label a claimed pool machine; the next start does");
            }
        };
        self.tasks
            .spawn(tracing::Instrument::instrument(label, span));
    }
}
