//! A containerd machine's life: made (container record, writable snapshot, task) and started,
//! inspected, listed, watched for changes, started again and removed, with what they share.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use containerd_client::services::v1::container::Runtime as ContainerRuntime;
use containerd_client::services::v1::snapshots::{MountsRequest, PrepareSnapshotRequest};
use containerd_client::services::v1::{
    Container, CreateContainerRequest, CreateTaskRequest, DeleteContainerRequest,
    DeleteTaskRequest, GetContainerRequest, GetRequest, KillRequest, ListContainersRequest,
    StartRequest, UpdateContainerRequest, WaitRequest,
};
use containerd_client::types::v1::{Process, Status as TaskStatus};
use containerd_client::types::Mount;
use narya_oci::spec;

use super::client::{classify, is_not_found};
use super::image::LocalImage;
use super::Containerd;
use crate::labels::{self, LABEL_ENVIRONMENT, LABEL_POOL};
use crate::{
    ErrorKind, Limits, MachineInfo, MachineSpec, MachineState, Network, Result, RuntimeError,
};

/// The shim every machine and throwaway runs under.
const RUNC: &str = "io.containerd.runc.v2";

/// A runtime or process spec as containerd takes it: JSON inside an `Any` of `type_url`.
pub(super) fn spec_any(value: &impl serde::Serialize, type_url: &str) -> Result<prost_types::Any> {
    Ok(prost_types::Any {
        type_url: type_url.to_owned(),
        value: serde_json::to_vec(value)
            .map_err(|e| RuntimeError::caused(ErrorKind::Other, "encoding a runtime spec", e))?,
    })
}

/// Where a container sits: its workspace, its network, its bounds.
pub(super) struct Placement<'a> {
    pub workspace: &'a Path,
    pub mount_point: &'a str,
    pub network: Network,
    pub limits: Limits,
}

/// What a task's status says of its machine: only a running task serves; no task, a stopped one
/// or one in any other state does not.
pub(super) fn machine_state(status: Option<TaskStatus>) -> MachineState {
    match status {
        Some(TaskStatus::Running) => MachineState::Running,
        // A busy shim answers its state late and containerd then says "unknown": that is not
        // stopped, and restarting on it would kill a healthy machine.
        Some(TaskStatus::Unknown | TaskStatus::Paused | TaskStatus::Pausing) => {
            MachineState::Unknown
        }
        Some(TaskStatus::Created | TaskStatus::Stopped) | None => MachineState::Stopped,
    }
}

impl Containerd {
    /// `Runtime::create_machine`: the container, its snapshot and its task; nothing is left
    /// behind when a step fails.
    pub(super) async fn make_machine(&self, spec_in: &MachineSpec) -> Result<MachineInfo> {
        let image = self.local_image(&spec_in.image.digest).await?;
        let labels = labels::machine_labels(spec_in);
        let process = spec::ProcessSpec {
            // tini reaps what setup scripts and sessions leave behind; sleep keeps it alive.
            args: ["/usr/bin/tini", "-s", "--", "/bin/sleep", "infinity"]
                .map(str::to_owned)
                .to_vec(),
            env: image.config.config.env.clone(),
            cwd: spec_in.mount_point.clone(),
            uid: spec_in.user.uid,
            gid: spec_in.user.gid,
            nofile: spec_in.limits.nofile,
        };
        let mounts = self
            .make_container(
                &spec_in.id,
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
        let started = match self.start_task(&spec_in.id, mounts.clone()).await {
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                self.clear_outlived_task(&spec_in.id).await?;
                self.start_task(&spec_in.id, mounts).await
            }
            other => other,
        };
        if let Err(e) = started {
            let _ = self.stop_task(&spec_in.id).await;
            self.delete_container(&spec_in.id).await;
            return Err(e);
        }
        Ok(labels::running_machine(spec_in))
    }

    /// Ends a task of `id` that outlived its container record: a machine removed from outside
    /// while it was being started again leaves one, and containerd then refuses a new task of
    /// that name. Its tasks are reachable again now that the new record of `id` exists.
    async fn clear_outlived_task(&self, id: &str) -> Result<()> {
        tracing::warn!(machine = %id, "ending a task left by an earlier machine of this name");
        if let Err(e) = self.stop_task(id).await {
            self.delete_container(id).await;
            return Err(e);
        }
        Ok(())
    }

    /// `Runtime::inspect`.
    pub(super) async fn inspect_machine(&self, id: &str) -> Result<MachineState> {
        match self.container(id).await {
            Ok(_) => {}
            Err(RuntimeError::NotFound { .. }) => return Ok(MachineState::Missing),
            Err(e) => return Err(e),
        }
        Ok(machine_state(self.task_status(id).await?))
    }

