//! The kernel a machine runs on: the host's, behind runc (`container`), or gVisor's, behind
//! runsc (`gvisor`), for every machine and every throwaway of a back end.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{ErrorKind, ProcessOutcome, ProcessSpec, Result, Runtime, RuntimeError};

/// What to install when runsc is missing.
pub const RUNSC_PACKAGE: &str =
    "the runsc package (Debian bookworm: `apt-get install -t bookworm-backports runsc`)";

/// `contrib/runsc/narya-runsc`: runsc as machines run under it (see the script's comment).
const WRAPPER: &str = include_str!("../../contrib/runsc/narya-runsc");
/// The wrapper's line naming runsc, replaced by the configured binary.
const WRAPPER_RUNSC_LINE: &str = "runsc=/usr/bin/runsc\n";

/// Under gVisor every process a back end runs in a machine carries `NARYA_EXEC=<its name>`:
/// the host sees only gVisor's own process for it, so what it started is found, and killed,
/// from inside by this mark.
pub(crate) const EXEC_MARK: &str = "NARYA_EXEC";
/// Marks a sweep's own process, which is never itself swept by mark (see [`sweep`]).
const SWEEP_VARIABLE: &str = "NARYA_SWEEP";

/// Kills, from inside the machine, every process whose environment has `$NARYA_SWEEP` as an
/// entry, for up to five rounds (a double fork can outrun one), and prints how many the first
/// round found. Its own children (`grep`, `wc`) do not carry the entry, and the shell's own
/// entry is `NARYA_SWEEP=<entry>`, never `<entry>` itself.
const SWEEP: &str = r#"killed=0
for round in 1 2 3 4 5; do
  found=
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = 1 ] || [ "$pid" = $$ ] && continue
    grep -qzxF -- "$NARYA_SWEEP" "$p/environ" 2>/dev/null && found="$found $pid"
  done
  [ -z "$found" ] && break
  # Stopped first, all of them: a shell that outlives its children by a moment would report
  # their deaths in its output.
  kill -STOP $found 2>/dev/null
  kill -KILL $found 2>/dev/null
  [ "$round" = 1 ] && killed=$(echo $found | wc -w)
  sleep 0.1
done
echo "killed=$killed""#;

/// The process that kills what carries `entry` in a machine under gVisor.
pub(crate) fn sweep(entry: &str) -> ProcessSpec {
    ProcessSpec {
        argv: vec!["/bin/sh".into(), "-c".into(), SWEEP.into()],
        env: BTreeMap::from([(SWEEP_VARIABLE.to_owned(), entry.to_owned())]),
        cwd: Some("/".to_owned()),
        timeout: Duration::from_secs(30),
        output_limit: 4096,
        stdin: None,
        output: None,
    }
}

/// Whether `spec` is a sweep: a sweep's process is never marked, so that killing it (a sweep
/// that timed out) never sweeps again.
pub(crate) fn is_sweep(spec: &ProcessSpec) -> bool {
    spec.env.contains_key(SWEEP_VARIABLE)
}

/// Kills every process in machine `id` of `runtime` carrying `entry`, from inside (under
/// gVisor, where they are no host processes); 0 when the machine is missing or not running.
pub(crate) async fn sweep_in(runtime: &dyn Runtime, id: &str, entry: &str) -> Result<usize> {
    match runtime.run(id, &sweep(entry)).await {
        Ok(outcome) => swept(&outcome),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// How many processes a sweep reports it killed.
fn swept(outcome: &ProcessOutcome) -> Result<usize> {
    let text = String::from_utf8_lossy(&outcome.output);
    text.lines()
        .find_map(|line| line.strip_prefix("killed="))
        .and_then(|n| n.trim().parse().ok())
        .filter(|_| outcome.exit_code == Some(0))
        .ok_or_else(|| {
            RuntimeError::plain(
                ErrorKind::Other,
                format!(
                    "a sweep in the machine failed ({:?}): {text}",
                    outcome.exit_code
                ),
            )
        })
}

/// The kernel machines run on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Sandbox {
    /// The host's kernel, behind runc.
    #[default]
    Container,
    /// gVisor: `runsc` is the runsc binary (containerd) or the name the engine registered it
    /// under (Docker, Podman).
    Gvisor { runsc: String },
}

impl Sandbox {
    /// How configuration and messages name it.
    pub fn name(&self) -> &'static str {
        match self {
            Sandbox::Container => "container",
            Sandbox::Gvisor { .. } => "gvisor",
        }
    }
}

/// Writes the wrapper that runs `runsc` to `to` (mode 0755, replacing what is there), after
/// checking that `runsc` is an executable file.
pub fn write_wrapper(runsc: &Path, to: &Path) -> Result<PathBuf> {
    let fail = |what: String| RuntimeError::plain(ErrorKind::Other, what);
    match std::fs::metadata(runsc) {
        Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => {}
        Ok(_) => {
            return Err(fail(format!(
                "runtime.runsc {} is not an executable file: install {RUNSC_PACKAGE}, or name \
                 its binary in runtime.runsc",
                runsc.display()
            )))
        }
        Err(e) => {
            return Err(fail(format!(
                "runtime.runsc {}: {e}; [runtime] sandbox = \"gvisor\" needs gVisor: install \
                 {RUNSC_PACKAGE}, or name its binary in runtime.runsc",
                runsc.display()
            )))
        }
    }
    let text = runsc
        .to_str()
        .filter(|path| path.starts_with('/') && !path.contains(['\'', '\n']))
        .map(|path| WRAPPER.replacen(WRAPPER_RUNSC_LINE, &format!("runsc='{path}'\n"), 1))
        .ok_or_else(|| {
            fail(format!(
                "runtime.runsc {}: give an absolute path without quotes or newlines",
                runsc.display()
            ))
        })?;
    let written = (|| {
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let partial = to.with_extension("partial");
        std::fs::write(&partial, text)?;
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
        std::fs::rename(&partial, to)
    })();
    written.map_err(|e| {
        RuntimeError::caused(
            ErrorKind::Other,
            format!("writing the runsc wrapper {}", to.display()),
            e,
        )
    })?;
    Ok(to.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_names_the_configured_runsc() {
        assert!(WRAPPER.contains(WRAPPER_RUNSC_LINE), "the line to replace");
        let dir = tempfile::tempdir().unwrap();
        let runsc = dir.path().join("my runsc");
        std::fs::write(&runsc, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&runsc, std::fs::Permissions::from_mode(0o755)).unwrap();
        let wrapper = write_wrapper(&runsc, &dir.path().join("bin/runsc")).unwrap();
        let text = std::fs::read_to_string(&wrapper).unwrap();
        assert!(text.contains(&format!("runsc='{}'\n", runsc.display())));
        assert!(!text.contains(WRAPPER_RUNSC_LINE));
        let mode = std::fs::metadata(&wrapper).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
    }

    #[test]
    fn a_missing_runsc_names_the_package() {
        let dir = tempfile::tempdir().unwrap();
        let e = write_wrapper(&dir.path().join("runsc"), &dir.path().join("w")).unwrap_err();
        assert!(e.to_string().contains("bookworm-backports runsc"), "{e}");
        assert!(!dir.path().join("w").exists());
    }
}
