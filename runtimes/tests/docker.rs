//! The conformance suite against the real Docker engine and Podman's Docker-compatible service,
//! for both image sources: the official image as an OCI layout (loaded as a docker-archive) and
//! the same image in a registry (pulled by digest).

mod support;

use std::path::{Path, PathBuf};

use bollard::query_parameters::RemoveImageOptions;
use narya_oci::{Digest, ImageReference};
use narya_runtimes::docker::{Docker, DockerConfig};
use narya_runtimes::fetch::ImageFetcher;
use narya_runtimes::network::{Isolation, NetworkConfig};
use narya_runtimes::{ImageSource, Network, Runtime, Sandbox};

/// Each engine has one image store for both suites: they take turns, and each starts without
/// the image so that its own source is the one that brings it.
static ONE_DOCKER_SUITE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
static ONE_PODMAN_SUITE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const DOCKER: &str = "NARYA_TEST_DOCKER_SOCKET";
const PODMAN: &str = "NARYA_TEST_PODMAN_SOCKET";
/// Podman with runsc as its default runtime (`contrib/dev/services.sh`'s podman-gvisor).
const PODMAN_GVISOR: &str = "NARYA_TEST_PODMAN_GVISOR_SOCKET";

fn docker(socket: &Path, network: Option<NetworkConfig>, scratch: &Path) -> Docker {
    docker_under(socket, network, scratch, Sandbox::Container)
}

fn docker_under(
    socket: &Path,
    network: Option<NetworkConfig>,
    scratch: &Path,
    sandbox: Sandbox,
) -> Docker {
    let registry = std::env::var("NARYA_TEST_REGISTRY").unwrap_or_default();
    Docker::new(DockerConfig {
        socket: socket.to_owned(),
        insecure_registries: vec![registry],
        network,
        profile_dir: scratch.join("profiles"),
        sandbox,
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

/// A copy of the official image layout at `layout` in `out` that only this run uses: the same
/// layer under a configuration of its own (its `author` names this run), so its digest and its
/// engine image id are this run's. Forgetting it takes nothing from the daemons and suites that
/// share the engine and run the official image meanwhile. Answers the copy's manifest digest.
fn private_copy(layout: &Path, out: &Path) -> Digest {
    let original = narya_oci::layout::Layout::open(layout).expect("the official image layout");
    let (_, manifest_bytes) = original
        .manifest(&original.resolve().expect("a linux/amd64 manifest"))
        .expect("the official image's manifest");
    let mut manifest: serde_json::Value = serde_json::from_slice(&manifest_bytes).unwrap();
    let blobs = out.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let write_blob = |bytes: &[u8]| {
        let digest = Digest::of(bytes);
        std::fs::write(blobs.join(digest.hex()), bytes).unwrap();
        (digest, bytes.len())
    };
    for layer in manifest["layers"].as_array().unwrap() {
        let digest: Digest = layer["digest"].as_str().unwrap().parse().unwrap();
        let (from, to) = (original.blob_path(&digest), blobs.join(digest.hex()));
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).unwrap();
        }
    }
    let config_digest: Digest = manifest["config"]["digest"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&original.read_blob(&config_digest).unwrap()).unwrap();
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    config["author"] = format!(
        "narya runtimes conformance, run {}-{run}",
        std::process::id()
    )
    .into();
    let (config_digest, config_size) = write_blob(&serde_json::to_vec(&config).unwrap());
    manifest["config"]["digest"] = config_digest.to_string().into();
    manifest["config"]["size"] = config_size.into();
    let (manifest_digest, manifest_size) = write_blob(&serde_json::to_vec(&manifest).unwrap());
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    index["manifests"] = serde_json::json!([{
        "mediaType": manifest["mediaType"],
        "digest": manifest_digest.to_string(),
        "size": manifest_size,
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"org.opencontainers.image.ref.name": "official"},
    }]);
    std::fs::write(out.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::copy(layout.join("oci-layout"), out.join("oci-layout")).unwrap();
    manifest_digest
}

/// What a daemon before Podman's networks were made through its own API left on Podman: the
/// run's network made through Podman's Docker-compatible create, which turns Podman's DNS on
/// (Podman 5 then names only aardvark-dns in machines' resolv.conf). The suite's daemon finds it
/// with no machine on it and must make it again without DNS, or
/// `network/resolv_conf_names_the_resolvers` fails.
async fn network_of_an_older_daemon(socket: &Path, config: &NetworkConfig) {
    let isolation = Isolation::new(config.clone()).expect("the run's network configuration");
    let client = bollard::Docker::connect_with_unix(
        &socket.display().to_string(),
        60,
        &bollard::ClientVersion {
            major_version: 1,
            minor_version: 41,
        },
    )
    .expect("a client for the engine");
    let request = bollard::models::NetworkCreateRequest {
        name: isolation.docker_network(),
        driver: Some("bridge".to_owned()),
        ipam: Some(bollard::models::Ipam {
            driver: Some("default".to_owned()),
            config: Some(vec![bollard::models::IpamConfig {
                subnet: Some(config.subnet.to_string()),
                gateway: Some(config.subnet.gateway().to_string()),
                ..Default::default()
            }]),
            options: None,
        }),
        enable_ipv6: Some(false),
        options: Some(std::collections::HashMap::from([
            (
                "com.docker.network.bridge.name".to_owned(),
                isolation.bridge(),
            ),
            (
                "com.docker.network.bridge.enable_icc".to_owned(),
                "false".to_owned(),
            ),
        ])),
        labels: Some(std::collections::HashMap::from([(
            "dev.narya.network".to_owned(),
            config.tag.clone(),
        )])),
        ..Default::default()
    };
    client
        .create_network(request)
        .await
        .expect("the network an older daemon made");
}

/// Pushes the layout at `layout` to `reference` in the test registry.
fn push(layout: &Path, reference: &str) {
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
        "pushing to {reference}: {}",
        String::from_utf8_lossy(&pushed.stderr)
    );
}

