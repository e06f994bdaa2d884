//! Reading OCI image layouts on disk, every blob verified against its digest; the public surface of `layout`.

mod archive;
mod error;
#[cfg(test)]
mod fixtures;
mod io;
mod pack;

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use self::io::HashingWriter;
use crate::manifest::{
    is_index, is_manifest, select_linux_amd64, Descriptor, ImageConfig, ImageIndex, ImageManifest,
    MEDIA_TYPE_OCI_MANIFEST,
};
use crate::Digest;

pub use archive::write_archive;
pub use error::LayoutError;
pub use pack::{pack, PackOptions, DEFAULT_PATH};

/// The file that marks a directory as an OCI image layout.
pub const LAYOUT_MARKER_FILE: &str = "oci-layout";
/// The layout's entry point: an image index.
pub const INDEX_FILE: &str = "index.json";
/// The only layout version this crate reads and writes.
pub const LAYOUT_VERSION: &str = "1.0.0";
/// The annotation naming a manifest in a layout's index (`oci:DIR:NAME` in skopeo's terms).
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

/// How far nested indexes are followed before a layout is taken to be malformed.
const MAX_INDEX_DEPTH: usize = 8;

/// The contents of the `oci-layout` marker file.
#[derive(Serialize, Deserialize)]
struct LayoutMarker {
    #[serde(rename = "imageLayoutVersion")]
    image_layout_version: String,
}

/// An OCI image layout on disk, opened for reading. Every blob read through it is verified.
#[derive(Clone, Debug)]
pub struct Layout {
    dir: PathBuf,
}

