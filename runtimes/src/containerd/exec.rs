//! Running processes under containerd: an exec in a machine's task, or a throwaway container's
//! own task, with output through FIFOs, watched to its end and cleaned up after.

use std::collections::BTreeMap;
use std::time::Duration;

use containerd_client::services::v1::{
    CloseIoRequest, Container, CreateTaskRequest, DeleteProcessRequest, ExecProcessRequest,
    KillRequest, StartRequest, WaitRequest,
};
use narya_oci::spec;
use tokio::time::Instant;

use super::client::classify;
use super::machine::{machine_state, spec_any};
use super::{unique, Containerd};
use crate::labels;
use crate::output::{InputFifo, OutputFifo};
use crate::watch::{require_running, watch, AbortOnDrop, Ending, Watched};
use crate::{ErrorKind, ProcessOutcome, ProcessSpec, Result, Runtime, RuntimeError, ThrowawaySpec};

/// How long output may still arrive after a process ended (a background child holding stdout).
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// `KEY=VALUE` entries: the image's, then ours over them.
fn merged_env(image_env: &[String], extra: &BTreeMap<String, String>) -> Vec<String> {
    let mut env: Vec<String> = image_env
        .iter()
        .filter(|e| {
            let key = e.split('=').next().unwrap_or_default();
            !extra.contains_key(key)
        })
        .cloned()
        .collect();
    env.extend(extra.iter().map(|(k, v)| format!("{k}={v}")));
    env
}

impl Containerd {
    /// `Runtime::run`.
    pub(super) async fn run_in(&self, id: &str, spec_in: &ProcessSpec) -> Result<ProcessOutcome> {
        let container = self.container(id).await?;
        let state = machine_state(self.task_status(id).await?);
        let container = require_running(self.name(), id, Some((container, state)))?;
        self.exec_in(id, &container, spec_in).await
    }

    /// `Runtime::run_throwaway`: its own container and task, removed whatever happened.
    pub(super) async fn run_in_throwaway(&self, spec_in: &ThrowawaySpec) -> Result<ProcessOutcome> {
        let image = self.local_image(&spec_in.image.digest).await?;
        let id = spec_in.name.clone();
        let mut args = ["/usr/bin/tini", "-s", "--"].map(str::to_owned).to_vec();
        args.extend(spec_in.process.argv.iter().cloned());
        let process = spec::ProcessSpec {
            args,
            env: merged_env(&image.config.config.env, &spec_in.process.env),
            cwd: spec_in
                .process
                .cwd
                .clone()
                .unwrap_or_else(|| spec_in.mount_point.clone()),
            uid: spec_in.user.uid,
            gid: spec_in.user.gid,
        };
        let labels = labels::throwaway_labels(&spec_in.name);
        let mounts = self
            .make_container(
                &id,
                &image,
                process,
                &spec_in.workspace,
                &spec_in.mount_point,
                spec_in.network,
                labels,
            )
            .await?;
        let outcome = async {
            let mut fifo = OutputFifo::create(
                &self.fifo_dir.join(&id),
                spec_in.process.output_limit,
                spec_in.process.output.clone(),
            )
            .map_err(|e| RuntimeError::caused(ErrorKind::Other, "cannot make an output FIFO", e))?;
            let input = self.input_fifo(&id, spec_in.process.stdin.as_ref())?;
            let started_at = Instant::now();
            let fifo_path = fifo.path().display().to_string();
            self.conn
                .tasks()
                .create(
                    self.conn.request(CreateTaskRequest {
                        container_id: id.clone(),
                        rootfs: mounts,
                        stdin: input
                            .as_ref()
                            .map(|i| i.path().display().to_string())
                            .unwrap_or_default(),
                        stdout: fifo_path.clone(),
                        stderr: fifo_path,
                        terminal: false,
                        checkpoint: None,
                        options: None,
                        runtime_path: String::new(),
                    }),
                )
                .await
                .map_err(|e| classify("creating a throwaway task", e))?;
            let (exit_code, timed_out) = self
                .start_and_wait(&id, "", &spec_in.process, &mut fifo, input)
                .await?;
            let (output, output_truncated) = fifo.collect(OUTPUT_GRACE).await;
            Ok(ProcessOutcome {
                exit_code,
                output,
                output_truncated,
                timed_out,
                duration: started_at.elapsed(),
            })
        }
        .await;
        // Whatever happened, the throwaway goes.
        if let Err(e) = self.stop_task(&id).await {
            tracing::warn!(container = %id, error = %e, "could not stop a throwaway container");
        }
        self.delete_container(&id).await;
        outcome
    }

