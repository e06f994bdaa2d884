//! The pool of machines started ahead of creates (`[pool] size`): made in the background with
//! what the next create would get, kept fresh (a new digest, a stopped machine, another
//! configuration: removed and made again), and found again by label after a restart.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use narya_runtimes::{ImageSource, MachineSpec, MachineState, PinnedImage};
use sha2::{Digest as _, Sha256};

use super::{EnvironmentError, Environments};
use crate::config::Config;
use crate::model::EnvironmentId;
use crate::store::{EnvironmentRecord, EnvironmentSummary};

/// How the runtime's names of pool machines begin; a claimed machine keeps its name.
pub(super) const NAME_PREFIX: &str = "narya-pool-";
/// Under the workspaces directory: the workspace of each unclaimed machine, and for each
/// claimed one a link to where its workspace went (the machine's mount names this path, so a
/// restart of the machine finds its workspace). Identifiers begin with a letter or digit, so
/// no environment's workspace is ever called this.
const POOL_DIR: &str = ".pool";
/// How often the pool looks at its machines when no create wakes it: a machine that stopped
/// is replaced within this.
const LOOK_EVERY: Duration = Duration::from_secs(2);
/// How often the image reference is resolved again: a new digest behind a tag replaces the
/// pool's machines within this (and at every start).
const RESOLVE_EVERY: Duration = Duration::from_secs(5);
/// After a failure to find or make machines, how long before trying again.
const BACK_OFF: Duration = Duration::from_secs(5);

/// The machines started ahead of creates, and what they must have been made for to be served.
pub(super) struct Pool {
    size: usize,
    /// This daemon's mark (from its workspaces directory): pool machines another daemon keeps
    /// in the same runtime are never served, removed or counted here.
    owner: String,
    /// The `dev.narya.pool` label of a machine this daemon may serve: its owner, and what the
    /// environment's machine is made with besides the image (user, mount point, network,
    /// limits, resolvers).
    configuration: String,
    ready: Mutex<Ready>,
    wake: tokio::sync::Notify,
    /// Creates starting a machine of their own right now: the pool makes none meanwhile.
    starting: AtomicUsize,
    /// Machines out of the pool whose removal failed: tried again at each look at the pool,
    /// so that none keeps running (and holding its limits) until the next start.
    undiscarded: Mutex<Vec<String>>,
}

/// A create starting a machine of its own, counted while it lives.
pub(super) struct Starting<'a>(&'a Pool);

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        if self.0.starting.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.wake.notify_one();
        }
    }
}

#[derive(Default)]
struct Ready {
    /// The image the next create would be pinned to, once resolved: no machine of another is
    /// served.
    image: Option<PinnedImage>,
    /// Started machines nobody has claimed, oldest first.
    machines: VecDeque<String>,
}

