//! The pool at start-up: the machines a previous daemon left, found by label, pooled again,
//! bound to the environment that claimed them, or removed.

use std::collections::{HashMap, VecDeque};

use narya_runtimes::MachineState;

use crate::environments::{EnvironmentError, Environments};
use crate::store::EnvironmentSummary;

impl Environments {
    /// Finds the pool machines a previous daemon left, by label: a claim it did not finish is
    /// finished (the store names the machine: it is that environment's, never pooled again);
    /// an unclaimed machine of the image the next create would get, made for this
    /// configuration and running, is pooled; any other is removed, and so is every pool
    /// workspace without a machine.
    pub(in crate::environments) async fn recover_pool(&self) -> Result<(), EnvironmentError> {
        let rows = self.store.summaries().await?;
        let claimed: HashMap<&str, &EnvironmentSummary> =
            rows.iter().map(|r| (r.machine.as_str(), r)).collect();
        let mut unclaimed = Vec::new();
        for machine in self.runtime.list().await? {
            let Some(configuration) = &machine.pool else {
                continue;
            };
            if !self.pool.owns(configuration) {
                continue;
            }
            match claimed.get(machine.id.as_str()) {
                // Never pooled again, bound or not. Finished before the image is resolved, so
                // a registry that does not answer leaves no environment half-bound.
                Some(row) => self.finish_claim(row).await,
                None => unclaimed.push(machine),
            }
        }
        let image = match self.pool.size {
            0 => None,
            _ => Some(self.runtime.ensure_image(&self.unpinned_image()).await?),
        };
        let mut kept = VecDeque::new();
        for machine in unclaimed {
            // A link where the workspace should be: a claim whose environment the store no
            // longer names (its workspace is another's), never to be served.
            let own_workspace = std::fs::symlink_metadata(self.pool_workspace(&machine.id))
                .is_ok_and(|meta| meta.is_dir());
            let fresh = machine.pool.as_ref() == Some(&self.pool.configuration)
                && image.as_ref().map(|i| &i.digest) == machine.digest.as_ref()
                && machine.state == MachineState::Running
                && own_workspace
                && kept.len() < self.pool.size;
            if fresh {
                tracing::info!(machine = %machine.id, "a pool machine found again");
                kept.push_back(machine.id);
            } else {
                tracing::info!(machine = %machine.id, state = ?machine.state, "removing a stale pool machine");
                self.discard_pooled(&machine.id).await;
            }
        }
        self.sweep_pool_workspaces(&kept, &claimed);
        let mut ready = self.pool.lock();
        ready.image = image;
        ready.machines = kept;
        Ok(())
    }

    /// Finishes the claim of the pool machine `row` names, under the environment's lock and
    /// only while the store still names that machine for it (a delete and a create of the
    /// identifier may have come since `row` was read). A binding that fails is tried again at
    /// the next start: the environment's record names the machine either way.
    async fn finish_claim(&self, row: &EnvironmentSummary) {
        let _guard = self.locks.lock(&row.organisation, &row.id).await;
        let current = match self.store.get(&row.organisation, &row.id).await {
            Ok(Some(now)) if now.deleted_at.is_none() && now.machine == row.machine => now,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(environment.id = %row.id, error = %e, "cannot read the environment of a claimed pool machine");
                return;
            }
        };
        if let Err(e) = self.bind_pooled(&current).await {
            tracing::warn!(environment.id = %row.id, machine = %row.machine, error = %e, "cannot finish the claim of a pool machine");
        }
    }

    /// Removes what `.pool` holds for no kept machine and no recorded environment: workspaces
    /// of machines that went, links of environments that were deleted.
    fn sweep_pool_workspaces(
        &self,
        kept: &VecDeque<String>,
        claimed: &HashMap<&str, &EnvironmentSummary>,
    ) {
        let Ok(entries) = std::fs::read_dir(self.pool_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if kept.contains(&name) || claimed.contains_key(name.as_str()) {
                continue;
            }
            let path = entry.path();
            if let Err(e) = self.trash.discard(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a pool workspace");
            }
        }
    }
}
