//! Running processes under containerd: an exec in a machine's task, or a throwaway container's
//! own task, with output through FIFOs, watched to its end and cleaned up after.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use containerd_client::services::v1::{
    CloseIoRequest, Container, DeleteProcessRequest, ExecProcessRequest, KillRequest, StartRequest,
    WaitRequest,
};
use narya_oci::spec;
use tokio::time::Instant;

use super::client::classify;
use super::container::{spec_any, Placement};
use super::machine::machine_state;
use super::{unique, Containerd};
use crate::output::{InputFifo, OutputFifo};
use crate::watch::{require_running, watch, AbortOnDrop, Ending, Watched};
use crate::{labels, sandbox};
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

/// A process's standard streams as containerd takes them: FIFOs we made and hold the other end of.
struct Stdio {
    output: OutputFifo,
    input: Option<InputFifo>,
}

/// How a watched process ended.
struct Ended {
    /// `None` when it was killed.
    exit_code: Option<i32>,
    timed_out: bool,
}

impl Stdio {
    /// The paths to give containerd as (stdin, stdout and stderr); no input is an empty path.
    fn paths(&self) -> (String, String) {
        let stdin = self
            .input
            .as_ref()
            .map(|i| i.path().display().to_string())
            .unwrap_or_default();
        (stdin, self.output.path().display().to_string())
    }

    /// What became of the process that ran from `started`: its output is collected once every
    /// writer closed, or the grace passed (a background child may hold stdout open).
    async fn outcome(self, ended: Ended, started: Instant) -> ProcessOutcome {
        let (output, output_truncated) = self.output.collect(OUTPUT_GRACE).await;
        ProcessOutcome {
            exit_code: ended.exit_code,
            output,
            output_truncated,
            timed_out: ended.timed_out,
            duration: started.elapsed(),
        }
    }
}

impl Containerd {
    /// `Runtime::run`.
    pub(super) async fn run_in(&self, id: &str, spec_in: &ProcessSpec) -> Result<ProcessOutcome> {
        let container = self.container(id).await?;
        let state = machine_state(self.task_status(id).await?);
        let container = require_running(self.name(), id, Some((container, state)))?;
        let gate = self.exec_gate(id);
        let _turn = gate.acquire().await.map_err(|_| {
            RuntimeError::plain(ErrorKind::Other, format!("the exec queue of {id} closed"))
        })?;
        self.exec_in(id, &container, spec_in).await
    }