/// A pool machine taken by one create.
pub(super) struct Pooled {
    pub name: String,
    pub image: PinnedImage,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The mark of the daemon whose workspaces are in `workspaces`: what every `dev.narya.pool`
/// label it writes begins with, before a `-` and the mark of its configuration.
pub fn owner_mark(workspaces: &Path) -> String {
    hex(&Sha256::digest(workspaces.to_string_lossy().as_bytes())[..6])
}

impl Pool {
    pub(super) fn new(config: &Config) -> Pool {
        let owner = owner_mark(&config.workspaces_dir());
        // The resolvers are fixed when a machine is made (Docker writes them into it), so a
        // change of them makes every pool machine stale too.
        let made_with = format!(
            "{}|{}|{:?}|{:?}|{:?}",
            config.environment.user,
            config.environment.workspace,
            config.environment.network,
            config.limits.limits(),
            config.network.dns,
        );
        let configuration = format!("{owner}-{}", hex(&Sha256::digest(made_with)[..8]));
        Pool {
            size: config.pool.size,
            owner,
            configuration,
            ready: Mutex::new(Ready::default()),
            wake: tokio::sync::Notify::new(),
            starting: AtomicUsize::new(0),
            undiscarded: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ready> {
        self.ready.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a machine labelled `configuration` was made by this daemon, whatever for.
    fn owns(&self, configuration: &str) -> bool {
        configuration
            .split_once('-')
            .is_some_and(|(owner, _)| owner == self.owner)
    }

    /// A fresh name for a pool machine: valid on every back end, never used before.
    fn new_name(&self) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let seed = format!(
            "{}|{}|{now}|{}",
            self.owner,
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        format!("{NAME_PREFIX}{}", hex(&Sha256::digest(seed)[..12]))
    }

    /// The oldest unclaimed machine, taken out of the pool (nobody else can take it) and the
    /// pool woken to replace it. `None` when the pool is empty.
    pub(super) fn take(&self) -> Option<Pooled> {
        let taken = {
            let mut ready = self.lock();
            let image = ready.image.clone()?;
            ready
                .machines
                .pop_front()
                .map(|name| Pooled { name, image })
        };
        if self.size > 0 {
            self.wake.notify_one();
        }
        taken
    }

    /// Counts a create starting its own machine until the returned guard goes; the pool
    /// resumes when none is left.
    pub(super) fn starting(&self) -> Starting<'_> {
        self.starting.fetch_add(1, Ordering::AcqRel);
        Starting(self)
    }

    /// Returns `pooled`, taken but not served, to the front of the pool, unless the image
    /// moved on meanwhile; whether it went back.
    pub(super) fn put_back(&self, pooled: Pooled) -> bool {
        let mut ready = self.lock();
        if ready.image.as_ref().map(|i| &i.digest) != Some(&pooled.image.digest) {
            return false;
        }
        ready.machines.push_front(pooled.name);
        true
    }

    /// Takes `name` out of the pool if it is still there; whether it was.
    fn forget(&self, name: &str) -> bool {
        let mut ready = self.lock();
        let before = ready.machines.len();
        ready.machines.retain(|m| m != name);
        ready.machines.len() != before
    }

    /// The `dev.narya.pool` label this daemon's servable machines carry.
    #[cfg(test)]
    pub(super) fn configuration_mark(&self) -> &str {
        &self.configuration
    }

    /// How many machines are waiting to be claimed.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().machines.len()
    }
}

impl Environments {
    /// Keeps the pool full until the daemon stops: what a previous daemon left is found first
    /// (reused when it is fresh, removed when not), then a machine is made for each one
    /// claimed, and the pool is looked at every few seconds. A pool of size 0 only removes
    /// what an earlier configuration left.
    pub async fn keep_pool_forever(self: Arc<Self>) {
        while let Err(e) = self.recover_pool().await {
            tracing::warn!(error = %e, "cannot find the pool's machines yet; retrying");
            tokio::time::sleep(BACK_OFF).await;
        }
        if self.pool.size == 0 {
            return;
        }
        let mut resolved = Instant::now();
        loop {
            if resolved.elapsed() >= RESOLVE_EVERY {
                match self.resolve_pool_image().await {
                    Ok(()) => resolved = Instant::now(),
                    Err(e) => tracing::warn!(error = %e, "cannot resolve the image for the pool"),
                }
            }
            self.look_at_pool().await;
            let wait = match self.fill_pool().await {
                Ok(()) => LOOK_EVERY,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a machine for the pool; retrying");
                    BACK_OFF
                }
            };
            tokio::select! {
                _ = self.pool.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Finds the pool machines a previous daemon left, by label: a claim it did not finish is
    /// finished (the store names the machine: it is that environment's, never pooled again);
    /// an unclaimed machine of the image the next create would get, made for this
    /// configuration and running, is pooled; any other is removed, and so is every pool
    /// workspace without a machine.
    pub(super) async fn recover_pool(&self) -> Result<(), EnvironmentError> {
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

    /// Resolves the image reference again; on a new digest, every pool machine of the old one
    /// is removed before any is served, and the pool refills with the new one.
    async fn resolve_pool_image(&self) -> Result<(), EnvironmentError> {
        let image = self.runtime.ensure_image(&self.unpinned_image()).await?;
        let stale: Vec<String> = {
            let mut ready = self.pool.lock();
            if ready.image.as_ref().map(|i| &i.digest) == Some(&image.digest) {
                return Ok(());
            }
            tracing::info!(digest = %image.digest, "the image resolves to a new digest: replacing the pool");
            ready.image = Some(image);
            ready.machines.drain(..).collect()
        };
        for name in stale {
            self.discard_pooled(&name).await;
        }
        Ok(())
    }

    /// Removes again what could not be removed before, and asks the runtime about every pool
    /// machine: one seen stopped or missing leaves the pool.
    pub(super) async fn look_at_pool(&self) {
        let undiscarded = std::mem::take(
            &mut *self
                .pool
                .undiscarded
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for name in undiscarded {
            self.discard_pooled(&name).await;
        }
        let names: Vec<String> = self.pool.lock().machines.iter().cloned().collect();
        for name in names {
            match self.runtime.inspect(&name).await {
                Ok(MachineState::Stopped | MachineState::Missing) => {
                    if self.pool.forget(&name) {
                        tracing::info!(machine = %name, "a pool machine stopped: replacing it");
                        self.discard_pooled(&name).await;
                    }
                }
                Ok(MachineState::Running | MachineState::Unknown) => {}
                Err(e) => {
                    tracing::debug!(machine = %name, error = %e, "cannot look at a pool machine")
                }
            }
        }
    }

    /// Starts machines until the pool holds `size`, one at a time, and none while a create
    /// starts a machine of its own (a burst larger than the pool is served first; the pool is
    /// woken when the last of them has its machine). A machine made for a digest that changed
    /// meanwhile is removed.
    pub(super) async fn fill_pool(&self) -> Result<(), EnvironmentError> {
        loop {
            if self.pool.starting.load(Ordering::Acquire) > 0 {
                return Ok(());
            }
            let image = {
                let ready = self.pool.lock();
                match &ready.image {
                    Some(image) if ready.machines.len() < self.pool.size => image.clone(),
                    _ => return Ok(()),
                }
            };
            let name = self.pool.new_name();
            let workspace = self.prepare_pool_workspace(&name)?;
            let spec = MachineSpec {
                id: name.clone(),
                environment: String::new(),
                organisation: String::new(),
                image: image.clone(),
                workspace,
                mount_point: self.config.environment.workspace.clone(),
                user: self.config.environment.user,
                network: self.config.environment.network,
                limits: self.config.limits.limits(),
                pool: Some(self.pool.configuration.clone()),
                labels: Default::default(),
            };
            if let Err(e) = self.runtime.create_machine(&spec).await {
                self.discard_pooled(&name).await;
                return Err(e.into());
            }
            let pooled = {
                let mut ready = self.pool.lock();
                let current = ready.image.as_ref().map(|i| &i.digest) == Some(&image.digest);
                if current {
                    ready.machines.push_back(name.clone());
                }
                current
            };
            if pooled {
                tracing::debug!(machine = %name, "pool machine started");
            } else {
                self.discard_pooled(&name).await;
            }
        }
    }

    /// Removes pool machine `name` and its workspace; a machine that cannot be removed now is
    /// tried again at each look at the pool (and at the next start).
    pub(super) async fn discard_pooled(&self, name: &str) {
        if let Err(e) = self.runtime.remove(name).await {
            tracing::warn!(machine = %name, error = %e, "cannot remove a pool machine; trying again");
            let mut undiscarded = self
                .pool
                .undiscarded
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !undiscarded.iter().any(|n| n == name) {
                undiscarded.push(name.to_owned());
            }
            return;
        }
        if let Err(e) = self.trash.discard(&self.pool_workspace(name)) {
            tracing::warn!(machine = %name, error = %e, "cannot remove a pool workspace");
        }
    }

    /// Binds the pool machine `row` names to `row`'s environment: its workspace becomes the
    /// environment's (a link left where the machine's mount points), and its labels say whose
    /// it is where the runtime can change them. Repeat-safe, so a start after a crash in the
    /// middle finishes it.
    pub(super) async fn bind_pooled(
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
    pub(super) fn label_claimed_later(self: &Arc<Self>, row: &EnvironmentRecord) {
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

    /// Moves pool machine `machine`'s workspace to environment `id`'s place and links the old
    /// path to it. The machine keeps its mount (a rename keeps the directory); a later start of
    /// the machine mounts through the link.
    pub(super) fn move_pool_workspace(
        &self,
        machine: &str,
        id: &EnvironmentId,
    ) -> Result<(), EnvironmentError> {
        let from = self.pool_workspace(machine);
        let to = self.workspace(id);
        let moved = || -> std::io::Result<()> {
            match std::fs::symlink_metadata(&from) {
                // Moved and linked already (a claim finished again), but only to this
                // environment's workspace: a link elsewhere is another claim's.
                Ok(meta) if meta.file_type().is_symlink() => {
                    return match std::fs::read_link(&from)? == to {
                        true => Ok(()),
                        false => Err(std::io::Error::other(
                            "the pool machine's workspace is another environment's",
                        )),
                    };
                }
                Ok(_) => {
                    // Whatever a failed earlier create of this identifier left goes first.
                    self.trash.discard(&to)?;
                    std::fs::rename(&from, &to)?;
                }
                // Moved by a daemon that died before it linked it.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.is_dir() => {}
                Err(e) => return Err(e),
            }
            std::os::unix::fs::symlink(&to, &from)
        };
        moved().map_err(|source| EnvironmentError::Workspace { path: from, source })
    }

    /// What `.pool` holds for `machine`, if it is a pool machine: the link a claim left, or
    /// the workspace a claim taken back never moved. Gone with its environment.
    pub(super) fn remove_pool_entry(&self, machine: &str) -> std::io::Result<()> {
        if !machine.starts_with(NAME_PREFIX) {
            return Ok(());
        }
        self.trash.discard(&self.pool_workspace(machine))
    }

    fn unpinned_image(&self) -> ImageSource {
        ImageSource {
            reference: self.config.image.reference.clone(),
            pinned: None,
        }
    }

    fn pool_dir(&self) -> PathBuf {
        self.config.workspaces_dir().join(POOL_DIR)
    }

    fn pool_workspace(&self, machine: &str) -> PathBuf {
        self.pool_dir().join(machine)
    }

    /// An empty workspace for pool machine `name`, owned by the environments' user.
    fn prepare_pool_workspace(&self, name: &str) -> Result<PathBuf, EnvironmentError> {
        let dir = self.pool_workspace(name);
        let prepare = || {
            std::fs::create_dir_all(self.pool_dir())?;
            std::fs::set_permissions(
                self.pool_dir(),
                std::os::unix::fs::PermissionsExt::from_mode(0o700),
            )?;
            std::fs::create_dir(&dir)?;
            self.make_users_own(&dir)
        };
        prepare().map_err(|source| EnvironmentError::Workspace {
            path: dir.clone(),
            source,
        })?;
        Ok(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(state_dir: &str, extra: &str) -> Config {
        Config::parse(&format!(
            "state_dir = {state_dir:?}\n[identity]\nissuer = \"https://id.test\"\naudience = \"narya\"\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn a_pool_knows_its_own_machines_and_their_configuration() {
        let pool = Pool::new(&config("/srv/a", ""));
        assert!(pool.owns(&pool.configuration));
        let other_daemon = Pool::new(&config("/srv/b", ""));
        assert!(!pool.owns(&other_daemon.configuration));
        let other_limits = Pool::new(&config("/srv/a", "[limits]\ncpus = 1.0\n"));
        assert!(pool.owns(&other_limits.configuration));
        assert_ne!(pool.configuration, other_limits.configuration);
        let other_user = Pool::new(&config("/srv/a", "[environment]\nuser = \"1001:1001\"\n"));
        assert_ne!(pool.configuration, other_user.configuration);
        assert_eq!(
            pool.configuration,
            Pool::new(&config("/srv/a", "")).configuration
        );
    }

    #[test]
    fn pool_machine_names_are_fresh_and_valid_container_names() {
        let pool = Pool::new(&config("/srv/a", ""));
        let names: std::collections::HashSet<String> = (0..1000).map(|_| pool.new_name()).collect();
        assert_eq!(names.len(), 1000);
        for name in names {
            assert!(name.starts_with(NAME_PREFIX) && name.len() <= 63, "{name}");
            assert!(name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        }
    }
}
