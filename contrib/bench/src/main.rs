//! `narya-bench`: measures `naryad` side by side with the raw runtime it drives (containerd and
//! Docker), alternating the two sides within one run, and writes `BENCHMARKS.md`.
//!
//! Needs root, the test services and the official image, as the end-to-end tests do:
//!
//! ```sh
//! eval "$(contrib/dev/services.sh env)"
//! export NARYA_TEST_IMAGE_LAYOUT=/var/tmp/narya-image/official
//! cargo build --release --workspace --bin naryad --bin narya-bench
//! $CARGO_TARGET_DIR/release/narya-bench            # full run, writes ./BENCHMARKS.md
//! $CARGO_TARGET_DIR/release/narya-bench --short    # a few samples: proves it works
//! $CARGO_TARGET_DIR/release/narya-bench --only gvisor --out gvisor.md   # one section alone
//! $CARGO_TARGET_DIR/release/narya-bench --only matrix --short             # another, quickly
//! ```
//!
//! The section "Newer runtimes" (`--only matrix`) also needs the runtime matrix
//! (`contrib/dev/services.sh start matrix`, whose `env` names it); without it, it is skipped,
//! and under `CI=true` it fails the run.
//!
//! Exits 0 when every measurement ran, whether the targets hold or not; non-zero when anything
//! failed (a create, an exec, a raw command, the daemon). The raw runtime's own errors under the
//! concurrent exec loads are measured and reported, not failures of the run.

mod bench;
mod daemon;
mod doubles;
mod host;
mod raw;
mod report;
mod stats;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Parser;
use narya::devkeys::DevKey;
use serde_json::json;

use crate::bench::{Bench, ExecLoad, MatrixRun, OutputLoad, Plan, SandboxRun};
use crate::daemon::{Daemon, Setup};
use crate::raw::{Backend, Raw};
use crate::report::Outcome;

#[derive(Parser)]
#[command(
    name = "narya-bench",
    about = "Benchmarks naryad against the raw container runtime"
)]
struct Args {
    /// The naryad to start; default: the one next to this executable.
    #[arg(long, value_name = "PATH")]
    naryad: Option<PathBuf>,
    /// Samples a side for each comparison (default 20; 3 with --short).
    #[arg(long, value_name = "N")]
    samples: Option<usize>,
    /// Few samples, 20 environments instead of 200, one concurrent round, one load of 16
    /// concurrent execs instead of three larger ones, 4 creates printing 1 MB each instead of
    /// 30 printing 100 MB: proves it works.
    #[arg(long)]
    short: bool,
    /// Where the report goes (default BENCHMARKS.md); with --only, the section alone, and only
    /// when given (it is always printed).
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Only this section, on each back end: its Markdown, to merge into a full run's report.
    #[arg(long, value_enum, value_name = "SECTION")]
    only: Option<Section>,
    /// Only this back end (repeatable); default: containerd and docker.
    #[arg(long = "backend", value_enum, value_name = "BACKEND")]
    backends: Vec<Backend>,
    /// Keep each daemon's stderr as DIR/naryad-BACKEND.NETWORK.log (RUST_LOG filters it).
    #[arg(long, value_name = "DIR")]
    log_dir: Option<PathBuf>,
}

/// A section `--only` runs by itself.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Section {
    /// "gVisor against runc".
    Gvisor,
    /// "Newer runtimes": create and exec on the test matrix's containerd 2.1 and Docker 28,
    /// beside the host's runtimes.
    Matrix,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("narya-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn env(name: &str) -> Result<String> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => Ok(v),
        _ => bail!(
            "{name} is not set: run `eval \"$(contrib/dev/services.sh env)\"` and export \
             NARYA_TEST_IMAGE_LAYOUT=/var/tmp/narya-image/official (as contrib/test.sh does)"
        ),
    }
}

fn plan(args: &Args) -> Plan {
    let samples = args
        .samples
        .unwrap_or(if args.short { 3 } else { 20 })
        .max(1);
    if args.short {
        Plan {
            short: true,
            samples,
            repeat_samples: 20,
            concurrency: 64,
            rounds: 1,
            // More execs than the daemon lets into one machine at once, so its queue is used.
            exec_loads: vec![ExecLoad {
                execs: 16,
                environments: 1,
            }],
            exec_rounds: 1,
            loaded: 20,
            list_samples: samples,
            output_load: OutputLoad {
                creates: 4,
                bytes: 1 << 20,
            },
        }
    } else {
        Plan {
            short: false,
            samples,
            repeat_samples: (samples * 10).max(200),
            concurrency: 64,
            rounds: 3,
            exec_loads: vec![
                ExecLoad {
                    execs: 64,
                    environments: 1,
                },
                ExecLoad {
                    execs: 256,
                    environments: 1,
                },
                ExecLoad {
                    execs: 256,
                    environments: 16,
                },
            ],
            exec_rounds: 3,
            loaded: report::TARGET_LOAD,
            list_samples: samples.max(50),
            output_load: OutputLoad {
                creates: report::OUTPUT_CREATES,
                bytes: report::OUTPUT_BYTES,
            },
        }
    }
}

