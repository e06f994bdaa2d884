//! gVisor against runc: two daemons of their own on one back end, one with `[runtime] sandbox =
//! "container"` (runc: the host's kernel) and one with `"gvisor"` (runsc: a kernel of its own),
//! both isolating their machines and with no pool, so that each create starts its machine. Each
//! measurement alternates the two: a create, an exec round trip, [`BURST`] concurrent execs into
//! one environment, and a build-shaped workload on [`FILES`] small files. No target: the figures
//! are for operators choosing a sandbox.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hyper::{Method, StatusCode};
use narya::client::Client;
use serde_json::{json, Value};
use tokio::process::Command;
use tokio::task::JoinSet;

use super::{describe, note, timed, Bench, Plan, SectionReport, SectionRun};
use crate::daemon::{Daemon, Setup};
use crate::raw::{Backend, Raw, COMMAND_LIMIT};
use crate::stats::Samples;

/// The execs of `true` started at once into one environment.
pub const BURST: usize = 64;
/// The small files of the build-shaped workload, in [`DIRS`] directories.
pub const FILES: usize = 20_000;
const DIRS: usize = 200;
/// What the workload's exec may take (the daemon is asked for this, the answer awaited a
/// minute longer): far more than either sandbox needs, so a slow one is measured, not cut off.
const BUILD_LIMIT: Duration = Duration::from_secs(20 * 60);
/// The gVisor daemon's `[network] subnet`: both daemons isolate at once; the runc one gets a
/// subnet of its own from `Daemon::start` (10.120–219.0.0/16).
const GVISOR_SUBNET: &str = "10.90.0.0/16";
/// The tarball of the files, in each environment's workspace.
const TARBALL: &str = "tree.tar";

/// The workload, in a fresh directory `$1` of the workspace: unpack the files, commit them all
/// to a new git repository, and pack them again. `set -e`: any step failing fails the exec.
/// `gc.auto=0`: the commit's 20 000 loose objects would otherwise start a `git gc` in the
/// background, which outlives the exec and writes on while the directory is being removed.
const BUILD_SCRIPT: &str = "set -e; mkdir \"$1\"; cd \"$1\"; tar -xf /workspace/tree.tar; \
    cd tree; git init -q; git add -A; \
    git -c gc.auto=0 -c user.name=narya-bench -c user.email=bench@narya.invalid commit -q -m x; \
    cd ..; tar -cf tree.tar tree";

/// One measurement under each sandbox.
#[derive(Default)]
pub struct Sides {
    pub container: Samples,
    pub gvisor: Samples,
}

impl Sides {
    fn push(&mut self, gvisor: bool, took: Duration) {
        match gvisor {
            true => self.gvisor.push(took),
            false => self.container.push(took),
        }
    }

    /// median(gVisor) / median(runc).
    pub fn ratio(&self) -> f64 {
        self.gvisor.median() / self.container.median()
    }
}

pub struct SandboxReport {
    /// `runsc --version`'s first line.
    pub runsc: String,
    pub create: Sides,
    pub exec: Sides,
    /// Wall time of [`BURST`] execs of `true` started at once, a sample a round.
    pub burst: Sides,
    /// Failed execs of the bursts: runc's, gVisor's.
    pub burst_errors: (usize, usize),
    pub build: Sides,
    /// The first few failures, verbatim.
    pub failures: Vec<String>,
}

/// What became of the section on one back end; skipped where this host has no runsc.
pub type SandboxRun = SectionRun<SandboxReport>;

impl SectionReport for SandboxReport {
    fn failures(&self) -> &[String] {
        &self.failures
    }

    /// An exec of the bursts failed.
    fn failed(&self) -> bool {
        self.burst_errors != (0, 0)
    }
}

/// Why this host cannot run machines under gVisor on `backend`, if it cannot: containerd needs
/// the runsc binary the daemon names by default, Docker an engine runtime named `runsc`.
async fn runsc_missing(backend: Backend, socket: &str) -> Option<String> {
    let binary = "/usr/bin/runsc";
    if !Path::new(binary).is_file() {
        return Some(format!(
            "no {binary}: install {}, as .ci/run does",
            narya_runtimes::sandbox::RUNSC_PACKAGE
        ));
    }
    if backend == Backend::Docker {
        let out = Command::new("docker")
            .args(["-H", &format!("unix://{socket}"), "info", "--format"])
            .arg("{{json .Runtimes}}")
            .output()
            .await;
        let runtimes: Value = match out {
            Ok(out) if out.status.success() => {
                serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
            }
            _ => Value::Null,
        };
        if runtimes.get("runsc").is_none() {
            return Some(
                "the Docker engine has no runtime named `runsc` (contrib/dev/services.sh \
                 registers contrib/runsc/narya-runsc as one when /usr/bin/runsc exists)"
                    .to_owned(),
            );
        }
    }
    None
}

async fn runsc_version() -> String {
    match Command::new("/usr/bin/runsc")
        .arg("--version")
        .output()
        .await
    {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("unknown")
            .to_owned(),
        Err(e) => format!("unknown ({e})"),
    }
}

