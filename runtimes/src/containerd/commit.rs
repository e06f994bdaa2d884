//! Keeping a machine's writable layer as an image of its own, as `nerdctl commit` does: the
//! snapshot diffed against its parent into a layer in the content store, a config and manifest
//! naming the pinned image's layers and that one, the layer unpacked into a committed snapshot
//! under its chain id, and an image record as the GC root of it all.

use std::collections::HashMap;

use containerd_client::services::v1::snapshots::{UsageRequest, ViewSnapshotRequest};
use containerd_client::services::v1::{
    CreateImageRequest, DeleteImageRequest, DiffRequest, GetImageRequest, Image,
};
use containerd_client::types::Descriptor as GrpcDescriptor;
use narya_oci::manifest::{
    chain_ids, Descriptor, ImageManifest, MEDIA_TYPE_OCI_LAYER, MEDIA_TYPE_OCI_MANIFEST,
};
use narya_oci::Digest;

use super::client::{classify, is_not_found};
use super::image::LocalImage;
use super::{unique, Containerd};
use crate::{Committed, ErrorKind, Result, RuntimeError};

/// The containerd image name a committed layer is kept under.
pub(crate) fn committed_name(name: &str) -> String {
    format!("narya.local/prebuild:{name}")
}

fn grpc_descriptor(media_type: &str, digest: &Digest, size: usize) -> GrpcDescriptor {
    GrpcDescriptor {
        media_type: media_type.to_owned(),
        digest: digest.to_string(),
        size: i64::try_from(size).unwrap_or(i64::MAX),
        annotations: HashMap::new(),
    }
}

fn other(what: String, e: impl Into<crate::Cause>) -> RuntimeError {
    RuntimeError::caused(ErrorKind::Other, what, e)
}

impl Containerd {
    /// `Runtime::commit`. Everything is written under a lease of its own, so nothing is
    /// collected before the image record holds it, and a daemon that dies midway leaves only
    /// what the lease's expiry collects.
    pub(super) async fn commit_machine(&self, id: &str, name: &str) -> Result<Committed> {
        let container = self.container(id).await?;
        let base = match container.image.strip_prefix("narya.local/prebuild:") {
            Some(layer) => self.committed_image(layer).await?,
            None => {
                let digest = super::image::digest_of_name(&container.image).ok_or_else(|| {
                    RuntimeError::plain(
                        ErrorKind::Other,
                        format!(
                            "containerd: machine {id} stands on image {}, not a pinned one",
                            container.image
                        ),
                    )
                })?;
                self.local_image(&digest).await?
            }
        };
        let lease = self.create_lease("narya-commit").await?;
        let outcome = self.commit_leased(id, name, &base, &lease).await;
        self.delete_lease(lease).await;
        outcome
    }

