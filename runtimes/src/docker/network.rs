//! Docker's side of isolated networking: a bridge network the daemon creates (`narya-<tag>`,
//! inter-container traffic off, addresses from `[network] subnet`), which isolated machines
//! join; the firewall chains do the rest (see `crate::network`).

use std::collections::HashMap;

use bollard::models::{HostConfig, Ipam, IpamConfig, NetworkCreateRequest};
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
        let existing = found(&format!("looking up network {name}"), answer)?;
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
            match client.create_network(request).await {
                Ok(_) => tracing::info!(network = %name, %subnet, "docker: network made"),
                // Made meanwhile by another call: as good.
                Err(e) => match classify(&format!("creating network {name}"), e) {
                    e if e.kind() == ErrorKind::AlreadyExists => {}
                    e => return Err(e),
                },
            }
        }
        isolation.ensure_firewall(true).await?;
        *ready = true;
        Ok(())
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
