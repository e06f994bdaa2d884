//! The create flow: serialised per identifier, run in a task of its own so a client that goes
//! away cancels nothing, answering a repeat with what exists, adopting what an interrupted
//! create left, and never leaving a half-made environment looking healthy.

use std::sync::Arc;

use narya_runtimes::{ImageSource, MachineState};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::{CreateRequest, EnvironmentError, Environments, Progress, PROVISIONING};
use crate::auth::Principal;
use crate::model::{now_rfc3339, EnvironmentId, SetupState, Status};
use crate::store::EnvironmentRecord;

/// How many events a slow streaming reader may fall behind before it misses some.
const PROGRESS_BACKLOG: usize = 1024;

/// How a create ended: made now, or found as it already was.
#[derive(Debug)]
pub enum Created {
    New(EnvironmentRecord),
    Existing(EnvironmentRecord),
}

impl Created {
    /// Whether this create made the environment (`201`) rather than found it (`200`).
    pub fn is_new(&self) -> bool {
        matches!(self, Created::New(_))
    }

    pub fn record(&self) -> &EnvironmentRecord {
        match self {
            Created::New(record) | Created::Existing(record) => record,
        }
    }
}

/// Told once provisioning has started (the identifier is now held and the row inserted): the
/// events of the create from its beginning.
type Announce = tokio::sync::oneshot::Sender<broadcast::Receiver<Progress>>;

/// A create whose progress is watched as it happens: its steps and output, then its outcome.
pub struct CreateStream {
    new: bool,
    events: Option<broadcast::Receiver<Progress>>,
    outcome: Outcome,
}

enum Outcome {
    Running(JoinHandle<Result<Created, EnvironmentError>>),
    Known(Box<Created>),
}

impl CreateStream {
    /// Whether this create is making the environment (`201`) or joined one that exists or is
    /// being made (`200`).
    pub fn is_new(&self) -> bool {
        self.new
    }

    /// The next event, or `None` once provisioning has ended. A reader that fell behind misses
    /// some output; the final record still carries its tail.
    pub async fn next(&mut self) -> Option<Progress> {
        let events = self.events.as_mut()?;
        loop {
            match events.recv().await {
                Ok(progress) => return Some(progress),
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => {
                    self.events = None;
                    return None;
                }
            }
        }
    }

    /// How the create ended.
    pub async fn outcome(self) -> Result<Created, EnvironmentError> {
        match self.outcome {
            Outcome::Known(created) => Ok(*created),
            Outcome::Running(task) => task.await.map_err(EnvironmentError::task("create"))?,
        }
    }
}

