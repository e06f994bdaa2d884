//! Concurrent execs of `true`: many at once into one environment or spread over several, the
//! daemon's side and the raw runtime's alternated, and whether any machine's init was restarted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::task::JoinSet;

use super::{Bench, HELPERS};
use crate::stats::Samples;

/// How long reading pid 1's start time may take: a healthy machine answers within a second,
/// one whose shim the load wedged never does.
const INIT_READ_LIMIT: Duration = Duration::from_secs(30);

/// One shape of load: `execs` started at once, spread round-robin over `environments`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecLoad {
    pub execs: usize,
    pub environments: usize,
}

impl ExecLoad {
    /// The row's name: "64 concurrent execs of `true` into one environment".
    pub fn describe(self) -> String {
        if self.environments == 1 {
            format!(
                "{} concurrent execs of `true` into one environment",
                self.execs
            )
        } else {
            format!(
                "{} concurrent execs of `true` over {} environments",
                self.execs, self.environments
            )
        }
    }
}

/// One side of a load: its wall times, failures and restarted machines.
#[derive(Default)]
pub struct LoadSide {
    pub wall: Samples,
    pub errors: usize,
    /// Machines whose pid 1 started anew between before the first round and after the last,
    /// or that are gone.
    pub restarted: usize,
    /// Machines that did not answer the read of pid 1's start time after the last round.
    pub unanswering: usize,
}

pub struct ExecLoadResult {
    pub load: ExecLoad,
    pub ours: LoadSide,
    pub raw: LoadSide,
    /// The first few failures, verbatim.
    pub failures: Vec<String>,
}

impl ExecLoadResult {
    pub fn ratio(&self) -> f64 {
        self.ours.wall.median() / self.raw.wall.median()
    }
}

/// Field 22 of `/proc/1/stat`, pid 1's start time in clock ticks since boot: a restarted task
/// has a new pid 1, which started later, even though its pid inside is 1 again.
fn start_time(stat: &str) -> Result<u64> {
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let (pid, rest) = stat
        .rsplit_once(')')
        .with_context(|| format!("/proc/1/stat has no command name: {stat:?}"))?;
    // Pid 1 of the machine's own pid namespace, not the host's: only that one is its init.
    if pid.split_whitespace().next() != Some("1") {
        bail!("/proc/1/stat is not pid 1's: {stat:?}");
    }
    rest.split_whitespace()
        .nth(22 - 3)
        .and_then(|field| field.parse().ok())
        .with_context(|| format!("/proc/1/stat has no start time: {stat:?}"))
}

/// Keeps the first five failures of a load, verbatim: enough to tell what went wrong.
fn keep_first(failures: &mut Vec<String>, errors: Vec<anyhow::Error>) {
    let room = 5usize.saturating_sub(failures.len());
    failures.extend(errors.into_iter().take(room).map(|e| format!("{e:#}")));
}

impl Bench {
    /// The start time of pid 1 in machine `machine`, read through the raw runtime so that the
    /// daemon has no part in the verdict.
    async fn init_start(&self, machine: &str) -> Result<u64> {
        let exec_id = self.fresh_id("stat");
        let stat = self
            .raw
            .exec_output(machine, &exec_id, &["cat", "/proc/1/stat"], INIT_READ_LIMIT)
            .await
            .with_context(|| format!("cannot read pid 1's start time in {machine}"))?;
        start_time(&stat)
    }

    /// Counts `machine` in `side` as restarted when its pid 1 started after `before`, as
    /// unanswering when the start time cannot be read.
    async fn look_again(&self, side: &mut LoadSide, machine: &str, before: u64) {
        match self.init_start(machine).await {
            Ok(after) if after == before => {}
            Ok(_) => side.restarted += 1,
            Err(_) => side.unanswering += 1,
        }
    }

    /// Starts `load.execs` execs at once, the `i`th into `targets[i % len]`, through the daemon
    /// (`ours`) or the raw runtime; the wall time until the last ended, and the failures.
    async fn exec_burst(
        self: &Arc<Self>,
        ours: bool,
        targets: &[String],
        execs: usize,
    ) -> (std::time::Duration, Vec<anyhow::Error>) {
        let mut set = JoinSet::new();
        let start = Instant::now();
        for i in 0..execs {
            let target = targets[i % targets.len()].clone();
            let bench = self.clone();
            if ours {
                set.spawn(async move { bench.exec_true_ours(&target).await });
            } else {
                let exec_id = bench.fresh_id("burst");
                set.spawn(async move { bench.raw.exec(&target, &exec_id).await });
            }
        }
        let outcomes = set.join_all().await;
        let wall = start.elapsed();
        (wall, outcomes.into_iter().filter_map(Result::err).collect())
    }

