//! Where pool machines' workspaces live (`.pool`), and how a claim moves one to its
//! environment's place and leaves a link behind.

use std::path::PathBuf;

use super::NAME_PREFIX;
use crate::environments::{EnvironmentError, Environments};
use crate::model::EnvironmentId;

/// Under the workspaces directory: the workspace of each unclaimed machine, and for each
/// claimed one a link to where its workspace went (the machine's mount names this path, so a
/// restart of the machine finds its workspace). Identifiers begin with a letter or digit, so
/// no environment's workspace is ever called this.
const POOL_DIR: &str = ".pool";

impl Environments {
    /// Moves pool machine `machine`'s workspace to environment `id`'s place and links the old
    /// path to it. The machine keeps its mount (a rename keeps the directory); a later start of
    /// the machine mounts through the link.
    pub(in crate::environments) fn move_pool_workspace(
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
    pub(in crate::environments) fn remove_pool_entry(&self, machine: &str) -> std::io::Result<()> {
        if !machine.starts_with(NAME_PREFIX) {
            return Ok(());
        }
        self.trash.discard(&self.pool_workspace(machine))
    }

    pub(super) fn pool_dir(&self) -> PathBuf {
        self.config.workspaces_dir().join(POOL_DIR)
    }

    pub(super) fn pool_workspace(&self, machine: &str) -> PathBuf {
        self.pool_dir().join(machine)
    }

    /// An empty workspace for pool machine `name`, owned by the environments' user.
    pub(super) fn prepare_pool_workspace(&self, name: &str) -> Result<PathBuf, EnvironmentError> {
        let dir = self.pool_workspace(name);
        let prepare = || {
            std::fs::create_dir_all(self.pool_dir())?;
            std::fs::set_permissions(
                self.pool_dir(),
                std::os::unix::fs::PermissionsExt::from_mode(0o700),
            )?;
            if dir.exists() {
                return Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists));
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
}
