//! Prebuilds: a create with a repository (GitHub's double over loopback) and a slow setup that
//! writes into the user's home and the workspace, first as a new key, then repeated under new
//! identifiers with the same key, on a daemon of its own with `[prebuild] enabled`.

use anyhow::{bail, Context, Result};
use hyper::{Method, StatusCode};
use narya::client::Client;
use serde_json::json;

use super::{timed, Plan};
use crate::daemon::{Daemon, Setup};
use crate::doubles::github::GitHubDouble;
use crate::raw::Backend;
use crate::stats::Samples;

/// How long the measured setup sleeps, and how much it writes (half into `/home/narya`, half
/// into the workspace), in a full run; a short run does a tenth of either.
pub const SETUP_SLEEP: u64 = 30;
pub const SETUP_MIB: u64 = 100;

pub struct PrebuildReport {
    /// Creates of a new key: clone, machine, setup, and making the prebuild.
    pub first: Samples,
    /// Creates of a key made before, each under a new identifier.
    pub repeat: Samples,
    /// What one prebuild keeps on the host (its layer and its workspace copy), in bytes.
    pub bytes: u64,
    pub sleep: u64,
    pub mib: u64,
}

/// Starts the daemon and the double, measures, and removes everything it made.
pub async fn measure_prebuild(
    setup: &Setup<'_>,
    backend: Backend,
    token: &str,
    plan: &Plan,
    prefix: &str,
) -> Result<PrebuildReport, String> {
    let double = GitHubDouble::start().await;
    double.install(7, "bench", &["app"]);
    double.create_repository("bench/app", &[("README.md", "measured\n")]);
    let extra = format!("[prebuild]\nenabled = true\n\n{}", double.toml());
    let setup = Setup {
        extra: &extra,
        ..setup.clone()
    };
    let daemon = Daemon::start(&setup, backend, token, "isolated")
        .await
        .map_err(|e| format!("{e:#}"))?;
    let client = daemon.client(token);
    let mut made = Vec::new();
    let measured = measure(&daemon, &client, &double, plan, prefix, &mut made).await;
    for id in &made {
        let _ = client
            .send(Method::DELETE, &format!("/v1/environments/{id}"), None)
            .await;
    }
    let measured = measured.map_err(|e| format!("{e:#}\n{}", daemon.log_tail()));
    let layers = kept_layers(&daemon);
    let stopped = daemon.stop().await;
    let socket = match backend {
        Backend::Containerd => setup.containerd_socket,
        Backend::Docker => setup.docker_socket,
    };
    remove_layers(backend, socket, &layers).await;
    let measured = measured?;
    stopped.map_err(|e| format!("{e:#}"))?;
    Ok(measured)
}

async fn measure(
    daemon: &Daemon,
    client: &Client,
    double: &GitHubDouble,
    plan: &Plan,
    prefix: &str,
    made: &mut Vec<String>,
) -> Result<PrebuildReport> {
    let connected = double.connect_as(client, "bench-admin", 7).await;
    if connected.status != StatusCode::NO_CONTENT {
        bail!(
            "connecting the double's installation answered {}",
            connected.status
        );
    }
    let (sleep, mib, firsts, repeats) = if plan.short {
        (SETUP_SLEEP / 10, SETUP_MIB / 10, 1, 3)
    } else {
        (SETUP_SLEEP, SETUP_MIB, 3, 10)
    };
    let half = mib * (1 << 20) / 2;
    // Each first create is a key of its own: the same setup, told apart by a comment.
    let script = |key: usize| {
        format!(
            "# key {key}\nsleep {sleep}\nhead -c {half} /dev/urandom > /home/narya/blob\n\
             head -c {half} /dev/urandom > /workspace/blob\n"
        )
    };
    let create = |id: String, key: usize| {
        let body = json!({"id": id, "repository": "bench/app", "setup": script(key)});
        async move {
            let answer = client
                .send_json(Method::POST, "/v1/environments", &body)
                .await?;
            let env: serde_json::Value = serde_json::from_slice(&answer.body).unwrap_or_default();
            if answer.status != StatusCode::CREATED || env["status"] != "ready" {
                bail!(
                    "create of {id} answered {}: {}",
                    answer.status,
                    String::from_utf8_lossy(&answer.body)
                );
            }
            Ok(env)
        }
    };
    eprintln!(
        "  create with a repository and a setup of sleep {sleep} + {mib} MiB: {firsts} new keys, \
         {repeats} repeats"
    );
    let mut report = PrebuildReport {
        first: Samples::default(),
        repeat: Samples::default(),
        bytes: 0,
        sleep,
        mib,
    };
    for key in 0..firsts {
        let id = format!("{prefix}first-{key}");
        made.push(id.clone());
        let (took, env) = timed(create(id.clone(), key)).await?;
        if env["setup"].get("prebuilt_at").is_some() {
            bail!("the first create of key {key} ({id}) was served from a prebuild");
        }
        report.first.push(took);
    }
    for n in 0..repeats {
        let id = format!("{prefix}repeat-{n}");
        made.push(id.clone());
        let (took, env) = timed(create(id.clone(), n % firsts)).await?;
        if !env["setup"]["prebuilt_at"].is_string() {
            bail!("the repeat create {id} ran its setup: no prebuild served it");
        }
        report.repeat.push(took);
    }
    report.bytes = prebuild_bytes(daemon).await? / firsts as u64;
    Ok(report)
}

/// The layers the daemon's prebuilds keep in the runtime: each workspace copy is named like
/// its layer.
fn kept_layers(daemon: &Daemon) -> Vec<String> {
    std::fs::read_dir(daemon.state.join("prebuilds"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes `layers` from the runtime once their daemon stopped, with the runtime's own CLI:
/// what the run measured leaves nothing behind.
async fn remove_layers(backend: Backend, socket: &str, layers: &[String]) {
    for layer in layers {
        let image = format!("narya.local/prebuild:{layer}");
        let mut command = match backend {
            Backend::Containerd => {
                let mut ctr = tokio::process::Command::new("ctr");
                ctr.args(["--address", socket, "-n", crate::raw::NAMESPACE])
                    .args(["images", "rm", &image]);
                ctr
            }
            Backend::Docker => {
                let mut docker = tokio::process::Command::new("docker");
                docker.args(["-H", &format!("unix://{socket}"), "rmi", "-f", &image]);
                docker
            }
        };
        if let Err(e) = command.output().await {
            eprintln!("narya-bench: cannot remove {image}: {e}");
        }
    }
}

/// What the daemon's prebuilds keep together, from its store.
async fn prebuild_bytes(daemon: &Daemon) -> Result<u64> {
    let url = format!("sqlite://{}?mode=ro", daemon.database().display());
    let pool = sqlx::SqlitePool::connect(&url)
        .await
        .context("cannot open the daemon's store")?;
    let total: i64 = sqlx::query_scalar("SELECT COALESCE(SUM(bytes), 0) FROM prebuilds")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    Ok(u64::try_from(total).unwrap_or(0))
}
