//! The create flow: serialised per identifier, run in a task of its own so a client that goes
//! away cancels nothing, answering a repeat with what exists, adopting what an interrupted
//! create left, and never leaving a half-made environment looking healthy.

use std::sync::Arc;

use narya_runtimes::{ImageSource, MachineInfo, PinnedImage};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::answer::{CreateStream, Created, Differs, Joined, Outcome};
use super::clone::Cloned;
use super::prebuild::Shape;
use super::{machine_name, CreateRequest, EnvironmentError, Environments, Progress, PROVISIONING};
use crate::auth::Principal;
use crate::github;
use crate::model::{now_rfc3339, SetupState, SetupStep, Status};
use crate::organisation::CloneSource;
use crate::store::{EnvironmentRecord, SetupRecord};

/// How the status detail of a create whose undo the runtime refused begins; the reconciler
/// finishes such undos.
pub(super) const UNDO_PENDING: &str = "provisioning failed: ";

/// How many events a slow streaming reader may fall behind before it is let go: at most this
/// many output chunks (32 KiB each) are kept for a reader that stopped reading.
pub(super) const PROGRESS_BACKLOG: usize = 64;

/// Told once provisioning has started (the identifier is now held and the row inserted): the
/// events of the create from its beginning.
pub(super) type Announce = tokio::sync::oneshot::Sender<broadcast::Receiver<Progress>>;

impl Environments {
    /// Creates `request.id` for `principal`, or answers with the environment recorded under it.
    /// Runs in its own task: dropping the returned future does not stop provisioning.
    pub async fn create(
        self: &Arc<Self>,
        principal: Principal,
        request: CreateRequest,
    ) -> Result<Created, EnvironmentError> {
        if let Some((_, joined)) = self.join(&principal, &request) {
            return joined.outcome().await;
        }
        self.start_create(principal, request, None)
            .await
            .map_err(EnvironmentError::task("create"))?
    }

    /// Like [`Environments::create`], answering as soon as provisioning has started, with its
    /// progress to watch. A repeat of a create still provisioning joins its progress from now
    /// on. A create answered without provisioning (a repeat, an adoption) or refused before it
    /// began is known at once.
    pub async fn create_streamed(
        self: &Arc<Self>,
        principal: Principal,
        request: CreateRequest,
    ) -> Result<CreateStream, EnvironmentError> {
        if let Some((events, joined)) = self.join(&principal, &request) {
            return Ok(CreateStream {
                new: false,
                differs: joined.differs,
                events: Some(events),
                outcome: Outcome::Joined(Box::new(joined)),
                fell_behind: None,
            });
        }
        let (announce, announced) = tokio::sync::oneshot::channel();
        let task = self.start_create(principal, request, Some(announce));
        match announced.await {
            Ok(events) => Ok(CreateStream {
                new: true,
                differs: Differs::default(),
                events: Some(events),
                outcome: Outcome::Running(task),
                fell_behind: None,
            }),
            Err(_) => {
                let created = task.await.map_err(EnvironmentError::task("create"))??;
                Ok(CreateStream {
                    new: created.is_new(),
                    differs: created.differs(),
                    events: None,
                    outcome: Outcome::Known(Box::new(created)),
                    fell_behind: None,
                })
            }
        }
    }

    fn start_create(
        self: &Arc<Self>,
        principal: Principal,
        request: CreateRequest,
        announce: Option<Announce>,
    ) -> JoinHandle<Result<Created, EnvironmentError>> {
        let this = self.clone();
        let span = tracing::info_span!("create", environment.id = %request.id, organisation = %principal.organisation);
        self.tasks.spawn(
            async move { this.create_serialised(principal, request, announce).await }
                .instrument(span),
        )
    }

