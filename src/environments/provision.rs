//! The create flow and its counterpart, delete: serialised per identifier, run in tasks of their
//! own so a client that goes away cancels nothing, and never leaving a half-made environment
//! looking healthy.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use narya_runtimes::{
    ErrorKind, ImageSource, MachineSpec, MachineState, Network, PinnedImage, ProcessSpec, Runtime,
    RuntimeError, ThrowawaySpec, LABEL_DIGEST,
};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio::sync::broadcast;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::{CreateRequest, EnvironmentId, Progress, Repository, Status, Utf8Chunks};
use crate::auth::Principal;
use crate::config::Config;
use crate::github::{self, GitHubApp, GitHubError, Redactor};
use crate::store::{EnvironmentRecord, SetupRecord, Store, StoreError};

/// What the status detail says while a create is in flight.
pub const PROVISIONING: &str = "provisioning";

/// Runs the setup script from stdin as a file in the machine's private /tmp: a script may be
/// longer than one argument can carry, and one with a `#!` line chooses its own interpreter.
/// Its stderr joins its stdout in one pipe, so the recorded output keeps the order it was
/// written in (two pipes are copied independently and interleave arbitrarily).
const SETUP_WRAPPER: &str = r#"f=$(mktemp /tmp/narya-setup.XXXXXX) || exit 125
cat > "$f" || exit 125
chmod 700 "$f"
case "$(head -c 2 "$f")" in
  '#!') "$f" </dev/null 2>&1 ;;
  *) /bin/bash "$f" </dev/null 2>&1 ;;
esac"#;

#[derive(Debug, thiserror::Error)]
pub enum EnvironmentError {
    #[error("identifier {0:?} is in use; choose another identifier")]
    IdInUse(String),
    #[error("identifier {0:?} is in use with a different setup or repository; repeat the original request, or choose another identifier")]
    DifferentCreate(String),
    #[error("environment {0:?} has a machine whose setup state was never recorded (its creation was interrupted), so nobody can say whether its toolchain exists; delete it (narya env delete {0}) and create it again")]
    SetupUnrecorded(String),
    #[error("no environment {0:?} in your organisation")]
    NotFound(String),
    #[error("{0}")]
    NotReady(String),
    #[error("this host has no GitHub App, which repository-carrying creates and connecting an installation need: add a [github] section (app_id, private_key) to naryad's configuration and restart it; nothing was created")]
    GitHubNotConfigured,
    #[error("your organisation has connected no GitHub App installation: install Narya's GitHub App at {connect_url}, then connect it with `narya github connect INSTALLATION_ID` (PUT /v1/organisation/github); nothing was created")]
    GitHubNotConnected { connect_url: String },
    #[error("GitHub knows no installation {installation} of Narya's GitHub App (it was never made, or was uninstalled): install the app at {connect_url}, then connect the installation with `narya github connect INSTALLATION_ID` (PUT /v1/organisation/github); nothing was created")]
    InstallationNotFound {
        installation: u64,
        connect_url: String,
    },
    #[error("repository {repository} is not among the repositories your organisation's GitHub App installation {installation} selected: add it to the installation's repositories at {connect_url}, or connect another installation with `narya github connect INSTALLATION_ID` (PUT /v1/organisation/github); nothing was created")]
    RepositoryNotSelected {
        repository: String,
        installation: i64,
        connect_url: String,
    },
    #[error("GitHub is not answering ({0}); nothing was created, try again shortly")]
    GitHubUnavailable(String),
    #[error(
        "the container runtime is not answering ({0}); nothing was provisioned, try again shortly"
    )]
    RuntimeUnavailable(String),
    #[error("the official image could not be resolved or fetched ({0}); nothing was provisioned")]
    ImageUnavailable(String),
    #[error("{0}")]
    Internal(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<GitHubError> for EnvironmentError {
    fn from(e: GitHubError) -> Self {
        match e {
            GitHubError::Unavailable(m) => EnvironmentError::GitHubUnavailable(m),
            other => EnvironmentError::Internal(format!("talking to GitHub failed: {other}")),
        }
    }
}

impl From<RuntimeError> for EnvironmentError {
    fn from(e: RuntimeError) -> Self {
        match e.kind() {
            ErrorKind::Unavailable => EnvironmentError::RuntimeUnavailable(e.to_string()),
            ErrorKind::Image => EnvironmentError::ImageUnavailable(e.to_string()),
            _ => EnvironmentError::Internal(format!("the container runtime failed: {e}")),
        }
    }
}

/// Told once provisioning has started (the identifier is now held and the row inserted): the
/// events of the create from its beginning.
pub type Announce = tokio::sync::oneshot::Sender<broadcast::Receiver<Progress>>;

/// How many events a slow streaming reader may fall behind before it misses some.
const PROGRESS_BACKLOG: usize = 1024;

/// How a create ended: made now, or found as it already was.
pub enum Created {
    New(EnvironmentRecord),
    Existing(EnvironmentRecord),
}

/// The environments of this host: create, delete, and the locks that keep them apart.
pub struct Environments {
    pub(super) store: Store,
    pub(super) runtime: Arc<dyn Runtime>,
    pub(super) config: Arc<Config>,
    /// The host's GitHub App; `None` without a `[github]` section.
    github: Option<Arc<GitHubApp>>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    tasks: TaskTracker,
    /// The progress of creates that are provisioning now, for repeats that join them.
    in_flight: Mutex<HashMap<String, broadcast::Sender<Progress>>>,
}

/// Forgets a create's progress channel when it ends, however it ends.
struct InFlight<'a> {
    owner: &'a Environments,
    id: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut in_flight) = self.owner.in_flight.lock() {
            in_flight.remove(&self.id);
        }
    }
}

