//! The disk bound (`[limits] disk`) through btrfs quota groups, which bound what a set of
//! subvolumes holds together (Docker's btrfs driver bounds its layers the same way). Each
//! environment's workspace is a subvolume with a quota group of its own, `1/<workspace's
//! subvolume id>`, limited to the bound; its machine's writable layer (the directory holding
//! the overlay's upper and work directories, which the runtime made) becomes a subvolume in
//! the same group before the machine starts. Past the bound a write fails with `EDQUOT`
//! inside, whichever of the two it lands in.
//!
//! The workspaces and the runtime's layers must be on one btrfs filesystem with quotas on;
//! simple quotas (`btrfs quota enable --simple`, Linux 6.7) are the ones to use: they are
//! cheap, and a subvolume made inside a bounded one joins its group. The seccomp filter
//! refuses the ioctls that make subvolumes anyway (`narya_oci::seccomp`).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::libc;

const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
/// The inode number of every subvolume's root directory.
const SUBVOLUME_ROOT: u64 = 256;

const BTRFS_IOC_SUBVOL_CREATE: libc::c_ulong = 0x5000_940e;
const BTRFS_IOC_INO_LOOKUP: libc::c_ulong = 0xd000_9412;
const BTRFS_IOC_FS_INFO: libc::c_ulong = 0x8400_941f;
const BTRFS_IOC_QGROUP_ASSIGN: libc::c_ulong = 0x4018_9429;
const BTRFS_IOC_QGROUP_CREATE: libc::c_ulong = 0x4010_942a;
const BTRFS_IOC_QGROUP_LIMIT: libc::c_ulong = 0x8030_942b;
const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1;

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; 4088],
}

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `struct btrfs_ioctl_fs_info_args`: only the filesystem's id is read.
#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    rest: [u8; 1024 - 32],
}

#[repr(C)]
struct QgroupAssignArgs {
    assign: u64,
    src: u64,
    dst: u64,
}

#[repr(C)]
struct QgroupCreateArgs {
    create: u64,
    qgroupid: u64,
}

#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// The most entries a runtime's fresh layer directory may hold to be made a subvolume: it
/// holds a handful (the upper and work directories, a link file); more is not a fresh layer.
const MAX_LAYER_ENTRIES: usize = 64;

fn open_dir(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Runs ioctl `request` on `file` with `args`.
fn ioctl<T>(file: &File, request: libc::c_ulong, args: &mut T) -> io::Result<()> {
    // SAFETY: each request is paired with the `#[repr(C)]` structure the kernel reads or
    // writes for it, and `args` is exactly that structure, alive for the call.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), request, args as *mut T) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn is_btrfs(file: &File) -> io::Result<bool> {
    let stat = nix::sys::statfs::fstatfs(file)?;
    Ok(stat.filesystem_type().0 as i64 == BTRFS_SUPER_MAGIC)
}

/// The id of the btrfs filesystem holding `file`, the same for each of its subvolumes.
fn filesystem_id(file: &File) -> io::Result<[u8; 16]> {
    let mut args = FsInfoArgs {
        max_id: 0,
        num_devices: 0,
        fsid: [0; 16],
        rest: [0; 1024 - 32],
    };
    ioctl(file, BTRFS_IOC_FS_INFO, &mut args)?;
    Ok(args.fsid)
}

fn uuid(fsid: &[u8; 16]) -> String {
    let hex: String = fsid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The id of the subvolume `dir` is in.
fn subvolume_of(dir: &File) -> io::Result<u64> {
    let mut args = InoLookupArgs {
        treeid: 0,
        objectid: SUBVOLUME_ROOT,
        name: [0; 4080],
    };
    ioctl(dir, BTRFS_IOC_INO_LOOKUP, &mut args)?;
    Ok(args.treeid)
}

/// The level-1 quota group of the workspace whose subvolume is `subvolume`.
fn group_of(subvolume: u64) -> u64 {
    (1 << 48) | subvolume
}

/// The bound of directory `path`: the quota group it heads, when it is a bounded workspace (a
/// subvolume's root on btrfs); `None` when it is a plain directory (the disk is unbounded).
pub fn group(path: &Path) -> io::Result<Option<u64>> {
    let dir = open_dir(path)?;
    if dir.metadata()?.ino() != SUBVOLUME_ROOT || !is_btrfs(&dir)? {
        return Ok(None);
    }
    Ok(Some(group_of(subvolume_of(&dir)?)))
}

/// Makes subvolume `name` in directory `parent`; answers its id.
fn make_subvolume(parent: &Path, name: &std::ffi::OsStr) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let holder = open_dir(parent)?;
    let bytes = name.as_bytes();
    let mut args = VolArgs {
        fd: 0,
        name: [0; 4088],
    };
    if bytes.len() >= args.name.len() || bytes.contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "name too long"));
    }
    args.name[..bytes.len()].copy_from_slice(bytes);
    ioctl(&holder, BTRFS_IOC_SUBVOL_CREATE, &mut args)?;
    subvolume_of(&open_dir(&parent.join(name))?)
}

