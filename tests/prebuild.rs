//! Prebuilds end to end: a real daemon with `[prebuild] enabled` on a real runtime, the official
//! image, and GitHub's double on loopback. A repeat create of the same key starts from what the
//! first one's setup made, and anything that differs provisions afresh.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use narya::client::Client;
use serde_json::{json, Value};
use support::e2e::{body, create, delete, exec, get, unique_id, Backend, Host};
use support::e2e::{files_holding, runtime_dirs};
use support::github::GitHubDouble;

/// Counts its runs in the workspace and in the user's home (the machine's writable layer), and
/// puts a tool into /usr/local: what a repeat create must find without running it again.
const SETUP: &str = "set -e
n=$(cat /workspace/.runs 2>/dev/null || echo 0); echo $((n + 1)) > /workspace/.runs
m=$(cat /home/narya/.runs 2>/dev/null || echo 0); echo $((m + 1)) > /home/narya/.runs
printf '#!/bin/sh\\necho tool of %s\\n' \"$(git -C /workspace rev-parse HEAD 2>/dev/null || echo none)\" > /usr/local/bin/tool
chmod +x /usr/local/bin/tool
echo \"setup ran at $(date +%s%N)\"
";

fn prebuild_toml(max_bytes: &str) -> String {
    format!("[prebuild]\nenabled = true\nmax_bytes = {max_bytes:?}\n")
}

/// Runs `script` in `id` through the API and answers its output, which must succeed.
async fn run(client: &Client, id: &str, script: &str) -> String {
    let answer = exec(client, id, &["bash", "-c", script]).await;
    assert_eq!(answer.status, StatusCode::OK);
    let result = body(&answer);
    assert_eq!(result["exit_code"], 0, "{script}: {result}");
    result["output"].as_str().unwrap_or_default().to_owned()
}

/// Creates `request` and answers the environment, which must be new and `ready`.
async fn created_ready(host: &Host, client: &Client, request: Value) -> Value {
    let answer = create(client, request).await;
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "{}\n{}",
        String::from_utf8_lossy(&answer.body),
        host.daemon.log()
    );
    let env = body(&answer);
    assert_eq!(env["status"], "ready", "{env}\n{}", host.daemon.log());
    env
}

/// Where the daemon keeps prebuilds' workspace copies.
fn copies_dir(host: &Host) -> PathBuf {
    host.daemon.dir.path().join("state/prebuilds")
}

fn copies(host: &Host) -> Vec<String> {
    match std::fs::read_dir(copies_dir(host)) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Removes the layers a test's daemon kept (their images in the shared runtime) when the test
/// ends, also when it failed: every prebuild left has its workspace copy named like its layer.
struct KeptLayers {
    backend: Backend,
    socket: String,
    copies: PathBuf,
}

impl KeptLayers {
    fn of(host: &Host) -> KeptLayers {
        KeptLayers {
            backend: host.backend,
            socket: host.socket.clone(),
            copies: copies_dir(host),
        }
    }
}

impl Drop for KeptLayers {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.copies) else {
            return;
        };
        for entry in entries.flatten() {
            let image = format!(
                "narya.local/prebuild:{}",
                entry.file_name().to_string_lossy()
            );
            let _ = remove_image(self.backend, &self.socket, &image);
        }
    }
}

/// Removes `image` from the runtime behind the daemon's back, with its own CLI.
fn remove_image(backend: Backend, socket: &str, image: &str) -> std::process::Output {
    match backend {
        Backend::Containerd => std::process::Command::new("ctr")
            .args(["--address", socket, "-n", support::e2e::NAMESPACE])
            .args(["images", "rm", "--sync", image])
            .output(),
        Backend::Docker | Backend::Podman => std::process::Command::new("docker")
            .args(["-H", &format!("unix://{socket}"), "rmi", "-f", image])
            .output(),
    }
    .expect("the runtime's CLI runs")
}

/// The git requests that fetched objects (not only the refs) so far.
fn fetches(double: &GitHubDouble) -> usize {
    double
        .git_requests()
        .iter()
        .filter(|r| r.path.ends_with("git-upload-pack") && r.status == 200)
        .count()
}

