//! Running commands in environments, and streaming creates: through the HTTP API and the CLI
//! of a real daemon on the real containerd.

mod support;

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use narya::client::Client;
use serde_json::{json, Value};
use support::e2e::{body, create, get, unique_id, Backend, Host};

async fn exec(client: &Client, id: &str, request: Value) -> (StatusCode, Value) {
    let answer = client
        .send_json(
            Method::POST,
            &format!("/v1/environments/{id}/exec"),
            &request,
        )
        .await
        .unwrap();
    (answer.status, body(&answer))
}

/// Reads an NDJSON answer to the end: each line with the time it arrived.
async fn stream(
    client: &Client,
    path: &str,
    request: &Value,
) -> (StatusCode, Vec<(Duration, Value)>) {
    stream_releasing(client, path, request, None).await
}

/// The file a [`HELD`] command waits for, in the workspace `workspace` on the host.
fn release_file(workspace: &std::path::Path) -> std::path::PathBuf {
    workspace.join("release")
}

/// Shell that waits (up to 60 s) until the test creates [`release_file`], then says `released`
/// if it was: output printed before it can only have reached the test while the command ran.
const HELD: &str = "i=0; while [ ! -e /workspace/release ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; [ -e /workspace/release ] && echo released";

/// As [`stream`]; when the first output line arrives, creates `release` (if given), which lets
/// a [`HELD`] command go on.
async fn stream_releasing(
    client: &Client,
    path: &str,
    request: &Value,
    release: Option<&std::path::Path>,
) -> (StatusCode, Vec<(Duration, Value)>) {
    let started = Instant::now();
    let mut answer = client
        .stream_json(Method::POST, path, request)
        .await
        .unwrap();
    let status = answer.status;
    let mut lines = Vec::new();
    while let Some(line) = answer.next_line().await.unwrap() {
        let line: Value = serde_json::from_str(&line).unwrap();
        if let (Some(release), true) = (release, line["output"].is_string()) {
            std::fs::write(release, "").unwrap();
        }
        lines.push((started.elapsed(), line));
    }
    (status, lines)
}

async fn ready(host: &Host, name: &str) -> String {
    let id = unique_id(name);
    let answer = create(&host.acme(), json!({"id": id})).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    id
}

async fn commands_run_as_the_unprivileged_user_with_their_env_cwd_and_stdin(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = ready(&host, "exec").await;

    let (status, result) = exec(&client, &id, json!({"argv": ["id", "-u"]})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (result["exit_code"].clone(), result["output"].clone()),
        (json!(0), json!("1000\n"))
    );
    assert_eq!(result["timed_out"], false);
    assert!(result["duration_ms"].is_u64());

    let (_, result) = exec(&client, &id, json!({"argv": ["sh", "-c", "exit 7"]})).await;
    assert_eq!(result["exit_code"], 7);

    let (_, result) = exec(
        &client,
        &id,
        json!({"argv": ["sh", "-c", "echo $GREETING; pwd; cat"], "env": {"GREETING": "hi there"}, "cwd": "/tmp", "stdin": "from stdin\n"}),
    )
    .await;
    assert_eq!(result["output"], "hi there\n/tmp\nfrom stdin\n");
    let (_, result) = exec(&client, &id, json!({"argv": ["pwd"]})).await;
    assert_eq!(
        result["output"], "/workspace\n",
        "the workspace is the default cwd"
    );
    host.remove(&id).await;
}

async fn streamed_output_arrives_while_the_command_runs(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = ready(&host, "stream").await;
    // The command holds after its first line until the test has read that line.
    let (status, lines) = stream_releasing(
        &client,
        &format!("/v1/environments/{id}/exec"),
        &json!({"argv": ["sh", "-c", format!("echo 1; {HELD}; echo 2")]}),
        Some(&release_file(&host.workspace(&id))),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, first) = &lines[0];
    assert_eq!(first["output"], "1\n");
    let (_, last) = lines.last().unwrap();
    assert_eq!(last["exit_code"], 0);
    assert_eq!(last["timed_out"], false);
    let output: String = lines
        .iter()
        .filter_map(|(_, l)| l["output"].as_str())
        .collect();
    assert_eq!(
        output, "1\nreleased\n2\n",
        "the first line reached the client while the command ran: {lines:?}"
    );
    host.remove(&id).await;
}

