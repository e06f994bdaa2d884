//! Counts for the metrics: how many environments by status, how many organisations. Numbers
//! only; nothing that names an environment or an organisation leaves here.

use sqlx::Row;

use super::{parsed, Store, StoreError};
use crate::model::Status;

/// The environments of this host, counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Every status that has rows, with how many (deleted ones read `gone`).
    pub by_status: Vec<(Status, i64)>,
    /// Organisations with an environment that is not deleted.
    pub organisations: i64,
}

impl Store {
    /// Counts the environments by status and the organisations holding them.
    pub async fn census(&self) -> Result<Census, StoreError> {
        let rows = sqlx::query("SELECT status, COUNT(*) AS n FROM environments GROUP BY status")
            .fetch_all(&self.pool)
            .await?;
        let by_status = rows
            .iter()
            .map(|row| Ok((parsed(row, "status")?, row.try_get("n")?)))
            .collect::<Result<_, StoreError>>()?;
        let organisations = sqlx::query(
            "SELECT COUNT(DISTINCT organisation) AS n FROM environments WHERE deleted_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?
        .try_get("n")?;
        Ok(Census {
            by_status,
            organisations,
        })
    }
}
