//! A Docker machine's life: a labelled container made and started, inspected, listed, watched
//! for changes, started again and removed, with what machines and throwaways share.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::models::{
    ContainerCreateBody, ContainerStateStatusEnum, ContainerSummaryStateEnum, HostConfig,
    HostConfigCgroupnsModeEnum, HostConfigLogConfig, Mount, MountTypeEnum, ResourcesUlimits,
    RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
    StartContainerOptions,
};
use bollard::Docker as Client;
use narya_oci::spec::CPU_PERIOD_US;
use narya_oci::Digest;
use nix::sys::resource::{getrlimit, Resource};
use tokio::time::Instant;

use super::engine::{classify, found};
use super::image::local_tag;
use super::Docker;
use crate::labels::{self, LABEL_ENVIRONMENT};
use crate::{
    Change, ErrorKind, Limits, MachineInfo, MachineSpec, MachineState, Network, Result,
    RuntimeError, ThrowawaySpec, OOM_SCORE_ADJ,
};

/// How long a container state the Docker API cannot express is waited out.
const STATE_SETTLE: Duration = Duration::from_secs(10);

/// How long a removal already under way in the engine is waited for.
const REMOVAL_WAIT: Duration = Duration::from_secs(30);

/// A Narya machine as the engine describes it.
pub(super) struct Machine {
    /// The engine's id, used for every later call: names can be matched by id prefixes.
    pub container: String,
    pub state: MachineState,
    pub labels: HashMap<String, String>,
    /// The host pid of its init while it runs.
    pub pid: Option<u32>,
}

fn network_mode(network: Network) -> String {
    match network {
        Network::Host => "host",
        // An isolated machine joins the daemon's network (`join_network`), never none.
        Network::None | Network::Isolated => "none",
    }
    .to_owned()
}

/// What machines and throwaways share: the workspace bind mount read-write, no new privileges,
/// no capabilities, the seccomp filter, a private cgroup namespace, the network asked for, the
/// limits, and no init of Docker's (ours is tini, in the image).
fn host_config(
    workspace: &Path,
    mount_point: &str,
    network: Network,
    limits: &Limits,
    seccomp: &str,
) -> Result<HostConfig> {
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
        security_opt: Some(vec![
            "no-new-privileges".to_owned(),
            format!("seccomp={seccomp}"),
        ]),
        cap_drop: Some(vec!["ALL".to_owned()]),
        network_mode: Some(network_mode(network)),
        init: Some(false),
        cgroupns_mode: Some(HostConfigCgroupnsModeEnum::PRIVATE),
        // Every output is read through exec attachments; what a machine writes to its init's
        // own output would otherwise grow the engine's log file without bound.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_owned()),
            config: None,
        }),
        ..bounded(limits)
    })
}

/// The lower of this process's hard `RLIMIT_NPROC` and the kernel's `pid_max`.
fn nproc_ceiling() -> Option<i64> {
    let hard = getrlimit(Resource::RLIMIT_NPROC)
        .ok()
        .map(|(_, hard)| hard)?;
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(hard);
    i64::try_from(hard.min(pid_max)).ok()
}

/// The `[limits]` as the engine takes them: the cgroup's memory (no swap on top), a CPU quota
/// (`NanoCpus` above the host's CPUs is refused), pids, the private `/tmp` with the same
/// options as on containerd, explicit rlimits (an engine's defaults may ask for more than the
/// host grants: Podman's fail with "error setting rlimit type 7") and the raised
/// `oom_score_adj`.
fn bounded(limits: &Limits) -> HostConfig {
    let memory = i64::try_from(limits.memory).unwrap_or(i64::MAX);
    let nofile = i64::try_from(limits.nofile).unwrap_or(i64::MAX);
    let mut ulimits = vec![ResourcesUlimits {
        name: Some("nofile".to_owned()),
        soft: Some(nofile),
        hard: Some(nofile),
    }];
    // RLIMIT_NPROC counts a uid's processes host-wide, so it cannot bound one environment (the
    // pids limit does); it is stated only so that the engine does not ask runc for more than it
    // may give: no more than ours, nor than the kernel's pid_max (what Podman raises its own
    // to, and the most processes there can be anyway).
    if let Some(nproc) = nproc_ceiling() {
        ulimits.push(ResourcesUlimits {
            name: Some("nproc".to_owned()),
            soft: Some(nproc),
            hard: Some(nproc),
        });
    }
    HostConfig {
        memory: Some(memory),
        memory_swap: Some(memory),
        cpu_period: Some(CPU_PERIOD_US as i64),
        cpu_quota: Some(limits.cpu_quota_us()),
        pids_limit: Some(i64::from(limits.pids)),
        tmpfs: Some(HashMap::from([(
            "/tmp".to_owned(),
            limits.tmp_options().join(","),
        )])),
        ulimits: Some(ulimits),
        oom_score_adj: Some(i64::from(OOM_SCORE_ADJ)),
        ..Default::default()
    }
}