    /// One load, `rounds` times a side, alternating: environments through the daemon and as
    /// many raw machines are made first, and removed afterwards.
    pub(super) async fn exec_load(
        self: &Arc<Self>,
        image: &str,
        load: ExecLoad,
        rounds: usize,
    ) -> Result<ExecLoadResult> {
        let tag = format!("e{}x{}", load.execs, load.environments);
        let envs: Vec<String> = (0..load.environments)
            .map(|_| self.fresh_id(&tag))
            .collect();
        let raws: Vec<String> = (0..load.environments)
            .map(|_| self.fresh_id(&format!("r{tag}")))
            .collect();
        for chunk in envs.chunks(HELPERS) {
            let mut set = JoinSet::new();
            for id in chunk {
                let (bench, id) = (self.clone(), id.clone());
                set.spawn(async move { bench.create_ours(&id).await.map(|_| ()) });
            }
            set.join_all().await.into_iter().collect::<Result<()>>()?;
        }
        for chunk in raws.chunks(HELPERS) {
            let mut set = JoinSet::new();
            for id in chunk {
                let (bench, id, image) = (self.clone(), id.clone(), image.to_owned());
                set.spawn(async move { bench.create_raw(&image, &id).await });
            }
            set.join_all().await.into_iter().collect::<Result<()>>()?;
        }
        let mut machines = Vec::new();
        for id in &envs {
            machines.push(self.raw.machine_of(id).await?);
        }

        // One untimed exec in each machine a side: the first one's costs are not the load's.
        for id in &envs {
            self.exec_true_ours(id).await?;
        }
        for id in &raws {
            self.raw.exec(id, &self.fresh_id("warm")).await?;
        }
        let mut ours_before = Vec::new();
        for machine in &machines {
            ours_before.push(self.init_start(machine).await?);
        }
        let mut raw_before = Vec::new();
        for machine in &raws {
            raw_before.push(self.init_start(machine).await?);
        }

        let mut result = ExecLoadResult {
            load,
            ours: LoadSide::default(),
            raw: LoadSide::default(),
            failures: Vec::new(),
        };
        for _ in 0..rounds {
            let (wall, errors) = self.exec_burst(true, &envs, load.execs).await;
            result.ours.wall.push(wall);
            result.ours.errors += errors.len();
            keep_first(&mut result.failures, errors);

            // A raw runtime that failed a round has most likely wedged its machine: more
            // rounds would only wait out the limit again.
            if result.raw.errors == 0 {
                let (wall, errors) = self.exec_burst(false, &raws, load.execs).await;
                result.raw.wall.push(wall);
                result.raw.errors += errors.len();
                keep_first(&mut result.failures, errors);
            }
        }

        // A restart at any round leaves a later start time for good, so one look at the end
        // covers every round. The daemon's machine is looked up again: a remade one, or none,
        // counts as restarted.
        for (id, (machine, before)) in envs.iter().zip(machines.iter().zip(&ours_before)) {
            match self.raw.machine_of(id).await {
                Ok(after) if after == *machine => {
                    self.look_again(&mut result.ours, &after, *before).await
                }
                _ => result.ours.restarted += 1,
            }
        }
        for (machine, before) in raws.iter().zip(&raw_before) {
            self.look_again(&mut result.raw, machine, *before).await;
        }

        self.delete_ours_all(envs).await?;
        self.delete_raw(&raws).await?;
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_even_when_the_command_name_has_spaces() {
        let stat = "1 (tini) S 0 1 1 0 -1 4194560 123 0 0 0 0 0 0 0 20 0 1 0 987654 2265088 1 \
                    18446744073709551615";
        assert_eq!(start_time(stat).unwrap(), 987654);
        let odd = "1 (a b) c) S 0 1 1 0 -1 4194560 123 0 0 0 0 0 0 0 20 0 1 0 42 2265088 1";
        assert_eq!(start_time(odd).unwrap(), 42);
        assert!(start_time("1 (tini) S 0").is_err());
        assert!(start_time("7 (tini) S 0 1 1 0 -1 4194560 123 0 0 0 0 0 0 0 20 0 1 0 42").is_err());
    }
}
