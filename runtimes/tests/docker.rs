//! The conformance suite against the real Docker engine, for both image sources: the official
//! image as an OCI layout (loaded as a docker-archive) and the same image in a registry (pulled
//! by digest).

use std::path::{Path, PathBuf};

use bollard::query_parameters::RemoveImageOptions;
use narya_oci::{Digest, ImageReference};
use narya_runtimes::conformance::{self, Fixture};
use narya_runtimes::docker::{Docker, DockerConfig};
use narya_runtimes::fetch::ImageFetcher;
use narya_runtimes::Runtime as _;
use narya_runtimes::{ImageSource, Network, User};

/// The engine has one image store for both suites: they take turns, and each starts without the
/// image so that its own source is the one that brings it.
static ONE_SUITE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The value of `var`, or a skip (outside CI) / failure (under CI=true) naming what is missing.
fn required(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            let message = format!(
                "{var} is not set: start the services and build the image with contrib/test.sh"
            );
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{message} (CI=true: not skipping)"
            );
            eprintln!("skipped: {message}");
            None
        }
    }
}

fn docker(socket: &Path) -> Docker {
    let registry = std::env::var("NARYA_TEST_REGISTRY").unwrap_or_default();
    Docker::new(DockerConfig {
        socket: socket.to_owned(),
        insecure_registries: vec![registry],
    })
    .expect("the Docker back end builds")
}

/// Removes the image pinned to `digest` from the engine under every name (whichever suite
/// brought it), so the next `ensure_image` has to fetch it from its own source.
async fn forget_image(
    socket: &Path,
    fetcher: &ImageFetcher,
    reference: &ImageReference,
    digest: &Digest,
) {
    let (manifest, _) = fetcher
        .manifest(reference, digest)
        .await
        .expect("the official image's manifest");
    let client = bollard::Docker::connect_with_unix(
        &socket.display().to_string(),
        60,
        &bollard::ClientVersion {
            major_version: 1,
            minor_version: 41,
        },
    )
    .expect("a client for the engine");
    let options = RemoveImageOptions {
        force: true,
        noprune: false,
    };
    // By image id, which takes every tag and digest reference with it; absent is fine.
    let _ = client
        .remove_image(&manifest.config.digest.to_string(), Some(options), None)
        .await;
}

async fn run_suite(reference: ImageReference, prefix: &str) {
    let Some(socket) = required("NARYA_TEST_DOCKER_SOCKET") else {
        return;
    };
    let socket = PathBuf::from(socket);
    let scratch = tempfile::tempdir().unwrap();
    let runtime = docker(&socket);
    match runtime.version().await {
        Ok(version) => eprintln!("docker: {version}"),
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "dockerd is not answering: {e}"
            );
            eprintln!(
                "skipped: dockerd is not answering on {}: {e}",
                socket.display()
            );
            return;
        }
    }
    let _turn = ONE_SUITE_AT_A_TIME.lock().await;
    let image = ImageSource {
        reference: reference.clone(),
        pinned: None,
    };
    let registry = std::env::var("NARYA_TEST_REGISTRY").unwrap_or_default();
    let fetcher = ImageFetcher::new(vec![registry]).expect("an image fetcher");
    let digest = fetcher
        .resolve(&reference)
        .await
        .expect("the official image resolves");
    forget_image(&socket, &fetcher, &reference, &digest).await;
    let fixture = Fixture {
        image,
        scratch: scratch.path().join("workspaces"),
        user: User {
            uid: 1000,
            gid: 1000,
        },
        network: Network::Host,
        mount_point: "/workspace".to_owned(),
        prefix: prefix.to_owned(),
        unreachable: Some(std::sync::Arc::new(docker(
            &scratch.path().join("nobody.sock"),
        ))),
    };
    std::fs::create_dir_all(&fixture.scratch).unwrap();
    let reports = conformance::run(&runtime, &fixture).await;
    if let Err(failed) = conformance::print_and_judge(
        &reports,
        // Straight to the process's stderr, past the test harness's capture: CI's log names
        // every case, passed or not.
        &mut std::io::stderr(),
    ) {
        panic!("conformance against Docker:\n{failed}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_with_the_image_from_an_oci_layout() {
    let Some(layout) = required("NARYA_TEST_IMAGE_LAYOUT") else {
        return;
    };
    let reference = format!("oci-layout:{layout}")
        .parse()
        .expect("a layout reference");
    run_suite(reference, "dconf-layout").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_with_the_image_from_a_registry() {
    let Some(reference) = required("NARYA_TEST_IMAGE_REF") else {
        return;
    };
    let reference = reference.parse().expect("a registry reference");
    run_suite(reference, "dconf-registry").await;
}
