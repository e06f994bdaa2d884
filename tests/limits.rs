//! The `[limits]` end to end, through a real daemon on every engine: a setup that forks without
//! end fails at the pids limit while the daemon and another environment keep answering, and a
//! process allocating past `memory` is killed (137) while its environment stays ready.

mod support;

use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde_json::{json, Value};
use support::e2e::{body, create, delete, exec, get, under_gvisor, unique_id, Backend, Host};

/// Small limits, so going past them is quick and light on a shared host.
const LIMITS: &str = "[limits]\nmemory = \"256MiB\"\npids = 256\ntmp = \"32MiB\"\n";

/// Forks 10,000 sleepers; the kernel refuses long before.
const FORK_10000: &str =
    "i=0; while [ $i -lt 10000 ]; do sleep 600 & i=$((i+1)); done; echo all-forked";

/// How long a single answer may take on a loaded, shared CI machine: generous on purpose (the
/// speed of exec lives in the benchmarks).
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

async fn ready(host: &Host, name: &str) -> String {
    let id = unique_id(name);
    let answer = create(&host.acme(), json!({ "id": id })).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{:?}", body(&answer));
    id
}

/// Runs `argv` in `id` and returns the exec's result, within [`ANSWER_WITHIN`].
async fn run(host: &Host, id: &str, argv: &[&str]) -> Value {
    let answer = tokio::time::timeout(ANSWER_WITHIN, exec(&host.acme(), id, argv))
        .await
        .unwrap_or_else(|_| {
            panic!("exec {argv:?} in {id} did not answer within {ANSWER_WITHIN:?}")
        });
    assert_eq!(answer.status, StatusCode::OK, "{:?}", body(&answer));
    body(&answer)
}

async fn a_setup_forking_without_end_fails_at_the_pids_limit_and_nobody_else_notices(
    backend: Backend,
) {
    let Some(host) = Host::start_on(backend, LIMITS).await else {
        return;
    };
    let bystander = ready(&host, "bystander").await;
    let _bystander_removal = host.removal(&bystander);
    let bomb = unique_id("forks");
    let _bomb_removal = host.removal(&bomb);
    let creating = {
        let client = host.acme();
        let body = json!({ "id": bomb, "setup": FORK_10000 });
        tokio::spawn(async move { create(&client, body).await })
    };
    // While the setup forks, the daemon and the other environment keep answering.
    let mut answered = 0;
    while !creating.is_finished() || answered == 0 {
        let result = run(&host, &bystander, &["echo", "still here"]).await;
        assert_eq!(result["exit_code"], 0, "{result}");
        assert_eq!(result["output"], "still here\n");
        let listed = tokio::time::timeout(ANSWER_WITHIN, get(&host.acme(), &bystander))
            .await
            .expect("the daemon answers a GET");
        assert_eq!(listed.status, StatusCode::OK);
        answered += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let created = creating.await.expect("the create task");
    let env = body(&created);
    let setup = &env["setup"];
    assert_eq!(setup["state"], "failed", "{env}");
    assert_ne!(setup["exit_code"], 0, "{env}");
    let output = setup["output"].as_str().unwrap_or_default();
    // Under gVisor the limit ends the whole sandbox rather than one fork (a known gap, README
    // "Sandboxes"): the setup fails all the same, and nobody else notices.
    assert!(
        !output.contains("all-forked")
            && (under_gvisor() || output.to_lowercase().contains("fork")),
        "the setup stopped at the limit: {output:?}"
    );
    // The other environment is still ready and still runs commands.
    let still = body(&get(&host.acme(), &bystander).await);
    assert_eq!(still["status"], "ready", "{still}");
    let result = run(&host, &bystander, &["true"]).await;
    assert_eq!(result["exit_code"], 0);
    for id in [&bomb, &bystander] {
        let gone = delete(&host.acme(), id).await;
        assert!(gone.status.is_success(), "deleting {id}: {}", gone.status);
    }
}

async fn a_process_past_memory_is_killed_and_its_environment_stays_ready(backend: Backend) {
    let Some(host) = Host::start_on(backend, LIMITS).await else {
        return;
    };
    let id = ready(&host, "oom").await;
    let _id_removal = host.removal(&id);
    // dd holds one block of `bs` bytes: 512 MiB cannot fit in 256.
    let result = run(
        &host,
        &id,
        &[
            "sh",
            "-c",
            "dd if=/dev/zero of=/dev/null bs=512M count=1 2>/dev/null; exit $?",
        ],
    )
    .await;
    support::e2e::assert_killed_past_memory(backend, &result);
    // Ready, and running commands: on runc it never stopped; under gVisor the daemon finds the
    // ended sandbox and starts the machine again (reading `degraded` meanwhile).
    let within = if under_gvisor() {
        ANSWER_WITHIN * 4
    } else {
        ANSWER_WITHIN
    };
    let deadline = Instant::now() + within;
    loop {
        let env = body(&get(&host.acme(), &id).await);
        let answer = exec(&host.acme(), &id, &["echo", "alive"]).await;
        if env["status"] == "ready" && body(&answer)["output"] == "alive\n" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not ready and running after the kill: {env} {:?}",
            body(&answer)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let gone = delete(&host.acme(), &id).await;
    assert!(gone.status.is_success());
}

async fn processes_run_filtered_bounded_and_first_in_line_for_the_oom_killer(backend: Backend) {
    let Some(host) = Host::start_on(backend, LIMITS).await else {
        return;
    };
    let id = ready(&host, "bounds").await;
    let _id_removal = host.removal(&id);
    let result = run(
        &host,
        &id,
        &[
            "sh",
            "-c",
            "grep '^Seccomp:' /proc/self/status; cat /proc/self/oom_score_adj /proc/1/oom_score_adj; ulimit -n; unshare -Ur id 2>/dev/null || echo refused",
        ],
    )
    .await;
    let output = result["output"].as_str().unwrap_or_default();
    let lines: Vec<&str> = output.lines().collect();
    let [seccomp, oom, user_namespace] = support::e2e::confinement_read_inside();
    assert_eq!(
        lines,
        [seccomp, oom, oom, "1024", user_namespace],
        "{result}"
    );
    let gone = delete(&host.acme(), &id).await;
    assert!(gone.status.is_success());
}

on_every_engine!(
    a_setup_forking_without_end_fails_at_the_pids_limit_and_nobody_else_notices,
    a_process_past_memory_is_killed_and_its_environment_stays_ready,
    processes_run_filtered_bounded_and_first_in_line_for_the_oom_killer,
);
