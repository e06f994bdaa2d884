//! Pulling the official image into containerd ourselves (containerd 1.6 has no transfer
//! service): content written under a lease with GC labels, an image record as the GC root,
//! each layer unpacked into a committed snapshot named by its chain id, diff ids verified.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
};
use containerd_client::services::v1::{ApplyRequest, CreateImageRequest, GetImageRequest, Image};
use containerd_client::services::v1::{CreateRequest as CreateLease, DeleteRequest as DeleteLease};
use containerd_client::types::Descriptor as GrpcDescriptor;
use narya_oci::manifest::{chain_ids, Descriptor, ImageConfig, ImageManifest};
use narya_oci::{Digest, ImageReference};

use super::client::{classify, is_not_found};
use super::{unique, Containerd};
use crate::pinning::{check_layers, LocalImages};
use crate::{ErrorKind, Result, RuntimeError};

/// What a machine needs of its image once it is local.
#[derive(Clone, Debug)]
pub(crate) struct LocalImage {
    pub name: String,
    pub manifest: ImageManifest,
    pub config_digest: Digest,
    pub config: ImageConfig,
    /// The chain id of the top layer: the parent of every machine's snapshot.
    pub top_chain: Digest,
}

/// The containerd image name for a pinned digest; the name itself pins it.
pub(crate) fn image_name(digest: &Digest) -> String {
    format!("narya.local/official@{digest}")
}

/// The digest an [`image_name`] pins, if `name` is one.
pub(crate) fn digest_of_name(name: &str) -> Option<Digest> {
    name.strip_prefix("narya.local/official@")?.parse().ok()
}

fn descriptor(d: &Descriptor) -> GrpcDescriptor {
    GrpcDescriptor {
        media_type: d.media_type.clone(),
        digest: d.digest.to_string(),
        size: i64::try_from(d.size).unwrap_or(i64::MAX),
        annotations: HashMap::new(),
    }
}

#[async_trait::async_trait]
impl LocalImages for Containerd {
    async fn has_image(&self, digest: &Digest) -> Result<bool> {
        Ok(self.local_image(digest).await.is_ok())
    }

    /// Content is written under a lease of its own, so that nothing is collected before the
    /// image record holds it; other processes pulling the same image race safely through
    /// AlreadyExists.
    async fn bring_image(&self, reference: &ImageReference, digest: &Digest) -> Result<()> {
        let lease = self.create_lease("narya-pull").await?;
        let outcome = self.pull(reference, digest, &lease).await;
        self.delete_lease(lease).await;
        outcome?;
        self.local_image(digest).await.map(|_| ())
    }
}

