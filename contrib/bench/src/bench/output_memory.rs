//! Memory under output: many creates at once whose setups print a great deal, answered as plain
//! JSON (no stream), and the daemon's peak resident memory while they run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::{describe, Bench};
use crate::daemon::Daemon;

/// How much output: `creates` at once, each setup printing `bytes` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputLoad {
    pub creates: usize,
    pub bytes: u64,
}

impl OutputLoad {
    /// The row's name: "30 concurrent creates, each setup printing 100 MB".
    pub fn describe(self) -> String {
        let mib = self.bytes as f64 / 1024.0 / 1024.0;
        format!(
            "{} concurrent creates, each setup printing {mib:.0} MB",
            self.creates
        )
    }

    /// The setup script: `bytes` bytes of short lines on standard output.
    fn setup(self) -> String {
        format!("yes narya-bench-output | head -c {}", self.bytes)
    }
}

pub struct OutputMemoryResult {
    pub load: OutputLoad,
    /// VmHWM while the load ran, reset before it.
    pub peak_kib: u64,
    pub wall: Duration,
    pub errors: usize,
    /// The first few failures, verbatim.
    pub failures: Vec<String>,
}

/// Resets the daemon's peak resident memory (VmHWM) to its current resident memory.
fn reset_peak(daemon: &Daemon) -> Result<()> {
    std::fs::write(format!("/proc/{}/clear_refs", daemon.pid), "5")
        .context("cannot reset the daemon's peak memory (/proc/PID/clear_refs needs root)")
}

impl Bench {
    /// A create of `id` with `setup`, answered as JSON: `201`, ready, the setup succeeded.
    async fn create_with_setup(&self, id: &str, setup: &str) -> Result<()> {
        Self::track(&self.ours_live, id, true);
        let body = json!({ "id": id, "setup": setup });
        let answer = self
            .client
            .send_json(Method::POST, "/v1/environments", &body)
            .await?;
        let env: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        if answer.status != StatusCode::CREATED || env["status"] != "ready" {
            bail!(
                "create of {id} with a loud setup answered {}",
                describe(&answer)
            );
        }
        Ok(())
    }

    /// Starts `load.creates` creates at once and measures the daemon's peak resident memory
    /// until the last answers; deletes them afterwards.
    pub async fn output_memory(
        self: &Arc<Self>,
        daemon: &Daemon,
        load: OutputLoad,
    ) -> Result<OutputMemoryResult> {
        let ids: Vec<String> = (0..load.creates).map(|_| self.fresh_id("out")).collect();
        let setup = load.setup();
        reset_peak(daemon)?;
        let started = Instant::now();
        let mut set = JoinSet::new();
        for id in &ids {
            let (bench, id, setup) = (self.clone(), id.clone(), setup.clone());
            set.spawn(async move {
                let made = bench.create_with_setup(&id, &setup).await;
                (id, made)
            });
        }
        let results = set.join_all().await;
        let wall = started.elapsed();
        let (_, peak_kib) = daemon.memory_kib()?;
        let mut made = Vec::new();
        let mut failures = Vec::new();
        let mut errors = 0;
        for (id, result) in results {
            match result {
                Ok(()) => made.push(id),
                Err(e) => {
                    errors += 1;
                    if failures.len() < 5 {
                        failures.push(format!("{e:#}"));
                    }
                    // What a failed create left, if anything, still goes.
                    let _ = self.delete_ours(&id).await;
                }
            }
        }
        self.delete_ours_all(made).await?;
        Ok(OutputMemoryResult {
            load,
            peak_kib,
            wall,
            errors,
            failures,
        })
    }
}
