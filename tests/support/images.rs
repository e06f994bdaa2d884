//! Images for tests that need a digest other than the official image's, and a registry to
//! serve them from.

/// Repacks the official image with creation time `created` (RFC 3339): the same files, a new
/// digest.
pub fn another_image(layout: &str, out: &std::path::Path, created: &str) -> String {
    let layout = narya_oci::layout::Layout::open(layout).unwrap();
    let (manifest, _) = layout.manifest(&layout.resolve().unwrap()).unwrap();
    let layer = layout.blob_path(&manifest.layers[0].digest);
    let rootfs = out.with_extension("rootfs.tar");
    let gunzip = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "gzip -dc {} > {}",
            layer.display(),
            rootfs.display()
        ))
        .status()
        .unwrap();
    assert!(gunzip.success());
    let packed = std::process::Command::new(env!("CARGO_BIN_EXE_naryad"))
        .args(["pack-image", "--created", created, "--rootfs"])
        .arg(&rootfs)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        packed.status.success(),
        "{}",
        String::from_utf8_lossy(&packed.stderr)
    );
    String::from_utf8(packed.stdout).unwrap().trim().to_owned()
}

pub fn push(layout: &std::path::Path, reference: &str) {
    let pushed = std::process::Command::new("skopeo")
        .args([
            "copy",
            "--quiet",
            "--preserve-digests",
            "--dest-tls-verify=false",
        ])
        .arg(format!("oci:{}:official", layout.display()))
        .arg(format!("docker://{reference}"))
        .output()
        .expect("skopeo runs");
    assert!(
        pushed.status.success(),
        "{}",
        String::from_utf8_lossy(&pushed.stderr)
    );
}