impl Containerd {
    /// A lease of its own for content and snapshots being written, so that nothing is collected
    /// before an image record holds them; it expires on its own in an hour should the daemon
    /// die before deleting it.
    pub(super) async fn create_lease(&self, prefix: &str) -> Result<String> {
        let lease = unique(prefix);
        let expire =
            humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(3600))
                .to_string();
        self.conn
            .leases()
            .create(self.conn.request(CreateLease {
                id: lease.clone(),
                labels: HashMap::from([("containerd.io/gc.expire".to_owned(), expire)]),
            }))
            .await
            .map_err(|e| classify("creating a lease", e))?;
        Ok(lease)
    }

    /// Lets containerd collect what only `lease` held.
    pub(super) async fn delete_lease(&self, lease: String) {
        let _ = self
            .conn
            .leases()
            .delete(self.conn.request(DeleteLease {
                id: lease,
                sync: false,
            }))
            .await;
    }

    async fn pull(&self, reference: &ImageReference, digest: &Digest, lease: &str) -> Result<()> {
        let fetcher = self.pinning.fetcher();
        let (manifest, manifest_bytes) = fetcher.manifest(reference, digest).await?;
        let (config, config_bytes) = fetcher.config(reference, &manifest).await?;
        check_layers(digest, &manifest, &config)?;
        let chain = chain_ids(&config.rootfs.diff_ids);
        let top_chain = chain.last().ok_or_else(|| {
            RuntimeError::plain(ErrorKind::Image, format!("image {digest} has no layers"))
        })?;

        for (layer, diff_id) in manifest.layers.iter().zip(&config.rootfs.diff_ids) {
            let labels =
                HashMap::from([("containerd.io/uncompressed".to_owned(), diff_id.to_string())]);
            if !self.has_content(&layer.digest, &labels).await? {
                let bytes = fetcher.blob(reference, layer).await?;
                self.write_content(&layer.digest, &bytes, labels, lease)
                    .await?;
            }
        }
        let config_labels = HashMap::from([(
            format!("containerd.io/gc.ref.snapshot.{}", self.snapshotter),
            top_chain.to_string(),
        )]);
        if !self
            .has_content(&manifest.config.digest, &config_labels)
            .await?
        {
            self.write_content(&manifest.config.digest, &config_bytes, config_labels, lease)
                .await?;
        }
        let mut manifest_labels = HashMap::from([(
            "containerd.io/gc.ref.content.config".to_owned(),
            manifest.config.digest.to_string(),
        )]);
        for (i, layer) in manifest.layers.iter().enumerate() {
            manifest_labels.insert(
                format!("containerd.io/gc.ref.content.l.{i}"),
                layer.digest.to_string(),
            );
        }
        if !self.has_content(digest, &manifest_labels).await? {
            self.write_content(digest, &manifest_bytes, manifest_labels, lease)
                .await?;
        }

        self.unpack(&manifest, &config, &chain, lease).await?;

        let media_type = manifest
            .media_type
            .clone()
            .unwrap_or_else(|| narya_oci::manifest::MEDIA_TYPE_OCI_MANIFEST.to_owned());
        let image = Image {
            name: image_name(digest),
            labels: HashMap::from([("dev.narya.image".to_owned(), reference.to_string())]),
            target: Some(GrpcDescriptor {
                media_type,
                digest: digest.to_string(),
                size: i64::try_from(manifest_bytes.len()).unwrap_or(i64::MAX),
                annotations: HashMap::new(),
            }),
            created_at: None,
            updated_at: None,
        };
        match self
            .conn
            .images()
            .create(self.conn.leased(
                CreateImageRequest {
                    image: Some(image),
                    source_date_epoch: None,
                },
                lease,
            ))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == tonic::Code::AlreadyExists => Ok(()),
            Err(e) => Err(classify("creating the image record", e)),
        }
    }

    /// Applies each layer onto its parent's snapshot and commits it under its chain id.
    async fn unpack(
        &self,
        manifest: &ImageManifest,
        config: &ImageConfig,
        chain: &[Digest],
        lease: &str,
    ) -> Result<()> {
        let mut parent = String::new();
        for (i, layer) in manifest.layers.iter().enumerate() {
            let chain_id = chain[i].to_string();
            let exists = self
                .conn
                .snapshots()
                .stat(self.conn.request(StatSnapshotRequest {
                    snapshotter: self.snapshotter.clone(),
                    key: chain_id.clone(),
                }))
                .await;
            match exists {
                Ok(_) => {
                    parent = chain_id;
                    continue;
                }
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(classify("checking a layer snapshot", e)),
            }
            self.unpack_layer(
                descriptor(layer),
                &config.rootfs.diff_ids[i],
                &parent,
                &chain[i],
                lease,
            )
            .await?;
            parent = chain_id;
        }
        Ok(())
    }

    /// Applies `layer` (whose uncompressed digest must be `diff_id`) onto snapshot `parent`
    /// and commits it as `chain_id`; another process committing the same meanwhile is as good.
    pub(super) async fn unpack_layer(
        &self,
        layer: GrpcDescriptor,
        diff_id: &Digest,
        parent: &str,
        chain_id: &Digest,
        lease: &str,
    ) -> Result<()> {
        let key = unique(&format!("narya-extract-{}", chain_id.hex()));
        let mounts = self
            .conn
            .snapshots()
            .prepare(self.conn.leased(
                PrepareSnapshotRequest {
                    snapshotter: self.snapshotter.clone(),
                    key: key.clone(),
                    parent: parent.to_owned(),
                    labels: HashMap::new(),
                },
                lease,
            ))
            .await
            .map_err(|e| classify("preparing a layer snapshot", e))?
            .into_inner()
            .mounts;
        let digest = layer.digest.clone();
        let applied = self
            .conn
            .diff()
            .apply(self.conn.leased(
                ApplyRequest {
                    diff: Some(layer),
                    mounts,
                    payloads: HashMap::new(),
                    sync_fs: false,
                },
                lease,
            ))
            .await;
        let verdict = match applied {
            Ok(r) => match r.into_inner().applied {
                Some(d) if d.digest == diff_id.to_string() => Ok(()),
                Some(d) => Err(RuntimeError::plain(
                    ErrorKind::Image,
                    format!(
                        "layer {digest} unpacked to {}, but the image config names diff id {diff_id}",
                        d.digest
                    ),
                )),
                None => Err(RuntimeError::plain(
                    ErrorKind::Image,
                    format!("containerd applied layer {digest} without saying what it applied"),
                )),
            },
            Err(e) => Err(classify(&format!("applying layer {digest}"), e)),
        };
        if let Err(e) = verdict {
            self.remove_snapshot(&key).await;
            return Err(e);
        }
        let committed = self
            .conn
            .snapshots()
            .commit(self.conn.leased(
                CommitSnapshotRequest {
                    snapshotter: self.snapshotter.clone(),
                    name: chain_id.to_string(),
                    key: key.clone(),
                    labels: HashMap::new(),
                },
                lease,
            ))
            .await;
        match committed {
            Ok(_) => Ok(()),
            // Another process committed the same layer meanwhile: theirs is as good.
            Err(e) if e.code() == tonic::Code::AlreadyExists => {
                self.remove_snapshot(&key).await;
                Ok(())
            }
            Err(e) => {
                self.remove_snapshot(&key).await;
                Err(classify("committing a layer snapshot", e))
            }
        }
    }

    pub(crate) async fn remove_snapshot(&self, key: &str) {
        let _ = self
            .conn
            .snapshots()
            .remove(self.conn.request(RemoveSnapshotRequest {
                snapshotter: self.snapshotter.clone(),
                key: key.to_owned(),
            }))
            .await;
    }

    /// The image already in containerd under `digest`, with its config and top snapshot, if
    /// every part of it is there.
    pub(crate) async fn local_image(&self, digest: &Digest) -> Result<LocalImage> {
        if let Some(found) = self.images.lock().await.get(digest) {
            return Ok(found.clone());
        }
        let local = self.read_image(image_name(digest), digest).await?;
        self.images
            .lock()
            .await
            .insert(digest.clone(), local.clone());
        Ok(local)
    }

    /// The image recorded as `name` with manifest `digest`, with its config and top snapshot,
    /// if every part of it is there.
    pub(crate) async fn read_image(&self, name: String, digest: &Digest) -> Result<LocalImage> {
        self.conn
            .images()
            .get(self.conn.request(GetImageRequest { name: name.clone() }))
            .await
            .map_err(|e| classify(&format!("looking up image {digest}"), e))?;
        let manifest_bytes = self.read_content(digest).await?;
        let manifest: ImageManifest = serde_json::from_slice(&manifest_bytes).map_err(|e| {
            RuntimeError::caused(ErrorKind::Image, format!("stored manifest {digest}"), e)
        })?;
        let config_bytes = self.read_content(&manifest.config.digest).await?;
        let config: ImageConfig = serde_json::from_slice(&config_bytes).map_err(|e| {
            RuntimeError::caused(
                ErrorKind::Image,
                format!("stored config {}", manifest.config.digest),
                e,
            )
        })?;
        let top_chain = chain_ids(&config.rootfs.diff_ids).pop().ok_or_else(|| {
            RuntimeError::plain(ErrorKind::Image, format!("image {digest} has no layers"))
        })?;
        self.conn
            .snapshots()
            .stat(self.conn.request(StatSnapshotRequest {
                snapshotter: self.snapshotter.clone(),
                key: top_chain.to_string(),
            }))
            .await
            .map_err(|e| classify("checking the image's top snapshot", e))?;
        Ok(LocalImage {
            name,
            config_digest: manifest.config.digest.clone(),
            manifest,
            config,
            top_chain,
        })
    }
}
