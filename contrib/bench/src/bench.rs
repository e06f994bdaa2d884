//! The measurements against one back end: the daemon's side and the raw runtime's, alternated.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use narya::client::{Answer, Client};

use crate::raw::Raw;
use crate::stats::Samples;

mod concurrent;
mod disk;
mod exec_load;
mod lifecycle;
mod matrix;
mod output_memory;
mod pool;
mod prebuild;
mod rows;
mod run;
mod sandbox;

pub use concurrent::Concurrent;
pub use disk::{measure_disk, BOUND as DISK_BOUND};
pub use exec_load::{ExecLoad, ExecLoadResult, LoadSide};
pub use matrix::{measure_matrix, MatrixReport, MatrixRun, RuntimeRows, MATRIX_SUBNET};
pub use output_memory::{OutputLoad, OutputMemoryResult};
pub use pool::{measure_pool, PoolReport, POOL_SIZE};
pub use prebuild::{measure_prebuild, PrebuildReport, SETUP_SLEEP as PREBUILD_SLEEP};
pub use rows::{measure_rows, seed as seed_rows, RowsReport, ROWS};
pub use sandbox::{measure_sandbox, SandboxReport, SandboxRun, Sides, BURST, FILES};

/// How much of everything to do.
#[derive(Clone, Debug)]
pub struct Plan {
    pub short: bool,
    /// Samples per side of each alternated comparison.
    pub samples: usize,
    pub repeat_samples: usize,
    pub concurrency: usize,
    pub rounds: usize,
    /// The concurrent exec loads, each run `exec_rounds` times a side.
    pub exec_loads: Vec<ExecLoad>,
    pub exec_rounds: usize,
    /// Environments recorded for the memory and list figures.
    pub loaded: usize,
    pub list_samples: usize,
    /// The creates with loud setups, measured for the daemon's peak memory.
    pub output_load: OutputLoad,
}

/// What became of a section of its own (gVisor's, the newer runtimes') on one back end.
pub enum SectionRun<R> {
    Measured(Box<R>),
    /// What it needs is not on this host (outside CI): why.
    Skipped(String),
    Failed(String),
}

/// What a section of its own measured, as the run and the report see it.
pub trait SectionReport {
    /// The first few failures of measurements that went on, verbatim.
    fn failures(&self) -> &[String] {
        &[]
    }

    /// Whether the run must exit non-zero although the section was measured.
    fn failed(&self) -> bool {
        false
    }
}

impl<R: SectionReport> SectionRun<R> {
    /// Skipped for `why`; under `CI=true` failed, as a missing service fails the tests there.
    pub fn missing(why: String) -> Self {
        if std::env::var("CI").as_deref() == Ok("true") {
            SectionRun::Failed(format!("{why} (CI=true: not skipping)"))
        } else {
            SectionRun::Skipped(why)
        }
    }

    /// What the measuring came to, once its daemons `stopped`.
    pub fn of(measured: Result<R, String>, stopped: Result<()>) -> Self {
        match (measured, stopped) {
            (Ok(report), Ok(())) => SectionRun::Measured(Box::new(report)),
            (Err(e), _) => SectionRun::Failed(e),
            (Ok(_), Err(e)) => SectionRun::Failed(format!("{e:#}")),
        }
    }

    /// Whether the run must exit non-zero: the section failed, or something it measured did.
    pub fn failed(&self) -> bool {
        match self {
            SectionRun::Measured(r) => r.failed(),
            SectionRun::Skipped(_) => false,
            SectionRun::Failed(_) => true,
        }
    }
}

/// How many untimed creates and deletes run at once while loading and cleaning up.
const HELPERS: usize = 8;

#[derive(Default)]
pub struct Pair {
    pub ours: Samples,
    pub raw: Samples,
}

impl Pair {
    pub fn ratio(&self) -> f64 {
        self.ours.median() / self.raw.median()
    }
}

pub struct Memory {
    pub idle_kib: u64,
    pub loaded_kib: u64,
    pub peak_kib: u64,
}

pub struct Report {
    pub image: String,
    pub raw_create: String,
    pub create: Pair,
    /// Create with isolated networking (`ours`) against create on the host's network (`raw`),
    /// both through a daemon.
    pub network_cost: Pair,
    /// What the raw side's CNI wrapper costs alone (containerd only).
    pub wrapper: Option<Samples>,
    pub repeat: Samples,
    pub exec: Pair,
    pub concurrent: Concurrent,
    pub exec_loads: Vec<ExecLoadResult>,
    pub memory: Memory,
    pub output_memory: OutputMemoryResult,
    pub list: Samples,
    /// Rows the list answered: the live environments and the deleted ones it still shows.
    pub list_rows: usize,
}

pub struct Bench {
    plan: Plan,
    client: Client,
    /// A second daemon's, whose machines use the host's network.
    host_client: Client,
    raw: Raw,
    prefix: String,
    counter: AtomicUsize,
    /// What exists and must go at the end, whatever happens in between.
    ours_live: Mutex<BTreeSet<String>>,
    host_live: Mutex<BTreeSet<String>>,
    raw_live: Mutex<BTreeSet<String>>,
}

fn describe(answer: &Answer) -> String {
    format!(
        "{} {}",
        answer.status,
        String::from_utf8_lossy(&answer.body).trim()
    )
}

/// Times `work`.
async fn timed<T>(work: impl Future<Output = Result<T>>) -> Result<(Duration, T)> {
    let start = Instant::now();
    let value = work.await?;
    Ok((start.elapsed(), value))
}

/// Keeps the first few failures of a row, verbatim, for its report.
fn note(failures: &mut Vec<String>, e: anyhow::Error) {
    if failures.len() < 5 {
        failures.push(format!("{e:#}"));
    }
}

/// One round of creates started at once through the daemon.
struct OursAtOnce {
    wall: Duration,
    made: Vec<String>,
    failed: Vec<(String, anyhow::Error)>,
}

impl Bench {
    pub fn new(
        plan: Plan,
        client: Client,
        host_client: Client,
        raw: Raw,
        prefix: String,
    ) -> Arc<Bench> {
        Arc::new(Bench {
            plan,
            client,
            host_client,
            raw,
            prefix,
            counter: AtomicUsize::new(0),
            ours_live: Mutex::new(BTreeSet::new()),
            host_live: Mutex::new(BTreeSet::new()),
            raw_live: Mutex::new(BTreeSet::new()),
        })
    }

    fn fresh_id(&self, kind: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{}{kind}-{n}", self.prefix)
    }

    fn track(set: &Mutex<BTreeSet<String>>, id: &str, live: bool) {
        let mut set = set.lock().unwrap_or_else(|p| p.into_inner());
        if live {
            set.insert(id.to_owned());
        } else {
            set.remove(id);
        }
    }
}