    /// `Runtime::list`, or `Runtime::machines_of` when `environment` is given.
    pub(super) async fn list_machines(
        &self,
        environment: Option<&str>,
    ) -> Result<Vec<MachineInfo>> {
        // Filters in one request are or-ed. containerd keeps no empty label, so a pool
        // machine is found by its pool mark, not by its empty identifier.
        let filters = match environment {
            // containerd's filter syntax quotes a value with `"` and escapes with `\\`.
            Some(value) => {
                let quoted = value.replace('\\', "\\\\").replace('"', "\\\"");
                vec![format!("labels.\"{LABEL_ENVIRONMENT}\"==\"{quoted}\"")]
            }
            None => vec![
                format!("labels.\"{LABEL_ENVIRONMENT}\""),
                format!("labels.\"{LABEL_POOL}\""),
            ],
        };
        let containers = self
            .conn
            .containers()
            .list(self.conn.request(ListContainersRequest { filters }))
            .await
            .map_err(|e| classify("listing machines", e))?
            .into_inner()
            .containers;
        let mut found = Vec::with_capacity(containers.len());
        for c in containers {
            // The runtime answered the listing; one task that does not answer in time is a
            // machine whose state nobody can tell, not a failed listing.
            let state = match self.task_status(&c.id).await {
                Ok(status) => machine_state(status),
                Err(e) => {
                    tracing::debug!(machine = %c.id, error = %e, "task state not told");
                    MachineState::Unknown
                }
            };
            found.push((c.labels, state));
        }
        Ok(labels::machines(found))
    }

    /// `Runtime::claim`: the container's labels rewritten whole (the mask names `labels`), so
    /// that the pool mark goes and the identifier and organisation come in one update.
    pub(super) async fn claim_machine(
        &self,
        id: &str,
        environment: &str,
        organisation: &str,
    ) -> Result<()> {
        let mut container = self.container(id).await?;
        if !labels::is_machine(&container.labels, id) {
            return Err(RuntimeError::plain(
                ErrorKind::NotFound,
                format!("containerd: {id} is no Narya machine"),
            ));
        }
        container.labels = labels::claimed_labels(container.labels, environment, organisation);
        self.conn
            .containers()
            .update(self.conn.request(UpdateContainerRequest {
                container: Some(container),
                update_mask: Some(prost_types::FieldMask {
                    paths: vec!["labels".to_owned()],
                }),
            }))
            .await
            .map_err(|e| classify(&format!("labelling machine {id} as claimed"), e))?;
        Ok(())
    }

    /// `Runtime::start`: a stopped task is deleted and made again on the same snapshot.
    pub(super) async fn start_machine(&self, id: &str) -> Result<()> {
        self.container(id).await?;
        match machine_state(self.task_status(id).await?) {
            MachineState::Running => return Ok(()),
            MachineState::Unknown => {
                return Err(RuntimeError::plain(
                    ErrorKind::Unavailable,
                    format!("containerd cannot tell the state of machine {id}; not restarting it"),
                ))
            }
            MachineState::Stopped | MachineState::Missing => self.stop_task(id).await?,
        }
        if let Some(isolation) = &self.isolation {
            let path = isolation.namespace_path(id);
            // The file without its namespace: the host restarted under a stopped machine.
            if path.exists() && !isolation.is_attached(id) {
                isolation.detach(id).await?;
                isolation.ensure_firewall(false).await?;
                isolation.attach(id).await?;
            }
        }
        let mounts = self.mounts(id).await?;
        self.start_task(id, mounts).await.map(|_| ())
    }

    /// `Runtime::remove`: task, container record, then snapshot; each gone already is fine.
    pub(super) async fn remove_machine(&self, id: &str) -> Result<()> {
        self.exec_gates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        match self.container(id).await {
            Ok(_) => {}
            Err(RuntimeError::NotFound { .. }) => {
                self.remove_snapshot(id).await;
                return self.release_network(id).await;
            }
            Err(e) => return Err(e),
        }
        self.stop_task(id).await?;
        match self
            .conn
            .containers()
            .delete(
                self.conn
                    .request(DeleteContainerRequest { id: id.to_owned() }),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(classify(&format!("deleting machine {id}"), e)),
        }
        self.remove_snapshot(id).await;
        self.release_network(id).await
    }

    /// The namespace a container of `id` joins for `network`: made and wired for `Isolated`.
    async fn network_for(&self, id: &str, network: Network) -> Result<Option<PathBuf>> {
        if network != Network::Isolated {
            return Ok(None);
        }
        let isolation = self.isolation.as_deref().ok_or_else(|| {
            RuntimeError::plain(
                ErrorKind::Other,
                "containerd: network \"isolated\" asked for, but no [network] is configured",
            )
        })?;
        if isolation.is_attached(id) {
            // The namespace of a machine of that id, or one a failed removal left behind.
            match self.container(id).await {
                Ok(_) => {
                    return Err(RuntimeError::plain(
                        ErrorKind::AlreadyExists,
                        format!("containerd: machine {id} exists already"),
                    ))
                }
                Err(RuntimeError::NotFound { .. }) => isolation.detach(id).await?,
                Err(e) => return Err(e),
            }
        }
        isolation.ensure_firewall(false).await?;
        Ok(Some(isolation.attach(id).await?))
    }

