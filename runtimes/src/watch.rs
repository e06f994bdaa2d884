//! Running one process in a machine, the same way on every back end: the machine must be running
//! first, and one watcher ends the process at its deadline or when nobody reads its output.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::mpsc::Sender;
use tokio::time::Instant;

use crate::{ErrorKind, MachineState, Result, RuntimeError};

/// The machine `id` of back end `runtime` as found with its state, unless it is known not to
/// run: `NotFound`. A machine whose state the runtime cannot tell right now (a busy shim) is
/// tried: the runtime itself refuses a process in a machine that is not running.
pub(crate) fn require_running<M>(
    runtime: &str,
    id: &str,
    found: Option<(M, MachineState)>,
) -> Result<M> {
    match found {
        Some((machine, MachineState::Running | MachineState::Unknown)) => Ok(machine),
        _ => Err(RuntimeError::plain(
            ErrorKind::NotFound,
            format!("{runtime}: machine {id} is not running"),
        )),
    }
}

/// How waiting for a process came out.
#[derive(Debug)]
pub(crate) enum Ending<T> {
    /// It ended by itself; `T` is what its end reported.
    Ended(T),
    /// It ran past its deadline, and was killed.
    TimedOut,
    /// Nobody read its output any more, and it was killed.
    Abandoned,
}

/// The process being watched, for the log and the bounds.
pub(crate) struct Watched<'a> {
    /// The machine (or throwaway) it runs in.
    pub machine: &'a str,
    /// When it has run too long.
    pub deadline: Instant,
    /// The caller's channel for its output: its receiving end going away ends the process.
    pub output: &'a Option<Sender<Vec<u8>>>,
}

/// Waits for `ended` (the process's end as the back end learns of it) until the deadline passes
/// or the caller stops reading the output; then runs `kill`, which must take the process and
/// everything it started. `ended` is borrowed, so the caller may still wait for it after a kill.
pub(crate) async fn watch<F: Future>(
    watched: &Watched<'_>,
    ended: Pin<&mut F>,
    kill: impl Future<Output = ()>,
) -> Ending<F::Output> {
    let ending = tokio::select! {
        outcome = ended => return Ending::Ended(outcome),
        _ = tokio::time::sleep_until(watched.deadline) => {
            tracing::info!(
                machine = watched.machine,
                "process ran past its bound; killing it and its descendants"
            );
            Ending::TimedOut
        }
        _ = abandoned(watched.output) => {
            tracing::info!(
                machine = watched.machine,
                "nobody reads the output any more; killing the process and its descendants"
            );
            Ending::Abandoned
        }
    };
    kill.await;
    ending
}

/// Resolves when the caller stops listening; never when there is no channel.
async fn abandoned(sink: &Option<Sender<Vec<u8>>>) {
    match sink {
        Some(sink) => sink.closed().await,
        None => std::future::pending().await,
    }
}

/// Stops a helper task (one feeding a process its input) when the process it serves is over.
pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    async fn watch_for(
        ended: impl Future<Output = u8>,
        deadline: Duration,
        output: &Option<Sender<Vec<u8>>>,
    ) -> (Ending<u8>, bool) {
        let killed = AtomicBool::new(false);
        let watched = Watched {
            machine: "m",
            deadline: Instant::now() + deadline,
            output,
        };
        let ended = std::pin::pin!(ended);
        let ending = watch(&watched, ended, async {
            killed.store(true, Ordering::SeqCst);
        })
        .await;
        (ending, killed.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn a_process_that_ends_in_time_is_not_killed() {
        let (ending, killed) = watch_for(async { 7 }, Duration::from_secs(5), &None).await;
        assert!(matches!(ending, Ending::Ended(7)), "{ending:?}");
        assert!(!killed);
    }

    #[tokio::test]
    async fn a_process_past_its_deadline_is_killed() {
        let (ending, killed) =
            watch_for(std::future::pending(), Duration::from_millis(10), &None).await;
        assert!(matches!(ending, Ending::TimedOut), "{ending:?}");
        assert!(killed);
    }

    #[tokio::test]
    async fn a_process_nobody_reads_is_killed() {
        let (sink, heard) = tokio::sync::mpsc::channel(1);
        drop(heard);
        let (ending, killed) =
            watch_for(std::future::pending(), Duration::from_secs(5), &Some(sink)).await;
        assert!(matches!(ending, Ending::Abandoned), "{ending:?}");
        assert!(killed);
    }

    #[test]
    fn only_a_running_machine_runs_a_process() {
        assert_eq!(
            require_running("x", "m", Some(((), MachineState::Running))).ok(),
            Some(())
        );
        for found in [Some(((), MachineState::Stopped)), None] {
            let e = require_running("x", "m", found).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotFound);
            assert_eq!(e.to_string(), "x: machine m is not running");
        }
    }
}