fn split(path: &Path) -> io::Result<(&Path, &std::ffi::OsStr)> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok((parent, name)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} has no parent directory", path.display()),
        )),
    }
}

/// Makes `path` (which must not exist) a subvolume heading a quota group of its own, limited
/// to `bytes`: what is written below it from now on, and in every subvolume later put in its
/// group ([`join_project`]), counts against `bytes`. Answers the group.
pub fn make_bounded(path: &Path, bytes: u64) -> io::Result<u64> {
    let (parent, name) = split(path)?;
    let subvolume = make_subvolume(parent, name)?;
    let dir = open_dir(path)?;
    let group = group_of(subvolume);
    let bounded = (|| {
        ioctl(
            &dir,
            BTRFS_IOC_QGROUP_CREATE,
            &mut QgroupCreateArgs {
                create: 1,
                qgroupid: group,
            },
        )?;
        assign(&dir, subvolume, group)?;
        ioctl(
            &dir,
            BTRFS_IOC_QGROUP_LIMIT,
            &mut QgroupLimitArgs {
                qgroupid: group,
                flags: BTRFS_QGROUP_LIMIT_MAX_RFER,
                max_rfer: bytes,
                max_excl: 0,
                rsv_rfer: 0,
                rsv_excl: 0,
            },
        )
    })();
    if let Err(e) = bounded {
        drop(dir);
        // An empty subvolume goes with rmdir.
        let _ = std::fs::remove_dir(path);
        return Err(e);
    }
    Ok(group)
}

/// Puts subvolume `subvolume` (its own level-0 group) in group `group`.
fn assign(on: &File, subvolume: u64, group: u64) -> io::Result<()> {
    ioctl(
        on,
        BTRFS_IOC_QGROUP_ASSIGN,
        &mut QgroupAssignArgs {
            assign: 1,
            src: subvolume,
            dst: group,
        },
    )
}

/// Whether quotas are on for the btrfs filesystem holding directory `path`, so that
/// [`make_bounded`] can bound what is written below it. Says what is missing otherwise.
pub fn check_enforced(path: &Path) -> Result<(), String> {
    let dir = open_dir(path).map_err(|e| format!("{} cannot be opened: {e}", path.display()))?;
    let fix = "put it on a btrfs filesystem with simple quotas on (`btrfs quota enable --simple \
               MOUNTPOINT`; contrib/dev/services.sh shows one way)";
    if !is_btrfs(&dir).map_err(|e| format!("{}: {e}", path.display()))? {
        return Err(format!("{} is not on btrfs: {fix}", path.display()));
    }
    let fsid = filesystem_id(&dir).map_err(|e| format!("{}: {e}", path.display()))?;
    let sysfs = PathBuf::from(format!("/sys/fs/btrfs/{}/qgroups", uuid(&fsid)));
    match std::fs::read_to_string(sysfs.join("enabled")) {
        Ok(enabled) if enabled.trim() == "1" => Ok(()),
        _ => Err(format!(
            "quotas are off on the btrfs filesystem holding {}: {fix}",
            path.display()
        )),
    }
}

