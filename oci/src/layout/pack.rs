//! Packing an uncompressed rootfs tar into an OCI image layout, as `naryad pack-image` does.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use flate2::{Compression, GzBuilder};
use serde::Serialize;

use super::io::{write_atomically, HashingWriter, TempFile, STREAM_BUFFER};
use super::{
    LayoutError, LayoutMarker, INDEX_FILE, LAYOUT_MARKER_FILE, LAYOUT_VERSION, REF_NAME_ANNOTATION,
};
use crate::manifest::{
    ContainerConfig, Descriptor, History, ImageConfig, ImageIndex, ImageManifest, Platform, RootFs,
    MEDIA_TYPE_OCI_CONFIG, MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_OCI_LAYER_GZIP,
    MEDIA_TYPE_OCI_MANIFEST,
};
use crate::Digest;

/// `PATH` in the official image's environment.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `HOME` in the official image's environment: the user's home in the machine, kept apart from the
/// workspace so that tools' caches and dotfiles stay out of the repository's checkout.
/// `contrib/image/build.sh` makes it, owned by the user, and names it in `/etc/passwd`.
pub const DEFAULT_HOME: &str = "/home/narya";

/// `LANG` in the official image's environment: glibc's built-in UTF-8 locale, no `locales` needed.
pub const DEFAULT_LANG: &str = "C.UTF-8";

/// What [`pack`] puts into the image configuration besides the layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackOptions {
    /// The name given to the manifest in `index.json` (`org.opencontainers.image.ref.name`).
    pub tag: String,
    /// `config.User`: the `uid:gid` processes of the image run as.
    pub user: String,
    /// `config.WorkingDir`: where processes start, the workspace. The user's `HOME` is
    /// [`DEFAULT_HOME`], not this.
    pub workdir: String,
    /// `created` of the configuration and its history entry, RFC 3339. Fixed for reproducibility.
    pub created: String,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            tag: "official".to_owned(),
            user: "1000:1000".to_owned(),
            workdir: "/workspace".to_owned(),
            created: "1970-01-01T00:00:00Z".to_owned(),
        }
    }
}

/// Packs the uncompressed rootfs tar at `rootfs_tar` into an OCI image layout in `out_dir`
/// (created if missing): one gzip layer, an image configuration from `options`, a manifest, and
/// `index.json` naming the manifest `options.tag` for linux/amd64. Returns the manifest digest.
///
/// Deterministic: the same tar and options give byte-identical files. Each blob is written to a
/// temporary file and renamed into place; `oci-layout` and `index.json` are written last, so an
/// interrupted pack into a fresh directory never leaves something that opens as a layout. Blobs already in `out_dir`
/// are overwritten with identical content; other files there are left alone.
pub fn pack(
    rootfs_tar: &Path,
    out_dir: &Path,
    options: &PackOptions,
) -> Result<Digest, LayoutError> {
    validate(options)?;
    // The input is checked before anything is created, so a wrong path leaves no trace.
    let rootfs = RootfsTar::open(rootfs_tar)?;
    let blobs = out_dir.join("blobs").join("sha256");
    fs::create_dir_all(&blobs).map_err(|source| LayoutError::Write {
        path: blobs.clone(),
        source,
    })?;

    let layer = write_layer(rootfs, &blobs)?;

    let config = ImageConfig {
        created: Some(options.created.clone()),
        architecture: "amd64".to_owned(),
        os: "linux".to_owned(),
        config: ContainerConfig {
            user: Some(options.user.clone()),
            env: vec![
                format!("PATH={DEFAULT_PATH}"),
                format!("HOME={DEFAULT_HOME}"),
                format!("LANG={DEFAULT_LANG}"),
            ],
            working_dir: Some(options.workdir.clone()),
            ..ContainerConfig::default()
        },
        rootfs: RootFs {
            kind: "layers".to_owned(),
            diff_ids: vec![layer.diff_id],
        },
        history: vec![History {
            created: Some(options.created.clone()),
            created_by: Some("naryad pack-image".to_owned()),
            comment: None,
        }],
    };
    let config_bytes = to_json(&config, "image configuration")?;
    let config_digest = Digest::of(&config_bytes);
    write_atomically(&blobs.join(config_digest.hex()), &config_bytes)?;

    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_OCI_MANIFEST.to_owned()),
        config: descriptor(MEDIA_TYPE_OCI_CONFIG, config_digest, config_bytes.len()),
        layers: vec![Descriptor {
            media_type: MEDIA_TYPE_OCI_LAYER_GZIP.to_owned(),
            digest: layer.digest,
            size: layer.size,
            platform: None,
            annotations: BTreeMap::new(),
        }],
        annotations: BTreeMap::new(),
    };
    let manifest_bytes = to_json(&manifest, "image manifest")?;
    let manifest_digest = Digest::of(&manifest_bytes);
    write_atomically(&blobs.join(manifest_digest.hex()), &manifest_bytes)?;

    let index = ImageIndex {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_OCI_INDEX.to_owned()),
        manifests: vec![Descriptor {
            platform: Some(Platform {
                architecture: "amd64".to_owned(),
                os: "linux".to_owned(),
                variant: None,
            }),
            annotations: BTreeMap::from([(REF_NAME_ANNOTATION.to_owned(), options.tag.clone())]),
            ..descriptor(
                MEDIA_TYPE_OCI_MANIFEST,
                manifest_digest.clone(),
                manifest_bytes.len(),
            )
        }],
        annotations: BTreeMap::new(),
    };
    let marker = LayoutMarker {
        image_layout_version: LAYOUT_VERSION.to_owned(),
    };
    write_atomically(
        &out_dir.join(LAYOUT_MARKER_FILE),
        &to_json(&marker, "oci-layout marker")?,
    )?;
    write_atomically(&out_dir.join(INDEX_FILE), &to_json(&index, "image index")?)?;
    Ok(manifest_digest)
}