/// Starts the two daemons on `backend`, measures, and removes everything they made; a skip (or
/// under `CI=true` a failure) where the host has no gVisor.
pub async fn measure_sandbox(
    setup: &Setup<'_>,
    backend: Backend,
    socket: &str,
    token: &str,
    plan: Plan,
    prefix: String,
) -> SandboxRun {
    if let Some(missing) = runsc_missing(backend, socket).await {
        return SandboxRun::missing(missing);
    }
    let extra = format!("[network]\nsubnet = \"{GVISOR_SUBNET}\"\n");
    // A log of its own for each daemon: they share the network and the disk bound, which
    // name the others' logs.
    let with = |sandbox: &'static str, extra| Setup {
        pool: 0,
        rows: 0,
        sandbox,
        extra,
        log: setup
            .log
            .as_ref()
            .map(|log| log.with_extension(format!("{sandbox}.log"))),
        ..setup.clone()
    };
    let (container, gvisor) = (with("container", ""), with("gvisor", &extra));
    let start = |setup| async move {
        Daemon::start(setup, backend, token, "isolated")
            .await
            .map_err(|e| format!("{e:#}"))
    };
    let runc = match start(&container).await {
        Ok(daemon) => daemon,
        Err(e) => return SandboxRun::Failed(e),
    };
    let runsc = match start(&gvisor).await {
        Ok(daemon) => daemon,
        Err(e) => {
            let _ = runc.stop().await;
            return SandboxRun::Failed(e);
        }
    };
    let bench = Bench::new(
        plan,
        runc.client(token),
        runsc.client(token),
        Raw::new(backend, socket),
        prefix,
    );
    let measured = bench.run_sandbox(&runc, &runsc).await;
    bench.sweep().await;
    let measured = measured.map_err(|e| {
        format!(
            "{e:#}\nthe runc daemon's last log lines:\n{}\nthe gVisor daemon's:\n{}",
            runc.log_tail(),
            runsc.log_tail()
        )
    });
    let stopped = runc.stop().await.and(runsc.stop().await);
    SandboxRun::of(measured, stopped)
}

