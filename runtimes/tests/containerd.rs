//! The conformance suite against the real containerd, for both image sources: the official
//! image as an OCI layout and the same image in a registry.

use std::path::PathBuf;

use narya_oci::ImageReference;
use narya_runtimes::conformance::{self, Fixture};
use narya_runtimes::containerd::{Containerd, ContainerdConfig};
use narya_runtimes::Runtime as _;
use narya_runtimes::{ImageSource, Network, User};

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

async fn run_suite(reference: ImageReference, namespace: &str) {
    let Some(socket) = required("NARYA_TEST_CONTAINERD_SOCKET") else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let runtime = containerd(&socket, namespace, scratch.path());
    if let Err(e) = runtime.version().await {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "containerd is not answering: {e}"
        );
        eprintln!("skipped: containerd is not answering on {socket}: {e}");
        return;
    }
    let fixture = Fixture {
        image: ImageSource {
            reference,
            pinned: None,
        },
        scratch: scratch.path().join("workspaces"),
        user: User {
            uid: 1000,
            gid: 1000,
        },
        network: Network::Host,
        mount_point: "/workspace".to_owned(),
        prefix: format!("conf-{namespace}"),
        unreachable: Some(std::sync::Arc::new(containerd(
            &scratch.path().join("nobody.sock").display().to_string(),
            namespace,
            scratch.path(),
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
        panic!("conformance against containerd:\n{failed}");
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
    run_suite(reference, "narya-conformance-layout").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_with_the_image_from_a_registry() {
    let Some(reference) = required("NARYA_TEST_IMAGE_REF") else {
        return;
    };
    let reference = reference.parse().expect("a registry reference");
    run_suite(reference, "narya-conformance-registry").await;
}
