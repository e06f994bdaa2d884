//! While a clone runs, its token is in none of the runtime's records, none of its files and no
//! process's environment; a daemon killed during a clone leaves no throwaway once it is back,
//! and the environment reads interrupted at step `clone`. A real daemon on a real runtime,
//! GitHub through its double, whose git server stalls.

mod support;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use narya_runtimes::{
    ImageSource, Network, ProcessSpec, Runtime, ThrowawayInfo, ThrowawaySpec, User,
};
use serde_json::json;
use support::e2e::{body, create, get, unique_id, Backend, Host, NAMESPACE};
use support::e2e::{files_holding, runtime_dirs};
use support::github::{assert_holds_no_token, GitHubDouble};

/// How long the double's git server holds each request: long enough to look around while the
/// clone waits, on a loaded machine.
const STALL: Duration = Duration::from_secs(15);

/// Environment `id`'s throwaways, found through the runtime by their labels.
async fn throwaways(runtime: &Arc<dyn Runtime>, id: &str) -> Vec<ThrowawayInfo> {
    let mut found = runtime.list_throwaways().await.unwrap();
    found.retain(|t| t.environment.as_deref() == Some(id));
    found
}

/// Removes what a test of environment `id` made in the shared runtime, also when it fails.
struct CleanUp {
    runtime: Arc<dyn Runtime>,
    id: String,
}

impl Drop for CleanUp {
    fn drop(&mut self) {
        let (runtime, id) = (self.runtime.clone(), self.id.clone());
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                if let Ok(found) = runtime.list_throwaways().await {
                    for t in found
                        .iter()
                        .filter(|t| t.environment.as_deref() == Some(&id))
                    {
                        let _ = runtime.remove_throwaway(&t.name).await;
                    }
                }
                if let Ok(machines) = runtime.machines_of(&id).await {
                    for m in machines {
                        let _ = runtime.remove(&m.id).await;
                    }
                }
            })
        });
    }
}

/// The runtime's own record of throwaway `name`, through its CLI.
fn runtime_record(host: &Host, name: &str) -> String {
    let out = match host.backend {
        Backend::Containerd => Command::new("ctr")
            .args(["--address", &host.socket, "-n", NAMESPACE])
            .args(["containers", "info", name])
            .output(),
        Backend::Docker | Backend::Podman => Command::new("docker")
            .args(["-H", &format!("unix://{}", host.socket), "inspect", name])
            .output(),
    }
    .expect("the runtime's CLI runs");
    assert!(
        out.status.success(),
        "the runtime has no record of {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The pid of a process whose command line holds every one of `parts`.
fn process_with(parts: &[&str]) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline);
            parts.iter().all(|p| cmdline.contains(p)).then_some(pid)
        })
}

/// Every process's environment and command line, as the host sees them.
fn every_process_environment() -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        for file in ["environ", "cmdline"] {
            let path = entry.path().join(file);
            // A process that ended meanwhile has nothing to read.
            if let Ok(bytes) = std::fs::read(&path) {
                found.push((path.display().to_string(), bytes));
            }
        }
    }
    found
}

