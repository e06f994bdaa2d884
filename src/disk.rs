//! The host's disk as the daemon sees it: the free space on the filesystem that holds the
//! state directory (the database, the workspaces), which creates must leave room on.

use std::path::Path;

/// Bytes an unprivileged writer could still write on the filesystem holding `path` (the
/// `statvfs` `f_bavail`: what is left past the root-reserved blocks).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let stat = nix::sys::statvfs::statvfs(path)?;
    Ok(stat.blocks_available().saturating_mul(stat.fragment_size()))
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
