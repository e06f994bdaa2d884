//! The conformance suite against the real containerd, for both image sources: the official
//! image as an OCI layout and the same image in a registry; and what containerd alone can leave
//! behind for a machine's name.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;

use narya_oci::ImageReference;
use narya_runtimes::containerd::{Containerd, ContainerdConfig};
use narya_runtimes::network::NetworkConfig;
use narya_runtimes::{ImageSource, MachineState, Network, Runtime, Sandbox};

fn containerd(
    socket: &str,
    namespace: &str,
    scratch: &std::path::Path,
    network: Option<NetworkConfig>,
) -> Containerd {
    containerd_under(socket, namespace, scratch, network, Sandbox::Container)
}

fn containerd_under(
    socket: &str,
    namespace: &str,
    scratch: &std::path::Path,
    network: Option<NetworkConfig>,
    sandbox: Sandbox,
) -> Containerd {
    let registry = std::env::var("NARYA_TEST_REGISTRY").unwrap_or_default();
    Containerd::new(ContainerdConfig {
        socket: PathBuf::from(socket),
        namespace: namespace.to_owned(),
        snapshotter: "overlayfs".to_owned(),
        insecure_registries: vec![registry],
        fifo_dir: scratch.join("fifo"),
        network,
        sandbox,
    })
    .expect("the containerd back end builds")
}

/// The official image as an OCI layout, when the variables name one.
fn layout_reference() -> Option<ImageReference> {
    let layout = support::required("NARYA_TEST_IMAGE_LAYOUT")?;
    Some(
        format!("oci-layout:{layout}")
            .parse()
            .expect("a layout reference"),
    )
}

/// The official image in a registry, when the variables name one.
fn registry_reference() -> Option<ImageReference> {
    let reference = support::required("NARYA_TEST_IMAGE_REF")?;
    Some(reference.parse().expect("a registry reference"))
}

/// The suite against this back end with the image from `reference`; skipped (outside CI) when
/// the variables name no such image.
async fn run_suite(
    reference: Option<ImageReference>,
    namespace: &str,
    prefix: &str,
    sandbox: Option<Sandbox>,
) {
    let Some(reference) = reference else {
        return;
    };
    let Some(sandbox) = sandbox else {
        return;
    };
    let Some(socket) = support::required("NARYA_TEST_CONTAINERD_SOCKET") else {
        return;
    };
    let scratch = support::scratch();
    let isolated = support::Isolated::new(scratch.path(), None);
    let runtime = containerd_under(
        &socket,
        namespace,
        scratch.path(),
        Some(isolated.config.clone()),
        sandbox.clone(),
    );
    let Some(version) = support::answering(&runtime, &socket).await else {
        return;
    };
    let unreachable = containerd(
        &scratch.path().join("nobody.sock").display().to_string(),
        namespace,
        scratch.path(),
        None,
    );
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
    run_suite(
        layout_reference(),
        "narya-conformance-layout",
        "cl",
        Some(Sandbox::Container),
    )
    .await;
}

