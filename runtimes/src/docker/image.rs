//! Making the official image available to the Docker engine under its manifest digest: pulled
//! by digest from a registry, or loaded from an OCI layout rewritten as the docker-archive that
//! Docker 20.10's `load` accepts (it refuses OCI layouts); the local image's id checked against
//! the config digest the manifest names, then tagged so the manifest digest finds it.

use std::time::Duration;

use bollard::query_parameters::{CreateImageOptions, ImportImageOptions, TagImageOptions};
use bytes::Bytes;
use futures_util::StreamExt;
use narya_oci::manifest::{
    ImageManifest, MEDIA_TYPE_DOCKER_LAYER_GZIP, MEDIA_TYPE_OCI_LAYER, MEDIA_TYPE_OCI_LAYER_GZIP,
};
use narya_oci::{Digest, ImageReference, RegistryReference};

use super::engine::{classify, found};
use super::Docker;
use crate::pinning::{check_layers, LocalImages};
use crate::{ErrorKind, Result, RuntimeError};

/// The repository our verified images are tagged into; the tag is the manifest digest's hex.
const LOCAL_REPOSITORY: &str = "narya.local/official";
/// Docker's own layer media type for uncompressed layers.
const MEDIA_TYPE_DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar";
const TAR_BLOCK: usize = 512;
/// How long a load may take to be answered; larger images than the official one take longer.
const LOAD_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The local name of the image pinned to manifest `digest`.
pub(super) fn local_tag(digest: &Digest) -> String {
    format!("{LOCAL_REPOSITORY}:{}", digest.hex())
}

/// Turns an engine failure while fetching the image into an `Image` error, unless the engine
/// itself is not answering.
fn image_failure(what: &str, error: bollard::errors::Error) -> RuntimeError {
    match classify(what, error) {
        e if e.kind() == ErrorKind::Unavailable => e,
        other => other.into_kind(ErrorKind::Image),
    }
}

#[async_trait::async_trait]
impl LocalImages for Docker {
    async fn has_image(&self, digest: &Digest) -> Result<bool> {
        self.has_local_image(digest).await
    }

    /// Pulls, loads and tags of the same content are idempotent in the engine, so other
    /// processes race safely.
    async fn bring_image(&self, reference: &ImageReference, digest: &Digest) -> Result<()> {
        // The manifest comes from the source, verified against `digest`: an unknown digest
        // fails here, and it names the config digest the engine's image id must equal.
        let (manifest, _) = self.pinning.fetcher().manifest(reference, digest).await?;
        let fetched_as = match reference {
            ImageReference::Registry(r) => self.pull(r, digest).await?,
            ImageReference::Layout(_) => {
                self.load(reference, digest, &manifest).await?;
                local_tag(digest)
            }
        };
        self.verify_and_tag(&fetched_as, digest, &manifest.config.digest)
            .await?;
        self.images.lock().await.insert(digest.clone());
        Ok(())
    }
}

impl Docker {
    /// Whether the engine has the image pinned to `digest` under our tag. The tag is only ever
    /// set after the image id was verified, so its presence is enough.
    pub(super) async fn has_local_image(&self, digest: &Digest) -> Result<bool> {
        if self.images.lock().await.contains(digest) {
            return Ok(true);
        }
        let client = self.engine.client().await?;
        let answer = client.inspect_image(&local_tag(digest)).await;
        if found(&format!("looking up image {digest}"), answer)?.is_none() {
            return Ok(false);
        }
        self.images.lock().await.insert(digest.clone());
        Ok(true)
    }

    /// Pulls `reference` by `digest`; returns the name the engine now knows it by.
    async fn pull(&self, reference: &RegistryReference, digest: &Digest) -> Result<String> {
        let client = self.engine.client().await?;
        let name = reference.name();
        let hint = if self.insecure_registries.contains(&reference.registry) {
            format!(
                " (registry {} is reached over plain HTTP: dockerd must list it in \
                 insecure-registries; 127.0.0.0/8 is insecure by default)",
                reference.registry
            )
        } else {
            String::new()
        };
        let options = CreateImageOptions {
            from_image: Some(name.clone()),
            // The engine takes a digest where a tag goes, as `docker pull name@digest` sends it.
            tag: Some(digest.to_string()),
            ..Default::default()
        };
        let mut progress = client.create_image(Some(options), None, None);
        // Errors arrive inside a 200 stream: every message is read so none is missed.
        while let Some(message) = progress.next().await {
            if let Err(e) = message {
                return Err(image_failure(&format!("pulling {name}@{digest}{hint}"), e));
            }
        }
        Ok(format!("{name}@{digest}"))
    }

