//! `naryad check-config`: one line per problem and exit 1, or exit 0 on a configuration a start
//! would take; never the daemon's state touched or its listeners bound.

mod support;

use std::path::Path;

use support::e2e::{requirements_for, Backend};
use support::github::GitHubDouble;
use support::idp::IdentityProvider;
use support::private::PrivateContainerd;
use support::{free_port, make_key, LIMITS};

/// What `naryad check-config --config PATH` printed and how it exited.
struct Checked {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Checked {
    fn problems(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|line| line.starts_with("problem: "))
            .collect()
    }

    fn says(&self, prefix: &str) -> bool {
        self.stdout.lines().any(|line| line.starts_with(prefix))
    }
}

impl std::fmt::Display for Checked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\nstdout:\n{}stderr:\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

async fn check_config(config: &Path) -> Checked {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_naryad"))
        .arg("check-config")
        .arg("--config")
        .arg(config)
        .env_remove("RUST_LOG")
        .output()
        .await
        .expect("naryad runs");
    Checked {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A tiny OCI layout packed by `naryad pack-image`: enough for the image reference to resolve.
fn tiny_layout(dir: &Path) -> String {
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::write(rootfs.join("etc/hostname"), "tiny\n").unwrap();
    let tar = dir.join("rootfs.tar");
    let made = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&rootfs)
        .arg(".")
        .status()
        .expect("tar runs");
    assert!(made.success());
    let layout = dir.join("layout");
    let packed = std::process::Command::new(env!("CARGO_BIN_EXE_naryad"))
        .args(["pack-image", "--rootfs"])
        .arg(&tar)
        .arg("--out")
        .arg(&layout)
        .output()
        .expect("naryad pack-image runs");
    assert!(
        packed.status.success(),
        "{}",
        String::from_utf8_lossy(&packed.stderr)
    );
    format!("oci-layout:{}", layout.display())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_socket_an_unreachable_identity_provider_and_a_missing_key_are_three_problems() {
    let dir = tempfile::tempdir().unwrap();
    let reference = tiny_layout(dir.path());
    // Bound and released: nothing answers there.
    let unreachable = format!("http://127.0.0.1:{}", free_port());
    let state = dir.path().join("state");
    let secret = dir.path().join("client-secret");
    std::fs::write(&secret, "s3cr3t\n").unwrap();
    let config = format!(
        "state_dir = {state:?}\n\n\
         [listen]\nsocket = {socket:?}\n\n\
         [identity]\nissuer = {unreachable:?}\naudience = \"narya\"\n\n\
         [runtime]\ncontainerd_socket = {runtime:?}\n\n\
         [image]\nreference = {reference:?}\n\n\
         [github]\napp_id = 1\nprivate_key = {key:?}\nclient_id = \"Iv1.check\"\n\
         client_secret_file = {secret:?}\napi_url = {unreachable:?}\n{LIMITS}",
        state = state.display().to_string(),
        socket = dir.path().join("run/narya.sock").display().to_string(),
        runtime = dir
            .path()
            .join("nowhere/containerd.sock")
            .display()
            .to_string(),
        key = dir.path().join("missing.pem").display().to_string(),
        secret = secret.display().to_string(),
    );
    let path = dir.path().join("naryad.toml");
    std::fs::write(&path, config).unwrap();

    let checked = check_config(&path).await;
    assert_eq!(checked.code, Some(1), "{checked}");
    let problems = checked.problems();
    assert_eq!(problems.len(), 3, "{checked}");
    assert!(
        problems[0].starts_with("problem: github.private_key")
            && problems[0].contains("missing.pem"),
        "{checked}"
    );
    assert!(
        problems[1].starts_with("problem: runtime.containerd_socket")
            && problems[1].contains("nowhere/containerd.sock"),
        "{checked}"
    );
    assert!(
        problems[2].starts_with("problem: identity") && problems[2].contains(&unreachable),
        "{checked}"
    );
    // Everything else was looked at and found right.
    assert!(checked.says("ok: state_dir"), "{checked}");
    assert!(checked.says("ok: listen.socket"), "{checked}");
    assert!(checked.says("ok: image.reference"), "{checked}");
    assert!(!state.exists(), "check-config made the state directory");
    assert!(
        !dir.path().join("run").exists(),
        "check-config made the socket's directory"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_that_does_not_parse_is_one_problem_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("naryad.toml");
    std::fs::write(
        &path,
        "statedir = \"/tmp\"\n[identity]\nissuer = \"https://id.example.com\"\naudience = \"narya\"\n",
    )
    .unwrap();
    let checked = check_config(&path).await;
    assert_eq!(checked.code, Some(1), "{checked}");
    assert_eq!(checked.problems().len(), 1, "{checked}");
    assert!(checked.problems()[0].contains("statedir"), "{checked}");

    let checked = check_config(&dir.path().join("absent.toml")).await;
    assert_eq!(checked.code, Some(1), "{checked}");
    assert_eq!(checked.problems().len(), 1, "{checked}");
}

async fn a_configuration_a_start_would_take_passes(backend: Backend) {
    let Some((socket, layout)) = requirements_for(backend) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let idp = IdentityProvider::start().await;
    let key = make_key(dir.path(), "idp", "P-256");
    idp.publish(&key.dev);
    let github = GitHubDouble::start().await;
    let runtime = match backend {
        Backend::Containerd => format!("[runtime]\ncontainerd_socket = {socket:?}\n"),
        Backend::Docker | Backend::Podman => {
            format!("[runtime]\nbackend = \"docker\"\ndocker_socket = {socket:?}\n")
        }
    };
    // The Docker run resolves the image in the test registry, when there is one.
    let image = match (backend, std::env::var("NARYA_TEST_IMAGE_REF")) {
        (Backend::Docker | Backend::Podman, Ok(reference)) if !reference.is_empty() => {
            let registry = reference.split('/').next().unwrap_or_default().to_owned();
            format!("[image]\nreference = {reference:?}\ninsecure_registries = [{registry:?}]\n")
        }
        _ => format!("[image]\nreference = \"oci-layout:{layout}\"\n"),
    };
    let state = dir.path().join("state");
    let served = dir.path().join("run/narya.sock");
    let config = format!(
        "state_dir = {state:?}\n\n\
         [listen]\nsocket = {served:?}\ntcp = \"127.0.0.1:{port}\"\n\n\
         {identity}\n{runtime}\n{image}\n{github}\n{LIMITS}",
        state = state.display().to_string(),
        served = served.display().to_string(),
        port = free_port(),
        identity = idp.identity_toml(""),
        github = github.toml(),
    );
    let path = dir.path().join("naryad.toml");
    std::fs::write(&path, config).unwrap();

    let checked = check_config(&path).await;
    assert_eq!(checked.code, Some(0), "{checked}");
    assert!(checked.problems().is_empty(), "{checked}");
    let name = match backend {
        Backend::Containerd => "containerd",
        Backend::Docker | Backend::Podman => "docker",
    };
    // Every engine the suite runs on is a tested one: no warning.
    assert!(
        checked.says(&format!("ok: runtime {name} at {socket} answers: version ")),
        "{checked}"
    );
    assert!(!checked.says("warning: "), "{checked}");
    assert!(
        checked.says("ok: identity: 1 key(s) fetched from "),
        "{checked}"
    );
    assert!(checked.says("ok: image.reference "), "{checked}");
    assert!(
        checked.stdout.contains(": sha256:"),
        "no digest printed: {checked}"
    );
    assert!(checked.says("ok: github: "), "{checked}");
    assert!(checked.says("ok: listen.tcp "), "{checked}");
    assert!(!state.exists(), "check-config made the state directory");
    assert!(!served.exists(), "check-config bound the socket");
}

on_every_engine!(a_configuration_a_start_would_take_passes);

/// A disk bound on a state directory whose filesystem has no quotas is a problem naming the
/// key and the way out; with the state on the quota filesystem (and the runtime's layers on
/// it too) it is held.
#[tokio::test]
async fn a_disk_bound_the_host_cannot_hold_is_a_problem_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let idp = IdentityProvider::start().await;
    let key = make_key(dir.path(), "k", "P-256");
    idp.publish(&key.dev);
    let write = |state: &Path| {
        let config = format!(
            "state_dir = {state:?}\n[listen]\nsocket = {socket:?}\n{identity}\n{limits}",
            state = state.display().to_string(),
            socket = dir.path().join("run/narya.sock").display().to_string(),
            identity = idp.identity_toml(""),
            limits = LIMITS.replace("disk = \"unbounded\"", "disk = \"1GiB\""),
        );
        let path = dir.path().join("naryad.toml");
        std::fs::write(&path, config).unwrap();
        path
    };
    let checked = check_config(&write(&dir.path().join("state"))).await;
    let problems = checked.problems();
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("problem: limits.disk")
                && p.contains("btrfs")
                && p.contains("unbounded")),
        "{checked}"
    );
    if let Some(root) = support::state_root() {
        let bounded = tempfile::tempdir_in(root).unwrap();
        let checked = check_config(&write(&bounded.path().join("state"))).await;
        assert!(
            checked.says("ok: limits.disk 1073741824 bytes"),
            "{checked}"
        );
    }
}

