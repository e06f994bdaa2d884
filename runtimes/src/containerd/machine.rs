//! A containerd machine's life: made (container record, writable snapshot, task) and started,
//! inspected, listed, claimed, started again and removed.

use containerd_client::services::v1::{
    DeleteContainerRequest, ListContainersRequest, UpdateContainerRequest,
};
use containerd_client::types::v1::Status as TaskStatus;
use narya_oci::spec;

use super::client::{classify, is_not_found};
use super::container::Placement;
use super::Containerd;
use crate::labels::{self, LABEL_ENVIRONMENT, LABEL_POOL};
use crate::{ErrorKind, MachineInfo, MachineSpec, MachineState, Result, RuntimeError};

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
        let image = match &spec_in.layer {
            Some(layer) => self.committed_image(layer).await?,
            None => self.local_image(&spec_in.image.digest).await?,
        };
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
    pub(super) async fn clear_outlived_task(&self, id: &str) -> Result<()> {
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
}
