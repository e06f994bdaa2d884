//! The filesystem half of `naryad check-config`: where the daemon will write, the sockets it
//! will serve and reach, and the files it reads, looked at without creating or changing any.

use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use nix::unistd::AccessFlags;

/// Whether this process may create entries in `dir`.
fn writable_dir(dir: &Path) -> Result<(), String> {
    nix::unistd::access(dir, AccessFlags::W_OK | AccessFlags::X_OK)
        .map_err(|e| format!("{} is not writable by this user: {e}", dir.display()))
}

/// The closest ancestor of `path` that exists.
fn existing_ancestor(path: &Path) -> Option<&Path> {
    path.ancestors()
        .skip(1)
        .find(|dir| std::fs::symlink_metadata(dir).is_ok())
}

/// A directory the daemon creates if missing and then writes into (`state_dir`).
pub fn directory_to_write(path: &Path) -> Result<String, String> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_dir() => Err("exists and is not a directory".to_owned()),
        Ok(_) => {
            writable_dir(path)?;
            Ok("a directory naryad can write".to_owned())
        }
        Err(e) if e.kind() == ErrorKind::NotFound => creatable(path),
        Err(e) => Err(e.to_string()),
    }
}

/// A path whose missing directories the daemon creates: the closest existing one must be a
/// writable directory.
fn creatable(path: &Path) -> Result<String, String> {
    let Some(ancestor) = existing_ancestor(path) else {
        return Err("no directory above it exists".to_owned());
    };
    if !ancestor.is_dir() {
        return Err(format!("{} is not a directory", ancestor.display()));
    }
    writable_dir(ancestor)?;
    Ok(format!(
        "does not exist yet; naryad will create it in {}",
        ancestor.display()
    ))
}

/// The unix socket the daemon serves: free to bind, or a live socket (a daemon serving it now,
/// which a restart replaces), never another kind of file.
pub fn socket_to_serve(path: &Path) -> Result<String, String> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            Err("exists and is not a socket; naryad would refuse to replace it".to_owned())
        }
        Ok(_) => {
            let dir = path.parent().unwrap_or(Path::new("/"));
            writable_dir(dir)?;
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => Ok("a daemon is serving it now (a restart takes it over)".to_owned()),
                Err(_) => Ok("a stale socket naryad will replace".to_owned()),
            }
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let dir = path.parent().unwrap_or(Path::new("/"));
            match std::fs::metadata(dir) {
                Ok(meta) if meta.is_dir() => {
                    writable_dir(dir)?;
                    Ok(format!("{} can hold it", dir.display()))
                }
                Ok(_) => Err(format!("{} is not a directory", dir.display())),
                Err(_) => creatable(path),
            }
        }
        Err(e) => Err(e.to_string()),
    }
}

/// A socket the daemon connects to (the runtime's): it must exist and be a socket.
pub fn socket_to_reach(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => Ok(()),
        Ok(_) => Err("is not a socket".to_owned()),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            Err("does not exist (is the runtime running, and is this its socket?)".to_owned())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// A file the daemon reads (the GitHub App's key).
pub fn file_to_read(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => nix::unistd::access(path, AccessFlags::R_OK)
            .map_err(|e| format!("is not readable by this user: {e}")),
        Ok(_) => Err("is not a regular file".to_owned()),
        Err(e) if e.kind() == ErrorKind::NotFound => Err("does not exist".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_under_a_writable_one_can_be_made() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("a/b/state");
        let said = directory_to_write(&state).unwrap();
        assert!(said.contains("will create"), "{said}");
        assert!(!state.exists(), "checking created it");
        directory_to_write(dir.path()).unwrap();
    }

    #[test]
    fn a_file_where_a_directory_or_socket_goes_is_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(directory_to_write(&file).is_err());
        assert!(socket_to_serve(&file).is_err());
        assert!(socket_to_reach(&file).is_err());
        assert!(directory_to_write(&file.join("below")).is_err());
        assert!(socket_to_serve(&file.join("below")).is_err());
        file_to_read(&file).unwrap();
        assert!(file_to_read(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn sockets_are_told_apart_by_whether_they_answer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        assert!(socket_to_serve(&path).unwrap().contains("can hold it"));
        assert!(socket_to_reach(&path).is_err());
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        socket_to_reach(&path).unwrap();
        assert!(socket_to_serve(&path).unwrap().contains("serving it now"));
        drop(listener);
        assert!(socket_to_serve(&path).unwrap().contains("stale"));
    }
}