    /// Loads the image of `manifest` from an OCI layout, as a docker-archive tagged with our tag.
    async fn load(
        &self,
        reference: &ImageReference,
        digest: &Digest,
        manifest: &ImageManifest,
    ) -> Result<()> {
        for layer in &manifest.layers {
            if ![
                MEDIA_TYPE_OCI_LAYER_GZIP,
                MEDIA_TYPE_OCI_LAYER,
                MEDIA_TYPE_DOCKER_LAYER_GZIP,
                MEDIA_TYPE_DOCKER_LAYER,
            ]
            .contains(&layer.media_type.as_str())
            {
                return Err(RuntimeError::plain(
                    ErrorKind::Image,
                    format!(
                        "image {digest}: layer {} is {}, which Docker 20.10 cannot load (gzip or \
                     uncompressed tar only)",
                        layer.digest, layer.media_type
                    ),
                ));
            }
        }
        let fetcher = self.pinning.fetcher();
        let (config, config_bytes) = fetcher.config(reference, manifest).await?;
        check_layers(digest, manifest, &config)?;
        let mut archive = Vec::new();
        let mut layer_names = Vec::with_capacity(manifest.layers.len());
        for layer in &manifest.layers {
            let bytes = fetcher.blob(reference, layer).await?;
            let name = format!("{}.tar", layer.digest.hex());
            append_file(&mut archive, &name, Bytes::from(bytes))?;
            layer_names.push(name);
        }
        let config_name = format!("{}.json", manifest.config.digest.hex());
        append_file(&mut archive, &config_name, Bytes::from(config_bytes))?;
        let archive_manifest = serde_json::json!([{
            "Config": config_name,
            "RepoTags": [local_tag(digest)],
            "Layers": layer_names,
        }]);
        let archive_manifest = serde_json::to_vec(&archive_manifest)
            .map_err(|e| RuntimeError::caused(ErrorKind::Other, "encoding manifest.json", e))?;
        append_file(&mut archive, "manifest.json", Bytes::from(archive_manifest))?;
        // Two empty blocks end a tar archive.
        archive.push(Bytes::from(vec![0u8; 2 * TAR_BLOCK]));

        // The engine answers a load only once it has read and unpacked the whole archive.
        let client = self
            .engine
            .client()
            .await?
            .clone()
            .with_timeout(LOAD_TIMEOUT);
        let options = ImportImageOptions {
            quiet: true,
            ..Default::default()
        };
        let mut progress =
            client.import_image_stream(options, futures_util::stream::iter(archive), None);
        while let Some(message) = progress.next().await {
            if let Err(e) = message {
                return Err(image_failure(&format!("loading image {digest}"), e));
            }
        }
        Ok(())
    }

    /// Checks that the image the engine holds as `name` has the id (config digest) that manifest
    /// `digest` names, and tags it with our tag; a mismatch is an `Image` error and leaves no tag.
    async fn verify_and_tag(&self, name: &str, digest: &Digest, config: &Digest) -> Result<()> {
        let client = self.engine.client().await?;
        let image = client
            .inspect_image(name)
            .await
            .map_err(|e| image_failure(&format!("looking up {name} after fetching it"), e))?;
        let id = image.id.unwrap_or_default();
        if id != config.to_string() {
            if name == local_tag(digest) {
                let _ = client
                    .remove_image(
                        name,
                        None::<bollard::query_parameters::RemoveImageOptions>,
                        None,
                    )
                    .await;
            }
            return Err(RuntimeError::plain(
                ErrorKind::Image,
                format!(
                    "image {digest}: the engine holds it as image {id:?}, but its manifest names \
                 config {config}"
                ),
            ));
        }
        if name != local_tag(digest) {
            let options = TagImageOptions {
                repo: Some(LOCAL_REPOSITORY.to_owned()),
                tag: Some(digest.hex().to_owned()),
            };
            client
                .tag_image(name, Some(options))
                .await
                .map_err(|e| classify(&format!("tagging image {digest}"), e))?;
        }
        Ok(())
    }
}

/// Appends one regular file to a tar archive held as pieces, so blobs are not copied.
fn append_file(archive: &mut Vec<Bytes>, name: &str, data: Bytes) -> Result<()> {
    let mut header = tar::Header::new_ustar();
    header
        .set_path(name)
        .map_err(|e| RuntimeError::caused(ErrorKind::Other, format!("tar entry {name}"), e))?;
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    let padding = (TAR_BLOCK - data.len() % TAR_BLOCK) % TAR_BLOCK;
    archive.push(Bytes::copy_from_slice(header.as_bytes()));
    archive.push(data);
    if padding > 0 {
        archive.push(Bytes::from(vec![0u8; padding]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names in one archive, as a tar reader sees them.
    fn entry_names(archive: &[Bytes]) -> Vec<String> {
        let bytes: Vec<u8> = archive.iter().flat_map(|b| b.iter().copied()).collect();
        let mut reader = tar::Archive::new(bytes.as_slice());
        let mut names = Vec::new();
        if let Ok(entries) = reader.entries() {
            for entry in entries.flatten() {
                if let Ok(path) = entry.path() {
                    names.push(path.display().to_string());
                }
            }
        }
        names
    }

    #[test]
    fn archive_pieces_read_back_as_a_tar() {
        let mut archive = Vec::new();
        append_file(&mut archive, "a.tar", Bytes::from(vec![1u8; 700])).unwrap();
        append_file(&mut archive, "manifest.json", Bytes::from_static(b"[]")).unwrap();
        archive.push(Bytes::from(vec![0u8; 2 * TAR_BLOCK]));
        let total: usize = archive.iter().map(Bytes::len).sum();
        assert_eq!(total % TAR_BLOCK, 0);
        assert_eq!(entry_names(&archive), ["a.tar", "manifest.json"]);
    }

    #[test]
    fn local_tags_carry_the_manifest_digest() {
        let digest: Digest = format!("sha256:{}", "ab".repeat(32)).parse().unwrap();
        assert_eq!(
            local_tag(&digest),
            format!("narya.local/official:{}", "ab".repeat(32))
        );
    }
}
