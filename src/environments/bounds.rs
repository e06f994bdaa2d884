//! Time bounds that outlive the daemon. Every setup and exec runs inside its machine under
//! coreutils `timeout -s KILL` a little past its own bound, so a daemon that is gone does not
//! leave an unbounded command, and carries a mark in its environment (`NARYA_RUN=<boot>.<n>`)
//! that its descendants inherit. A run in flight is written down in the state directory
//! (`runs/<boot>.<n>`, holding the machine's name) until it ends, so that a later daemon knows
//! which runs nobody tracks any more and kills what is left of them; a run that is killed has
//! its marked processes killed at once, those that left its process group too.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use narya_runtimes::{ProcessOutcome, ProcessSpec, RuntimeError};
use sha2::{Digest as _, Sha256};

use super::Environments;

/// The environment variable that marks a run's processes.
pub const MARK: &str = "NARYA_RUN";
/// The bound inside the machine over the daemon's own: the daemon's watch ends a run first.
const INSIDE_GRACE: Duration = Duration::from_secs(5);
/// The bounding wrapper in the official image (coreutils).
const TIMEOUT: &str = "/usr/bin/timeout";

/// This daemon's runs: its boot's id, their counter, and where runs in flight are written down.
pub(super) struct Bounds {
    boot: String,
    next: AtomicU64,
    ledger: PathBuf,
}

/// One run in flight, written down until it [ends](Run::ended). A run dropped before (its
/// task cancelled, the daemon stopping with it under way) stays written down, so that the next
/// daemon kills what is left of it.
pub(super) struct Run {
    /// Its mark as an environment entry, `NARYA_RUN=<boot>.<n>`.
    entry: String,
    file: Option<PathBuf>,
}

impl Run {
    /// The run is over: struck from the ledger.
    fn ended(self) {
        if let Some(file) = &self.file {
            if let Err(e) = std::fs::remove_file(file) {
                tracing::warn!(run = %self.entry, error = %e, "could not strike a finished run from the ledger");
            }
        }
    }
}

/// An id for this daemon's start that no earlier one had: random bytes where the system has
/// them, with the pid and the time mixed in.
fn boot_id() -> String {
    let mut hasher = Sha256::new();
    let mut random = [0u8; 16];
    if let Ok(mut urandom) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut urandom, &mut random);
    }
    hasher.update(random);
    hasher.update(std::process::id().to_le_bytes());
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    hasher.update(now.as_nanos().to_le_bytes());
    hasher.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether a run whose wrapper exited with `code` ended by itself. A wrapper that ended by a
/// signal (the shell's 128 + n) may have been killed from inside the run (`kill -9 $PPID`),
/// leaving what it started unbounded: that run is treated as killed, whoever sent the signal.
fn ended_by_itself(code: i32) -> bool {
    !(129..=192).contains(&code)
}

/// `duration` as `timeout` reads it: seconds, to the millisecond.
fn seconds(duration: Duration) -> String {
    format!("{}.{:03}s", duration.as_secs(), duration.subsec_millis())
}

impl Bounds {
    /// A new boot's bounds, writing runs in flight under `ledger`.
    pub fn new(ledger: PathBuf) -> Bounds {
        Bounds {
            boot: boot_id(),
            next: AtomicU64::new(0),
            ledger,
        }
    }

    /// Marks `spec` as a new run in `machine`, bounds it inside the machine too, and writes it
    /// down as in flight. A ledger that cannot be written costs only the kill after a restart
    /// (the bound inside the machine still holds), so it is logged, not fatal.
    pub fn start(&self, machine: &str, spec: &mut ProcessSpec) -> Run {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mark = format!("{}.{n}", self.boot);
        let mut argv = vec![
            TIMEOUT.to_owned(),
            "-s".to_owned(),
            "KILL".to_owned(),
            seconds(spec.timeout + INSIDE_GRACE),
        ];
        argv.append(&mut spec.argv);
        spec.argv = argv;
        spec.env.insert(MARK.to_owned(), mark.clone());
        let file = self.ledger.join(&mark);
        let written =
            std::fs::create_dir_all(&self.ledger).and_then(|()| std::fs::write(&file, machine));
        let file = match written {
            Ok(()) => Some(file),
            Err(e) => {
                tracing::warn!(run = %mark, error = %e, "could not write a run down as in flight; a restart will not find it");
                None
            }
        };
        Run {
            entry: format!("{MARK}={mark}"),
            file,
        }
    }