    async fn commit_leased(
        &self,
        id: &str,
        name: &str,
        base: &LocalImage,
        lease: &str,
    ) -> Result<Committed> {
        // The layer: what the machine's snapshot holds over a read-only view of its parent.
        let upper = self.mounts(id).await?;
        let view = unique(&format!("narya-view-{id}"));
        let lower = self
            .conn
            .snapshots()
            .view(self.conn.leased(
                ViewSnapshotRequest {
                    snapshotter: self.snapshotter.clone(),
                    key: view.clone(),
                    parent: base.top_chain.to_string(),
                    labels: HashMap::new(),
                },
                lease,
            ))
            .await
            .map_err(|e| classify(&format!("viewing the parent of machine {id}"), e))?
            .into_inner()
            .mounts;
        let diffed = self
            .conn
            .diff()
            .diff(self.conn.leased(
                DiffRequest {
                    left: lower,
                    right: upper,
                    media_type: MEDIA_TYPE_OCI_LAYER.to_owned(),
                    r#ref: unique(&format!("narya-commit-{id}")),
                    labels: HashMap::new(),
                    source_date_epoch: None,
                },
                lease,
            ))
            .await;
        self.remove_snapshot(&view).await;
        let layer = diffed
            .map_err(|e| classify(&format!("diffing machine {id}'s writable layer"), e))?
            .into_inner()
            .diff
            .ok_or_else(|| {
                RuntimeError::plain(
                    ErrorKind::Other,
                    format!("containerd diffed machine {id} without saying what it wrote"),
                )
            })?;
        let layer_digest: Digest = layer
            .digest
            .parse()
            .map_err(|e| other(format!("the digest of machine {id}'s layer"), e))?;
        let layer_size = u64::try_from(layer.size).unwrap_or(0);

        // The image: the base's config and manifest with the layer on top. An uncompressed
        // layer's digest is its diff id.
        let mut diff_ids = base.config.rootfs.diff_ids.clone();
        diff_ids.push(layer_digest.clone());
        let chain = chain_ids(&diff_ids);
        let top = chain
            .last()
            .cloned()
            .ok_or_else(|| RuntimeError::plain(ErrorKind::Other, "an image with no layers"))?;
        let config_bytes = self.read_content(&base.config_digest).await?;
        let mut config: serde_json::Value = serde_json::from_slice(&config_bytes)
            .map_err(|e| other(format!("reading config {}", base.config_digest), e))?;
        config["rootfs"]["diff_ids"] = serde_json::json!(diff_ids);
        if let Some(history) = config.get_mut("history").and_then(|h| h.as_array_mut()) {
            history.push(serde_json::json!({"created_by": "narya prebuild", "comment": name}));
        }
        let config_bytes =
            serde_json::to_vec(&config).map_err(|e| other("encoding a config".to_owned(), e))?;
        let config_digest = Digest::of(&config_bytes);
        let mut manifest: ImageManifest = base.manifest.clone();
        manifest.media_type = Some(MEDIA_TYPE_OCI_MANIFEST.to_owned());
        manifest.config.digest = config_digest.clone();
        manifest.config.size = config_bytes.len() as u64;
        manifest.layers.push(Descriptor {
            media_type: MEDIA_TYPE_OCI_LAYER.to_owned(),
            digest: layer_digest.clone(),
            size: layer_size,
            platform: None,
            annotations: Default::default(),
        });
        let manifest_bytes = serde_json::to_vec(&manifest)
            .map_err(|e| other("encoding a manifest".to_owned(), e))?;
        let manifest_digest = Digest::of(&manifest_bytes);

        // Uncompressed: the layer's digest is its diff id.
        self.unpack_layer(
            layer,
            &layer_digest,
            &base.top_chain.to_string(),
            &top,
            lease,
        )
        .await?;
        // On disk twice: the layer's archive in the content store, and unpacked.
        let unpacked = self
            .conn
            .snapshots()
            .usage(self.conn.request(UsageRequest {
                snapshotter: self.snapshotter.clone(),
                key: top.to_string(),
            }))
            .await
            .map(|r| u64::try_from(r.into_inner().size).unwrap_or(0))
            .unwrap_or(layer_size);
        let config_labels = HashMap::from([(
            format!("containerd.io/gc.ref.snapshot.{}", self.snapshotter),
            top.to_string(),
        )]);
        if !self.has_content(&config_digest, &config_labels).await? {
            self.write_content(&config_digest, &config_bytes, config_labels, lease)
                .await?;
        }
        let mut manifest_labels = HashMap::from([(
            "containerd.io/gc.ref.content.config".to_owned(),
            config_digest.to_string(),
        )]);
        for (i, l) in manifest.layers.iter().enumerate() {
            manifest_labels.insert(
                format!("containerd.io/gc.ref.content.l.{i}"),
                l.digest.to_string(),
            );
        }
        if !self.has_content(&manifest_digest, &manifest_labels).await? {
            self.write_content(&manifest_digest, &manifest_bytes, manifest_labels, lease)
                .await?;
        }
        // A layer kept before under this name is replaced.
        self.remove_committed_image(name).await?;
        self.conn
            .images()
            .create(self.conn.leased(
                CreateImageRequest {
                    image: Some(Image {
                        name: committed_name(name),
                        labels: HashMap::from([("dev.narya.prebuild".to_owned(), name.to_owned())]),
                        target: Some(grpc_descriptor(
                            MEDIA_TYPE_OCI_MANIFEST,
                            &manifest_digest,
                            manifest_bytes.len(),
                        )),
                        created_at: None,
                        updated_at: None,
                    }),
                    source_date_epoch: None,
                },
                lease,
            ))
            .await
            .map_err(|e| classify("creating the committed image's record", e))?;
        tracing::info!(machine = %id, layer = %layer_digest, archive = layer_size, unpacked, "machine's layer committed");
        Ok(Committed {
            name: name.to_owned(),
            bytes: layer_size.saturating_add(unpacked),
        })
    }

    /// The image a committed layer `name` is kept as, ready to start machines from.
    pub(crate) async fn committed_image(&self, name: &str) -> Result<LocalImage> {
        let image = self
            .conn
            .images()
            .get(self.conn.request(GetImageRequest {
                name: committed_name(name),
            }))
            .await
            .map_err(|e| classify(&format!("looking up committed layer {name}"), e))?
            .into_inner()
            .image
            .and_then(|image| image.target)
            .ok_or_else(|| {
                RuntimeError::plain(
                    ErrorKind::NotFound,
                    format!("containerd: no committed layer {name}"),
                )
            })?;
        let digest: Digest = image
            .digest
            .parse()
            .map_err(|e| other(format!("the digest of committed layer {name}"), e))?;
        self.read_image(committed_name(name), &digest).await
    }

    /// `Runtime::remove_committed`: the image record goes, and containerd's collector takes
    /// what only it held once no machine's snapshot stands on it.
    pub(super) async fn remove_committed_image(&self, name: &str) -> Result<()> {
        match self
            .conn
            .images()
            .delete(self.conn.request(DeleteImageRequest {
                name: committed_name(name),
                sync: false,
                target: None,
            }))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(classify(&format!("removing committed layer {name}"), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_committed_layer_is_named_apart_from_the_official_image() {
        assert_eq!(
            committed_name("p-0123"),
            "narya.local/prebuild:p-0123".to_owned()
        );
        assert!(!committed_name("x").starts_with("narya.local/official"));
    }
}
