//! Running processes under Docker: an exec in a machine, or a throwaway container of its own,
//! attached, watched to its end, killed from the host when it must be, and cleaned up after.

use std::collections::BTreeMap;
use std::time::Duration;

use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, ExecConfig, HostConfigLogConfig};
use bollard::query_parameters::{
    AttachContainerOptions, KillContainerOptions, StartContainerOptions, WaitContainerOptions,
};
use bollard::Docker as Client;
use futures_util::StreamExt;
use tokio::time::Instant;

use super::engine::{classify, found, wait_outcome};
use super::machine::Machine;
use super::process::{Feeding, OutputPump};
use super::Docker;
use crate::watch::{require_running, watch, Watched};
use crate::{labels, sandbox};
use crate::{ErrorKind, ProcessOutcome, ProcessSpec, Result, Runtime, RuntimeError, ThrowawaySpec};

/// How long a kill waits for the engine to report the process's host pid.
const PID_WAIT: Duration = Duration::from_secs(2);

/// How often a running exec is asked whether it ended (`exec_over`).
const EXEC_POLL: Duration = Duration::from_secs(1);

/// How long the output of an exec the engine reports ended may stay silent before it counts as
/// complete.
const OUTPUT_QUIET: Duration = Duration::from_secs(2);

/// A name for an exec's mark, distinct within this process (the engine names the exec only
/// once it is made, with the environment in it).
fn unique_exec() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{n}", std::process::id())
}

