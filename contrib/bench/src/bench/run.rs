//! The main run against one back end ([`Bench::run`]): warm-up, create, isolated against host
//! network, idempotent repeat, exec, concurrent creates, memory and list, the concurrent exec
//! loads, memory under output. Its warm-up and samples serve the newer runtimes' section too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::{describe, timed, Bench, Memory, Pair, Report, HELPERS};
use crate::daemon::Daemon;
use crate::stats::Samples;

impl Bench {
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
    pub(super) async fn warm_up(&self, daemon: &Daemon) -> Result<String> {
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
    pub(super) async fn create_sample(&self, image: &str, pair: &mut Pair) -> Result<()> {
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
    pub(super) async fn exec_ready(&self, image: &str, kept: &str) -> Result<String> {
        let raw_kept = self.fresh_id("rexec");
        self.create_raw(image, &raw_kept).await?;
        self.exec_true_ours(kept).await?;
        self.raw.exec(&raw_kept, "warm").await?;
        Ok(raw_kept)
    }

    /// The `i`th sample a side of the exec row into `pair`: `true` through the daemon into
    /// `kept`, then with the raw client into `raw_kept`.
    pub(super) async fn exec_sample(
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
}
