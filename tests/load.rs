//! Under load and slow runtimes: dozens of commands at once into one environment, and a shim
//! that answers late, never cost the machine its processes — through a real daemon on the
//! real containerd and Docker.

mod support;

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use serde_json::json;
use support::e2e::{body, create, get, unique_id, Backend, Host};

/// When the machine of environment `id` started its init (field 22 of /proc/1/stat, in clock
/// ticks since boot): it changes if and only if the machine was restarted.
async fn init_started(host: &Host, id: &str) -> String {
    let out = host.sh(id, "cut -d' ' -f22 /proc/1/stat").await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    String::from_utf8_lossy(&out.output).trim().to_owned()
}

/// Polls the environment's status until `stop` is set; every status seen, in order.
fn watch_status(
    host: &Host,
    id: &str,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<Vec<String>>,
) {
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let client = host.acme();
    let id = id.to_owned();
    let watcher = tokio::spawn(async move {
        let mut seen = Vec::new();
        while !*stopped.borrow() {
            let answer = get(&client, &id).await;
            seen.push(body(&answer)["status"].as_str().unwrap_or("?").to_owned());
            tokio::select! {
                _ = stopped.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
        seen
    });
    (stop, watcher)
}

async fn sixty_four_commands_at_once_leave_the_machine_as_it_was(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("load");
    assert_eq!(
        create(&client, json!({"id": id})).await.status,
        StatusCode::CREATED
    );
    let started_before = init_started(&host, &id).await;
    let (stop, watcher) = watch_status(&host, &id);

    let began = Instant::now();
    let mut execs = Vec::new();
    for _ in 0..64 {
        let client = host.acme();
        let path = format!("/v1/environments/{id}/exec");
        execs.push(tokio::spawn(async move {
            let answer = client
                .send_json(Method::POST, &path, &json!({"argv": ["true"]}))
                .await
                .unwrap();
            (answer.status, body(&answer))
        }));
    }
    for exec in execs {
        let (status, result) = exec.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{result}");
        assert_eq!(result["exit_code"], 0, "{result}");
    }
    println!("64 concurrent execs on {backend:?}: {:?}", began.elapsed());
    // Give the reconciler a few passes to misjudge the busy machine, if it would.
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.send(true).unwrap();
    let seen = watcher.await.unwrap();
    assert!(seen.iter().all(|s| s == "ready"), "statuses seen: {seen:?}");
    assert_eq!(
        init_started(&host, &id).await,
        started_before,
        "the machine was restarted under load"
    );
    host.remove(&id).await;
}

/// The containerd shim serving `machine`, found by its command line.
fn shim_of(machine: &str) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let is_shim = args
                .first()
                .is_some_and(|a| String::from_utf8_lossy(a).contains("containerd-shim"));
            let serves = args
                .windows(2)
                .any(|w| w[0] == b"-id" && w[1] == machine.as_bytes());
            (is_shim && serves).then_some(pid)
        })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shim_that_answers_late_costs_its_machine_nothing() {
    let Some(host) = Host::start_on(Backend::Containerd, "").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("slowshim");
    assert_eq!(
        create(&client, json!({"id": id})).await.status,
        StatusCode::CREATED
    );
    let machine = host.machine(&id).await.name;
    let started_before = init_started(&host, &id).await;
    let shim = shim_of(&machine).expect("the machine's shim runs on this host");
    let stopped = nix_kill(shim, "STOP");
    assert!(stopped, "could not pause the shim");
    // Several reconciler passes (2 s apart) see a shim that does not answer.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(nix_kill(shim, "CONT"), "could not resume the shim");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        init_started(&host, &id).await,
        started_before,
        "a machine whose shim answered late was restarted"
    );
    let answer = get(&client, &id).await;
    assert_eq!(body(&answer)["status"], "ready", "{}", body(&answer));
    host.remove(&id).await;
}

/// Sends `signal` (a name `kill` knows) to `pid`.
fn nix_kill(pid: i32, signal: &str) -> bool {
    std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

on_every_engine!(sixty_four_commands_at_once_leave_the_machine_as_it_was);
