//! The containerd back end, over containerd's gRPC API in one namespace and snapshotter.

mod client;
mod image;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use containerd_client::services::v1::container::Runtime as ContainerRuntime;
use containerd_client::services::v1::snapshots::{MountsRequest, PrepareSnapshotRequest};
use containerd_client::services::v1::{
    CloseIoRequest, Container, CreateContainerRequest, CreateTaskRequest, DeleteContainerRequest,
    DeleteProcessRequest, DeleteTaskRequest, ExecProcessRequest, GetContainerRequest, GetRequest,
    KillRequest, ListContainersRequest, StartRequest, WaitRequest,
};
use containerd_client::types::v1::Status as TaskStatus;
use containerd_client::types::Mount;
use narya_oci::spec;
use narya_oci::Digest;
use tokio::sync::Mutex;

use tokio::time::Instant;

use self::client::{classify, is_not_found, Connection};
use self::image::LocalImage;
use crate::labels::{self, LABEL_ENVIRONMENT};
use crate::output::{InputFifo, OutputFifo};
use crate::pinning::ImagePinning;
use crate::watch::{require_running, watch, AbortOnDrop, Ending, Watched};
use crate::{
    ErrorKind, ImageSource, MachineInfo, MachineSpec, MachineState, Network, PinnedImage,
    ProcessOutcome, ProcessSpec, Result, Runtime, RuntimeError, ThrowawaySpec,
};

const RUNC: &str = "io.containerd.runc.v2";
/// How long output may still arrive after a process ended (a background child holding stdout).
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// How to reach containerd and where to keep things.
#[derive(Clone, Debug)]
pub struct ContainerdConfig {
    pub socket: PathBuf,
    pub namespace: String,
    pub snapshotter: String,
    pub insecure_registries: Vec<String>,
    /// A private directory for the FIFOs that carry process output.
    pub fifo_dir: PathBuf,
}

pub struct Containerd {
    conn: Connection,
    namespace: String,
    snapshotter: String,
    pinning: ImagePinning,
    fifo_dir: PathBuf,
    images: Mutex<HashMap<Digest, LocalImage>>,
}

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

fn spec_any(value: &serde_json::Value, type_url: &str) -> Result<prost_types::Any> {
    Ok(prost_types::Any {
        type_url: type_url.to_owned(),
        value: serde_json::to_vec(value)
            .map_err(|e| RuntimeError::caused(ErrorKind::Other, "encoding a runtime spec", e))?,
    })
}

