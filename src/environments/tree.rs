//! Removing trees a tenant wrote (workspaces, pool workspaces, what a failed create left):
//! never on an async worker, never by recursion, never through a link. A tree leaves its place
//! at once by a rename into the trash (`workspaces/.trash`), which one thread of its own empties
//! in the background, so a delete of a tree 100 000 levels deep or of a million files answers
//! at once and nothing else waits for it; what a stopped daemon left in the trash goes at the
//! next start.
//!
//! The removal holds two directory descriptors whatever the tree's depth: it walks the top of
//! the tree, unlinks what is not a directory, and moves each subdirectory it meets up to the top
//! (`renameat2` with `RENAME_NOREPLACE`), so every directory is visited from the top, moved at
//! most once, and removed once empty. Nothing is opened without `O_NOFOLLOW`, and `unlinkat`
//! removes a link itself, never what it names.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{open, openat, renameat2, OFlag, RenameFlags};
use nix::sys::stat::{fstatat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Where trees wait to be removed, under the workspaces directory (so a move there is a rename).
pub const TRASH: &str = ".trash";
/// How often a long removal says how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// How long the trash's thread sleeps when nobody wakes it: what a failed removal left is
/// tried again after that.
const RETRY: Duration = Duration::from_secs(60);

const DIRECTORY: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// How far a removal got.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    pub files: u64,
    pub directories: u64,
}

/// Removes the tree at `path` (a directory, a file or a link; nothing there is fine), as the
/// module says. Blocking: call it from a thread of its own or `spawn_blocking`.
pub fn remove_tree(path: &Path) -> std::io::Result<Removed> {
    let mut removed = Removed::default();
    let top = match open(path, DIRECTORY, Mode::empty()) {
        Ok(top) => top,
        Err(Errno::ENOENT) => return Ok(removed),
        // A file or a link where a directory was expected: removed itself.
        Err(Errno::ENOTDIR | Errno::ELOOP) => {
            return match std::fs::remove_file(path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(removed),
                done => done.map(|()| Removed {
                    files: 1,
                    ..removed
                }),
            };
        }
        Err(e) => return Err(e.into()),
    };
    let mut progress = Progress::new(path);
    empty_top(&top, &mut removed, &mut progress)?;
    drop(top);
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        done => done?,
    }
    removed.directories += 1;
    Ok(removed)
}

/// Says, every so often, how far a removal got: a long one is seen to move.
struct Progress<'a> {
    path: &'a Path,
    next: Instant,
}

impl Progress<'_> {
    fn new(path: &Path) -> Progress<'_> {
        Progress {
            path,
            next: Instant::now() + PROGRESS_EVERY,
        }
    }

    fn tick(&mut self, removed: &Removed) {
        if Instant::now() >= self.next {
            self.next = Instant::now() + PROGRESS_EVERY;
            tracing::info!(path = %self.path.display(), files = removed.files, directories = removed.directories, "still removing a tree");
        }
    }
}

/// Names each directory moved up to the top apart from everything else there.
static NEXT_NAME: AtomicU64 = AtomicU64::new(0);

/// Empties directory `top` (the tree's root): passes over its entries until one finds none.
fn empty_top(top: &OwnedFd, removed: &mut Removed, progress: &mut Progress) -> nix::Result<()> {
    loop {
        let mut found = false;
        let mut entries = Dir::openat(top, c".", DIRECTORY, Mode::empty())?;
        for entry in entries.iter() {
            let entry = entry?;
            let name = entry.file_name();
            if is_dot(name) {
                continue;
            }
            found = true;
            let name = name.to_owned();
            if is_directory(top, &name, entry.file_type())? {
                empty_into_top(top, &name, removed)?;
            } else {
                unlink(top, &name, UnlinkatFlags::NoRemoveDir, removed)?;
            }
            progress.tick(removed);
        }
        if !found {
            return Ok(());
        }
    }
}

