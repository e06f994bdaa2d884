//! A containerd machine's task: its init made from a container and started, its status and
//! host pid, and its end (killed, waited for, deleted).

use std::time::Duration;

use containerd_client::services::v1::{
    CreateTaskRequest, DeleteTaskRequest, GetRequest, KillRequest, StartRequest, WaitRequest,
};
use containerd_client::types::v1::{Process, Status as TaskStatus};
use containerd_client::types::Mount;

use super::client::{classify, is_not_found};
use super::Containerd;
use crate::{ErrorKind, Result, RuntimeError};

impl Containerd {
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

    /// Whether task `id` is, or within 5 s reads, not running.
    async fn stops_soon(&self, id: &str) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            if !self.task_runs(id).await {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether task `id` may still be running: neither missing, created and never started,
    /// nor stopped (a task containerd cannot be asked about counts as running).
    async fn task_runs(&self, id: &str) -> bool {
        !matches!(
            self.task_status(id).await,
            Ok(None | Some(TaskStatus::Stopped | TaskStatus::Created))
        )
    }

    /// Task `id`'s own process as containerd reports it; `None` when there is no task.
    pub(super) async fn task_process(&self, id: &str) -> Result<Option<Process>> {
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
    pub(super) async fn start_task(&self, id: &str, rootfs: Vec<Mount>) -> Result<u32> {
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
            // runsc refuses to signal a sandbox that has ended ("sandbox is not running", or its
            // control server refusing connections while the shim has yet to see it end) and the
            // shim passes that on as an unknown error: a task that stopped is what a kill wants.
            Err(e) if self.stops_soon(id).await => {
                tracing::debug!(machine = id, error = %e, "kill refused by a task that is not running");
            }
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