/// A fresh P-256 key, its key set on disk, and a token for organisation `bench`.
fn identity(dir: &Path) -> Result<(PathBuf, String)> {
    let pem_path = dir.join("key.pem");
    let status = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
        ])
        .arg(&pem_path)
        .status()
        .context("cannot run openssl")?;
    if !status.success() {
        bail!("openssl genpkey failed ({status})");
    }
    let key = DevKey::from_pem(&std::fs::read(&pem_path)?)?;
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, key.jwks().to_string())?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let token = key.sign(&json!({
        "iss": "narya-bench", "aud": "narya", "sub": "bench", "org": "bench",
        "iat": now, "nbf": now, "exp": now + 24 * 3600,
    }))?;
    Ok((jwks, token))
}

/// The section "gVisor against runc" on `backend`, from two daemons of its own.
async fn gvisor(
    setup: &Setup<'_>,
    backend: Backend,
    socket: &str,
    token: &str,
    plan: &Plan,
    log_dir: Option<&Path>,
) -> SandboxRun {
    eprintln!("== {} under runc and under gVisor", backend.name());
    let setup = Setup {
        log: log_dir.map(|d| d.join(format!("naryad-{}-sandbox.log", backend.name()))),
        ..setup.clone()
    };
    let prefix = format!("nb{}{}g-", std::process::id(), &backend.name()[..1]);
    let run = bench::measure_sandbox(&setup, backend, socket, token, plan.clone(), prefix).await;
    match &run {
        SandboxRun::Skipped(why) => {
            eprintln!("narya-bench: gVisor on {}: skipped: {why}", backend.name())
        }
        SandboxRun::Failed(e) => eprintln!("narya-bench: gVisor on {}: {e}", backend.name()),
        SandboxRun::Measured(_) => {}
    }
    run
}

/// The section "Newer runtimes" on `backend`, from two daemons of its own.
async fn newer_runtimes(
    setup: &Setup<'_>,
    backend: Backend,
    socket: &str,
    token: &str,
    plan: &Plan,
    log_dir: Option<&Path>,
) -> MatrixRun {
    eprintln!(
        "== {} on the host's runtime and the newer one",
        backend.name()
    );
    let setup = Setup {
        log: log_dir.map(|d| d.join(format!("naryad-{}-matrix.log", backend.name()))),
        ..setup.clone()
    };
    let prefix = format!("nb{}{}m", std::process::id(), &backend.name()[..1]);
    let run = bench::measure_matrix(&setup, backend, socket, token, plan.clone(), &prefix).await;
    match &run {
        MatrixRun::Skipped(why) => eprintln!(
            "narya-bench: newer runtimes on {}: skipped: {why}",
            backend.name()
        ),
        MatrixRun::Failed(e) => {
            eprintln!("narya-bench: newer runtimes on {}: {e}", backend.name())
        }
        MatrixRun::Measured(_) => {}
    }
    run
}

