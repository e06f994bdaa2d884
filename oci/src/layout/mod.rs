//! OCI image layouts on disk: packing a rootfs tar into one, reading one back with every blob
//! verified against its digest, and archiving one as the `oci-archive` tar that skopeo reads.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use flate2::{Compression, GzBuilder};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::digest::hex_lower;
use crate::manifest::{
    is_index, is_manifest, select_linux_amd64, ContainerConfig, Descriptor, History, ImageConfig,
    ImageIndex, ImageManifest, Platform, RootFs, MEDIA_TYPE_OCI_CONFIG, MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_LAYER_GZIP, MEDIA_TYPE_OCI_MANIFEST,
};
use crate::Digest;

/// The file that marks a directory as an OCI image layout.
pub const LAYOUT_MARKER_FILE: &str = "oci-layout";
/// The layout's entry point: an image index.
pub const INDEX_FILE: &str = "index.json";
/// The only layout version this crate reads and writes.
pub const LAYOUT_VERSION: &str = "1.0.0";
/// The annotation naming a manifest in a layout's index (`oci:DIR:NAME` in skopeo's terms).
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";
/// `PATH` in the official image's environment.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How far nested indexes are followed before a layout is taken to be malformed.
const MAX_INDEX_DEPTH: usize = 8;
/// Prefix of the temporary files blobs are written to before being renamed into place.
const TEMP_PREFIX: &str = ".narya-tmp-";
/// Size of the read and write buffers used when streaming a layer.
const STREAM_BUFFER: usize = 1 << 20;

/// What [`pack`] puts into the image configuration besides the layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackOptions {
    /// The name given to the manifest in `index.json` (`org.opencontainers.image.ref.name`).
    pub tag: String,
    /// `config.User`: the `uid:gid` processes of the image run as.
    pub user: String,
    /// `config.WorkingDir`, also the user's `HOME`: the workspace is the user's home.
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

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "cannot read the rootfs tar {path}: {source}; check the path (an uncompressed tar, as mmdebstrap writes)"
    )]
    ReadRootfs { path: PathBuf, source: io::Error },
    #[error(
        "{path} is not an uncompressed tar (no ustar header at its start); give the tar mmdebstrap wrote, not a compressed one"
    )]
    NotATar { path: PathBuf },
    #[error("cannot write {path}: {source}; check that its directory is writable and has room")]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path} is not an OCI image layout: {reason}; build one with contrib/image/build.sh")]
    NotALayout { path: PathBuf, reason: String },
    #[error("{path} is not a valid {what}: {source}; the layout is damaged: rebuild it")]
    Parse {
        path: PathBuf,
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("cannot serialise the {what}: {source}")]
    Serialise {
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("blob {digest} is missing from the layout (looked for {path}); the layout is incomplete: rebuild it")]
    BlobMissing { digest: Digest, path: PathBuf },
    #[error(
        "blob {path} does not match its digest: expected {expected}, its content hashes to {actual}; the layout is corrupt: rebuild it"
    )]
    DigestMismatch {
        expected: Digest,
        actual: Digest,
        path: PathBuf,
    },
    #[error("blob {digest} holds {actual} bytes but its descriptor says {expected}; the layout is corrupt: rebuild it")]
    SizeMismatch {
        digest: Digest,
        expected: u64,
        actual: u64,
    },
    #[error(
        "the image index {path} has no linux/amd64 manifest (it lists: {available}); Narya runs linux/amd64 images only: build or choose one for that platform"
    )]
    NoLinuxAmd64 { path: PathBuf, available: String },
    #[error("blob {digest} has media type {media_type:?} where {expected} was expected")]
    MediaType {
        digest: Digest,
        media_type: String,
        expected: &'static str,
    },
    #[error(
        "image indexes in {path} nest more than {MAX_INDEX_DEPTH} deep; refusing to follow them"
    )]
    IndexTooDeep { path: PathBuf },
    #[error("invalid {option} {value:?}: {reason}")]
    InvalidOption {
        option: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("cannot archive {path}: a layout holds only regular files and directories")]
    UnsupportedFile { path: PathBuf },
}

