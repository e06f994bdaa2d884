//! The newer runtimes of the test matrix (containerd 2.1, Docker Engine 28): the main rows'
//! create and exec round trip, naryad against the runtime's own raw client, with the host's
//! runtime of the same back end measured in the same run as the reference. Two daemons of their
//! own on each back end, one on each runtime, both configured as the main rows' daemon
//! (machines isolated, no pool); every sample goes round the four sides (naryad and the raw
//! client on the host's runtime, then on the newer one), so that drift cancels between the
//! runtimes as it does between the sides.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;

use super::{Bench, Pair, Plan, SectionReport, SectionRun};
use crate::daemon::{Daemon, Setup};
use crate::raw::{Backend, Raw};

/// The newer runtime's daemon's `[network] subnet`: both daemons isolate at once; the host's
/// one gets a subnet of its own from `Daemon::start` (10.120–219.0.0/16).
pub const MATRIX_SUBNET: &str = "10.91.0.0/16";

/// One runtime's rows.
pub struct RuntimeRows {
    /// The runtime's server version.
    pub version: String,
    /// The raw side's create, as a command line.
    pub raw_create: String,
    pub create: Pair,
    pub exec: Pair,
}

pub struct MatrixReport {
    /// The host's runtime: the reference.
    pub host: RuntimeRows,
    /// The newer runtime of the matrix.
    pub newer: RuntimeRows,
}

impl SectionReport for MatrixReport {}

/// What became of the section on one back end; skipped where the matrix does not answer.
pub type MatrixRun = SectionRun<MatrixReport>;

/// The newer runtime of `backend`: its socket, its raw client and its version; or why there is
/// none (its variables unset, its `ctr` missing, or it does not answer).
async fn newer_runtime(backend: Backend) -> Result<(String, Raw, String), String> {
    let hint = "start the runtime matrix (`contrib/dev/services.sh start matrix`) and eval \
                `contrib/dev/services.sh env`";
    let variable = backend.matrix_variable();
    let socket = match std::env::var(variable) {
        Ok(s) if !s.is_empty() => s,
        _ => return Err(format!("{variable} is not set: {hint}")),
    };
    let bin = match std::env::var_os("NARYA_MATRIX_BIN") {
        Some(b) if !b.is_empty() => PathBuf::from(b),
        _ => return Err(format!("NARYA_MATRIX_BIN is not set: {hint}")),
    };
    let ctr = bin.join("ctr");
    if backend == Backend::Containerd && !ctr.is_file() {
        return Err(format!("no {}: {hint}", ctr.display()));
    }
    let raw = Raw::newer(backend, &socket, &bin);
    match raw.server_version().await {
        Ok(version) => Ok((socket, raw, version)),
        Err(e) => Err(format!(
            "the matrix's {} on {socket} does not answer ({e:#}): {hint}",
            backend.name()
        )),
    }
}

