//! What a process in the fake runtime does: the outcome a test scripted, its output streamed
//! and cut to its tail, and the kill when nobody reads it or it runs past its bound.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::{ProcessOutcome, ProcessSpec};

/// The largest chunk sent to `ProcessSpec::output` at once, as the real back ends read.
const CHUNK: usize = 32 * 1024;

/// One process the fake was asked to run, as the test sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeProcess {
    /// The machine id, or the throwaway's name.
    pub machine: String,
    pub throwaway: bool,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub stdin: Option<Vec<u8>>,
    /// The host directory the process sees as its workspace; `None` in a machine the fake did
    /// not create (one given to `add_machine`).
    pub workspace: Option<PathBuf>,
}

/// How a process ends, as a test scripts it with `FakeRuntime::on_process`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeOutcome {
    /// The process exits with `code` after writing `output`.
    Exit { code: i32, output: Vec<u8> },
    /// The process writes `output`, then runs past its bound and is killed.
    TimedOut { output: Vec<u8> },
}

impl Default for FakeOutcome {
    fn default() -> FakeOutcome {
        FakeOutcome::Exit {
            code: 0,
            output: Vec::new(),
        }
    }
}

/// What a test says every process does; the default outcome when it says nothing.
pub(super) type ProcessScript = dyn Fn(&FakeProcess) -> FakeOutcome + Send + Sync;

/// Plays `planned` out against `spec`: output streamed to `spec.output` in chunks, then the
/// outcome. A receiver that is gone kills the process; output nobody takes within
/// `spec.timeout` times it out. Neither takes real time otherwise.
pub(super) async fn play(planned: FakeOutcome, spec: &ProcessSpec) -> ProcessOutcome {
    let (exit_code, output, timed_out) = match planned {
        FakeOutcome::Exit { code, output } => (Some(code), output, false),
        FakeOutcome::TimedOut { output } => (None, output, true),
    };
    let mut written = 0;
    let delivery = deliver(spec.output.as_ref(), &output, &mut written);
    let (exit_code, timed_out, duration) = match tokio::time::timeout(spec.timeout, delivery).await
    {
        Ok(Delivery::Done) if timed_out => (None, true, spec.timeout),
        Ok(Delivery::Done) => (exit_code, false, Duration::ZERO),
        Ok(Delivery::Abandoned) => (None, false, Duration::ZERO),
        Err(_) => (None, true, spec.timeout),
    };
    let (output, output_truncated) = tail(&output[..written], spec.output_limit);
    ProcessOutcome {
        exit_code,
        output,
        output_truncated,
        timed_out,
        duration,
    }
}

enum Delivery {
    Done,
    /// The receiver went away: the process is killed.
    Abandoned,
}

/// Sends `output` to `sink` a line (at most [`CHUNK`] bytes) at a time, counting in `written`
/// what the process got to write before it ended.
async fn deliver(
    sink: Option<&mpsc::Sender<Vec<u8>>>,
    output: &[u8],
    written: &mut usize,
) -> Delivery {
    let Some(sink) = sink else {
        *written = output.len();
        return Delivery::Done;
    };
    // A process whose output nobody reads any more is killed even if it writes nothing.
    if sink.is_closed() {
        return Delivery::Abandoned;
    }
    for chunk in output
        .split_inclusive(|b| *b == b'\n')
        .flat_map(|line| line.chunks(CHUNK))
    {
        *written += chunk.len();
        if sink.send(chunk.to_vec()).await.is_err() {
            return Delivery::Abandoned;
        }
    }
    Delivery::Done
}

/// The last `limit` bytes of `bytes`, and whether any were dropped.
fn tail(bytes: &[u8], limit: usize) -> (Vec<u8>, bool) {
    let start = bytes.len().saturating_sub(limit);
    (bytes[start..].to_vec(), start > 0)
}
