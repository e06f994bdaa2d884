//! Prebuilds (`[prebuild]`): after a setup succeeds, the machine's writable layer (committed by
//! the runtime) and a copy of the workspace are kept under the key of everything that shaped
//! them; a later create of the same key starts from them and runs no setup.
//!
//! A prebuild is recorded `making` before anything is kept and `ready` once both parts are
//! whole, so a daemon that dies midway leaves nothing that could be served half-made: the next
//! one takes back whatever a `making` row names. One is pinned while an environment that is not
//! deleted stands on it; the least recently used of the others leave first past `max_bytes`,
//! and those of another image digest once a create pins a newer one.

use std::path::{Path, PathBuf};

use narya_runtimes::{ErrorKind, PinnedImage};
use sha2::{Digest as _, Sha256};
use tokio::sync::broadcast;

use super::{EnvironmentError, Environments, Progress};
use crate::model::{Digest, Repository};
use crate::store::{EnvironmentRecord, PrebuildRecord, SetupRecord};

/// What the key of a prebuild is made of, besides the daemon's own configuration.
pub(super) struct Shape<'a> {
    pub organisation: &'a str,
    pub digest: &'a Digest,
    pub script: &'a str,
    /// The repository and the commit its clone checked out, for a create with one.
    pub source: Option<(&'a Repository, &'a str)>,
}

/// Copies the tree at `from` into the directory `to` (which exists), keeping owners, modes,
/// times, links and extended attributes, sharing the data with reflinks where the filesystem
/// has them: GNU cp walks any depth without recursing on its own stack.
async fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut source = from.as_os_str().to_owned();
    source.push("/.");
    let out = tokio::process::Command::new("cp")
        .args(["-a", "--reflink=auto", "--"])
        .arg(source)
        .arg(to)
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap_or("no message").to_owned();
    Err(std::io::Error::other(format!(
        "cp -a {} {} failed ({}): {first}",
        from.display(),
        to.display(),
        out.status
    )))
}

/// The bytes the files under `root` hold (apparent sizes), walked without recursion.
fn tree_bytes(root: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total = total.saturating_add(meta.len());
            }
        }
    }
    total
}

impl Environments {
    /// Whether creates with a setup make and use prebuilds.
    pub(super) fn prebuilds_on(&self) -> bool {
        self.config.prebuild.enabled
    }

    fn prebuilds_dir(&self) -> PathBuf {
        self.config.state_dir.join("prebuilds")
    }

    fn prebuild_workspace(&self, layer: &str) -> PathBuf {
        self.prebuilds_dir().join(layer)
    }

