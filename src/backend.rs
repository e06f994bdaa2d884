//! Choosing the runtime back end from configuration: the one place above `runtimes/` that
//! names a back end.

use std::sync::Arc;

use narya_runtimes::containerd::{Containerd, ContainerdConfig};
use narya_runtimes::docker::{Docker, DockerConfig};
use narya_runtimes::{Runtime, RuntimeError};

use crate::config::{Backend, Config};

/// The configured back end.
pub fn connect(config: &Config) -> Result<Arc<dyn Runtime>, RuntimeError> {
    match config.runtime.backend {
        Backend::Containerd => Ok(Arc::new(Containerd::new(ContainerdConfig {
            socket: config.runtime.containerd_socket.clone(),
            namespace: config.runtime.containerd_namespace.clone(),
            snapshotter: config.runtime.snapshotter.clone(),
            insecure_registries: config.image.insecure_registries.clone(),
            fifo_dir: config.state_dir.join("fifo"),
        })?)),
        // The engine's API version is checked on first use (and by `Docker::version`), so a
        // daemon started before the engine waits for it instead of failing.
        Backend::Docker => Ok(Arc::new(Docker::new(DockerConfig {
            socket: config.runtime.docker_socket.clone(),
            insecure_registries: config.image.insecure_registries.clone(),
            profile_dir: config.state_dir.join("profiles"),
        })?)),
    }
}