async fn run(args: Args) -> Result<bool> {
    let plan = plan(&args);
    let mut backends = if args.backends.is_empty() {
        vec![Backend::Containerd, Backend::Docker]
    } else {
        args.backends.clone()
    };
    backends.sort();
    backends.dedup();
    let layout = env("NARYA_TEST_IMAGE_LAYOUT")?;
    let mut sockets = Vec::new();
    for backend in &backends {
        sockets.push(env(backend.socket_variable())?);
    }
    let containerd_socket = std::env::var("NARYA_TEST_CONTAINERD_SOCKET")
        .unwrap_or_else(|_| "/run/containerd/containerd.sock".to_owned());
    let docker_socket = std::env::var("NARYA_TEST_DOCKER_SOCKET")
        .unwrap_or_else(|_| "/var/run/docker.sock".to_owned());
    let naryad = match &args.naryad {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("this executable has no directory")?
            .join("naryad"),
    };
    if !naryad.is_file() {
        bail!(
            "{} does not exist: build it (cargo build [--release] --bin naryad) or pass --naryad",
            naryad.display()
        );
    }
    let naryad = std::fs::canonicalize(&naryad)?;
    if let Some(dir) = &args.log_dir {
        std::fs::create_dir_all(dir)?;
    }
    let keys = tempfile::Builder::new()
        .prefix("narya-bench-keys-")
        .tempdir()?;
    let (jwks, token) = identity(keys.path())?;
    let out = args.out.clone().unwrap_or_else(|| "BENCHMARKS.md".into());
    let mut context = host::context(&naryad, &out);
    eprintln!(
        "narya-bench: {} mode, naryad {} ({})",
        if plan.short { "short" } else { "full" },
        naryad.display(),
        context.naryad_profile
    );

    let mut outcomes = Vec::new();
    // The runs of a section alone (`--only`).
    let (mut alone_sandbox, mut alone_matrix) = (Vec::new(), Vec::new());
    let mut interrupted = false;
    for (backend, socket) in backends.into_iter().zip(sockets) {
        let setup = Setup {
            naryad: &naryad,
            jwks: &jwks,
            containerd_socket: &containerd_socket,
            docker_socket: &docker_socket,
            layout: &layout,
            log: args
                .log_dir
                .as_ref()
                .map(|d| d.join(format!("naryad-{}.log", backend.name()))),
            pool: 0,
            disk: None,
            rows: 0,
            extra: "",
            sandbox: "container",
        };
        let log_dir = args.log_dir.as_deref();
        match args.only {
            Some(Section::Gvisor) => {
                let run = gvisor(&setup, backend, &socket, &token, &plan, log_dir).await;
                alone_sandbox.push((backend, run));
                continue;
            }
            Some(Section::Matrix) => {
                let run = newer_runtimes(&setup, backend, &socket, &token, &plan, log_dir).await;
                alone_matrix.push((backend, run));
                continue;
            }
            None => {}
        }
        eprintln!("== {}", backend.name());
        let raw = Raw::new(backend, &socket);
        let runtime_version = raw.version().await;
        // The daemon measured throughout isolates its machines (the default); a second one, on
        // the host's network, shows what that costs.
        let daemons = match Daemon::start(&setup, backend, &token, "isolated").await {
            Ok(isolated) => match Daemon::start(&setup, backend, &token, "host").await {
                Ok(host) => Ok((isolated, host)),
                Err(e) => {
                    let _ = isolated.stop().await;
                    Err(e)
                }
            },
            Err(e) => Err(e),
        };
        let result = match daemons {
            Err(e) => Err(format!("{e:#}")),
            Ok((daemon, host)) => {
                let prefix = format!("nb{}{}-", std::process::id(), &backend.name()[..1]);
                let bench = Bench::new(
                    plan.clone(),
                    daemon.client(&token),
                    host.client(&token),
                    raw,
                    prefix,
                );
                // Ctrl-C stops the measuring, yet what was made still goes.
                let measured = tokio::select! {
                    measured = bench.run(&daemon) => measured,
                    _ = tokio::signal::ctrl_c() => {
                        interrupted = true;
                        Err(anyhow::anyhow!("interrupted"))
                    }
                };
                bench.sweep().await;
                let measured = measured.map_err(|e| {
                    format!("{e:#}\nthe daemon's last log lines:\n{}", daemon.log_tail())
                });
                let stopped = daemon.stop().await.and(host.stop().await);
                match (measured, stopped) {
                    (Ok(report), Ok(())) => Ok(report),
                    (Err(e), _) => Err(e),
                    (Ok(_), Err(e)) => Err(format!("{e:#}")),
                }
            }
        };
        if let Err(e) = &result {
            eprintln!("narya-bench: {}: {e}", backend.name());
        }
        let pool = if interrupted {
            None
        } else {
            eprintln!("== {} with a pool of {}", backend.name(), bench::POOL_SIZE);
            let setup = Setup {
                log: args
                    .log_dir
                    .as_ref()
                    .map(|d| d.join(format!("naryad-{}-pool.log", backend.name()))),
                pool: bench::POOL_SIZE,
                ..setup
            };
            let prefix = format!("nb{}{}p-", std::process::id(), &backend.name()[..1]);
            let measured =
                bench::measure_pool(&setup, backend, &socket, &token, plan.clone(), prefix).await;
            if let Err(e) = &measured {
                eprintln!("narya-bench: {} with a pool: {e}", backend.name());
            }
            Some(measured)
        };
        let disk = if interrupted || crate::daemon::state_root().is_none() {
            None
        } else {
            eprintln!("== {} with and without [limits] disk", backend.name());
            let setup = Setup {
                log: args
                    .log_dir
                    .as_ref()
                    .map(|d| d.join(format!("naryad-{}-disk.log", backend.name()))),
                ..setup
            };
            let prefix = format!("nb{}{}d-", std::process::id(), &backend.name()[..1]);
            let measured =
                bench::measure_disk(&setup, backend, &socket, &token, plan.clone(), prefix).await;
            if let Err(e) = &measured {
                eprintln!(
                    "narya-bench: {} with and without a disk bound: {e}",
                    backend.name()
                );
            }
            Some(measured)
        };
        let rows = if interrupted {
            None
        } else {
            eprintln!("== {} with large rows in the store", backend.name());
            let setup = Setup {
                log: args
                    .log_dir
                    .as_ref()
                    .map(|d| d.join(format!("naryad-{}-rows.log", backend.name()))),
                ..setup
            };
            let prefix = format!("nb{}{}r-", std::process::id(), &backend.name()[..1]);
            let loaded = if plan.short {
                bench::ROWS / 10
            } else {
                bench::ROWS
            };
            let measured = bench::measure_rows(&setup, backend, &token, &prefix, loaded).await;
            if let Err(e) = &measured {
                eprintln!("narya-bench: {} with large rows: {e}", backend.name());
            }
            Some(measured)
        };
        let prebuild = if interrupted {
            None
        } else {
            eprintln!("== {} with prebuilds", backend.name());
            let setup = Setup {
                log: args
                    .log_dir
                    .as_ref()
                    .map(|d| d.join(format!("naryad-{}-prebuild.log", backend.name()))),
                ..setup
            };
            let prefix = format!("nb{}{}b-", std::process::id(), &backend.name()[..1]);
            let measured = bench::measure_prebuild(&setup, backend, &token, &plan, &prefix).await;
            if let Err(e) = &measured {
                eprintln!("narya-bench: {} with prebuilds: {e}", backend.name());
            }
            Some(measured)
        };
        let sandbox = if interrupted {
            None
        } else {
            Some(gvisor(&setup, backend, &socket, &token, &plan, log_dir).await)
        };
        let matrix = if interrupted {
            None
        } else {
            Some(newer_runtimes(&setup, backend, &socket, &token, &plan, log_dir).await)
        };
        outcomes.push(Outcome {
            backend,
            runtime_version,
            result,
            pool,
            disk,
            rows,
            prebuild,
            sandbox,
            matrix,
        });
        if interrupted {
            break;
        }
    }

    context.load_end = host::load_average();
    if args.only.is_some() {
        let sandbox: Vec<_> = alone_sandbox.iter().map(|(b, run)| (*b, run)).collect();
        let matrix: Vec<_> = alone_matrix.iter().map(|(b, run)| (*b, run)).collect();
        let section = match args.only {
            Some(Section::Matrix) => report::matrix_section(&plan, &matrix, Some(&context)),
            _ => report::sandbox_section(&plan, &sandbox, Some(&context)),
        };
        println!("{section}");
        if let Some(out) = &args.out {
            std::fs::write(out, &section)
                .with_context(|| format!("cannot write {}", out.display()))?;
            eprintln!("narya-bench: wrote {}", out.display());
        }
        let failed = sandbox.iter().any(|(_, run)| run.failed())
            || matrix.iter().any(|(_, run)| run.failed());
        return Ok(!failed);
    }
    println!("{}", report::table(&plan, &outcomes));
    let (summary, held, total) = report::summary(&plan, &outcomes);
    println!("Targets holding on every back end: {held} of {total}\n{summary}");
    let runs: Vec<_> = outcomes
        .iter()
        .filter_map(|o| Some((o.backend, o.sandbox.as_ref()?)))
        .collect();
    if !runs.is_empty() {
        println!("{}", report::sandbox_section(&plan, &runs, None));
    }
    let runs: Vec<_> = outcomes
        .iter()
        .filter_map(|o| Some((o.backend, o.matrix.as_ref()?)))
        .collect();
    if !runs.is_empty() {
        println!("{}", report::matrix_section(&plan, &runs, None));
    }
    std::fs::write(&out, report::document(&context, &plan, &outcomes))
        .with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!("narya-bench: wrote {}", out.display());

    let errors = outcomes.iter().any(|o| match &o.result {
        Ok(r) => {
            r.concurrent.ours_errors > 0
                || r.concurrent.raw_errors > 0
                // The raw runtime failing a concurrent exec load is a finding, measured and
                // reported, not a failure of the run.
                || r.exec_loads.iter().any(|l| l.ours.errors > 0)
                || r.output_memory.errors > 0
        }
        Err(_) => true,
    }) || outcomes.iter().any(|o| match &o.pool {
        Some(Ok(p)) => p.burst.ours_errors > 0 || p.burst.raw_errors > 0,
        Some(Err(_)) => true,
        None => false,
    }) || outcomes.iter().any(|o| {
        matches!(o.disk, Some(Err(_)))
            || matches!(o.rows, Some(Err(_)))
            || matches!(o.prebuild, Some(Err(_)))
            || o.sandbox.as_ref().is_some_and(SandboxRun::failed)
            || o.matrix.as_ref().is_some_and(MatrixRun::failed)
    });
    if errors {
        eprintln!("narya-bench: something failed (see above); exiting non-zero");
    }
    Ok(!errors)
}
