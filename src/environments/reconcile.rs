//! Keeping statuses true: the store compared with the runtime at start-up and then every few
//! seconds, and a machine the runtime reports changed looked at alone at once. Stopped machines are started again, missing ones are `gone`, and an unreachable
//! runtime makes every environment `degraded` until it answers.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use narya_runtimes::{Change, ErrorKind, MachineInfo, MachineState};
use tokio::time::Instant;

use super::create::UNDO_PENDING;
use super::delete::unix_now;
use super::Environments;
use crate::model::{now_rfc3339, SetupState, SetupStep, Status};
use crate::store::{EnvironmentRecord, EnvironmentSummary, SetupRecord};

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
/// The output of a step the host stopped during.
const INTERRUPTED_OUTPUT: &str = "narya: the host stopped during this step, so nobody can say what it left behind; delete this environment and create it again\n";

/// What a burst of runtime changes asks for.
enum Burst {
    /// A look at the machines it named.
    Named,
    /// A full pass: something changed that the runtime did not name.
    Unnamed,
    /// The stream ended.
    Ended,
}

/// Gathers the burst that `first` begins (an exit, a delete, … arrive together) for a moment,
/// the machines it names into `changed`.
async fn burst(
    stream: &mut BoxStream<'static, Change>,
    first: Option<Change>,
    changed: &mut BTreeSet<String>,
) -> Burst {
    use futures_util::StreamExt;
    let settled = Instant::now() + CHANGE_SETTLE;
    let mut burst = Burst::Named;
    let mut next = first;
    loop {
        match next {
            Some(Change::Machine(machine)) => {
                changed.insert(machine);
            }
            Some(Change::Unknown) => burst = Burst::Unnamed,
            None => return Burst::Ended,
        }
        match tokio::time::timeout_at(settled, stream.next()).await {
            Ok(change) => next = change,
            Err(_) => return burst,
        }
    }
}

impl Environments {
    /// Records the creates and replaces a previous daemon left under way as interrupted in the
    /// step they were in: nothing is provisioning them now, and nobody can say what they left.
    pub async fn mark_interrupted(&self) -> Result<(), crate::store::StoreError> {
        for row in self.store.summaries().await? {
            let under_way = !row.setup_recorded && !row.has_setup;
            if under_way {
                tracing::warn!(environment.id = %row.id, organisation = %row.organisation, "creation was interrupted by a daemon stop");
                self.store
                    .record_interrupted(
                        &row.organisation,
                        &row.id,
                        INTERRUPTED,
                        INTERRUPTED_OUTPUT,
                        &now_rfc3339(),
                    )
                    .await?;
            }
        }
        Ok(())
    }

    /// Compares store and runtime until the daemon stops: a machine the runtime reports
    /// changed is looked at alone (one state call) at once, and every few seconds, whatever it
    /// reports, all of them are (the floor, and what a change it cannot name asks for).
    pub async fn reconcile_forever(self: Arc<Self>) {
        use futures_util::StreamExt;
        let mut wait = POLL;
        let mut orphans_reported = HashSet::new();
        let mut changes = None;
        // Subscribing is tried once a full pass at most: a runtime that is down ends a
        // subscription at once, and must not be asked again in a tight loop.
        let mut subscribe = true;
        let mut swept = false;
        let mut full_pass_at = Instant::now();
        let mut changed = BTreeSet::new();
        loop {
            if Instant::now() >= full_pass_at {
                changed.clear();
                let passed = self.reconcile_once(&mut orphans_reported).await;
                self.metrics.reconciled(passed.is_ok());
                wait = match passed {
                    Ok(()) => {
                        // Once the runtime answers: what earlier daemons left running goes.
                        if !swept {
                            swept = self.sweep_earlier_runs().await;
                            if swept && self.prebuilds_on() {
                                self.recover_prebuilds().await;
                            }
                        }
                        POLL
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reconciling failed; retrying");
                        changes = None;
                        (wait * 2).min(BACKOFF_MAX)
                    }
                };
                full_pass_at = Instant::now() + wait;
                subscribe = true;
            }
            if !changed.is_empty() {
                let passed = self.reconcile_machines(&std::mem::take(&mut changed)).await;
                self.metrics.reconciled(passed.is_ok());
                if let Err(e) = passed {
                    tracing::warn!(error = %e, "cannot look at the machines that changed; looking at all of them");
                    full_pass_at = Instant::now();
                    continue;
                }
            }
            if changes.is_none() && subscribe {
                subscribe = false;
                changes = self.runtime.changes().await.ok();
            }
            let Some(stream) = changes.as_mut() else {
                tokio::time::sleep_until(full_pass_at).await;
                continue;
            };
            let first = tokio::select! {
                change = stream.next() => change,
                _ = tokio::time::sleep_until(full_pass_at) => continue,
            };
            match burst(stream, first, &mut changed).await {
                Burst::Named => {}
                Burst::Unnamed => full_pass_at = Instant::now(),
                // The runtime stopped reporting: the next full pass looks, then subscribes again.
                Burst::Ended => changes = None,
            }
        }
    }

