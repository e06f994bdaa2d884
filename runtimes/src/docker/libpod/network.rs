//! Podman's networks are made through its own API (`/libpod/networks/create`), never through
//! its Docker-compatible create, which turns Podman's DNS on for every bridge network: under
//! netavark (Podman 5; Podman 4 with it) aardvark-dns then serves the network and becomes the
//! only resolver in each machine's `/etc/resolv.conf`, in place of the `[network] dns` the
//! daemon asks for. Podman's own create takes `dns_enabled` as it is asked (Podman 4.3 with CNI
//! and no `dnsname` plugin had it off either way).
//!
//! The request is the one made for Docker; each field it sets is carried over as Podman's
//! compatible create would carry it, and a field this translation does not know fails the
//! create rather than being lost.

use std::path::Path;

use bollard::models::{IpamConfig, NetworkCreateRequest};
use serde_json::{json, Map, Value};

use super::{expect, request, untranslated, LibpodError};
use crate::{ErrorKind, Result, RuntimeError};

/// Creates the network `network` asks for through Podman's own API on `socket`, with Podman's
/// DNS off. A network of that name already there is `AlreadyExists`.
pub(in crate::docker) async fn create_network(
    socket: &Path,
    network: &NetworkCreateRequest,
) -> Result<()> {
    let what = || format!("docker: creating network {} (Podman)", network.name);
    let created = async {
        let spec = network_spec(network)?;
        let answer = request(socket, hyper::Method::POST, "/networks/create", Some(&spec)).await?;
        expect(200, answer).map(drop)
    };
    created
        .await
        .map_err(|e| RuntimeError::caused(e.kind(), what(), e))
}

/// Whether Podman's DNS serves network `name` (`dns_enabled` in Podman's own inspect); `None`
/// when there is no such network.
pub(in crate::docker) async fn network_dns_enabled(
    socket: &Path,
    name: &str,
) -> Result<Option<bool>> {
    let what = || format!("docker: looking up network {name} (Podman)");
    let inspected = async {
        let path = format!("/networks/{name}/json");
        let answer = request(socket, hyper::Method::GET, &path, None).await?;
        let body = expect(200, answer)?;
        let network: Value =
            serde_json::from_slice(&body).map_err(|e| LibpodError::Decode("a network", e))?;
        Ok::<_, LibpodError>(
            network
                .get("dns_enabled")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        )
    };
    match inspected.await {
        Ok(enabled) => Ok(Some(enabled)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RuntimeError::caused(e.kind(), what(), e)),
    }
}