async fn timed_out_and_abandoned_commands_leave_nothing_running(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = ready(&host, "bounds").await;
    let (_, result) = exec(
        &client,
        &id,
        json!({"argv": ["sh", "-c", "sleep 1000 & sleep 1001"], "timeout": "1s"}),
    )
    .await;
    assert_eq!(result["timed_out"], true);
    assert_eq!(result["exit_code"], json!(null));

    // A streaming client that goes away mid-stream takes its command with it.
    {
        let mut answer = client
            .stream_json(
                Method::POST,
                &format!("/v1/environments/{id}/exec"),
                &json!({"argv": ["sh", "-c", "echo up; sleep 1002 & sleep 1003"]}),
            )
            .await
            .unwrap();
        assert_eq!(
            answer.next_line().await.unwrap().as_deref(),
            Some(r#"{"output":"up\n"}"#)
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ps = host
            .sh(
                &id,
                "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done",
            )
            .await;
        let listing = String::from_utf8_lossy(&ps.output).into_owned();
        if !listing.contains("sleep 100") {
            break;
        }
        assert!(Instant::now() < deadline, "still running: {listing}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    host.remove(&id).await;
}

async fn many_commands_at_once_across_environments(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let mut ids = Vec::new();
    for n in 0..4 {
        let id = ready(&host, &format!("many{n}")).await;
        // Each environment knows its own name, so an answer shows where the command ran.
        std::fs::write(host.workspace(&id).join("whoami"), &id).unwrap();
        ids.push(id);
    }
    let mut tasks = Vec::new();
    for i in 0..20 {
        let client = host.acme();
        let id = ids[i % 4].clone();
        tasks.push(tokio::spawn(async move {
            let (status, result) = exec(
                &client,
                &id,
                json!({"argv": ["sh", "-c", format!("sleep 0.5; echo {i} $(cat /workspace/whoami)")]}),
            )
            .await;
            (i, id, status, result)
        }));
    }
    for task in tasks {
        let (i, id, status, result) = task.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(result["output"], format!("{i} {id}\n"));
    }
    for id in ids {
        host.remove(&id).await;
    }
}

async fn commands_run_only_in_ready_environments_of_your_organisation(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let broken = unique_id("broken");
    assert_eq!(
        create(&client, json!({"id": broken, "setup": "exit 1"}))
            .await
            .status,
        StatusCode::CREATED
    );
    let answer = client
        .send_json(
            Method::POST,
            &format!("/v1/environments/{broken}/exec"),
            &json!({"argv": ["true"]}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::CONFLICT);
    assert_eq!(answer.error().unwrap().code, "NRY-0042");
    let theirs = host.daemon.tcp(Some(&host.token("globex")));
    let answer = theirs
        .send_json(
            Method::POST,
            &format!("/v1/environments/{broken}/exec"),
            &json!({"argv": ["true"]}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    host.remove(&broken).await;
}

async fn a_streamed_create_shows_setup_output_before_the_environment(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("watched");
    // The setup holds after its first line until the test has read that line.
    let request = json!({"id": id, "setup": format!("echo one; {HELD}; echo two")});
    let (status, lines) = stream_releasing(
        &client,
        "/v1/environments",
        &request,
        Some(&release_file(&host.workspace(&id))),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let events: Vec<&Value> = lines.iter().map(|(_, l)| l).collect();
    let steps: Vec<String> = events
        .iter()
        .filter_map(|e| Some(format!("{} {}", e["step"].as_str()?, e["state"].as_str()?)))
        .collect();
    assert_eq!(
        steps,
        [
            "image started",
            "image finished",
            "machine started",
            "machine finished",
            "setup started",
            "setup finished"
        ]
    );
    let output: String = events
        .iter()
        .filter(|e| e["step"] == "setup")
        .filter_map(|e| e["output"].as_str())
        .collect();
    assert_eq!(
        output, "one\nreleased\ntwo\n",
        "the first line reached the client while the setup ran: {lines:?}"
    );
    let (_, last) = lines.last().unwrap();
    let environment = &last["environment"];
    assert_eq!(environment["status"], "ready");
    assert_eq!(
        *environment,
        body(&get(&client, &id).await),
        "the final event equals a later GET"
    );

    let (status, repeat) = stream(&client, "/v1/environments", &request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(repeat.len(), 1);
    assert_eq!(repeat[0].1["environment"], *environment);
    host.remove(&id).await;
}

#[test]
fn the_cli_streams_exec_and_reports_exit_codes() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(host) = runtime.block_on(Host::start("")) else {
        return;
    };
    let narya = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_narya"))
            .arg("--socket")
            .arg(&host.daemon.socket)
            .args(args)
            .env("NARYA_TOKEN", host.token("acme"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let id = unique_id("cli");
    let created = narya(&["env", "create", &id, "--json"], "");
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let env: Value =
        serde_json::from_slice(&created.stdout).expect("--json prints only the environment");
    assert_eq!(env["status"], "ready");

    let id2 = unique_id("cliplain");
    std::fs::write(host.daemon.dir.path().join("s.sh"), "echo building\n").unwrap();
    let setup = host.daemon.dir.path().join("s.sh").display().to_string();
    let plain = narya(&["env", "create", &id2, "--setup", &setup, "--follow"], "");
    assert!(plain.status.success());
    let progress = String::from_utf8_lossy(&plain.stderr);
    assert!(
        progress.contains("setup started") && progress.contains("setup finished"),
        "plain progress lines: {progress}"
    );
    assert!(
        String::from_utf8_lossy(&plain.stdout).contains("building\n"),
        "--follow prints the setup output"
    );

    let out = narya(
        &[
            "env",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "cat; echo to-stderr >&2; exit 3",
        ],
        "piped in\n",
    );
    assert_eq!(out.status.code(), Some(3));
    // stdout and stderr travel in two pipes: both arrive, in an order nobody promises.
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("piped in\n") && printed.contains("to-stderr\n") && printed.len() == 19,
        "{printed:?}"
    );
    let out = narya(
        &["env", "exec", &id, "--timeout", "1s", "--", "sleep", "30"],
        "",
    );
    assert_eq!(out.status.code(), Some(124));
    let out = narya(
        &[
            "env",
            "exec",
            &id,
            "-n",
            "-e",
            "A=b",
            "--cwd",
            "/tmp",
            "--",
            "sh",
            "-c",
            "echo $A; pwd",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "b\n/tmp\n");
    let out = narya(&["env", "exec", "no-such-env", "--", "true"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NRY-0030"));
    let listed = narya(&["env", "list"], "");
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(
        table.starts_with("ID") && table.contains(&id) && table.contains("ready"),
        "{table}"
    );
    runtime.block_on(host.remove(&id));
    runtime.block_on(host.remove(&id2));
}

async fn a_streamed_repeat_joins_the_create_in_flight(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("joined");
    // The setup holds after `early` until the repeat has joined.
    let request = json!({"id": id, "setup": format!("echo early; {HELD}; echo late")});
    let mut first = client
        .stream_json(Method::POST, "/v1/environments", &request)
        .await
        .unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    loop {
        let line = first
            .next_line()
            .await
            .unwrap()
            .expect("the stream goes on");
        if line.contains("early") {
            break;
        }
    }
    // Its status line is answered once it has joined: only then may the setup go on.
    let mut repeat = host
        .daemon
        .tcp(Some(&host.token("acme")))
        .stream_json(Method::POST, "/v1/environments", &request)
        .await
        .unwrap();
    assert_eq!(
        repeat.status,
        StatusCode::OK,
        "a repeat while provisioning joins it"
    );
    std::fs::write(release_file(&host.workspace(&id)), "").unwrap();
    let mut joined = Vec::new();
    while let Some(line) = repeat.next_line().await.unwrap() {
        joined.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    let output: String = joined.iter().filter_map(|l| l["output"].as_str()).collect();
    assert_eq!(
        output, "released\nlate\n",
        "the joiner streams from where it joined"
    );
    let mut rest = Vec::new();
    while let Some(line) = first.next_line().await.unwrap() {
        rest.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    let final_first = &rest.last().unwrap()["environment"];
    assert_eq!(joined.last().unwrap()["environment"], *final_first);
    assert_eq!(final_first["setup"]["output"], "early\nreleased\nlate\n");
    assert_eq!(host.machines_labelled(&id).await, 1);
    host.remove(&id).await;
}

on_every_engine!(
    commands_run_as_the_unprivileged_user_with_their_env_cwd_and_stdin,
    streamed_output_arrives_while_the_command_runs,
    timed_out_and_abandoned_commands_leave_nothing_running,
    many_commands_at_once_across_environments,
    commands_run_only_in_ready_environments_of_your_organisation,
    a_streamed_create_shows_setup_output_before_the_environment,
    a_streamed_repeat_joins_the_create_in_flight,
);
