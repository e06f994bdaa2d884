//! Prebuilds as recorded: what a successful setup made, under the key of everything that shaped
//! it, `making` until whole, and which environments stand on each.

use sqlx::Row;

use super::{parsed, SetupRecord, Store, StoreError};
use crate::model::{Digest, EnvironmentId, SetupState, SetupStep};

/// One prebuild.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrebuildRecord {
    pub key: String,
    pub organisation: String,
    pub image_digest: Digest,
    /// The runtime's name for its committed layer, which also names its workspace copy.
    pub layer: String,
    /// What it holds on the host: the layer and the workspace copy.
    pub bytes: u64,
    /// The setup that made it (`prebuilt_at` set to when it finished).
    pub setup: SetupRecord,
}

/// What eviction and retirement read of every prebuild.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrebuildSummary {
    pub key: String,
    pub layer: String,
    pub image_digest: Digest,
    pub ready: bool,
    pub bytes: u64,
    /// Whether an environment that is not deleted was provisioned from it.
    pub pinned: bool,
}

fn millis_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn bytes_of(row: &sqlx::sqlite::SqliteRow) -> Result<u64, StoreError> {
    Ok(u64::try_from(row.try_get::<i64, _>("bytes")?).unwrap_or(0))
}

impl Store {
    /// Records `prebuild` as being made, unless one of its key exists: whether it was recorded.
    /// Recorded first, so that a daemon that dies midway knows what to take back.
    pub async fn begin_prebuild(&self, prebuild: &PrebuildRecord) -> Result<bool, StoreError> {
        let setup = &prebuild.setup;
        let done = sqlx::query(
            "INSERT OR IGNORE INTO prebuilds (key, organisation, image_digest, layer, state, \
             bytes, setup_exit_code, setup_output, setup_output_truncated, setup_started_at, \
             setup_finished_at, last_used) VALUES (?, ?, ?, ?, 'making', 0, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&prebuild.key)
        .bind(&prebuild.organisation)
        .bind(prebuild.image_digest.to_string())
        .bind(&prebuild.layer)
        .bind(setup.exit_code)
        .bind(&setup.output)
        .bind(setup.output_truncated)
        .bind(&setup.started_at)
        .bind(&setup.finished_at)
        .bind(millis_now())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Marks prebuild `key` whole, holding `bytes`: from now on creates are served from it.
    /// Whether its `making` row was still there to mark.
    pub async fn finish_prebuild(&self, key: &str, bytes: u64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE prebuilds SET state = 'ready', bytes = ?, last_used = ? \
             WHERE key = ? AND state = 'making'",
        )
        .bind(i64::try_from(bytes).unwrap_or(i64::MAX))
        .bind(millis_now())
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The whole prebuild of `key`, if there is one.
    pub async fn ready_prebuild(&self, key: &str) -> Result<Option<PrebuildRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT key, organisation, image_digest, layer, bytes, setup_exit_code, \
             setup_output, setup_output_truncated, setup_started_at, setup_finished_at \
             FROM prebuilds WHERE key = ? AND state = 'ready'",
        )
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let finished_at: String = row.try_get("setup_finished_at")?;
        Ok(Some(PrebuildRecord {
            key: row.try_get("key")?,
            organisation: row.try_get("organisation")?,
            image_digest: parsed(&row, "image_digest")?,
            layer: row.try_get("layer")?,
            bytes: bytes_of(&row)?,
            setup: SetupRecord {
                state: SetupState::Succeeded,
                step: SetupStep::Setup,
                exit_code: row.try_get("setup_exit_code")?,
                output: row
                    .try_get::<Option<Vec<u8>>, _>("setup_output")?
                    .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                    .unwrap_or_default(),
                output_truncated: row.try_get("setup_output_truncated")?,
                started_at: row.try_get("setup_started_at")?,
                prebuilt_at: Some(finished_at.clone()),
                finished_at,
            },
        }))
    }

    /// Notes that environment `id` was provisioned from prebuild `key`, which keeps it while
    /// the environment is not deleted, and counts as its most recent use.
    pub async fn use_prebuild(&self, id: &EnvironmentId, key: &str) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT OR REPLACE INTO prebuild_uses (id, key) VALUES (?, ?)")
            .bind(id.as_str())
            .bind(key)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE prebuilds SET last_used = ? WHERE key = ?")
            .bind(millis_now())
            .bind(key)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The prebuild environment `id` was provisioned from, if it was and it is still kept.
    pub async fn prebuild_of(&self, id: &EnvironmentId) -> Result<Option<String>, StoreError> {
        let row = sqlx::query(
            "SELECT u.key FROM prebuild_uses u JOIN prebuilds p ON p.key = u.key \
             WHERE u.id = ? AND p.state = 'ready'",
        )
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| r.try_get("key")).transpose()?)
    }

    /// Every prebuild, least recently used first.
    pub async fn prebuilds(&self) -> Result<Vec<PrebuildSummary>, StoreError> {
        let rows = sqlx::query(
            "SELECT p.key, p.layer, p.image_digest, p.state = 'ready' AS ready, p.bytes, \
             EXISTS (SELECT 1 FROM prebuild_uses u JOIN environments e ON e.id = u.id \
                     WHERE u.key = p.key AND e.deleted_at IS NULL) AS pinned \
             FROM prebuilds p ORDER BY p.last_used, p.key",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(PrebuildSummary {
                    key: row.try_get("key")?,
                    layer: row.try_get("layer")?,
                    image_digest: parsed(row, "image_digest")?,
                    ready: row.try_get("ready")?,
                    bytes: bytes_of(row)?,
                    pinned: row.try_get("pinned")?,
                })
            })
            .collect()
    }

    /// Forgets prebuild `key` and which environments were made from it (what it kept is
    /// removed by the caller first): a later prebuild of the same key starts unpinned.
    pub async fn forget_prebuild(&self, key: &str) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for sql in [
            "DELETE FROM prebuilds WHERE key = ?",
            "DELETE FROM prebuild_uses WHERE key = ?",
        ] {
            sqlx::query(sql).bind(key).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