/// Starts a create of `acme/app` as `id` in the background, and waits for its clone to be
/// running in its throwaway: answers the create's task and the throwaway's name.
async fn clone_under_way(
    host: &Host,
    double: &GitHubDouble,
    id: &str,
) -> (tokio::task::JoinHandle<narya::client::Answer>, String) {
    let creating = {
        let client = host.acme();
        let id = id.to_owned();
        tokio::spawn(
            async move { create(&client, json!({"id": id, "repository": "acme/app"})).await },
        )
    };
    let clone_url = format!("{}/acme/app.git", double.git_url());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = throwaways(&host.runtime, id).await;
        let running = process_with(&["narya-clone", &clone_url]).is_some();
        if let (Some(throwaway), true, false) = (found.first(), running, double.tokens().is_empty())
        {
            return (creating, throwaway.name.clone());
        }
        assert!(
            Instant::now() < deadline,
            "no clone under way within 60 s: {found:?}, process running {running}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn a_stalled_clone_keeps_its_token_out_of_the_runtime(backend: Backend) {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    double.create_repository("acme/app", &[("README.md", "stalled\n")]);
    let Some(host) = Host::start_on(backend, &double.toml()).await else {
        return;
    };
    let client = host.acme();
    let connected = double.connect_as(&client, "acme-admin", 7).await;
    assert_eq!(connected.status, StatusCode::NO_CONTENT);
    let id = unique_id("stalled");
    let _clean_up = CleanUp {
        runtime: host.runtime.clone(),
        id: id.clone(),
    };
    double.delay_git(STALL);
    let (creating, throwaway) = clone_under_way(&host, &double, &id).await;

    let forms = double.token_forms();
    assert_eq!(forms.len(), 2, "one token for the clone");
    let record = runtime_record(&host, &throwaway);
    assert!(record.contains("narya-clone"), "{record}");
    assert_holds_no_token(
        "the runtime's record of the throwaway",
        record.as_bytes(),
        &forms,
    );
    assert!(!record.contains("GIT_CONFIG"), "{record}");
    for (what, bytes) in every_process_environment() {
        assert_holds_no_token(&what, &bytes, &forms);
    }
    let holding = files_holding(&runtime_dirs(backend), &forms);
    assert!(holding.is_empty(), "files holding the token: {holding}");

    let created = creating.await.unwrap();
    assert_eq!(
        created.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let env = body(&created);
    assert_eq!(env["status"], "ready", "{env}");
    assert!(host.workspace(&id).join("README.md").exists());
    let tokens = double.tokens();
    assert!(tokens.iter().all(|t| t.revoked_at.is_some()), "{tokens:?}");
    assert!(throwaways(&host.runtime, &id).await.is_empty());
    assert_holds_no_token("the daemon's log", host.daemon.log().as_bytes(), &forms);
}

/// A throwaway of an environment this daemon's store does not know, as another daemon sharing
/// the runtime would run one; it sleeps until removed. Answers the task running it.
async fn foreign_throwaway(
    host: &Host,
    environment: &str,
    workspace: &std::path::Path,
) -> tokio::task::JoinHandle<()> {
    let image = host
        .runtime
        .ensure_image(&ImageSource {
            reference: format!("oci-layout:{}", host.layout).parse().unwrap(),
            pinned: None,
        })
        .await
        .unwrap();
    let spec = ThrowawaySpec {
        name: format!("narya-clone-{environment}"),
        image,
        workspace: workspace.to_owned(),
        mount_point: "/workspace".to_owned(),
        user: User {
            uid: 1000,
            gid: 1000,
        },
        network: Network::None,
        environment: environment.to_owned(),
        organisation: "acme".to_owned(),
        // Within this host's hard limit of open files, as the test daemons' own `[limits]`.
        limits: narya_runtimes::Limits {
            nofile: 1024,
            ..Default::default()
        },
        process: ProcessSpec {
            argv: vec!["sleep".to_owned(), "600".to_owned()],
            env: Default::default(),
            cwd: None,
            timeout: Duration::from_secs(600),
            output_limit: 1024,
            stdin: None,
            output: None,
        },
    };
    let runtime = host.runtime.clone();
    let running = tokio::spawn(async move {
        if let Err(e) = runtime.run_throwaway(&spec).await {
            eprintln!("the foreign throwaway ended: {e}");
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while throwaways(&host.runtime, environment).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the foreign throwaway did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running
}

async fn a_daemon_killed_during_a_clone_leaves_no_throwaway_once_back(backend: Backend) {
    let double = GitHubDouble::start().await;
    double.install(7, "acme", &["app"]);
    double.create_repository("acme/app", &[("README.md", "never\n")]);
    let Some(mut host) = Host::start_on(backend, &double.toml()).await else {
        return;
    };
    let client = host.acme();
    let connected = double.connect_as(&client, "acme-admin", 7).await;
    assert_eq!(connected.status, StatusCode::NO_CONTENT);
    let id = unique_id("clonekill");
    let _clean_up = CleanUp {
        runtime: host.runtime.clone(),
        id: id.clone(),
    };
    // Another daemon's clone: not this store's environment, so never swept by this daemon.
    let foreign = unique_id("foreign");
    let _clean_up_foreign = CleanUp {
        runtime: host.runtime.clone(),
        id: foreign.clone(),
    };
    let foreign_workspace = tempfile::tempdir().unwrap();
    let foreign_run = foreign_throwaway(&host, &foreign, foreign_workspace.path()).await;
    // The clone never gets an answer while this test runs.
    double.delay_git(Duration::from_secs(600));
    let (creating, throwaway) = clone_under_way(&host, &double, &id).await;

    tokio::task::block_in_place(|| {
        host.daemon.kill();
        host.daemon.restart();
    });
    let _ = creating.await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = throwaways(&host.runtime, &id).await;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "throwaway {throwaway} still there 10 s after the restart: {left:?}\n{}",
            host.daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let env = body(&get(&host.acme(), &id).await);
    assert_eq!(env["status"], "unusable", "{env}");
    assert_eq!(env["setup"]["state"], "interrupted", "{env}");
    assert_eq!(env["setup"]["step"], "clone", "{env}");
    assert_eq!(host.machines_labelled(&id).await, 0, "no machine was made");
    // Several passes of the restarted daemon's reconciler (every 2 s) left the other one alone.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        throwaways(&host.runtime, &foreign).await.len(),
        1,
        "another daemon's throwaway was swept"
    );
    host.runtime
        .remove_throwaway(&format!("narya-clone-{foreign}"))
        .await
        .unwrap();
    let _ = foreign_run.await;
}

on_every_engine!(
    a_stalled_clone_keeps_its_token_out_of_the_runtime,
    a_daemon_killed_during_a_clone_leaves_no_throwaway_once_back,
);