/// Where this run's suites find their image: this run's copy of the official image, as a
/// layout (`registry` false) or pushed to a repository of this run's in the test registry.
fn private_reference(registry: bool, scratch: &Path, prefix: &str) -> Option<ImageReference> {
    let layout = support::required("NARYA_TEST_IMAGE_LAYOUT")?;
    let copy = scratch.join("image");
    private_copy(Path::new(&layout), &copy);
    let reference = if registry {
        let host = support::required("NARYA_TEST_REGISTRY")?;
        let reference = format!("{host}/narya-test/{prefix}-{}:test", std::process::id());
        push(&copy, &reference);
        reference
    } else {
        format!("oci-layout:{}", copy.display())
    };
    Some(reference.parse().expect("an image reference"))
}

/// The suite against this back end with the image from `reference`; skipped (outside CI) when
/// the variables name no such image.
async fn run_suite(registry: bool, prefix: &str, engine: &str, sandbox: Option<Sandbox>) {
    let Some(sandbox) = sandbox else {
        return;
    };
    let scratch = support::scratch();
    let Some(reference) = private_reference(registry, scratch.path(), prefix) else {
        return;
    };
    let Some(socket) = support::required(engine) else {
        return;
    };
    let socket = PathBuf::from(socket);
    let isolated = support::Isolated::new(scratch.path(), Some(&socket));
    let runtime = docker_under(
        &socket,
        Some(isolated.config.clone()),
        scratch.path(),
        sandbox.clone(),
    );
    let Some(version) = support::answering(&runtime, &socket.display().to_string()).await else {
        return;
    };
    eprintln!("docker: {version}");
    if engine == PODMAN {
        network_of_an_older_daemon(&socket, &isolated.config).await;
    }
    let _turn = match engine {
        PODMAN => Some(ONE_PODMAN_SUITE_AT_A_TIME.lock().await),
        DOCKER => Some(ONE_DOCKER_SUITE_AT_A_TIME.lock().await),
        _ => None,
    };
    let registry = std::env::var("NARYA_TEST_REGISTRY").unwrap_or_default();
    let fetcher = ImageFetcher::new(vec![registry]).expect("an image fetcher");
    let digest = fetcher
        .resolve(&reference)
        .await
        .expect("the official image resolves");
    forget_image(&socket, &fetcher, &reference, &digest).await;
    let unreachable = docker(&scratch.path().join("nobody.sock"), None, scratch.path());
    let fixture = support::fixture(
        reference,
        scratch.path(),
        support::prefix(prefix),
        std::sync::Arc::new(unreachable),
        Network::Isolated,
        Some(isolated.outside.addr),
        support::Engine { version, sandbox },
    );
    support::run_and_judge(&runtime, &fixture).await;
    forget_image(&socket, &fetcher, &fixture.image.reference, &digest).await;
    runtime.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_with_the_image_from_an_oci_layout() {
    run_suite(false, "dl", DOCKER, Some(Sandbox::Container)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_with_the_image_from_a_registry() {
    run_suite(true, "dr", DOCKER, Some(Sandbox::Container)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn podman_conformance_with_the_image_from_an_oci_layout() {
    run_suite(false, "pl", PODMAN, Some(Sandbox::Container)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn podman_conformance_with_the_image_from_a_registry() {
    run_suite(true, "pr", PODMAN, Some(Sandbox::Container)).await;
}

/// Every group, and the sandbox group, with machines under gVisor (the engine's `runsc`).
#[tokio::test(flavor = "multi_thread")]
async fn conformance_under_gvisor() {
    run_suite(false, "dg", DOCKER, support::gvisor("runsc")).await;
}

/// Every group, and the sandbox group, on a Podman whose default runtime is runsc: the one way
/// Podman runs machines under gVisor (see the next test). Not named for the matrix's
/// `conformance` filter: this Podman is the host's, whichever engines the matrix points at.
#[tokio::test(flavor = "multi_thread")]
async fn podman_with_runsc_as_its_default_passes_every_group_under_gvisor() {
    run_suite(false, "pg", PODMAN_GVISOR, support::gvisor("runsc")).await;
}

/// Podman's API ignores the runtime a container asks for (Podman issue 28429): gVisor on a
/// Podman whose default runtime is runc is refused, never run on runc.
#[tokio::test(flavor = "multi_thread")]
async fn podman_under_gvisor_is_refused_unless_runsc_is_its_default() {
    let Some(sandbox) = support::gvisor("runsc") else {
        return;
    };
    let Some(socket) = support::required(PODMAN) else {
        return;
    };
    let scratch = support::scratch();
    let runtime = docker_under(Path::new(&socket), None, scratch.path(), sandbox);
    let e = runtime
        .version()
        .await
        .expect_err("a Podman running runc by default refuses gVisor");
    let message = e.to_string();
    assert!(
        message.contains("28429") && message.contains("runtime = \"runsc\""),
        "{message}"
    );
}

/// A Podman that makes a machine meant for gVisor under runc anyway (its default changed after
/// the check above, or the check was never made) has that machine refused at create and
/// removed: nothing of it runs, and nothing is left in the engine.
#[tokio::test(flavor = "multi_thread")]
async fn podman_making_a_gvisor_machine_under_runc_has_it_refused_and_removed() {
    let Some(sandbox) = support::gvisor("runsc") else {
        return;
    };
    let Some(socket) = support::required(PODMAN) else {
        return;
    };
    let scratch = support::scratch();
    let Some(reference) = private_reference(false, scratch.path(), "pw") else {
        return;
    };
    let runtime = docker_under(Path::new(&socket), None, scratch.path(), sandbox);
    // The suites on this engine each start without the image: this test takes its turn.
    let _turn = ONE_PODMAN_SUITE_AT_A_TIME.lock().await;
    let image = runtime
        .ensure_image(&ImageSource {
            reference,
            pinned: None,
        })
        .await
        .expect("the official image");
    let id = format!("{}-wrong-runtime", support::prefix("pw"));
    let spec = support::machine_spec(&id, "pw", image, scratch.path(), Network::None);
    let _removal = RemovedOnDrop {
        socket: socket.clone(),
        name: id.clone(),
    };
    let e = runtime
        .create_machine(&spec)
        .await
        .expect_err("a machine this Podman would run under runc");
    let message = e.to_string();
    assert!(
        message.contains("under \"runc\", not the runtime \"runsc\"")
            && message.contains("it was removed")
            && message.contains("28429"),
        "{message}"
    );
    let machines = runtime.list().await.expect("the engine's machines");
    assert!(machines.iter().all(|m| m.id != id), "{machines:?}");
    let client = bollard::Docker::connect_with_unix(
        &socket,
        60,
        &bollard::ClientVersion {
            major_version: 1,
            minor_version: 41,
        },
    )
    .expect("a client for the engine");
    let inspected = client
        .inspect_container(
            &id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await;
    assert!(
        matches!(
            inspected,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            })
        ),
        "the refused container is still in the engine: {inspected:?}"
    );
}

/// Removes container `name` from the engine on `socket` when dropped: what a test that failed
/// midway would otherwise leave running.
struct RemovedOnDrop {
    socket: String,
    name: String,
}

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let url = format!("http://d/containers/{}?force=true&v=true", self.name);
        let _ = std::process::Command::new("curl")
            .args(["-sS", "-X", "DELETE", "--unix-socket", &self.socket, &url])
            .output();
    }
}
