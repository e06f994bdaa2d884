//! Running a session's command in a ready environment.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use narya_runtimes::{ErrorKind, ProcessOutcome, ProcessSpec};

use super::{EnvironmentError, EnvironmentId, Environments, Status};
use crate::auth::Principal;

/// A command, checked: what the person asked to run and how.
#[derive(Clone, Debug)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub timeout: Duration,
    pub stdin: Option<Vec<u8>>,
}

impl Environments {
    /// Runs `request` in environment `id` as the unprivileged user; chunks of output go to
    /// `output` as they are produced. Dropping `output`'s receiver kills the command.
    pub async fn exec(
        self: Arc<Self>,
        principal: Principal,
        id: EnvironmentId,
        request: ExecRequest,
        output: tokio::sync::mpsc::Sender<Vec<u8>>,
    ) -> Result<ProcessOutcome, EnvironmentError> {
        self.check_ready(&principal, &id).await?;
        let spec = ProcessSpec {
            argv: request.argv,
            env: request.env,
            cwd: request.cwd,
            timeout: request.timeout,
            output_limit: self.config.environment.output_limit,
            stdin: request.stdin,
            output: Some(output),
        };
        match self.runtime.run(id.as_str(), &spec).await {
            Ok(outcome) => Ok(outcome),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(EnvironmentError::NotReady(format!(
                "environment {id} has no running machine right now ({e}); wait for it to come back or replace it"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether `principal` may run commands in `id` now: it exists for them and is ready.
    pub async fn check_ready(
        &self,
        principal: &Principal,
        id: &EnvironmentId,
    ) -> Result<(), EnvironmentError> {
        let row = self
            .store
            .get(&principal.organisation, id.as_str())
            .await?
            .ok_or_else(|| EnvironmentError::NotFound(id.to_string()))?;
        if row.status != Status::Ready {
            return Err(EnvironmentError::NotReady(format!(
                "environment {id} is {}{}; commands run only in a ready environment",
                row.status.as_str(),
                row.status_detail
                    .as_deref()
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            )));
        }
        Ok(())
    }
}