    /// Looks at machine `machine` alone, when the runtime reported it changed: one state call
    /// if it serves an environment the store knows, none otherwise (a throwaway, an orphan:
    /// the full pass reports those). Errors: the store or the runtime did not answer.
    pub async fn reconcile_machine(&self, machine: &str) -> Result<(), String> {
        self.reconcile_machines(&BTreeSet::from([machine.to_owned()]))
            .await
    }

    /// As [`Environments::reconcile_machine`], for each of `machines`: one read of the store,
    /// and one state call for each machine it knows.
    async fn reconcile_machines(&self, machines: &BTreeSet<String>) -> Result<(), String> {
        let rows = self.store.summaries().await.map_err(|e| e.to_string())?;
        let mut failed = None;
        for row in rows.iter().filter(|r| {
            machines.contains(&r.machine) && r.setup_recorded && r.status != Status::Unusable
        }) {
            if let Err(e) = self.look_at(row).await {
                failed = Some(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// One comparison. An unreachable runtime is not an error of the pass: it is a status.
    pub async fn reconcile_once(
        &self,
        orphans_reported: &mut HashSet<String>,
    ) -> Result<(), String> {
        let retention = self.config.environment.gone_retention.0.as_secs();
        let expired = unix_now().saturating_sub(i64::try_from(retention).unwrap_or(i64::MAX));
        match self.store.purge_deleted(expired).await {
            Ok(0) => {}
            Ok(purged) => {
                tracing::info!(purged, "forgot deleted environments past their retention")
            }
            Err(e) => return Err(e.to_string()),
        }
        // Deleted environments are not among them: nothing of theirs is left to judge.
        let rows = self.store.summaries().await.map_err(|e| e.to_string())?;
        let machines = match self.runtime.list().await {
            Ok(machines) => machines,
            Err(e) if e.kind() == ErrorKind::Unavailable => {
                // `gone` stays gone: a runtime coming back does not bring a lost machine back.
                for row in rows.iter().filter(|r| {
                    r.setup_recorded && r.status != Status::Unusable && r.status != Status::Gone
                }) {
                    self.settle(row, Status::Degraded, Some(RUNTIME_UNREACHABLE))
                        .await;
                }
                return Err(format!("the runtime is not answering: {e}"));
            }
            Err(e) => return Err(e.to_string()),
        };
        self.sweep_throwaways().await;
        let by_name: HashMap<&str, &MachineInfo> =
            machines.iter().map(|m| (m.id.as_str(), m)).collect();
        for row in rows.iter().filter(|r| {
            !r.setup_recorded
                && r.status_detail
                    .as_deref()
                    .is_some_and(|d| d.starts_with(UNDO_PENDING))
        }) {
            self.finish_undo(row).await;
        }
        for row in &rows {
            if !row.setup_recorded || row.status == Status::Unusable {
                continue;
            }
            match by_name.get(row.machine.as_str()).map(|m| m.state) {
                Some(MachineState::Running) => self.settle(row, Status::Ready, None).await,
                // Nobody can tell right now (a busy shim): asked again on the next pass.
                Some(MachineState::Unknown) => {}
                Some(MachineState::Stopped | MachineState::Missing) => {
                    if let Err(e) = self.look_at(row).await {
                        tracing::warn!(environment.id = %row.id, error = %e, "cannot confirm a stopped machine; asking again later");
                    }
                }
                None => {
                    if row.status == Status::Gone || self.release_lost(row).await {
                        self.settle(row, Status::Gone, Some(MISSING)).await
                    }
                }
            }
        }
        let known: HashSet<&str> = rows.iter().map(|r| r.machine.as_str()).collect();
        for machine in &machines {
            // A pool machine serves nobody until a create claims it (and the store names it).
            let pooled = machine.pool.is_some() && machine.environment.is_none();
            if !pooled
                && !known.contains(machine.id.as_str())
                && orphans_reported.insert(machine.id.clone())
            {
                tracing::warn!(machine = %machine.id, digest = ?machine.digest.as_ref().map(ToString::to_string), "a Narya machine the store does not know; a create without setup of this id adopts it");
            }
        }
        Ok(())
    }

    /// Finishes taking back a create whose undo the runtime refused, unless something holds the
    /// identifier: the machine removed, and the record `unusable` with the cause.
    async fn finish_undo(&self, row: &EnvironmentSummary) {
        let Some(_guard) = self.locks.try_lock(&row.organisation, &row.id) else {
            return;
        };
        let Ok(Some(mut current)) = self.store.get(&row.organisation, &row.id).await else {
            return;
        };
        let Some(cause) = current
            .status_detail
            .as_deref()
            .filter(|_| !current.setup_recorded)
            .and_then(|d| d.strip_prefix(UNDO_PENDING))
            .map(str::to_owned)
        else {
            return;
        };
        if let Err(e) = self.runtime.remove(&row.machine).await {
            tracing::warn!(environment.id = %row.id, error = %e, "still cannot take back a failed create; retrying");
            return;
        }
        if let Err(e) = self.remove_workspace(&current) {
            tracing::warn!(environment.id = %row.id, error = %e, "could not remove the workspace of a failed create");
        }
        let now = now_rfc3339();
        current.setup = Some(SetupRecord {
            state: SetupState::Failed,
            step: SetupStep::Setup,
            exit_code: None,
            output: format!("narya: provisioning failed and was taken back: {cause}\n"),
            output_truncated: false,
            started_at: current.created_at.clone(),
            finished_at: now.clone(),
            prebuilt_at: None,
        });
        current.setup_recorded = true;
        current.status = Status::Unusable;
        current.status_detail = Some(format!("provisioning failed: {cause}"));
        current.updated_at = now;
        match self.store.record(&current).await {
            Ok(()) => {
                tracing::info!(environment.id = %row.id, "took back a failed create; it reads unusable")
            }
            Err(e) => {
                tracing::error!(environment.id = %row.id, error = %e, "could not record a taken-back create")
            }
        }
    }

    /// Writes `status` for `row` if it changed and no create, delete or replace holds the id.
    async fn settle(&self, row: &EnvironmentSummary, status: Status, detail: Option<&str>) {
        if row.status == status && row.status_detail.as_deref() == detail {
            return;
        }
        let Some(_guard) = self.locks.try_lock(&row.organisation, &row.id) else {
            return;
        };
        if let Some(current) = self.settled_row(row).await {
            self.record_status(&current, status, detail).await;
        }
    }

    /// `row` as it reads now, under its lock, if the reconciler may still judge it: recorded,
    /// not unusable, not deleted.
    async fn settled_row(&self, row: &EnvironmentSummary) -> Option<EnvironmentRecord> {
        let current = self.store.get(&row.organisation, &row.id).await.ok()??;
        let judged = current.setup_recorded
            && current.status != Status::Unusable
            && current.deleted_at.is_none();
        judged.then_some(current)
    }

    /// Releases what the runtime still holds for a machine it lost (on containerd: its network
    /// namespace, interface and address), under the environment's lock and only while the
    /// runtime still answers that the machine is missing. Whether the row may be settled now.
    async fn release_lost(&self, row: &EnvironmentSummary) -> bool {
        let Some(_guard) = self.locks.try_lock(&row.organisation, &row.id) else {
            return false;
        };
        let Some(current) = self.settled_row(row).await else {
            return false;
        };
        match self.runtime.inspect(&current.machine).await {
            Ok(MachineState::Missing) => {}
            _ => return false,
        }
        match self.runtime.remove(&current.machine).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(environment.id = %row.id, error = %e, "could not release what a lost machine held; retrying");
                false
            }
        }
    }

    /// Looks at `row`'s machine under its environment's lock (so that no create, delete or
    /// replace races it) with one state call, and acts only on what the runtime is sure of: a
    /// machine seen stopped is started again, a missing one is `gone`, a running one `ready`;
    /// one whose state it cannot tell is left alone. A held lock leaves it to a later look.
    async fn look_at(&self, row: &EnvironmentSummary) -> Result<(), String> {
        let Some(_guard) = self.locks.try_lock(&row.organisation, &row.id) else {
            return Ok(());
        };
        let Some(current) = self.settled_row(row).await else {
            return Ok(());
        };
        match self.runtime.inspect(&current.machine).await {
            Ok(MachineState::Running) => self.record_status(&current, Status::Ready, None).await,
            Ok(MachineState::Stopped) => self.restart(current).await,
            Ok(MachineState::Missing) => {
                // What the runtime still holds for a lost machine (its network namespace,
                // address and interface on containerd) goes with it.
                if let Err(e) = self.runtime.remove(&current.machine).await {
                    tracing::warn!(environment.id = %row.id, error = %e, "could not release what a lost machine held; retrying");
                    return Ok(());
                }
                self.record_status(&current, Status::Gone, Some(MISSING))
                    .await
            }
            Ok(MachineState::Unknown) => {
                tracing::debug!(environment.id = %row.id, "state cannot be told; left alone");
            }
            Err(e) if e.kind() == ErrorKind::Unavailable => return Err(e.to_string()),
            Err(e) => {
                tracing::warn!(environment.id = %row.id, error = %e, "cannot look at a machine; asking again later");
            }
        }
        Ok(())
    }

    /// Starts `current`'s machine, seen stopped under its lock, again.
    async fn restart(&self, current: EnvironmentRecord) {
        self.record_status(&current, Status::Degraded, Some(RESTARTING))
            .await;
        match self.runtime.start(&current.machine).await {
            Ok(()) => {
                tracing::info!(environment.id = %current.id, "stopped machine started again");
                self.metrics.machine_restarted();
                let restarting = EnvironmentRecord {
                    status: Status::Degraded,
                    status_detail: Some(RESTARTING.to_owned()),
                    ..current
                };
                self.record_status(&restarting, Status::Ready, None).await;
            }
            Err(e) => {
                tracing::warn!(environment.id = %current.id, error = %e, "could not start a stopped machine; retrying")
            }
        }
    }

    /// Writes `status` for `current` (read under its lock) if it changed.
    async fn record_status(
        &self,
        current: &EnvironmentRecord,
        status: Status,
        detail: Option<&str>,
    ) {
        if current.status == status && current.status_detail.as_deref() == detail {
            return;
        }
        tracing::info!(environment.id = %current.id, from = current.status.as_str(), to = status.as_str(), detail, "status changed");
        if let Err(e) = self
            .store
            .set_status(
                &current.organisation,
                &current.id,
                status,
                detail,
                &now_rfc3339(),
            )
            .await
        {
            tracing::error!(environment.id = %current.id, error = %e, "could not record a status change");
        }
    }
}