impl Environments {
    /// Creates `request.id` for `principal`, or answers with the environment recorded under it.
    /// Runs in its own task: dropping the returned future does not stop provisioning.
    pub async fn create(
        self: &Arc<Self>,
        principal: Principal,
        request: CreateRequest,
    ) -> Result<Created, EnvironmentError> {
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
        if let Some(events) = self.join_in_flight(&principal, &request).await? {
            return Ok(CreateStream {
                new: false,
                events: Some(events),
                outcome: Outcome::Running(self.start_create(principal, request, None)),
            });
        }
        let (announce, announced) = tokio::sync::oneshot::channel();
        let task = self.start_create(principal, request, Some(announce));
        match announced.await {
            Ok(events) => Ok(CreateStream {
                new: true,
                events: Some(events),
                outcome: Outcome::Running(task),
            }),
            Err(_) => {
                let created = task.await.map_err(EnvironmentError::task("create"))??;
                Ok(CreateStream {
                    new: created.is_new(),
                    events: None,
                    outcome: Outcome::Known(Box::new(created)),
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

    /// The progress of a create of the same environment (same organisation, same setup and
    /// repository) that is provisioning right now, from this moment on.
    async fn join_in_flight(
        &self,
        principal: &Principal,
        request: &CreateRequest,
    ) -> Result<Option<broadcast::Receiver<Progress>>, EnvironmentError> {
        let Some(events) = self.locks.join(&request.id) else {
            return Ok(None);
        };
        let row = self.store.get(&principal.organisation, &request.id).await?;
        Ok(row
            .filter(|r| !r.setup_recorded && r.fingerprint == request.fingerprint())
            .map(|_| events))
    }

    async fn create_serialised(
        &self,
        principal: Principal,
        request: CreateRequest,
        announce: Option<Announce>,
    ) -> Result<Created, EnvironmentError> {
        let id = &request.id;
        let _guard = self.locks.lock(id).await;
        if let Some(holder) = self.store.holder(id).await? {
            if holder != principal.organisation {
                return Err(EnvironmentError::IdInUse(id.clone()));
            }
        }
        let fingerprint = request.fingerprint();
        let carries_setup = request.setup.is_some() || request.repository.is_some();
        if let Some(row) = self.store.get(&principal.organisation, id).await? {
            if row.setup_recorded {
                return if row.fingerprint == fingerprint {
                    tracing::info!("repeat of a recorded create: answering as it stands");
                    Ok(Created::Existing(row))
                } else {
                    Err(EnvironmentError::DifferentCreate(id.clone()))
                };
            }
            if carries_setup {
                return Err(EnvironmentError::SetupUnrecorded(id.clone()));
            }
            return self
                .adopt_row(row, &fingerprint)
                .await
                .map(Created::Existing);
        }
        match self.runtime.inspect(id.as_str()).await? {
            MachineState::Missing => self
                .provision(&principal, &request, announce)
                .await
                .map(Created::New),
            _ if carries_setup => Err(EnvironmentError::SetupUnrecorded(id.clone())),
            state => self
                .adopt_orphan(&principal, id, state, &fingerprint)
                .await
                .map(Created::Existing),
        }
    }

    /// A row left unrecorded by a daemon that died, met by a create without setup: the machine
    /// is made sure of and the row recorded as a setup-less environment.
    async fn adopt_row(
        &self,
        mut row: EnvironmentRecord,
        fingerprint: &str,
    ) -> Result<EnvironmentRecord, EnvironmentError> {
        tracing::info!("adopting an environment whose creation was interrupted");
        match self.runtime.inspect(row.id.as_str()).await? {
            MachineState::Running => {}
            MachineState::Stopped => self.runtime.start(row.id.as_str()).await?,
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
                    .create_machine(&self.machine_spec(&row.id, pinned, workspace))
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
    async fn adopt_orphan(
        &self,
        principal: &Principal,
        id: &EnvironmentId,
        state: MachineState,
        fingerprint: &str,
    ) -> Result<EnvironmentRecord, EnvironmentError> {
        tracing::warn!("adopting a Narya machine the store did not know");
        let machine = self
            .runtime
            .list()
            .await?
            .into_iter()
            .find(|m| m.id == id.as_str())
            .ok_or_else(|| EnvironmentError::MachineVanished(id.clone()))?;
        let digest = machine
            .digest
            .ok_or_else(|| EnvironmentError::MachineUnlabelled(id.clone()))?;
        if state == MachineState::Stopped {
            self.runtime.start(id.as_str()).await?;
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
        };
        self.store.insert(&row).await?;
        Ok(row)
    }

    /// The create flow proper, for an identifier nobody holds: pin, record, make, set up, record.
    async fn provision(
        &self,
        principal: &Principal,
        request: &CreateRequest,
        announce: Option<Announce>,
    ) -> Result<EnvironmentRecord, EnvironmentError> {
        // Before anything is made, not even a row: GitHub's refusals cost nothing to undo.
        let clone = match &request.repository {
            Some(repository) => Some(self.check_repository(principal, repository).await?),
            None => None,
        };
        let id = &request.id;
        // Subscribed now so the image events reach the announced stream too.
        let (events, from_the_start) = broadcast::channel(PROGRESS_BACKLOG);
        let _ = events.send(Progress::started("image"));
        let pinned = self
            .runtime
            .ensure_image(&ImageSource {
                reference: self.config.image.reference.clone(),
                pinned: None,
            })
            .await?;
        tracing::info!(digest = %pinned.digest, "image pinned");
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
        };
        let _ = events.send(Progress::finished("image"));
        self.store.insert(&row).await?;
        let _in_flight = self.locks.in_flight(id, &events);
        if let Some(announce) = announce {
            let _ = announce.send(from_the_start);
        }

        let made = async {
            let workspace = self.prepare_workspace(id, true)?;
            if let Some(clone) = &clone {
                let _ = events.send(Progress::started("clone"));
                let cloned = self
                    .run_clone(id, &pinned, &workspace, clone, &events)
                    .await?;
                let _ = events.send(Progress::finished("clone"));
                if cloned.state != SetupState::Succeeded {
                    // No machine is made after a failed clone: nothing of this environment runs,
                    // so nothing can look healthy. The reconciler leaves unusable rows alone,
                    // exec refuses them, and delete removes a missing machine as a no-op.
                    return Ok(Some(cloned));
                }
            }
            let _ = events.send(Progress::started("machine"));
            self.runtime
                .create_machine(&self.machine_spec(id, pinned, workspace))
                .await?;
            let _ = events.send(Progress::finished("machine"));
            tracing::info!("machine started");
            match &request.setup {
                Some(script) => {
                    let _ = events.send(Progress::started("setup"));
                    let setup = self.run_setup(id, script, &events).await?;
                    let _ = events.send(Progress::finished("setup"));
                    Ok(Some(setup))
                }
                None => Ok(None),
            }
        }
        .await;
        let setup = match made {
            Ok(setup) => setup,
            Err(e) => {
                self.undo(&mut row, &e).await;
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
        self.store.record(&row).await?;
        tracing::info!(status = row.status.as_str(), "environment recorded");
        Ok(row)
    }

    /// Takes back a create that failed before its outcome was recorded. When the machine cannot
    /// be removed (the runtime went away), the row stays unrecorded, so the identifier is
    /// refused to setup-carrying creates until someone deletes it.
    async fn undo(&self, row: &mut EnvironmentRecord, cause: &EnvironmentError) {
        tracing::warn!(error = %cause, "provisioning failed; taking it back");
        match self.runtime.remove(row.id.as_str()).await {
            Ok(()) => {
                if let Err(e) = self.remove_workspace(&row.id) {
                    tracing::warn!(error = %e, "could not remove the workspace");
                }
                if let Err(e) = self.store.delete(&row.organisation, &row.id).await {
                    tracing::error!(error = %e, "could not delete the row of a failed create");
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "could not remove the machine of a failed create; leaving it unrecorded");
                row.status_detail = Some(format!("provisioning failed: {cause}"));
                row.updated_at = now_rfc3339();
                let _ = self.store.record(row).await;
            }
        }
    }
}
