//! Pinning the official image, on every back end: the reference resolved to its manifest digest
//! (unless pinned already), then that digest made available locally, one pull at a time.

use narya_oci::manifest::{ImageConfig, ImageManifest};
use narya_oci::{Digest, ImageReference};
use tokio::sync::Mutex;

use crate::fetch::ImageFetcher;
use crate::{ErrorKind, ImageSource, PinnedImage, Result, RuntimeError};

/// A back end's own image store, as pinning needs it.
#[async_trait::async_trait]
pub(crate) trait LocalImages: Sync {
    /// Whether the image pinned to `digest` is complete in the store.
    async fn has_image(&self, digest: &Digest) -> Result<bool>;

    /// Makes exactly `digest` of `reference` available in the store, verified against its
    /// digests. Only called while no other pull of this process runs.
    async fn bring_image(&self, reference: &ImageReference, digest: &Digest) -> Result<()>;
}

/// Where the official image comes from, and the lock that makes this process pull it once.
pub(crate) struct ImagePinning {
    fetcher: ImageFetcher,
    one_pull_at_a_time: Mutex<()>,
}

impl ImagePinning {
    /// `insecure_registries` are reached over plain HTTP; every other registry over HTTPS.
    pub(crate) fn new(insecure_registries: Vec<String>) -> Result<ImagePinning> {
        Ok(ImagePinning {
            fetcher: ImageFetcher::new(insecure_registries)?,
            one_pull_at_a_time: Mutex::new(()),
        })
    }

    /// Reads manifests, configs and blobs from where the image is published.
    pub(crate) fn fetcher(&self) -> &ImageFetcher {
        &self.fetcher
    }

    /// The trait's `ensure_image`: resolves `source` unless it is pinned, and brings the digest
    /// into `store` unless it is there. Other processes race safely: bringing the same content
    /// twice is idempotent in every store.
    pub(crate) async fn ensure(
        &self,
        source: &ImageSource,
        store: &impl LocalImages,
        runtime: &str,
    ) -> Result<PinnedImage> {
        let digest = match &source.pinned {
            Some(d) => d.clone(),
            None => self.fetcher.resolve(&source.reference).await?,
        };
        let _pulling = self.one_pull_at_a_time.lock().await;
        if !store.has_image(&digest).await? {
            tracing::info!(
                %digest,
                reference = %source.reference,
                runtime,
                "making the official image available"
            );
            store.bring_image(&source.reference, &digest).await?;
        }
        Ok(PinnedImage {
            reference: source.reference.clone(),
            digest,
        })
    }
}

/// Fails with `Image` unless `config` names one diff id for each layer of `manifest`.
pub(crate) fn check_layers(
    digest: &Digest,
    manifest: &ImageManifest,
    config: &ImageConfig,
) -> Result<()> {
    if config.rootfs.diff_ids.len() == manifest.layers.len() {
        return Ok(());
    }
    Err(RuntimeError::plain(
        ErrorKind::Image,
        format!(
            "image {digest}: the config lists {} diff ids for {} layers",
            config.rootfs.diff_ids.len(),
            manifest.layers.len()
        ),
    ))
}