    /// Releases what `id`'s isolated network held on the host; nothing to do without one.
    async fn release_network(&self, id: &str) -> Result<()> {
        match &self.isolation {
            Some(isolation) => isolation.detach(id).await,
            None => Ok(()),
        }
    }

    pub(super) async fn container(&self, id: &str) -> Result<Container> {
        self.conn
            .containers()
            .get(self.conn.request(GetContainerRequest { id: id.to_owned() }))
            .await
            .map_err(|e| classify(&format!("looking up machine {id}"), e))?
            .into_inner()
            .container
            .ok_or_else(|| {
                RuntimeError::plain(ErrorKind::NotFound, format!("containerd: no machine {id}"))
            })
    }

    pub(super) async fn task_status(&self, id: &str) -> Result<Option<TaskStatus>> {
        Ok(self
            .task_process(id)
            .await?
            .map(|p| TaskStatus::try_from(p.status).unwrap_or(TaskStatus::Unknown)))
    }

    /// `Runtime::init_pid`: the task's own process while it is not known to have stopped (a
    /// busy shim's `UNKNOWN` still has a live init).
    pub(super) async fn machine_init_pid(&self, id: &str) -> Result<Option<u32>> {
        let Some(p) = self.task_process(id).await? else {
            return Ok(None);
        };
        match TaskStatus::try_from(p.status).unwrap_or(TaskStatus::Unknown) {
            TaskStatus::Stopped | TaskStatus::Created => Ok(None),
            _ if p.pid > 0 => Ok(Some(p.pid)),
            // A shim too busy to answer its state in time makes containerd report the task
            // `UNKNOWN` with no pid: the init lives, but where cannot be told now. Never "no
            // init" (that would strike a run whose processes still run): ask again later.
            _ => Err(RuntimeError::plain(
                ErrorKind::Unavailable,
                format!("the shim of {id} cannot tell its init's pid right now"),
            )),
        }
    }

    /// Task `id`'s own process as containerd reports it; `None` when there is no task.
    async fn task_process(&self, id: &str) -> Result<Option<Process>> {
        match self
            .conn
            .tasks()
            .get(self.conn.request(GetRequest {
                container_id: id.to_owned(),
                exec_id: String::new(),
            }))
            .await
        {
            Ok(r) => Ok(r.into_inner().process),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(classify(&format!("looking up the task of {id}"), e)),
        }
    }

    async fn mounts(&self, key: &str) -> Result<Vec<Mount>> {
        Ok(self
            .conn
            .snapshots()
            .mounts(self.conn.request(MountsRequest {
                snapshotter: self.snapshotter.clone(),
                key: key.to_owned(),
            }))
            .await
            .map_err(|e| classify(&format!("mounts of {key}"), e))?
            .into_inner()
            .mounts)
    }

    /// Creates the task of container `id` on its snapshot, reading `stdin` and writing
    /// `stdout` (with stderr): FIFO paths, or empty for none.
    pub(super) async fn create_task(
        &self,
        id: &str,
        rootfs: Vec<Mount>,
        stdin: String,
        stdout: String,
    ) -> Result<()> {
        self.conn
            .tasks()
            .create(self.conn.request(CreateTaskRequest {
                container_id: id.to_owned(),
                rootfs,
                stdin,
                stdout: stdout.clone(),
                stderr: stdout,
                terminal: false,
                checkpoint: None,
                options: None,
                runtime_path: String::new(),
            }))
            .await
            .map_err(|e| classify(&format!("creating the task of {id}"), e))?;
        Ok(())
    }

    /// Creates and starts the task of machine `id` on its snapshot: its init has no stdio.
    async fn start_task(&self, id: &str, rootfs: Vec<Mount>) -> Result<u32> {
        self.create_task(id, rootfs, String::new(), String::new())
            .await?;
        let started = self
            .conn
            .tasks()
            .start(self.conn.request(StartRequest {
                container_id: id.to_owned(),
                exec_id: String::new(),
            }))
            .await
            .map_err(|e| classify(&format!("starting the task of {id}"), e))?;
        Ok(started.into_inner().pid)
    }