async fn a_repeat_create_of_the_same_key_starts_from_the_first_ones_setup(backend: Backend) {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    let first_commit = double.create_repository("acme/app", &[("README.md", "hello\n")]);
    let extra = format!("{}\n{}", prebuild_toml("20GiB"), double.toml());
    let Some(mut host) = Host::start_on(backend, &extra).await else {
        return;
    };
    let _layers = KeptLayers::of(&host);
    let client = host.acme();
    let connected = double.connect_as(&client, "acme-admin", 7).await;
    assert_eq!(connected.status, StatusCode::NO_CONTENT);
    let request = |id: &str| json!({"id": id, "repository": "acme/app", "setup": SETUP});

    // The first create runs its setup and keeps what it made.
    let first = unique_id("pb-first");
    let made = created_ready(&host, &client, request(&first)).await;
    assert_eq!(made["setup"]["state"], "succeeded");
    assert!(made["setup"].get("prebuilt_at").is_none(), "{made}");
    assert_eq!(copies(&host).len(), 1, "one prebuild kept");
    let fetched = fetches(&double);

    // The second, of another identifier and the same key, runs no setup and clones nothing.
    let second = unique_id("pb-second");
    let started = Instant::now();
    let repeat = created_ready(&host, &client, request(&second)).await;
    let took = started.elapsed();
    let setup = &repeat["setup"];
    assert_eq!(setup["state"], "succeeded");
    assert_eq!(
        setup["output"], made["setup"]["output"],
        "the record of the run that made it"
    );
    assert_eq!(setup["started_at"], made["setup"]["started_at"]);
    let prebuilt_at = setup["prebuilt_at"].as_str().expect("prebuilt_at is set");
    assert!(
        humantime::parse_rfc3339(prebuilt_at).is_ok(),
        "{prebuilt_at}"
    );
    assert_eq!(repeat["image_digest"], made["image_digest"]);
    assert_eq!(fetches(&double), fetched, "the repeat fetched objects");
    assert_eq!(run(&client, &second, "cat /workspace/.runs").await, "1\n");
    assert_eq!(run(&client, &second, "cat /home/narya/.runs").await, "1\n");
    assert_eq!(
        run(&client, &second, "cat /workspace/README.md; tool").await,
        format!("hello\ntool of {first_commit}\n")
    );
    assert_eq!(
        std::fs::read_to_string(host.workspace(&second).join(".runs")).unwrap(),
        "1\n"
    );
    eprintln!("repeat create took {took:?}");

    // The installation token is in no layer the runtime keeps, and in no workspace copy.
    let forms = double.token_forms();
    assert!(!forms.is_empty());
    let mut dirs = runtime_dirs(backend);
    dirs.push(copies_dir(&host));
    let holding = files_holding(&dirs, &forms);
    assert!(holding.is_empty(), "files hold the token: {holding}");

    // What the second one writes is its own: the first and the prebuild stay as they were.
    run(
        &client,
        &second,
        "echo mine > /home/narya/mine; echo 5 > .runs",
    )
    .await;
    assert_eq!(
        run(&client, &first, "cat /workspace/.runs; ls /home/narya").await,
        "1\n"
    );

    // Replaced after its machine went, it starts from the prebuild again: no setup runs, and
    // the workspace is its own.
    let machine = host.machine(&second).await;
    host.remove_machine(&machine).await;
    let gone = support::e2e::until(&client, &second, Duration::from_secs(60), "gone", |env| {
        env["status"] == "gone"
    })
    .await;
    assert_eq!(gone["status"], "gone");
    let replaced = client
        .send(
            Method::POST,
            &format!("/v1/environments/{second}/replace"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(replaced.status, StatusCode::OK, "{}", host.daemon.log());
    assert_eq!(body(&replaced)["setup"]["prebuilt_at"], prebuilt_at);
    assert_eq!(
        run(&client, &second, "cat /home/narya/.runs /workspace/.runs").await,
        "1\n5\n"
    );

    // A changed script provisions afresh.
    let changed = unique_id("pb-script");
    let env = created_ready(
        &host,
        &client,
        json!({"id": changed, "repository": "acme/app", "setup": format!("{SETUP}true\n")}),
    )
    .await;
    assert!(env["setup"].get("prebuilt_at").is_none(), "{env}");
    assert_eq!(run(&client, &changed, "cat /home/narya/.runs").await, "1\n");

    // A default branch that moved provisions afresh from its new commit.
    let second_commit = double.push_commit("acme/app", &[("README.md", "moved\n")]);
    let moved = unique_id("pb-moved");
    let env = created_ready(&host, &client, request(&moved)).await;
    assert!(env["setup"].get("prebuilt_at").is_none(), "{env}");
    assert_eq!(
        run(&client, &moved, "cat README.md; tool").await,
        format!("moved\ntool of {second_commit}\n")
    );
    let again = unique_id("pb-moved-again");
    let env = created_ready(&host, &client, request(&again)).await;
    assert!(env["setup"]["prebuilt_at"].is_string(), "{env}");
    assert_eq!(run(&client, &again, "cat README.md").await, "moved\n");

    // Every token minted was revoked, those that only read the default branch too.
    assert!(double.tokens().iter().all(|t| t.revoked_at.is_some()));

    // Another image digest matches none of these: its creates provision afresh, and once one
    // pinned it, the old digest's prebuilds nobody stands on are retired.
    for id in [&first, &second, &changed, &moved, &again] {
        assert_eq!(delete(&client, id).await.status, StatusCode::NO_CONTENT);
    }
    let variant = variant_layout(Path::new(&host.layout), host.daemon.dir.path());
    host.daemon.kill();
    let config = std::fs::read_to_string(&host.daemon.config_path).unwrap();
    let config = config.replace(&host.layout, variant.to_str().unwrap());
    std::fs::write(&host.daemon.config_path, config).unwrap();
    host.daemon.restart();
    let client = host.acme();
    let other = unique_id("pb-digest");
    let env = created_ready(&host, &client, request(&other)).await;
    assert_ne!(env["image_digest"], made["image_digest"]);
    assert!(env["setup"].get("prebuilt_at").is_none(), "{env}");
    assert_eq!(run(&client, &other, "cat /home/narya/.runs").await, "1\n");
    assert_eq!(
        copies(&host).len(),
        1,
        "only the new digest's prebuild is kept"
    );
    assert_eq!(delete(&client, &other).await.status, StatusCode::NO_CONTENT);
    // The variant image goes too, once no daemon can bring it back (its pool would): no other
    // test knows it.
    host.daemon.kill();
    let digest = env["image_digest"].as_str().unwrap_or_default();
    let image = match backend {
        Backend::Containerd => format!("narya.local/official@{digest}"),
        Backend::Docker | Backend::Podman => format!(
            "narya.local/official:{}",
            digest.trim_start_matches("sha256:")
        ),
    };
    let _ = remove_image(backend, &host.socket, &image);
}

/// A copy of the OCI layout at `layout` whose image differs by one config label: another
/// manifest digest of the same files.
fn variant_layout(layout: &Path, dir: &Path) -> PathBuf {
    use sha2::{Digest as _, Sha256};
    let copy = dir.join("variant-layout");
    let status = std::process::Command::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(layout)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let blob = |digest: &str| {
        copy.join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let write = |bytes: &[u8]| {
        let digest = format!("sha256:{:x}", Sha256::digest(bytes));
        std::fs::write(blob(&digest), bytes).unwrap();
        digest
    };
    let mut index: Value =
        serde_json::from_slice(&std::fs::read(copy.join("index.json")).unwrap()).unwrap();
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(blob(&manifest_digest)).unwrap()).unwrap();
    let config_digest = manifest["config"]["digest"].as_str().unwrap().to_owned();
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(blob(&config_digest)).unwrap()).unwrap();
    config["config"]["Labels"]["dev.narya.test.variant"] = json!("2");
    let config_bytes = serde_json::to_vec(&config).unwrap();
    manifest["config"]["digest"] = json!(write(&config_bytes));
    manifest["config"]["size"] = json!(config_bytes.len());
    let manifest_bytes = serde_json::to_vec(&manifest).unwrap();
    index["manifests"][0]["digest"] = json!(write(&manifest_bytes));
    index["manifests"][0]["size"] = json!(manifest_bytes.len());
    std::fs::write(copy.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    copy
}

async fn a_setup_that_fails_or_another_organisation_never_gets_a_prebuild(backend: Backend) {
    let Some(host) = Host::start_on(backend, &prebuild_toml("20GiB")).await else {
        return;
    };
    let _layers = KeptLayers::of(&host);
    let acme = host.acme();
    let failing = "echo tried >> /home/narya/tries; exit 3";
    for _ in 0..2 {
        let id = unique_id("pb-fail");
        let answer = create(&acme, json!({"id": id, "setup": failing})).await;
        assert_eq!(answer.status, StatusCode::CREATED);
        let env = body(&answer);
        assert_eq!(env["status"], "unusable", "{env}");
        assert_eq!(env["setup"]["exit_code"], 3);
        assert!(env["setup"].get("prebuilt_at").is_none());
        assert_eq!(delete(&acme, &id).await.status, StatusCode::NO_CONTENT);
    }
    assert!(copies(&host).is_empty(), "a failed setup made a prebuild");

    // acme's prebuild of a setup without a repository serves acme, never globex.
    let made = unique_id("pb-acme");
    created_ready(&host, &acme, json!({"id": made, "setup": SETUP})).await;
    let repeat = unique_id("pb-acme-again");
    let env = created_ready(&host, &acme, json!({"id": repeat, "setup": SETUP})).await;
    assert!(env["setup"]["prebuilt_at"].is_string(), "{env}");
    let globex = host.client("globex");
    let theirs = unique_id("pb-globex");
    let env = created_ready(&host, &globex, json!({"id": theirs, "setup": SETUP})).await;
    assert!(env["setup"].get("prebuilt_at").is_none(), "{env}");
    assert_eq!(run(&globex, &theirs, "cat /home/narya/.runs").await, "1\n");
    for (client, id) in [(&acme, &made), (&acme, &repeat), (&globex, &theirs)] {
        assert_eq!(delete(client, id).await.status, StatusCode::NO_CONTENT);
    }
}

async fn past_max_bytes_the_least_recently_used_prebuild_leaves(backend: Backend) {
    // Each setup below writes 3 MiB, which containerd keeps twice (the layer's archive and its
    // unpacked snapshot) and Docker once; two prebuilds fit, three do not.
    let max_bytes = match backend {
        Backend::Containerd => "14MiB",
        Backend::Docker | Backend::Podman => "7MiB",
    };
    let Some(host) = Host::start_on(backend, &prebuild_toml(max_bytes)).await else {
        return;
    };
    let _layers = KeptLayers::of(&host);
    let client = host.acme();
    let setup = |name: &str| {
        format!("head -c 3145728 /dev/urandom > /home/narya/{name}.bin\necho {name}\n")
    };
    let make = |name: &'static str| {
        let client = &client;
        let host = &host;
        let setup = setup(name);
        async move {
            let id = unique_id(&format!("pb-{name}"));
            let env = created_ready(host, client, json!({"id": id, "setup": setup})).await;
            assert_eq!(delete(client, &id).await.status, StatusCode::NO_CONTENT);
            env["setup"]["prebuilt_at"].is_string()
        }
    };
    assert!(!make("a").await);
    assert!(!make("b").await);
    assert_eq!(copies(&host).len(), 2);
    // a is used again, so b is now the least recently used.
    assert!(make("a").await);
    assert!(!make("c").await);
    assert_eq!(copies(&host).len(), 2, "{:?}", copies(&host));
    assert!(make("a").await, "the recently used one stayed");
    assert!(make("c").await, "the newest stayed");
    assert!(!make("b").await, "the least recently used one left");
}

async fn a_daemon_killed_while_making_a_prebuild_leaves_none_to_serve(backend: Backend) {
    let Some(mut host) = Host::start_on(backend, &prebuild_toml("20GiB")).await else {
        return;
    };
    let _layers = KeptLayers::of(&host);
    let client = host.acme();
    // Enough in the layer that committing it takes a while.
    let setup = format!("{SETUP}head -c 419430400 /dev/zero > /home/narya/big\n");
    let first = unique_id("pb-killed");
    let mut stream = client
        .stream_json(
            Method::POST,
            "/v1/environments",
            &json!({"id": first, "setup": setup}),
        )
        .await
        .unwrap();
    let mut seen = String::new();
    let began = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = stream.next_line().await.unwrap() {
            seen.push_str(&line);
            seen.push('\n');
            if serde_json::from_str::<Value>(&line).ok()
                == Some(json!({"step": "setup", "state": "finished"}))
            {
                break;
            }
        }
        // The daemon says when it begins making the prebuild, before the create answers.
        while !host.daemon.log().contains("making a prebuild") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        began.is_ok(),
        "no prebuild was begun: {seen}\n{}",
        host.daemon.log()
    );
    assert!(
        !seen.contains("\"environment\""),
        "the create answered before it could be killed: {seen}"
    );
    host.daemon.kill();
    host.daemon.restart();
    let client = host.acme();
    // What was half-made is taken back once the daemon is up and the runtime answers.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !copies(&host).is_empty() {
        assert!(Instant::now() < deadline, "left: {:?}", copies(&host));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let interrupted = body(&get(&client, &first).await);
    assert_eq!(interrupted["status"], "unusable", "{interrupted}");
    let second = unique_id("pb-after-kill");
    let env = created_ready(&host, &client, json!({"id": second, "setup": setup})).await;
    assert!(env["setup"].get("prebuilt_at").is_none(), "{env}");
    assert_eq!(run(&client, &second, "cat /home/narya/.runs").await, "1\n");
    for id in [&first, &second] {
        let _ = delete(&client, id).await;
    }
}