    /// The runs written down by earlier boots: (file, mark entry, machine).
    fn earlier_runs(&self) -> std::io::Result<Vec<(PathBuf, String, String)>> {
        let entries = match std::fs::read_dir(&self.ledger) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            entries => entries?,
        };
        let ours = format!("{}.", self.boot);
        let mut runs = Vec::new();
        for entry in entries {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if name.starts_with(&ours) {
                continue;
            }
            let machine = std::fs::read_to_string(entry.path()).unwrap_or_default();
            runs.push((entry.path(), format!("{MARK}={name}"), machine));
        }
        Ok(runs)
    }
}

impl Environments {
    /// Runs `spec` in `machine` within its bounds (see the module): on a kill, what it started
    /// is killed too, wherever in the machine it went.
    pub(super) async fn run_bounded(
        &self,
        machine: &str,
        mut spec: ProcessSpec,
    ) -> Result<ProcessOutcome, RuntimeError> {
        let run = self.bounds.start(machine, &mut spec);
        let outcome = self.runtime.run(machine, &spec).await;
        // Killed (timed out, or nobody read it): the runtime took its process tree; descendants
        // that left it (double fork, `setsid`) still carry the mark. A run the runtime failed
        // is nobody's either. What cannot be killed now stays written down for the next daemon.
        let over = match &outcome {
            Ok(o) if o.exit_code.is_some_and(ended_by_itself) => true,
            _ => self.kill_marked(machine, &run.entry).await,
        };
        if over {
            run.ended();
        }
        outcome
    }

    /// Kills every process in `machine` marked with `entry`. Returns false when the runtime
    /// cannot say where the machine's processes are, so it may be tried again.
    async fn kill_marked(&self, machine: &str, entry: &str) -> bool {
        match self.runtime.kill_marked(machine, entry).await {
            Ok(killed) => {
                if killed > 0 {
                    tracing::info!(
                        machine,
                        run = entry,
                        killed,
                        "killed what a run left behind"
                    );
                }
                true
            }
            Err(e) => {
                tracing::warn!(machine, run = entry, error = %e, "cannot find a run's processes to kill");
                false
            }
        }
    }

    /// Kills what runs of earlier boots left in flight in this host's own machines (those the
    /// store knows), striking each from the ledger once done. Returns true once none is left.
    pub(super) async fn sweep_earlier_runs(&self) -> bool {
        let runs = match self.bounds.earlier_runs() {
            Ok(runs) => runs,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the runs an earlier daemon left in flight");
                return false;
            }
        };
        if runs.is_empty() {
            return true;
        }
        let known: std::collections::HashSet<String> = match self.store.summaries().await {
            Ok(rows) => rows.into_iter().map(|r| r.machine).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the store to end earlier runs");
                return false;
            }
        };
        let mut done = true;
        for (file, entry, machine) in runs {
            let ended = !known.contains(&machine) || self.kill_marked(&machine, &entry).await;
            if ended {
                if let Err(e) = std::fs::remove_file(&file) {
                    tracing::warn!(run = %entry, error = %e, "could not strike an ended run from the ledger");
                }
            } else {
                done = false;
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn spec(argv: &[&str]) -> ProcessSpec {
        ProcessSpec {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            env: BTreeMap::from([(MARK.to_owned(), "forged".to_owned())]),
            cwd: None,
            timeout: Duration::from_millis(2500),
            output_limit: 10,
            stdin: None,
            output: None,
        }
    }

    #[test]
    fn a_run_is_bounded_inside_marked_and_written_down_until_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let bounds = Bounds::new(dir.path().join("runs"));
        let mut first = spec(&["sleep", "9"]);
        let run = bounds.start("narya-m", &mut first);
        assert_eq!(
            first.argv,
            ["/usr/bin/timeout", "-s", "KILL", "7.500s", "sleep", "9"]
        );
        let mark = first.env[MARK].clone();
        assert_eq!(
            mark,
            format!("{}.0", bounds.boot),
            "the caller cannot forge it"
        );
        assert_eq!(run.entry, format!("NARYA_RUN={mark}"));
        let file = dir.path().join("runs").join(&mark);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "narya-m");
        let mut second = spec(&["true"]);
        let second_run = bounds.start("narya-m", &mut second);
        assert_eq!(second.env[MARK], format!("{}.1", bounds.boot));
        run.ended();
        assert!(!file.exists());
        // Dropped before it ended (cancelled): still written down for the next daemon.
        drop(second_run);
        assert!(
            bounds.earlier_runs().unwrap().is_empty(),
            "ours are not earlier"
        );

        let later = Bounds {
            boot: "later".into(),
            next: AtomicU64::new(0),
            ledger: dir.path().join("runs"),
        };
        let earlier = later.earlier_runs().unwrap();
        assert_eq!(earlier.len(), 1);
        assert_eq!(earlier[0].1, format!("NARYA_RUN={}.1", bounds.boot));
        assert_eq!(earlier[0].2, "narya-m");
        assert_ne!(boot_id(), bounds.boot);
    }
}
