//! Reading environments: one by id, an organisation's list or a page of it, the summaries the
//! reconciler and the sweeps walk, who holds an id, and how many an organisation has recorded.

use sqlx::Row;

use super::{
    parsed, record_from_row, EnvironmentRecord, EnvironmentSummary, Store, StoreError, COLUMNS,
};
use crate::model::EnvironmentId;

impl Store {
    /// The environment `id` if `organisation` holds it.
    pub async fn get(
        &self,
        organisation: &str,
        id: &EnvironmentId,
    ) -> Result<Option<EnvironmentRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM environments WHERE organisation = ? AND id = ?");
        let row = sqlx::query(&sql)
            .bind(organisation)
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(record_from_row).transpose()
    }

    /// Every environment of `organisation`, ordered by id, without their setup scripts (never
    /// shown, up to 64 KiB each).
    pub async fn list(&self, organisation: &str) -> Result<Vec<EnvironmentRecord>, StoreError> {
        let columns = COLUMNS.replace("setup_script", "NULL AS setup_script");
        let sql = format!("SELECT {columns} FROM environments WHERE organisation = ? ORDER BY id");
        let rows = sqlx::query(&sql)
            .bind(organisation)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(record_from_row).collect()
    }

    /// Up to `limit` environments of `organisation` whose ids sort after `after` (all, when
    /// `None`), by id: a list read a page at a time, so answering it holds one page however
    /// many rows the organisation has and whatever they hold.
    pub async fn list_page(
        &self,
        organisation: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<EnvironmentRecord>, StoreError> {
        let columns = COLUMNS.replace("setup_script", "NULL AS setup_script");
        let sql = format!(
            "SELECT {columns} FROM environments WHERE organisation = ? AND id > ? \
             ORDER BY id LIMIT ?"
        );
        let rows = sqlx::query(&sql)
            .bind(organisation)
            .bind(after.unwrap_or(""))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(record_from_row).collect()
    }

    /// Every environment on this host that is not deleted, of every organisation, summarised:
    /// for the reconciler and the sweeps only, which compare them with the runtime and never
    /// show them to anyone. Read a row at a time, so a pass costs the summaries alone, however
    /// many deleted rows wait for their retention and whatever the rows hold.
    pub async fn summaries(&self) -> Result<Vec<EnvironmentSummary>, StoreError> {
        use futures_util::TryStreamExt;
        let mut rows = sqlx::query(
            "SELECT id, organisation, machine, status, status_detail, setup_recorded, \
             setup_state IS NOT NULL AS has_setup FROM environments \
             WHERE deleted_at IS NULL ORDER BY id",
        )
        .fetch(&self.pool);
        let mut summaries = Vec::new();
        while let Some(row) = rows.try_next().await? {
            summaries.push(EnvironmentSummary {
                id: parsed(&row, "id")?,
                organisation: row.try_get("organisation")?,
                machine: row.try_get("machine")?,
                status: parsed(&row, "status")?,
                status_detail: row.try_get("status_detail")?,
                setup_recorded: row.try_get("setup_recorded")?,
                has_setup: row.try_get("has_setup")?,
            });
        }
        Ok(summaries)
    }

    /// Which organisation holds `id`, if any. Used only to refuse a create, never to show.
    pub async fn holder(&self, id: &EnvironmentId) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT organisation FROM environments WHERE id = ?")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get("organisation")).transpose()?)
    }

    /// How many recorded environments (not `gone`) `organisation` holds.
    pub async fn recorded_count(&self, organisation: &str) -> Result<usize, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS n FROM environments WHERE organisation = ? AND status != 'gone'",
        )
        .bind(organisation)
        .fetch_one(&self.pool)
        .await?;
        let n: i64 = row.try_get("n")?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }
}