fn validate(options: &PackOptions) -> Result<(), LayoutError> {
    let invalid = |option, value: &str, reason| {
        Err(LayoutError::InvalidOption {
            option,
            value: value.to_owned(),
            reason,
        })
    };
    // The ref.name grammar of the image-spec, loosely: what skopeo accepts after `oci:DIR:`.
    if options.tag.is_empty()
        || !options
            .tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:@/+".contains(&b))
    {
        return invalid(
            "tag",
            &options.tag,
            "use letters, digits and - . _ : @ / + only",
        );
    }
    if options.user.is_empty() || options.user.chars().any(char::is_whitespace) {
        return invalid("user", &options.user, "give a user such as 1000:1000");
    }
    if !options.workdir.starts_with('/') {
        return invalid("workdir", &options.workdir, "give an absolute path");
    }
    if options.created.is_empty() {
        return invalid(
            "created",
            &options.created,
            "give an RFC 3339 time such as 1970-01-01T00:00:00Z",
        );
    }
    Ok(())
}

pub(super) fn descriptor(media_type: &str, digest: Digest, size: usize) -> Descriptor {
    Descriptor {
        media_type: media_type.to_owned(),
        digest,
        size: size as u64,
        platform: None,
        annotations: BTreeMap::new(),
    }
}

fn to_json<T: Serialize>(value: &T, what: &'static str) -> Result<Vec<u8>, LayoutError> {
    serde_json::to_vec(value).map_err(|source| LayoutError::Serialise { what, source })
}

/// The compressed layer blob written by [`write_layer`].
struct PackedLayer {
    digest: Digest,
    size: u64,
    diff_id: Digest,
}

/// An uncompressed tar opened for packing, its first header block already read and checked.
struct RootfsTar {
    path: PathBuf,
    input: BufReader<File>,
    first_block: [u8; 512],
}

impl RootfsTar {
    fn open(path: &Path) -> Result<RootfsTar, LayoutError> {
        let read_error = |source| LayoutError::ReadRootfs {
            path: path.to_owned(),
            source,
        };
        let mut input =
            BufReader::with_capacity(STREAM_BUFFER, File::open(path).map_err(read_error)?);
        let mut first_block = [0u8; 512];
        match input.read_exact(&mut first_block) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(LayoutError::NotATar {
                    path: path.to_owned(),
                })
            }
            Err(e) => return Err(read_error(e)),
        }
        // POSIX ustar and GNU tar both carry "ustar" at offset 257 of every header.
        if &first_block[257..262] != b"ustar" {
            return Err(LayoutError::NotATar {
                path: path.to_owned(),
            });
        }
        Ok(RootfsTar {
            path: path.to_owned(),
            input,
            first_block,
        })
    }
}