/// Holds one identifier's lock; forgets the lock when nobody else waits for it.
pub(super) struct IdGuard<'a> {
    owner: &'a Environments,
    id: String,
    lock: Option<Arc<tokio::sync::Mutex<()>>>,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for IdGuard<'_> {
    fn drop(&mut self) {
        let Some(lock) = self.lock.take() else { return };
        let Ok(mut locks) = self.owner.locks.lock() else {
            return;
        };
        // Ours and the map's: nobody else holds or waits for it.
        if Arc::strong_count(&lock) <= 3 {
            locks.remove(&self.id);
        }
    }
}

/// A repository checked against the organisation's installation: what the clone fetches, and
/// through which installation.
struct CloneSource {
    repository: Repository,
    installation: i64,
}

/// Streams a step's output to the create's progress as text, with `redactor`'s secrets taken
/// out first. We read the output ourselves, so nobody's stream going away can stop the step.
fn forward_output(
    step: &'static str,
    events: &broadcast::Sender<Progress>,
    mut redactor: Redactor,
) -> (
    tokio::sync::mpsc::Sender<Vec<u8>>,
    tokio::task::JoinHandle<()>,
) {
    let (chunks, mut chunks_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    let events = events.clone();
    let forward = tokio::spawn(async move {
        let mut text = Utf8Chunks::default();
        let send = |output: String| {
            if !output.is_empty() {
                let _ = events.send(Progress::Output { step, output });
            }
        };
        while let Some(chunk) = chunks_rx.recv().await {
            send(text.push(&redactor.push(&chunk)));
        }
        send(text.push(&redactor.finish()));
        send(text.finish());
    });
    (chunks, forward)
}

pub fn now_rfc3339() -> String {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned())
}

fn rfc3339(at: SystemTime) -> String {
    OffsetDateTime::from(at)
        .format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned())
}

