//! A machine frozen through the cgroup freezer, found from its init's host pid: nothing of a
//! tenant runs while the daemon reads its files as root (a prebuild's commit and copy), so no
//! process left behind can swap a directory for a link under the reader. Thawed when dropped.
//!
//! cgroup v2's `cgroup.freeze` where the machine's cgroup has one; else cgroup v1's freezer
//! controller (hosts that mount v1 controllers, with a controller-less v2 hierarchy beside).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long the kernel is given to freeze every task of the machine.
const FREEZE_WAIT: Duration = Duration::from_secs(10);

/// Which freezer, and the machine's directory in its hierarchy.
#[derive(Debug, PartialEq, Eq)]
enum Freezer {
    /// `cgroup.freeze` (`1`/`0`), frozen once `cgroup.events` says `frozen 1`.
    V2(PathBuf),
    /// `freezer.state` (`FROZEN`/`THAWED`), frozen once it reads `FROZEN`.
    V1(PathBuf),
}

/// The frozen cgroup; thawed on drop.
pub(super) struct Frozen {
    freezer: Freezer,
}

/// Where the hierarchy of `wanted` is mounted, from mountinfo's lines: `cgroup2`, or the v1
/// hierarchy holding controller `freezer`.
fn mount_point(mountinfo: &str, v2: bool) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut fields = right.split_whitespace();
        let (kind, _source, options) = (fields.next()?, fields.next()?, fields.next()?);
        let found = match v2 {
            true => kind == "cgroup2",
            false => kind == "cgroup" && options.split(',').any(|o| o == "freezer"),
        };
        found.then(|| PathBuf::from(left.split_whitespace().nth(4).unwrap_or_default()))
    })
}

/// The path a `/proc/<pid>/cgroup` line gives for the hierarchy `prefix` names (`0::` for v2,
/// a v1 line naming `freezer`), made safe to join under a mount point.
fn cgroup_path(cgroups: &str, v2: bool) -> Option<PathBuf> {
    let path = cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let found = match v2 {
            true => id == "0" && controllers.is_empty(),
            false => controllers.split(',').any(|c| c == "freezer"),
        };
        found.then(|| path.trim().trim_start_matches('/').to_owned())
    })?;
    let safe = !path.is_empty() && path.split('/').all(|part| part != ".." && part != ".");
    safe.then(|| PathBuf::from(path))
}

/// The freezer of host pid `pid`'s cgroup.
fn freezer_of(pid: u32) -> io::Result<Freezer> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let v2 = mount_point(&mountinfo, true)
        .zip(cgroup_path(&cgroups, true))
        .map(|(mount, path)| mount.join(path))
        .filter(|dir| dir.join("cgroup.freeze").is_file());
    if let Some(dir) = v2 {
        return Ok(Freezer::V2(dir));
    }
    let v1 = mount_point(&mountinfo, false)
        .zip(cgroup_path(&cgroups, false))
        .map(|(mount, path)| mount.join(path))
        .filter(|dir| dir.join("freezer.state").is_file());
    v1.map(Freezer::V1).ok_or_else(|| {
        io::Error::other(format!(
            "process {pid} is in no cgroup with a freezer (cgroup v2 cgroup.freeze, or v1 freezer)"
        ))
    })
}

impl Freezer {
    fn set(&self, frozen: bool) -> io::Result<()> {
        match self {
            Freezer::V2(dir) => {
                std::fs::write(dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })
            }
            Freezer::V1(dir) => std::fs::write(
                dir.join("freezer.state"),
                if frozen { "FROZEN" } else { "THAWED" },
            ),
        }
    }

    fn is_frozen(&self) -> io::Result<bool> {
        match self {
            Freezer::V2(dir) => Ok(std::fs::read_to_string(dir.join("cgroup.events"))?
                .lines()
                .any(|line| line.trim() == "frozen 1")),
            Freezer::V1(dir) => {
                Ok(std::fs::read_to_string(dir.join("freezer.state"))?.trim() == "FROZEN")
            }
        }
    }

    fn dir(&self) -> &Path {
        match self {
            Freezer::V2(dir) | Freezer::V1(dir) => dir,
        }
    }
}

/// Freezes the cgroup of the machine whose init is host pid `pid` (and every cgroup below it),
/// waiting until the kernel says every task in it is frozen.
pub(super) async fn freeze(pid: u32) -> io::Result<Frozen> {
    let freezer = freezer_of(pid)?;
    freezer.set(true)?;
    let held = Frozen { freezer };
    let deadline = Instant::now() + FREEZE_WAIT;
    while !held.freezer.is_frozen()? {
        if Instant::now() >= deadline {
            return Err(io::Error::other(format!(
                "{} did not freeze within {} s",
                held.freezer.dir().display(),
                FREEZE_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(held)
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Err(e) = self.freezer.set(false) {
            tracing::error!(cgroup = %self.freezer.dir().display(), error = %e, "could not thaw a machine");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
35 30 0:31 / /sys/fs/cgroup/freezer rw,nosuid - cgroup cgroup rw,freezer
36 30 0:32 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
40 30 0:35 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
";

    #[test]
    fn hierarchies_are_found_from_mountinfo() {
        assert_eq!(
            mount_point(HYBRID, true),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            mount_point(HYBRID, false),
            Some(PathBuf::from("/sys/fs/cgroup/freezer"))
        );
        let pure = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            mount_point(pure, true),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(mount_point(pure, false), None);
    }

    #[test]
    fn a_process_names_its_cgroup_in_each_hierarchy_and_nothing_unsafe() {
        let cgroups = "6:freezer:/narya-e2e/m1\n4:memory:/narya-e2e/m1\n0::/narya-e2e/m1\n";
        assert_eq!(
            cgroup_path(cgroups, true),
            Some(PathBuf::from("narya-e2e/m1"))
        );
        assert_eq!(
            cgroup_path(cgroups, false),
            Some(PathBuf::from("narya-e2e/m1"))
        );
        assert_eq!(
            cgroup_path("0::/\n", true),
            None,
            "the root is no machine's"
        );
        assert_eq!(cgroup_path("0::/a/../../etc\n", true), None);
        assert!(freezer_of(u32::MAX).is_err());
    }
}
