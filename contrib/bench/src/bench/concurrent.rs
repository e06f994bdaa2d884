//! Concurrent creates: rounds of creates started at once on each side, their wall time, errors
//! and the machines running afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::task::JoinSet;

use super::{note, Bench, OursAtOnce};
use crate::stats::Samples;

pub struct Concurrent {
    pub ours: Samples,
    pub raw: Samples,
    pub ours_errors: usize,
    pub raw_errors: usize,
    /// Machines running after each round.
    pub ours_machines: Vec<usize>,
    pub raw_machines: Vec<usize>,
    /// The first few failures, verbatim.
    pub failures: Vec<String>,
}

impl Concurrent {
    pub fn ratio(&self) -> f64 {
        self.ours.median() / self.raw.median()
    }
}

impl Bench {
    /// Creates `{group}0` … `{group}{n-1}` through the daemon, all at once, and times the
    /// round until the last answers.
    pub(super) async fn create_ours_at_once(self: &Arc<Self>, group: &str, n: usize) -> OursAtOnce {
        let mut set = JoinSet::new();
        let start = Instant::now();
        for i in 0..n {
            let (bench, id) = (self.clone(), format!("{group}{i}"));
            set.spawn(async move {
                let outcome = bench.create_ours(&id).await.map(|_| ());
                (id, outcome)
            });
        }
        let outcomes = set.join_all().await;
        let wall = start.elapsed();
        let mut round = OursAtOnce {
            wall,
            made: Vec::new(),
            failed: Vec::new(),
        };
        for (id, outcome) in outcomes {
            match outcome {
                Ok(()) => round.made.push(id),
                Err(e) => round.failed.push((id, e)),
            }
        }
        round
    }

    /// Starts `{group}0` … `{group}{n-1}` with the raw runtime, all at once: the round's wall
    /// time and the names, with each failure noted in `failures`.
    pub(super) async fn create_raw_at_once(
        self: &Arc<Self>,
        image: &str,
        group: &str,
        n: usize,
        failures: &mut Vec<String>,
    ) -> (Duration, Vec<String>, usize) {
        let ids: Vec<String> = (0..n).map(|i| format!("{group}{i}")).collect();
        let mut set = JoinSet::new();
        let start = Instant::now();
        for id in &ids {
            let (bench, id, image) = (self.clone(), id.clone(), image.to_owned());
            set.spawn(async move { bench.create_raw(&image, &id).await });
        }
        let outcomes = set.join_all().await;
        let wall = start.elapsed();
        let mut errors = 0;
        for e in outcomes.into_iter().filter_map(Result::err) {
            errors += 1;
            note(failures, e);
        }
        (wall, ids, errors)
    }

    pub(super) async fn concurrent(self: &Arc<Self>, image: &str) -> Result<Concurrent> {
        let n = self.plan.concurrency;
        let mut result = Concurrent {
            ours: Samples::default(),
            raw: Samples::default(),
            ours_errors: 0,
            raw_errors: 0,
            ours_machines: Vec::new(),
            raw_machines: Vec::new(),
            failures: Vec::new(),
        };
        for round in 0..self.plan.rounds {
            // The daemon's side.
            let group = format!("{}k{round}-", self.prefix);
            let ours = self.create_ours_at_once(&group, n).await;
            result.ours.push(ours.wall);
            result
                .ours_machines
                .push(self.raw.running_for_environments(&group).await?);
            if let Err(e) = self.delete_ours_all(ours.made).await {
                result.ours_errors += 1;
                note(&mut result.failures, e);
            }
            // A failed create may have left a record or a machine, or nothing (then the
            // delete's 404 is right): whatever is left goes directly.
            for (id, e) in ours.failed {
                result.ours_errors += 1;
                note(&mut result.failures, e);
                if self.delete_ours(&id).await.is_err() {
                    self.raw.remove_quietly(std::slice::from_ref(&id)).await;
                    Self::track(&self.ours_live, &id, false);
                }
            }

            // The raw runtime's side.
            let group = format!("{}rk{round}-", self.prefix);
            let (wall, ids, errors) = self
                .create_raw_at_once(image, &group, n, &mut result.failures)
                .await;
            result.raw.push(wall);
            result.raw_errors += errors;
            result.raw_machines.push(self.raw.running(&group).await?);
            self.delete_raw(&ids).await?;
        }
        Ok(result)
    }
}