/// Streams the rootfs tar through gzip into `blobs`, hashing it on both sides of the compressor.
fn write_layer(rootfs: RootfsTar, blobs: &Path) -> Result<PackedLayer, LayoutError> {
    let RootfsTar {
        path: rootfs_tar,
        mut input,
        first_block,
    } = rootfs;
    let temp = TempFile::in_dir(blobs);
    let file = temp.open()?;
    let compressed = HashingWriter::new(BufWriter::with_capacity(STREAM_BUFFER, file));
    // An empty gzip header (mtime 0, no name) keeps the blob a function of the tar alone.
    let gzip = GzBuilder::new().write(compressed, Compression::default());
    let mut uncompressed = HashingWriter::new(gzip);

    let write_error = |source| LayoutError::Write {
        path: temp.path.clone(),
        source,
    };
    uncompressed.write_all(&first_block).map_err(write_error)?;
    copy(&mut input, &mut uncompressed, &rootfs_tar, &temp.path)?;
    let (gzip, diff_id, _) = uncompressed.finish();
    let compressed = gzip.finish().map_err(write_error)?;
    let (buffered, digest, size) = compressed.finish();
    let file = buffered
        .into_inner()
        .map_err(|e| write_error(e.into_error()))?;
    file.sync_all().map_err(write_error)?;
    drop(file);
    temp.persist(&blobs.join(digest.hex()))?;
    Ok(PackedLayer {
        digest,
        size,
        diff_id,
    })
}

/// `io::copy`, but telling a failure to read the input from a failure to write the output.
fn copy(
    input: &mut impl Read,
    output: &mut impl Write,
    input_path: &Path,
    output_path: &Path,
) -> Result<(), LayoutError> {
    let mut buffer = vec![0u8; STREAM_BUFFER];
    loop {
        let n = match input.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(LayoutError::ReadRootfs {
                    path: input_path.to_owned(),
                    source,
                })
            }
        };
        output
            .write_all(&buffer[..n])
            .map_err(|source| LayoutError::Write {
                path: output_path.to_owned(),
                source,
            })?;
    }
}

#[cfg(test)]
mod tests {
    use flate2::read::GzDecoder;

    use super::*;
    use crate::layout::fixtures::{files, options, rootfs_tar};
    use crate::layout::io::TEMP_PREFIX;
    use crate::layout::{write_archive, Layout};

    #[test]
    fn a_packed_rootfs_resolves_to_the_returned_digest_with_its_config_and_layer() {
        let temp = tempfile::tempdir().unwrap();
        let tar_path = rootfs_tar(temp.path());
        let out = temp.path().join("layout");
        let digest = pack(&tar_path, &out, &options()).unwrap();

        let layout = Layout::open(&out).unwrap();
        assert_eq!(layout.resolve().unwrap(), digest);

        let index = layout.index().unwrap();
        assert_eq!(index.manifests.len(), 1);
        assert_eq!(
            index.manifests[0].annotations.get(REF_NAME_ANNOTATION),
            Some(&"official".to_owned())
        );
        assert_eq!(
            index.manifests[0].platform,
            Some(Platform {
                architecture: "amd64".to_owned(),
                os: "linux".to_owned(),
                variant: None
            })
        );

        let (manifest, manifest_bytes) = layout.manifest(&digest).unwrap();
        assert!(digest.verifies(&manifest_bytes));
        assert_eq!(manifest.config.media_type, MEDIA_TYPE_OCI_CONFIG);
        assert_eq!(manifest.layers.len(), 1);
        assert_eq!(manifest.layers[0].media_type, MEDIA_TYPE_OCI_LAYER_GZIP);
        layout.verify_blob(&manifest.layers[0]).unwrap();

        let (config, _) = layout.config(&manifest).unwrap();
        let tar_bytes = fs::read(&tar_path).unwrap();
        assert_eq!(config.rootfs.kind, "layers");
        assert_eq!(config.rootfs.diff_ids, vec![Digest::of(&tar_bytes)]);
        assert_eq!(
            (config.os.as_str(), config.architecture.as_str()),
            ("linux", "amd64")
        );
        assert_eq!(config.created.as_deref(), Some("2025-05-20T00:00:00Z"));
        assert_eq!(config.config.user.as_deref(), Some("1000:1000"));
        assert_eq!(config.config.working_dir.as_deref(), Some("/workspace"));
        assert_eq!(
            config.config.env,
            vec![
                format!("PATH={DEFAULT_PATH}"),
                "HOME=/home/narya".to_owned(),
                "LANG=C.UTF-8".to_owned()
            ]
        );
        assert_eq!(config.history.len(), 1);

        // The layer decompresses to exactly the tar it was packed from.
        let layer = layout.read_blob(&manifest.layers[0].digest).unwrap();
        assert_eq!(layer.len() as u64, manifest.layers[0].size);
        let mut unpacked = Vec::new();
        GzDecoder::new(layer.as_slice())
            .read_to_end(&mut unpacked)
            .unwrap();
        assert_eq!(unpacked, tar_bytes);

        // Nothing temporary is left behind.
        assert!(files(&out).keys().all(|name| !name.contains(TEMP_PREFIX)));
        assert_eq!(files(&out).len(), 5, "{:?}", files(&out).keys());
    }

