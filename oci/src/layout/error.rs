//! The one error type of reading, packing and archiving OCI image layouts.

use std::io;
use std::path::PathBuf;

use super::MAX_INDEX_DEPTH;
use crate::Digest;

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