    /// The key of a prebuild of `shape` on this host: a SHA-256 over every part, each hashed
    /// on its own so that no two different shapes can run together into one.
    pub(super) fn prebuild_key(&self, shape: &Shape<'_>) -> String {
        let environment = &self.config.environment;
        let parts = [
            "narya-prebuild-1".to_owned(),
            shape.organisation.to_owned(),
            shape.digest.to_string(),
            hex(&Sha256::digest(shape.script.as_bytes())),
            shape
                .source
                .map_or("-".to_owned(), |(repository, _)| repository.to_string()),
            shape
                .source
                .map_or("-".to_owned(), |(_, commit)| commit.to_owned()),
            environment.user.to_string(),
            environment.workspace.clone(),
            format!("{:?}", self.config.limits),
        ];
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update(Sha256::digest(part.as_bytes()));
        }
        hex(&hasher.finalize())
    }

    /// The whole prebuild of `key`, if `organisation` made one and it is kept; marked used by
    /// environment `row` at once, so that nothing evicts it from under the create.
    pub(super) async fn take_prebuild(
        &self,
        row: &EnvironmentRecord,
        key: &str,
    ) -> Result<Option<PrebuildRecord>, EnvironmentError> {
        let _kept = self.prebuild_guard.read().await;
        let Some(prebuild) = self.store.ready_prebuild(key).await? else {
            return Ok(None);
        };
        if prebuild.organisation != row.organisation || prebuild.image_digest != row.image_digest {
            return Ok(None);
        }
        if !self.prebuild_workspace(&prebuild.layer).is_dir() {
            drop(_kept);
            tracing::warn!(prebuild = %key, "a prebuild's workspace copy is gone; forgetting it");
            let _only = self.prebuild_guard.write().await;
            self.drop_prebuild(key, &prebuild.layer).await;
            return Ok(None);
        }
        self.store.use_prebuild(&row.id, key).await?;
        Ok(Some(prebuild))
    }

    /// Makes `row`'s workspace and machine from `prebuild`: the workspace copied from its copy
    /// (over what is there), the machine started from its layer. Answers its setup record.
    pub(super) async fn provision_prebuilt(
        &self,
        row: &EnvironmentRecord,
        prebuild: PrebuildRecord,
        pinned: PinnedImage,
        workspace: PathBuf,
        events: &broadcast::Sender<Progress>,
    ) -> Result<SetupRecord, EnvironmentError> {
        tracing::info!(prebuild = %prebuild.key, prebuilt_at = ?prebuild.setup.prebuilt_at, "provisioning from a prebuild; no setup runs");
        let copy = self.prebuild_workspace(&prebuild.layer);
        copy_tree(&copy, &workspace)
            .await
            .map_err(|source| EnvironmentError::Workspace {
                path: workspace.clone(),
                source,
            })?;
        let _ = events.send(Progress::started("machine"));
        let mut spec = self.machine_spec(row, pinned, workspace);
        spec.layer = Some(prebuild.layer.clone());
        let starting = self.pool.starting();
        let machine = self.runtime.create_machine(&spec);
        if let Err(e) = self.metrics.create_step("machine", machine).await {
            // A layer the runtime lost (removed behind our back) would fail every create of
            // this key: the prebuild is forgotten, so that a retry provisions afresh.
            if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Image) {
                tracing::warn!(prebuild = %prebuild.key, error = %e, "the runtime cannot start a machine from a prebuild; forgetting it");
                self.forget_lost_prebuild(&prebuild).await;
            }
            return Err(e.into());
        }
        drop(starting);
        let _ = events.send(Progress::finished("machine"));
        Ok(prebuild.setup)
    }

    /// Forgets `prebuild`, whose layer the runtime lost: every create of its key would fail.
    pub(super) async fn forget_lost_prebuild(&self, prebuild: &PrebuildRecord) {
        let _only = self.prebuild_guard.write().await;
        self.drop_prebuild(&prebuild.key, &prebuild.layer).await;
    }

    /// Keeps what `row`'s setup made as the prebuild of `key`, before anyone can run anything
    /// in its machine. A failure costs the create nothing: it is logged, and whatever was made
    /// of the prebuild is taken back.
    pub(super) async fn make_prebuild(
        &self,
        row: &EnvironmentRecord,
        key: &str,
        setup: &SetupRecord,
    ) {
        // The layer's name; it also names the workspace copy. Unique per making, so a layer
        // left by a dead daemon never meets a new one.
        let layer = format!("p-{}-{}", &key[..24], unique_suffix());
        // Known to be in flight here, so that recovering what an earlier daemon left never
        // takes it back.
        let _in_flight = InFlight::new(&self.prebuilds_making, &layer);
        let record = PrebuildRecord {
            key: key.to_owned(),
            organisation: row.organisation.clone(),
            image_digest: row.image_digest.clone(),
            layer: layer.clone(),
            bytes: 0,
            setup: setup.clone(),
        };
        match self.store.begin_prebuild(&record).await {
            Ok(true) => {}
            Ok(false) => return tracing::info!("a prebuild of this key is kept already"),
            Err(e) => return tracing::warn!(error = %e, "cannot record a prebuild"),
        }
        // Within the setup step as a client sees it: the contract's steps are image, clone,
        // machine and setup.
        tracing::info!(prebuild = %key, layer = %layer, "making a prebuild");
        let kept = self.keep_prebuild(row, &layer).await;
        let bytes = match kept {
            Ok(bytes) if bytes <= self.config.prebuild.max_bytes => bytes,
            Ok(bytes) => {
                tracing::warn!(
                    bytes,
                    max_bytes = self.config.prebuild.max_bytes,
                    "the setup made more than [prebuild] max_bytes; no prebuild is kept"
                );
                self.drop_prebuild(key, &layer).await;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not make a prebuild; taking it back");
                self.drop_prebuild(key, &layer).await;
                return;
            }
        };
        match self.store.finish_prebuild(key, bytes).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!("the prebuild's record went while it was made; taking it back");
                self.drop_prebuild(key, &layer).await;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not record a prebuild whole; taking it back");
                self.drop_prebuild(key, &layer).await;
                return;
            }
        }
        tracing::info!(prebuild = %key, bytes, "prebuild kept");
        self.evict_prebuilds().await;
    }

    /// Commits `row`'s machine's layer as `layer` and copies its workspace: the bytes kept.
    async fn keep_prebuild(&self, row: &EnvironmentRecord, layer: &str) -> Result<u64, String> {
        // What a prebuild holds comes out of the host's disk like an environment does.
        let reserve = self.config.host.reserve_disk;
        let free = crate::disk::free_bytes(&self.config.state_dir).map_err(|e| e.to_string())?;
        if free < reserve {
            return Err(format!(
                "the host has {free} bytes free, below [host] reserve_disk ({reserve})"
            ));
        }
        // Frozen while its files are read: what the setup left running (a background child) can
        // neither change what is kept nor swap a directory for a link under the copy.
        let pid = self
            .runtime
            .init_pid(&row.machine)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the machine is not running".to_owned())?;
        let frozen = super::freeze::freeze(pid)
            .await
            .map_err(|e| format!("cannot freeze the machine: {e}"))?;
        let committed = self
            .runtime
            .commit(&row.machine, layer)
            .await
            .map_err(|e| e.to_string())?;
        let copy = self.prebuild_workspace(layer);
        std::fs::create_dir_all(&copy).map_err(|e| format!("{}: {e}", copy.display()))?;
        copy_tree(&self.workspace(&row.id), &copy)
            .await
            .map_err(|e| e.to_string())?;
        drop(frozen);
        // On disk before it is recorded whole: a host that crashes next serves no torn copy.
        sync_filesystem(&copy).await.map_err(|e| e.to_string())?;
        let workspace_bytes = tokio::task::spawn_blocking(move || tree_bytes(&copy))
            .await
            .map_err(|e| e.to_string())?;
        Ok(committed.bytes.saturating_add(workspace_bytes))
    }

    /// Removes what prebuild `key` keeps (its layer named `layer`, its workspace copy) and
    /// forgets it; whether it went. A layer the runtime will not remove yet keeps its row, to
    /// be tried again.
    async fn drop_prebuild(&self, key: &str, layer: &str) -> bool {
        if let Err(e) = self.runtime.remove_committed(layer).await {
            tracing::warn!(prebuild = %key, error = %e, "could not remove a prebuild's layer; trying again later");
            return false;
        }
        if let Err(e) = self.trash.discard(&self.prebuild_workspace(layer)) {
            tracing::warn!(prebuild = %key, error = %e, "could not remove a prebuild's workspace copy");
            return false;
        }
        match self.store.forget_prebuild(key).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(prebuild = %key, error = %e, "could not forget a prebuild");
                false
            }
        }
    }

    /// Past `max_bytes`, the least recently used prebuilds no environment stands on leave.
    async fn evict_prebuilds(&self) {
        let _only = self.prebuild_guard.write().await;
        let prebuilds = match self.store.prebuilds().await {
            Ok(prebuilds) => prebuilds,
            Err(e) => return tracing::warn!(error = %e, "cannot read the prebuilds to evict"),
        };
        let mut total: u64 = prebuilds.iter().map(|p| p.bytes).sum();
        for prebuild in prebuilds {
            if total <= self.config.prebuild.max_bytes {
                break;
            }
            if prebuild.pinned || !prebuild.ready {
                continue;
            }
            tracing::info!(prebuild = %prebuild.key, bytes = prebuild.bytes, "evicting the least recently used prebuild");
            if self.drop_prebuild(&prebuild.key, &prebuild.layer).await {
                total = total.saturating_sub(prebuild.bytes);
            }
        }
    }

    /// Once a create pinned `current`, the prebuilds of other digests no environment stands on
    /// leave: no create can match them again.
    pub(super) async fn retire_prebuilds(&self, current: &Digest) {
        let _only = self.prebuild_guard.write().await;
        let Ok(prebuilds) = self.store.prebuilds().await else {
            return;
        };
        for prebuild in prebuilds {
            if prebuild.ready && !prebuild.pinned && &prebuild.image_digest != current {
                tracing::info!(prebuild = %prebuild.key, digest = %prebuild.image_digest, "retiring a prebuild of an older image");
                self.drop_prebuild(&prebuild.key, &prebuild.layer).await;
            }
        }
    }

    /// At start-up: what a daemon that died while making a prebuild left is taken back, and a
    /// workspace copy no prebuild names goes.
    pub async fn recover_prebuilds(&self) {
        let _only = self.prebuild_guard.write().await;
        let Ok(prebuilds) = self.store.prebuilds().await else {
            return;
        };
        let making = self.prebuilds_in_flight();
        for prebuild in &prebuilds {
            if !prebuild.ready && !making.contains(&prebuild.layer) {
                tracing::warn!(prebuild = %prebuild.key, "taking back a prebuild an earlier daemon left half-made");
                self.drop_prebuild(&prebuild.key, &prebuild.layer).await;
            }
        }
        let named: std::collections::HashSet<&str> = prebuilds
            .iter()
            .map(|p| p.layer.as_str())
            .chain(making.iter().map(String::as_str))
            .collect();
        let Ok(entries) = std::fs::read_dir(self.prebuilds_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !named.contains(name.to_string_lossy().as_ref()) {
                tracing::warn!(copy = %entry.path().display(), "removing a workspace copy no prebuild names");
                let _ = self.trash.discard(&entry.path());
            }
        }
        drop(_only);
        // Past max_bytes since the last start (a smaller max_bytes, pins gone): evicted now.
        self.evict_prebuilds().await;
    }

    /// The layers prebuilds are being made under by this daemon now.
    fn prebuilds_in_flight(&self) -> std::collections::HashSet<String> {
        self.prebuilds_making
            .lock()
            .map(|set| set.clone())
            .unwrap_or_default()
    }
}

