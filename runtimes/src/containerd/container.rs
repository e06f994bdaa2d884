//! A containerd container: its record with the runtime spec, its writable snapshot (joined to
//! its workspace's disk bound) and its network namespace, made and deleted together.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use containerd_client::services::v1::container::Runtime as ContainerRuntime;
use containerd_client::services::v1::snapshots::{MountsRequest, PrepareSnapshotRequest};
use containerd_client::services::v1::{
    Container, CreateContainerRequest, DeleteContainerRequest, GetContainerRequest,
};
use containerd_client::types::Mount;
use narya_oci::spec;

use super::client::classify;
use super::image::LocalImage;
use super::Containerd;
use crate::{ErrorKind, Limits, Network, Result, RuntimeError};

/// The shim every machine and throwaway runs under.
const RUNC: &str = "io.containerd.runc.v2";

/// The runc shim's options (`containerd.runc.v1.Options` in containerd's
/// `api/types/runc/options/oci.proto`): only the OCI runtime it calls instead of runc.
#[derive(Clone, PartialEq, prost::Message)]
struct RuncOptions {
    #[prost(string, tag = "6")]
    binary_name: String,
}

/// The runc shim's options for a container of this back end: `None` (runc) or the OCI runtime
/// it calls instead.
fn runtime_options(oci_runtime: Option<&Path>) -> Option<prost_types::Any> {
    use prost::Message;
    oci_runtime.map(|binary| prost_types::Any {
        type_url: "containerd.runc.v1.Options".to_owned(),
        value: RuncOptions {
            binary_name: binary.display().to_string(),
        }
        .encode_to_vec(),
    })
}

/// A runtime or process spec as containerd takes it: JSON inside an `Any` of `type_url`.
pub(super) fn spec_any(value: &impl serde::Serialize, type_url: &str) -> Result<prost_types::Any> {
    Ok(prost_types::Any {
        type_url: type_url.to_owned(),
        value: serde_json::to_vec(value)
            .map_err(|e| RuntimeError::caused(ErrorKind::Other, "encoding a runtime spec", e))?,
    })
}

/// Where a container sits: its workspace, its network, its bounds.
pub(super) struct Placement<'a> {
    pub workspace: &'a Path,
    pub mount_point: &'a str,
    pub network: Network,
    pub limits: Limits,
}

impl Containerd {
    /// The namespace a container of `id` joins for `network`: made and wired for `Isolated`.
    pub(super) async fn network_for(&self, id: &str, network: Network) -> Result<Option<PathBuf>> {
        if network != Network::Isolated {
            return Ok(None);
        }
        let isolation = self.isolation.as_deref().ok_or_else(|| {
            RuntimeError::plain(
                ErrorKind::Other,
                "containerd: network \"isolated\" asked for, but no [network] is configured",
            )
        })?;
        if isolation.is_attached(id) {
            // The namespace of a machine of that id, or one a failed removal left behind.
            match self.container(id).await {
                Ok(_) => {
                    return Err(RuntimeError::plain(
                        ErrorKind::AlreadyExists,
                        format!("containerd: machine {id} exists already"),
                    ))
                }
                Err(RuntimeError::NotFound { .. }) => isolation.detach(id).await?,
                Err(e) => return Err(e),
            }
        }
        isolation.ensure_firewall(false).await?;
        Ok(Some(isolation.attach(id).await?))
    }

    /// Releases what `id`'s isolated network held on the host; nothing to do without one.
    pub(super) async fn release_network(&self, id: &str) -> Result<()> {
        match &self.isolation {
            Some(isolation) => isolation.detach(id).await,
            None => Ok(()),
        }
    }

    pub(super) async fn container(&self, id: &str) -> Result<Container> {
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

    pub(super) async fn mounts(&self, key: &str) -> Result<Vec<Mount>> {
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

    /// Makes a container (record, snapshot) for `process` on `image`; nothing is left behind
    /// when a step fails.
    pub(super) async fn make_container(
        &self,
        id: &str,
        image: &LocalImage,
        process: spec::ProcessSpec,
        placement: Placement<'_>,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Mount>> {
        let cgroups_path = format!("/{}/{id}", self.namespace);
        let netns = self.network_for(id, placement.network).await?;
        let resolv_conf = self
            .isolation
            .as_deref()
            .filter(|_| netns.is_some())
            .map(|isolation| isolation.resolv_conf_path());
        let runtime_spec = match spec::container(&spec::ContainerSpec {
            hostname: id,
            process,
            workspace: placement.workspace,
            workspace_mount: placement.mount_point,
            host_network: placement.network == Network::Host,
            netns: netns.as_deref(),
            resolv_conf: resolv_conf.as_deref(),
            cgroups_path: &cgroups_path,
            limits: placement.limits,
        }) {
            Ok(spec) => spec,
            Err(e) => {
                self.forget_network(id).await;
                return Err(RuntimeError::caused(
                    ErrorKind::Other,
                    format!("writing the spec of {id}"),
                    e,
                ));
            }
        };
        let container = Container {
            id: id.to_owned(),
            labels,
            image: image.name.clone(),
            runtime: Some(ContainerRuntime {
                name: RUNC.to_owned(),
                options: runtime_options(self.oci_runtime.as_deref()),
            }),
            spec: Some(match spec_any(&runtime_spec, spec::SPEC_TYPE_URL) {
                Ok(any) => any,
                Err(e) => {
                    self.forget_network(id).await;
                    return Err(e);
                }
            }),
            snapshotter: self.snapshotter.clone(),
            snapshot_key: id.to_owned(),
            ..Default::default()
        };
        if let Err(e) = self
            .conn
            .containers()
            .create(self.conn.request(CreateContainerRequest {
                container: Some(container),
            }))
            .await
        {
            self.forget_network(id).await;
            return Err(classify(&format!("creating machine {id}"), e));
        }
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
        let mounts = match prepared {
            Ok(r) => r.into_inner().mounts,
            Err(e) => {
                let e = classify(&format!("preparing the writable layer of {id}"), e);
                self.delete_container(id).await;
                return Err(e);
            }
        };
        // What the machine writes outside its workspace counts against the workspace's disk
        // bound: the writable layer joins its project before anything runs.
        let writable = crate::disk::overlay_writable_dirs(
            mounts
                .iter()
                .flat_map(|m| m.options.iter().map(String::as_str)),
        );
        if let Err(e) = crate::disk::join_project(placement.workspace, &writable) {
            self.delete_container(id).await;
            return Err(RuntimeError::caused(
                ErrorKind::Other,
                format!("bounding the writable layer of {id} with its workspace's disk quota"),
                e,
            ));
        }
        Ok(mounts)
    }

    pub(super) async fn delete_container(&self, id: &str) {
        let _ = self
            .conn
            .containers()
            .delete(
                self.conn
                    .request(DeleteContainerRequest { id: id.to_owned() }),
            )
            .await;
        self.remove_snapshot(id).await;
        self.forget_network(id).await;
    }

    /// `release_network` on a path that has an error to report already.
    pub(super) async fn forget_network(&self, id: &str) {
        if let Err(e) = self.release_network(id).await {
            tracing::warn!(machine = %id, error = %e, "could not release a network namespace");
        }
    }
}