impl Layout {
    /// Opens the layout in `dir`, checking its `oci-layout` marker (version 1.0.0).
    pub fn open(dir: impl Into<PathBuf>) -> Result<Layout, LayoutError> {
        let dir = dir.into();
        let marker_path = dir.join(LAYOUT_MARKER_FILE);
        let not_a_layout = |reason: String| LayoutError::NotALayout {
            path: dir.clone(),
            reason,
        };
        let bytes = match fs::read(&marker_path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(not_a_layout(format!("it has no {LAYOUT_MARKER_FILE} file")))
            }
            Err(source) => {
                return Err(LayoutError::Read {
                    path: marker_path,
                    source,
                })
            }
        };
        let marker: LayoutMarker = serde_json::from_slice(&bytes).map_err(|e| {
            not_a_layout(format!("its {LAYOUT_MARKER_FILE} file is not valid: {e}"))
        })?;
        if marker.image_layout_version != LAYOUT_VERSION {
            return Err(not_a_layout(format!(
                "it declares imageLayoutVersion {:?}; only {LAYOUT_VERSION} is supported",
                marker.image_layout_version
            )));
        }
        Ok(Layout { dir })
    }

    /// The layout's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the blob `digest` lives (whether or not it exists).
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.dir.join("blobs").join("sha256").join(digest.hex())
    }

    /// The layout's `index.json`.
    pub fn index(&self) -> Result<ImageIndex, LayoutError> {
        let path = self.dir.join(INDEX_FILE);
        let bytes = fs::read(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => LayoutError::NotALayout {
                path: self.dir.clone(),
                reason: format!("it has no {INDEX_FILE}"),
            },
            _ => LayoutError::Read {
                path: path.clone(),
                source,
            },
        })?;
        serde_json::from_slice(&bytes).map_err(|source| LayoutError::Parse {
            path,
            what: "image index",
            source,
        })
    }

    /// The digest of the linux/amd64 image manifest the layout's index names, following nested
    /// indexes (each verified). Reads only; repeating it is safe.
    pub fn resolve(&self) -> Result<Digest, LayoutError> {
        let mut index = self.index()?;
        let mut index_path = self.dir.join(INDEX_FILE);
        for _ in 0..MAX_INDEX_DEPTH {
            let Some(chosen) = select_linux_amd64(&index) else {
                return Err(LayoutError::NoLinuxAmd64 {
                    path: index_path,
                    available: describe_platforms(&index),
                });
            };
            if is_manifest(&chosen.media_type) {
                return Ok(chosen.digest.clone());
            }
            // select_linux_amd64 only returns manifests and indexes.
            debug_assert!(is_index(&chosen.media_type));
            let chosen = chosen.clone();
            let bytes = self.read_descriptor(&chosen)?;
            index_path = self.blob_path(&chosen.digest);
            index = serde_json::from_slice(&bytes).map_err(|source| LayoutError::Parse {
                path: index_path.clone(),
                what: "image index",
                source,
            })?;
        }
        Err(LayoutError::IndexTooDeep {
            path: self.dir.clone(),
        })
    }

    /// The bytes of blob `digest`, verified: content that does not hash to `digest` is
    /// [`LayoutError::DigestMismatch`], never returned. Loads the whole blob into memory.
    pub fn read_blob(&self, digest: &Digest) -> Result<Vec<u8>, LayoutError> {
        let path = self.blob_path(digest);
        let bytes = fs::read(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => LayoutError::BlobMissing {
                digest: digest.clone(),
                path: path.clone(),
            },
            _ => LayoutError::Read {
                path: path.clone(),
                source,
            },
        })?;
        let actual = Digest::of(&bytes);
        if actual != *digest {
            return Err(LayoutError::DigestMismatch {
                expected: digest.clone(),
                actual,
                path,
            });
        }
        Ok(bytes)
    }

    /// Checks the blob a descriptor names (size, then digest) by streaming it, without holding it
    /// in memory: for layers, before handing their path to something that imports them.
    pub fn verify_blob(&self, descriptor: &Descriptor) -> Result<(), LayoutError> {
        let path = self.blob_path(&descriptor.digest);
        let read_error = |source: std::io::Error| match source.kind() {
            std::io::ErrorKind::NotFound => LayoutError::BlobMissing {
                digest: descriptor.digest.clone(),
                path: path.clone(),
            },
            _ => LayoutError::Read {
                path: path.clone(),
                source,
            },
        };
        let mut file = File::open(&path).map_err(read_error)?;
        let mut hashing = HashingWriter::new(std::io::sink());
        std::io::copy(&mut file, &mut hashing).map_err(read_error)?;
        let (_, actual, size) = hashing.finish();
        if size != descriptor.size {
            return Err(LayoutError::SizeMismatch {
                digest: descriptor.digest.clone(),
                expected: descriptor.size,
                actual: size,
            });
        }
        if actual != descriptor.digest {
            return Err(LayoutError::DigestMismatch {
                expected: descriptor.digest.clone(),
                actual,
                path,
            });
        }
        Ok(())
    }

    /// The image manifest `digest`, parsed, with its verified bytes.
    pub fn manifest(&self, digest: &Digest) -> Result<(ImageManifest, Vec<u8>), LayoutError> {
        let bytes = self.read_blob(digest)?;
        let manifest: ImageManifest =
            serde_json::from_slice(&bytes).map_err(|source| LayoutError::Parse {
                path: self.blob_path(digest),
                what: "image manifest",
                source,
            })?;
        if let Some(media_type) = &manifest.media_type {
            if !is_manifest(media_type) {
                return Err(LayoutError::MediaType {
                    digest: digest.clone(),
                    media_type: media_type.clone(),
                    expected: MEDIA_TYPE_OCI_MANIFEST,
                });
            }
        }
        Ok((manifest, bytes))
    }

    /// The image configuration `manifest` names, parsed, with its verified bytes.
    pub fn config(&self, manifest: &ImageManifest) -> Result<(ImageConfig, Vec<u8>), LayoutError> {
        let bytes = self.read_descriptor(&manifest.config)?;
        let config = serde_json::from_slice(&bytes).map_err(|source| LayoutError::Parse {
            path: self.blob_path(&manifest.config.digest),
            what: "image configuration",
            source,
        })?;
        Ok((config, bytes))
    }

    /// A verified blob whose size must also match its descriptor.
    fn read_descriptor(&self, descriptor: &Descriptor) -> Result<Vec<u8>, LayoutError> {
        let bytes = self.read_blob(&descriptor.digest)?;
        if bytes.len() as u64 != descriptor.size {
            return Err(LayoutError::SizeMismatch {
                digest: descriptor.digest.clone(),
                expected: descriptor.size,
                actual: bytes.len() as u64,
            });
        }
        Ok(bytes)
    }
}

