//! The Docker back end, over the Docker Engine API (bollard) on the engine's unix socket.

mod engine;
mod image;
mod process;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, ContainerStateStatusEnum, ContainerSummaryStateEnum, ExecConfig,
    HostConfig, HostConfigLogConfig, Mount, MountTypeEnum, RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, InspectContainerOptions, KillContainerOptions,
    ListContainersOptions, RemoveContainerOptions, StartContainerOptions, WaitContainerOptions,
};
use bollard::Docker as Client;
use futures_util::StreamExt;
use narya_oci::Digest;
use tokio::sync::Mutex;
use tokio::time::Instant;

use self::engine::{classify, wait_outcome, Engine};
use self::image::local_tag;
use self::process::{Feeding, OutputPump};
use crate::labels::{self, LABEL_ENVIRONMENT};
use crate::pinning::ImagePinning;
use crate::watch::{require_running, watch, Watched};
use crate::{
    ErrorKind, ImageSource, MachineInfo, MachineSpec, MachineState, Network, PinnedImage,
    ProcessOutcome, ProcessSpec, Result, Runtime, RuntimeError, ThrowawaySpec,
};

/// How long a kill waits for the engine to report the process's host pid.
const PID_WAIT: Duration = Duration::from_secs(2);
/// How long a removal already under way in the engine is waited for.
const REMOVAL_WAIT: Duration = Duration::from_secs(30);

/// How to reach the engine.
#[derive(Clone, Debug)]
pub struct DockerConfig {
    /// The engine's unix socket (`runtime.docker_socket`).
    pub socket: PathBuf,
    /// Registries reached over plain HTTP (`image.insecure_registries`); dockerd must treat
    /// them as insecure too.
    pub insecure_registries: Vec<String>,
}

pub struct Docker {
    engine: Engine,
    pinning: ImagePinning,
    insecure_registries: Vec<String>,
    /// Manifest digests known to be available under our tag.
    images: Mutex<HashSet<Digest>>,
}

/// A Narya machine as the engine describes it.
struct Machine {
    /// The engine's id, used for every later call: names can be matched by id prefixes.
    container: String,
    state: MachineState,
    labels: HashMap<String, String>,
}

fn network_mode(network: Network) -> String {
    match network {
        Network::Host => "host",
        Network::None => "none",
    }
    .to_owned()
}

/// What machines and throwaways share: the workspace bind mount read-write, no new privileges,
/// no capabilities, the network asked for, and no init of Docker's (ours is tini, in the image).
fn host_config(workspace: &Path, mount_point: &str, network: Network) -> Result<HostConfig> {
    let source = workspace.to_str().ok_or_else(|| {
        RuntimeError::plain(
            ErrorKind::Other,
            format!("workspace path {} is not UTF-8", workspace.display()),
        )
    })?;
    Ok(HostConfig {
        // A bind *mount* (not a `Binds` entry): the engine refuses a missing source instead of
        // creating it as root.
        mounts: Some(vec![Mount {
            target: Some(mount_point.to_owned()),
            source: Some(source.to_owned()),
            typ: Some(MountTypeEnum::BIND),
            read_only: Some(false),
            ..Default::default()
        }]),
        security_opt: Some(vec!["no-new-privileges".to_owned()]),
        cap_drop: Some(vec!["ALL".to_owned()]),
        network_mode: Some(network_mode(network)),
        init: Some(false),
        ..Default::default()
    })
}

