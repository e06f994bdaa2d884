//! Streamed answers (NDJSON) read as typed events: a create's progress, an exec's output.

use hyper::StatusCode;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::{ClientError, Streamed};
use crate::api::types::{EnvironmentView, EventLine};

/// Whether a create's step began or ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    Started,
    Finished,
}

/// What a streamed create reports as it happens.
#[derive(Debug)]
pub enum CreateEvent {
    /// A step (`image`, `clone`, `machine`, `setup`) began or ended.
    Step { step: String, state: StepState },
    /// Output of the clone or the setup script, as it came.
    Output { step: String, output: String },
    /// The environment, once the create is over.
    Environment(Box<EnvironmentView>),
}

/// A create answered as it happens.
pub struct CreateStream {
    pub(super) lines: Streamed,
}

impl CreateStream {
    /// 201 when it is provisioned now, 200 when it already existed (or was being provisioned).
    pub fn status(&self) -> StatusCode {
        self.lines.status
    }

    /// Whether the environment existed before this request.
    pub fn existed(&self) -> bool {
        self.status() == StatusCode::OK
    }

    /// What the existing environment was made with that this request differs in
    /// (`setup`, `repository` or `setup, repository`), when it does.
    pub fn differs(&self) -> Option<&str> {
        super::differs(&self.lines.headers)
    }

    /// The next event; `None` at the end. A create that fails after its stream began is
    /// `ClientError::Failed`. Lines of a kind this client does not know are skipped, so the
    /// daemon may add some.
    pub async fn next_event(&mut self) -> Result<Option<CreateEvent>, ClientError> {
        while let Some(mut line) = self.lines.next_json().await? {
            if let Some(environment) = line.get_mut("environment") {
                let environment = decode_value(environment.take(), "an environment")?;
                return Ok(Some(CreateEvent::Environment(environment)));
            }
            stream_failure(&mut line)?;
            let Some(step) = line.get("step").and_then(|s| s.as_str()) else {
                continue;
            };
            let step = step.to_owned();
            if let Some(output) = line.get("output").and_then(|o| o.as_str()) {
                let output = output.to_owned();
                return Ok(Some(CreateEvent::Output { step, output }));
            }
            if let Some(Ok(state)) = line
                .get_mut("state")
                .map(|s| StepState::deserialize(s.take()))
            {
                return Ok(Some(CreateEvent::Step { step, state }));
            }
        }
        Ok(None)
    }
}

/// How a streamed command ended.
#[derive(Debug, Deserialize)]
pub struct ExecExit {
    /// `None` when the command was killed.
    pub exit_code: Option<i64>,
    pub timed_out: bool,
    pub duration_ms: u64,
}

/// What a streamed exec reports as it happens.
#[derive(Debug)]
pub enum ExecEvent {
    /// Combined stdout and stderr, as it came.
    Output(String),
    /// The command ended; the stream ends here.
    Exited(ExecExit),
}

/// An exec answered as it happens.
pub struct ExecStream {
    pub(super) lines: Streamed,
}

impl ExecStream {
    /// The next event; `None` at the end. An exec that fails after its stream began is
    /// `ClientError::Failed`. Lines of a kind this client does not know are skipped.
    pub async fn next_event(&mut self) -> Result<Option<ExecEvent>, ClientError> {
        while let Some(mut line) = self.lines.next_json().await? {
            if let Some(output) = line.get("output").and_then(|o| o.as_str()) {
                return Ok(Some(ExecEvent::Output(output.to_owned())));
            }
            stream_failure(&mut line)?;
            if line.get("timed_out").is_some() {
                let exit = decode_value(line, "a command's exit")?;
                return Ok(Some(ExecEvent::Exited(exit)));
            }
        }
        Ok(None)
    }
}

/// What `GET /v1/events` reports as it happens (heartbeats are read and skipped).
#[derive(Debug)]
pub enum WatchEvent {
    /// An environment's status was just written.
    Changed(EventLine),
    /// The reader fell behind and missed this many changes.
    Lagged(u64),
}

/// The organisation's status changes, read as they happen.
pub struct WatchStream {
    pub(super) lines: Streamed,
}

impl WatchStream {
    /// The next change (or how many were missed); `None` when the daemon ends the stream.
    pub async fn next_event(&mut self) -> Result<Option<WatchEvent>, ClientError> {
        while let Some(mut line) = self.lines.next_json().await? {
            if let Some(missed) = line.get("lagged").and_then(|n| n.as_u64()) {
                return Ok(Some(WatchEvent::Lagged(missed)));
            }
            stream_failure(&mut line)?;
            if line.get("status").is_some() {
                return Ok(Some(WatchEvent::Changed(decode_value(line, "an event")?)));
            }
        }
        Ok(None)
    }
}

/// A stream's last line `{"error": {code, message}}`, as the error it reports.
fn stream_failure(line: &mut serde_json::Value) -> Result<(), ClientError> {
    match line.get_mut("error") {
        Some(error) => Err(ClientError::Failed {
            error: decode_value(error.take(), "an error")?,
        }),
        None => Ok(()),
    }
}

fn decode_value<T: DeserializeOwned>(
    value: serde_json::Value,
    expected: &'static str,
) -> Result<T, ClientError> {
    serde_json::from_value(value).map_err(|source| ClientError::Decode { expected, source })
}
