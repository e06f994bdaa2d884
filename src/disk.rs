//! The host's disk as the daemon sees it: the free space on the filesystem that holds the
//! state directory (the database, the workspaces), which creates must leave room on; and the
//! per-environment bound (`[limits] disk`), a btrfs quota group given to each workspace.

use std::path::Path;

use narya_runtimes::disk;

/// Bytes an unprivileged writer could still write on the filesystem holding `path` (the
/// `statvfs` `f_bavail`: what is left past the root-reserved blocks).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let stat = nix::sys::statvfs::statvfs(path)?;
    Ok(stat.blocks_available().saturating_mul(stat.fragment_size()))
}

/// Bounds each workspace to `[limits] disk`: a workspace is made a btrfs subvolume heading a
/// quota group of its own, which its machine's writable layer joins (`narya_runtimes::disk`).
#[derive(Debug)]
pub struct Quotas {
    bytes: u64,
}

impl Quotas {
    pub fn new(bytes: u64) -> Quotas {
        Quotas { bytes }
    }

    /// The bound each environment gets, in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Makes workspace directory `dir`, bounded; one that exists already (made before the
    /// bound, or by an earlier attempt) is kept as it is.
    pub fn make(&self, dir: &Path) -> std::io::Result<()> {
        if dir.is_dir() {
            return Ok(());
        }
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)?;
        }
        disk::make_bounded(dir, self.bytes).map(drop)
    }
}

/// Whether `[limits] disk` can be held on this host: workspaces made in `workspaces` (or, when
/// it does not exist yet, its nearest existing parent) and the writable layers of `runtime`
/// (when it answers) on one btrfs filesystem with quotas on. Says what is missing otherwise.
pub async fn check_bound(
    workspaces: &Path,
    runtime: Option<&dyn narya_runtimes::Runtime>,
) -> Result<(), String> {
    let existing = workspaces
        .ancestors()
        .find(|dir| dir.is_dir())
        .unwrap_or(workspaces);
    disk::check_enforced(existing)?;
    let Some(runtime) = runtime else {
        return Ok(());
    };
    let layers = match runtime.layers_dir().await {
        Ok(Some(layers)) => layers,
        Ok(None) => return Ok(()),
        Err(e) => return Err(format!("the {} runtime's layers: {e}", runtime.name())),
    };
    disk::check_enforced(&layers)
        .map_err(|e| format!("the {} runtime's writable layers: {e}", runtime.name()))?;
    match disk::same_filesystem(existing, &layers) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "the {} runtime keeps writable layers in {}, on another filesystem than the \
             workspaces ({}): one quota cannot count both; put state_dir on the runtime's \
             filesystem",
            runtime.name(),
            layers.display(),
            workspaces.display()
        )),
        Err(e) => Err(format!("{}: {e}", layers.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_free_space_of_a_real_filesystem_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).unwrap();
        assert!(free > 0, "a test machine has some room left");
        assert!(free_bytes(&dir.path().join("missing")).is_err());
    }
}
