//! Keys made with `openssl`, as the identity provider's and GitHub's doubles use them. Shared
//! with the benchmark, which includes this file.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use narya::devkeys::DevKey;

/// A private key made by `openssl`, with its PEM files.
pub struct TestKey {
    pub dev: DevKey,
    pub private_pem: Vec<u8>,
    pub public_pem: Vec<u8>,
    pub private_path: PathBuf,
}

/// Makes a key with `openssl genpkey`; `kind` is "RSA" or "P-256".
pub fn make_key(dir: &Path, name: &str, kind: &str) -> TestKey {
    let private_path = dir.join(format!("{name}.pem"));
    let mut cmd = Command::new("openssl");
    cmd.arg("genpkey");
    match kind {
        "RSA" => cmd.args(["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]),
        "P-256" => cmd.args(["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]),
        other => panic!("unknown key kind {other}"),
    };
    let status = cmd
        .arg("-out")
        .arg(&private_path)
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl genpkey failed");
    let public = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&private_path)
        .output()
        .expect("openssl runs");
    assert!(public.status.success());
    let private_pem = std::fs::read(&private_path).unwrap();
    TestKey {
        dev: DevKey::from_pem(&private_pem).expect("openssl's key is usable"),
        private_pem,
        public_pem: public.stdout,
        private_path,
    }
}