async fn what_a_setup_leaves_running_is_frozen_while_kept_and_runs_on_after(backend: Backend) {
    let Some(host) = Host::start_on(backend, &prebuild_toml("20GiB")).await else {
        return;
    };
    let _layers = KeptLayers::of(&host);
    let client = host.acme();
    // A process the setup leaves behind, writing as fast as it can into the layer and the
    // workspace while the prebuild is made.
    let setup = "setsid sh -c 'while :; do echo tick >> /home/narya/ticks; echo tick >> /workspace/ticks; done' \
         </dev/null >/dev/null 2>&1 &
until [ -s /home/narya/ticks ] && [ -s /workspace/ticks ]; do sleep 0.05; done
echo started";
    let first = unique_id("pb-busy");
    created_ready(&host, &client, json!({"id": first, "setup": setup})).await;
    assert_eq!(copies(&host).len(), 1, "{}", host.daemon.log());
    // Thawed: it runs on in the environment that made the prebuild.
    let count = "wc -l < /home/narya/ticks";
    let before: u64 = run(&client, &first, count).await.trim().parse().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after: u64 = run(&client, &first, count).await.trim().parse().unwrap();
    assert!(
        after > before,
        "the setup's process stopped: {before} then {after}"
    );
    // What was kept is whole lines only, each file as it stood at one instant.
    let second = unique_id("pb-busy-again");
    let env = created_ready(&host, &client, json!({"id": second, "setup": setup})).await;
    assert!(env["setup"]["prebuilt_at"].is_string(), "{env}");
    let kept = run(
        &client,
        &second,
        "grep -cv '^tick$' /home/narya/ticks /workspace/ticks || true",
    )
    .await;
    assert_eq!(kept, "/home/narya/ticks:0\n/workspace/ticks:0\n");
    for id in [&first, &second] {
        assert_eq!(delete(&client, id).await.status, StatusCode::NO_CONTENT);
    }
}

