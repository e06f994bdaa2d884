//! Prometheus metrics: one handle, cloned into whatever counts something, and the text
//! exposition `GET /metrics` answers on `listen.metrics` (a listener of its own, no token).
//! No label carries an identifier: labels are statuses, steps, outcomes, kinds and reasons.

mod runtime;
mod serve;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narya_runtimes::{ErrorKind, ProcessOutcome};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

pub use runtime::Metered;
pub use serve::router;

use crate::auth::AuthError;
use crate::model::Status;
use crate::store::Census;

/// One label, its value fixed at compile time: nothing a caller sends becomes a label.
type Label = [(&'static str, &'static str); 1];
type Histograms = Family<Label, Histogram, fn() -> Histogram>;

/// Buckets from 5 ms to about 20 min: an exec or a setup may take any of these.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

/// What the daemon counts; clones share it.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    environments: Family<Label, Gauge>,
    organisations: Gauge,
    creates: Family<Label, Counter>,
    create_steps: Histograms,
    execs: Family<Label, Counter>,
    exec_seconds: Histogram,
    reconciler_passes: Family<Label, Counter>,
    machine_restarts: Counter,
    runtime_failures: Family<Label, Counter>,
    jwt_refusals: Family<Label, Counter>,
    connections: Family<Label, Gauge>,
    host_free_bytes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("narya");
        let inner = Inner {
            environments: Family::default(),
            organisations: Gauge::default(),
            creates: Family::default(),
            create_steps: Family::new_with_constructor(seconds_histogram),
            execs: Family::default(),
            exec_seconds: seconds_histogram(),
            reconciler_passes: Family::default(),
            machine_restarts: Counter::default(),
            runtime_failures: Family::default(),
            jwt_refusals: Family::default(),
            connections: Family::default(),
            host_free_bytes: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "environments",
            "Environments on this host by status (deleted ones read gone until forgotten)",
            inner.environments.clone(),
        );
        registry.register(
            "host_free_bytes",
            "Free bytes on the filesystem of state_dir (creates are refused below [host] reserve_disk)",
            inner.host_free_bytes.clone(),
        );
        registry.register(
            "organisations",
            "Organisations with at least one environment on this host",
            inner.organisations.clone(),
        );
        registry.register(
            "creates",
            "Creates that provisioned, by outcome: ready, unusable (the clone or setup failed) or failed (taken back)",
            inner.creates.clone(),
        );
        registry.register(
            "create_step_duration_seconds",
            "How long each step of a create took: image, clone, machine, setup",
            inner.create_steps.clone(),
        );
        registry.register(
            "execs",
            "Commands run, by outcome: succeeded (exit 0), failed (another exit or killed), timed_out, or error (could not run)",
            inner.execs.clone(),
        );
        registry.register(
            "exec_duration_seconds",
            "How long commands ran",
            inner.exec_seconds.clone(),
        );
        registry.register(
            "reconciler_passes",
            "Comparisons of the store with the runtime, by outcome: ok or failed",
            inner.reconciler_passes.clone(),
        );
        registry.register(
            "machine_restarts",
            "Stopped machines the host started again",
            inner.machine_restarts.clone(),
        );
        registry.register(
            "runtime_failures",
            "Calls to the container runtime that failed, by kind",
            inner.runtime_failures.clone(),
        );
        registry.register(
            "jwt_refusals",
            "Requests refused for their bearer token, by reason",
            inner.jwt_refusals.clone(),
        );
        registry.register(
            "open_connections",
            "Connections open now, by listener: unix, tcp or metrics",
            inner.connections.clone(),
        );
        Metrics {
            inner: Arc::new(Inner { registry, ..inner }),
        }
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.inner.registry);
        text
    }

    /// Sets the environment gauges from a count of the store.
    pub fn census(&self, census: &Census) {
        for status in [
            Status::Ready,
            Status::Degraded,
            Status::Gone,
            Status::Unusable,
        ] {
            let count = census
                .by_status
                .iter()
                .filter(|(s, _)| *s == status)
                .map(|(_, n)| *n)
                .sum();
            self.inner
                .environments
                .get_or_create(&[("status", status.as_str())])
                .set(count);
        }
        self.inner.organisations.set(census.organisations);
    }

    /// The free bytes on `state_dir`'s filesystem, as just read.
    pub fn host_free(&self, bytes: u64) {
        self.inner
            .host_free_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// A create that provisioned ended as `status`, or failed (`None`).
    pub fn create_ended(&self, status: Option<Status>) {
        let outcome = match status {
            Some(Status::Ready) => "ready",
            Some(Status::Unusable) => "unusable",
            Some(Status::Degraded | Status::Gone) | None => "failed",
        };
        self.inner
            .creates
            .get_or_create(&[("outcome", outcome)])
            .inc();
    }

    /// Runs `step` (`image`, `clone`, `machine` or `setup`) of a create, timing it.
    pub async fn create_step<F: Future>(&self, step: &'static str, work: F) -> F::Output {
        let started = Instant::now();
        let done = work.await;
        self.inner
            .create_steps
            .get_or_create(&[("step", step)])
            .observe(started.elapsed().as_secs_f64());
        done
    }

    /// A command ended (or could not run: `None`) after `took`.
    pub fn exec_ended(&self, outcome: Option<&ProcessOutcome>, took: Duration) {
        let outcome = match outcome {
            None => "error",
            Some(o) if o.timed_out => "timed_out",
            Some(o) if o.exit_code == Some(0) => "succeeded",
            Some(_) => "failed",
        };
        self.inner
            .execs
            .get_or_create(&[("outcome", outcome)])
            .inc();
        self.inner.exec_seconds.observe(took.as_secs_f64());
    }

    /// The reconciler compared store and runtime.
    pub fn reconciled(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        self.inner
            .reconciler_passes
            .get_or_create(&[("outcome", outcome)])
            .inc();
    }

    /// A stopped machine was started again.
    pub fn machine_restarted(&self) {
        self.inner.machine_restarts.inc();
    }

    /// A runtime call failed.
    pub fn runtime_failed(&self, kind: ErrorKind) {
        let kind = match kind {
            ErrorKind::NotFound => "not_found",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Image => "image",
            ErrorKind::Other => "other",
        };
        self.inner
            .runtime_failures
            .get_or_create(&[("kind", kind)])
            .inc();
    }

    /// A request was refused for its token.
    pub fn jwt_refused(&self, reason: &AuthError) {
        let reason = match reason {
            AuthError::Missing => "missing",
            AuthError::Malformed(_) => "malformed",
            AuthError::Algorithm(_) => "algorithm",
            AuthError::UnknownKey => "unknown_key",
            AuthError::Invalid(_) => "invalid",
            AuthError::MissingClaim(_) => "missing_claim",
        };
        self.inner
            .jwt_refusals
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// The gauge of connections open on `listener` (`unix`, `tcp` or `metrics`).
    pub fn connections(&self, listener: &'static str) -> Gauge {
        self.inner
            .connections
            .get_or_create(&[("listener", listener)])
            .clone()
    }
}

#[cfg(test)]
mod tests;