/// The contents of the `oci-layout` marker file.
#[derive(Serialize, Deserialize)]
struct LayoutMarker {
    #[serde(rename = "imageLayoutVersion")]
    image_layout_version: String,
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
                format!("HOME={}", options.workdir),
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

fn descriptor(media_type: &str, digest: Digest, size: usize) -> Descriptor {
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

/// A writer that hashes and counts what passes through it.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    fn finish(self) -> (W, Digest, u64) {
        let digest = digest_from(self.hasher);
        (self.inner, digest, self.bytes)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn digest_from(hasher: Sha256) -> Digest {
    format!("sha256:{}", hex_lower(&hasher.finalize()))
        .parse()
        .expect("a SHA-256 output renders as 64 lower-case hex characters")
}

/// A temporary file beside its final place, removed unless persisted.
struct TempFile {
    path: PathBuf,
    persisted: bool,
}

impl TempFile {
    /// A fresh name in `dir`; the file is created by [`TempFile::open`].
    fn in_dir(dir: &Path) -> TempFile {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{TEMP_PREFIX}{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        TempFile {
            path: dir.join(name),
            persisted: false,
        }
    }

    fn open(&self) -> Result<File, LayoutError> {
        File::options()
            .write(true)
            .create_new(true)
            .open(&self.path)
            .map_err(|source| LayoutError::Write {
                path: self.path.clone(),
                source,
            })
    }

    fn persist(mut self, to: &Path) -> Result<(), LayoutError> {
        fs::rename(&self.path, to).map_err(|source| LayoutError::Write {
            path: to.to_owned(),
            source,
        })?;
        self.persisted = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.persisted {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), LayoutError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let temp = TempFile::in_dir(dir);
    let mut file = temp.open()?;
    let write_error = |source| LayoutError::Write {
        path: temp.path.clone(),
        source,
    };
    file.write_all(bytes).map_err(write_error)?;
    file.sync_all().map_err(write_error)?;
    drop(file);
    temp.persist(path)
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
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
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
            io::ErrorKind::NotFound => LayoutError::NotALayout {
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
            io::ErrorKind::NotFound => LayoutError::BlobMissing {
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
        let read_error = |source: io::Error| match source.kind() {
            io::ErrorKind::NotFound => LayoutError::BlobMissing {
                digest: descriptor.digest.clone(),
                path: path.clone(),
            },
            _ => LayoutError::Read {
                path: path.clone(),
                source,
            },
        };
        let mut file = File::open(&path).map_err(read_error)?;
        let mut hashing = HashingWriter::new(io::sink());
        io::copy(&mut file, &mut hashing).map_err(read_error)?;
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

/// Writes the layout in `layout_dir` as a tar at `archive` in the `oci-archive` form skopeo
/// reads: the layout's files at the tar root, in sorted order, with mtime 0, owner 0:0 and fixed
/// modes, so the same layout always gives the same bytes. Written to a temporary file beside
/// `archive` and renamed into place.
pub fn write_archive(layout_dir: &Path, archive: &Path) -> Result<(), LayoutError> {
    Layout::open(layout_dir)?;
    let mut entries = Vec::new();
    collect_entries(layout_dir, "", &mut entries)?;
    // By full path: a directory sorts just before what it holds, as its path is their prefix.
    entries.sort_by(|a, b| a.name().cmp(b.name()));

    let dir = match archive.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let temp = TempFile::in_dir(dir);
    let file = temp.open()?;
    let write_error = |source| LayoutError::Write {
        path: temp.path.clone(),
        source,
    };
    let mut builder = tar::Builder::new(BufWriter::with_capacity(STREAM_BUFFER, file));
    for entry in &entries {
        let mut header = tar::Header::new_gnu();
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        match entry {
            ArchiveEntry::Directory(name) => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder
                    .append_data(&mut header, name, io::empty())
                    .map_err(write_error)?;
            }
            ArchiveEntry::File(name) => {
                let path = layout_dir.join(name);
                let source = File::open(&path).map_err(|source| LayoutError::Read {
                    path: path.clone(),
                    source,
                })?;
                let size = source
                    .metadata()
                    .map_err(|source| LayoutError::Read {
                        path: path.clone(),
                        source,
                    })?
                    .len();
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(0o644);
                header.set_size(size);
                // A file that shrinks while being archived would leave a short entry and a
                // corrupt archive: count what was read and refuse that.
                let mut counted = CountingReader {
                    inner: source.take(size),
                    bytes: 0,
                };
                builder
                    .append_data(&mut header, name, &mut counted)
                    .map_err(write_error)?;
                if counted.bytes != size {
                    return Err(LayoutError::Read {
                        path,
                        source: io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the file changed while it was being archived",
                        ),
                    });
                }
            }
        }
    }
    let buffered = builder.into_inner().map_err(write_error)?;
    let file = buffered
        .into_inner()
        .map_err(|e| write_error(e.into_error()))?;
    file.sync_all().map_err(write_error)?;
    drop(file);
    temp.persist(archive)
}

/// A reader that counts the bytes read through it.
struct CountingReader<R> {
    inner: R,
    bytes: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

#[derive(Debug)]
enum ArchiveEntry {
    Directory(String),
    File(String),
}

impl ArchiveEntry {
    fn name(&self) -> &str {
        match self {
            ArchiveEntry::Directory(name) | ArchiveEntry::File(name) => name,
        }
    }
}

/// Lists the files and directories under `dir` as `/`-joined paths relative to the layout,
/// leaving out temporary files of an interrupted pack.
fn collect_entries(
    dir: &Path,
    prefix: &str,
    entries: &mut Vec<ArchiveEntry>,
) -> Result<(), LayoutError> {
    let read_error = |source| LayoutError::Read {
        path: dir.to_owned(),
        source,
    };
    for entry in fs::read_dir(dir).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            return Err(LayoutError::UnsupportedFile { path });
        };
        if name.starts_with(TEMP_PREFIX) {
            continue;
        }
        let relative = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let file_type = entry.file_type().map_err(|source| LayoutError::Read {
            path: path.clone(),
            source,
        })?;
        if file_type.is_dir() {
            collect_entries(&path, &relative, entries)?;
            entries.push(ArchiveEntry::Directory(relative));
        } else if file_type.is_file() {
            entries.push(ArchiveEntry::File(relative));
        } else {
            return Err(LayoutError::UnsupportedFile { path });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use flate2::read::GzDecoder;

    use super::*;

    /// A small rootfs tar, built the way mmdebstrap's output looks: relative paths, fixed times.
    fn rootfs_tar(dir: &Path) -> PathBuf {
        let path = dir.join("rootfs.tar");
        let mut builder = tar::Builder::new(File::create(&path).unwrap());
        let mut add = |name: &str, kind: tar::EntryType, mode: u32, data: &[u8]| {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_mode(mode);
            header.set_mtime(1_700_000_000);
            header.set_size(data.len() as u64);
            builder.append_data(&mut header, name, data).unwrap();
        };
        add("./", tar::EntryType::Directory, 0o755, b"");
        add("./etc/", tar::EntryType::Directory, 0o755, b"");
        add(
            "./etc/passwd",
            tar::EntryType::Regular,
            0o644,
            b"root:x:0:0:root:/root:/bin/bash\nnarya:x:1000:1000::/workspace:/bin/bash\n",
        );
        add("./usr/", tar::EntryType::Directory, 0o755, b"");
        add("./usr/bin/", tar::EntryType::Directory, 0o755, b"");
        add(
            "./usr/bin/tini",
            tar::EntryType::Regular,
            0o755,
            &[0x7f, b'E', b'L', b'F', 2, 1, 1, 0],
        );
        builder.into_inner().unwrap().sync_all().unwrap();
        path
    }

    /// Every file under `dir`, relative path → bytes.
    fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        let mut entries = Vec::new();
        collect_entries(dir, "", &mut entries).unwrap();
        entries
            .into_iter()
            .filter_map(|e| match e {
                ArchiveEntry::File(name) => Some(name),
                ArchiveEntry::Directory(_) => None,
            })
            .map(|name| {
                let bytes = fs::read(dir.join(&name)).unwrap();
                (name, bytes)
            })
            .collect()
    }

    fn options() -> PackOptions {
        PackOptions {
            created: "2025-05-20T00:00:00Z".to_owned(),
            ..PackOptions::default()
        }
    }

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
            vec![format!("PATH={DEFAULT_PATH}"), "HOME=/workspace".to_owned()]
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
    fn the_archive_holds_the_layout_sorted_at_its_root_owned_by_root_at_time_zero() {
        let temp = tempfile::tempdir().unwrap();
        let tar_path = rootfs_tar(temp.path());
        let out = temp.path().join("layout");
        pack(&tar_path, &out, &options()).unwrap();
        let archive = temp.path().join("layout.tar");
        write_archive(&out, &archive).unwrap();

        let mut names = Vec::new();
        let mut reader = tar::Archive::new(File::open(&archive).unwrap());
        for entry in reader.entries().unwrap() {
            let mut entry = entry.unwrap();
            let header = entry.header().clone();
            assert_eq!(header.mtime().unwrap(), 0);
            assert_eq!((header.uid().unwrap(), header.gid().unwrap()), (0, 0));
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            if header.entry_type().is_file() {
                let mut bytes = Vec::new();
                entry.read_to_end(&mut bytes).unwrap();
                assert_eq!(bytes, fs::read(out.join(&name)).unwrap(), "{name}");
            }
            names.push(name);
        }
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(&names[..2], ["blobs", "blobs/sha256"]);
        assert!(names.contains(&"index.json".to_owned()));
        assert!(names.contains(&"oci-layout".to_owned()));
        assert_eq!(names.len(), 2 + 3 + 2);
    }

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
