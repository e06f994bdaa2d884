//! A process's attached streams over the engine's hijacked connection: output carried into the
//! kept tail and the caller's channel, bounded by the process's deadline, input written then
//! closed.

use std::pin::Pin;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::errors::Error as EngineError;
use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::Sender;
use tokio::time::Instant;

use super::engine::classify;
use crate::output::TailBuffer;
use crate::RuntimeError;

pub(super) type Frames = Pin<Box<dyn Stream<Item = Result<LogOutput, EngineError>> + Send>>;
pub(super) type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// Why reading a process's output stopped.
#[derive(Debug)]
pub(super) enum Ending {
    /// The engine closed the stream: every writer closed its end (or the engine gave up on them
    /// after the process ended).
    Ended,
    /// The deadline passed first.
    TimedOut,
    /// The caller dropped the receiving end of its output channel.
    Abandoned,
    /// The stream broke; the engine went away mid-process.
    Failed(RuntimeError),
}

/// Resolves when the caller stops listening; never when there is no channel.
pub(super) async fn abandoned(sink: &Option<Sender<Vec<u8>>>) {
    match sink {
        Some(sink) => sink.closed().await,
        None => std::future::pending().await,
    }
}

/// Reads frames into the tail and the caller's channel.
pub(super) struct OutputPump {
    frames: Frames,
    tail: TailBuffer,
    sink: Option<Sender<Vec<u8>>>,
}

impl OutputPump {
    pub(super) fn new(frames: Frames, limit: usize, sink: Option<Sender<Vec<u8>>>) -> OutputPump {
        OutputPump {
            frames,
            tail: TailBuffer::new(limit),
            sink,
        }
    }

    /// Reads until the stream ends, `deadline` passes or the caller stops listening. A chunk is
    /// in the caller's channel before the next one is read, so nothing is sent after `run`
    /// returns unless `drain` is called.
    pub(super) async fn run(&mut self, deadline: Instant) -> Ending {
        loop {
            let frame = tokio::select! {
                frame = self.frames.next() => frame,
                _ = tokio::time::sleep_until(deadline) => return Ending::TimedOut,
                _ = abandoned(&self.sink) => return Ending::Abandoned,
            };
            let bytes = match frame {
                None => return Ending::Ended,
                Some(Err(e)) => return Ending::Failed(classify("reading process output", e)),
                Some(Ok(frame)) => frame.into_bytes(),
            };
            self.tail.push(&bytes);
            if let Some(sink) = &self.sink {
                // A slow reader holds the process back, but never past its deadline.
                tokio::select! {
                    sent = sink.send(bytes.to_vec()) => {
                        if sent.is_err() {
                            return Ending::Abandoned;
                        }
                    }
                    _ = tokio::time::sleep_until(deadline) => return Ending::TimedOut,
                }
            }
        }
    }

    /// After a kill: what is still on its way, for at most `grace`, so the tail holds the last
    /// words of the process.
    pub(super) async fn drain(&mut self, grace: Duration) {
        let until = Instant::now() + grace;
        while let Ok(Some(Ok(frame))) = tokio::time::timeout_at(until, self.frames.next()).await {
            let bytes = frame.into_bytes();
            self.tail.push(&bytes);
            if let Some(sink) = &self.sink {
                if !matches!(
                    tokio::time::timeout_at(until, sink.send(bytes.to_vec())).await,
                    Ok(Ok(()))
                ) {
                    self.sink = None;
                }
            }
        }
    }

    /// The kept bytes and whether earlier ones were dropped.
    pub(super) fn finish(self) -> (Vec<u8>, bool) {
        self.tail.finish()
    }
}

/// Stops a helper task when the process it serves is over.
pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Gives the process its input: `bytes`, then end of file. Without input the write half is held
/// (not closed) until the process is over: half-closing the connection is how the engine learns
/// of end of file, and there is no input to end. Dropping it stops the writer.
pub(super) struct Feeding {
    _writer: Option<AbortOnDrop>,
    _held: Option<Input>,
}

impl Feeding {
    pub(super) fn start(mut input: Input, bytes: Option<&Vec<u8>>) -> Feeding {
        let Some(bytes) = bytes.cloned() else {
            return Feeding {
                _writer: None,
                _held: Some(input),
            };
        };
        let writer = tokio::spawn(async move {
            // A process that exits without reading everything ends the write; that is fine.
            let _ = input.write_all(&bytes).await;
            let _ = input.shutdown().await;
        });
        Feeding {
            _writer: Some(AbortOnDrop(writer)),
            _held: None,
        }
    }
}
