//! What the disk bound costs a create: two daemons of their own on the same filesystem, one
//! with `[limits] disk` (each workspace a subvolume in a quota group, the writable layer made
//! one too) and one with `disk = "unbounded"`, both on the host's network, their creates
//! alternated.

use anyhow::Result;

use super::{timed, Bench, Pair, Plan};
use crate::daemon::{Daemon, Setup};
use crate::raw::{Backend, Raw};
use crate::stats::Samples;

/// The bound the measured daemon holds: the contract's default.
pub const BOUND: &str = "10GiB";

/// Starts the two daemons on `backend`, alternates their creates (each deleted again), and
/// removes everything they made. `ours` is bounded, `raw` unbounded.
pub async fn measure_disk(
    setup: &Setup<'_>,
    backend: Backend,
    socket: &str,
    token: &str,
    plan: Plan,
    prefix: String,
) -> Result<Pair, String> {
    let with = |disk| Setup {
        pool: 0,
        disk: Some(disk),
        rows: 0,
        ..setup.clone()
    };
    let (bounded, unbounded) = (with(BOUND), with("unbounded"));
    let start = |setup| async move {
        // On the host's network: two daemons isolating at once would each make a network of
        // the default subnet (which the second cannot), and the bound costs the same either way.
        Daemon::start(setup, backend, token, "host")
            .await
            .map_err(|e| format!("{e:#}"))
    };
    let with_bound = start(&bounded).await?;
    let without = match start(&unbounded).await {
        Ok(daemon) => daemon,
        Err(e) => {
            let _ = with_bound.stop().await;
            return Err(e);
        }
    };
    let bench = Bench::new(
        plan,
        with_bound.client(token),
        without.client(token),
        Raw::new(backend, socket),
        prefix,
    );
    let measured = bench.run_disk().await;
    bench.sweep().await;
    let stopped = with_bound.stop().await.and(without.stop().await);
    let measured = measured.map_err(|e| format!("{e:#}"))?;
    stopped.map_err(|e| format!("{e:#}"))?;
    Ok(measured)
}

impl Bench {
    /// A warm-up create on each daemon, then `samples` creates a side, alternated.
    async fn run_disk(&self) -> Result<Pair> {
        for (kind, bounded) in [("dwarm", true), ("uwarm", false)] {
            let id = self.fresh_id(kind);
            self.create_either(bounded, &id).await?;
            self.delete_either(bounded, &id).await?;
        }
        eprintln!(
            "  create, disk {BOUND} vs unbounded, alternating ({} samples a side)",
            self.plan.samples
        );
        let mut pair = Pair {
            ours: Samples::default(),
            raw: Samples::default(),
        };
        for _ in 0..self.plan.samples {
            for bounded in [true, false] {
                let id = self.fresh_id(if bounded { "d" } else { "u" });
                let (took, _) = timed(self.create_either(bounded, &id)).await?;
                if bounded {
                    pair.ours.push(took);
                } else {
                    pair.raw.push(took);
                }
                self.delete_either(bounded, &id).await?;
            }
        }
        Ok(pair)
    }

    async fn create_either(&self, bounded: bool, id: &str) -> Result<()> {
        match bounded {
            true => self.create_ours(id).await.map(drop),
            false => Self::create_on(&self.host_client, &self.host_live, id)
                .await
                .map(drop),
        }
    }

    async fn delete_either(&self, bounded: bool, id: &str) -> Result<()> {
        match bounded {
            true => self.delete_ours(id).await,
            false => Self::delete_on(&self.host_client, &self.host_live, id).await,
        }
    }
}
