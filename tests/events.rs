//! `GET /v1/events` end to end: a watcher sees a machine killed from outside go `degraded` and
//! come back `ready`, another organisation's watcher sees nothing of it, and every stream ends
//! cleanly when the daemon stops.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use narya::api::types::StatusView;
use narya::client::WatchEvent;
use serde_json::{json, Value};
use support::e2e::{create, unique_id, Backend, Host};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

/// Generous: the host notices a killed machine in about a second, but this machine is shared.
const DEADLINE: Duration = Duration::from_secs(60);

/// `narya env watch ID --json`, as a script would run it, its stdout read line by line.
struct CliWatcher {
    child: Child,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl CliWatcher {
    /// Starts it and waits for its "watching" line: from then on nothing is missed.
    async fn start(host: &Host, organisation: &str, id: &str) -> CliWatcher {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_narya"))
            .args(["--url", &format!("http://{}", host.daemon.tcp), "--json"])
            .args(["env", "watch", id])
            .env("NARYA_TOKEN", host.token(organisation))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("narya runs");
        let stderr = child.stderr.take().expect("piped stderr");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = BufReader::new(stderr).lines();
        let first = tokio::time::timeout(DEADLINE, stderr.next_line())
            .await
            .expect("narya env watch says it is watching in time")
            .expect("stderr reads");
        assert_eq!(first.as_deref(), Some(format!("watching {id}").as_str()));
        CliWatcher {
            child,
            stdout: BufReader::new(stdout).lines(),
        }
    }

    /// Reads lines until one says `id` is `status`; how long that took.
    async fn until(&mut self, id: &str, status: &str, since: Instant) -> Value {
        let deadline = since + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = tokio::time::timeout(left, self.stdout.next_line())
                .await
                .unwrap_or_else(|_| panic!("no {status} line for {id} within {DEADLINE:?}"))
                .expect("stdout reads")
                .unwrap_or_else(|| panic!("the watch ended before {id} was {status}"));
            let event: Value = serde_json::from_str(&line).expect("a JSON line");
            assert_eq!(event["id"], id, "narya env watch {id} printed {line}");
            if event["status"] == status {
                println!("{id} seen {status} {:?} after the kill", since.elapsed());
                return event;
            }
        }
    }
}

async fn a_machine_killed_from_outside_is_watched_degraded_then_ready(backend: Backend) {
    let Some(mut host) = Host::start_on(backend, "").await else {
        return;
    };
    let id = unique_id("watched");
    let _cleanup = host.cleanup(&id);
    let created = create(&host.acme(), json!({ "id": id })).await;
    assert_eq!(created.status, StatusCode::CREATED);

    let mut cli = CliWatcher::start(&host, "acme", &id).await;
    let mut acme = host.acme().watch().await.expect("acme watches");
    let globex = host.client("globex").watch().await.expect("globex watches");
    let seen_by_globex = collect(globex);

    host.kill(&id).await;
    let killed = Instant::now();
    let degraded = cli.until(&id, "degraded", killed).await;
    assert!(degraded["status_detail"].is_string(), "{degraded}");
    assert!(degraded["at"].is_string(), "{degraded}");
    cli.until(&id, "ready", killed).await;

    // The library reads the same lines, in the same order.
    let mut statuses = Vec::new();
    while statuses.last() != Some(&StatusView::Ready) {
        match tokio::time::timeout(DEADLINE, acme.next_event()).await {
            Ok(Ok(Some(WatchEvent::Changed(change)))) => {
                assert_eq!(change.id, id);
                statuses.push(change.status);
            }
            other => panic!("acme's watch: {other:?}"),
        }
    }
    assert_eq!(statuses.first(), Some(&StatusView::Degraded));

    // Every stream ends cleanly at shutdown, and the daemon does not wait for them.
    let status = tokio::task::block_in_place(|| host.daemon.terminate());
    assert_eq!(status.code(), Some(0), "{}", host.daemon.log());
    let ended = tokio::time::timeout(DEADLINE, cli.child.wait())
        .await
        .expect("narya env watch ends when the daemon stops")
        .expect("narya waits");
    assert!(ended.success(), "narya env watch exited {ended}");
    assert!(
        matches!(acme.next_event().await, Ok(None)),
        "acme's stream ends cleanly"
    );
    let globex_saw = tokio::time::timeout(DEADLINE, seen_by_globex)
        .await
        .expect("globex's stream ends")
        .expect("the reader task ends");
    assert_eq!(
        globex_saw,
        Vec::<String>::new(),
        "globex saw acme's changes"
    );
}

/// Everything a watch reports until it ends, in the background.
fn collect(mut watch: narya::client::WatchStream) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        loop {
            match watch.next_event().await {
                Ok(Some(event)) => seen.push(format!("{event:?}")),
                Ok(None) => return seen,
                Err(e) => {
                    seen.push(format!("error: {e}"));
                    return seen;
                }
            }
        }
    })
}

on_every_engine!(a_machine_killed_from_outside_is_watched_degraded_then_ready);