    /// The create of `request.id` provisioning now for `principal`'s organisation, joined: its
    /// progress from now on, and its outcome. A repeat waits for it and answers with that
    /// outcome, never provisioning a second time.
    fn join(
        &self,
        principal: &Principal,
        request: &CreateRequest,
    ) -> Option<(broadcast::Receiver<Progress>, Joined)> {
        let flight = self.locks.flight(&principal.organisation, &request.id)?;
        if flight.organisation != principal.organisation {
            return None;
        }
        let joined = Joined {
            id: request.id.clone(),
            outcome: flight.outcome,
            differs: Differs::between(flight.setup.as_deref(), flight.repository.as_ref(), request),
        };
        Some((flight.events.subscribe(), joined))
    }

    async fn create_serialised(
        self: &Arc<Self>,
        principal: Principal,
        request: CreateRequest,
        announce: Option<Announce>,
    ) -> Result<Created, EnvironmentError> {
        let id = &request.id;
        let _guard = self.locks.lock(&principal.organisation, id).await;
        if let Some(holder) = self.store.holder(id).await? {
            if holder != principal.organisation {
                return Err(EnvironmentError::IdInUse(id.clone()));
            }
        }
        let fingerprint = request.fingerprint();
        let carries_setup = request.setup.is_some() || request.repository.is_some();
        match self.store.get(&principal.organisation, id).await? {
            // Deleted: its record answered `gone` until now; this create makes a new one.
            Some(row) if row.deleted_at.is_some() => {
                self.store.delete(&row.organisation, &row.id).await?;
            }
            Some(row) if row.setup_recorded => {
                let differs = Differs::of(&row, &request);
                tracing::info!(
                    ?differs,
                    "repeat of a recorded create: answering as it stands"
                );
                return Ok(Created::Existing(row, differs));
            }
            Some(_) if carries_setup => {
                return Err(EnvironmentError::SetupUnrecorded(id.clone()));
            }
            Some(row) => {
                let row = self.adopt_row(row, &fingerprint).await?;
                return Ok(Created::Existing(row, Differs::default()));
            }
            None => {}
        }
        // The store knows no such environment of ours; the runtime may still hold a machine
        // of that identifier (the store was lost). Another organisation's is never adopted.
        let machines = self.runtime.machines_of(id.as_str()).await?;
        let ours = |m: &MachineInfo| m.organisation.as_deref() == Some(&principal.organisation);
        if let Some(foreign) = machines.iter().find(|m| !ours(m)) {
            tracing::warn!(machine = %foreign.id, "the identifier is held by another organisation's machine");
            return Err(EnvironmentError::IdInUse(id.clone()));
        }
        match machines.into_iter().next() {
            None => self
                .provision(&principal, &request, announce)
                .await
                .map(Created::New),
            Some(_) if carries_setup => Err(EnvironmentError::SetupUnrecorded(id.clone())),
            Some(machine) => self
                .adopt_orphan(&principal, id, machine, &fingerprint)
                .await
                .map(|row| Created::Existing(row, Differs::default())),
        }
    }