fn machine_state(status: Option<ContainerStateStatusEnum>) -> MachineState {
    match status {
        Some(ContainerStateStatusEnum::RUNNING) => MachineState::Running,
        // On its way somewhere: not stopped, and not to be restarted.
        Some(
            ContainerStateStatusEnum::PAUSED
            | ContainerStateStatusEnum::RESTARTING
            | ContainerStateStatusEnum::REMOVING,
        ) => MachineState::Unknown,
        // Created, exited, dead: not serving.
        _ => MachineState::Stopped,
    }
}

impl Docker {
    /// [`host_config`] with the seccomp filter as this engine takes it, joined to the daemon's
    /// network when `network` is isolated.
    pub(super) async fn host_config(
        &self,
        client: &Client,
        workspace: &Path,
        mount_point: &str,
        network: Network,
        limits: &Limits,
    ) -> Result<HostConfig> {
        let seccomp = self.seccomp_option().await?;
        let mut host = host_config(workspace, mount_point, network, limits, &seccomp)?;
        self.join_network(client, &mut host, network).await?;
        Ok(host)
    }

    /// `Runtime::create_machine`: the container made and started; removed again when it does
    /// not start.
    pub(super) async fn make_machine(&self, spec: &MachineSpec) -> Result<MachineInfo> {
        let client = self.engine.client().await?;
        let image = self.require_image(&spec.image.digest).await?;
        let mut host = self
            .host_config(
                client,
                &spec.workspace,
                &spec.mount_point,
                spec.network,
                &spec.limits,
            )
            .await?;
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
            hostname: (spec.network != Network::Host && spec.id.len() <= 63)
                .then(|| spec.id.clone()),
            labels: Some(labels::machine_labels(spec)),
            host_config: Some(host),
            ..Default::default()
        };
        let created = match self
            .create_container(client, &spec.id, &spec.image.digest, body)
            .await
        {
            Ok(created) => created,
            Err(e) => {
                if spec.network == Network::Isolated && e.kind() != ErrorKind::AlreadyExists {
                    self.recheck_network().await;
                }
                return Err(e);
            }
        };
        if let Err(e) = self.bound_layer(client, &created, &spec.workspace).await {
            if let Err(removal) = self.remove_container(client, &created).await {
                tracing::warn!(machine = %spec.id, error = %removal, "could not remove a machine whose layer could not be bounded");
            }
            return Err(e);
        }
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
        Ok(labels::running_machine(spec))
    }

    /// Puts the writable layer of the created (not yet started) container `container` in the
    /// project of `workspace`, bounded like it, when the workspace has one: the engine's
    /// overlay `UpperDir` and `WorkDir`, as its inspection names them on this host.
    async fn bound_layer(&self, client: &Client, container: &str, workspace: &Path) -> Result<()> {
        if crate::disk::group(workspace).ok().flatten().is_none() {
            return Ok(());
        }
        let inspected = client
            .inspect_container(container, None::<InspectContainerOptions>)
            .await
            .map_err(|e| classify(&format!("inspecting the layers of {container}"), e))?;
        let data = inspected
            .graph_driver
            .map(|driver| driver.data)
            .unwrap_or_default();
        let writable: Vec<PathBuf> = ["UpperDir", "WorkDir"]
            .iter()
            .filter_map(|key| data.get(*key).map(PathBuf::from))
            .collect();
        crate::disk::join_project(workspace, &writable).map_err(|e| {
            RuntimeError::caused(
                ErrorKind::Other,
                format!(
                    "bounding the writable layer of {container} with its workspace's disk quota"
                ),
                e,
            )
        })
    }

    /// `Runtime::inspect`.
    pub(super) async fn inspect_machine(&self, id: &str) -> Result<MachineState> {
        let client = self.engine.client().await?;
        Ok(self
            .machine(client, id)
            .await?
            .map_or(MachineState::Missing, |m| m.state))
    }

    /// `Runtime::init_pid`.
    pub(super) async fn machine_init_pid(&self, id: &str) -> Result<Option<u32>> {
        let client = self.engine.client().await?;
        Ok(self.machine(client, id).await?.and_then(|m| m.pid))
    }

    /// `Runtime::list`, or `Runtime::machines_of` when `environment` is given.
    pub(super) async fn list_machines(
        &self,
        environment: Option<&str>,
    ) -> Result<Vec<MachineInfo>> {
        let client = self.engine.client().await?;
        let label = match environment {
            Some(value) => format!("{LABEL_ENVIRONMENT}={value}"),
            None => LABEL_ENVIRONMENT.to_owned(),
        };
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_owned(), vec![label])])),
            ..Default::default()
        };
        let containers = client
            .list_containers(Some(options))
            .await
            .map_err(|e| classify("listing machines", e))?;
        Ok(labels::machines(containers.into_iter().map(|c| {
            let state = match c.state {
                Some(ContainerSummaryStateEnum::RUNNING) => MachineState::Running,
                Some(
                    ContainerSummaryStateEnum::PAUSED
                    | ContainerSummaryStateEnum::RESTARTING
                    | ContainerSummaryStateEnum::REMOVING,
                ) => MachineState::Unknown,
                _ => MachineState::Stopped,
            };
            (c.labels.unwrap_or_default(), state)
        })))
    }

    /// `Runtime::changes`: the engine's container events of Narya machines, from the moment
    /// of the call. The request goes out only when the stream is first read, so it asks for
    /// the events since now: a machine that stops in between is still reported.
    pub(super) async fn subscribe_changes(
        &self,
    ) -> Result<futures_util::stream::BoxStream<'static, Change>> {
        use futures_util::StreamExt;
        let client = self.engine.client().await?.clone();
        if self.engine.is_podman().await? {
            return Ok(super::podman::polled_changes(client).await);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let options = bollard::query_parameters::EventsOptions {
            since: Some(format!("{}.{:09}", now.as_secs(), now.subsec_nanos())),
            until: None,
            filters: Some(std::collections::HashMap::from([
                ("type".to_owned(), vec!["container".to_owned()]),
                ("label".to_owned(), vec![LABEL_ENVIRONMENT.to_owned()]),
                // What happens to machines; an exec's events (exec_create, exec_start,
                // exec_die) are not, and dozens at once must not each set off a pass.
                (
                    "event".to_owned(),
                    [
                        "create", "start", "die", "stop", "kill", "oom", "destroy", "pause",
                        "unpause",
                    ]
                    .map(str::to_owned)
                    .to_vec(),
                ),
            ])),
        };
        Ok(client
            .events(Some(options))
            .take_while(|event| std::future::ready(event.is_ok()))
            .filter_map(|event| std::future::ready(event.ok().and_then(change_of)))
            .boxed())
    }

    /// `Runtime::start`.
    pub(super) async fn start_machine(&self, id: &str) -> Result<()> {
        let client = self.engine.client().await?;
        let machine = self.machine(client, id).await?.ok_or_else(|| {
            RuntimeError::plain(ErrorKind::NotFound, format!("docker: no machine {id}"))
        })?;
        match machine.state {
            MachineState::Running => return Ok(()),
            MachineState::Unknown => {
                return Err(RuntimeError::plain(
                    ErrorKind::Unavailable,
                    format!("docker: machine {id} is neither running nor stopped; not starting it"),
                ))
            }
            MachineState::Stopped | MachineState::Missing => {}
        }
        client
            .start_container(&machine.container, None::<StartContainerOptions>)
            .await
            .map_err(|e| classify(&format!("starting machine {id}"), e))
    }

    /// `Runtime::remove`.
    pub(super) async fn remove_machine(&self, id: &str) -> Result<()> {
        let client = self.engine.client().await?;
        match self.machine(client, id).await? {
            Some(machine) => self.remove_container(client, &machine.container).await,
            None => Ok(()),
        }
    }

    /// The Narya machine `id`, or `None` when the engine has no container of that name that is
    /// labelled as that environment's machine (the engine's names are shared with everything
    /// else on the host, so an unlabelled namesake is not ours to run in or remove).
    pub(super) async fn machine(&self, client: &Client, id: &str) -> Result<Option<Machine>> {
        let mut answer = client
            .inspect_container(id, None::<InspectContainerOptions>)
            .await;
        // Podman says `stopped` for a moment after a container's process ends (before its
        // clean-up makes it `exited`): a state the Docker API does not have, so the answer does
        // not parse. Ask again until it settles.
        let settle = Instant::now() + STATE_SETTLE;
        while matches!(answer, Err(bollard::errors::Error::JsonDataError { .. }))
            && Instant::now() < settle
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
            answer = client
                .inspect_container(id, None::<InspectContainerOptions>)
                .await;
        }
        let Some(found) = found(&format!("looking up machine {id}"), answer)? else {
            return Ok(None);
        };
        let labels = found.config.and_then(|c| c.labels).unwrap_or_default();
        if !labels::is_machine(&labels, id) {
            return Ok(None);
        }
        let Some(container) = found.id else {
            return Ok(None);
        };
        let state = found.state.unwrap_or_default();
        Ok(Some(Machine {
            container,
            state: machine_state(state.status),
            labels,
            pid: state
                .pid
                .and_then(|p| u32::try_from(p).ok())
                .filter(|p| *p > 0),
        }))
    }

    /// Fails with `Image` unless the image pinned to `digest` is in the engine.
    pub(super) async fn require_image(&self, digest: &Digest) -> Result<String> {
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
    pub(super) async fn remove_container(&self, client: &Client, container: &str) -> Result<()> {
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        let answer = client.remove_container(container, Some(options)).await;
        match found(&format!("removing container {container}"), answer) {
            // Removed now, or gone already.
            Ok(_) => return Ok(()),
            // 409: "removal already in progress" from another caller.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let until = Instant::now() + REMOVAL_WAIT;
        loop {
            let answer = client
                .inspect_container(container, None::<InspectContainerOptions>)
                .await;
            match found(&format!("waiting for {container} to go"), answer)? {
                None => return Ok(()),
                Some(_) if Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Some(_) => {
                    return Err(RuntimeError::plain(
                        ErrorKind::Other,
                        format!(
                            "docker: container {container} was still being removed after {} s",
                            REMOVAL_WAIT.as_secs()
                        ),
                    ))
                }
            }
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
        let created = if self.engine.is_podman().await? {
            // Through Podman's own API: its compatible create drops the cgroup namespace.
            super::libpod::create(self.engine.socket(), name, &body).await
        } else {
            let options = CreateContainerOptions {
                name: Some(name.to_owned()),
                platform: String::new(),
            };
            client
                .create_container(Some(options), body)
                .await
                .map(|created| created.id)
                .map_err(|e| classify(&format!("creating container {name}"), e))
        };
        match created {
            Ok(id) => Ok(id),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.images.lock().await.remove(digest);
                Err(e.into_kind(ErrorKind::Image))
            }
            Err(other) => Err(other),
        }
    }

    /// Creates the throwaway `spec` names from `body`; one of that name left behind by a daemon
    /// that died mid-run is cleared first.
    pub(super) async fn create_throwaway(
        &self,
        client: &Client,
        spec: &ThrowawaySpec,
        body: ContainerCreateBody,
    ) -> Result<String> {
        let (name, digest) = (spec.name.as_str(), &spec.image.digest);
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
}

/// The machine an engine event is about, by the labels it carries as attributes; `None` for a
/// throwaway container's (which is no machine), `Unknown` when it names none.
fn change_of(event: bollard::models::EventMessage) -> Option<Change> {
    let attributes = event.actor.and_then(|a| a.attributes).unwrap_or_default();
    if labels::is_any_throwaway(&attributes) {
        return None;
    }
    Some(match labels::machine_name(&attributes) {
        Some(name) => Change::Machine(name.to_owned()),
        None => Change::Unknown,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use bollard::models::{EventActor, EventMessage};

    use super::change_of;
    use crate::Change;

    fn event(attributes: &[(&str, &str)]) -> EventMessage {
        EventMessage {
            actor: Some(EventActor {
                id: Some("f00d".to_owned()),
                attributes: Some(
                    attributes
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect::<HashMap<_, _>>(),
                ),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_event_names_the_machine_by_its_labels_and_passes_over_throwaways() {
        let machine = event(&[
            ("name", "narya-1"),
            ("dev.narya.environment", "demo"),
            ("dev.narya.machine", "narya-1"),
        ]);
        assert_eq!(change_of(machine), Some(Change::Machine("narya-1".into())));
        let throwaway = event(&[
            ("name", "demo-clone"),
            ("dev.narya.throwaway", "demo-clone"),
        ]);
        assert_eq!(change_of(throwaway), None);
        assert_eq!(change_of(event(&[])), Some(Change::Unknown));
    }
}