/// Whether directories `a` and `b` are on one filesystem (for btrfs: whatever their
/// subvolumes), so that one quota group can count what both hold.
pub fn same_filesystem(a: &Path, b: &Path) -> io::Result<bool> {
    let (a, b) = (open_dir(a)?, open_dir(b)?);
    if is_btrfs(&a)? && is_btrfs(&b)? {
        return Ok(filesystem_id(&a)? == filesystem_id(&b)?);
    }
    Ok(a.metadata()?.dev() == b.metadata()?.dev())
}

/// Puts the writable layer a runtime made for a machine of `workspace` (the overlay's upper
/// and work directories `dirs`, fresh and empty) in the workspace's quota group: their common
/// parent directory becomes a subvolume in that group, holding what it held. A workspace that
/// heads no group (the disk is unbounded) leaves them as they are.
pub fn join_project(workspace: &Path, dirs: &[PathBuf]) -> io::Result<()> {
    let Some(group) = group(workspace)? else {
        return Ok(());
    };
    let mut parents = dirs.iter().filter_map(|d| d.parent());
    let Some(layer) = parents.next() else {
        return Err(io::Error::other(
            "the runtime gave no writable directory to bound (only overlay layers can be)",
        ));
    };
    if parents.any(|p| p != layer) {
        return Err(io::Error::other(format!(
            "the writable directories {dirs:?} are not in one directory"
        )));
    }
    if !same_filesystem(workspace, layer)? {
        return Err(io::Error::other(format!(
            "the writable layer {} is not on the workspaces' filesystem: one quota cannot \
             count both",
            layer.display()
        )));
    }
    let subvolume = into_subvolume(layer)?;
    assign(&open_dir(layer)?, subvolume, group)
}

/// Makes directory `dir` a subvolume holding what it held (a runtime's fresh layer: a few
/// empty directories and small files); answers the subvolume's id. One that is a subvolume
/// already is left as it is.
fn into_subvolume(dir: &Path) -> io::Result<u64> {
    let opened = open_dir(dir)?;
    let meta = opened.metadata()?;
    if meta.ino() == SUBVOLUME_ROOT {
        return subvolume_of(&opened);
    }
    drop(opened);
    let (parent, name) = split(dir)?;
    // Aside one level up, out of the directory of layers: containerd's snapshotter removes
    // whatever it finds there that it does not know (its cleanup after a removal), which
    // would take the layer away mid-move. Where the directory of layers is a mount of its own
    // (Podman's `overlay`, which has no such cleanup), beside the layer instead.
    let mut aside_name = std::ffi::OsString::from("narya-moving-");
    aside_name.push(name);
    let mut budget = MAX_LAYER_ENTRIES;
    count(dir, &mut budget, 0)?;
    let mut aside = parent.parent().unwrap_or(parent).join(&aside_name);
    if let Err(e) = std::fs::rename(dir, &aside) {
        if e.raw_os_error() != Some(nix::libc::EXDEV) {
            return Err(e);
        }
        aside = parent.join(&aside_name);
        std::fs::rename(dir, &aside)?;
    }
    let made = make_subvolume(parent, name).and_then(|id| {
        copy_tree(&aside, dir, 0)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        std::os::unix::fs::lchown(dir, Some(meta.uid()), Some(meta.gid()))?;
        Ok(id)
    });
    match made {
        Ok(id) => {
            std::fs::remove_dir_all(&aside)?;
            Ok(id)
        }
        Err(e) => {
            // Put the runtime's directory back as it was.
            let _ = std::fs::remove_dir_all(dir);
            let _ = std::fs::rename(&aside, dir);
            Err(e)
        }
    }
}

/// The deepest a fresh layer directory goes (`work/work` and the like).
const MAX_LAYER_DEPTH: usize = 4;