async fn a_prebuild_whose_layer_the_runtime_lost_is_forgotten(backend: Backend) {
    let Some(host) = Host::start_on(backend, &prebuild_toml("20GiB")).await else {
        return;
    };
    let _layers = KeptLayers::of(&host);
    let client = host.acme();
    let first = unique_id("pb-lost");
    created_ready(&host, &client, json!({"id": first, "setup": SETUP})).await;
    let kept = copies(&host);
    assert_eq!(kept.len(), 1);
    // The committed layer removed behind the daemon's back.
    let image = format!("narya.local/prebuild:{}", kept[0]);
    let removed = remove_image(backend, &host.socket, &image);
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    // The create that meets it fails and is taken back; the prebuild is forgotten with it.
    let second = unique_id("pb-lost-again");
    let failed = create(&client, json!({"id": second, "setup": SETUP})).await;
    assert_ne!(failed.status, StatusCode::CREATED, "{}", host.daemon.log());
    assert!(failed.error().is_some());
    assert_eq!(get(&client, &second).await.status, StatusCode::NOT_FOUND);
    assert!(
        copies(&host).iter().all(|c| c != &kept[0]),
        "{:?}",
        copies(&host)
    );
    // Its retry provisions afresh, and makes a prebuild again.
    let env = created_ready(&host, &client, json!({"id": second, "setup": SETUP})).await;
    assert!(env["setup"].get("prebuilt_at").is_none(), "{env}");
    assert_eq!(run(&client, &second, "cat /home/narya/.runs").await, "1\n");
    assert_eq!(copies(&host).len(), 1);
    for id in [&first, &second] {
        assert_eq!(delete(&client, id).await.status, StatusCode::NO_CONTENT);
    }
}

on_every_engine!(
    a_repeat_create_of_the_same_key_starts_from_the_first_ones_setup,
    a_setup_that_fails_or_another_organisation_never_gets_a_prebuild,
);

on_both_backends!(
    what_a_setup_leaves_running_is_frozen_while_kept_and_runs_on_after,
    a_prebuild_whose_layer_the_runtime_lost_is_forgotten,
    past_max_bytes_the_least_recently_used_prebuild_leaves,
    a_daemon_killed_while_making_a_prebuild_leaves_none_to_serve,
);
