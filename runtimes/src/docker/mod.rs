//! The Docker back end, over the Docker Engine API (bollard) on the engine's unix socket.

mod changes;
mod commit;
mod engine;
mod exec;
mod host_config;
mod image;
mod libpod;
mod machine;
mod network;
mod podman;
mod process;
mod seccomp;
mod throwaway;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use narya_oci::Digest;
use tokio::sync::Mutex;

use self::engine::Engine;
use crate::network::{Isolation, NetworkConfig};
use crate::pinning::ImagePinning;
use crate::{
    ImageSource, MachineInfo, MachineSpec, MachineState, PinnedImage, ProcessOutcome, ProcessSpec,
    Result, Runtime, Sandbox, ThrowawayInfo, ThrowawaySpec,
};

/// How to reach the engine.
#[derive(Clone, Debug)]
pub struct DockerConfig {
    /// The engine's unix socket (`runtime.docker_socket`).
    pub socket: PathBuf,
    /// Registries reached over plain HTTP (`image.insecure_registries`); dockerd must treat
    /// them as insecure too.
    pub insecure_registries: Vec<String>,
    /// Isolated networking (`network = "isolated"`); `None`: machines asking for it fail.
    pub network: Option<NetworkConfig>,
    /// A directory of the daemon's own where files the engine reads are written (the seccomp
    /// profile, for Podman, which takes it as a path).
    pub profile_dir: PathBuf,
    /// The kernel machines and throwaways run on.
    pub sandbox: Sandbox,
}

/// The Docker back end.
pub struct Docker {
    engine: Engine,
    pinning: ImagePinning,
    insecure_registries: Vec<String>,
    /// Manifest digests known to be available under our tag.
    images: Mutex<HashSet<Digest>>,
    isolation: Option<Arc<Isolation>>,
    /// Whether the network isolated machines join was seen or made by this process.
    network_ready: Mutex<bool>,
    profile_dir: PathBuf,
    /// The seccomp profile's file, once written.
    seccomp_file: Mutex<Option<PathBuf>>,
    /// The engine's name of the OCI runtime machines run under instead of its default (runsc,
    /// under gVisor).
    oci_runtime: Option<String>,
}

impl Docker {
    pub fn new(config: DockerConfig) -> Result<Docker> {
        Ok(Docker {
            engine: Engine::new(&config.socket),
            pinning: ImagePinning::new(config.insecure_registries.clone())?,
            insecure_registries: config.insecure_registries,
            images: Mutex::new(HashSet::new()),
            isolation: config
                .network
                .map(|network| {
                    let isolation = Isolation::new(network)?;
                    isolation.check_overlaps()?;
                    Ok::<_, crate::RuntimeError>(Arc::new(isolation))
                })
                .transpose()?,
            network_ready: Mutex::new(false),
            profile_dir: config.profile_dir,
            seccomp_file: Mutex::new(None),
            oci_runtime: match config.sandbox {
                Sandbox::Container => None,
                Sandbox::Gvisor { runsc } => Some(runsc),
            },
        })
    }
}

#[async_trait::async_trait]
impl Runtime for Docker {
    fn name(&self) -> &'static str {
        "docker"
    }

    /// The engine's version; refuses engines below API 1.41, and under gVisor an engine that
    /// has no runtime of the configured name.
    async fn version(&self) -> Result<String> {
        let version = self.engine.version().await?;
        match &self.oci_runtime {
            None => Ok(version),
            Some(name) => {
                self.engine.check_runtime(name).await?;
                Ok(format!(
                    "{version}, machines under gVisor (engine runtime {name:?})"
                ))
            }
        }
    }

    /// The engine's root directory (`DockerRootDir`; Podman answers its graph root there).
    async fn layers_dir(&self) -> Result<Option<std::path::PathBuf>> {
        let client = self.engine.client().await?;
        let info = client
            .info()
            .await
            .map_err(|e| engine::classify("asking for the engine's root directory", e))?;
        Ok(info.docker_root_dir.map(std::path::PathBuf::from))
    }

    async fn ensure_image(&self, source: &ImageSource) -> Result<PinnedImage> {
        self.pinning.ensure(source, self, self.name()).await
    }

    async fn create_machine(&self, spec: &MachineSpec) -> Result<MachineInfo> {
        self.make_machine(spec).await
    }

    /// The engine cannot change a container's labels: a claimed machine keeps its pool labels
    /// and its name, and the daemon's store alone binds it (see the README).
    async fn claim(&self, _id: &str, _environment: &str, _organisation: &str) -> Result<bool> {
        Ok(false)
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
        self.release_network().await
    }
}
