//! A Docker machine's life: a labelled container made (its writable layer joined to its
//! workspace's disk bound) and started, inspected, listed, started again and removed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::models::{
    ContainerCreateBody, ContainerStateStatusEnum, ContainerSummaryStateEnum, RestartPolicy,
    RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
    StartContainerOptions,
};
use bollard::Docker as Client;
use narya_oci::Digest;
use tokio::time::Instant;

use super::engine::{classify, found};
use super::image::local_tag;
use super::Docker;
use crate::labels::{self, LABEL_ENVIRONMENT};
use crate::{
    ErrorKind, MachineInfo, MachineSpec, MachineState, Network, Result, RuntimeError, ThrowawaySpec,
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
    /// `Runtime::create_machine`: the container made and started; removed again when it does
    /// not start.
    pub(super) async fn make_machine(&self, spec: &MachineSpec) -> Result<MachineInfo> {
        let client = self.engine.client().await?;
        let image = match &spec.layer {
            Some(layer) => super::commit::committed_tag(layer),
            None => self.require_image(&spec.image.digest).await?,
        };
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
        let bounded = crate::disk::group(workspace).map_err(|e| {
            RuntimeError::caused(
                ErrorKind::Other,
                format!(
                    "reading the disk bound of workspace {}",
                    workspace.display()
                ),
                e,
            )
        })?;
        if bounded.is_none() {
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
