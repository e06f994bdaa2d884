//! Repositories cloned through the organisation's GitHub App installation, end to end: a real
//! daemon on a real runtime, the official image, and a GitHub double (REST API and git smart
//! HTTP through `git http-backend`) on loopback.

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use hyper::{Method, StatusCode};
use narya::client::{Answer, Client};
use serde_json::{json, Value};
use support::e2e::{body, create, get, unique_id, Backend, Host, NAMESPACE};
use support::github::{assert_holds_no_token, connect_with_code, GitHubDouble};

/// The build script of the double's repository: what a setup builds from the clone.
const BUILD_SH: &str =
    "#!/bin/sh\nset -e\necho \"built from $(git -C /workspace rev-parse HEAD)\" > built.txt\n";

/// Connects acme to `installation` as a person of acme who can access it.
async fn connect(double: &GitHubDouble, client: &Client, installation: i64) -> Answer {
    double.connect_as(client, "acme-admin", installation).await
}

async fn exec(client: &Client, id: &str, script: &str) -> Value {
    let answer = client
        .send_json(
            Method::POST,
            &format!("/v1/environments/{id}/exec"),
            &json!({"argv": ["bash", "-c", script]}),
        )
        .await
        .unwrap();
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    body(&answer)
}

/// Every file under `dir`, `.git/` included.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                pending.push(entry.path());
            }
            found.push(entry.path());
        }
    }
    found
}

/// The runtime's own description of environment `id`'s machine (its spec and labels) and when
/// it was made.
async fn machine_record(host: &Host, id: &str) -> (String, SystemTime) {
    let name = host.machine(id).await.name;
    let (output, created) = match host.backend {
        Backend::Containerd => {
            let out = Command::new("ctr")
                .args(["--address", &host.socket, "-n", NAMESPACE])
                .args(["containers", "info", &name])
                .output()
                .expect("ctr runs");
            assert!(out.status.success(), "ctr containers info {name}");
            let info: Value = serde_json::from_slice(&out.stdout).unwrap();
            let created = info["CreatedAt"].as_str().unwrap().to_owned();
            (out.stdout, created)
        }
        Backend::Docker | Backend::Podman => {
            let out = Command::new("docker")
                .args(["-H", &format!("unix://{}", host.socket), "inspect", &name])
                .output()
                .expect("docker runs");
            assert!(out.status.success(), "docker inspect {name}");
            let info: Value = serde_json::from_slice(&out.stdout).unwrap();
            let created = info[0]["Created"].as_str().unwrap().to_owned();
            (out.stdout, created)
        }
    };
    let created =
        time::OffsetDateTime::parse(&created, &time::format_description::well_known::Rfc3339)
            .unwrap();
    (
        String::from_utf8(output).unwrap(),
        SystemTime::from(created),
    )
}

/// Reads a streamed create to its end: the status and every line.
async fn streamed_create(client: &Client, request: &Value) -> (StatusCode, Vec<Value>, String) {
    let mut answer = client
        .stream_json(Method::POST, "/v1/environments", request)
        .await
        .unwrap();
    let status = answer.status;
    let mut lines = Vec::new();
    let mut raw = String::new();
    while let Some(line) = answer.next_line().await.unwrap() {
        raw.push_str(&line);
        raw.push('\n');
        lines.push(serde_json::from_str(&line).unwrap());
    }
    (status, lines, raw)
}

/// Nothing of environment `id` exists: no row, no machine, no workspace.
async fn assert_nothing_made(host: &Host, client: &Client, id: &str) {
    assert_eq!(get(client, id).await.status, StatusCode::NOT_FOUND);
    let listed = client
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(body(&listed)["environments"], json!([]));
    assert_eq!(host.machines_labelled(id).await, 0);
    assert!(!host.workspace(id).exists(), "a workspace was made");
}