/// "linux/arm64, linux/arm/v7" — what an index offers, for an error message.
fn describe_platforms(index: &ImageIndex) -> String {
    if index.manifests.is_empty() {
        return "nothing".to_owned();
    }
    index
        .manifests
        .iter()
        .map(|d| match &d.platform {
            Some(p) => match &p.variant {
                Some(v) => format!("{}/{}/{v}", p.os, p.architecture),
                None => format!("{}/{}", p.os, p.architecture),
            },
            None => format!("{} without a platform", d.media_type),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use crate::manifest::{Platform, MEDIA_TYPE_OCI_INDEX};

    use super::fixtures::{options, rootfs_tar};
    use super::pack::descriptor;
    use super::*;

    #[test]
    fn a_corrupted_blob_is_refused_with_a_digest_mismatch() {
        let temp = tempfile::tempdir().unwrap();
        let tar_path = rootfs_tar(temp.path());
        let out = temp.path().join("layout");
        let digest = pack(&tar_path, &out, &options()).unwrap();
        let layout = Layout::open(&out).unwrap();
        let (manifest, _) = layout.manifest(&digest).unwrap();
        let layer = &manifest.layers[0];

        let path = layout.blob_path(&layer.digest);
        let mut bytes = fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        fs::write(&path, &bytes).unwrap();

        match layout.read_blob(&layer.digest) {
            Err(LayoutError::DigestMismatch {
                expected, actual, ..
            }) => {
                assert_eq!(expected, layer.digest);
                assert_eq!(actual, Digest::of(&bytes));
            }
            other => panic!("expected a digest mismatch, got {other:?}"),
        }
        assert!(matches!(
            layout.verify_blob(layer),
            Err(LayoutError::DigestMismatch { .. })
        ));
        let message = layout.read_blob(&layer.digest).unwrap_err().to_string();
        assert!(message.contains(&layer.digest.to_string()), "{message}");
    }

    #[test]
    fn a_missing_blob_is_named() {
        let temp = tempfile::tempdir().unwrap();
        let tar_path = rootfs_tar(temp.path());
        let out = temp.path().join("layout");
        let digest = pack(&tar_path, &out, &options()).unwrap();
        let layout = Layout::open(&out).unwrap();
        fs::remove_file(layout.blob_path(&digest)).unwrap();
        assert!(matches!(
            layout.manifest(&digest),
            Err(LayoutError::BlobMissing { digest: d, .. }) if d == digest
        ));
    }

    fn write_index(dir: &Path, index: &ImageIndex) {
        fs::write(dir.join(INDEX_FILE), serde_json::to_vec(index).unwrap()).unwrap();
    }

    fn with_platform(mut descriptor: Descriptor, architecture: &str) -> Descriptor {
        descriptor.platform = Some(Platform {
            architecture: architecture.to_owned(),
            os: "linux".to_owned(),
            variant: None,
        });
        descriptor
    }

    #[test]
    fn an_index_with_only_an_arm64_manifest_does_not_resolve() {
        let temp = tempfile::tempdir().unwrap();
        let tar_path = rootfs_tar(temp.path());
        let out = temp.path().join("layout");
        pack(&tar_path, &out, &options()).unwrap();
        let layout = Layout::open(&out).unwrap();
        let mut index = layout.index().unwrap();
        index.manifests = vec![with_platform(index.manifests[0].clone(), "arm64")];
        write_index(&out, &index);

        let err = layout.resolve().unwrap_err();
        assert!(
            matches!(&err, LayoutError::NoLinuxAmd64 { available, .. } if available == "linux/arm64"),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(message.contains("linux/amd64"), "{message}");
        assert!(message.contains("index.json"), "{message}");
    }

    #[test]
    fn a_nested_index_is_followed_and_verified() {
        let temp = tempfile::tempdir().unwrap();
        let tar_path = rootfs_tar(temp.path());
        let out = temp.path().join("layout");
        let digest = pack(&tar_path, &out, &options()).unwrap();
        let layout = Layout::open(&out).unwrap();
        let top = layout.index().unwrap();
        let amd64 = top.manifests[0].clone();

        // The manifest list of a multi-platform image, as `skopeo copy --all` lays it out.
        let nested = ImageIndex {
            manifests: vec![with_platform(amd64.clone(), "arm64"), amd64],
            ..top.clone()
        };
        let nested_bytes = serde_json::to_vec(&nested).unwrap();
        let nested_digest = Digest::of(&nested_bytes);
        fs::write(layout.blob_path(&nested_digest), &nested_bytes).unwrap();
        let entry = Descriptor {
            platform: None,
            ..descriptor(
                MEDIA_TYPE_OCI_INDEX,
                nested_digest.clone(),
                nested_bytes.len(),
            )
        };
        write_index(
            &out,
            &ImageIndex {
                manifests: vec![entry],
                ..top
            },
        );
        assert_eq!(layout.resolve().unwrap(), digest);

        // A nested index that does not match its digest is not followed.
        fs::write(layout.blob_path(&nested_digest), b"{}").unwrap();
        assert!(matches!(
            layout.resolve(),
            Err(LayoutError::DigestMismatch { .. })
        ));
    }

    #[test]
    fn a_directory_without_the_marker_is_not_a_layout() {
        let temp = tempfile::tempdir().unwrap();
        assert!(matches!(
            Layout::open(temp.path()),
            Err(LayoutError::NotALayout { .. })
        ));
        fs::write(
            temp.path().join(LAYOUT_MARKER_FILE),
            br#"{"imageLayoutVersion":"2.0.0"}"#,
        )
        .unwrap();
        let err = Layout::open(temp.path()).unwrap_err();
        assert!(err.to_string().contains("2.0.0"), "{err}");
    }
}
