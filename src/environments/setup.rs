//! Running the setup script once, bounded and unprivileged, and turning what any step's process
//! did into the setup record the store keeps.

use std::collections::BTreeMap;
use std::time::SystemTime;

use narya_runtimes::{ProcessOutcome, ProcessSpec};
use tokio::sync::{broadcast, mpsc};

use super::{EnvironmentError, Environments, Progress, Utf8Chunks};
use crate::github::Redactor;
use crate::model::{now_rfc3339, rfc3339, SetupState, SetupStep};
use crate::store::SetupRecord;

/// Runs the setup script from stdin as a file in the machine's private /tmp: a script may be
/// longer than one argument can carry, and one with a `#!` line chooses its own interpreter.
/// Its stderr joins its stdout in one pipe, so the recorded output keeps the order it was
/// written in (two pipes are copied independently and interleave arbitrarily).
const SETUP_WRAPPER: &str = r#"f=$(mktemp /tmp/narya-setup.XXXXXX) || exit 125
cat > "$f" || exit 125
chmod 700 "$f"
case "$(head -c 2 "$f")" in
  '#!') "$f" </dev/null 2>&1 ;;
  *) /bin/bash "$f" </dev/null 2>&1 ;;
esac"#;

/// The record of `step`'s process, which began at `started_at`; `output` is what may be kept
/// of its output (secrets already taken out).
pub(super) fn step_record(
    step: SetupStep,
    outcome: &ProcessOutcome,
    output: &[u8],
    started_at: SystemTime,
) -> SetupRecord {
    SetupRecord {
        state: SetupState::of(outcome.exit_code, outcome.timed_out),
        step,
        exit_code: outcome.exit_code.map(i64::from),
        output: String::from_utf8_lossy(output).into_owned(),
        output_truncated: outcome.output_truncated,
        started_at: rfc3339(started_at),
        finished_at: now_rfc3339(),
        prebuilt_at: None,
    }
}

/// Streams a step's output to the create's progress as text, with `redactor`'s secrets taken
/// out first. We read the output ourselves, so nobody's stream going away can stop the step.
pub(super) fn forward_output(
    step: &'static str,
    events: &broadcast::Sender<Progress>,
    mut redactor: Redactor,
) -> (mpsc::Sender<Vec<u8>>, tokio::task::JoinHandle<()>) {
    let (chunks, mut chunks_rx) = mpsc::channel::<Vec<u8>>(64);
    let events = events.clone();
    let forward = tokio::spawn(async move {
        let mut text = Utf8Chunks::default();
        let send = |output: String| {
            if !output.is_empty() {
                let _ = events.send(Progress::Output { step, output });
            }
        };
        while let Some(chunk) = chunks_rx.recv().await {
            send(text.push(&redactor.push(&chunk)));
        }
        send(text.push(&redactor.finish()));
        send(text.finish());
    });
    (chunks, forward)
}

impl Environments {
    /// Runs the setup script once in `machine`, bounded, as the unprivileged user in the
    /// workspace.
    pub(super) async fn run_setup(
        &self,
        machine: &str,
        script: &str,
        events: &broadcast::Sender<Progress>,
    ) -> Result<SetupRecord, EnvironmentError> {
        let env = &self.config.environment;
        let started_at = SystemTime::now();
        let (chunks, forward) = forward_output("setup", events, Redactor::none());
        let spec = ProcessSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), SETUP_WRAPPER.into()],
            env: BTreeMap::new(),
            cwd: None,
            timeout: env.setup_timeout.0,
            output_limit: env.output_limit,
            stdin: Some(script.as_bytes().to_vec()),
            output: Some(chunks),
        };
        // The spec holds the output's sending end: it goes with the run, ending the forwarding.
        let outcome = self.run_bounded(machine, spec).await;
        let _ = forward.await;
        let outcome = outcome?;
        let record = step_record(SetupStep::Setup, &outcome, &outcome.output, started_at);
        tracing::info!(state = record.state.as_str(), exit_code = ?outcome.exit_code, "setup finished");
        Ok(record)
    }
}
