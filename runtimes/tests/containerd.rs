//! The conformance suite against the real containerd, for both image sources: the official
//! image as an OCI layout and the same image in a registry.

mod support;

use std::path::PathBuf;

use narya_oci::ImageReference;
use narya_runtimes::containerd::{Containerd, ContainerdConfig};
use narya_runtimes::network::NetworkConfig;
use narya_runtimes::{Network, Runtime};

fn containerd(
    socket: &str,
    namespace: &str,
    scratch: &std::path::Path,
    network: Option<NetworkConfig>,
) -> Containerd {
    let registry = std::env::var("NARYA_TEST_REGISTRY").unwrap_or_default();
    Containerd::new(ContainerdConfig {
        socket: PathBuf::from(socket),
        namespace: namespace.to_owned(),
        snapshotter: "overlayfs".to_owned(),
        insecure_registries: vec![registry],
        fifo_dir: scratch.join("fifo"),
        network,
    })
    .expect("the containerd back end builds")
}

/// The suite against this back end with the image from `reference`; skipped (outside CI) when
/// the variables name no such image.
async fn run_suite(reference: Option<ImageReference>, namespace: &str) {
    let Some(reference) = reference else {
        return;
    };
    let Some(socket) = support::required("NARYA_TEST_CONTAINERD_SOCKET") else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let isolated = support::Isolated::new(scratch.path(), None);
    let runtime = containerd(
        &socket,
        namespace,
        scratch.path(),
        Some(isolated.config.clone()),
    );
    if support::answering(&runtime, &socket).await.is_none() {
        return;
    }
    let unreachable = containerd(
        &scratch.path().join("nobody.sock").display().to_string(),
        namespace,
        scratch.path(),
        None,
    );
    let fixture = support::fixture(
        reference,
        scratch.path(),
        format!("conf-{namespace}"),
        std::sync::Arc::new(unreachable),
        Network::Isolated,
        Some(isolated.outside.addr),
    );
    support::run_and_judge(&runtime, &fixture).await;
    let left = runtime
        .isolation()
        .map(|i| i.leftovers())
        .unwrap_or_default();
    assert_eq!(
        left,
        Default::default(),
        "the suite's machines left network state behind"
    );
    runtime.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_with_the_image_from_an_oci_layout() {
    run_suite(support::layout_reference(), "narya-conformance-layout").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_with_the_image_from_a_registry() {
    run_suite(support::registry_reference(), "narya-conformance-registry").await;
}

/// What the host holds for machines on `subnet`: host-side interfaces carrying its gateway
/// (`ptp` puts it on each), and routes into it.
fn held_on_host(subnet: narya_runtimes::network::Subnet) -> (usize, usize) {
    let out = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .expect("ip runs");
    let gateway = format!("inet {}/", subnet.gateway());
    let interfaces = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&gateway))
        .count();
    let out = std::process::Command::new("ip")
        .args(["-4", "route", "show"])
        .output()
        .expect("ip runs");
    let routes = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|dest| dest.split('/').next()?.parse().ok())
        .filter(|ip| subnet.contains(*ip))
        .count();
    (interfaces, routes)
}

/// Creates and removes isolated machines 200 times: no interface, route, namespace file or
/// address reservation is left afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_isolated_creates_and_removes_leave_nothing_behind() {
    let Some(reference) = support::layout_reference() else {
        return;
    };
    let Some(socket) = support::required("NARYA_TEST_CONTAINERD_SOCKET") else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let isolated = support::Isolated::new(scratch.path(), None);
    let subnet = isolated.config.subnet;
    let runtime = containerd(
        &socket,
        "narya-conformance-leak",
        scratch.path(),
        Some(isolated.config.clone()),
    );
    if support::answering(&runtime, &socket).await.is_none() {
        return;
    }
    let image = runtime
        .ensure_image(&narya_runtimes::ImageSource {
            reference,
            pinned: None,
        })
        .await
        .expect("the official image");
    let workspace = scratch.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let before = held_on_host(subnet);
    let isolation = runtime.isolation().expect("isolated networking");
    let pid = std::process::id();
    for n in 0..200 {
        let id = format!("leak-{pid}-{n}");
        let spec = narya_runtimes::MachineSpec {
            id: id.clone(),
            environment: id.clone(),
            organisation: format!("leak-{pid}"),
            image: image.clone(),
            workspace: workspace.clone(),
            mount_point: "/workspace".to_owned(),
            user: narya_runtimes::User {
                uid: 1000,
                gid: 1000,
            },
            network: Network::Isolated,
            labels: Default::default(),
        };
        let made = runtime.create_machine(&spec).await;
        let removed = runtime.remove(&id).await;
        made.unwrap_or_else(|e| panic!("cycle {n}: create: {e}"));
        removed.unwrap_or_else(|e| panic!("cycle {n}: remove: {e}"));
    }
    assert_eq!(held_on_host(subnet), before, "interfaces and routes left");
    assert_eq!(
        isolation.leftovers(),
        Default::default(),
        "namespaces or reservations left"
    );
    runtime.shutdown().await.unwrap();
}
