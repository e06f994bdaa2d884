//! The conformance suite against the real containerd, for both image sources: the official
//! image as an OCI layout and the same image in a registry.

mod support;

use std::path::PathBuf;

use narya_oci::ImageReference;
use narya_runtimes::containerd::{Containerd, ContainerdConfig};

fn containerd(socket: &str, namespace: &str, scratch: &std::path::Path) -> Containerd {
    let registry = std::env::var("NARYA_TEST_REGISTRY").unwrap_or_default();
    Containerd::new(ContainerdConfig {
        socket: PathBuf::from(socket),
        namespace: namespace.to_owned(),
        snapshotter: "overlayfs".to_owned(),
        insecure_registries: vec![registry],
        fifo_dir: scratch.join("fifo"),
    })
    .expect("the containerd back end builds")
}

/// The suite against this back end with the image from `reference`; skipped (outside CI) when
/// the variables name no such image.
async fn run_suite(reference: Option<ImageReference>, namespace: &str, prefix: &str) {
    let Some(reference) = reference else {
        return;
    };
    let Some(socket) = support::required("NARYA_TEST_CONTAINERD_SOCKET") else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let runtime = containerd(&socket, namespace, scratch.path());
    let Some(version) = support::answering(&runtime, &socket).await else {
        return;
    };
    let unreachable = containerd(
        &scratch.path().join("nobody.sock").display().to_string(),
        namespace,
        scratch.path(),
    );
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
    run_suite(
        support::layout_reference(),
        "narya-conformance-layout",
        "cl",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_with_the_image_from_a_registry() {
    run_suite(
        support::registry_reference(),
        "narya-conformance-registry",
        "cr",
    )
    .await;
}
