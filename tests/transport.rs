//! The transport limits of a real daemon: silent clients are closed after the header timeout,
//! connections beyond the limit wait, and long quiet answers are never cut by either bound.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use narya::client::Client;
use serde_json::{json, Value};
use support::e2e::{body, create, unique_id, Backend, Host};
use support::idp::IdentityProvider;
use support::{make_key, now, Daemon};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

/// A daemon with `extra` TOML in its configuration, and a token it accepts.
async fn daemon_and_token(extra: &str) -> (tempfile::TempDir, IdentityProvider, Daemon, String) {
    let dir = tempfile::tempdir().unwrap();
    let idp = IdentityProvider::start().await;
    let key = make_key(dir.path(), "k", "P-256");
    idp.publish(&key.dev);
    let config = format!("{}\n{extra}", idp.identity_toml(""));
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(&config))
        .await
        .unwrap();
    let token = key
        .dev
        .sign(&json!({
            "iss": idp.issuer, "aud": "narya", "sub": "alice", "org": "acme",
            "exp": now() + 600,
        }))
        .unwrap();
    (dir, idp, daemon, token)
}

/// Reads until the daemon closes the connection (whatever it says first); how long that took.
async fn closed_after(mut stream: impl AsyncRead + Unpin, give_up: Duration) -> Duration {
    let started = Instant::now();
    let mut buffer = [0u8; 1024];
    let read_to_end = async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    if tokio::time::timeout(give_up, read_to_end).await.is_err() {
        return give_up;
    }
    started.elapsed()
}

const HALF_A_REQUEST_LINE: &[u8] = b"GET /v1/environm";

#[tokio::test(flavor = "multi_thread")]
async fn half_sent_requests_are_closed_after_the_header_timeout_while_others_are_answered() {
    const SILENT: usize = 200;
    let header_timeout = Duration::from_secs(2);
    let (_dir, _idp, daemon, token) = daemon_and_token("[listen]\nheader_timeout = \"2s\"\n").await;

    // Normal requests, on both transports in turn, for as long as the silent ones are open.
    let done = Arc::new(AtomicBool::new(false));
    let prober = {
        let done = done.clone();
        let clients: Vec<(&'static str, Client)> = daemon.transports(Some(&token)).into();
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            for (transport, client) in clients.iter().cycle() {
                if done.load(Ordering::SeqCst) && latencies.len() >= 4 {
                    break;
                }
                let started = Instant::now();
                let answer = client
                    .send(Method::GET, "/v1/environments", None)
                    .await
                    .unwrap_or_else(|e| panic!("{transport}: {e}"));
                assert_eq!(answer.status, StatusCode::OK, "{transport}");
                latencies.push((*transport, started.elapsed()));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            latencies
        })
    };

    let give_up = Duration::from_secs(30);
    let mut silent = tokio::task::JoinSet::new();
    for _ in 0..SILENT {
        let mut unix = UnixStream::connect(&daemon.socket).await.unwrap();
        unix.write_all(HALF_A_REQUEST_LINE).await.unwrap();
        silent.spawn(async move { ("unix", closed_after(unix, give_up).await) });
        let mut tcp = TcpStream::connect(&daemon.tcp).await.unwrap();
        tcp.write_all(HALF_A_REQUEST_LINE).await.unwrap();
        silent.spawn(async move { ("tcp", closed_after(tcp, give_up).await) });
    }
    let mut slowest = [("unix", Duration::ZERO), ("tcp", Duration::ZERO)];
    while let Some(closed) = silent.join_next().await {
        let (transport, after) = closed.unwrap();
        let entry = slowest.iter_mut().find(|(t, _)| *t == transport).unwrap();
        entry.1 = entry.1.max(after);
    }
    done.store(true, Ordering::SeqCst);
    let latencies = prober.await.unwrap();

    for (transport, after) in slowest {
        println!("{SILENT} half-sent requests on {transport}: the last closed after {after:?}");
        assert!(
            // Well short of `give_up`: closed by the header timeout, with room for a loaded
            // machine's late accept.
            after <= header_timeout + Duration::from_secs(15),
            "{transport}: a silent connection stayed open {after:?}"
        );
    }
    let slowest_answer = latencies.iter().map(|(_, l)| *l).max().unwrap();
    println!(
        "{} normal requests answered meanwhile; the slowest in {slowest_answer:?}",
        latencies.len()
    );
    assert!(
        latencies.iter().any(|(t, _)| *t == "unix") && latencies.iter().any(|(t, _)| *t == "tcp")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_beyond_max_connections_wait_for_a_free_slot() {
    let (_dir, _idp, daemon, token) =
        daemon_and_token("[listen]\nheader_timeout = \"2s\"\nmax_connections = 3\n").await;
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(UnixStream::connect(&daemon.socket).await.unwrap());
    }
    // Let the daemon accept them and take every slot of the unix listener.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let tcp = daemon
        .tcp(Some(&token))
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(tcp.status, StatusCode::OK, "the limit is per listener");
    let unix = daemon
        .unix(Some(&token))
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    let waited = started.elapsed();
    println!("a request beyond max_connections was answered after {waited:?}");
    assert_eq!(unix.status, StatusCode::OK);
    assert!(
        waited >= Duration::from_secs(1),
        "answered in {waited:?}, before the silent connections' header timeout freed a slot"
    );
}

/// Reads an NDJSON answer to the end.
async fn stream(client: &Client, path: &str, request: &Value) -> (StatusCode, Vec<Value>) {
    let mut answer = client
        .stream_json(Method::POST, path, request)
        .await
        .unwrap();
    let status = answer.status;
    let mut lines = Vec::new();
    while let Some(line) = answer.next_line().await.unwrap() {
        lines.push(serde_json::from_str(&line).unwrap());
    }
    (status, lines)
}

fn output_of(lines: &[Value]) -> String {
    lines.iter().filter_map(|l| l["output"].as_str()).collect()
}

async fn quiet_answers_outlast_the_header_and_idle_timeouts(backend: Backend) {
    let limits = "[listen]\nheader_timeout = \"1s\"\nidle_timeout = \"1s\"\n";
    let Some(host) = Host::start_on(backend, limits).await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("quiet");
    let quiet = "sleep 3; echo done";

    let (status, lines) = stream(
        &client,
        "/v1/environments",
        &json!({"id": id, "setup": quiet}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{lines:?}");
    assert_eq!(output_of(&lines), "done\n", "{lines:?}");
    let last = lines.last().unwrap();
    assert_eq!(last["environment"]["status"], "ready", "{lines:?}");

    let exec = format!("/v1/environments/{id}/exec");
    let (status, lines) = stream(&client, &exec, &json!({"argv": ["sh", "-c", quiet]})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(output_of(&lines), "done\n", "{lines:?}");
    assert_eq!(lines.last().unwrap()["exit_code"], 0, "{lines:?}");

    let answer = client
        .send_json(Method::POST, &exec, &json!({"argv": ["sh", "-c", quiet]}))
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    let result = body(&answer);
    assert_eq!(
        (result["exit_code"].clone(), result["output"].clone()),
        (json!(0), json!("done\n"))
    );

    let repeat = create(&client, json!({"id": id, "setup": quiet})).await;
    assert_eq!(repeat.status, StatusCode::OK);
    // The fixture finds the machine by its labels, whatever the daemon named it.
    host.remove(&id).await;
}

on_every_engine!(quiet_answers_outlast_the_header_and_idle_timeouts);
