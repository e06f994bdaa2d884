//! The pool of started machines end to end, on the real runtimes: creates served from machines
//! started before the request, the pool refilled, never a machine of an old digest served,
//! nothing pooled and claimed at once after a crash, and pooled environments isolated like any.

mod machines;
#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use narya_runtimes::conformance::Outside;
use narya_runtimes::MachineState;
use serde_json::json;
use support::e2e::{body, create, delete, exec, get, unique_id, until, Backend, Host};
use support::github::GitHubDouble;
use support::network::{address_of, connect, DROPPED};

use machines::{
    claimed_machine, clean_up, full_pool, pool_dir, pool_machines, unclaimed, PoolHost,
    REFILLED_WITHIN,
};

/// Two machines kept started, with the limits every test daemon has.
const POOL_OF_TWO: &str = "[pool]\nsize = 2\n";

async fn two_creates_are_served_from_the_pool_a_third_is_made_and_the_pool_refills(
    backend: Backend,
) {
    let Some(host) = Host::start_on(backend, POOL_OF_TWO).await else {
        return;
    };
    let host = PoolHost(Some(host));
    let started_before = full_pool(&host, 2).await;
    let client = host.acme();
    let ids: Vec<String> = (0..3).map(|n| unique_id(&format!("pooled-{n}"))).collect();
    let creates: Vec<_> = ids
        .iter()
        .map(|id| {
            let client = client.clone();
            let body = json!({ "id": id });
            tokio::spawn(async move { create(&client, body).await })
        })
        .collect();
    for create in creates {
        let answer = create.await.unwrap();
        assert_eq!(answer.status, StatusCode::CREATED, "{:?}", body(&answer));
        assert_eq!(body(&answer)["status"], "ready");
    }
    let served: Vec<Option<String>> = ids.iter().map(|id| claimed_machine(&host, id)).collect();
    let from_pool: BTreeSet<String> = served.iter().flatten().cloned().collect();
    assert_eq!(
        from_pool, started_before,
        "two creates were served the machines started before the requests: {served:?}"
    );
    let made = ids
        .iter()
        .zip(&served)
        .find(|(_, machine)| machine.is_none())
        .map(|(id, _)| id.clone())
        .expect("a third create made its own machine");
    assert_eq!(host.state(&made).await, MachineState::Running);

    for id in &ids {
        let answer = exec(&client, id, &["sh", "-c", "id -u; pwd; ls -A | wc -l"]).await;
        let result = body(&answer);
        assert_eq!(result["exit_code"], 0, "{result}");
        assert_eq!(result["output"], "1000\n/workspace\n0\n", "{id}: {result}");
    }
    // The creates ran at once: whichever two the pool served.
    let (pooled, machine) = ids
        .iter()
        .zip(&served)
        .find_map(|(id, machine)| Some((id.clone(), machine.clone()?)))
        .expect("a create served from the pool");
    let written = exec(&client, &pooled, &["sh", "-c", "echo kept > /workspace/f"]).await;
    assert_eq!(body(&written)["exit_code"], 0);
    assert_eq!(
        std::fs::read_to_string(host.workspace(&pooled).join("f")).unwrap(),
        "kept\n",
        "the claimed machine's workspace is the environment's"
    );
    // A claimed machine that stops is started again by the reconciler, with its workspace:
    // its mount names the pool's path, which now links to the environment's.
    host.kill_machine(&machine).await;
    let deadline = Instant::now() + REFILLED_WITHIN;
    loop {
        let read = body(&exec(&client, &pooled, &["cat", "/workspace/f"]).await);
        if read["output"] == "kept\n" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not back with its workspace: {read}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let listed = support::e2e::list(&client).await;
    assert_eq!(
        listed.len(),
        3,
        "pool machines are no environments: {listed:?}"
    );
    assert!(support::e2e::list(&host.client("globex")).await.is_empty());

    let refilled = full_pool(&host, 2).await;
    assert!(
        refilled.is_disjoint(&from_pool),
        "claimed machines are never pooled again"
    );

    for id in &ids {
        assert_eq!(delete(&client, id).await.status, StatusCode::NO_CONTENT);
        assert!(!host.workspace(id).exists());
    }
    for machine in &from_pool {
        assert_eq!(
            host.runtime.inspect(machine).await.unwrap(),
            MachineState::Missing,
            "a deleted pooled environment's machine is removed"
        );
        assert!(!pool_dir(&host).join(machine).exists());
    }
    clean_up(host).await;
}

async fn a_pool_machine_that_stops_is_replaced_and_never_served(backend: Backend) {
    let Some(host) = Host::start_on(backend, POOL_OF_TWO).await else {
        return;
    };
    let host = PoolHost(Some(host));
    let before = full_pool(&host, 2).await;
    let stopped = before.iter().next().unwrap().clone();
    host.kill_machine(&stopped).await;
    let deadline = Instant::now() + REFILLED_WITHIN;
    // Podman answers 500 for a container in the middle of its removal: ask again.
    while host.runtime.inspect(&stopped).await.ok() != Some(MachineState::Missing) {
        assert!(
            Instant::now() < deadline,
            "the stopped pool machine was not removed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = full_pool(&host, 2).await;
    assert!(!after.contains(&stopped));
    clean_up(host).await;
}

async fn a_pooled_environment_is_isolated_and_bounded_like_any_other(backend: Backend) {
    let extra =
        format!("{POOL_OF_TWO}[limits]\nmemory = \"256MiB\"\npids = 256\ntmp = \"32MiB\"\n");
    let Some(host) = Host::start_on(backend, &extra).await else {
        return;
    };
    let host = PoolHost(Some(host));
    full_pool(&host, 2).await;
    let scratch = tempfile::tempdir().unwrap();
    let outside = Outside::start(scratch.path()).expect("a stand-in for the internet");
    let metadata =
        Outside::start_link_local(scratch.path()).expect("a stand-in for a metadata service");
    // Two pooled environments of two organisations: the pool's machines were made for nobody.
    let (acme, globex) = (host.acme(), host.client("globex"));
    let (first, second) = (unique_id("pool-iso-a"), unique_id("pool-iso-b"));
    for (client, id) in [(&acme, &first), (&globex, &second)] {
        let answer = create(client, json!({ "id": id })).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{:?}", body(&answer));
        assert!(
            claimed_machine(&host, id).is_some(),
            "{id} was served from the pool"
        );
    }
    let client = acme.clone();
    let loopback = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = loopback.local_addr().unwrap().port();
    let script = format!(
        "grep '^Seccomp:' /proc/self/status; grep '^CapEff:' /proc/self/status; \
         cat /proc/self/oom_score_adj; ulimit -n; unshare -Ur id 2>/dev/null || echo refused; \
         timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo reached || echo unreached"
    );
    let result = body(&exec(&client, &first, &["sh", "-c", &script]).await);
    let output = result["output"].as_str().unwrap_or_default();
    let lines: Vec<&str> = output.lines().collect();
    let [seccomp, oom, user_namespace] = support::e2e::confinement_read_inside();
    assert_eq!(
        lines,
        [
            seccomp,
            "CapEff:\t0000000000000000",
            oom,
            "1024",
            user_namespace,
            "unreached"
        ],
        "{result}"
    );
    assert_eq!(
        connect(&client, &first, outside.addr).await,
        0,
        "the outside is reachable"
    );
    let status = connect(&client, &first, metadata.addr).await;
    assert_eq!(status, DROPPED, "the link-local address {}", metadata.addr);
    let (at_first, at_second) = (
        address_of(&client, &first).await,
        address_of(&globex, &second).await,
    );
    let status = connect(&client, &first, SocketAddr::new(at_second, 9)).await;
    assert_eq!(status, DROPPED, "globex's environment at {at_second}");
    let status = connect(&globex, &second, SocketAddr::new(at_first, 9)).await;
    assert_eq!(status, DROPPED, "acme's environment at {at_first}");
    loopback.set_nonblocking(true).unwrap();
    assert!(
        loopback.accept().is_err(),
        "the host's loopback was reached"
    );
    // Past the memory limit: killed inside (dd holds one block of 512 MiB in 256).
    let hog = body(
        &exec(
            &client,
            &first,
            &[
                "sh",
                "-c",
                "dd if=/dev/zero of=/dev/null bs=512M count=1 2>/dev/null; exit $?",
            ],
        )
        .await,
    );
    support::e2e::assert_killed_past_memory(backend, &hog);
    until(&client, &first, REFILLED_WITHIN, "ready", |e| {
        e["status"] == "ready"
    })
    .await;
    for (client, id) in [(&acme, &first), (&globex, &second)] {
        assert_eq!(delete(client, id).await.status, StatusCode::NO_CONTENT);
    }
    clean_up(host).await;
}

/// A create with a repository never takes a pool machine, with setup or without: its clone is
/// done before its own machine is made, as without a pool, and the pool's machines stay
/// waiting for the next setup-less create.
async fn a_create_with_a_repository_never_claims_a_pool_machine(backend: Backend) {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    let commit = double.create_repository("acme/app", &[("README.md", "hello\n")]);
    let extra = format!("{POOL_OF_TWO}{}", double.toml());
    let Some(host) = Host::start_on(backend, &extra).await else {
        return;
    };
    let host = PoolHost(Some(host));
    let client = host.acme();
    let connected = double.connect_as(&client, "acme-admin", 7).await;
    assert_eq!(connected.status, StatusCode::NO_CONTENT, "{connected:?}");
    let waiting = full_pool(&host, 2).await;
    let ids = [unique_id("pool-repo"), unique_id("pool-repo-setup")];
    let requests = [
        json!({ "id": ids[0], "repository": "acme/app" }),
        json!({ "id": ids[1], "repository": "acme/app", "setup": "git -C /workspace rev-parse HEAD" }),
    ];
    for (id, request) in ids.iter().zip(requests) {
        let answer = create(&client, request).await;
        let env = body(&answer);
        assert_eq!(answer.status, StatusCode::CREATED, "{env}");
        assert_eq!(env["status"], "ready", "{env}\n{}", host.daemon.log());
        assert_eq!(claimed_machine(&host, id), None, "{id} took a pool machine");
        let machine = host.machine(id).await;
        assert!(
            !waiting.contains(&machine.name) && !machine.labels.contains_key("dev.narya.pool"),
            "{id} runs on a pool machine: {machine:?}"
        );
        assert_eq!(machine.organisation(), Some("acme"));
        assert!(
            host.workspace(id).join("README.md").is_file(),
            "{id}: no clone"
        );
        assert_eq!(
            unclaimed(&host).await,
            waiting,
            "the pool's machines still wait, unclaimed"
        );
    }
    let setup = body(&get(&client, &ids[1]).await);
    let output = setup["setup"]["output"].as_str().unwrap_or_default();
    assert!(output.contains(&commit), "the setup saw the clone: {setup}");

    // The next create without one is served from the pool.
    let plain = unique_id("pool-plain");
    let answer = create(&client, json!({ "id": plain })).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{:?}", body(&answer));
    let served = claimed_machine(&host, &plain).expect("a setup-less create takes a pool machine");
    assert!(
        waiting.contains(&served),
        "{served} was not waiting in {waiting:?}"
    );
    for id in ids.iter().chain([&plain]) {
        assert_eq!(delete(&client, id).await.status, StatusCode::NO_CONTENT);
    }
    clean_up(host).await;
}

/// SIGKILL while creates claim pool machines: after a restart each environment is recorded
/// with its machine or absent, no machine is both pooled and claimed, and nothing leaks.
async fn a_sigkill_during_claims_leaves_each_environment_recorded_or_absent(backend: Backend) {
    let extra = "[pool]\nsize = 4\n";
    let Some(host) = Host::start_on(backend, extra).await else {
        return;
    };
    let mut host = PoolHost(Some(host));
    full_pool(&host, 4).await;
    let client = host.acme();
    let ids: Vec<String> = (0..6).map(|n| unique_id(&format!("killed-{n}"))).collect();
    for id in &ids {
        let client = client.clone();
        let body = json!({ "id": id });
        tokio::spawn(async move { create(&client, body).await });
    }
    tokio::time::sleep(Duration::from_millis(15)).await;
    tokio::task::block_in_place(|| {
        host.daemon.kill();
        host.daemon.restart();
    });
    let client = host.acme();
    full_pool(&host, 4).await;
    let mut claimed = BTreeSet::new();
    for id in &ids {
        let answer = get(&client, id).await;
        match answer.status {
            StatusCode::NOT_FOUND => {
                assert!(
                    claimed_machine(&host, id).is_none(),
                    "{id}: absent, yet claimed"
                );
            }
            StatusCode::OK => {
                let env = until(&client, id, Duration::from_secs(60), "settled", |e| {
                    e["status_detail"] != "provisioning"
                })
                .await;
                if let Some(machine) = claimed_machine(&host, id) {
                    assert_eq!(env["status"], "ready", "{id}: {env}");
                    assert_eq!(
                        host.runtime.inspect(&machine).await.unwrap(),
                        MachineState::Running,
                        "{id} is recorded with its machine"
                    );
                    claimed.insert(machine);
                }
            }
            other => panic!("{id}: {other}"),
        }
    }
    let waiting = unclaimed(&host).await;
    assert!(
        waiting.is_disjoint(&claimed),
        "never both pooled and claimed"
    );
    let ours = pool_machines(&host).await;
    let accounted: BTreeSet<String> = waiting.union(&claimed).cloned().collect();
    assert_eq!(
        ours, accounted,
        "every pool machine is pooled or claimed: none leaked"
    );
    for id in &ids {
        let _ = delete(&client, id).await;
        host.remove(id).await;
    }
    clean_up(host).await;
}

on_every_engine!(
    two_creates_are_served_from_the_pool_a_third_is_made_and_the_pool_refills,
    a_pool_machine_that_stops_is_replaced_and_never_served,
    a_pooled_environment_is_isolated_and_bounded_like_any_other,
    a_create_with_a_repository_never_claims_a_pool_machine,
    a_sigkill_during_claims_leaves_each_environment_recorded_or_absent,
);

/// The tag moves to a new digest and the daemon restarts: the pool machines of the old digest
/// are removed before any is served, new creates get the new digest, existing environments
/// keep theirs.
async fn a_new_digest_behind_the_tag_replaces_the_pool_at_restart(backend: Backend) {
    let Some((socket, layout)) = support::e2e::requirements_for(backend) else {
        return;
    };
    let Some(registry) = support::required("NARYA_TEST_REGISTRY") else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let reference = format!(
        "{registry}/narya-test/pool-moving-{}-{backend:?}:v",
        std::process::id()
    )
    .to_lowercase();
    tokio::task::block_in_place(|| {
        support::images::push(std::path::Path::new(&layout), &reference)
    });
    let old = narya_oci::layout::Layout::open(&layout)
        .unwrap()
        .resolve()
        .unwrap()
        .to_string();
    let extra = format!("[image]\ninsecure_registries = [{registry:?}]\n{POOL_OF_TWO}");
    let mut host = PoolHost(Some(
        Host::start_with_on(backend, &socket, &reference, &extra, &socket, &layout).await,
    ));
    let old_pool = full_pool(&host, 2).await;
    let client = host.acme();
    let existing = unique_id("pinned-old");
    let created = create(&client, json!({ "id": existing })).await;
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", body(&created));
    assert_eq!(body(&created)["image_digest"], old);
    let old_pool: BTreeSet<String> = full_pool(&host, 2)
        .await
        .union(&old_pool)
        .filter(|m| claimed_machine(&host, &existing).as_ref() != Some(*m))
        .cloned()
        .collect();

    let newer = scratch.path().join("newer");
    let new = tokio::task::block_in_place(|| {
        support::images::another_image(&layout, &newer, "2031-01-01T00:00:00Z")
    });
    assert_ne!(new, old);
    tokio::task::block_in_place(|| {
        support::images::push(&newer, &reference);
        assert_eq!(host.daemon.terminate().code(), Some(0));
        host.daemon.restart();
    });
    let client = host.acme();
    let fresh = unique_id("pinned-new");
    let created = create(&client, json!({ "id": fresh })).await;
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", body(&created));
    assert_eq!(
        body(&created)["image_digest"],
        new,
        "no machine of the old digest is served"
    );
    let new_pool = full_pool(&host, 2).await;
    assert!(new_pool.is_disjoint(&old_pool));
    for machine in &old_pool {
        assert_eq!(
            host.runtime.inspect(machine).await.unwrap(),
            MachineState::Missing
        );
    }
    for machine in host.runtime.list().await.unwrap() {
        if new_pool.contains(&machine.id) {
            assert_eq!(
                machine.digest.map(|d| d.to_string()).as_deref(),
                Some(new.as_str())
            );
        }
    }
    let kept = body(&get(&client, &existing).await);
    assert_eq!(
        kept["image_digest"], old,
        "an existing environment keeps its digest"
    );
    for id in [&existing, &fresh] {
        assert_eq!(delete(&client, id).await.status, StatusCode::NO_CONTENT);
    }
    clean_up(host).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_digest_behind_the_tag_replaces_the_pool_at_restart_on_containerd() {
    a_new_digest_behind_the_tag_replaces_the_pool_at_restart(Backend::Containerd).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_digest_behind_the_tag_replaces_the_pool_at_restart_on_docker() {
    a_new_digest_behind_the_tag_replaces_the_pool_at_restart(Backend::Docker).await
}