    /// Runs `argv` as an exec in running task `id` and waits within the bound.
    async fn exec_in(
        &self,
        id: &str,
        container: &Container,
        spec_in: &ProcessSpec,
    ) -> Result<ProcessOutcome> {
        let run_as = labels::run_as(id, &container.labels, spec_in)?;
        let machine_spec: serde_json::Value = container
            .spec
            .as_ref()
            .and_then(|s| serde_json::from_slice(&s.value).ok())
            .unwrap_or_default();
        let base_env: Vec<String> = machine_spec["process"]["env"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let process = spec::process(&spec::ProcessSpec {
            args: spec_in.argv.clone(),
            env: merged_env(&base_env, &spec_in.env),
            cwd: run_as.cwd,
            uid: run_as.user.uid,
            gid: run_as.user.gid,
        });
        let exec_id = unique("exec");
        let mut fifo = OutputFifo::create(
            &self.fifo_dir.join(&exec_id),
            spec_in.output_limit,
            spec_in.output.clone(),
        )
        .map_err(|e| RuntimeError::caused(ErrorKind::Other, "cannot make an output FIFO", e))?;
        let fifo_path = fifo.path().display().to_string();
        let input = self.input_fifo(&exec_id, spec_in.stdin.as_ref())?;
        let started_at = Instant::now();
        self.conn
            .tasks()
            .exec(
                self.conn.request(ExecProcessRequest {
                    container_id: id.to_owned(),
                    stdin: input
                        .as_ref()
                        .map(|i| i.path().display().to_string())
                        .unwrap_or_default(),
                    stdout: fifo_path.clone(),
                    stderr: fifo_path,
                    terminal: false,
                    spec: Some(spec_any(&process, spec::PROCESS_TYPE_URL)?),
                    exec_id: exec_id.clone(),
                }),
            )
            .await
            .map_err(|e| classify(&format!("starting a process in {id}"), e))?;
        let outcome = self
            .start_and_wait(id, &exec_id, spec_in, &mut fifo, input)
            .await;
        let _ = self
            .conn
            .tasks()
            .delete_process(self.conn.request(DeleteProcessRequest {
                container_id: id.to_owned(),
                exec_id: exec_id.clone(),
            }))
            .await;
        let (exit_code, timed_out) = outcome?;
        let (output, output_truncated) = fifo.collect(OUTPUT_GRACE).await;
        Ok(ProcessOutcome {
            exit_code,
            output,
            output_truncated,
            timed_out,
            duration: started_at.elapsed(),
        })
    }

    /// The FIFO carrying `stdin` to process `name`, when there is input.
    fn input_fifo(&self, name: &str, stdin: Option<&Vec<u8>>) -> Result<Option<InputFifo>> {
        stdin
            .map(|bytes| {
                InputFifo::create(&self.fifo_dir.join(format!("{name}-in")), bytes.clone()).map_err(
                    |e| RuntimeError::caused(ErrorKind::Other, "cannot make an input FIFO", e),
                )
            })
            .transpose()
    }

    /// Starts process `exec_id` (empty: the task itself) and waits up to `timeout`; on time-out
    /// kills it and everything it started. Returns (exit code or None when killed, timed out).
    async fn start_and_wait(
        &self,
        id: &str,
        exec_id: &str,
        process: &ProcessSpec,
        fifo: &mut OutputFifo,
        input: Option<InputFifo>,
    ) -> Result<(Option<i32>, bool)> {
        let mut tasks = self.conn.tasks();
        // Wait answers for an exited process too until it is deleted, so it may follow Start.
        let wait_request = self.conn.request(WaitRequest {
            container_id: id.to_owned(),
            exec_id: exec_id.to_owned(),
        });
        let started = tasks
            .start(self.conn.request(StartRequest {
                container_id: id.to_owned(),
                exec_id: exec_id.to_owned(),
            }))
            .await;
        fifo.writer_attached();
        let pid = started
            .map_err(|e| classify(&format!("starting a process in {id}"), e))?
            .into_inner()
            .pid;
        // containerd holds the input open until told otherwise: once our bytes are in, close it
        // so the process reads end of file.
        let feeding = input.map(|mut input| {
            let conn = self.conn.clone();
            let request = CloseIoRequest {
                container_id: id.to_owned(),
                exec_id: exec_id.to_owned(),
                stdin: true,
            };
            tokio::spawn(async move {
                input.written().await;
                let _ = conn.tasks().close_io(conn.request(request)).await;
                drop(input);
            })
        });
        let _stop_feeding = feeding.map(AbortOnDrop);
        let mut waiter = self.conn.tasks();
        let mut wait = std::pin::pin!(waiter.wait(wait_request));
        let watched = Watched {
            machine: id,
            deadline: Instant::now() + process.timeout,
            output: &process.output,
        };
        let kill = self.kill_process(id, exec_id, pid);
        // After a kill the wait still answers, once the process is gone.
        let (status, timed_out, killed) = match watch(&watched, wait.as_mut(), kill).await {
            Ending::Ended(status) => (status, false, false),
            Ending::TimedOut => (wait.await, true, true),
            Ending::Abandoned => (wait.await, false, true),
        };
        let status = status
            .map_err(|e| classify(&format!("waiting for a process in {id}"), e))?
            .into_inner()
            .exit_status;
        // Killed processes report 128+signal; a killed one has no exit code of its own.
        let exit_code = if killed {
            None
        } else {
            i32::try_from(status).ok()
        };
        Ok((exit_code, timed_out))
    }

    /// Kills process `exec_id` of task `id` (host pid `pid`) and everything it started; for
    /// the task itself (empty `exec_id`), every process in the container.
    async fn kill_process(&self, id: &str, exec_id: &str, pid: u32) {
        if !exec_id.is_empty() {
            crate::host::kill_tree(pid);
        }
        let _ = self
            .conn
            .tasks()
            .kill(self.conn.request(KillRequest {
                container_id: id.to_owned(),
                exec_id: exec_id.to_owned(),
                signal: 9,
                all: exec_id.is_empty(),
            }))
            .await;
    }
}