async fn a_selected_repository_is_cloned_before_the_machine_and_its_token_is_kept_nowhere(
    backend: Backend,
) {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    let commit = double.create_repository(
        "acme/app",
        &[
            ("README.md", "hello from the double\n"),
            ("build.sh", BUILD_SH),
        ],
    );
    let Some(host) = Host::start_on(backend, &double.toml()).await else {
        return;
    };
    let client = host.acme();
    let connected = connect(&double, &client, 7).await;
    assert_eq!(
        connected.status,
        StatusCode::NO_CONTENT,
        "{}",
        String::from_utf8_lossy(&connected.body)
    );
    let id = unique_id("clone");
    let setup = "git -C /workspace log -1 --format='commit %H'\nsh build.sh\ncat built.txt\n";
    let (status, lines, raw) = streamed_create(
        &client,
        &json!({"id": id, "repository": "acme/app", "setup": setup}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{raw}");
    let env = lines
        .last()
        .map_or(Value::Null, |l| l["environment"].clone());
    assert_eq!(
        env["status"],
        "ready",
        "the stream did not end ready:\n{raw}\n{}",
        host.daemon.log()
    );
    assert_eq!(env["repository"], "acme/app");
    assert_eq!(env["setup"]["step"], "setup");
    assert_eq!(env["setup"]["state"], "succeeded");
    let output = env["setup"]["output"].as_str().unwrap();
    assert!(output.contains(&format!("commit {commit}")), "{output:?}");
    assert!(
        output.contains(&format!("built from {commit}")),
        "the setup built what was cloned: {output:?}"
    );
    let position = |wanted: Value| {
        lines
            .iter()
            .position(|l| *l == wanted)
            .unwrap_or_else(|| panic!("no {wanted} in {raw}"))
    };
    let clone_started = position(json!({"step": "clone", "state": "started"}));
    let clone_finished = position(json!({"step": "clone", "state": "finished"}));
    let machine_started = position(json!({"step": "machine", "state": "started"}));
    assert!(position(json!({"step": "image", "state": "finished"})) < clone_started);
    assert!(clone_started < clone_finished && clone_finished < machine_started);

    // The workspace holds the clone, all of it the environment user's.
    let workspace = host.workspace(&id);
    for file in ["README.md", "build.sh", "built.txt", ".git/HEAD"] {
        assert!(workspace.join(file).exists(), "{file} missing");
    }
    for file in files_under(&workspace) {
        let meta = std::fs::symlink_metadata(&file).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (1000, 1000),
            "{} is not the environment user's",
            file.display()
        );
    }

    // One token, for the clone: that repository, contents read, revoked after it (the
    // selection is checked with the App's own JWT).
    let tokens = double.tokens();
    let clone_tokens: Vec<_> = tokens.iter().collect();
    assert_eq!(clone_tokens.len(), 1, "{tokens:?}");
    let clone_token = clone_tokens[0];
    assert_eq!(clone_token.installation, 7);
    assert_eq!(clone_token.repositories, Some(vec!["app".to_owned()]));
    assert_eq!(clone_token.permissions, json!({"contents": "read"}));
    assert!(
        tokens.iter().all(|t| t.revoked_at.is_some()),
        "a token was left live: {tokens:?}"
    );
    let git = double.git_requests();
    assert!(!git.is_empty());
    // git asks without credentials first; its helper answers GitHub's 401 with the token.
    assert!(
        git.iter()
            .all(|r| r.status == 200 || (r.status == 401 && r.authorization.is_none())),
        "{git:?}"
    );
    let revoked_at = clone_token.revoked_at.unwrap();
    assert!(git.iter().all(|r| r.at <= revoked_at));

    // The clone ran before the machine existed.
    let (machine, created) = machine_record(&host, &id).await;
    let last_git = git.iter().map(|r| r.at).max().unwrap();
    assert!(
        last_git < created,
        "the machine was made at {created:?}, before the clone's last request at {last_git:?}"
    );

    // The token is nowhere.
    let forms = double.token_forms();
    for file in files_under(&workspace) {
        if file.is_file() {
            assert_holds_no_token(
                &file.display().to_string(),
                &std::fs::read(&file).unwrap(),
                &forms,
            );
        }
    }
    let remote = exec(&client, &id, "git -C /workspace remote -v").await;
    let remote = remote["output"].as_str().unwrap();
    assert!(
        remote.contains(&format!(
            "origin\t{}/acme/app.git (fetch)",
            double.git_url()
        )),
        "{remote:?}"
    );
    assert_holds_no_token("git remote -v", remote.as_bytes(), &forms);
    let environ = exec(
        &client,
        &id,
        "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null; true",
    )
    .await;
    let environ = environ["output"].as_str().unwrap();
    assert!(
        environ.contains("HOME="),
        "read no environment: {environ:?}"
    );
    assert_holds_no_token(
        "the machine's processes' environment",
        environ.as_bytes(),
        &forms,
    );
    assert!(!environ.contains("GIT_CONFIG"), "{environ:?}");
    assert_holds_no_token(
        "the runtime's record of the machine",
        machine.as_bytes(),
        &forms,
    );
    assert!(!machine.contains("x-access-token"));
    assert_holds_no_token("the streamed create", raw.as_bytes(), &forms);
    let got = get(&client, &id).await;
    assert_holds_no_token("GET", &got.body, &forms);
    let state = host.daemon.dir.path().join("state");
    for db in ["narya.db", "narya.db-wal", "narya.db-shm"] {
        if let Ok(bytes) = std::fs::read(state.join(db)) {
            assert_holds_no_token(db, &bytes, &forms);
        }
    }
    assert_holds_no_token("the daemon's log", host.daemon.log().as_bytes(), &forms);
    host.remove(&id).await;
}

async fn an_organisation_without_an_installation_is_refused_before_anything_is_made(
    backend: Backend,
) {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    let Some(host) = Host::start_on(backend, &double.toml()).await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("unconnected");
    let answer = create(
        &client,
        json!({"id": id, "repository": "acme/app", "setup": "true"}),
    )
    .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    let error = answer.error().unwrap();
    assert_eq!(error.code, "NRY-0050");
    for gesture in [
        double.connect_url(),
        "narya github connect",
        "PUT /v1/organisation/github",
    ] {
        assert!(error.message.contains(gesture), "{}", error.message);
    }
    // A streamed create is refused the same way, as a plain error.
    let mut streamed = client
        .stream_json(
            Method::POST,
            "/v1/environments",
            &json!({"id": id, "repository": "acme/app"}),
        )
        .await
        .unwrap();
    assert_eq!(streamed.status, StatusCode::FORBIDDEN);
    assert!(!streamed.streaming);
    let _ = streamed.next_line().await;
    assert_nothing_made(&host, &client, &id).await;
    assert!(double.tokens().is_empty(), "a token was minted");
    assert!(
        double.api_requests().is_empty(),
        "GitHub was asked: {:?}",
        double.api_requests()
    );
}

async fn a_repository_outside_the_selection_is_refused_before_anything_is_made(backend: Backend) {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    double.create_repository("acme/other", &[("README.md", "not selected\n")]);
    let Some(host) = Host::start_on(backend, &double.toml()).await else {
        return;
    };
    let client = host.acme();
    assert_eq!(
        connect(&double, &client, 7).await.status,
        StatusCode::NO_CONTENT
    );
    let id = unique_id("unselected");
    for repository in ["acme/other", "globex/app"] {
        let answer = create(
            &client,
            json!({"id": id, "repository": repository, "setup": "true"}),
        )
        .await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{repository}");
        let error = answer.error().unwrap();
        assert_eq!(error.code, "NRY-0051");
        for named in [
            repository,
            double.connect_url(),
            "narya github connect",
            "PUT /v1/organisation/github",
        ] {
            assert!(error.message.contains(named), "{}", error.message);
        }
    }
    assert_nothing_made(&host, &client, &id).await;
    assert!(
        double.tokens().is_empty(),
        "a token was minted: {:?}",
        double.tokens()
    );
    assert!(double.git_requests().is_empty());
}

async fn an_unanswering_github_is_503_and_changes_nothing(backend: Backend) {
    let dead = format!("http://127.0.0.1:{}", support::free_port());
    let double = GitHubDouble::start().await;
    let toml = double.toml().replace(&double.url, &dead);
    let Some(host) = Host::start_on(backend, &toml).await else {
        return;
    };
    let client = host.acme();
    let answer = connect(&double, &client, 7).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    let error = answer.error().unwrap();
    assert_eq!(error.code, "NRY-0060");
    assert!(error.message.contains("GitHub"), "{}", error.message);
    let refused = create(&client, json!({"id": "x", "repository": "acme/app"})).await;
    assert_eq!(
        refused.error().unwrap().code,
        "NRY-0050",
        "nothing was connected"
    );
}

async fn a_clone_that_fails_leaves_the_environment_unusable_with_gits_output(backend: Backend) {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app", "missing"]);
    double.create_repository("acme/app", &[("README.md", "hello\n")]);
    let Some(host) = Host::start_on(backend, &double.toml()).await else {
        return;
    };
    let client = host.acme();
    assert_eq!(
        connect(&double, &client, 7).await.status,
        StatusCode::NO_CONTENT
    );
    let setup = "touch /workspace/setup-ran";

    // Selected, but not on the git server.
    let missing = unique_id("missing");
    let answer = create(
        &client,
        json!({"id": missing, "repository": "acme/missing", "setup": setup}),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let env = body(&answer);
    assert_eq!(env["status"], "unusable", "{env}");
    assert_eq!(env["setup"]["step"], "clone");
    assert_eq!(env["setup"]["state"], "failed");
    assert_ne!(env["setup"]["exit_code"], 0);
    let output = env["setup"]["output"].as_str().unwrap();
    assert!(output.contains("not found"), "git's message: {output:?}");
    assert!(!host.workspace(&missing).join("setup-ran").exists());
    assert_eq!(
        host.machines_labelled(&missing).await,
        0,
        "no machine after a failed clone"
    );

    // The git server refuses the token.
    double.refuse_git_tokens(true);
    let refused = unique_id("refused");
    let (status, lines, raw) = streamed_create(
        &client,
        &json!({"id": refused, "repository": "acme/app", "setup": setup}),
    )
    .await;
    double.refuse_git_tokens(false);
    assert_eq!(status, StatusCode::CREATED, "{raw}");
    let env = lines.last().unwrap()["environment"].clone();
    assert_eq!(env["status"], "unusable", "{env}");
    assert_eq!(env["setup"]["step"], "clone");
    assert_eq!(env["setup"]["state"], "failed");
    let output = env["setup"]["output"].as_str().unwrap();
    assert!(
        output.contains("terminal prompts disabled") || output.contains("Authentication failed"),
        "git's message: {output:?}"
    );
    let streamed_output: String = lines
        .iter()
        .filter(|l| l["step"] == "clone")
        .filter_map(|l| l["output"].as_str())
        .collect();
    assert_eq!(streamed_output, output, "the clone's output was streamed");
    assert!(
        !lines
            .iter()
            .any(|l| l["step"] == "setup" || l["step"] == "machine"),
        "{raw}"
    );
    assert!(!host.workspace(&refused).join("setup-ran").exists());

    let forms = double.token_forms();
    assert_holds_no_token("the streamed create", raw.as_bytes(), &forms);
    assert_holds_no_token("the failed clone's answer", &answer.body, &forms);
    let tokens = double.tokens();
    assert!(tokens.iter().all(|t| t.revoked_at.is_some()), "{tokens:?}");
    assert_holds_no_token("the daemon's log", host.daemon.log().as_bytes(), &forms);

    // The reconciler leaves the cause standing; exec refuses; delete frees the id.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let env = body(&get(&client, &missing).await);
    assert_eq!(env["status"], "unusable", "{env}");
    assert_eq!(env["setup"]["step"], "clone");
    let exec = client
        .send_json(
            Method::POST,
            &format!("/v1/environments/{missing}/exec"),
            &json!({"argv": ["true"]}),
        )
        .await
        .unwrap();
    assert_eq!(exec.error().unwrap().code, "NRY-0042");
    for id in [&missing, &refused] {
        let deleted = client
            .send(Method::DELETE, &format!("/v1/environments/{id}"), None)
            .await
            .unwrap();
        assert_eq!(deleted.status, StatusCode::NO_CONTENT);
        assert!(!host.workspace(id).exists());
    }
}

async fn a_clone_past_its_bound_is_timed_out(backend: Backend) {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    double.create_repository("acme/app", &[("README.md", "hello\n")]);
    double.delay_git(Duration::from_secs(30));
    let extra = format!("[environment]\nclone_timeout = \"2s\"\n\n{}", double.toml());
    let Some(host) = Host::start_on(backend, &extra).await else {
        return;
    };
    let client = host.acme();
    assert_eq!(
        connect(&double, &client, 7).await.status,
        StatusCode::NO_CONTENT
    );
    let id = unique_id("slowclone");
    let started = Instant::now();
    let answer = create(
        &client,
        json!({"id": id, "repository": "acme/app", "setup": "true"}),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(25), "not bounded");
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let env = body(&answer);
    assert_eq!(env["status"], "unusable", "{env}");
    assert_eq!(env["setup"]["step"], "clone");
    assert_eq!(env["setup"]["state"], "timed_out");
    assert_eq!(env["setup"]["exit_code"], Value::Null);
    assert!(double.tokens().iter().all(|t| t.revoked_at.is_some()));
    assert_eq!(host.machines_labelled(&id).await, 0);
}

async fn without_a_github_section_repository_creates_are_refused_with_how_to_configure(
    backend: Backend,
) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let client = host.acme();
    let id = unique_id("nogithub");
    let answer = create(&client, json!({"id": id, "repository": "acme/app"})).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    let error = answer.error().unwrap();
    assert_eq!(error.code, "NRY-0050");
    assert!(error.message.contains("[github]"), "{}", error.message);
    assert_nothing_made(&host, &client, &id).await;
    let connect = connect_with_code(&client, 7, "a-code").await;
    assert_eq!(connect.status, StatusCode::FORBIDDEN);
    assert!(connect.error().unwrap().message.contains("[github]"));
}

on_every_engine!(
    a_selected_repository_is_cloned_before_the_machine_and_its_token_is_kept_nowhere,
    an_organisation_without_an_installation_is_refused_before_anything_is_made,
    a_repository_outside_the_selection_is_refused_before_anything_is_made,
    an_unanswering_github_is_503_and_changes_nothing,
    a_clone_that_fails_leaves_the_environment_unusable_with_gits_output,
    a_clone_past_its_bound_is_timed_out,
    without_a_github_section_repository_creates_are_refused_with_how_to_configure,
);