/// A containerd older than every tested one (bullseye's 1.4, fetched by contrib/matrix/fetch.sh)
/// answers: check-config names its version and the oldest tested one as a warning, and still
/// passes the configuration.
#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_older_than_any_tested_is_a_warning_naming_the_oldest_tested() {
    let Some(bin_dir) = support::required("NARYA_TEST_OLD_CONTAINERD") else {
        return;
    };
    let old = PrivateContainerd::start_from(Some(Path::new(&bin_dir)));
    let dir = tempfile::tempdir().unwrap();
    let idp = IdentityProvider::start().await;
    let key = make_key(dir.path(), "idp", "P-256");
    idp.publish(&key.dev);
    let config = format!(
        "state_dir = {state:?}\n[listen]\nsocket = {socket:?}\n{identity}\n\
         [runtime]\ncontainerd_socket = {runtime:?}\n\n[image]\nreference = {reference:?}\n{LIMITS}",
        state = dir.path().join("state").display().to_string(),
        socket = dir.path().join("run/narya.sock").display().to_string(),
        identity = idp.identity_toml(""),
        runtime = old.socket.display().to_string(),
        reference = tiny_layout(dir.path()),
    );
    let path = dir.path().join("naryad.toml");
    std::fs::write(&path, config).unwrap();

    let checked = check_config(&path).await;
    assert_eq!(checked.code, Some(0), "{checked}");
    assert!(checked.problems().is_empty(), "{checked}");
    let warning = format!(
        "warning: runtime containerd at {} answers: version 1.4.",
        old.socket.display()
    );
    assert!(checked.says(&warning), "{checked}");
    assert!(
        checked
            .stdout
            .contains("the oldest tested containerd is 1.6.20"),
        "{checked}"
    );
    assert!(
        checked.stderr.contains(": no problems, 1 warning(s)"),
        "{checked}"
    );
}