fn env_list(env: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    env.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

fn machine_state(status: Option<ContainerStateStatusEnum>) -> MachineState {
    match status {
        Some(ContainerStateStatusEnum::RUNNING) => MachineState::Running,
        // Created, paused, restarting, exited, dead, being removed: not serving.
        _ => MachineState::Stopped,
    }
}

impl Docker {
    pub fn new(config: DockerConfig) -> Result<Docker> {
        Ok(Docker {
            engine: Engine::new(&config.socket),
            pinning: ImagePinning::new(config.insecure_registries.clone())?,
            insecure_registries: config.insecure_registries,
            images: Mutex::new(HashSet::new()),
        })
    }

    /// The Narya machine `id`, or `None` when the engine has no container of that name that is
    /// labelled as that environment's machine (the engine's names are shared with everything
    /// else on the host, so an unlabelled namesake is not ours to run in or remove).
    async fn machine(&self, client: &Client, id: &str) -> Result<Option<Machine>> {
        let found = match client
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
        {
            Ok(found) => found,
            Err(e) => {
                return match classify(&format!("looking up machine {id}"), e) {
                    RuntimeError::NotFound { .. } => Ok(None),
                    other => Err(other),
                }
            }
        };
        let labels = found.config.and_then(|c| c.labels).unwrap_or_default();
        if !labels::is_machine(&labels, id) {
            return Ok(None);
        }
        let Some(container) = found.id else {
            return Ok(None);
        };
        Ok(Some(Machine {
            container,
            state: machine_state(found.state.and_then(|s| s.status)),
            labels,
        }))
    }

    /// Fails with `Image` unless the image pinned to `digest` is in the engine.
    async fn require_image(&self, digest: &Digest) -> Result<String> {
        if self.has_local_image(digest).await? {
            Ok(local_tag(digest))
        } else {
            Err(RuntimeError::plain(
                ErrorKind::Image,
                format!(
                    "docker: image {digest} is not in the engine; ensure_image makes it available"
                ),
            ))
        }
    }

    /// Force-removes container `container` (killing what runs in it) with its writable layer.
    /// Gone already is fine; a removal already under way is waited for.
    async fn remove_container(&self, client: &Client, container: &str) -> Result<()> {
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        match client.remove_container(container, Some(options)).await {
            Ok(()) => return Ok(()),
            Err(e) => match classify(&format!("removing container {container}"), e) {
                RuntimeError::NotFound { .. } => return Ok(()),
                // 409: "removal already in progress" from another caller.
                RuntimeError::AlreadyExists { .. } => {}
                other => return Err(other),
            },
        }
        let until = Instant::now() + REMOVAL_WAIT;
        loop {
            match client
                .inspect_container(container, None::<InspectContainerOptions>)
                .await
            {
                Ok(_) if Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Ok(_) => {
                    return Err(RuntimeError::plain(
                        ErrorKind::Other,
                        format!(
                            "docker: container {container} was still being removed after {} s",
                            REMOVAL_WAIT.as_secs()
                        ),
                    ))
                }
                Err(e) => {
                    return match classify(&format!("waiting for {container} to go"), e) {
                        RuntimeError::NotFound { .. } => Ok(()),
                        other => Err(other),
                    }
                }
            }
        }
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
        // The engine starts an exec with the container's environment (the image's) and puts
        // these over it.
        let config = ExecConfig {
            attach_stdin: Some(spec.stdin.is_some()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            env: Some(env_list(&spec.env)),
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
            // The stream ends when the process's output closes, which need not be its end.
            let ended = std::pin::pin!(async {
                pump.read_all().await?;
                self.exec_exit(client, &exec).await
            });
            watch(&watched, ended, self.kill_exec(client, &exec)).await
        };
        pump.outcome(ending, started).await
    }

    /// The exit code of exec `exec` once the engine has it; right after the output ends the
    /// engine may still report it running, and a process that closed its output may run on.
    async fn exec_exit(&self, client: &Client, exec: &str) -> Result<Option<i32>> {
        let mut pause = Duration::from_millis(5);
        loop {
            let info = match client.inspect_exec(exec).await {
                Ok(info) => info,
                Err(e) => {
                    return match classify("reading a process's exit code", e) {
                        // The machine was removed under it, and the process with it.
                        e if e.kind() == ErrorKind::NotFound => Ok(None),
                        other => Err(other),
                    };
                }
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

    /// Creates container `name` from `body`. The only thing the engine can miss is the image:
    /// removed behind our back, it is an `Image` error and forgotten, so that the next
    /// `ensure_image` brings it back.
    async fn create_container(
        &self,
        client: &Client,
        name: &str,
        digest: &Digest,
        body: ContainerCreateBody,
    ) -> Result<String> {
        let options = CreateContainerOptions {
            name: Some(name.to_owned()),
            platform: String::new(),
        };
        match client.create_container(Some(options), body).await {
            Ok(created) => Ok(created.id),
            Err(e) => match classify(&format!("creating container {name}"), e) {
                e if e.kind() == ErrorKind::NotFound => {
                    self.images.lock().await.remove(digest);
                    Err(e.into_kind(ErrorKind::Image))
                }
                other => Err(other),
            },
        }
    }

    /// Creates throwaway `name`; one left behind by a daemon that died mid-run is cleared first.
    async fn create_throwaway(
        &self,
        client: &Client,
        name: &str,
        digest: &Digest,
        body: ContainerCreateBody,
    ) -> Result<String> {
        let refusal = match self
            .create_container(client, name, digest, body.clone())
            .await
        {
            Err(e) if e.kind() == ErrorKind::AlreadyExists => e,
            created => return created,
        };
        let stale = client
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
            .map_err(|e| classify(&format!("looking up throwaway {name}"), e))?;
        let labels = stale.config.and_then(|c| c.labels).unwrap_or_default();
        // Only a throwaway of the same name is ours to clear.
        let (Some(stale_id), true) = (stale.id, labels::is_throwaway(&labels, name)) else {
            return Err(refusal);
        };
        tracing::warn!(
            container = name,
            "removing a throwaway container left behind"
        );
        self.remove_container(client, &stale_id).await?;
        self.create_container(client, name, digest, body).await
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

#[async_trait::async_trait]
impl Runtime for Docker {
    fn name(&self) -> &'static str {
        "docker"
    }

    /// The engine's version; refuses engines below API 1.41.
    async fn version(&self) -> Result<String> {
        self.engine.version().await
    }

    async fn ensure_image(&self, source: &ImageSource) -> Result<PinnedImage> {
        self.pinning.ensure(source, self, self.name()).await
    }

    async fn create_machine(&self, spec: &MachineSpec) -> Result<MachineInfo> {
        let client = self.engine.client().await?;
        let image = self.require_image(&spec.image.digest).await?;
        let mut host = host_config(&spec.workspace, &spec.mount_point, spec.network)?;
        // Machines come back when the engine restarts (it stops them with SIGTERM, so tini exits
        // non-zero and the engine restarts them on start-up), yet one whose main process was
        // killed stays stopped as under containerd: tini reports its child's SIGKILL (137) as 0
        // (`-e 137`), which `on-failure` does not restart. `unless-stopped` would restart it at
        // once, hiding the stop from `inspect`.
        host.restart_policy = Some(RestartPolicy {
            name: Some(RestartPolicyNameEnum::ON_FAILURE),
            maximum_retry_count: Some(0),
        });
        let body = ContainerCreateBody {
            image: Some(image),
            user: Some(spec.user.to_string()),
            // tini reaps what setup scripts and sessions leave behind; sleep keeps it alive.
            entrypoint: Some(
                ["/usr/bin/tini", "-s", "-e", "137", "--"]
                    .map(str::to_owned)
                    .to_vec(),
            ),
            cmd: Some(["/bin/sleep", "infinity"].map(str::to_owned).to_vec()),
            working_dir: Some(spec.mount_point.clone()),
            // The host's network comes with the host's name; a private one gets the id as
            // containerd gives it, when it fits a hostname.
            hostname: (spec.network == Network::None && spec.id.len() <= 63)
                .then(|| spec.id.clone()),
            labels: Some(labels::machine_labels(spec)),
            host_config: Some(host),
            ..Default::default()
        };
        let created = self
            .create_container(client, &spec.id, &spec.image.digest, body)
            .await?;
        if let Err(e) = client
            .start_container(&created, None::<StartContainerOptions>)
            .await
        {
            let e = classify(&format!("starting machine {}", spec.id), e);
            if let Err(removal) = self.remove_container(client, &created).await {
                tracing::warn!(machine = %spec.id, error = %removal, "could not remove a machine that failed to start");
            }
            return Err(e);
        }
        Ok(MachineInfo {
            id: spec.id.clone(),
            digest: Some(spec.image.digest.clone()),
            state: MachineState::Running,
        })
    }

    async fn run(&self, id: &str, spec: &ProcessSpec) -> Result<ProcessOutcome> {
        let client = self.engine.client().await?;
        let found = self.machine(client, id).await?.map(|m| {
            let state = m.state;
            (m, state)
        });
        let machine = require_running(self.name(), id, found)?;
        self.exec_in(client, id, &machine, spec).await
    }

    async fn run_throwaway(&self, spec: &ThrowawaySpec) -> Result<ProcessOutcome> {
        let client = self.engine.client().await?;
        let image = self.require_image(&spec.image.digest).await?;
        let process = &spec.process;
        let has_stdin = process.stdin.is_some();
        let mut host = host_config(&spec.workspace, &spec.mount_point, spec.network)?;
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
            labels: Some(labels::throwaway_labels(&spec.name)),
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
        let container = self
            .create_throwaway(client, &spec.name, &spec.image.digest, body)
            .await?;
        let outcome = self
            .run_attached(client, &spec.name, &container, process)
            .await;
        // Whatever happened, the throwaway goes.
        if let Err(e) = self.remove_container(client, &container).await {
            tracing::warn!(container = %spec.name, error = %e, "could not remove a throwaway container");
        }
        outcome
    }

    async fn inspect(&self, id: &str) -> Result<MachineState> {
        let client = self.engine.client().await?;
        Ok(self
            .machine(client, id)
            .await?
            .map_or(MachineState::Missing, |m| m.state))
    }

    async fn list(&self) -> Result<Vec<MachineInfo>> {
        let client = self.engine.client().await?;
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_owned(),
                vec![LABEL_ENVIRONMENT.to_owned()],
            )])),
            ..Default::default()
        };
        let containers = client
            .list_containers(Some(options))
            .await
            .map_err(|e| classify("listing machines", e))?;
        Ok(labels::machines(containers.into_iter().map(|c| {
            let state = match c.state {
                Some(ContainerSummaryStateEnum::RUNNING) => MachineState::Running,
                _ => MachineState::Stopped,
            };
            (c.labels.unwrap_or_default(), state)
        })))
    }

    async fn changes(&self) -> Result<futures_util::stream::BoxStream<'static, ()>> {
        use futures_util::StreamExt;
        let client = self.engine.client().await?.clone();
        let options = bollard::query_parameters::EventsOptions {
            since: None,
            until: None,
            filters: Some(std::collections::HashMap::from([
                ("type".to_owned(), vec!["container".to_owned()]),
                ("label".to_owned(), vec![LABEL_ENVIRONMENT.to_owned()]),
            ])),
        };
        Ok(client
            .events(Some(options))
            .take_while(|event| std::future::ready(event.is_ok()))
            .map(|_| ())
            .boxed())
    }

    async fn start(&self, id: &str) -> Result<()> {
        let client = self.engine.client().await?;
        let machine = self.machine(client, id).await?.ok_or_else(|| {
            RuntimeError::plain(ErrorKind::NotFound, format!("docker: no machine {id}"))
        })?;
        if machine.state == MachineState::Running {
            return Ok(());
        }
        client
            .start_container(&machine.container, None::<StartContainerOptions>)
            .await
            .map_err(|e| classify(&format!("starting machine {id}"), e))
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let client = self.engine.client().await?;
        match self.machine(client, id).await? {
            Some(machine) => self.remove_container(client, &machine.container).await,
            None => Ok(()),
        }
    }
}
