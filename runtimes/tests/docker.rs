//! The conformance suite against the real Docker engine and Podman's Docker-compatible service,
//! for both image sources: the official image as an OCI layout (loaded as a docker-archive) and
//! the same image in a registry (pulled by digest).

mod support;

use std::path::{Path, PathBuf};

use bollard::query_parameters::RemoveImageOptions;
use narya_oci::{Digest, ImageReference};
use narya_runtimes::docker::{Docker, DockerConfig};
use narya_runtimes::fetch::ImageFetcher;

/// Each engine has one image store for both suites: they take turns, and each starts without
/// the image so that its own source is the one that brings it.
static ONE_DOCKER_SUITE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
static ONE_PODMAN_SUITE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const DOCKER: &str = "NARYA_TEST_DOCKER_SOCKET";
const PODMAN: &str = "NARYA_TEST_PODMAN_SOCKET";

fn docker(socket: &Path, scratch: &Path) -> Docker {
    let registry = std::env::var("NARYA_TEST_REGISTRY").unwrap_or_default();
    Docker::new(DockerConfig {
        socket: socket.to_owned(),
        insecure_registries: vec![registry],
        profile_dir: scratch.join("profiles"),
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

/// The suite against this back end with the image from `reference`; skipped (outside CI) when
/// the variables name no such image.
async fn run_suite(reference: Option<ImageReference>, prefix: &str, engine: &str) {
    let Some(reference) = reference else {
        return;
    };
    let Some(socket) = support::required(engine) else {
        return;
    };
    let socket = PathBuf::from(socket);
    let scratch = tempfile::tempdir().unwrap();
    let runtime = docker(&socket, scratch.path());
    let Some(version) = support::answering(&runtime, &socket.display().to_string()).await else {
        return;
    };
    eprintln!("docker: {version}");
    let _turn = if engine == PODMAN {
        ONE_PODMAN_SUITE_AT_A_TIME.lock().await
    } else {
        ONE_DOCKER_SUITE_AT_A_TIME.lock().await
    };
    let registry = std::env::var("NARYA_TEST_REGISTRY").unwrap_or_default();
    let fetcher = ImageFetcher::new(vec![registry]).expect("an image fetcher");
    let digest = fetcher
        .resolve(&reference)
        .await
        .expect("the official image resolves");
    forget_image(&socket, &fetcher, &reference, &digest).await;
    let unreachable = docker(&scratch.path().join("nobody.sock"), scratch.path());
    let fixture = support::fixture(
        reference,
        scratch.path(),
        support::prefix(prefix),
        std::sync::Arc::new(unreachable),
        &version,
    );
    support::run_and_judge(&runtime, &fixture).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_with_the_image_from_an_oci_layout() {
    run_suite(support::layout_reference(), "dl", DOCKER).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_with_the_image_from_a_registry() {
    run_suite(support::registry_reference(), "dr", DOCKER).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn podman_conformance_with_the_image_from_an_oci_layout() {
    run_suite(support::layout_reference(), "pl", PODMAN).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn podman_conformance_with_the_image_from_a_registry() {
    run_suite(support::registry_reference(), "pr", PODMAN).await;
}
