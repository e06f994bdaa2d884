//! Choosing the runtime back end from configuration: the one place above `runtimes/` that
//! names a back end.

use std::sync::Arc;

use narya_runtimes::containerd::{Containerd, ContainerdConfig};
use narya_runtimes::docker::{Docker, DockerConfig};
use narya_runtimes::network::{non_loopback_resolvers, tag_for, NetworkConfig};
use narya_runtimes::{Network, Runtime, RuntimeError};

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
            network: network(config),
            sandbox: config.runtime.sandbox(),
        })?)),
        // The engine's API version is checked on first use (and by `Docker::version`), so a
        // daemon started before the engine waits for it instead of failing.
        Backend::Docker => Ok(Arc::new(Docker::new(DockerConfig {
            socket: config.runtime.docker_socket.clone(),
            insecure_registries: config.image.insecure_registries.clone(),
            network: network(config),
            profile_dir: config.state_dir.join("profiles"),
            sandbox: config.runtime.sandbox(),
        })?)),
    }
}

/// Isolated networking as configured, when environments get it. The tag comes from the state
/// directory: stable for one installation, distinct for two daemons on one host.
fn network(config: &Config) -> Option<NetworkConfig> {
    if config.environment.network != Network::Isolated {
        return None;
    }
    let dns = if config.network.dns.is_empty() {
        let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        non_loopback_resolvers(&text)
    } else {
        config.network.dns.clone()
    };
    Some(NetworkConfig {
        tag: tag_for(&config.state_dir.display().to_string()),
        subnet: config.network.subnet,
        dns,
        cni_bin_dirs: config.network.cni_bin_dir.clone(),
        run_dir: config.state_dir.join("net"),
    })
}
