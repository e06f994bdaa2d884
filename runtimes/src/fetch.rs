//! Reading the official image from where it is published: an OCI layout or a registry. Every
//! document and blob is verified against its digest by `narya-oci` before it is handed on.

use narya_oci::layout::Layout;
use narya_oci::manifest::{Descriptor, ImageConfig, ImageManifest};
use narya_oci::registry::RegistryClient;
use narya_oci::{Digest, ImageReference};

use crate::{ErrorKind, Result, RuntimeError};

/// Fetches manifests, configs and blobs of the official image, verified.
#[derive(Clone)]
pub struct ImageFetcher {
    registry: std::sync::Arc<RegistryClient>,
}

fn image_error(reference: &ImageReference, e: impl Into<crate::Cause>) -> RuntimeError {
    RuntimeError::caused(ErrorKind::Image, format!("official image {reference}"), e)
}

async fn with_layout<T: Send + 'static>(
    reference: &ImageReference,
    dir: &std::path::Path,
    work: impl FnOnce(&Layout) -> Result<T, narya_oci::layout::LayoutError> + Send + 'static,
) -> Result<T> {
    let dir = dir.to_owned();
    let outcome = tokio::task::spawn_blocking(move || Layout::open(dir).and_then(|l| work(&l)))
        .await
        .map_err(|e| {
            RuntimeError::caused(ErrorKind::Other, "reading the image layout panicked", e)
        })?;
    outcome.map_err(|e| image_error(reference, e))
}

impl ImageFetcher {
    /// `insecure_registries` are reached over plain HTTP; every other registry over HTTPS.
    pub fn new(insecure_registries: Vec<String>) -> Result<ImageFetcher> {
        Ok(ImageFetcher {
            registry: std::sync::Arc::new(RegistryClient::new(insecure_registries).map_err(
                |e| RuntimeError::caused(ErrorKind::Other, "setting up the registry client", e),
            )?),
        })
    }

    /// The manifest digest `reference` names now (linux/amd64).
    pub async fn resolve(&self, reference: &ImageReference) -> Result<Digest> {
        match reference {
            ImageReference::Layout(dir) => with_layout(reference, dir, |l| l.resolve()).await,
            ImageReference::Registry(r) => self
                .registry
                .resolve(r)
                .await
                .map_err(|e| image_error(reference, e)),
        }
    }

    /// The manifest `digest`, parsed, and its exact bytes.
    pub async fn manifest(
        &self,
        reference: &ImageReference,
        digest: &Digest,
    ) -> Result<(ImageManifest, Vec<u8>)> {
        match reference {
            ImageReference::Layout(dir) => {
                let digest = digest.clone();
                with_layout(reference, dir, move |l| l.manifest(&digest)).await
            }
            ImageReference::Registry(r) => self
                .registry
                .manifest(r, digest)
                .await
                .map_err(|e| image_error(reference, e)),
        }
    }

    /// The blob `descriptor` names, verified against its digest.
    pub async fn blob(
        &self,
        reference: &ImageReference,
        descriptor: &Descriptor,
    ) -> Result<Vec<u8>> {
        match reference {
            ImageReference::Layout(dir) => {
                let digest = descriptor.digest.clone();
                with_layout(reference, dir, move |l| l.read_blob(&digest)).await
            }
            ImageReference::Registry(r) => self
                .registry
                .blob(r, &descriptor.digest)
                .await
                .map_err(|e| image_error(reference, e)),
        }
    }

    /// The image configuration `manifest` names, parsed, and its bytes.
    pub async fn config(
        &self,
        reference: &ImageReference,
        manifest: &ImageManifest,
    ) -> Result<(ImageConfig, Vec<u8>)> {
        let bytes = self.blob(reference, &manifest.config).await?;
        let config = serde_json::from_slice(&bytes).map_err(|e| {
            RuntimeError::caused(
                ErrorKind::Image,
                format!(
                    "official image {reference}: config {} is not an image config",
                    manifest.config.digest
                ),
                e,
            )
        })?;
        Ok((config, bytes))
    }
}
