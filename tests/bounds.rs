//! Bounds survive the daemon: a setup or exec is bounded inside its machine as well, what a
//! killed daemon left running is killed at the next start, and what a killed run started is
//! killed too, also when it left the run's process group. Each test sleeps for durations of its
//! own (the test process's pid in them), so it finds exactly its own processes on the host.

mod support;

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use narya::client::{Answer, Client};
use serde_json::json;
use support::e2e::{body, create, under_gvisor, unique_id, Backend, Host};

/// A `sleep` argument no other test (or test process) uses: `base` seconds and a fraction made
/// of this process's pid and the back end.
fn duration(base: u32, backend: Backend) -> String {
    let which = match backend {
        Backend::Containerd => 1,
        Backend::Docker => 2,
        Backend::Podman => 3,
    };
    format!("{base}.{}{which}", std::process::id())
}

/// Host pids of the live `sleep <duration>` processes, wherever they run.
fn sleeping(duration: &str) -> Vec<u32> {
    let wanted = format!("sleep\0{duration}\0");
    // Unreadable, every "nothing left" would hold without a look.
    let processes = std::fs::read_dir("/proc").expect("/proc is readable");
    processes
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z'));
            // The program may be named by path (`/bin/sleep`).
            !zombie && cmdline.ends_with(wanted.as_bytes()) && {
                let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
                program == b"sleep" || program.ends_with(b"/sleep")
            }
        })
        .collect()
}

/// Where a test looks for its `sleep`s: the host's `/proc`, or, under gVisor (whose processes
/// are none of the host's), the machine's own, through the runtime's CLI.
struct Watch<'a> {
    host: &'a Host,
    id: &'a str,
}

impl Watch<'_> {
    /// How many live `sleep <duration>` processes there are.
    async fn count(&self, duration: &str) -> usize {
        if !under_gvisor() {
            return sleeping(duration).len();
        }
        let ran = self
            .host
            .sh(
                self.id,
                "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done",
            )
            .await;
        let listing = String::from_utf8_lossy(&ran.output).into_owned();
        let wanted = format!("sleep {duration} ");
        listing
            .lines()
            .filter(|line| *line == wanted || line.ends_with(&format!("/{wanted}")))
            .count()
    }
}