    #[test]
    fn packing_twice_gives_identical_bytes_and_archives() {
        let temp = tempfile::tempdir().unwrap();
        let tar_path = rootfs_tar(temp.path());
        let (a, b) = (temp.path().join("a"), temp.path().join("b"));
        let digest_a = pack(&tar_path, &a, &options()).unwrap();
        let digest_b = pack(&tar_path, &b, &options()).unwrap();
        assert_eq!(digest_a, digest_b);
        assert_eq!(files(&a), files(&b));

        let (archive_a, archive_b) = (temp.path().join("a.tar"), temp.path().join("b.tar"));
        write_archive(&a, &archive_a).unwrap();
        write_archive(&b, &archive_b).unwrap();
        assert_eq!(fs::read(&archive_a).unwrap(), fs::read(&archive_b).unwrap());

        // Other options give another image.
        let other = PackOptions {
            tag: "other".to_owned(),
            ..options()
        };
        let c = temp.path().join("c");
        pack(&tar_path, &c, &other).unwrap();
        assert_ne!(files(&a), files(&c));
    }

    #[test]
    fn a_compressed_or_empty_input_is_not_packed() {
        let temp = tempfile::tempdir().unwrap();
        let out = temp.path().join("layout");
        let gz = temp.path().join("rootfs.tar.gz");
        let mut encoder = GzBuilder::new().write(File::create(&gz).unwrap(), Compression::fast());
        encoder
            .write_all(&fs::read(rootfs_tar(temp.path())).unwrap())
            .unwrap();
        encoder.finish().unwrap();
        assert!(matches!(
            pack(&gz, &out, &options()),
            Err(LayoutError::NotATar { .. })
        ));
        let empty = temp.path().join("empty.tar");
        fs::write(&empty, b"").unwrap();
        assert!(matches!(
            pack(&empty, &out, &options()),
            Err(LayoutError::NotATar { .. })
        ));
        assert!(matches!(
            pack(&temp.path().join("absent.tar"), &out, &options()),
            Err(LayoutError::ReadRootfs { .. })
        ));
        // Nothing was created for a refused input.
        assert!(!out.exists());
    }

    #[test]
    fn invalid_options_are_refused() {
        let temp = tempfile::tempdir().unwrap();
        let tar_path = rootfs_tar(temp.path());
        let out = temp.path().join("layout");
        for bad in [
            PackOptions {
                tag: String::new(),
                ..options()
            },
            PackOptions {
                tag: "has space".to_owned(),
                ..options()
            },
            PackOptions {
                workdir: "workspace".to_owned(),
                ..options()
            },
            PackOptions {
                user: String::new(),
                ..options()
            },
        ] {
            assert!(matches!(
                pack(&tar_path, &out, &bad),
                Err(LayoutError::InvalidOption { .. })
            ));
        }
    }
}