/// Starts a daemon on the host's runtime of `backend` (on `socket`) and one on the matrix's
/// newer runtime, measures, and removes everything they made; a skip (or under `CI=true` a
/// failure) where the newer runtime does not answer.
pub async fn measure_matrix(
    setup: &Setup<'_>,
    backend: Backend,
    socket: &str,
    token: &str,
    plan: Plan,
    prefix: &str,
) -> MatrixRun {
    let (newer_socket, newer_raw, newer_version) = match newer_runtime(backend).await {
        Ok(found) => found,
        Err(why) => return MatrixRun::missing(why),
    };
    let host_raw = Raw::new(backend, socket);
    let host_version = host_raw.version().await;
    let extra = format!("[network]\nsubnet = \"{MATRIX_SUBNET}\"\n");
    // A log of its own for each daemon.
    let with = |runtime: &str, extra| Setup {
        pool: 0,
        rows: 0,
        sandbox: "container",
        extra,
        log: setup
            .log
            .as_ref()
            .map(|log| log.with_extension(format!("{runtime}.log"))),
        ..setup.clone()
    };
    let host = with("host", "");
    let newer = match backend {
        Backend::Containerd => Setup {
            containerd_socket: &newer_socket,
            ..with("newer", &extra)
        },
        Backend::Docker => Setup {
            docker_socket: &newer_socket,
            ..with("newer", &extra)
        },
    };
    let start = |setup| async move {
        Daemon::start(setup, backend, token, "isolated")
            .await
            .map_err(|e| format!("{e:#}"))
    };
    let host_daemon = match start(&host).await {
        Ok(daemon) => daemon,
        Err(e) => return MatrixRun::Failed(e),
    };
    let newer_daemon = match start(&newer).await {
        Ok(daemon) => daemon,
        Err(e) => {
            let _ = host_daemon.stop().await;
            return MatrixRun::Failed(e);
        }
    };
    // No second daemon in this section: each bench's second client is its first, unused.
    let bench = |daemon: &Daemon, raw, side: &str| {
        let client = daemon.client(token);
        Bench::new(
            plan.clone(),
            client.clone(),
            client,
            raw,
            format!("{prefix}{side}-"),
        )
    };
    let benches = [
        bench(&host_daemon, host_raw, "h"),
        bench(&newer_daemon, newer_raw, "n"),
    ];
    let measured = compare(
        &benches,
        [&host_daemon, &newer_daemon],
        [host_version, newer_version],
    )
    .await;
    for bench in &benches {
        bench.sweep().await;
    }
    let measured = measured
        .map(|[host, newer]| MatrixReport { host, newer })
        .map_err(|e| {
            format!(
                "{e:#}\nthe daemon's on the host's runtime, last log lines:\n{}\nthe daemon's on \
                 the newer runtime:\n{}",
                host_daemon.log_tail(),
                newer_daemon.log_tail()
            )
        });
    let stopped = host_daemon.stop().await.and(newer_daemon.stop().await);
    MatrixRun::of(measured, stopped)
}

/// The create and exec rows on each runtime, each sample going round both runtimes; the caller
/// cleans up whatever happens.
async fn compare(
    benches: &[Arc<Bench>; 2],
    daemons: [&Daemon; 2],
    versions: [String; 2],
) -> Result<[RuntimeRows; 2]> {
    let samples = benches[0].plan.samples;
    eprintln!("  warm-up");
    let mut images = Vec::new();
    for (bench, daemon) in benches.iter().zip(daemons) {
        images.push(bench.warm_up(daemon).await?);
    }

    eprintln!(
        "  create, the host's runtime and the newer one in turn, each alternating \
         ({samples} samples a side)"
    );
    let mut create = [Pair::default(), Pair::default()];
    for _ in 0..samples {
        for ((bench, image), pair) in benches.iter().zip(&images).zip(&mut create) {
            bench.create_sample(image, pair).await?;
        }
    }

    let mut kept = Vec::new();
    for (bench, image) in benches.iter().zip(&images) {
        let id = bench.fresh_id("kept");
        bench.create_ours(&id).await?;
        let raw_kept = bench.exec_ready(image, &id).await?;
        kept.push((id, raw_kept));
    }
    eprintln!(
        "  exec round trip, the host's runtime and the newer one in turn, each alternating \
         ({samples} samples a side)"
    );
    let mut exec = [Pair::default(), Pair::default()];
    for i in 0..samples {
        for ((bench, (id, raw_kept)), pair) in benches.iter().zip(&kept).zip(&mut exec) {
            bench.exec_sample(id, raw_kept, i, pair).await?;
        }
    }
    for (bench, (id, raw_kept)) in benches.iter().zip(kept) {
        bench.delete_raw(&[raw_kept]).await?;
        bench.delete_ours(&id).await?;
    }

    Ok([0, 1].map(|i| RuntimeRows {
        version: versions[i].clone(),
        raw_create: benches[i].raw.create_command(&images[i], "ID"),
        create: std::mem::take(&mut create[i]),
        exec: std::mem::take(&mut exec[i]),
    }))
}
