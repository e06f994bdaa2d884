//! The environment domain: creating, deleting, replacing and running commands in environments,
//! and keeping their statuses true. One file per operation; what they share lives here.

use std::path::PathBuf;
use std::sync::Arc;

use narya_runtimes::{MachineSpec, PinnedImage, Runtime};
use std::collections::BTreeMap;

use sha2::{Digest as _, Sha256};
use tokio_util::task::TaskTracker;

mod admit;
mod adopt;
mod answer;
mod bounds;
mod claim;
mod clone;
mod create;
mod delete;
mod error;
mod exec;
mod freeze;
mod locks;
mod pool;
mod prebuild;
mod progress;
mod reconcile;
mod replace;
mod request;
mod setup;
mod sweep;
#[cfg(test)]
mod tests;
mod tree;

pub use answer::{CreateStream, Created, Differs};
pub use bounds::MARK as RUN_MARK;
pub use error::EnvironmentError;
pub use exec::ExecRun;
pub use pool::owner_mark as pool_owner_mark;
pub use progress::{Progress, Utf8Chunks};
pub use reconcile::RUNTIME_UNREACHABLE;
pub use request::{fingerprint, CreateRequest, ExecRequest, InvalidExec};

use crate::auth::Principal;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::model::EnvironmentId;
use crate::organisation::Organisations;
use crate::store::{EnvironmentRecord, Store};

/// The runtime's name for the machine of `organisation`'s environment `id`: internal, so that
/// every identifier the contract allows is a valid container name on every back end, and two
/// organisations' machines never share one.
pub fn machine_name(organisation: &str, id: &EnvironmentId) -> String {
    let mut hasher = Sha256::new();
    hasher.update(organisation.as_bytes());
    hasher.update([0]);
    hasher.update(id.as_str().as_bytes());
    let hex: String = hasher.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("narya-{hex}")
}

/// What the status detail says while a create is in flight.
pub const PROVISIONING: &str = "provisioning";