    /// Makes a container (record, snapshot) for `process` on `image`; nothing is left behind
    /// when a step fails.
    pub(super) async fn make_container(
        &self,
        id: &str,
        image: &LocalImage,
        process: spec::ProcessSpec,
        placement: Placement<'_>,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Mount>> {
        let cgroups_path = format!("/{}/{id}", self.namespace);
        let netns = self.network_for(id, placement.network).await?;
        let resolv_conf = self
            .isolation
            .as_deref()
            .filter(|_| netns.is_some())
            .map(|isolation| isolation.resolv_conf_path());
        let runtime_spec = match spec::container(&spec::ContainerSpec {
            hostname: id,
            process,
            workspace: placement.workspace,
            workspace_mount: placement.mount_point,
            host_network: placement.network == Network::Host,
            netns: netns.as_deref(),
            resolv_conf: resolv_conf.as_deref(),
            cgroups_path: &cgroups_path,
            limits: placement.limits,
        }) {
            Ok(spec) => spec,
            Err(e) => {
                self.forget_network(id).await;
                return Err(RuntimeError::caused(
                    ErrorKind::Other,
                    format!("writing the spec of {id}"),
                    e,
                ));
            }
        };
        let container = Container {
            id: id.to_owned(),
            labels,
            image: image.name.clone(),
            runtime: Some(ContainerRuntime {
                name: RUNC.to_owned(),
                options: None,
            }),
            spec: Some(match spec_any(&runtime_spec, spec::SPEC_TYPE_URL) {
                Ok(any) => any,
                Err(e) => {
                    self.forget_network(id).await;
                    return Err(e);
                }
            }),
            snapshotter: self.snapshotter.clone(),
            snapshot_key: id.to_owned(),
            ..Default::default()
        };
        if let Err(e) = self
            .conn
            .containers()
            .create(self.conn.request(CreateContainerRequest {
                container: Some(container),
            }))
            .await
        {
            self.forget_network(id).await;
            return Err(classify(&format!("creating machine {id}"), e));
        }
        let prepared = self
            .conn
            .snapshots()
            .prepare(self.conn.request(PrepareSnapshotRequest {
                snapshotter: self.snapshotter.clone(),
                key: id.to_owned(),
                parent: image.top_chain.to_string(),
                labels: HashMap::new(),
            }))
            .await;
        let mounts = match prepared {
            Ok(r) => r.into_inner().mounts,
            Err(e) => {
                let e = classify(&format!("preparing the writable layer of {id}"), e);
                self.delete_container(id).await;
                return Err(e);
            }
        };
        // What the machine writes outside its workspace counts against the workspace's disk
        // bound: the writable layer joins its project before anything runs.
        let writable = crate::disk::overlay_writable_dirs(
            mounts
                .iter()
                .flat_map(|m| m.options.iter().map(String::as_str)),
        );
        if let Err(e) = crate::disk::join_project(placement.workspace, &writable) {
            self.delete_container(id).await;
            return Err(RuntimeError::caused(
                ErrorKind::Other,
                format!("bounding the writable layer of {id} with its workspace's disk quota"),
                e,
            ));
        }
        Ok(mounts)
    }

    pub(super) async fn delete_container(&self, id: &str) {
        let _ = self
            .conn
            .containers()
            .delete(
                self.conn
                    .request(DeleteContainerRequest { id: id.to_owned() }),
            )
            .await;
        self.remove_snapshot(id).await;
        self.forget_network(id).await;
    }

    /// `release_network` on a path that has an error to report already.
    async fn forget_network(&self, id: &str) {
        if let Err(e) = self.release_network(id).await {
            tracing::warn!(machine = %id, error = %e, "could not release a network namespace");
        }
    }

    /// Kills the task (every process in it), waits for it, deletes it. Missing is fine.
    pub(super) async fn stop_task(&self, id: &str) -> Result<()> {
        match self
            .conn
            .tasks()
            .kill(self.conn.request(KillRequest {
                container_id: id.to_owned(),
                exec_id: String::new(),
                signal: 9,
                all: true,
            }))
            .await
        {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            // Killing a task that already stopped is refused; deleting it below settles it.
            Err(e) if e.code() == tonic::Code::FailedPrecondition => {}
            Err(e) => return Err(classify(&format!("killing machine {id}"), e)),
        }
        let mut tasks = self.conn.tasks();
        let wait = tasks.wait(self.conn.request(WaitRequest {
            container_id: id.to_owned(),
            exec_id: String::new(),
        }));
        match tokio::time::timeout(Duration::from_secs(10), wait).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if is_not_found(&e) => return Ok(()),
            Ok(Err(e)) => return Err(classify(&format!("waiting for machine {id} to stop"), e)),
            Err(_) => {
                return Err(RuntimeError::plain(
                    ErrorKind::Other,
                    format!("containerd: machine {id} did not stop within 10 s of SIGKILL"),
                ))
            }
        }
        match self
            .conn
            .tasks()
            .delete(self.conn.request(DeleteTaskRequest {
                container_id: id.to_owned(),
            }))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(classify(&format!("deleting the task of {id}"), e)),
        }
    }
}
