//! A process's attached streams over the engine's hijacked connection: output carried into the
//! kept tail and the caller's channel, input written then closed, and what became of the process
//! once the watcher saw it end.

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
use crate::watch::{AbortOnDrop, Ending};
use crate::{ProcessOutcome, Result};

/// How long output may still arrive after a process was killed.
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

pub(super) type Frames = Pin<Box<dyn Stream<Item = Result<LogOutput, EngineError>> + Send>>;
pub(super) type Input = Pin<Box<dyn AsyncWrite + Send>>;

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

    /// Reads until the stream ends; `Unavailable` when it breaks (the engine went away
    /// mid-process). A chunk is in the caller's channel before the next one is read, so nothing
    /// is sent once reading stops unless `drain` is called. The watcher bounds all of it: a
    /// slow reader holds the process back, but never past its deadline.
    pub(super) async fn read_all(&mut self) -> Result<()> {
        self.read_until_over(std::future::pending(), Duration::ZERO)
            .await
    }

    /// Reads like `read_all`, until `over` (the engine reports the process ended) and then only
    /// until no output came for `quiet`: the engine may never close the stream of a process that
    /// ended (Docker leaves an exec's stream open when its gVisor sandbox dies under it). Output
    /// that keeps coming is read to its end, however slowly the caller takes it; and waiting
    /// for `over` never cuts a chunk short on its way to the caller.
    pub(super) async fn read_until_over(
        &mut self,
        over: impl std::future::Future<Output = ()>,
        quiet: Duration,
    ) -> Result<()> {
        let mut over = std::pin::pin!(over);
        let mut ended = false;
        loop {
            let next = if ended {
                match tokio::time::timeout(quiet, self.frames.next()).await {
                    Ok(next) => next,
                    Err(_) => return Ok(()),
                }
            } else {
                // Only the wait for a frame is raced, and a stream's `next` loses nothing when
                // it is dropped.
                tokio::select! {
                    next = self.frames.next() => next,
                    () = &mut over => {
                        ended = true;
                        continue;
                    }
                }
            };
            let Some(frame) = next else {
                return Ok(());
            };
            let bytes = frame
                .map_err(|e| classify("reading process output", e))?
                .into_bytes();
            self.tail.push(&bytes);
            if let Some(sink) = &self.sink {
                if sink.send(bytes.to_vec()).await.is_err() {
                    // Nobody listens any more: the watcher sees the channel closed and ends
                    // the process, so reading stops here for good.
                    std::future::pending::<()>().await;
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

    /// What became of the process, from how watching it ended: a killed one has no exit code,
    /// and what it wrote on its way out is still read for a moment.
    pub(super) async fn outcome(
        mut self,
        ending: Ending<Result<Option<i32>>>,
        started: Instant,
    ) -> Result<ProcessOutcome> {
        let timed_out = matches!(ending, Ending::TimedOut);
        let exit_code = match ending {
            Ending::Ended(exited) => exited?,
            Ending::TimedOut | Ending::Abandoned => {
                self.drain(OUTPUT_GRACE).await;
                None
            }
        };
        let (output, output_truncated) = self.tail.finish();
        Ok(ProcessOutcome {
            exit_code,
            output,
            output_truncated,
            timed_out,
            duration: started.elapsed(),
        })
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
