//! The measurements against one back end: the daemon's side and the raw runtime's, alternated.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hyper::{Method, StatusCode};
use narya::client::{Answer, Client};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::daemon::Daemon;
use crate::raw::{Raw, COMMAND_LIMIT};
use crate::stats::Samples;

mod disk;
mod exec_load;
mod matrix;
mod output_memory;
mod pool;
mod prebuild;
mod rows;
mod sandbox;

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

    /// `POST /v1/environments` for a new id: must answer 201 with a ready environment.
    async fn create_ours(&self, id: &str) -> Result<Value> {
        Self::create_on(&self.client, &self.ours_live, id).await
    }

    /// `create_ours` on the daemon of `client`, whose environments `live` tracks.
    async fn create_on(client: &Client, live: &Mutex<BTreeSet<String>>, id: &str) -> Result<Value> {
        Self::track(live, id, true);
        let answer = client
            .send_json(Method::POST, "/v1/environments", &json!({ "id": id }))
            .await?;
        if answer.status != StatusCode::CREATED {
            bail!("create of {id} answered {}", describe(&answer));
        }
        let env: Value = serde_json::from_slice(&answer.body)
            .with_context(|| format!("create of {id}: the answer is not JSON"))?;
        if env["status"] != "ready" {
            bail!("create of {id} answered 201 but not ready: {env}");
        }
        Ok(env)
    }

    async fn delete_ours(&self, id: &str) -> Result<()> {
        Self::delete_on(&self.client, &self.ours_live, id).await
    }

    /// `delete_ours` on the daemon of `client`, whose environments `live` tracks.
    async fn delete_on(client: &Client, live: &Mutex<BTreeSet<String>>, id: &str) -> Result<()> {
        let answer = client
            .send(Method::DELETE, &format!("/v1/environments/{id}"), None)
            .await?;
        if answer.status != StatusCode::NO_CONTENT {
            bail!("delete of {id} answered {}", describe(&answer));
        }
        Self::track(live, id, false);
        Ok(())
    }

    /// `POST /v1/environments/{id}/exec {"argv": ["true"]}`: must answer 200 with exit code 0.
    async fn exec_true_ours(&self, id: &str) -> Result<()> {
        let path = format!("/v1/environments/{id}/exec");
        let body = json!({ "argv": ["true"] });
        let sent = self.client.send_json(Method::POST, &path, &body);
        let Ok(answer) = tokio::time::timeout(COMMAND_LIMIT, sent).await else {
            bail!(
                "exec of true in {id} did not answer within {} s",
                COMMAND_LIMIT.as_secs()
            );
        };
        let answer = answer?;
        let outcome: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        if answer.status != StatusCode::OK || outcome["exit_code"] != 0 {
            bail!("exec of true in {id} answered {}", describe(&answer));
        }
        Ok(())
    }

    async fn create_raw(&self, image: &str, id: &str) -> Result<()> {
        Self::track(&self.raw_live, id, true);
        self.raw.create(image, id).await
    }

    async fn delete_raw(&self, ids: &[String]) -> Result<()> {
        self.raw.remove(ids).await?;
        for id in ids {
            Self::track(&self.raw_live, id, false);
        }
        Ok(())
    }

    /// Deletes `ids` through the daemon, `HELPERS` at a time.
    async fn delete_ours_all(self: &Arc<Self>, ids: Vec<String>) -> Result<()> {
        let mut results = Vec::new();
        for chunk in ids.chunks(HELPERS) {
            let mut set = JoinSet::new();
            for id in chunk {
                let (bench, id) = (self.clone(), id.clone());
                set.spawn(async move { bench.delete_ours(&id).await });
            }
            results.extend(set.join_all().await);
        }
        results.into_iter().collect()
    }

    /// Everything, in order; the caller cleans up afterwards whatever happened.
    pub async fn run(self: &Arc<Self>, daemon: &Daemon) -> Result<Report> {
        let plan = self.plan.clone();

        eprintln!("  warm-up");
        let image = self.warm_up(daemon).await?;
        let warm = self.fresh_id("hwarm");
        Self::create_on(&self.host_client, &self.host_live, &warm).await?;
        Self::delete_on(&self.host_client, &self.host_live, &warm).await?;

        tokio::time::sleep(Duration::from_secs(1)).await;
        let (idle_kib, _) = daemon.memory_kib()?;

        eprintln!("  create, alternating ({} samples a side)", plan.samples);
        let mut create = Pair::default();
        for _ in 0..plan.samples {
            self.create_sample(&image, &mut create).await?;
        }

        let mut wrapper = None;
        if self.raw.wrapper_alone().await?.is_some() {
            let mut samples = Samples::default();
            for _ in 0..plan.samples {
                if let Some(took) = self.raw.wrapper_alone().await? {
                    samples.push(took);
                }
            }
            wrapper = Some(samples);
        }

        eprintln!(
            "  create, isolated vs host network, alternating ({} samples a side)",
            plan.samples
        );
        let mut network_cost = Pair {
            ours: Samples::default(),
            raw: Samples::default(),
        };
        for _ in 0..plan.samples {
            let id = self.fresh_id("ni");
            let (took, _) = timed(self.create_ours(&id)).await?;
            network_cost.ours.push(took);
            self.delete_ours(&id).await?;

            let id = self.fresh_id("nh");
            let (took, _) = timed(Self::create_on(&self.host_client, &self.host_live, &id)).await?;
            network_cost.raw.push(took);
            Self::delete_on(&self.host_client, &self.host_live, &id).await?;
        }

        eprintln!("  idempotent repeat ({} samples)", plan.repeat_samples);
        let kept = self.fresh_id("repeat");
        self.create_ours(&kept).await?;
        let body = json!({ "id": kept });
        let mut repeat = Samples::default();
        for _ in 0..plan.repeat_samples {
            let (took, answer) = timed(async {
                Ok(self
                    .client
                    .send_json(Method::POST, "/v1/environments", &body)
                    .await?)
            })
            .await?;
            if answer.status != StatusCode::OK {
                bail!("a repeat of {kept} answered {}", describe(&answer));
            }
            repeat.push(took);
        }

        eprintln!(
            "  exec round trip, alternating ({} samples a side)",
            plan.samples
        );
        let raw_kept = self.exec_ready(&image, &kept).await?;
        let mut exec = Pair::default();
        for i in 0..plan.samples {
            self.exec_sample(&kept, &raw_kept, i, &mut exec).await?;
        }
        self.delete_raw(&[raw_kept]).await?;
        self.delete_ours(&kept).await?;

        eprintln!(
            "  {} concurrent creates, alternating ({} round{})",
            plan.concurrency,
            plan.rounds,
            if plan.rounds == 1 { "" } else { "s" }
        );
        let concurrent = self.concurrent(&image).await?;

        eprintln!("  {} environments recorded: memory and list", plan.loaded);
        let loaded: Vec<String> = (0..plan.loaded).map(|_| self.fresh_id("l")).collect();
        for chunk in loaded.chunks(HELPERS) {
            let mut set = JoinSet::new();
            for id in chunk {
                let (bench, id) = (self.clone(), id.clone());
                set.spawn(async move { bench.create_ours(&id).await.map(|_| ()) });
            }
            set.join_all()
                .await
                .into_iter()
                .collect::<Result<Vec<()>>>()?;
        }
        self.await_purge(plan.loaded).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (loaded_kib, _) = daemon.memory_kib()?;
        let mut list = Samples::default();
        let mut list_rows = 0;
        for i in 0..=plan.list_samples {
            let (took, answer) = timed(async {
                Ok(self
                    .client
                    .send(Method::GET, "/v1/environments", None)
                    .await?)
            })
            .await?;
            let listed: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
            let rows = listed["environments"]
                .as_array()
                .map_or(&[][..], Vec::as_slice);
            // Deleted environments stay listed as `gone` for their retention: should one not
            // have been forgotten yet, it is listed, not counted.
            let count = rows.iter().filter(|e| e["status"] != "gone").count();
            list_rows = rows.len();
            if answer.status != StatusCode::OK || count != plan.loaded {
                bail!(
                    "a list of {} environments answered {} with {count}",
                    plan.loaded,
                    answer.status
                );
            }
            // The first is a warm-up.
            if i > 0 {
                list.push(took);
            }
        }
        self.delete_ours_all(loaded).await?;

        // Last: a burst of hundreds of requests leaves the allocator holding more than the
        // daemon needs afterwards, which would blur the memory figures above.
        let mut exec_loads = Vec::new();
        for load in plan.exec_loads.iter().copied() {
            eprintln!(
                "  {}, alternating ({} round{})",
                load.describe(),
                plan.exec_rounds,
                if plan.exec_rounds == 1 { "" } else { "s" }
            );
            exec_loads.push(self.exec_load(&image, load, plan.exec_rounds).await?);
        }
        let (_, peak_kib) = daemon.memory_kib()?;

        // After the peak of the run is read: this resets it.
        eprintln!("  {}", plan.output_load.describe());
        let output_memory = self.output_memory(daemon, plan.output_load).await?;

        Ok(Report {
            raw_create: self.raw.create_command(&image, "ID"),
            image,
            create,
            network_cost,
            wrapper,
            repeat,
            exec,
            concurrent,
            exec_loads,
            memory: Memory {
                idle_kib,
                loaded_kib,
                peak_kib,
            },
            output_memory,
            list,
            list_rows,
        })
    }

    /// The warm-up before any timing: one create and delete through the daemon (which loads the
    /// image into the runtime), whose machine's network the raw side adopts, and one raw create
    /// and removal. The raw side's name of the image the daemon pinned.
    async fn warm_up(&self, daemon: &Daemon) -> Result<String> {
        let warm = self.fresh_id("warm");
        let env = self.create_ours(&warm).await?;
        // The raw side's machines get the network the daemon gave this one.
        let network = self.raw.network_like(&warm, &daemon.state).await?;
        self.raw.adopt(network);
        self.delete_ours(&warm).await?;
        let digest = env["image_digest"]
            .as_str()
            .context("the environment names no image_digest")?
            .to_owned();
        let image = self.raw.image_for(&digest).await?;
        let raw_warm = self.fresh_id("rwarm");
        self.create_raw(&image, &raw_warm).await?;
        self.delete_raw(&[raw_warm]).await?;
        Ok(image)
    }

    /// One sample a side of the create row into `pair`: a create through the daemon, then a
    /// raw one of `image`, each timed and removed again untimed.
    async fn create_sample(&self, image: &str, pair: &mut Pair) -> Result<()> {
        let id = self.fresh_id("c");
        let (took, _) = timed(self.create_ours(&id)).await?;
        pair.ours.push(took);
        self.delete_ours(&id).await?;

        let id = self.fresh_id("rc");
        let (took, _) = timed(self.create_raw(image, &id)).await?;
        pair.raw.push(took);
        self.delete_raw(&[id]).await?;
        Ok(())
    }

    /// A raw machine of `image` for the exec row beside the daemon's environment `kept`, and
    /// one untimed round trip a side; the raw machine's name, for the caller to remove.
    async fn exec_ready(&self, image: &str, kept: &str) -> Result<String> {
        let raw_kept = self.fresh_id("rexec");
        self.create_raw(image, &raw_kept).await?;
        self.exec_true_ours(kept).await?;
        self.raw.exec(&raw_kept, "warm").await?;
        Ok(raw_kept)
    }

    /// The `i`th sample a side of the exec row into `pair`: `true` through the daemon into
    /// `kept`, then with the raw client into `raw_kept`.
    async fn exec_sample(
        &self,
        kept: &str,
        raw_kept: &str,
        i: usize,
        pair: &mut Pair,
    ) -> Result<()> {
        let (took, _) = timed(self.exec_true_ours(kept)).await?;
        pair.ours.push(took);
        let (took, _) = timed(self.raw.exec(raw_kept, &format!("x{i}"))).await?;
        pair.raw.push(took);
        Ok(())
    }

    /// Waits until the list answers only the `live` environments: the daemon forgets deleted
    /// ones at its next pass after their retention (1 s here), and the run deleted hundreds.
    async fn await_purge(&self, live: usize) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = self
                .client
                .send(Method::GET, "/v1/environments", None)
                .await?;
            let listed: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
            let rows = listed["environments"].as_array().map_or(0, Vec::len);
            if rows == live {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the list still answers {rows} rows for {live} environments after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Creates `{group}0` … `{group}{n-1}` through the daemon, all at once, and times the
    /// round until the last answers.
    async fn create_ours_at_once(self: &Arc<Self>, group: &str, n: usize) -> OursAtOnce {
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
    async fn create_raw_at_once(
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

    async fn concurrent(self: &Arc<Self>, image: &str) -> Result<Concurrent> {
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

    /// Removes whatever the run left: through the daemon while it answers, then directly.
    pub async fn sweep(self: &Arc<Self>) {
        let host: Vec<String> = self
            .host_live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        for id in host {
            let _ = Self::delete_on(&self.host_client, &self.host_live, &id).await;
        }
        let ours: Vec<String> = self
            .ours_live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        let _ = self.delete_ours_all(ours).await;
        let mut left: Vec<String> = self
            .ours_live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        left.extend(
            self.raw_live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned(),
        );
        if !left.is_empty() {
            eprintln!("  sweeping {} leftover machines", left.len());
            self.raw.remove_quietly(&left).await;
        }
    }
}
