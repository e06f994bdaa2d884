//! Low-level file I/O that reading, packing and archiving layouts share: hashing writes, temp files renamed into place.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest as _, Sha256};

use super::LayoutError;
use crate::digest::hex_lower;
use crate::Digest;

/// Prefix of the temporary files blobs are written to before being renamed into place.
pub(super) const TEMP_PREFIX: &str = ".narya-tmp-";
/// Size of the read and write buffers used when streaming a layer.
pub(super) const STREAM_BUFFER: usize = 1 << 20;

/// A writer that hashes and counts what passes through it.
pub(super) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    pub(super) fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    pub(super) fn finish(self) -> (W, Digest, u64) {
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
pub(super) struct TempFile {
    pub(super) path: PathBuf,
    persisted: bool,
}

impl TempFile {
    /// A fresh name in `dir`; the file is created by [`TempFile::open`].
    pub(super) fn in_dir(dir: &Path) -> TempFile {
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

    pub(super) fn open(&self) -> Result<File, LayoutError> {
        File::options()
            .write(true)
            .create_new(true)
            .open(&self.path)
            .map_err(|source| LayoutError::Write {
                path: self.path.clone(),
                source,
            })
    }

    pub(super) fn persist(mut self, to: &Path) -> Result<(), LayoutError> {
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
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), LayoutError> {
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
