//! The GitHub App installation each organisation connected: one installation, one organisation.

use sqlx::Row;

use super::{Store, StoreError};

/// An organisation's connected installation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectedInstallation {
    pub installation_id: i64,
    /// The login of the GitHub account it belongs to, as GitHub named it when it was connected.
    pub account: Option<String>,
}

/// What became of connecting an installation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connecting {
    /// Recorded (or already so): the organisation's creates clone through it.
    Connected,
    /// Another organisation holds it; nothing was recorded.
    HeldByAnother,
}

impl Store {
    /// The GitHub App installation `organisation` connected, if any.
    pub async fn installation(&self, organisation: &str) -> Result<Option<i64>, StoreError> {
        Ok(self
            .connected_installation(organisation)
            .await?
            .map(|c| c.installation_id))
    }

    /// `organisation`'s installation and its account, if any.
    pub async fn connected_installation(
        &self,
        organisation: &str,
    ) -> Result<Option<ConnectedInstallation>, StoreError> {
        let row = sqlx::query(
            "SELECT installation_id, account FROM github_installations WHERE organisation = ?",
        )
        .bind(organisation)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(ConnectedInstallation {
                installation_id: r.try_get("installation_id")?,
                account: r.try_get("account")?,
            })
        })
        .transpose()
    }

    /// Records (or replaces) `organisation`'s installation, unless another organisation holds
    /// it: checked and written in one immediate transaction, so of two organisations racing for
    /// one installation exactly one wins.
    pub async fn connect_installation(
        &self,
        organisation: &str,
        installation: &ConnectedInstallation,
        at: &str,
    ) -> Result<Connecting, StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let holder: Option<String> = sqlx::query_scalar(
            "SELECT organisation FROM github_installations \
             WHERE installation_id = ? AND organisation != ?",
        )
        .bind(installation.installation_id)
        .bind(organisation)
        .fetch_optional(&mut *tx)
        .await?;
        if holder.is_some() {
            return Ok(Connecting::HeldByAnother);
        }
        sqlx::query(
            "INSERT INTO github_installations (organisation, installation_id, account, connected_at) \
             VALUES (?, ?, ?, ?) ON CONFLICT (organisation) DO UPDATE SET \
             installation_id = excluded.installation_id, account = excluded.account, \
             connected_at = excluded.connected_at",
        )
        .bind(organisation)
        .bind(installation.installation_id)
        .bind(installation.account.as_deref())
        .bind(at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Connecting::Connected)
    }

    /// Forgets `organisation`'s installation; whether there was one.
    pub async fn disconnect_installation(&self, organisation: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM github_installations WHERE organisation = ?")
            .bind(organisation)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::Arc;

    use sqlx::migrate::Migrator;
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

    use super::*;

    fn installation(id: i64, account: &str) -> ConnectedInstallation {
        ConnectedInstallation {
            installation_id: id,
            account: Some(account.to_owned()),
        }
    }

    #[tokio::test]
    async fn one_installation_belongs_to_one_organisation() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("narya.db")).await.unwrap();
        assert_eq!(store.installation("acme").await.unwrap(), None);
        let connect = |org: &'static str, id: i64| {
            let store = store.clone();
            async move {
                store
                    .connect_installation(org, &installation(id, "acme-gh"), "t")
                    .await
                    .unwrap()
            }
        };
        assert_eq!(connect("acme", 7).await, Connecting::Connected);
        assert_eq!(connect("acme", 7).await, Connecting::Connected, "again");
        assert_eq!(connect("globex", 7).await, Connecting::HeldByAnother);
        assert_eq!(store.installation("globex").await.unwrap(), None);
        assert_eq!(connect("acme", 8).await, Connecting::Connected, "replaced");
        assert_eq!(
            store.connected_installation("acme").await.unwrap(),
            Some(installation(8, "acme-gh"))
        );
        assert_eq!(connect("globex", 7).await, Connecting::Connected, "let go");
        assert!(store.disconnect_installation("acme").await.unwrap());
        assert!(!store.disconnect_installation("acme").await.unwrap());
        assert_eq!(store.installation("acme").await.unwrap(), None);
        assert_eq!(store.installation("globex").await.unwrap(), Some(7));
    }

    #[tokio::test]
    async fn of_organisations_racing_for_one_installation_exactly_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("narya.db")).await.unwrap());
        let racers: Vec<_> = (0..8)
            .map(|n| {
                let store = store.clone();
                tokio::spawn(async move {
                    let org = format!("org-{n}");
                    let won = store
                        .connect_installation(&org, &installation(7, "acme-gh"), "t")
                        .await
                        .unwrap();
                    (org, won)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for racer in racers {
            let (org, won) = racer.await.unwrap();
            if won == Connecting::Connected {
                winners.push(org);
            }
        }
        assert_eq!(winners.len(), 1, "{winners:?}");
        assert_eq!(store.installation(&winners[0]).await.unwrap(), Some(7));
    }

    /// A database at `path` with the migrations up to `version` only, as an older daemon left it.
    async fn migrated_to(path: &std::path::Path, version: i64) -> sqlx::SqlitePool {
        let all = sqlx::migrate!("src/store/migrations");
        let older = Migrator {
            migrations: Cow::Owned(
                all.migrations
                    .iter()
                    .filter(|m| m.version <= version)
                    .cloned()
                    .collect(),
            ),
            ..Migrator::DEFAULT
        };
        let pool = SqlitePoolOptions::new()
            .connect_with(
                SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(true),
            )
            .await
            .unwrap();
        older.run(&pool).await.unwrap();
        pool
    }

    #[tokio::test]
    async fn installations_connected_without_proof_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("narya.db");
        let pool = migrated_to(&path, 2).await;
        sqlx::query("INSERT INTO github_installations VALUES ('acme', 7, 't')")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        let store = Store::open(&path).await.unwrap();
        assert_eq!(store.installation("acme").await.unwrap(), None);
    }

    #[tokio::test]
    async fn installations_proved_by_access_alone_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("narya.db");
        let pool = migrated_to(&path, 3).await;
        sqlx::query("INSERT INTO github_installations VALUES ('acme', 7, 'acme', 't')")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        let store = Store::open(&path).await.unwrap();
        assert_eq!(store.installation("acme").await.unwrap(), None);
        // A connect after the upgrade is kept.
        let connected = ConnectedInstallation {
            installation_id: 7,
            account: Some("acme".to_owned()),
        };
        store
            .connect_installation("acme", &connected, "t")
            .await
            .unwrap();
        assert_eq!(store.installation("acme").await.unwrap(), Some(7));
    }
}
