//! The pool's rows, against a daemon of their own with `[pool] size` machines: a setup-less
//! create from a warm pool against the raw runtime's `run -d` (alternated), a burst of
//! concurrent creates larger than the pool against as many `run -d` at once, and what the
//! pool's idle machines cost the host.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{note, timed, Bench, Pair, Plan};
use crate::daemon::{Daemon, Setup};
use crate::raw::{Backend, Raw};
use crate::stats::Samples;

/// The pool the rows run with.
pub const POOL_SIZE: usize = 8;
/// How long the pool may take to fill before a sample.
const FILLED_WITHIN: Duration = Duration::from_secs(60);

pub struct PoolReport {
    pub size: usize,
    /// Ours: a create served from a full pool; raw: `run -d`.
    pub warm: Pair,
    /// Warm creates that a pool machine served (the rest started their own).
    pub warm_from_pool: usize,
    pub burst: Burst,
    pub cost: PoolCost,
}

pub struct Burst {
    pub creates: usize,
    pub ours: Samples,
    pub raw: Samples,
    pub ours_errors: usize,
    pub raw_errors: usize,
    /// Creates of each round a pool machine served.
    pub from_pool: Vec<usize>,
    pub failures: Vec<String>,
}

impl Burst {
    pub fn ratio(&self) -> f64 {
        self.ours.median() / self.raw.median()
    }
}

/// What `machines` idle pool machines hold on the host: their processes, and the runtime's
/// shim of each, with the sum of their resident memory (shared pages counted in each).
pub struct PoolCost {
    pub machines: usize,
    pub processes: usize,
    pub shims: usize,
    pub rss_kib: u64,
}

/// Starts a daemon with a pool of [`POOL_SIZE`] on `backend`, measures, and removes everything
/// it made, the pool's machines included (they outlive a daemon on purpose).
pub async fn measure_pool(
    setup: &Setup<'_>,
    backend: Backend,
    socket: &str,
    token: &str,
    plan: Plan,
    prefix: String,
) -> Result<PoolReport, String> {
    // On the host's network, as the raw side's `run -d` is when it adopts no other: a claim
    // costs the same whatever the network, which was set up when the pool made the machine.
    let daemon = Daemon::start(setup, backend, token, "host")
        .await
        .map_err(|e| format!("{e:#}"))?;
    let bench = Bench::new(
        plan,
        daemon.client(token),
        daemon.client(token),
        Raw::new(backend, socket),
        prefix,
    );
    let measured = bench.run_pool(&daemon).await;
    bench.sweep().await;
    let pool_dir = daemon.pool_dir();
    let left: Vec<String> = entries(&pool_dir).into_iter().collect();
    let stopped = daemon.stop().await;
    let raw = Raw::new(backend, socket);
    raw.remove_quietly(&left).await;
    let measured = measured.map_err(|e| format!("{e:#}"))?;
    stopped.map_err(|e| format!("{e:#}"))?;
    Ok(measured)
}

