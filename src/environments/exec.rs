//! Running a session's command in a ready environment, its output watched as it is produced.

use std::sync::Arc;

use narya_runtimes::{ErrorKind, ProcessOutcome, ProcessSpec};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{EnvironmentError, Environments, ExecRequest, Utf8Chunks};
use crate::auth::Principal;
use crate::model::{EnvironmentId, Status};
use crate::store::EnvironmentRecord;

/// A command running in an environment. Dropping it kills the command and all it started.
pub struct ExecRun {
    output: Option<mpsc::Receiver<Vec<u8>>>,
    text: Utf8Chunks,
    task: JoinHandle<Result<ProcessOutcome, EnvironmentError>>,
}

impl ExecRun {
    /// The next piece of the command's output as text (never splitting a character), or `None`
    /// once the command has closed its output.
    pub async fn next_output(&mut self) -> Option<String> {
        let output = self.output.as_mut()?;
        while let Some(chunk) = output.recv().await {
            let text = self.text.push(&chunk);
            if !text.is_empty() {
                return Some(text);
            }
        }
        self.output = None;
        Some(self.text.finish()).filter(|rest| !rest.is_empty())
    }

    /// How the command ended, its output read to the end first (the outcome keeps its tail).
    pub async fn outcome(self) -> Result<ProcessOutcome, EnvironmentError> {
        let ExecRun { output, task, .. } = self;
        if let Some(mut output) = output {
            while output.recv().await.is_some() {}
        }
        task.await.map_err(EnvironmentError::task("exec"))?
    }
}

impl Environments {
    /// Starts `request` in environment `id` as the unprivileged user, once the environment is
    /// found ready for `principal`.
    pub async fn exec(
        self: &Arc<Self>,
        principal: &Principal,
        id: EnvironmentId,
        request: ExecRequest,
    ) -> Result<ExecRun, EnvironmentError> {
        let machine = self.check_ready(principal, &id).await?.machine;
        let (chunks, output) = mpsc::channel(64);
        let spec = ProcessSpec {
            argv: request.argv,
            env: request.env,
            cwd: request.cwd,
            timeout: request.timeout,
            output_limit: self.config.environment.output_limit,
            stdin: request.stdin,
            output: Some(chunks),
        };
        // The command runs in a task of its own that ends when it does; the run holds the
        // receiving end of its output, so a caller that goes away takes the command with it.
        let environments = self.clone();
        let metrics = self.metrics.clone();
        let task = tokio::spawn(async move {
            let started = std::time::Instant::now();
            let ran = environments.run_bounded(&machine, spec).await;
            metrics.exec_ended(ran.as_ref().ok(), started.elapsed());
            match ran {
                Ok(outcome) => Ok(outcome),
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    Err(EnvironmentError::NoRunningMachine { id, source: e })
                }
                Err(e) => Err(e.into()),
            }
        });
        Ok(ExecRun {
            output: Some(output),
            text: Utf8Chunks::default(),
            task,
        })
    }

    /// Environment `id`, if `principal` may run commands in it now: it exists for them and is
    /// ready.
    async fn check_ready(
        &self,
        principal: &Principal,
        id: &EnvironmentId,
    ) -> Result<EnvironmentRecord, EnvironmentError> {
        let row = self.get(principal, id).await?;
        if row.status != Status::Ready {
            return Err(EnvironmentError::NotReady {
                id: row.id,
                status: row.status,
                detail: row.status_detail,
            });
        }
        Ok(row)
    }
}
