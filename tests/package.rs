//! The Debian package: built by `contrib/deb/build.sh` (cargo-deb) from this test run's
//! binaries, installed with `dpkg -i` into a clean bookworm root by `contrib/deb/test.sh`, which
//! checks files, conffile, units (installed, not enabled), group, `check-config`, and purge.

use std::path::Path;
use std::process::Command;

/// Whether this machine can run the package test: root and mmdebstrap. Under CI it must.
fn can_build_roots() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    let mmdebstrap = Command::new("sh")
        .args(["-c", "command -v mmdebstrap"])
        .output()
        .is_ok_and(|out| out.status.success());
    if root && mmdebstrap {
        return true;
    }
    let message = "the package test needs root and mmdebstrap: run contrib/test.sh as root";
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{message} (CI=true: not skipping)"
    );
    eprintln!("skipped: {message}");
    false
}

#[test]
fn the_package_installs_into_a_clean_bookworm_root() {
    if !can_build_roots() {
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let binaries = Path::new(env!("CARGO_BIN_EXE_naryad"))
        .parent()
        .expect("the binary is in a directory");
    assert!(
        binaries.join("narya").is_file(),
        "narya is not built beside naryad"
    );
    let out = tempfile::tempdir().unwrap();
    let built = Command::new(repo.join("contrib/deb/build.sh"))
        .arg("--binaries")
        .arg(binaries)
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("contrib/deb/build.sh runs");
    assert!(
        built.status.success(),
        "contrib/deb/build.sh failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let deb = String::from_utf8_lossy(&built.stdout).trim().to_owned();
    assert!(deb.ends_with(".deb"), "build.sh printed {deb:?}");

    let tested = Command::new(repo.join("contrib/deb/test.sh"))
        .arg(&deb)
        .output()
        .expect("contrib/deb/test.sh runs");
    let said = String::from_utf8_lossy(&tested.stderr);
    assert!(
        tested.status.success(),
        "contrib/deb/test.sh failed:\n{said}"
    );
    assert!(said.contains("purge keeps /var/lib/narya"), "{said}");
}