/// Refuses a tree of more than `budget` entries or deeper than [`MAX_LAYER_DEPTH`].
fn count(dir: &Path, budget: &mut usize, depth: usize) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        *budget = budget.checked_sub(1).ok_or_else(|| {
            io::Error::other(format!(
                "{} holds too much to be a fresh layer",
                dir.display()
            ))
        })?;
        if entry.file_type()?.is_dir() {
            if depth >= MAX_LAYER_DEPTH {
                return Err(io::Error::other(format!(
                    "{} is too deep to be a fresh layer",
                    dir.display()
                )));
            }
            count(&entry.path(), budget, depth + 1)?;
        }
    }
    Ok(())
}

/// Copies what `from` holds into the existing directory `to`: directories, files and links,
/// with their modes and owners. Bounded by [`count`] beforehand.
fn copy_tree(from: &Path, to: &Path, depth: usize) -> io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let meta = entry.metadata()?;
        let target = to.join(entry.file_name());
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_dir() && depth < MAX_LAYER_DEPTH {
            std::fs::create_dir(&target)?;
            copy_tree(&entry.path(), &target, depth + 1)?;
            std::fs::set_permissions(
                &target,
                std::fs::Permissions::from_mode(meta.mode() & 0o7777),
            )?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        } else {
            return Err(io::Error::other(format!(
                "{} is neither a directory, a file nor a link",
                entry.path().display()
            )));
        }
        std::os::unix::fs::lchown(&target, Some(meta.uid()), Some(meta.gid()))?;
    }
    Ok(())
}

/// The `upperdir=` and `workdir=` of overlay mount options: the directories a machine writes.
pub fn overlay_writable_dirs<'a>(options: impl IntoIterator<Item = &'a str>) -> Vec<PathBuf> {
    options
        .into_iter()
        .filter_map(|option| {
            option
                .strip_prefix("upperdir=")
                .or_else(|| option.strip_prefix("workdir="))
        })
        .map(PathBuf::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writable_directories_are_read_from_overlay_options() {
        let dirs = overlay_writable_dirs([
            "index=off",
            "workdir=/var/lib/c/snapshots/7/work",
            "upperdir=/var/lib/c/snapshots/7/fs",
            "lowerdir=/var/lib/c/snapshots/1/fs",
        ]);
        assert_eq!(
            dirs,
            [
                PathBuf::from("/var/lib/c/snapshots/7/work"),
                PathBuf::from("/var/lib/c/snapshots/7/fs")
            ]
        );
        assert!(overlay_writable_dirs(["rbind", "ro"]).is_empty());
    }

    #[test]
    fn the_kernel_structures_have_their_c_sizes() {
        assert_eq!(std::mem::size_of::<VolArgs>(), 4096);
        assert_eq!(std::mem::size_of::<InoLookupArgs>(), 4096);
        assert_eq!(std::mem::size_of::<FsInfoArgs>(), 1024);
        assert_eq!(std::mem::size_of::<QgroupAssignArgs>(), 24);
        assert_eq!(std::mem::size_of::<QgroupCreateArgs>(), 16);
        assert_eq!(std::mem::size_of::<QgroupLimitArgs>(), 48);
        assert_eq!(
            uuid(&[
                0x4d, 0xf1, 0x1e, 0x3a, 0x77, 0xdf, 0x40, 0xe8, 0x8e, 0x60, 0x30, 0x6d, 0x10, 0xf2,
                0x32, 0x6e
            ]),
            "4df11e3a-77df-40e8-8e60-306d10f2326e"
        );
    }

    #[test]
    fn a_filesystem_without_quotas_is_named_as_such() {
        // /proc is not btrfs, whatever the host.
        let err = check_enforced(Path::new("/proc")).unwrap_err();
        assert!(err.contains("/proc") && err.contains("btrfs"), "{err}");
        let plain = tempfile::tempdir().unwrap();
        assert_eq!(
            group(plain.path()).unwrap(),
            None,
            "a plain directory is unbounded"
        );
    }
}