/// Removes directory `name` of `top`: what is not a directory in it is unlinked, each
/// subdirectory moved up to `top` (to be removed from there), and then `name` itself.
fn empty_into_top(top: &OwnedFd, name: &CStr, removed: &mut Removed) -> nix::Result<()> {
    loop {
        match unlinkat(top, name, UnlinkatFlags::RemoveDir) {
            Ok(()) => {
                removed.directories += 1;
                return Ok(());
            }
            Err(Errno::ENOENT) => return Ok(()),
            Err(Errno::ENOTEMPTY | Errno::EEXIST) => {}
            Err(e) => return Err(e),
        }
        let dir = match openat(top, name, DIRECTORY, Mode::empty()) {
            Ok(dir) => dir,
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut entries = Dir::openat(&dir, c".", DIRECTORY, Mode::empty())?;
        for entry in entries.iter() {
            let entry = entry?;
            let child = entry.file_name();
            if is_dot(child) {
                continue;
            }
            let child = child.to_owned();
            if is_directory(&dir, &child, entry.file_type())? {
                move_up(&dir, &child, top)?;
            } else {
                unlink(&dir, &child, UnlinkatFlags::NoRemoveDir, removed)?;
            }
        }
    }
}

/// Moves directory `name` of `from` to `top` under a name nothing there has.
fn move_up(from: &OwnedFd, name: &CStr, top: &OwnedFd) -> nix::Result<()> {
    loop {
        let fresh = CString::new(format!(
            ".narya-removing.{}",
            NEXT_NAME.fetch_add(1, Ordering::Relaxed)
        ))
        .map_err(|_| Errno::EINVAL)?;
        match renameat2(
            from,
            name,
            top,
            fresh.as_c_str(),
            RenameFlags::RENAME_NOREPLACE,
        ) {
            Err(Errno::EEXIST) => continue,
            Err(Errno::ENOENT) => return Ok(()),
            done => return done,
        }
    }
}

fn unlink(
    dir: &OwnedFd,
    name: &CStr,
    flag: UnlinkatFlags,
    removed: &mut Removed,
) -> nix::Result<()> {
    match unlinkat(dir, name, flag) {
        Ok(()) => {
            removed.files += 1;
            Ok(())
        }
        Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

/// Whether `name` in `dir` is a directory (never following a link), from the entry's type when
/// the filesystem gives it.
fn is_directory(dir: &impl AsFd, name: &CStr, kind: Option<Type>) -> nix::Result<bool> {
    match kind {
        Some(kind) => Ok(kind == Type::Directory),
        None => match fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => {
                Ok(SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)
            }
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e),
        },
    }
}

/// The trash of a workspaces directory, and the thread that empties it.
pub struct Trash {
    dir: PathBuf,
    wake: std::sync::Mutex<mpsc::Sender<()>>,
}

impl Trash {
    /// The trash under `workspaces`, with its thread started (it first removes what an earlier
    /// daemon left there).
    pub fn new(workspaces: &Path) -> Trash {
        let dir = workspaces.join(TRASH);
        let (wake, woken) = mpsc::channel();
        let emptied = dir.clone();
        let started = std::thread::Builder::new()
            .name("narya-trash".into())
            .spawn(move || empty_forever(&emptied, &woken));
        if let Err(e) = started {
            tracing::error!(error = %e, "cannot start the thread that empties the trash; trees are removed at the next start");
        }
        let _ = wake.send(());
        Trash {
            dir,
            wake: std::sync::Mutex::new(wake),
        }
    }

    /// Takes the tree at `path` out of its place at once (a rename into the trash) and has it
    /// removed in the background; nothing there is fine. A tree that cannot be moved (another
    /// filesystem) is removed here, off the caller's thread only if the caller is off one.
    pub fn discard(&self, path: &Path) -> std::io::Result<()> {
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
            Ok(meta) if !meta.is_dir() => return std::fs::remove_file(path),
            Ok(_) => {}
        }
        std::fs::create_dir_all(&self.dir)?;
        let name = format!(
            "{}.{}.{}",
            path.file_name()
                .map_or("tree".into(), |n| n.to_string_lossy()),
            std::process::id(),
            NEXT_NAME.fetch_add(1, Ordering::Relaxed)
        );
        match std::fs::rename(path, self.dir.join(name)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            done => done?,
        }
        if let Ok(wake) = self.wake.lock() {
            let _ = wake.send(());
        }
        Ok(())
    }

    /// Whether the trash holds nothing.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        std::fs::read_dir(&self.dir).map_or(true, |mut entries| entries.next().is_none())
    }
}

