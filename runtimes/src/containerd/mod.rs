//! The containerd back end, over containerd's gRPC API in one namespace and snapshotter.

mod client;
mod content;
mod exec;
mod image;
mod machine;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use narya_oci::Digest;
use tokio::sync::Mutex;

use self::client::{classify, Connection};
use self::image::LocalImage;
use crate::pinning::ImagePinning;
use crate::{
    ErrorKind, ImageSource, MachineInfo, MachineSpec, MachineState, PinnedImage, ProcessOutcome,
    ProcessSpec, Result, Runtime, RuntimeError, ThrowawaySpec,
};

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

/// The containerd back end.
pub struct Containerd {
    conn: Connection,
    namespace: String,
    snapshotter: String,
    pinning: ImagePinning,
    fifo_dir: PathBuf,
    images: Mutex<HashMap<Digest, LocalImage>>,
    /// Per machine, how many processes may be starting or running in it at once: a runc shim
    /// answers dozens of simultaneous execs so slowly that they time out, so they queue here.
    exec_gates: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

/// Processes one machine's shim is given at once; the rest wait their turn.
const EXECS_PER_MACHINE: usize = 8;

/// A name no other call of this process or any other uses, for leases, uploads, scratch
/// snapshots and execs.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
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
            exec_gates: std::sync::Mutex::new(HashMap::new()),
        })
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

    async fn create_machine(&self, spec: &MachineSpec) -> Result<MachineInfo> {
        self.make_machine(spec).await
    }

    async fn run(&self, id: &str, spec: &ProcessSpec) -> Result<ProcessOutcome> {
        self.run_in(id, spec).await
    }

    async fn run_throwaway(&self, spec: &ThrowawaySpec) -> Result<ProcessOutcome> {
        self.run_in_throwaway(spec).await
    }

    async fn inspect(&self, id: &str) -> Result<MachineState> {
        self.inspect_machine(id).await
    }

    async fn list(&self) -> Result<Vec<MachineInfo>> {
        self.list_machines(None).await
    }

    async fn machines_of(&self, environment: &str) -> Result<Vec<MachineInfo>> {
        self.list_machines(Some(environment)).await
    }

    async fn changes(&self) -> Result<futures_util::stream::BoxStream<'static, ()>> {
        self.subscribe_changes().await
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.start_machine(id).await
    }

    async fn remove(&self, id: &str) -> Result<()> {
        self.remove_machine(id).await
    }
}
