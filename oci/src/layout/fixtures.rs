//! Test fixtures shared by the layout module's unit tests: a small rootfs tar and pack options.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use super::archive::{collect_entries, ArchiveEntry};
use super::PackOptions;

/// A small rootfs tar, built the way mmdebstrap's output looks: relative paths, fixed times.
pub(super) fn rootfs_tar(dir: &Path) -> PathBuf {
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
pub(super) fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
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

pub(super) fn options() -> PackOptions {
    PackOptions {
        created: "2025-05-20T00:00:00Z".to_owned(),
        ..PackOptions::default()
    }
}
