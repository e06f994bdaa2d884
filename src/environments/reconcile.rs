//! Keeping statuses true: the store compared with the runtime at start-up and then every few
//! seconds. Stopped machines are started again, missing ones are `gone`, and an unreachable
//! runtime makes every environment `degraded` until it answers.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use narya_runtimes::{ErrorKind, MachineInfo, MachineState};

use super::Environments;
use crate::model::{now_rfc3339, Status};
use crate::store::EnvironmentRecord;

/// How often the runtime is compared with the store while it answers.
const POLL: Duration = Duration::from_secs(2);
/// How long to let a burst of runtime events arrive before looking.
const CHANGE_SETTLE: Duration = Duration::from_millis(100);
/// The longest wait between tries while it does not.
const BACKOFF_MAX: Duration = Duration::from_secs(4);

pub const RUNTIME_UNREACHABLE: &str =
    "the container runtime is not answering; the host keeps retrying";
const RESTARTING: &str = "the machine stopped; the host is starting it again";
const MISSING: &str =
    "the runtime no longer has this environment's machine; replace it or create a new one";
const INTERRUPTED: &str = "its creation was interrupted before the setup state was recorded; delete it and create it again";

impl Environments {
    /// Marks rows a previous daemon left provisioning: nothing is provisioning them now.
    pub async fn mark_interrupted(&self) -> Result<(), crate::store::StoreError> {
        for row in self.store.list_all().await? {
            if !row.setup_recorded && row.status_detail.as_deref() != Some(INTERRUPTED) {
                tracing::warn!(environment.id = %row.id, organisation = %row.organisation, "creation was interrupted by a daemon stop");
                self.store
                    .set_status(
                        &row.organisation,
                        &row.id,
                        Status::Unusable,
                        Some(INTERRUPTED),
                        &now_rfc3339(),
                    )
                    .await?;
            }
        }
        Ok(())
    }

    /// Compares store and runtime until the daemon stops: at once when the runtime reports a
    /// change to its machines, and every few seconds whatever it reports.
    pub async fn reconcile_forever(self: Arc<Self>) {
        use futures_util::StreamExt;
        let mut wait = POLL;
        let mut orphans_reported = HashSet::new();
        let mut changes = None;
        loop {
            wait = match self.reconcile_once(&mut orphans_reported).await {
                Ok(()) => POLL,
                Err(e) => {
                    tracing::warn!(error = %e, "reconciling failed; retrying");
                    changes = None;
                    (wait * 2).min(BACKOFF_MAX)
                }
            };
            if changes.is_none() {
                changes = self.runtime.changes().await.ok();
            }
            let nudged = match changes.as_mut() {
                Some(stream) => tokio::select! {
                    event = stream.next() => Some(event.is_some()),
                    _ = tokio::time::sleep(wait) => None,
                },
                None => {
                    tokio::time::sleep(wait).await;
                    None
                }
            };
            match nudged {
                // A burst of events (exit, delete, …) is one change: let it finish arriving.
                Some(true) => tokio::time::sleep(CHANGE_SETTLE).await,
                // The runtime stopped reporting: wait as usual, then look and subscribe again.
                Some(false) => {
                    changes = None;
                    tokio::time::sleep(wait).await;
                }
                None => {}
            }
        }
    }

    /// One comparison. An unreachable runtime is not an error of the pass: it is a status.
    pub async fn reconcile_once(
        &self,
        orphans_reported: &mut HashSet<String>,
    ) -> Result<(), String> {
        let rows = self.store.list_all().await.map_err(|e| e.to_string())?;
        let machines = match self.runtime.list().await {
            Ok(machines) => machines,
            Err(e) if e.kind() == ErrorKind::Unavailable => {
                for row in rows
                    .iter()
                    .filter(|r| r.setup_recorded && r.status != Status::Unusable)
                {
                    self.settle(row, Status::Degraded, Some(RUNTIME_UNREACHABLE))
                        .await;
                }
                return Err(format!("the runtime is not answering: {e}"));
            }
            Err(e) => return Err(e.to_string()),
        };
        let by_id: HashMap<&str, &MachineInfo> =
            machines.iter().map(|m| (m.id.as_str(), m)).collect();
        for row in &rows {
            if !row.setup_recorded || row.status == Status::Unusable {
                continue;
            }
            match by_id.get(row.id.as_str()).map(|m| m.state) {
                Some(MachineState::Running) => self.settle(row, Status::Ready, None).await,
                Some(_) => {
                    self.settle(row, Status::Degraded, Some(RESTARTING)).await;
                    match self.runtime.start(row.id.as_str()).await {
                        Ok(()) => {
                            tracing::info!(environment.id = %row.id, "stopped machine started again");
                            // Judged against the row as it now reads (degraded), not as this
                            // pass found it (ready), or the restart would stay unrecorded.
                            let restarting = EnvironmentRecord {
                                status: Status::Degraded,
                                status_detail: Some(RESTARTING.to_owned()),
                                ..row.clone()
                            };
                            self.settle(&restarting, Status::Ready, None).await;
                        }
                        Err(e) => {
                            tracing::warn!(environment.id = %row.id, error = %e, "could not start a stopped machine; retrying")
                        }
                    }
                }
                None => self.settle(row, Status::Gone, Some(MISSING)).await,
            }
        }
        let known: HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        for machine in &machines {
            if !known.contains(machine.id.as_str()) && orphans_reported.insert(machine.id.clone()) {
                tracing::warn!(machine = %machine.id, digest = ?machine.digest.as_ref().map(ToString::to_string), "a Narya machine the store does not know; a create without setup of this id adopts it");
            }
        }
        Ok(())
    }

    /// Writes `status` for `row` if it changed and no create, delete or replace holds the id.
    async fn settle(&self, row: &EnvironmentRecord, status: Status, detail: Option<&str>) {
        if row.status == status && row.status_detail.as_deref() == detail {
            return;
        }
        let Some(_guard) = self.locks.try_lock(&row.id) else {
            return;
        };
        // Re-read under the lock: the row may have changed since the pass began.
        let Ok(Some(current)) = self.store.get(&row.organisation, &row.id).await else {
            return;
        };
        if !current.setup_recorded
            || current.status == Status::Unusable
            || (current.status == status && current.status_detail.as_deref() == detail)
        {
            return;
        }
        tracing::info!(environment.id = %row.id, from = current.status.as_str(), to = status.as_str(), detail, "status changed");
        if let Err(e) = self
            .store
            .set_status(&row.organisation, &row.id, status, detail, &now_rfc3339())
            .await
        {
            tracing::error!(environment.id = %row.id, error = %e, "could not record a status change");
        }
    }
}