/// The names under the pool's directory: machines waiting (a directory each) and claimed
/// ones (a link each).
fn entries(pool_dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(pool_dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The machines waiting in the pool: a workspace directory of their own (a claimed one's is a
/// link).
fn waiting(pool_dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(pool_dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether environment `id`'s machine came from the pool: its workspace is linked from there.
fn served_from_pool(pool_dir: &Path, workspace: &Path) -> bool {
    std::fs::read_dir(pool_dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|target| target == workspace))
    })
}

impl Bench {
    /// Waits until `size` machines wait in the pool and run.
    async fn full_pool(&self, pool_dir: &Path, size: usize) -> Result<BTreeSet<String>> {
        let deadline = Instant::now() + FILLED_WITHIN;
        loop {
            let waiting = waiting(pool_dir);
            if waiting.len() >= size {
                let mut running = 0;
                for name in &waiting {
                    running += self.raw.running(name).await?;
                }
                if running >= size {
                    // Started; the daemon counts each in as its start returns.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return Ok(waiting);
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the pool held {} of {size} machines after {FILLED_WITHIN:?}",
                    waiting.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The pool's rows; the caller cleans up afterwards whatever happened.
    async fn run_pool(self: &Arc<Self>, daemon: &Daemon) -> Result<PoolReport> {
        let plan = self.plan.clone();
        let pool_dir = daemon.pool_dir();
        let workspaces = pool_dir
            .parent()
            .context("the pool's directory has no parent")?
            .to_owned();
        let size = POOL_SIZE;

        eprintln!("  warm-up with a pool of {size}");
        self.full_pool(&pool_dir, size).await?;
        let warm = self.fresh_id("pwarm");
        let env = self.create_ours(&warm).await?;
        self.delete_ours(&warm).await?;
        let digest = env["image_digest"]
            .as_str()
            .context("the environment names no image_digest")?
            .to_owned();
        let image = self.raw.image_for(&digest).await?;
        let raw_warm = self.fresh_id("prwarm");
        self.create_raw(&image, &raw_warm).await?;
        self.delete_raw(&[raw_warm]).await?;

        eprintln!(
            "  create from a warm pool, alternating ({} samples a side)",
            plan.samples
        );
        let mut pair = Pair {
            ours: Samples::default(),
            raw: Samples::default(),
        };
        let mut warm_from_pool = 0;
        for _ in 0..plan.samples {
            self.full_pool(&pool_dir, size).await?;
            let id = self.fresh_id("p");
            let (took, _) = timed(self.create_ours(&id)).await?;
            pair.ours.push(took);
            if served_from_pool(&pool_dir, &workspaces.join(&id)) {
                warm_from_pool += 1;
            }
            self.delete_ours(&id).await?;

            let id = self.fresh_id("prc");
            let (took, _) = timed(self.create_raw(&image, &id)).await?;
            pair.raw.push(took);
            self.delete_raw(&[id]).await?;
        }

        eprintln!(
            "  {} concurrent creates with a pool of {size}, alternating ({} round{})",
            plan.concurrency,
            plan.rounds,
            if plan.rounds == 1 { "" } else { "s" }
        );
        let burst = self.burst(&image, &pool_dir, &workspaces, size).await?;

        eprintln!("  the cost of {size} idle pool machines");
        let idle = self.full_pool(&pool_dir, size).await?;
        let cost = pool_cost(&idle, &pool_dir)?;

        Ok(PoolReport {
            size,
            warm: pair,
            warm_from_pool,
            burst,
            cost,
        })
    }

    async fn burst(
        self: &Arc<Self>,
        image: &str,
        pool_dir: &Path,
        workspaces: &Path,
        size: usize,
    ) -> Result<Burst> {
        let n = self.plan.concurrency;
        let mut result = Burst {
            creates: n,
            ours: Samples::default(),
            raw: Samples::default(),
            ours_errors: 0,
            raw_errors: 0,
            from_pool: Vec::new(),
            failures: Vec::new(),
        };
        for round in 0..self.plan.rounds {
            self.full_pool(pool_dir, size).await?;
            let group = format!("{}pk{round}-", self.prefix);
            let ours = self.create_ours_at_once(&group, n).await;
            result.ours.push(ours.wall);
            for (id, e) in ours.failed {
                result.ours_errors += 1;
                note(&mut result.failures, e);
                if self.delete_ours(&id).await.is_err() {
                    Self::track(&self.ours_live, &id, false);
                }
            }
            result.from_pool.push(
                ours.made
                    .iter()
                    .filter(|id| served_from_pool(pool_dir, &workspaces.join(id)))
                    .count(),
            );
            if let Err(e) = self.delete_ours_all(ours.made).await {
                result.ours_errors += 1;
                note(&mut result.failures, e);
            }

            let group = format!("{}prk{round}-", self.prefix);
            let (wall, ids, errors) = self
                .create_raw_at_once(image, &group, n, &mut result.failures)
                .await;
            result.raw.push(wall);
            result.raw_errors += errors;
            self.delete_raw(&ids).await?;
        }
        Ok(result)
    }
}

/// The processes of the machines `names`, found by the workspace each mounts (every process
/// of a machine shares its mounts), and each machine's shim (the parent of its init).
fn pool_cost(names: &BTreeSet<String>, pool_dir: &Path) -> Result<PoolCost> {
    let mounts: Vec<String> = names
        .iter()
        .map(|n| pool_dir.join(n).display().to_string())
        .collect();
    let mut in_machines = BTreeSet::new();
    for entry in std::fs::read_dir("/proc")
        .context("cannot read /proc")?
        .flatten()
    {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(mountinfo) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
            continue;
        };
        let mounted = mountinfo.lines().any(|line| {
            // The fourth field is the mount's root within its file system: the workspace.
            line.split_whitespace()
                .nth(3)
                .is_some_and(|root| mounts.iter().any(|m| m.ends_with(root) && root.len() > 1))
        });
        if mounted {
            in_machines.insert(pid);
        }
    }
    let mut shims = BTreeSet::new();
    for pid in &in_machines {
        if let Some(parent) = status_field(*pid, "PPid:") {
            let parent = parent as u32;
            if !in_machines.contains(&parent) {
                shims.insert(parent);
            }
        }
    }
    let rss_kib = in_machines
        .iter()
        .chain(&shims)
        .filter_map(|pid| status_field(*pid, "VmRSS:"))
        .sum();
    Ok(PoolCost {
        machines: names.len(),
        processes: in_machines.len(),
        shims: shims.len(),
        rss_kib,
    })
}

fn status_field(pid: u32, name: &str) -> Option<u64> {
    let status = std::fs::read_to_string(PathBuf::from(format!("/proc/{pid}/status"))).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}
