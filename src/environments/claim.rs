//! A create served from the pool: a started machine taken, recorded as the environment's and
//! bound to it, so that no machine starts while the caller waits. Only creates without a
//! repository claim one (a clone must be done before the environment's machine exists).

use std::sync::Arc;

use narya_runtimes::MachineState;
use tokio::sync::broadcast;

use super::create::{Announce, PROGRESS_BACKLOG};
use super::pool::Pooled;
use super::{CreateRequest, EnvironmentError, Environments, Progress, PROVISIONING};
use crate::auth::Principal;
use crate::model::{now_rfc3339, SetupStep, Status};
use crate::store::EnvironmentRecord;

impl Environments {
    /// A running pool machine for one create, or `None` (the pool is empty, or what it held
    /// has stopped): the create then makes its own machine. Machines found stopped are removed.
    pub(super) async fn take_pooled(&self) -> Option<Pooled> {
        while let Some(pooled) = self.pool.take() {
            match self.runtime.inspect(&pooled.name).await {
                Ok(MachineState::Running) => return Some(pooled),
                Ok(state @ (MachineState::Stopped | MachineState::Missing)) => {
                    tracing::info!(machine = %pooled.name, ?state, "a pool machine is not running; not serving it");
                    self.discard_pooled(&pooled.name).await;
                }
                // The runtime cannot say, or says it is between states (a shim slow under load,
                // an engine restarting it): the machine stays pooled (the pool looks at it
                // again; removing it could remove a healthy one) and this create goes the usual
                // way, which meets the runtime's answer itself.
                other => {
                    match other {
                        Err(e) => {
                            tracing::debug!(machine = %pooled.name, error = %e, "cannot look at a pool machine")
                        }
                        Ok(state) => {
                            tracing::debug!(machine = %pooled.name, ?state, "a pool machine between states")
                        }
                    }
                    let name = pooled.name.clone();
                    if !self.pool.put_back(pooled) {
                        self.discard_pooled(&name).await;
                    }
                    return None;
                }
            }
        }
        None
    }

    /// The create flow for an identifier nobody holds, on pool machine `pooled`.
    ///
    /// Without setup, the row goes into the store recorded and `ready`, naming the machine, in
    /// one write, before the machine is bound (its workspace moved; its labels right after the
    /// answer): a daemon that dies at any point leaves either no environment (and the machine,
    /// still pooled, is found again) or one recorded with that machine, whose binding the next
    /// start finishes. With setup, the row is unrecorded while the setup runs, as in any create.
    pub(super) async fn provision_pooled(
        self: &Arc<Self>,
        principal: &Principal,
        request: &CreateRequest,
        pooled: Pooled,
        announce: Option<Announce>,
    ) -> Result<EnvironmentRecord, EnvironmentError> {
        let id = &request.id;
        tracing::info!(machine = %pooled.name, digest = %pooled.image.digest, "claiming a pool machine");
        let now = now_rfc3339();
        let setup_less = request.setup.is_none();
        let mut row = EnvironmentRecord {
            id: id.clone(),
            organisation: principal.organisation.clone(),
            person: principal.person.clone(),
            fingerprint: request.fingerprint(),
            setup_script: request.setup.clone(),
            repository: None,
            image_digest: pooled.image.digest.clone(),
            setup_recorded: setup_less,
            status: if setup_less {
                Status::Ready
            } else {
                Status::Degraded
            },
            status_detail: (!setup_less).then(|| PROVISIONING.to_owned()),
            setup: None,
            created_at: now.clone(),
            updated_at: now,
            deleted_at: None,
            machine: pooled.name.clone(),
        };
        if let Err(e) = self.insert_row(&row).await {
            // Nothing names the machine: it is still a pool machine, of nobody.
            self.discard_pooled(&pooled.name).await;
            self.metrics.create_ended(None);
            return Err(e);
        }
        if setup_less {
            let moved = self.move_pool_workspace(&row.machine, &row.id);
            self.metrics
                .create_ended(moved.as_ref().ok().map(|()| row.status));
            return match moved {
                Ok(()) => {
                    tracing::info!("environment recorded on a pool machine");
                    self.label_claimed_later(&row);
                    Ok(row)
                }
                Err(e) => {
                    // Degraded while the undo runs, as any create is: a machine that cannot be
                    // removed leaves the row unrecorded, never `ready`.
                    row.setup_recorded = false;
                    row.status = Status::Degraded;
                    self.undo(&mut row, &e).await;
                    Err(e)
                }
            };
        }
        let (events, from_the_start) = broadcast::channel(PROGRESS_BACKLOG);
        let in_flight = self.locks.in_flight(
            id,
            &principal.organisation,
            request.setup.clone(),
            None,
            &events,
        );
        match announce {
            Some(announce) => {
                let _ = announce.send(from_the_start);
            }
            None => drop(from_the_start),
        }
        let made = self.set_up_pooled(&mut row, request, &events).await;
        self.metrics
            .create_ended(made.as_ref().ok().map(|()| row.status));
        match made {
            Ok(()) => {
                tracing::info!(
                    status = row.status.as_str(),
                    "environment recorded on a pool machine"
                );
                in_flight.land(Ok(row.clone()));
                Ok(row)
            }
            Err(e) => {
                let shared = Arc::new(e);
                in_flight.land(Err(shared.clone()));
                Err(EnvironmentError::unshare(shared))
            }
        }
    }

    /// Binds the claimed machine, runs the setup in it and records the outcome, or takes back
    /// what it did (the machine is removed, never returned to the pool).
    async fn set_up_pooled(
        &self,
        row: &mut EnvironmentRecord,
        request: &CreateRequest,
        events: &broadcast::Sender<Progress>,
    ) -> Result<(), EnvironmentError> {
        let made = async {
            let _ = events.send(Progress::started("image"));
            let _ = events.send(Progress::finished("image"));
            self.store
                .set_step(&row.organisation, &row.id, SetupStep::Setup, &now_rfc3339())
                .await?;
            let _ = events.send(Progress::started("machine"));
            self.bind_pooled(row).await?;
            let _ = events.send(Progress::finished("machine"));
            self.setup_step(&row.machine, request, events).await
        }
        .await;
        self.record_made(row, made).await
    }
}