/// Podman's network (`types.Network`) for what `network` asks of the Docker API, with DNS off.
fn network_spec(network: &NetworkCreateRequest) -> Result<Value, LibpodError> {
    let mut spec = Map::new();
    let mut left = Vec::new();
    let driver = network.driver.as_deref().unwrap_or("bridge");
    spec.insert("name".to_owned(), json!(network.name));
    spec.insert("driver".to_owned(), json!(driver));
    spec.insert("dns_enabled".to_owned(), json!(false));
    spec.insert(
        "internal".to_owned(),
        json!(network.internal.unwrap_or(false)),
    );
    spec.insert(
        "ipv6_enabled".to_owned(),
        json!(network.enable_ipv6.unwrap_or(false)),
    );
    if let Some(labels) = &network.labels {
        spec.insert("labels".to_owned(), json!(labels));
    }
    let mut options = Map::new();
    // What Podman's compatible create does: Docker's bridge networks never reach each other.
    if driver == "bridge" {
        options.insert("isolate".to_owned(), json!("true"));
    }
    let mut pairs: Vec<(&String, &String)> = network.options.iter().flatten().collect();
    pairs.sort();
    for (name, value) in pairs {
        match name.as_str() {
            "com.docker.network.bridge.name" if driver == "bridge" => {
                spec.insert("network_interface".to_owned(), json!(value));
            }
            "com.docker.network.driver.mtu" | "mtu" => {
                options.insert("mtu".to_owned(), json!(value));
            }
            // Podman has no such switch (its compatible create drops it too): the daemon's
            // firewall chains keep the machines on the bridge apart.
            "com.docker.network.bridge.enable_icc" => {}
            _ => left.push(format!("Options {name:?}")),
        }
    }
    spec.insert("options".to_owned(), Value::Object(options));
    if let Some(ipam) = &network.ipam {
        match ipam.driver.as_deref() {
            None | Some("default") => {}
            Some(other) => left.push(format!("IPAM.Driver {other:?}")),
        }
        if ipam.options.as_ref().is_some_and(|o| !o.is_empty()) {
            left.push("IPAM.Options".to_owned());
        }
        let mut subnets = Vec::new();
        for config in ipam.config.iter().flatten() {
            match config {
                IpamConfig {
                    subnet: Some(subnet),
                    gateway,
                    ip_range: None,
                    auxiliary_addresses: None,
                } => {
                    let mut s = Map::new();
                    s.insert("subnet".to_owned(), json!(subnet));
                    if let Some(gateway) = gateway {
                        s.insert("gateway".to_owned(), json!(gateway));
                    }
                    subnets.push(Value::Object(s));
                }
                other => left.push(format!("IPAM.Config {other:?}")),
            }
        }
        if !subnets.is_empty() {
            spec.insert("subnets".to_owned(), json!(subnets));
        }
    }
    let mut rest = network.clone();
    rest.name = String::new();
    (rest.driver, rest.internal, rest.enable_ipv6) = (None, None, None);
    (rest.labels, rest.options, rest.ipam) = (None, None, None);
    left.extend(
        untranslated(&rest)?
            .into_iter()
            .filter(|field| field != "Name"),
    );
    if !left.is_empty() {
        return Err(LibpodError::Untranslated(left.join(", ")));
    }
    Ok(Value::Object(spec))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use bollard::models::{Ipam, IpamConfig, NetworkCreateRequest};
    use serde_json::json;

    use super::network_spec;
    use crate::docker::libpod::LibpodError;

    fn request() -> NetworkCreateRequest {
        NetworkCreateRequest {
            name: "narya-t1".to_owned(),
            driver: Some("bridge".to_owned()),
            ipam: Some(Ipam {
                driver: Some("default".to_owned()),
                config: Some(vec![IpamConfig {
                    subnet: Some("10.89.0.0/16".to_owned()),
                    gateway: Some("10.89.0.1".to_owned()),
                    ..Default::default()
                }]),
                options: None,
            }),
            enable_ipv6: Some(false),
            options: Some(HashMap::from([
                (
                    "com.docker.network.bridge.name".to_owned(),
                    "nry-t1".to_owned(),
                ),
                (
                    "com.docker.network.bridge.enable_icc".to_owned(),
                    "false".to_owned(),
                ),
            ])),
            labels: Some(HashMap::from([(
                "dev.narya.network".to_owned(),
                "t1".to_owned(),
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn the_daemons_network_becomes_podmans_without_its_dns() {
        let spec = network_spec(&request()).expect("everything is carried over");
        assert_eq!(
            spec,
            json!({
                "name": "narya-t1",
                "driver": "bridge",
                "network_interface": "nry-t1",
                "subnets": [{"subnet": "10.89.0.0/16", "gateway": "10.89.0.1"}],
                "ipv6_enabled": false,
                "internal": false,
                "dns_enabled": false,
                "labels": {"dev.narya.network": "t1"},
                "options": {"isolate": "true"},
            })
        );
    }

    #[test]
    fn what_is_not_translated_fails_the_network_create() {
        let mut network = request();
        network.attachable = Some(true);
        network.options.as_mut().unwrap().insert(
            "com.docker.network.bridge.host_binding_ipv4".to_owned(),
            "0.0.0.0".to_owned(),
        );
        network.ipam.as_mut().unwrap().config.as_mut().unwrap()[0].ip_range =
            Some("10.89.1.0/24".to_owned());
        match network_spec(&network) {
            Err(LibpodError::Untranslated(left)) => {
                assert!(left.contains("Attachable"), "{left}");
                assert!(left.contains("host_binding_ipv4"), "{left}");
                assert!(left.contains("10.89.1.0/24"), "{left}");
            }
            other => panic!("{other:?}"),
        }
    }
}
