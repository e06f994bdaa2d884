//! The seccomp filter stated explicitly to the engine. The Docker Engine takes the profile
//! itself in `seccomp=`; Podman's Docker-compatible service reads `seccomp=` as a file path, so
//! for Podman the profile is written once into the daemon's own directory: to a fresh file
//! opened with `O_EXCL`, then renamed over the final name, so no reader sees half a profile and
//! nothing another user placed there is followed or reused.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use narya_oci::seccomp::default_profile;

use super::Docker;
use crate::{ErrorKind, Result, RuntimeError};

/// The profile as JSON: Docker's profile format reads the OCI fields the filter uses.
pub(super) fn profile_json() -> Result<String> {
    serde_json::to_string(&default_profile())
        .map_err(|e| RuntimeError::caused(ErrorKind::Other, "encoding the seccomp profile", e))
}

/// Names each fresh file apart from any other this process writes at the same time.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Writes `text` to `dir/name` atomically: a new private file beside it, then a rename.
fn write_atomically(dir: &Path, name: &str, text: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let target = dir.join(name);
    let fresh = dir.join(format!(
        ".{name}.{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&fresh)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&fresh, &target)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&fresh);
    }
    written.map(|()| target)
}

impl Docker {
    /// The value after `seccomp=` in a container's security options.
    pub(super) async fn seccomp_option(&self) -> Result<String> {
        let json = profile_json()?;
        if !self.engine.is_podman().await? {
            return Ok(json);
        }
        let mut written = self.seccomp_file.lock().await;
        if let Some(path) = written.as_ref() {
            return Ok(path.display().to_string());
        }
        let path = write_atomically(&self.profile_dir, "seccomp.json", &json).map_err(|e| {
            RuntimeError::caused(
                ErrorKind::Other,
                format!(
                    "docker: writing the seccomp profile into {}",
                    self.profile_dir.display()
                ),
                e,
            )
        })?;
        *written = Some(path.clone());
        Ok(path.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_is_written_whole_and_replaced_atomically() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let first = write_atomically(dir.path(), "seccomp.json", "{}").expect("written");
        let again = write_atomically(dir.path(), "seccomp.json", "{\"a\":1}").expect("rewritten");
        assert_eq!(first, again);
        assert_eq!(
            std::fs::read_to_string(&again).expect("readable"),
            "{\"a\":1}"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("listable")
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("seccomp.json")]);
    }

    #[test]
    fn the_profile_reads_as_a_docker_profile() {
        let json: serde_json::Value =
            serde_json::from_str(&profile_json().expect("encoded")).expect("JSON");
        assert_eq!(json["defaultAction"], "SCMP_ACT_ERRNO");
        assert!(json["syscalls"].as_array().is_some_and(|s| s.len() > 5));
    }
}