/// The environments of this host: their operations, and the locks that keep them apart.
pub struct Environments {
    store: Store,
    runtime: Arc<dyn Runtime>,
    config: Arc<Config>,
    organisations: Arc<Organisations>,
    locks: locks::Locks,
    /// The bounds of setups and execs, which outlive this daemon.
    bounds: bounds::Bounds,
    /// Creates, deletes and replaces in flight, which shutdown waits for.
    tasks: TaskTracker,
    /// Machines started ahead of creates.
    pool: pool::Pool,
    /// Where removed workspaces go, to be removed off the API's and reconciler's way.
    trash: tree::Trash,
    /// The bound of each workspace and writable layer (`[limits] disk`); `None`: unbounded.
    quotas: Option<Arc<crate::disk::Quotas>>,
    metrics: Metrics,
    /// Held to read while a create takes a prebuild, to write while prebuilds are removed:
    /// none goes from under a create that found it.
    prebuild_guard: tokio::sync::RwLock<()>,
    /// The layers of the prebuilds this daemon is making now.
    prebuilds_making: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Environments {
    pub fn new(
        store: Store,
        runtime: Arc<dyn Runtime>,
        config: Arc<Config>,
        organisations: Arc<Organisations>,
    ) -> Environments {
        Environments {
            store,
            runtime,
            bounds: bounds::Bounds::new(config.state_dir.join("runs")),
            pool: pool::Pool::new(&config),
            trash: tree::Trash::new(&config.workspaces_dir()),
            config,
            organisations,
            locks: locks::Locks::default(),
            tasks: TaskTracker::new(),
            metrics: Metrics::default(),
            quotas: None,
            prebuild_guard: tokio::sync::RwLock::new(()),
            prebuilds_making: Default::default(),
        }
    }

    /// Bounds every workspace made from now on (and the writable layer of its machine) with
    /// `quotas`.
    pub fn with_disk_bound(mut self, quotas: Arc<crate::disk::Quotas>) -> Environments {
        self.quotas = Some(quotas);
        self
    }

    /// Counts what happens into `metrics` (by default, into a handle nobody reads).
    pub fn with_metrics(mut self, metrics: Metrics) -> Environments {
        self.metrics = metrics;
        self
    }

    /// Where every status change of every environment is published.
    pub fn events(&self) -> &crate::events::Events {
        self.store.events()
    }

    /// Waits for every create, delete and replace in flight to record its outcome.
    pub async fn drain(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Runs `operation` on `id` for `principal` as a task shutdown waits for, in a span that
    /// names both: a caller that goes away does not leave the operation half done.
    async fn run_tracked<T, F, Op>(
        self: &Arc<Self>,
        what: &'static str,
        principal: Principal,
        id: EnvironmentId,
        operation: Op,
    ) -> Result<T, EnvironmentError>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, EnvironmentError>> + Send + 'static,
        Op: FnOnce(Arc<Self>, Principal, EnvironmentId) -> F,
    {
        let span = tracing::info_span!("operation", operation = what, environment.id = %id, organisation = %principal.organisation);
        let work = operation(self.clone(), principal, id);
        let task = self
            .tasks
            .spawn(tracing::Instrument::instrument(work, span));
        task.await.map_err(EnvironmentError::task(what))?
    }

    /// Environment `id` of `principal`'s organisation.
    pub async fn get(
        &self,
        principal: &Principal,
        id: &EnvironmentId,
    ) -> Result<EnvironmentRecord, EnvironmentError> {
        self.store
            .get(&principal.organisation, id)
            .await?
            .ok_or_else(|| EnvironmentError::NotFound(id.clone()))
    }

    /// Every environment of `principal`'s organisation, by id.
    pub async fn list(
        &self,
        principal: &Principal,
    ) -> Result<Vec<EnvironmentRecord>, EnvironmentError> {
        Ok(self.store.list(&principal.organisation).await?)
    }

    /// Up to `limit` environments of `principal`'s organisation after id `after`, by id.
    pub async fn list_page(
        &self,
        principal: &Principal,
        after: Option<&EnvironmentId>,
        limit: u32,
    ) -> Result<Vec<EnvironmentRecord>, EnvironmentError> {
        Ok(self
            .store
            .list_page(
                &principal.organisation,
                after.map(EnvironmentId::as_str),
                limit,
            )
            .await?)
    }

    fn workspace(&self, id: &EnvironmentId) -> PathBuf {
        self.config.workspaces_dir().join(id.as_str())
    }

    fn machine_spec(
        &self,
        row: &EnvironmentRecord,
        image: PinnedImage,
        workspace: PathBuf,
    ) -> MachineSpec {
        MachineSpec {
            id: row.machine.clone(),
            environment: row.id.to_string(),
            organisation: row.organisation.clone(),
            image,
            workspace,
            mount_point: self.config.environment.workspace.clone(),
            user: self.config.environment.user,
            network: self.config.environment.network,
            limits: self.config.limits.limits(),
            pool: None,
            labels: BTreeMap::new(),
            layer: None,
        }
    }

    /// The workspace directory, owned by the environment's user. `fresh`: whatever a failed
    /// earlier attempt left there goes first.
    fn prepare_workspace(
        &self,
        id: &EnvironmentId,
        fresh: bool,
    ) -> Result<PathBuf, EnvironmentError> {
        let dir = self.workspace(id);
        let prepare = || {
            if fresh {
                self.trash.discard(&dir)?;
            }
            self.make_workspace_dir(&dir)?;
            self.make_users_own(&dir)
        };
        prepare().map_err(|source| EnvironmentError::Workspace {
            path: dir.clone(),
            source,
        })?;
        Ok(dir)
    }

    /// Makes workspace directory `dir` (and its parents), bounded to `[limits] disk` when the
    /// disk is bounded; one that exists is kept.
    fn make_workspace_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        match &self.quotas {
            Some(quotas) => quotas.make(dir),
            None => std::fs::create_dir_all(dir),
        }
    }

    /// Gives workspace directory `dir` to the environments' user, readable by nobody else (but
    /// root): what sessions leave there is theirs.
    fn make_users_own(&self, dir: &std::path::Path) -> std::io::Result<()> {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let user = self.config.environment.user;
        std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid))
    }

    /// Removes `row`'s workspace (and what `.pool` holds for its machine, when that was a
    /// pool machine); one already gone is fine.
    fn remove_workspace(&self, row: &EnvironmentRecord) -> std::io::Result<()> {
        let removed = self.trash.discard(&self.workspace(&row.id));
        let entry = self.remove_pool_entry(&row.machine);
        removed.and(entry)
    }

    /// How many started machines wait in the pool to be claimed.
    #[cfg(test)]
    fn pooled(&self) -> usize {
        self.pool.len()
    }
}