/// A layer's name in `set` while its prebuild is being made.
struct InFlight<'a> {
    set: &'a std::sync::Mutex<std::collections::HashSet<String>>,
    layer: String,
}

impl<'a> InFlight<'a> {
    fn new(set: &'a std::sync::Mutex<std::collections::HashSet<String>>, layer: &str) -> Self {
        if let Ok(mut making) = set.lock() {
            making.insert(layer.to_owned());
        }
        InFlight {
            set,
            layer: layer.to_owned(),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut making) = self.set.lock() {
            making.remove(&self.layer);
        }
    }
}

/// `syncfs` on the filesystem holding `path`, through coreutils' `sync -f`.
async fn sync_filesystem(path: &Path) -> std::io::Result<()> {
    let status = tokio::process::Command::new("sync")
        .arg("-f")
        .arg(path)
        .status()
        .await?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "sync -f {} failed ({status})",
            path.display()
        )))
    }
}

/// A suffix no other making of this daemon or an earlier one shares: the time in nanoseconds
/// and a counter.
fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{nanos:x}{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_bytes_counts_files_at_any_depth() {
        let dir = tempfile::tempdir().unwrap();
        let mut deep = dir.path().to_path_buf();
        for i in 0..50 {
            deep.push(format!("d{i}"));
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("f"), vec![0u8; 1000]).unwrap();
        std::fs::write(dir.path().join("g"), vec![0u8; 24]).unwrap();
        assert_eq!(tree_bytes(dir.path()), 1024);
    }

    #[tokio::test]
    async fn a_copied_tree_keeps_its_files_links_and_modes() {
        use std::os::unix::fs::PermissionsExt;
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(from.path().join("a/b")).unwrap();
        std::fs::write(from.path().join("a/b/c"), "hello").unwrap();
        std::fs::set_permissions(
            from.path().join("a/b/c"),
            std::fs::Permissions::from_mode(0o751),
        )
        .unwrap();
        std::os::unix::fs::symlink("b/c", from.path().join("a/link")).unwrap();
        std::fs::write(from.path().join(".hidden"), "x").unwrap();
        copy_tree(from.path(), to.path()).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(to.path().join("a/b/c")).unwrap(),
            "hello"
        );
        let mode = std::fs::metadata(to.path().join("a/b/c"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o751);
        assert_eq!(
            std::fs::read_link(to.path().join("a/link")).unwrap(),
            Path::new("b/c")
        );
        assert!(to.path().join(".hidden").exists());
        let missing = copy_tree(&from.path().join("nowhere"), to.path()).await;
        assert!(missing.is_err());
    }
}
