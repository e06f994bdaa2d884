//! The daemon's memory with a store full of large rows: 10 000 deleted environments, each with
//! a 64 KiB setup script and 64 KiB of output that is not UTF-8, kept for their retention, as
//! create/delete churn leaves them. The reconciler's passes and the sweeps read summaries of
//! the rows, so the daemon's peak stays near that of a daemon with an empty store. The rows are
//! another organisation's (`churn`) than the one measuring: what is measured is what every
//! organisation pays for one organisation's churn, not that organisation's own list of them.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::daemon::{Daemon, Setup};
use crate::raw::Backend;

/// The rows the loaded daemon's store holds (a tenth in short mode).
pub const ROWS: usize = 10_000;
/// How long each daemon runs over its store before its peak is read: several of the
/// reconciler's full passes (every 2 s).
const OVER: Duration = Duration::from_secs(10);

pub struct RowsReport {
    pub rows: usize,
    /// Peak resident memory (VmHWM) of a daemon whose store is empty, and of one whose store
    /// holds the rows; each made one environment and ran [`OVER`].
    pub empty_kib: u64,
    pub loaded_kib: u64,
}

/// Writes `rows` deleted environments into the store at `database` (made first with the
/// daemon's own schema), as a daemon that ran for a while leaves them.
pub async fn seed(database: &Path, rows: usize) -> Result<()> {
    drop(
        narya::store::Store::open(database)
            .await
            .context("cannot make the store to seed")?,
    );
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", database.display())).await?;
    let script = "#".repeat(65536);
    let output = vec![0xffu8; 65536];
    let deleted_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let mut batch = pool.begin().await?;
    for n in 0..rows {
        sqlx::query(
            "INSERT INTO environments (id, organisation, person, fingerprint, setup_script, \
             image_digest, setup_recorded, status, status_detail, setup_state, setup_step, \
             setup_output, setup_started_at, setup_finished_at, created_at, updated_at, \
             deleted_at, machine) VALUES (?, 'churn', 'ada', 'f', ?, ?, 1, 'gone', 'deleted', \
             'failed', 'setup', CAST(? AS TEXT), 't', 't', 't', 't', ?, ?)",
        )
        .bind(format!("churn-{n}"))
        .bind(&script)
        .bind(format!("sha256:{}", "a".repeat(64)))
        .bind(&output)
        .bind(deleted_at)
        .bind(format!("narya-churn-{n}"))
        .execute(&mut *batch)
        .await?;
    }
    batch.commit().await?;
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(())
}

/// One daemon with an empty store, then one whose store holds `loaded` rows: each makes one
/// environment, runs [`OVER`], and says its peak.
pub async fn measure_rows(
    setup: &Setup<'_>,
    backend: Backend,
    token: &str,
    prefix: &str,
    loaded: usize,
) -> Result<RowsReport, String> {
    let mut peaks = Vec::new();
    for rows in [0, loaded] {
        let seeded = Setup {
            pool: 0,
            rows,
            ..setup.clone()
        };
        let daemon = Daemon::start(&seeded, backend, token, "host")
            .await
            .map_err(|e| format!("{e:#}"))?;
        let measured = peak_over_a_create(&daemon, token, &format!("{prefix}{rows}")).await;
        let stopped = daemon.stop().await;
        peaks.push(measured.map_err(|e| format!("{e:#}"))?);
        stopped.map_err(|e| format!("{e:#}"))?;
    }
    Ok(RowsReport {
        rows: loaded,
        empty_kib: peaks[0],
        loaded_kib: peaks[1],
    })
}

async fn peak_over_a_create(daemon: &Daemon, token: &str, id: &str) -> Result<u64> {
    use hyper::{Method, StatusCode};
    let client = daemon.client(token);
    let made = client
        .send_json(
            Method::POST,
            "/v1/environments",
            &serde_json::json!({ "id": id }),
        )
        .await?;
    anyhow::ensure!(
        made.status == StatusCode::CREATED,
        "create answered {}",
        made.status
    );
    tokio::time::sleep(OVER).await;
    let (_, peak) = daemon.memory_kib()?;
    let deleted = client
        .send(Method::DELETE, &format!("/v1/environments/{id}"), None)
        .await?;
    anyhow::ensure!(
        deleted.status == StatusCode::NO_CONTENT,
        "delete answered {}",
        deleted.status
    );
    Ok(peak)
}