/// The trash's thread: empties `dir` whenever woken, and now and then unwoken (to retry what
/// failed), until the daemon that woke it is gone.
fn empty_forever(dir: &Path, woken: &mpsc::Receiver<()>) {
    loop {
        empty(dir);
        match woken.recv_timeout(RETRY) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        // Wakes that came meanwhile are served by the same pass.
        while woken.try_recv().is_ok() {}
    }
}

/// Removes every tree in the trash.
fn empty(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let started = Instant::now();
        match remove_tree(&path) {
            Ok(removed) => {
                tracing::debug!(path = %path.display(), files = removed.files, directories = removed.directories, seconds = started.elapsed().as_secs_f64(), "removed a discarded tree")
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a discarded tree; trying again later")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deep_tree_and_a_wide_one_are_removed_without_recursion() {
        let scratch = tempfile::tempdir().unwrap();
        let top = scratch.path().join("workspace");
        std::fs::create_dir(&top).unwrap();
        // 20 000 levels: deeper than any recursion on a 2 MiB stack could go through std.
        let mut level = open(&top, DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..20_000 {
            nix::sys::stat::mkdirat(&level, c"d", Mode::from_bits_truncate(0o755)).unwrap();
            let file = openat(
                &level,
                c"f",
                OFlag::O_CREAT | OFlag::O_WRONLY,
                Mode::from_bits_truncate(0o644),
            )
            .unwrap();
            drop(file);
            level = openat(&level, c"d", DIRECTORY, Mode::empty()).unwrap();
        }
        drop(level);
        let mut deep = top.clone();
        deep.push("wide");
        std::fs::create_dir(&deep).unwrap();
        for n in 0..5_000 {
            std::fs::write(deep.join(n.to_string()), b"").unwrap();
        }
        let removed = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || remove_tree(&top))
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        assert_eq!(removed.directories, 20_002);
        assert_eq!(removed.files, 25_000);
        assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
    }

    #[test]
    fn links_are_removed_never_followed() {
        let scratch = tempfile::tempdir().unwrap();
        let outside = scratch.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"mine").unwrap();
        let top = scratch.path().join("workspace");
        std::fs::create_dir_all(top.join("a/b")).unwrap();
        std::os::unix::fs::symlink(&outside, top.join("a/b/link")).unwrap();
        std::os::unix::fs::symlink(&outside, top.join("top-link")).unwrap();
        remove_tree(&top).unwrap();
        assert!(!top.exists());
        assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"mine");
        // A link where the tree was is removed itself.
        let link = scratch.path().join("link");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        remove_tree(&link).unwrap();
        assert!(std::fs::symlink_metadata(&link).is_err());
        assert!(outside.join("keep").exists());
        assert_eq!(remove_tree(&link).unwrap(), Removed::default());
    }

    #[test]
    fn a_discarded_tree_leaves_its_place_at_once_and_the_trash_empties() {
        let scratch = tempfile::tempdir().unwrap();
        let workspace = scratch.path().join("demo");
        std::fs::create_dir_all(workspace.join("x/y")).unwrap();
        std::fs::write(workspace.join("x/y/z"), b"z").unwrap();
        let trash = Trash::new(scratch.path());
        trash.discard(&workspace).unwrap();
        assert!(!workspace.exists());
        trash.discard(&workspace).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !trash.is_empty() {
            assert!(Instant::now() < deadline, "the trash did not empty");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
