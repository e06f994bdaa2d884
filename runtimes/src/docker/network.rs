//! Docker's side of isolated networking: a bridge network the daemon creates (`narya-<tag>`,
//! inter-container traffic off, addresses from `[network] subnet`), which isolated machines
//! join; the firewall chains do the rest (see `crate::network`). On Podman the network is made
//! through Podman's own API, without Podman's DNS (see `libpod::network`).

use std::collections::HashMap;

use bollard::models::{
    HostConfig, Ipam, IpamConfig, Network as EngineNetwork, NetworkCreateRequest,
};
use bollard::query_parameters::InspectNetworkOptions;
use bollard::Docker as Client;

use super::engine::{classify, found};
use super::Docker;
use crate::network::Isolation;
use crate::{ErrorKind, Network, Result, RuntimeError};

/// Marks the networks Narya made, with the tag of the daemon that made it.
const LABEL_NETWORK: &str = "dev.narya.network";

impl Docker {
    fn require_isolation(&self) -> Result<&Isolation> {
        self.isolation.as_deref().ok_or_else(|| {
            RuntimeError::plain(
                ErrorKind::Other,
                "docker: network \"isolated\" asked for, but no [network] is configured",
            )
        })
    }

    /// Sets `host` up for `network`: for `Isolated`, the daemon's network (made if missing),
    /// its resolvers and IPv6 off.
    pub(super) async fn join_network(
        &self,
        client: &Client,
        host: &mut HostConfig,
        network: Network,
    ) -> Result<()> {
        if network != Network::Isolated {
            return Ok(());
        }
        let isolation = self.require_isolation()?;
        self.ensure_network(client, isolation).await?;
        host.network_mode = Some(isolation.docker_network());
        host.dns = Some(
            isolation
                .config()
                .dns
                .iter()
                .map(ToString::to_string)
                .collect(),
        );
        host.sysctls = Some(HashMap::from([(
            "net.ipv6.conf.all.disable_ipv6".to_owned(),
            "1".to_owned(),
        )]));
        Ok(())
    }

