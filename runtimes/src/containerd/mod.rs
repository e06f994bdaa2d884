//! The containerd back end, over containerd's gRPC API in one namespace and snapshotter.

mod client;
mod commit;
mod container;
mod content;
mod events;
mod exec;
mod image;
mod machine;
mod task;
mod throwaway;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use narya_oci::Digest;
use tokio::sync::Mutex;

use self::client::{classify, Connection};
use self::image::LocalImage;
use crate::network::{Isolation, NetworkConfig};
use crate::pinning::ImagePinning;
use crate::{
    ErrorKind, ImageSource, MachineInfo, MachineSpec, MachineState, PinnedImage, ProcessOutcome,
    ProcessSpec, Result, Runtime, RuntimeError, Sandbox, ThrowawayInfo, ThrowawaySpec,
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
    /// Isolated networking (`network = "isolated"`); `None`: machines asking for it fail.
    pub network: Option<NetworkConfig>,
    /// The kernel machines and throwaways run on.
    pub sandbox: Sandbox,
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
    isolation: Option<Arc<Isolation>>,
    /// The OCI runtime the runc shim calls instead of runc (`BinaryName`): the runsc wrapper
    /// under gVisor.
    oci_runtime: Option<PathBuf>,
}

/// Processes one machine's shim is given at once; the rest wait their turn.
const EXECS_PER_MACHINE: usize = 8;

/// A name no other call of this process or any other uses, for leases, uploads, scratch
/// snapshots and execs (and so the FIFOs named after them).
///
/// The counter makes names distinct inside the process however many calls race (a clock read
/// is not: two threads can read the same nanosecond); the pid keeps two daemons on one host
/// apart; the process's start time keeps a restarted daemon that got its predecessor's pid (pid 1
/// in a container, every time) from reusing a name the predecessor left behind in containerd.
fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static STARTED: OnceLock<u128> = OnceLock::new();
    let started = STARTED.get_or_init(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{started:x}-{n}", std::process::id())
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
        // Beside the FIFOs, in the daemon's own directory.
        let oci_runtime = match &config.sandbox {
            Sandbox::Container => None,
            Sandbox::Gvisor { runsc } => Some(crate::sandbox::write_wrapper(
                std::path::Path::new(runsc),
                &config.fifo_dir.with_file_name("narya-runsc"),
            )?),
        };
        let isolation = match config.network {
            Some(network) => {
                let isolation = Isolation::new(network)?;
                isolation.check_reservations()?;
                isolation.check_overlaps()?;
                isolation.write_conflist()?;
                Some(Arc::new(isolation))
            }
            None => None,
        };
        Ok(Containerd {
            isolation,
            conn: Connection::new(&config.socket, &config.namespace)?,
            namespace: config.namespace,
            snapshotter: config.snapshotter,
            pinning: ImagePinning::new(config.insecure_registries)?,
            fifo_dir: config.fifo_dir,
            images: Mutex::new(HashMap::new()),
            exec_gates: std::sync::Mutex::new(HashMap::new()),
            oci_runtime,
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

    /// The snapshotter's root, as containerd's introspection exports it.
    async fn layers_dir(&self) -> Result<Option<std::path::PathBuf>> {
        let plugins = self
            .conn
            .introspection()
            .plugins(containerd_client::services::v1::PluginsRequest {
                filters: vec![format!(
                    "type==io.containerd.snapshotter.v1,id=={}",
                    self.snapshotter
                )],
            })
            .await
            .map_err(|e| classify("asking for the snapshotter's root", e))?
            .into_inner()
            .plugins;
        Ok(plugins
            .into_iter()
            .find_map(|plugin| plugin.exports.get("root").map(std::path::PathBuf::from)))
    }

    async fn ensure_image(&self, source: &ImageSource) -> Result<PinnedImage> {
        self.pinning.ensure(source, self, self.name()).await
    }

    async fn create_machine(&self, spec: &MachineSpec) -> Result<MachineInfo> {
        self.make_machine(spec).await
    }

    async fn claim(&self, id: &str, environment: &str, organisation: &str) -> Result<bool> {
        self.claim_machine(id, environment, organisation).await?;
        Ok(true)
    }

    async fn run(&self, id: &str, spec: &ProcessSpec) -> Result<ProcessOutcome> {
        self.run_in(id, spec).await
    }

    async fn run_throwaway(&self, spec: &ThrowawaySpec) -> Result<ProcessOutcome> {
        self.run_in_throwaway(spec).await
    }

    async fn list_throwaways(&self) -> Result<Vec<ThrowawayInfo>> {
        self.list_throwaway_containers().await
    }

    async fn remove_throwaway(&self, name: &str) -> Result<()> {
        self.remove_throwaway_container(name).await
    }

    async fn inspect(&self, id: &str) -> Result<MachineState> {
        self.inspect_machine(id).await
    }

    async fn init_pid(&self, id: &str) -> Result<Option<u32>> {
        self.machine_init_pid(id).await
    }

    async fn kill_marked(&self, id: &str, entry: &str) -> Result<usize> {
        if self.oci_runtime.is_some() {
            return crate::sandbox::sweep_in(self, id, entry).await;
        }
        crate::kill_marked_from_the_host(self.machine_init_pid(id).await?, entry).await
    }

    async fn list(&self) -> Result<Vec<MachineInfo>> {
        self.list_machines(None).await
    }

    async fn machines_of(&self, environment: &str) -> Result<Vec<MachineInfo>> {
        self.list_machines(Some(environment)).await
    }

    async fn changes(&self) -> Result<futures_util::stream::BoxStream<'static, crate::Change>> {
        self.subscribe_changes().await
    }

    async fn commit(&self, id: &str, name: &str) -> Result<crate::Committed> {
        self.commit_machine(id, name).await
    }

    async fn remove_committed(&self, name: &str) -> Result<()> {
        self.remove_committed_image(name).await
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.start_machine(id).await
    }

    async fn remove(&self, id: &str) -> Result<()> {
        self.remove_machine(id).await
    }

    fn isolation(&self) -> Option<&Isolation> {
        self.isolation.as_deref()
    }

    async fn shutdown(&self) -> Result<()> {
        if let Some(isolation) = &self.isolation {
            // Every isolated machine of this daemon holds a namespace under its run directory.
            let left = isolation.leftovers().namespaces;
            if left == 0 {
                isolation.remove_firewall().await;
            } else {
                tracing::info!(
                    machines = left,
                    "network: keeping the firewall chains for the machines still there"
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::unique;

    #[test]
    fn ten_thousand_names_made_from_many_threads_at_once_are_distinct() {
        let threads: Vec<_> = (0..16)
            .map(|_| std::thread::spawn(|| (0..625).map(|_| unique("exec")).collect::<Vec<_>>()))
            .collect();
        let mut names = HashSet::new();
        for thread in threads {
            for name in thread.join().unwrap() {
                assert!(names.insert(name.clone()), "{name} was made twice");
            }
        }
        assert_eq!(names.len(), 10_000);
    }

    #[test]
    fn names_are_valid_containerd_identifiers() {
        // containerd refuses exec and lease ids longer than 76 characters or outside [A-Za-z0-9_.-].
        let name = unique("narya-pull");
        assert!(name.len() <= 76, "{name}");
        assert!(name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')));
    }
}