/// Writes [`FILES`] small text files, source-sized (about 100 to 900 bytes), into `tree/` under
/// a temporary directory, and packs them into `to` (readable by the machines' user).
async fn make_tarball(to: &Path) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("narya-bench-tree-")
        .tempdir()?;
    for n in 0..FILES {
        let sub = dir.path().join(format!("tree/d{:03}", n % DIRS));
        if n < DIRS {
            std::fs::create_dir_all(&sub)?;
        }
        let text: String = (0..4 + n % 28)
            .map(|line| {
                format!(
                    "let v{line} = {};\n",
                    (n * 7919 + line * 104_729) % 1_000_003
                )
            })
            .collect();
        std::fs::write(sub.join(format!("f{n:05}.rs")), text)?;
    }
    let out = Command::new("tar")
        .arg("-cf")
        .arg(to)
        .arg("-C")
        .arg(dir.path())
        .arg("tree")
        .output()
        .await
        .context("cannot run tar")?;
    if !out.status.success() {
        bail!(
            "tar failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    std::fs::set_permissions(to, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    Ok(())
}

/// `POST /v1/environments/{id}/exec` with `argv` on `client`: must answer `200` with exit code
/// 0 within `limit`, which the daemon is asked to hold the command to.
async fn exec_on(client: &Client, id: &str, argv: &[&str], limit: Duration) -> Result<()> {
    let path = format!("/v1/environments/{id}/exec");
    let body = json!({ "argv": argv, "timeout": format!("{}s", limit.as_secs()) });
    let sent = client.send_json(Method::POST, &path, &body);
    let Ok(answer) = tokio::time::timeout(limit + Duration::from_secs(60), sent).await else {
        bail!("exec of {argv:?} in {id} did not answer within {limit:?} and a minute");
    };
    let answer = answer?;
    let outcome: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
    if answer.status != StatusCode::OK || outcome["exit_code"] != 0 {
        bail!("exec of {argv:?} in {id} answered {}", describe(&answer));
    }
    Ok(())
}

impl Bench {
    /// The runc daemon's client (`client`) or the gVisor one's (`host_client`).
    fn sandboxed(&self, gvisor: bool) -> &Client {
        if gvisor {
            &self.host_client
        } else {
            &self.client
        }
    }

    async fn create_sandboxed(&self, gvisor: bool, id: &str) -> Result<()> {
        match gvisor {
            true => Self::create_on(&self.host_client, &self.host_live, id).await,
            false => self.create_ours(id).await,
        }
        .map(drop)
    }

    async fn delete_sandboxed(&self, gvisor: bool, id: &str) -> Result<()> {
        match gvisor {
            true => Self::delete_on(&self.host_client, &self.host_live, id).await,
            false => self.delete_ours(id).await,
        }
    }

    /// [`BURST`] execs of `true` at once into `id`: the wall time until the last answered,
    /// and the failures.
    async fn sandboxed_burst(&self, gvisor: bool, id: &str) -> (Duration, Vec<anyhow::Error>) {
        let mut set = JoinSet::new();
        let start = Instant::now();
        for _ in 0..BURST {
            let (client, id) = (self.sandboxed(gvisor).clone(), id.to_owned());
            set.spawn(async move { exec_on(&client, &id, &["true"], COMMAND_LIMIT).await });
        }
        let outcomes = set.join_all().await;
        let wall = start.elapsed();
        (wall, outcomes.into_iter().filter_map(Result::err).collect())
    }

    /// Everything, alternating runc and gVisor; the caller cleans up whatever happens.
    async fn run_sandbox(self: &Arc<Self>, runc: &Daemon, runsc: &Daemon) -> Result<SandboxReport> {
        let sides = [false, true];
        eprintln!("  warm-up");
        for gvisor in sides {
            let id = self.fresh_id(if gvisor { "gwarm" } else { "cwarm" });
            self.create_sandboxed(gvisor, &id).await?;
            self.delete_sandboxed(gvisor, &id).await?;
        }
        let samples = self.plan.samples;
        eprintln!("  create, runc vs gVisor, alternating ({samples} samples a side)");
        let mut create = Sides::default();
        for _ in 0..samples {
            for gvisor in sides {
                let id = self.fresh_id(if gvisor { "gc" } else { "cc" });
                let (took, _) = timed(self.create_sandboxed(gvisor, &id)).await?;
                create.push(gvisor, took);
                self.delete_sandboxed(gvisor, &id).await?;
            }
        }

        let kept = [self.fresh_id("ckept"), self.fresh_id("gkept")];
        for (gvisor, id) in sides.into_iter().zip(&kept) {
            self.create_sandboxed(gvisor, id).await?;
            // One untimed exec: the first one's costs are not the round trip's.
            exec_on(self.sandboxed(gvisor), id, &["true"], COMMAND_LIMIT).await?;
        }
        eprintln!("  exec round trip, runc vs gVisor, alternating ({samples} samples a side)");
        let mut exec = Sides::default();
        for _ in 0..samples {
            for (gvisor, id) in sides.into_iter().zip(&kept) {
                let client = self.sandboxed(gvisor);
                let (took, _) = timed(exec_on(client, id, &["true"], COMMAND_LIMIT)).await?;
                exec.push(gvisor, took);
            }
        }

        let rounds = self.plan.exec_rounds;
        eprintln!(
            "  {BURST} concurrent execs into one environment, alternating ({rounds} round{})",
            if rounds == 1 { "" } else { "s" }
        );
        let (mut burst, mut burst_errors, mut failures) = (Sides::default(), (0, 0), Vec::new());
        for _ in 0..rounds {
            for (gvisor, id) in sides.into_iter().zip(&kept) {
                let (wall, errors) = self.sandboxed_burst(gvisor, id).await;
                burst.push(gvisor, wall);
                match gvisor {
                    true => burst_errors.1 += errors.len(),
                    false => burst_errors.0 += errors.len(),
                }
                for e in errors {
                    note(&mut failures, e);
                }
            }
        }

        let build = self.build(runc, runsc, &kept).await?;
        for (gvisor, id) in sides.into_iter().zip(&kept) {
            self.delete_sandboxed(gvisor, id).await?;
        }
        Ok(SandboxReport {
            runsc: runsc_version().await,
            create,
            exec,
            burst,
            burst_errors,
            build,
            failures,
        })
    }

    /// The build-shaped workload in `kept` (runc's, gVisor's), one exec a run, alternating;
    /// each run in a directory of its own, removed untimed afterwards.
    async fn build(&self, runc: &Daemon, runsc: &Daemon, kept: &[String; 2]) -> Result<Sides> {
        let runs = if self.plan.short { 1 } else { 3 };
        eprintln!(
            "  {FILES} files unpacked, committed to git and packed again, alternating \
             ({runs} run{} a side)",
            if runs == 1 { "" } else { "s" }
        );
        let tarball = runc.workspace(&kept[0]).join(TARBALL);
        make_tarball(&tarball).await?;
        std::fs::copy(&tarball, runsc.workspace(&kept[1]).join(TARBALL))
            .context("cannot copy the tarball into the gVisor environment's workspace")?;
        let mut build = Sides::default();
        for run in 0..runs {
            let dir = format!("/workspace/build-{run}");
            for (gvisor, id) in [false, true].into_iter().zip(kept) {
                let client = self.sandboxed(gvisor);
                let argv = ["sh", "-c", BUILD_SCRIPT, "sh", &dir];
                let (took, _) = timed(exec_on(client, id, &argv, BUILD_LIMIT)).await?;
                build.push(gvisor, took);
                exec_on(client, id, &["rm", "-rf", &dir], BUILD_LIMIT).await?;
            }
        }
        Ok(build)
    }
}