/// Every group, and the sandbox group, with machines under gVisor.
#[tokio::test(flavor = "multi_thread")]
async fn conformance_under_gvisor() {
    run_suite(
        layout_reference(),
        "narya-conformance-gvisor",
        "cg",
        support::gvisor("/usr/bin/runsc"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_with_the_image_from_a_registry() {
    run_suite(
        registry_reference(),
        "narya-conformance-registry",
        "cr",
        Some(Sandbox::Container),
    )
    .await;
}

/// The socket, containerd in `namespace` (host networking) and the official image from its
/// layout pinned there; `None` when skipped (outside CI).
async fn with_the_image(
    namespace: &str,
    scratch: &std::path::Path,
) -> Option<(String, Containerd, narya_runtimes::PinnedImage)> {
    let reference = layout_reference()?;
    let socket = support::required("NARYA_TEST_CONTAINERD_SOCKET")?;
    let runtime = containerd(&socket, namespace, scratch, None);
    support::answering(&runtime, &socket).await?;
    let image = runtime
        .ensure_image(&ImageSource {
            reference,
            pinned: None,
        })
        .await
        .expect("the official image");
    Some((socket, runtime, image))
}

/// Deletes container record `id` of `namespace` straight through containerd's API, leaving
/// its task running, as a removal from outside racing a restart of the machine can.
async fn delete_only_the_record(socket: &str, namespace: &str, id: &str) {
    use containerd_client::services::v1::containers_client::ContainersClient;
    use containerd_client::services::v1::DeleteContainerRequest;
    let channel = containerd_client::connect(socket).await.unwrap();
    let mut request = tonic::Request::new(DeleteContainerRequest { id: id.to_owned() });
    request
        .metadata_mut()
        .insert("containerd-namespace", namespace.parse().unwrap());
    ContainersClient::new(channel)
        .delete(request)
        .await
        .expect("containerd deletes a container record whose task runs");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_that_outlived_its_container_does_not_block_a_new_machine_of_its_name() {
    let scratch = tempfile::tempdir().unwrap();
    // Shared by every run of this test (the image stays for the next); the machine is this
    // process's own.
    let namespace = "narya-runtime-tests";
    let Some((socket, runtime, image)) = with_the_image(namespace, scratch.path()).await else {
        return;
    };
    let id = format!("outlived-{}", std::process::id());
    let _removal = support::Removal {
        socket: socket.clone(),
        namespace: namespace.to_owned(),
        id: id.clone(),
    };
    let spec = support::machine_spec(&id, namespace, image, scratch.path(), Network::Host);
    runtime.create_machine(&spec).await.unwrap();
    delete_only_the_record(&socket, namespace, &id).await;
    assert_eq!(runtime.inspect(&id).await.unwrap(), MachineState::Missing);
    let tasks = std::process::Command::new("ctr")
        .args([
            "--address",
            &socket,
            "--namespace",
            namespace,
            "tasks",
            "ls",
        ])
        .output()
        .expect("ctr runs");
    assert!(
        String::from_utf8_lossy(&tasks.stdout).contains(&id),
        "the task outlived its record: {}",
        String::from_utf8_lossy(&tasks.stdout)
    );

    // What a replace does: remove whatever is left, make the machine again.
    runtime.remove(&id).await.unwrap();
    runtime
        .create_machine(&spec)
        .await
        .expect("a machine made again over a task that outlived its record");
    assert_eq!(runtime.inspect(&id).await.unwrap(), MachineState::Running);
    runtime.remove(&id).await.unwrap();
    assert_eq!(runtime.inspect(&id).await.unwrap(), MachineState::Missing);
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
    let Some(reference) = layout_reference() else {
        return;
    };
    let Some(socket) = support::required("NARYA_TEST_CONTAINERD_SOCKET") else {
        return;
    };
    let scratch = support::scratch();
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
            limits: support::test_limits(),
            pool: None,
            labels: Default::default(),
            layer: None,
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

/// Spins `threads` busy loops on the host until dropped, so containerd's shims run starved as
/// on a loaded CI machine.
struct BusyHost {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyHost {
    fn new(threads: usize) -> BusyHost {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        BusyHost { stop, threads }
    }
}

impl Drop for BusyHost {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// `output`'s lines, sorted.
fn lines(output: &[u8]) -> Vec<String> {
    let mut lines: Vec<String> = String::from_utf8_lossy(output)
        .split_inclusive('\n')
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// Two hundred execs, sixteen at a time, on a host kept busy: every one answers exactly what it
/// wrote (containerd reports an exec's exit before its shim has copied the output, and deleting
/// the exec stops that copy).
#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_execs_on_a_busy_host_each_answer_their_whole_output() {
    use futures_util::StreamExt;
    let scratch = tempfile::tempdir().unwrap();
    let namespace = "narya-test-output";
    let Some((socket, runtime, image)) = with_the_image(namespace, scratch.path()).await else {
        return;
    };
    let id = format!("output-{}", std::process::id());
    let _removal = support::Removal {
        socket: socket.clone(),
        namespace: namespace.to_owned(),
        id: id.clone(),
    };
    runtime
        .create_machine(&support::machine_spec(
            &id,
            &id,
            image,
            scratch.path(),
            Network::None,
        ))
        .await
        .expect("the machine");
    let busy = BusyHost::new(4);
    let runtime = &runtime;
    let id = id.as_str();
    let wrong: Vec<String> = futures_util::stream::iter(0..200)
        .map(|n| async move {
            let out = runtime
                .run(
                    id,
                    &narya_runtimes::ProcessSpec {
                        argv: vec![
                            "/bin/sh".into(),
                            "-c".into(),
                            format!("echo out-{n}; cut -d' ' -f1 /proc/1/stat; echo err-{n} >&2"),
                        ],
                        env: BTreeMap::new(),
                        cwd: None,
                        timeout: std::time::Duration::from_secs(120),
                        output_limit: 4096,
                        stdin: None,
                        output: None,
                    },
                )
                .await;
            (n, out)
        })
        .buffer_unordered(16)
        .filter_map(|(n, out)| async move {
            // stdout and stderr reach the FIFO through pipes of their own: either may come first.
            let mut want = [format!("out-{n}\n"), "1\n".to_owned(), format!("err-{n}\n")];
            want.sort();
            match out {
                Ok(out) if out.exit_code == Some(0) && lines(&out.output) == want => None,
                other => Some(format!("#{n}: {other:?}")),
            }
        })
        .collect()
        .await;
    drop(busy);
    runtime.remove(id).await.unwrap();
    assert!(wrong.is_empty(), "{} of 200 execs: {wrong:#?}", wrong.len());
    runtime.shutdown().await.unwrap();
}