    /// The create flow proper, for an identifier nobody holds: pin, record, make, set up, record.
    async fn provision(
        self: &Arc<Self>,
        principal: &Principal,
        request: &CreateRequest,
        announce: Option<Announce>,
    ) -> Result<EnvironmentRecord, EnvironmentError> {
        // Before anything is made, not even a row: refusals cost nothing to undo.
        self.admit(principal).await?;
        let clone = match &request.repository {
            Some(repository) => Some(self.check_repository(principal, repository).await?),
            None => None,
        };
        // A repository's clone must be done before the environment's machine exists: such a
        // create never takes a started one. Nor does a setup that may have a prebuild.
        let may_be_prebuilt = self.prebuilds_on() && request.setup.is_some();
        if clone.is_none() && !may_be_prebuilt {
            if let Some(pooled) = self.take_pooled().await {
                return self
                    .provision_pooled(principal, request, pooled, announce)
                    .await;
            }
        }
        let id = &request.id;
        // Subscribed now so the image events reach the announced stream too.
        let (events, from_the_start) = broadcast::channel(PROGRESS_BACKLOG);
        let _ = events.send(Progress::started("image"));
        let image = ImageSource {
            reference: self.config.image.reference.clone(),
            pinned: None,
        };
        let pinned = self
            .metrics
            .create_step("image", self.runtime.ensure_image(&image));
        let pinned = match pinned.await {
            Ok(pinned) => pinned,
            Err(e) => {
                self.metrics.create_ended(None);
                return Err(e.into());
            }
        };
        tracing::info!(digest = %pinned.digest, "image pinned");
        if self.prebuilds_on() {
            self.retire_prebuilds(&pinned.digest).await;
        }
        let now = now_rfc3339();
        let mut row = EnvironmentRecord {
            id: id.clone(),
            organisation: principal.organisation.clone(),
            person: principal.person.clone(),
            fingerprint: request.fingerprint(),
            setup_script: request.setup.clone(),
            repository: request.repository.clone(),
            image_digest: pinned.digest.clone(),
            setup_recorded: false,
            status: Status::Degraded,
            status_detail: Some(PROVISIONING.to_owned()),
            setup: None,
            created_at: now.clone(),
            updated_at: now,
            deleted_at: None,
            machine: machine_name(&principal.organisation, id),
        };
        let _ = events.send(Progress::finished("image"));
        self.insert_row(&row).await?;
        let in_flight = self.locks.in_flight(
            id,
            &principal.organisation,
            request.setup.clone(),
            request.repository.clone(),
            &events,
        );
        match announce {
            Some(announce) => {
                let _ = announce.send(from_the_start);
            }
            // Nobody streams this create: holding its first receiver would keep a backlog of
            // every event (the whole setup output, up to the channel's capacity) until it ends.
            None => drop(from_the_start),
        }
        let made = self.make(&mut row, request, clone, pinned, &events).await;
        self.metrics
            .create_ended(made.as_ref().ok().map(|()| row.status));
        match made {
            Ok(()) => {
                tracing::info!(status = row.status.as_str(), "environment recorded");
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

    /// Makes what `row` records (workspace, clone, machine, setup) and records the outcome, or
    /// takes back what it made.
    async fn make(
        &self,
        row: &mut EnvironmentRecord,
        request: &CreateRequest,
        clone: Option<CloneSource>,
        pinned: PinnedImage,
        events: &broadcast::Sender<Progress>,
    ) -> Result<(), EnvironmentError> {
        let id = &request.id;
        let organisation = &row.organisation.clone();
        let made = async {
            let workspace = self.prepare_workspace(id, true)?;
            // With prebuilds on, a setup's outcome is kept, and a create of the same key uses it.
            let script = request.setup.as_deref().filter(|_| self.prebuilds_on());
            let mut commit = None;
            if let Some(clone) = &clone {
                self.store
                    .set_step(organisation, id, SetupStep::Clone, &now_rfc3339())
                    .await?;
                let _ = events.send(Progress::started("clone"));
                let lookup = script.map(|script| (&*row, script));
                let cloned =
                    self.run_clone(organisation, id, &pinned, &workspace, clone, lookup, events);
                let cloned = self.metrics.create_step("clone", cloned).await?;
                let _ = events.send(Progress::finished("clone"));
                match cloned {
                    Cloned::Prebuilt(prebuild) => {
                        self.store
                            .set_step(organisation, id, SetupStep::Setup, &now_rfc3339())
                            .await?;
                        return self
                            .provision_prebuilt(row, *prebuild, pinned, workspace, events)
                            .await
                            .map(Some);
                    }
                    // No machine is made after a failed clone: nothing of this environment
                    // runs, so nothing can look healthy. The reconciler leaves unusable rows
                    // alone, exec refuses them, and delete removes a missing machine as a no-op.
                    Cloned::Done(record) if record.state != SetupState::Succeeded => {
                        return Ok(Some(record))
                    }
                    Cloned::Done(_) => commit = github::checked_out_commit(&workspace),
                }
            }
            // A clone whose commit cannot be told makes no prebuild: its key would be a guess.
            let key = script
                .filter(|_| clone.is_none() || commit.is_some())
                .map(|script| {
                    self.prebuild_key(&Shape {
                        organisation,
                        digest: &pinned.digest,
                        script,
                        source: clone
                            .as_ref()
                            .zip(commit.as_deref())
                            .map(|(clone, commit)| (&clone.repository, commit)),
                    })
                });
            if let (None, Some(key)) = (&clone, &key) {
                if let Some(prebuild) = self.take_prebuild(row, key).await? {
                    self.store
                        .set_step(organisation, id, SetupStep::Setup, &now_rfc3339())
                        .await?;
                    return self
                        .provision_prebuilt(row, prebuild, pinned, workspace, events)
                        .await
                        .map(Some);
                }
            }
            self.store
                .set_step(organisation, id, SetupStep::Setup, &now_rfc3339())
                .await?;
            let _ = events.send(Progress::started("machine"));
            let spec = self.machine_spec(row, pinned, workspace);
            // The pool waits while creates start machines: it never competes with one.
            let starting = self.pool.starting();
            let machine = self.runtime.create_machine(&spec);
            self.metrics.create_step("machine", machine).await?;
            drop(starting);
            let _ = events.send(Progress::finished("machine"));
            tracing::info!("machine started");
            let setup = self.setup_step(&row.machine, request, events).await?;
            if let (Some(key), Some(record)) = (&key, &setup) {
                // Only a setup that succeeded, in a machine this create made, is kept; nothing
                // runs in the machine until the create answers, so what is kept is the setup's.
                if record.state == SetupState::Succeeded {
                    self.make_prebuild(row, key, record).await;
                }
            }
            Ok(setup)
        }
        .await;
        self.record_made(row, made).await
    }

    /// The last step of a create: `request`'s setup, if it has one, run in `machine`.
    pub(super) async fn setup_step(
        &self,
        machine: &str,
        request: &CreateRequest,
        events: &broadcast::Sender<Progress>,
    ) -> Result<Option<SetupRecord>, EnvironmentError> {
        let Some(script) = &request.setup else {
            return Ok(None);
        };
        let _ = events.send(Progress::started("setup"));
        let setup = self.run_setup(machine, script, events);
        let setup = self.metrics.create_step("setup", setup).await?;
        let _ = events.send(Progress::finished("setup"));
        Ok(Some(setup))
    }

    /// Records what a create made (`made`: its setup's outcome, if it had one), or takes back
    /// what it made when making failed.
    pub(super) async fn record_made(
        &self,
        row: &mut EnvironmentRecord,
        made: Result<Option<SetupRecord>, EnvironmentError>,
    ) -> Result<(), EnvironmentError> {
        let setup = match made {
            Ok(setup) => setup,
            Err(e) => {
                self.undo(row, &e).await;
                return Err(e);
            }
        };
        row.status = match &setup {
            Some(s) if s.state != SetupState::Succeeded => Status::Unusable,
            _ => Status::Ready,
        };
        row.status_detail = None;
        row.setup = setup;
        row.setup_recorded = true;
        row.updated_at = now_rfc3339();
        self.store.record(row).await?;
        Ok(())
    }

    /// Takes back a create that failed before its outcome was recorded. When the machine cannot
    /// be removed (the runtime went away), the row stays unrecorded, saying why, and the
    /// reconciler finishes the undo once the runtime answers.
    pub(super) async fn undo(&self, row: &mut EnvironmentRecord, cause: &EnvironmentError) {
        tracing::warn!(error = %cause, "provisioning failed; taking it back");
        match self.runtime.remove(&row.machine).await {
            Ok(()) => {
                if let Err(e) = self.remove_workspace(row) {
                    tracing::warn!(error = %e, "could not remove the workspace");
                }
                if let Err(e) = self.store.delete(&row.organisation, &row.id).await {
                    tracing::error!(error = %e, "could not delete the row of a failed create");
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "could not remove the machine of a failed create; leaving it unrecorded");
                row.status_detail = Some(format!("{UNDO_PENDING}{cause}"));
                row.updated_at = now_rfc3339();
                let _ = self.store.record(row).await;
            }
        }
    }
}
