//! Archiving an OCI image layout as the reproducible `oci-archive` tar that skopeo reads.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read};
use std::path::Path;

use super::io::{TempFile, STREAM_BUFFER, TEMP_PREFIX};
use super::{Layout, LayoutError};

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
pub(super) enum ArchiveEntry {
    Directory(String),
    File(String),
}

impl ArchiveEntry {
    pub(super) fn name(&self) -> &str {
        match self {
            ArchiveEntry::Directory(name) | ArchiveEntry::File(name) => name,
        }
    }
}

/// Lists the files and directories under `dir` as `/`-joined paths relative to the layout,
/// leaving out temporary files of an interrupted pack.
pub(super) fn collect_entries(
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
    use super::*;
    use crate::layout::fixtures::{options, rootfs_tar};
    use crate::layout::pack;

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
}