    /// Machine `id`'s exec queue.
    fn exec_gate(&self, id: &str) -> Arc<tokio::sync::Semaphore> {
        let mut gates = self.exec_gates.lock().unwrap_or_else(|p| p.into_inner());
        gates
            .entry(id.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(super::EXECS_PER_MACHINE)))
            .clone()
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
            nofile: spec_in.limits.nofile,
        };
        let labels = labels::throwaway_labels(spec_in);
        let mounts = self
            .make_container(
                &id,
                &image,
                process,
                Placement {
                    workspace: &spec_in.workspace,
                    mount_point: &spec_in.mount_point,
                    network: spec_in.network,
                    limits: spec_in.limits,
                },
                labels,
            )
            .await?;
        let outcome = async {
            let mut stdio = self.stdio(&id, &spec_in.process)?;
            let (stdin, stdout) = stdio.paths();
            let started = Instant::now();
            self.create_task(&id, mounts, stdin, stdout).await?;
            let ended = self
                .start_and_wait(&id, "", &spec_in.process, &mut stdio, None)
                .await?;
            Ok(stdio.outcome(ended, started).await)
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
        // The exec is the machine's own process (user, no capabilities, rlimits,
        // oom_score_adj) running something else.
        let machine: spec::Spec = container
            .spec
            .as_ref()
            .and_then(|s| serde_json::from_slice(&s.value).ok())
            .ok_or_else(|| {
                RuntimeError::plain(
                    ErrorKind::Other,
                    format!("containerd: the runtime spec of machine {id} is unreadable"),
                )
            })?;
        let Some(mut base) = machine.process().clone() else {
            return Err(RuntimeError::plain(
                ErrorKind::Other,
                format!("containerd: the runtime spec of machine {id} has no process"),
            ));
        };
        let base_env = base.env().clone().unwrap_or_default();
        // Who runs it is what the labels say (the same as the machine's, for Narya machines).
        base.set_user({
            let mut user = base.user().clone();
            user.set_uid(run_as.user.uid);
            user.set_gid(run_as.user.gid);
            user
        });
        let exec_id = unique("exec");
        let mut env = merged_env(&base_env, &spec_in.env);
        // Under gVisor what the process starts is found from inside by this mark.
        let mark = (self.oci_runtime.is_some() && !sandbox::is_sweep(spec_in))
            .then(|| format!("{}={exec_id}", sandbox::EXEC_MARK));
        env.extend(mark.clone());
        let process = spec::exec_process(&base, spec_in.argv.clone(), env, &run_as.cwd);
        let mut stdio = self.stdio(&exec_id, spec_in)?;
        let (stdin, stdout) = stdio.paths();
        let started = Instant::now();
        self.conn
            .tasks()
            .exec(self.conn.request(ExecProcessRequest {
                container_id: id.to_owned(),
                stdin,
                stdout: stdout.clone(),
                stderr: stdout,
                terminal: false,
                spec: Some(spec_any(&process, spec::PROCESS_TYPE_URL)?),
                exec_id: exec_id.clone(),
            }))
            .await
            .map_err(|e| classify(&format!("starting a process in {id}"), e))?;
        let ended = self
            .start_and_wait(id, &exec_id, spec_in, &mut stdio, mark)
            .await;
        // The shim copies the process's output into our FIFO on its own time, and a delete
        // stops that copy (after at most 2 s): under load the copy may not even have begun
        // when the process's exit is reported. So the output ends (or its grace passes)
        // before the delete, and what the delete then cuts short is a background child's.
        if ended.is_ok() {
            stdio.output.wait_closed(OUTPUT_GRACE).await;
        }
        let _ = self
            .conn
            .tasks()
            .delete_process(self.conn.request(DeleteProcessRequest {
                container_id: id.to_owned(),
                exec_id: exec_id.clone(),
            }))
            .await;
        Ok(stdio.outcome(ended?, started).await)
    }

    /// The FIFOs of process `name`: its output always, its input when it has some.
    fn stdio(&self, name: &str, process: &ProcessSpec) -> Result<Stdio> {
        let output = OutputFifo::create(
            &self.fifo_dir.join(name),
            process.output_limit,
            process.output.clone(),
        )
        .map_err(|e| RuntimeError::caused(ErrorKind::Other, "cannot make an output FIFO", e))?;
        let input = process
            .stdin
            .as_ref()
            .map(|bytes| {
                InputFifo::create(&self.fifo_dir.join(format!("{name}-in")), bytes.clone())
            })
            .transpose()
            .map_err(|e| RuntimeError::caused(ErrorKind::Other, "cannot make an input FIFO", e))?;
        Ok(Stdio { output, input })
    }

    /// Starts process `exec_id` (empty: the task itself) and watches it to its end: on time-out,
    /// or when nobody reads its output, it is killed with everything it started.
    /// `mark`: the environment entry its processes carry under gVisor, by which they are killed.
    async fn start_and_wait(
        &self,
        id: &str,
        exec_id: &str,
        process: &ProcessSpec,
        stdio: &mut Stdio,
        mark: Option<String>,
    ) -> Result<Ended> {
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
        stdio.output.writer_attached();
        let pid = started
            .map_err(|e| classify(&format!("starting a process in {id}"), e))?
            .into_inner()
            .pid;
        // containerd holds the input open until told otherwise: once our bytes are in, close it
        // so the process reads end of file.
        let feeding = stdio.input.take().map(|mut input| {
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
        let kill = self.kill_process(id, exec_id, pid, mark.as_deref());
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
        Ok(Ended {
            exit_code,
            timed_out,
        })
    }

    /// Kills process `exec_id` of task `id` (host pid `pid`) and everything it started; for
    /// the task itself (empty `exec_id`), every process in the container. Under gVisor the host
    /// pid is gVisor's own, and what carries `mark` is killed from inside.
    async fn kill_process(&self, id: &str, exec_id: &str, pid: u32, mark: Option<&str>) {
        if let Some(mark) = mark {
            if let Err(e) = Box::pin(sandbox::sweep_in(self, id, mark)).await {
                tracing::warn!(machine = id, error = %e, "cannot kill a process's tree in its sandbox");
            }
        }
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