/// `KEY=VALUE` entries: the image's, then ours over them.
fn merged_env(
    image_env: &[String],
    extra: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
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

/// What a task's status says of its machine. Unknown is not stopped in truth (a busy shim
/// answers late), but nothing can be run in it either.
fn machine_state(status: Option<TaskStatus>) -> MachineState {
    match status {
        Some(TaskStatus::Running) => MachineState::Running,
        _ => MachineState::Stopped,
    }
}

impl Containerd {
    pub fn new(config: ContainerdConfig) -> Result<Containerd> {
        std::fs::create_dir_all(&config.fifo_dir).map_err(|e| {
            RuntimeError::caused(
                ErrorKind::Other,
                format!("cannot create {}", config.fifo_dir.display()),
                e,
            )
        })?;
        Ok(Containerd {
            conn: Connection::new(&config.socket, &config.namespace)?,
            namespace: config.namespace,
            snapshotter: config.snapshotter,
            pinning: ImagePinning::new(config.insecure_registries)?,
            fifo_dir: config.fifo_dir,
            images: Mutex::new(HashMap::new()),
        })
    }

    async fn container(&self, id: &str) -> Result<Container> {
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

    async fn task_status(&self, id: &str) -> Result<Option<TaskStatus>> {
        match self
            .conn
            .tasks()
            .get(self.conn.request(GetRequest {
                container_id: id.to_owned(),
                exec_id: String::new(),
            }))
            .await
        {
            Ok(r) => Ok(r
                .into_inner()
                .process
                .map(|p| TaskStatus::try_from(p.status).unwrap_or(TaskStatus::Unknown))),
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

    /// Creates and starts the task of container `id` on its snapshot; stdio as given.
    async fn start_task(&self, id: &str, rootfs: Vec<Mount>, output: &str) -> Result<u32> {
        self.conn
            .tasks()
            .create(self.conn.request(CreateTaskRequest {
                container_id: id.to_owned(),
                rootfs,
                stdin: String::new(),
                stdout: output.to_owned(),
                stderr: output.to_owned(),
                terminal: false,
                checkpoint: None,
                options: None,
                runtime_path: String::new(),
            }))
            .await
            .map_err(|e| classify(&format!("creating the task of {id}"), e))?;
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
    #[allow(clippy::too_many_arguments)]
    async fn make_container(
        &self,
        id: &str,
        image: &LocalImage,
        process: spec::ProcessSpec,
        workspace: &Path,
        mount_point: &str,
        network: Network,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Mount>> {
        let cgroups_path = format!("/{}/{id}", self.namespace);
        let runtime_spec = spec::container(&spec::ContainerSpec {
            hostname: id,
            process,
            workspace,
            workspace_mount: mount_point,
            host_network: network == Network::Host,
            cgroups_path: &cgroups_path,
        });
        let container = Container {
            id: id.to_owned(),
            labels,
            image: image.name.clone(),
            runtime: Some(ContainerRuntime {
                name: RUNC.to_owned(),
                options: None,
            }),
            spec: Some(spec_any(&runtime_spec, spec::SPEC_TYPE_URL)?),
            snapshotter: self.snapshotter.clone(),
            snapshot_key: id.to_owned(),
            ..Default::default()
        };
        self.conn
            .containers()
            .create(self.conn.request(CreateContainerRequest {
                container: Some(container),
            }))
            .await
            .map_err(|e| classify(&format!("creating machine {id}"), e))?;
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
        match prepared {
            Ok(r) => Ok(r.into_inner().mounts),
            Err(e) => {
                let e = classify(&format!("preparing the writable layer of {id}"), e);
                self.delete_container(id).await;
                Err(e)
            }
        }
    }

    async fn delete_container(&self, id: &str) {
        let _ = self
            .conn
            .containers()
            .delete(
                self.conn
                    .request(DeleteContainerRequest { id: id.to_owned() }),
            )
            .await;
        self.remove_snapshot(id).await;
    }

    /// Kills the task (every process in it), waits for it, deletes it. Missing is fine.
    async fn stop_task(&self, id: &str) -> Result<()> {
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

#[async_trait::async_trait]
impl Runtime for Containerd {
    fn name(&self) -> &'static str {
        "containerd"
    }

    async fn version(&self) -> Result<String> {
        let v = self
            .conn
            .version()
            .version(())
            .await
            .map_err(|e| classify("asking for the version", e))?
            .into_inner();
        Ok(v.version)
    }

    async fn ensure_image(&self, source: &ImageSource) -> Result<PinnedImage> {
        self.pinning.ensure(source, self, self.name()).await
    }

    async fn create_machine(&self, spec_in: &MachineSpec) -> Result<MachineInfo> {
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
        };
        let mounts = self
            .make_container(
                &spec_in.id,
                &image,
                process,
                &spec_in.workspace,
                &spec_in.mount_point,
                spec_in.network,
                labels,
            )
            .await?;
        if let Err(e) = self.start_task(&spec_in.id, mounts, "").await {
            let _ = self.stop_task(&spec_in.id).await;
            self.delete_container(&spec_in.id).await;
            return Err(e);
        }
        Ok(MachineInfo {
            id: spec_in.id.clone(),
            digest: Some(spec_in.image.digest.clone()),
            state: MachineState::Running,
        })
    }

    async fn run(&self, id: &str, spec_in: &ProcessSpec) -> Result<ProcessOutcome> {
        let container = self.container(id).await?;
        let state = machine_state(self.task_status(id).await?);
        let container = require_running(self.name(), id, Some((container, state)))?;
        self.exec_in(id, &container, spec_in).await
    }

    async fn run_throwaway(&self, spec_in: &ThrowawaySpec) -> Result<ProcessOutcome> {
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

    async fn inspect(&self, id: &str) -> Result<MachineState> {
        match self.container(id).await {
            Ok(_) => {}
            Err(RuntimeError::NotFound { .. }) => return Ok(MachineState::Missing),
            Err(e) => return Err(e),
        }
        Ok(machine_state(self.task_status(id).await?))
    }

    async fn list(&self) -> Result<Vec<MachineInfo>> {
        let containers = self
            .conn
            .containers()
            .list(self.conn.request(ListContainersRequest {
                filters: vec![format!("labels.\"{LABEL_ENVIRONMENT}\"")],
            }))
            .await
            .map_err(|e| classify("listing machines", e))?
            .into_inner()
            .containers;
        let mut found = Vec::with_capacity(containers.len());
        for c in containers {
            let state = machine_state(self.task_status(&c.id).await?);
            found.push((c.labels, state));
        }
        Ok(labels::machines(found))
    }

    async fn changes(&self) -> Result<futures_util::stream::BoxStream<'static, ()>> {
        use futures_util::StreamExt;
        // containerd answers a subscription only with its first event, so the call is made in
        // a task of its own and its events relayed: the caller is never held up by a quiet
        // runtime. The relay ends with the subscription or when nobody listens any more.
        let (nudges, heard) = tokio::sync::mpsc::channel::<()>(16);
        let conn = self.conn.clone();
        let request = containerd_client::services::v1::SubscribeRequest {
            // Events of every namespace arrive unless filtered.
            filters: vec![format!("namespace==\"{}\"", self.namespace)],
        };
        tokio::spawn(async move {
            let mut client = conn.events();
            let subscribed = tokio::select! {
                subscribed = client.subscribe(request) => subscribed,
                _ = nudges.closed() => return,
            };
            let Ok(events) = subscribed else { return };
            let mut events = events.into_inner();
            loop {
                tokio::select! {
                    event = events.next() => match event {
                        Some(Ok(_)) => {
                            if nudges.send(()).await.is_err() {
                                return;
                            }
                        }
                        _ => return,
                    },
                    _ = nudges.closed() => return,
                }
            }
        });
        Ok(futures_util::stream::unfold(heard, |mut heard| async move {
            heard.recv().await.map(|()| ((), heard))
        })
        .boxed())
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.container(id).await?;
        match self.task_status(id).await? {
            Some(TaskStatus::Running) => return Ok(()),
            Some(_) => self.stop_task(id).await?,
            None => {}
        }
        let mounts = self.mounts(id).await?;
        self.start_task(id, mounts, "").await.map(|_| ())
    }

    async fn remove(&self, id: &str) -> Result<()> {
        match self.container(id).await {
            Ok(_) => {}
            Err(RuntimeError::NotFound { .. }) => {
                self.remove_snapshot(id).await;
                return Ok(());
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
        Ok(())
    }
}