    /// The daemon's network and firewall, once per process (and again after the engine lost
    /// the network).
    async fn ensure_network(&self, client: &Client, isolation: &Isolation) -> Result<()> {
        let mut ready = self.network_ready.lock().await;
        if *ready {
            return Ok(());
        }
        let name = isolation.docker_network();
        let answer = client
            .inspect_network(&name, None::<InspectNetworkOptions>)
            .await;
        let mut existing = found(&format!("looking up network {name}"), answer)?;
        let podman = self.engine.is_podman().await?;
        if let Some(network) = &existing {
            // The rules fence the configured subnet: a network made for another one would leave
            // its machines outside them.
            let subnets: Vec<String> = network
                .ipam
                .as_ref()
                .and_then(|ipam| ipam.config.as_ref())
                .map(|configs| configs.iter().filter_map(|c| c.subnet.clone()).collect())
                .unwrap_or_default();
            let wanted = isolation.config().subnet.to_string();
            if subnets != [wanted.clone()] {
                return Err(RuntimeError::plain(
                    ErrorKind::Other,
                    format!("docker: network {name} has subnet {subnets:?}, not [network] subnet {wanted}; delete its environments and the network (docker network rm {name}), or set the subnet back"),
                ));
            }
        }
        if let Some(network) = &existing {
            if podman && self.made_again_without_dns(client, &name, network).await? {
                existing = None;
            }
        }
        if existing.is_none() {
            let subnet = isolation.config().subnet;
            let request = NetworkCreateRequest {
                name: name.clone(),
                driver: Some("bridge".to_owned()),
                ipam: Some(Ipam {
                    driver: Some("default".to_owned()),
                    config: Some(vec![IpamConfig {
                        subnet: Some(subnet.to_string()),
                        gateway: Some(subnet.gateway().to_string()),
                        ..Default::default()
                    }]),
                    options: None,
                }),
                enable_ipv6: Some(false),
                options: Some(HashMap::from([
                    (
                        "com.docker.network.bridge.name".to_owned(),
                        isolation.bridge(),
                    ),
                    (
                        "com.docker.network.bridge.enable_icc".to_owned(),
                        "false".to_owned(),
                    ),
                ])),
                labels: Some(HashMap::from([(
                    LABEL_NETWORK.to_owned(),
                    isolation.config().tag.clone(),
                )])),
                ..Default::default()
            };
            let created = if podman {
                // Through Podman's own API: its compatible create turns Podman's DNS on.
                super::libpod::create_network(self.engine.socket(), &request).await
            } else {
                client
                    .create_network(request)
                    .await
                    .map(drop)
                    .map_err(|e| classify(&format!("creating network {name}"), e))
            };
            match created {
                Ok(()) => tracing::info!(network = %name, %subnet, "docker: network made"),
                // Made meanwhile by another call: as good.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        isolation.ensure_firewall(true).await?;
        *ready = true;
        Ok(())
    }

    /// Podman: whether `network` (named `name`) had Podman's DNS on and was removed, to be made
    /// again without it. A daemon before this one made its network through Podman's compatible
    /// API, which turns the DNS on: under netavark (Podman 5) aardvark-dns is then the only
    /// resolver in its machines' resolv.conf, in place of `[network] dns`. A network with
    /// machines on it stays as it is (removing it would cut them off), with a warning.
    async fn made_again_without_dns(
        &self,
        client: &Client,
        name: &str,
        network: &EngineNetwork,
    ) -> Result<bool> {
        let socket = self.engine.socket();
        if super::libpod::network_dns_enabled(socket, name).await? != Some(true) {
            return Ok(false);
        }
        let attached = network.containers.as_ref().map_or(0, |c| c.len());
        let removed = if attached > 0 {
            Err(format!("{attached} machine(s) on it"))
        } else {
            match client.remove_network(name).await {
                Ok(()) => Ok(()),
                Err(e) => match classify(&format!("removing network {name}"), e) {
                    e if e.kind() == ErrorKind::NotFound => Ok(()),
                    e => Err(e.to_string()),
                },
            }
        };
        match removed {
            Ok(()) => {
                tracing::info!(network = %name, "docker: network had Podman's DNS on; making it again without");
                Ok(true)
            }
            Err(why) => {
                tracing::warn!(
                    network = %name,
                    "docker: network has Podman's DNS on, so its machines resolve names through \
                     Podman's aardvark-dns instead of [network] dns; it is made again without \
                     once nothing is on it (kept now: {why})"
                );
                Ok(false)
            }
        }
    }

    /// After a create failed: the network may be what went missing, so look again next time.
    pub(super) async fn recheck_network(&self) {
        *self.network_ready.lock().await = false;
    }

    /// `Runtime::shutdown`: the network and the chains go when no container is on it.
    pub(super) async fn release_network(&self) -> Result<()> {
        let Some(isolation) = self.isolation.as_deref() else {
            return Ok(());
        };
        let client = self.engine.client().await?;
        let name = isolation.docker_network();
        let answer = client
            .inspect_network(&name, None::<InspectNetworkOptions>)
            .await;
        if let Some(network) = found(&format!("looking up network {name}"), answer)? {
            let attached = network.containers.map_or(0, |c| c.len());
            if attached > 0 {
                tracing::info!(
                    machines = attached,
                    "network: keeping the network and its chains for the machines still there"
                );
                return Ok(());
            }
            match client.remove_network(&name).await {
                Ok(()) => {}
                Err(e) => {
                    let e = classify(&format!("removing network {name}"), e);
                    if e.kind() != ErrorKind::NotFound {
                        return Err(e);
                    }
                }
            }
        }
        isolation.remove_firewall().await;
        *self.network_ready.lock().await = false;
        Ok(())
    }
}
