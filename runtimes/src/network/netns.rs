//! Network namespaces kept alive by a bind mount on a file, as `ip netns` does, under the
//! daemon's own run directory. Blocking: call from `spawn_blocking`.

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::statfs::{statfs, NSFS_MAGIC};

/// Whether `path` holds a namespace (rather than the empty file a reboot leaves behind).
pub(crate) fn is_namespace(path: &Path) -> bool {
    statfs(path).is_ok_and(|s| s.filesystem_type() == NSFS_MAGIC)
}

/// Makes a new network namespace at `path` with IPv6 off in it. A namespace there already is
/// kept as it is.
pub(crate) fn create(path: &Path) -> io::Result<()> {
    if is_namespace(path) {
        return Ok(());
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let target: PathBuf = path.to_owned();
    // A thread of its own enters the new namespace and ends with it, so no thread of the daemon
    // is ever left in a machine's namespace.
    let made = std::thread::Builder::new()
        .name("narya-netns".to_owned())
        .spawn(move || -> io::Result<()> {
            unshare(CloneFlags::CLONE_NEWNET)?;
            // /proc/sys/net is the opener's namespace: this thread's, now.
            for key in ["all", "default"] {
                let sysctl = format!("/proc/sys/net/ipv6/conf/{key}/disable_ipv6");
                match std::fs::write(&sysctl, "1") {
                    Ok(()) => {}
                    // A kernel without IPv6 has nothing to turn off.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            mount(
                Some("/proc/thread-self/ns/net"),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )?;
            Ok(())
        })?
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?;
    if let Err(e) = made {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(())
}

/// Unmounts and deletes the namespace at `path`; gone already is fine.
pub(crate) fn remove(path: &Path) -> io::Result<()> {
    match umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) => {}
        // Not mounted (EINVAL) or not there (ENOENT).
        Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(e.into()),
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