/// Waits up to `within` for `check` to hold of `durations`' processes.
async fn until_sleeping(
    watch: &Watch<'_>,
    durations: &[&str],
    within: Duration,
    what: &str,
    check: fn(usize) -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        let mut found = Vec::new();
        for d in durations {
            found.push((*d, watch.count(d).await));
        }
        if found.iter().all(|(_, n)| check(*n)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn ready(host: &Host, id: &str) {
    let answer = create(&host.acme(), json!({ "id": id })).await;
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
}

async fn exec(client: &Client, id: &str, argv: &[&str], timeout: &str) -> Answer {
    client
        .send_json(
            Method::POST,
            &format!("/v1/environments/{id}/exec"),
            &json!({ "argv": argv, "timeout": timeout }),
        )
        .await
        .unwrap()
}

async fn a_run_the_daemon_no_longer_tracks_ends_by_its_bound_or_at_the_next_start(
    backend: Backend,
) {
    let Some(mut host) = Host::start_on(backend, "").await else {
        return;
    };
    let id = unique_id("orphaned");
    let _removal = host.removal(&id);
    let watch = Watch {
        host: &host,
        id: &id,
    };
    ready(&host, &id).await;
    // One run bounded at 5 s, which only the bound inside the machine can end once the daemon
    // is gone; one at 10 minutes, which only the next daemon can end. The long one first, and
    // the daemon killed as soon as the short one runs: started together, a slow start of one
    // could outlast the other's bound.
    let short = duration(1000, backend);
    let long = duration(1001, backend);
    let mut runs = Vec::new();
    for (sleep, timeout) in [(&long, "10m"), (&short, "5s")] {
        let client = host.acme();
        let path = format!("/v1/environments/{id}/exec");
        let request = json!({ "argv": ["sleep", sleep], "timeout": timeout });
        // Their answers never come: the daemon is killed under them.
        runs.push(tokio::spawn(async move {
            client.send_json(Method::POST, &path, &request).await
        }));
        until_sleeping(
            &watch,
            &[sleep.as_str()],
            Duration::from_secs(60),
            "the run started",
            |n| n == 1,
        )
        .await;
    }
    assert_eq!(watch.count(&long).await, 1, "the long run still runs");

    tokio::task::block_in_place(|| host.daemon.kill());
    let watch = Watch {
        host: &host,
        id: &id,
    };
    for run in runs {
        let _ = run.await;
    }
    until_sleeping(
        &watch,
        &[&short],
        Duration::from_secs(30),
        "the 5 s run ended inside its machine",
        |n| n == 0,
    )
    .await;
    assert_eq!(
        watch.count(&long).await,
        1,
        "a run outlives a killed daemon until a daemon ends it"
    );

    tokio::task::block_in_place(|| host.daemon.restart());
    let watch = Watch {
        host: &host,
        id: &id,
    };
    until_sleeping(
        &watch,
        &[&long],
        Duration::from_secs(30),
        "the untracked run killed at start",
        |n| n == 0,
    )
    .await;
    // The daemon logs the kill once it is done, after the process is gone: wait for the line.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host.daemon.log().contains("killed what a run left behind") {
        assert!(
            Instant::now() < deadline,
            "the kill was not logged within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The machine itself was left alone.
    let answer = exec(&host.acme(), &id, &["true"], "30s").await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(body(&answer)["exit_code"], 0, "{answer:?}");
}

async fn a_timed_out_exec_leaves_nothing_behind_even_what_left_its_group(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let id = unique_id("escaping");
    let _removal = host.removal(&id);
    let watch = Watch {
        host: &host,
        id: &id,
    };
    ready(&host, &id).await;
    let sleeps = [
        duration(600, backend),
        duration(601, backend),
        duration(602, backend),
    ];
    let script = format!(
        "(sleep {} &); (setsid sleep {} &); sleep {}",
        sleeps[0], sleeps[1], sleeps[2]
    );
    let answer = exec(&host.acme(), &id, &["bash", "-c", &script], "2s").await;
    assert_eq!(answer.status, StatusCode::OK);
    let outcome = body(&answer);
    assert_eq!(outcome["timed_out"], true, "{outcome}");
    assert_eq!(outcome["exit_code"], serde_json::Value::Null, "{outcome}");
    let sleeps: Vec<&str> = sleeps.iter().map(String::as_str).collect();
    until_sleeping(
        &watch,
        &sleeps,
        Duration::from_secs(30),
        "nothing of the exec left",
        |n| n == 0,
    )
    .await;

    // A run that ends by itself keeps what it started in the background: only a killed run
    // takes its descendants with it.
    let kept = duration(603, backend);
    let answer = exec(
        &host.acme(),
        &id,
        &["bash", "-c", &format!("(setsid sleep {kept} &)")],
        "30s",
    )
    .await;
    assert_eq!(body(&answer)["exit_code"], 0);
    until_sleeping(
        &watch,
        &[&kept],
        Duration::from_secs(30),
        "a finished exec's background process kept",
        |n| n == 1,
    )
    .await;
}

/// A run that kills its own bounding wrapper (`timeout`, its parent) and carries on as
/// something else is treated as killed: what it left runs no longer.
async fn an_exec_that_kills_its_wrapper_leaves_nothing_behind(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let id = unique_id("wrapper");
    let _removal = host.removal(&id);
    let watch = Watch {
        host: &host,
        id: &id,
    };
    ready(&host, &id).await;
    let sleep = duration(650, backend);
    let script = format!("kill -9 $PPID; exec sleep {sleep}");
    let answer = exec(&host.acme(), &id, &["sh", "-c", &script], "20s").await;
    assert_eq!(answer.status, StatusCode::OK);
    let outcome = body(&answer);
    assert_ne!(outcome["exit_code"], 0, "{outcome}");
    until_sleeping(
        &watch,
        &[&sleep],
        Duration::from_secs(30),
        "nothing of the exec that killed its wrapper left",
        |n| n == 0,
    )
    .await;
}

async fn a_setup_past_its_bound_leaves_nothing_behind(backend: Backend) {
    let Some(host) = Host::start_on(backend, "[environment]\nsetup_timeout = \"3s\"\n").await
    else {
        return;
    };
    let id = unique_id("slow-setup");
    let _removal = host.removal(&id);
    let watch = Watch {
        host: &host,
        id: &id,
    };
    let sleeps = [duration(700, backend), duration(701, backend)];
    let setup = format!("(setsid sleep {} &); sleep {}", sleeps[0], sleeps[1]);
    let answer = create(&host.acme(), json!({ "id": id, "setup": setup })).await;
    let environment = body(&answer);
    assert_eq!(environment["setup"]["state"], "timed_out", "{environment}");
    let sleeps: Vec<&str> = sleeps.iter().map(String::as_str).collect();
    until_sleeping(
        &watch,
        &sleeps,
        Duration::from_secs(30),
        "nothing of the setup left",
        |n| n == 0,
    )
    .await;
}

on_every_engine!(
    a_run_the_daemon_no_longer_tracks_ends_by_its_bound_or_at_the_next_start,
    a_timed_out_exec_leaves_nothing_behind_even_what_left_its_group,
    an_exec_that_kills_its_wrapper_leaves_nothing_behind,
    a_setup_past_its_bound_leaves_nothing_behind,
);
