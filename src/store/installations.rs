//! The GitHub App installation each organisation connected.

use sqlx::Row;

use super::{Store, StoreError};

impl Store {
    /// The GitHub App installation `organisation` connected, if any.
    pub async fn installation(&self, organisation: &str) -> Result<Option<i64>, StoreError> {
        let row =
            sqlx::query("SELECT installation_id FROM github_installations WHERE organisation = ?")
                .bind(organisation)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|r| r.try_get("installation_id")).transpose()?)
    }

    /// Records (or replaces) `organisation`'s installation.
    pub async fn connect_installation(
        &self,
        organisation: &str,
        installation_id: i64,
        at: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO github_installations (organisation, installation_id, connected_at) \
             VALUES (?, ?, ?) ON CONFLICT (organisation) DO UPDATE SET \
             installation_id = excluded.installation_id, connected_at = excluded.connected_at",
        )
        .bind(organisation)
        .bind(installation_id)
        .bind(at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