fn env_list(env: &BTreeMap<String, String>) -> Vec<String> {
    env.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

impl Docker {
    /// `Runtime::run`.
    pub(super) async fn run_in(&self, id: &str, spec: &ProcessSpec) -> Result<ProcessOutcome> {
        let client = self.engine.client().await?;
        let found = self.machine(client, id).await?.map(|m| {
            let state = m.state;
            (m, state)
        });
        let machine = require_running(self.name(), id, found)?;
        self.exec_in(client, id, &machine, spec).await
    }

    /// `Runtime::run_throwaway`: its own container, removed whatever happened.
    pub(super) async fn run_in_throwaway(&self, spec: &ThrowawaySpec) -> Result<ProcessOutcome> {
        let client = self.engine.client().await?;
        let image = self.require_image(&spec.image.digest).await?;
        let process = &spec.process;
        let has_stdin = process.stdin.is_some();
        let mut host = self
            .host_config(
                client,
                &spec.workspace,
                &spec.mount_point,
                spec.network,
                &spec.limits,
            )
            .await?;
        // Its output is read through the attachment; none of it goes to the engine's logs.
        host.log_config = Some(HostConfigLogConfig {
            typ: Some("none".to_owned()),
            config: None,
        });
        let body = ContainerCreateBody {
            image: Some(image),
            user: Some(spec.user.to_string()),
            entrypoint: Some(["/usr/bin/tini", "-s", "--"].map(str::to_owned).to_vec()),
            cmd: Some(process.argv.clone()),
            // Secrets given to the throwaway live here, on this container only.
            env: Some(env_list(&process.env)),
            working_dir: Some(
                process
                    .cwd
                    .clone()
                    .unwrap_or_else(|| spec.mount_point.clone()),
            ),
            labels: Some(labels::throwaway_labels(spec)),
            attach_stdin: Some(has_stdin),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(has_stdin),
            // The engine closes the process's input when our attachment's input ends.
            stdin_once: Some(has_stdin),
            tty: Some(false),
            host_config: Some(host),
            ..Default::default()
        };
        let container = self.create_throwaway(client, spec, body).await?;
        let outcome = self
            .run_attached(client, &spec.name, &container, process)
            .await;
        // Whatever happened, the throwaway goes.
        if let Err(e) = self.remove_container(client, &container).await {
            tracing::warn!(container = %spec.name, error = %e, "could not remove a throwaway container");
        }
        outcome
    }

    /// Runs `spec` as an exec in the running machine and waits within its bound.
    async fn exec_in(
        &self,
        client: &Client,
        id: &str,
        machine: &Machine,
        spec: &ProcessSpec,
    ) -> Result<ProcessOutcome> {
        let run_as = labels::run_as(id, &machine.labels, spec)?;
        // Under gVisor what the process starts is found from inside by this mark.
        let mark = (self.oci_runtime.is_some() && !sandbox::is_sweep(spec))
            .then(|| format!("{}={}", sandbox::EXEC_MARK, unique_exec()));
        let mut env = env_list(&spec.env);
        env.extend(mark.clone());
        // The engine starts an exec with the container's environment (the image's) and puts
        // these over it.
        let config = ExecConfig {
            attach_stdin: Some(spec.stdin.is_some()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            env: Some(env),
            cmd: Some(spec.argv.clone()),
            user: Some(run_as.user.to_string()),
            working_dir: Some(run_as.cwd),
            ..Default::default()
        };
        let exec = match client.create_exec(&machine.container, config).await {
            Ok(created) => created.id,
            Err(e) => {
                return Err(match classify(&format!("starting a process in {id}"), e) {
                    // 409: the machine stopped between our look and the exec.
                    e if e.kind() == ErrorKind::AlreadyExists => e.into_kind(ErrorKind::NotFound),
                    other => other,
                });
            }
        };
        let started = Instant::now();
        let watched = Watched {
            machine: id,
            deadline: started + spec.timeout,
            output: &spec.output,
        };
        let options = StartExecOptions {
            detach: false,
            tty: false,
            output_capacity: None,
        };
        let (frames, input) = match client.start_exec(&exec, Some(options)).await {
            Ok(StartExecResults::Attached { output, input }) => (output, input),
            Ok(StartExecResults::Detached) => {
                return Err(RuntimeError::plain(
                    ErrorKind::Other,
                    "docker: the engine started an attached process detached",
                ))
            }
            Err(e) => return Err(classify(&format!("starting a process in {id}"), e)),
        };
        let _feeding = Feeding::start(input, spec.stdin.as_ref());
        let mut pump = OutputPump::new(frames, spec.output_limit, spec.output.clone());
        let ending = {
            // The stream ends when the process's output closes, which need not be its end; and
            // a process can end without its stream ending (see `exec_over`).
            let ended = std::pin::pin!(async {
                pump.read_until_over(self.exec_over(client, &exec), OUTPUT_QUIET)
                    .await?;
                self.exec_exit(client, &exec).await
            });
            let kill = async {
                if let Some(mark) = &mark {
                    if let Err(e) = Box::pin(sandbox::sweep_in(self, id, mark)).await {
                        tracing::warn!(machine = id, error = %e, "cannot kill a process's tree in its sandbox");
                    }
                }
                self.kill_exec(client, &exec).await
            };
            watch(&watched, ended, kill).await
        };
        pump.outcome(ending, started).await
    }

    /// Resolves once the engine reports exec `exec` ended, or no longer knows it (its machine
    /// stopped), while its output is still being read: Docker 20.10 sometimes never closes the
    /// stream of an exec whose gVisor sandbox died at its `pids` limit, which left a setup
    /// waiting for its whole bound. Asked only after a second, and then every second, so that
    /// short processes cost the engine nothing more.
    async fn exec_over(&self, client: &Client, exec: &str) {
        loop {
            tokio::time::sleep(EXEC_POLL).await;
            match found(
                "reading whether a process ended",
                client.inspect_exec(exec).await,
            ) {
                Ok(None) => return,
                Ok(Some(info)) if info.running == Some(false) && info.exit_code.is_some() => return,
                // Running, or the engine cannot say now: a broken stream says the rest.
                Ok(Some(_)) | Err(_) => {}
            }
        }
    }

    /// The exit code of exec `exec` once the engine has it; right after the output ends the
    /// engine may still report it running, and a process that closed its output may run on.
    async fn exec_exit(&self, client: &Client, exec: &str) -> Result<Option<i32>> {
        let mut pause = Duration::from_millis(5);
        loop {
            let answer = client.inspect_exec(exec).await;
            let Some(info) = found("reading a process's exit code", answer)? else {
                // The machine was removed under it, and the process with it.
                return Ok(None);
            };
            if info.running == Some(false) && info.exit_code.is_some() {
                return Ok(info.exit_code.and_then(|c| i32::try_from(c).ok()));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Kills exec `exec` and everything it started, from the host: the engine has no API to
    /// kill an exec, but reports its host pid, which leads its own process group.
    async fn kill_exec(&self, client: &Client, exec: &str) {
        let until = Instant::now() + PID_WAIT;
        loop {
            match client.inspect_exec(exec).await {
                Ok(info) => {
                    let pid = info
                        .pid
                        .and_then(|p| u32::try_from(p).ok())
                        .filter(|p| *p > 0);
                    match (info.running, pid) {
                        (Some(true), Some(pid)) => {
                            crate::host::kill_tree(pid);
                            return;
                        }
                        // Over already.
                        (Some(false), _) if info.exit_code.is_some() => return,
                        // Not started yet: its pid comes shortly.
                        _ => {}
                    }
                }
                Err(e) => {
                    let e = classify("looking up a process to kill", e);
                    tracing::warn!(error = %e, "cannot kill a process: the engine does not say which");
                    return;
                }
            }
            if Instant::now() >= until {
                tracing::warn!(
                    exec,
                    "the engine reported no pid for a process to kill; leaving it"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Attaches to throwaway `container`, starts it and waits within the process's bound; on
    /// time-out (or when nobody reads the output) kills it.
    async fn run_attached(
        &self,
        client: &Client,
        name: &str,
        container: &str,
        process: &ProcessSpec,
    ) -> Result<ProcessOutcome> {
        // Attached before it starts, so no output is missed.
        let options = AttachContainerOptions {
            stream: true,
            logs: false,
            stdin: process.stdin.is_some(),
            stdout: true,
            stderr: true,
            detach_keys: None,
        };
        let attached = client
            .attach_container(container, Some(options))
            .await
            .map_err(|e| classify("attaching to a throwaway container", e))?;
        let started = Instant::now();
        let watched = Watched {
            machine: name,
            deadline: started + process.timeout,
            output: &process.output,
        };
        client
            .start_container(container, None::<StartContainerOptions>)
            .await
            .map_err(|e| classify("starting a throwaway container", e))?;
        let _feeding = Feeding::start(attached.input, process.stdin.as_ref());
        let mut pump = OutputPump::new(
            attached.output,
            process.output_limit,
            process.output.clone(),
        );
        let ending = {
            let ended = std::pin::pin!(async {
                pump.read_all().await?;
                let options = WaitContainerOptions {
                    condition: "not-running".to_owned(),
                };
                let waited = client.wait_container(container, Some(options)).next().await;
                let code = wait_outcome(waited)
                    .map_err(|e| classify("waiting for a throwaway container", e))?;
                Ok(code.and_then(|c| i32::try_from(c).ok()))
            });
            // Killing its init takes down every process in its pid namespace.
            let kill = async {
                let kill = KillContainerOptions {
                    signal: "SIGKILL".to_owned(),
                };
                if let Err(e) = client.kill_container(container, Some(kill)).await {
                    tracing::debug!(error = %classify("killing a throwaway container", e), "kill refused; removal follows");
                }
            };
            watch(&watched, ended, kill).await
        };
        pump.outcome(ending, started).await
    }
}