impl Environments {
    pub fn new(
        store: Store,
        runtime: Arc<dyn Runtime>,
        config: Arc<Config>,
        github: Option<Arc<GitHubApp>>,
    ) -> Environments {
        Environments {
            store,
            runtime,
            config,
            github,
            locks: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `work` as a tracked task: shutdown waits for it to record its outcome.
    pub(super) fn tasks_spawn<F>(&self, work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(work)
    }

    /// Waits for every create and delete in flight to record its outcome.
    pub async fn drain(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    pub(super) async fn lock(&self, id: &str) -> IdGuard<'_> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(id.to_owned()).or_default().clone()
        };
        let guard = lock.clone().lock_owned().await;
        IdGuard {
            owner: self,
            id: id.to_owned(),
            lock: Some(lock),
            _guard: guard,
        }
    }

    /// The lock of `id` if nobody holds it now (a create, delete or replace in progress).
    pub(super) fn try_lock(&self, id: &str) -> Option<IdGuard<'_>> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(id.to_owned()).or_default().clone()
        };
        let guard = lock.clone().try_lock_owned().ok()?;
        Some(IdGuard {
            owner: self,
            id: id.to_owned(),
            lock: Some(lock),
            _guard: guard,
        })
    }

    pub(super) fn workspace(&self, id: &str) -> PathBuf {
        self.config.workspaces_dir().join(id)
    }

    /// Creates `request.id` for `principal`, or answers with the environment recorded under it.
    /// Runs in its own task: dropping the returned future does not stop provisioning.
    pub async fn create(
        self: &Arc<Self>,
        principal: Principal,
        request: CreateRequest,
    ) -> Result<Created, EnvironmentError> {
        self.start_create(principal, request, None)
            .await
            .map_err(|e| EnvironmentError::Internal(format!("the create task failed: {e}")))?
    }

    /// Starts a create in its own task; `announce` hears when provisioning has started.
    pub fn start_create(
        self: &Arc<Self>,
        principal: Principal,
        request: CreateRequest,
        announce: Option<Announce>,
    ) -> tokio::task::JoinHandle<Result<Created, EnvironmentError>> {
        let this = self.clone();
        let span = tracing::info_span!("create", environment.id = %request.id, organisation = %principal.organisation);
        self.tasks.spawn(
            async move { this.create_serialised(principal, request, announce).await }
                .instrument(span),
        )
    }

    /// The progress of a create of the same environment (same organisation, same setup and
    /// repository) that is provisioning right now, from this moment on.
    pub async fn join_in_flight(
        &self,
        principal: &Principal,
        request: &CreateRequest,
    ) -> Result<Option<broadcast::Receiver<Progress>>, EnvironmentError> {
        let events = {
            let in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            match in_flight.get(request.id.as_str()) {
                Some(sender) => sender.subscribe(),
                None => return Ok(None),
            }
        };
        let row = self
            .store
            .get(&principal.organisation, request.id.as_str())
            .await?;
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
        let id = request.id.as_str().to_owned();
        let _guard = self.lock(&id).await;
        if let Some(holder) = self.store.holder(&id).await? {
            if holder != principal.organisation {
                return Err(EnvironmentError::IdInUse(id));
            }
        }
        let fingerprint = request.fingerprint();
        let carries_setup = request.setup.is_some() || request.repository.is_some();
        if let Some(row) = self.store.get(&principal.organisation, &id).await? {
            if row.setup_recorded {
                return if row.fingerprint == fingerprint {
                    tracing::info!("repeat of a recorded create: answering as it stands");
                    Ok(Created::Existing(row))
                } else {
                    Err(EnvironmentError::DifferentCreate(id))
                };
            }
            if carries_setup {
                return Err(EnvironmentError::SetupUnrecorded(id));
            }
            return self
                .adopt_row(row, &fingerprint)
                .await
                .map(Created::Existing);
        }
        match self.runtime.inspect(&id).await? {
            MachineState::Missing => self
                .provision(&principal, &request, announce)
                .await
                .map(Created::New),
            _ if carries_setup => Err(EnvironmentError::SetupUnrecorded(id)),
            state => self
                .adopt_orphan(&principal, &request.id, state, &fingerprint)
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
        match self.runtime.inspect(&row.id).await? {
            MachineState::Running => {}
            MachineState::Stopped => self.runtime.start(&row.id).await?,
            MachineState::Missing => {
                let digest = row.image_digest.parse().map_err(|e| {
                    EnvironmentError::Internal(format!("stored digest of {}: {e}", row.id))
                })?;
                let pinned = self
                    .runtime
                    .ensure_image(&ImageSource {
                        reference: self.config.image.reference.clone(),
                        pinned: Some(digest),
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
            .ok_or_else(|| {
                EnvironmentError::Internal(format!("machine {id} vanished while being adopted"))
            })?;
        let digest = machine.digest.ok_or_else(|| {
            EnvironmentError::Internal(format!("machine {id} carries no {LABEL_DIGEST} label"))
        })?;
        if state == MachineState::Stopped {
            self.runtime.start(id.as_str()).await?;
        }
        self.prepare_workspace(id.as_str(), false)?;
        let now = now_rfc3339();
        let row = EnvironmentRecord {
            id: id.to_string(),
            organisation: principal.organisation.clone(),
            person: principal.person.clone(),
            fingerprint: fingerprint.to_owned(),
            setup_script: None,
            repository: None,
            image_digest: digest.to_string(),
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

    pub(super) fn machine_spec(
        &self,
        id: &str,
        image: narya_runtimes::PinnedImage,
        workspace: PathBuf,
    ) -> MachineSpec {
        MachineSpec {
            id: id.to_owned(),
            image,
            workspace,
            mount_point: self.config.environment.workspace.clone(),
            user: self.config.environment.user,
            network: self.config.environment.network,
            labels: BTreeMap::new(),
        }
    }

    /// The workspace directory, owned by the environment's user. `fresh`: whatever a failed
    /// earlier attempt left there goes first.
    pub(super) fn prepare_workspace(
        &self,
        id: &str,
        fresh: bool,
    ) -> Result<PathBuf, EnvironmentError> {
        let dir = self.workspace(id);
        let fault = |e: std::io::Error| {
            EnvironmentError::Internal(format!(
                "cannot prepare the workspace {}: {e}",
                dir.display()
            ))
        };
        if fresh && dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(fault)?;
        }
        std::fs::create_dir_all(&dir).map_err(fault)?;
        let user = self.config.environment.user;
        std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.gid)).map_err(fault)?;
        Ok(dir)
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
        let id = request.id.as_str();
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
            id: id.to_owned(),
            organisation: principal.organisation.clone(),
            person: principal.person.clone(),
            fingerprint: request.fingerprint(),
            setup_script: request.setup.clone(),
            repository: request.repository.as_ref().map(|r| r.to_string()),
            image_digest: pinned.digest.to_string(),
            setup_recorded: false,
            status: Status::Degraded,
            status_detail: Some(PROVISIONING.to_owned()),
            setup: None,
            created_at: now.clone(),
            updated_at: now,
        };
        let _ = events.send(Progress::finished("image"));
        self.store.insert(&row).await?;
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned(), events.clone());
        let _in_flight = InFlight {
            owner: self,
            id: id.to_owned(),
        };
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
                if cloned.state != "succeeded" {
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
            Some(s) if s.state != "succeeded" => Status::Unusable,
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

    /// Runs the setup script once, bounded, as the unprivileged user in the workspace.
    pub(super) async fn run_setup(
        &self,
        id: &str,
        script: &str,
        events: &broadcast::Sender<Progress>,
    ) -> Result<SetupRecord, EnvironmentError> {
        let env = &self.config.environment;
        let started_at = SystemTime::now();
        let (chunks, forward) = forward_output("setup", events, Redactor::none());
        let spec = ProcessSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), SETUP_WRAPPER.into()],
            env: BTreeMap::new(),
            cwd: None,
            timeout: env.setup_timeout.0,
            output_limit: env.output_limit,
            stdin: Some(script.as_bytes().to_vec()),
            output: Some(chunks),
        };
        let outcome = self.runtime.run(id, &spec).await;
        drop(spec);
        let _ = forward.await;
        let outcome = outcome?;
        let state = if outcome.timed_out {
            "timed_out"
        } else if outcome.exit_code == Some(0) {
            "succeeded"
        } else {
            "failed"
        };
        tracing::info!(state, exit_code = ?outcome.exit_code, "setup finished");
        Ok(SetupRecord {
            state: state.to_owned(),
            step: "setup".to_owned(),
            exit_code: outcome.exit_code.map(i64::from),
            output: String::from_utf8_lossy(&outcome.output).into_owned(),
            output_truncated: outcome.output_truncated,
            started_at: rfc3339(started_at),
            finished_at: now_rfc3339(),
        })
    }

    /// Step 4 of a create: the organisation's installation, and the repository among those it
    /// selected. Answers the installation to clone through.
    async fn check_repository(
        &self,
        principal: &Principal,
        repository: &Repository,
    ) -> Result<CloneSource, EnvironmentError> {
        let github = self
            .github
            .as_ref()
            .ok_or(EnvironmentError::GitHubNotConfigured)?;
        let connect_url = github.connect_url().to_owned();
        let Some(installation) = self.store.installation(&principal.organisation).await? else {
            return Err(EnvironmentError::GitHubNotConnected { connect_url });
        };
        match github.selects(installation, repository).await {
            Ok(true) => Ok(CloneSource {
                repository: repository.clone(),
                installation,
            }),
            Ok(false) => Err(EnvironmentError::RepositoryNotSelected {
                repository: repository.to_string(),
                installation,
                connect_url,
            }),
            Err(GitHubError::InstallationNotFound(_)) => {
                Err(EnvironmentError::InstallationNotFound {
                    installation: installation.unsigned_abs(),
                    connect_url,
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Clones the repository into the (empty) workspace before the machine exists: `git clone`
    /// in a throwaway container of the pinned image, as the environment's user, bounded by
    /// `environment.clone_timeout`, with a token minted for this one clone (that repository,
    /// `contents: read`) living only in that process's environment and revoked right after.
    /// A clone that fails is answered as a record, like a failed setup; only a runtime that
    /// fails is an error.
    async fn run_clone(
        &self,
        id: &str,
        image: &PinnedImage,
        workspace: &Path,
        source: &CloneSource,
        events: &broadcast::Sender<Progress>,
    ) -> Result<SetupRecord, EnvironmentError> {
        let github = self
            .github
            .as_ref()
            .ok_or(EnvironmentError::GitHubNotConfigured)?;
        let env = &self.config.environment;
        let started_at = SystemTime::now();
        let failed = |output: String| SetupRecord {
            state: "failed".to_owned(),
            step: "clone".to_owned(),
            exit_code: None,
            output,
            output_truncated: false,
            started_at: rfc3339(started_at),
            finished_at: now_rfc3339(),
        };
        let token = match github
            .mint_token(
                source.installation,
                Some(&[source.repository.name()][..]),
                serde_json::json!({"contents": "read"}),
            )
            .await
        {
            Ok(token) => token,
            // A token GitHub will not give fails the clone like a refused one would.
            Err(e) => {
                tracing::warn!(error = %e, "GitHub gave no token for the clone");
                let output = format!(
                    "narya: GitHub gave no token to clone {}: {e}\n",
                    source.repository
                );
                let _ = events.send(Progress::Output {
                    step: "clone",
                    output: output.clone(),
                });
                return Ok(failed(output));
            }
        };
        tracing::info!(repository = %source.repository, "cloning with a token minted for this clone");
        let redactor = Redactor::for_token(&token.token);
        let (chunks, forward) = forward_output("clone", events, Redactor::for_token(&token.token));
        let spec = ThrowawaySpec {
            name: github::throwaway_name(id),
            image: image.clone(),
            workspace: workspace.to_owned(),
            mount_point: env.workspace.clone(),
            user: env.user,
            // The clone must reach GitHub whatever network the machine itself is given.
            network: Network::Host,
            process: ProcessSpec {
                argv: github::clone_argv(&github.clone_url(&source.repository), &env.workspace),
                env: github::clone_env(github.git_url(), &token.token),
                cwd: None,
                timeout: env.clone_timeout.0,
                output_limit: env.output_limit,
                stdin: None,
                output: Some(chunks),
            },
        };
        let outcome = self.runtime.run_throwaway(&spec).await;
        drop(spec);
        let _ = forward.await;
        // Revoked whatever the clone did: the token was for this one command.
        match github.revoke(&token.token).await {
            Ok(()) => tracing::info!("the clone's token is revoked"),
            Err(e) => {
                tracing::warn!(error = %e, expires_at = ?token.expires_at, "could not revoke the clone's token; it expires on its own")
            }
        }
        let outcome = outcome?;
        let mut output = redactor.redact(&outcome.output, outcome.output_truncated);
        let mut state = if outcome.timed_out {
            "timed_out"
        } else if outcome.exit_code == Some(0) {
            "succeeded"
        } else {
            "failed"
        };
        if state == "succeeded" {
            let config = std::fs::read(workspace.join(".git/config")).unwrap_or_default();
            if github::config_holds_secret(&config, &token.token) {
                tracing::error!(
                    "the clone left its credential in .git/config; emptying the workspace"
                );
                self.prepare_workspace(id, true)?;
                state = "failed";
                output.extend_from_slice(
                    b"narya: the clone left its credential in .git/config; the workspace was emptied\n",
                );
            }
        }
        tracing::info!(state, exit_code = ?outcome.exit_code, "clone finished");
        Ok(SetupRecord {
            state: state.to_owned(),
            step: "clone".to_owned(),
            exit_code: outcome.exit_code.map(i64::from),
            output: String::from_utf8_lossy(&output).into_owned(),
            output_truncated: outcome.output_truncated,
            started_at: rfc3339(started_at),
            finished_at: now_rfc3339(),
        })
    }

    /// Connects `principal`'s organisation to GitHub App installation `installation_id`, once
    /// GitHub has said that installation exists. Repeating it is safe; a new id replaces the old.
    pub async fn connect_github(
        &self,
        principal: &Principal,
        installation_id: u64,
    ) -> Result<(), EnvironmentError> {
        let github = self
            .github
            .as_ref()
            .ok_or(EnvironmentError::GitHubNotConfigured)?;
        let not_found = || EnvironmentError::InstallationNotFound {
            installation: installation_id,
            connect_url: github.connect_url().to_owned(),
        };
        // GitHub's ids are positive 64-bit integers; a larger one names nothing.
        let id = i64::try_from(installation_id).map_err(|_| not_found())?;
        let installation = github.installation(id).await.map_err(|e| match e {
            GitHubError::InstallationNotFound(_) => not_found(),
            other => other.into(),
        })?;
        self.store
            .connect_installation(&principal.organisation, installation.id, &now_rfc3339())
            .await?;
        tracing::info!(organisation = %principal.organisation, installation = installation.id, account = ?installation.account, "GitHub installation connected");
        Ok(())
    }

    /// Takes back a create that failed before its outcome was recorded. When the machine cannot
    /// be removed (the runtime went away), the row stays unrecorded, so the identifier is
    /// refused to setup-carrying creates until someone deletes it.
    pub(super) async fn undo(&self, row: &mut EnvironmentRecord, cause: &EnvironmentError) {
        tracing::warn!(error = %cause, "provisioning failed; taking it back");
        match self.runtime.remove(&row.id).await {
            Ok(()) => {
                if let Err(e) = std::fs::remove_dir_all(self.workspace(&row.id)) {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!(error = %e, "could not remove the workspace");
                    }
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

    /// Destroys the machine, its writable layer and the workspace, and frees the identifier.
    pub async fn delete(
        self: &Arc<Self>,
        principal: Principal,
        id: EnvironmentId,
    ) -> Result<(), EnvironmentError> {
        let this = self.clone();
        let span = tracing::info_span!("delete", environment.id = %id, organisation = %principal.organisation);
        let task = self.tasks.spawn(
            async move {
                let _guard = this.lock(id.as_str()).await;
                let row = this
                    .store
                    .get(&principal.organisation, id.as_str())
                    .await?
                    .ok_or_else(|| EnvironmentError::NotFound(id.to_string()))?;
                this.runtime.remove(&row.id).await?;
                match std::fs::remove_dir_all(this.workspace(&row.id)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(EnvironmentError::Internal(format!(
                            "the machine is gone but the workspace could not be removed: {e}"
                        )))
                    }
                }
                this.store.delete(&row.organisation, &row.id).await?;
                tracing::info!("environment deleted");
                Ok(())
            }
            .instrument(span),
        );
        task.await
            .map_err(|e| EnvironmentError::Internal(format!("the delete task failed: {e}")))?
    }
}
