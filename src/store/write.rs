//! Changing environments: inserting, recording, setting a status or a step, deleting and
//! purging rows. Every status written here is published to the store's events.

use sqlx::Row;

use super::{bind_changing, parsed, EnvironmentRecord, Store, StoreError};
use crate::events::StatusEvent;
use crate::model::{EnvironmentId, SetupStep, Status};

impl Store {
    /// Publishes `record`'s status as just written.
    fn published(&self, record: &EnvironmentRecord) {
        self.events.publish(
            &record.organisation,
            StatusEvent {
                id: record.id.clone(),
                status: record.status,
                status_detail: record.status_detail.clone(),
                at: record.updated_at.clone(),
            },
        );
    }

    /// The status and detail `organisation`'s `id` has now, if it exists.
    async fn status_of(
        &self,
        organisation: &str,
        id: &EnvironmentId,
    ) -> Result<Option<(Status, Option<String>)>, StoreError> {
        let row = sqlx::query(
            "SELECT status, status_detail FROM environments WHERE organisation = ? AND id = ?",
        )
        .bind(organisation)
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| Ok((parsed(&row, "status")?, row.try_get("status_detail")?)))
            .transpose()
    }

    /// Sets an environment's status and detail, nothing else, if either changes.
    pub async fn set_status(
        &self,
        organisation: &str,
        id: &EnvironmentId,
        status: Status,
        detail: Option<&str>,
        at: &str,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(
            "UPDATE environments SET status = ?, status_detail = ?, updated_at = ? \
             WHERE organisation = ? AND id = ? AND (status IS NOT ? OR status_detail IS NOT ?)",
        )
        .bind(status.as_str())
        .bind(detail)
        .bind(at)
        .bind(organisation)
        .bind(id.as_str())
        .bind(status.as_str())
        .bind(detail)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 1 {
            self.events.publish(
                organisation,
                StatusEvent {
                    id: id.clone(),
                    status,
                    status_detail: detail.map(str::to_owned),
                    at: at.to_owned(),
                },
            );
        }
        Ok(())
    }

    /// Inserts a new row. Fails with [`StoreError::Held`] when the id is held.
    pub async fn insert(&self, record: &EnvironmentRecord) -> Result<(), StoreError> {
        self.insert_within(record, usize::MAX).await
    }

    /// Inserts a new row unless its organisation already holds `max_environments` recorded
    /// environments (not `gone`): [`StoreError::AtLimit`]. Counted and inserted in one
    /// statement, so creates racing each other never pass the limit together.
    pub async fn insert_within(
        &self,
        record: &EnvironmentRecord,
        max_environments: usize,
    ) -> Result<(), StoreError> {
        let query = sqlx::query(
            "INSERT INTO environments (id, organisation, person, created_at, fingerprint, \
             setup_script, repository, image_digest, setup_recorded, status, status_detail, \
             setup_state, setup_step, setup_exit_code, setup_output, setup_output_truncated, \
             setup_started_at, setup_finished_at, updated_at, deleted_at, setup_prebuilt_at, \
             machine) \
             SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? \
             WHERE (SELECT COUNT(*) FROM environments WHERE organisation = ? \
                    AND status != 'gone') < ?",
        )
        .bind(record.id.as_str())
        .bind(&record.organisation)
        .bind(&record.person)
        .bind(&record.created_at);
        let inserted = bind_changing(query, record)
            .bind(&record.machine)
            .bind(&record.organisation)
            .bind(i64::try_from(max_environments).unwrap_or(i64::MAX))
            .execute(&self.pool)
            .await;
        match inserted {
            Err(e)
                if e.as_database_error()
                    .is_some_and(|d| d.is_unique_violation()) =>
            {
                return Err(StoreError::Held(e))
            }
            Ok(done) if done.rows_affected() == 0 => {
                return Err(StoreError::AtLimit(max_environments))
            }
            done => done?,
        };
        self.published(record);
        Ok(())
    }

    /// Writes a row's status, setup record and fingerprint in one statement: the outcome of a
    /// create is recorded whole or not at all. A changed status is published; the writes of one
    /// environment are serialised by its lock, so the status read first is the one replaced.
    pub async fn record(&self, record: &EnvironmentRecord) -> Result<(), StoreError> {
        let before = self.status_of(&record.organisation, &record.id).await?;
        let query = sqlx::query(
            "UPDATE environments SET fingerprint = ?, setup_script = ?, repository = ?, \
             image_digest = ?, setup_recorded = ?, status = ?, status_detail = ?, \
             setup_state = ?, setup_step = ?, setup_exit_code = ?, setup_output = ?, \
             setup_output_truncated = ?, setup_started_at = ?, setup_finished_at = ?, \
             updated_at = ?, deleted_at = ?, setup_prebuilt_at = ?, machine = ? \
             WHERE organisation = ? AND id = ?",
        );
        let done = bind_changing(query, record)
            .bind(&record.machine)
            .bind(&record.organisation)
            .bind(record.id.as_str())
            .execute(&self.pool)
            .await?;
        let now = (record.status, record.status_detail.clone());
        if done.rows_affected() == 1 && before != Some(now) {
            self.published(record);
        }
        Ok(())
    }

    /// Deletes `id` if `organisation` holds it; whether a row went.
    pub async fn delete(&self, organisation: &str, id: &EnvironmentId) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM environments WHERE organisation = ? AND id = ?")
            .bind(organisation)
            .bind(id.as_str())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Notes which step of a create or replace is under way, so that a daemon stop can say
    /// which one it interrupted.
    pub async fn set_step(
        &self,
        organisation: &str,
        id: &EnvironmentId,
        step: SetupStep,
        at: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE environments SET setup_step = ?, setup_started_at = ? \
             WHERE organisation = ? AND id = ? AND setup_recorded = 0",
        )
        .bind(step.as_str())
        .bind(at)
        .bind(organisation)
        .bind(id.as_str())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records a create or replace the host stopped during as `unusable`, its setup state
    /// `interrupted` in the step it was in; the setup state itself stays unrecorded.
    pub async fn record_interrupted(
        &self,
        organisation: &str,
        id: &EnvironmentId,
        detail: &str,
        output: &str,
        at: &str,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(
            "UPDATE environments SET status = 'unusable', status_detail = ?, \
             setup_state = 'interrupted', setup_step = COALESCE(setup_step, 'setup'), \
             setup_exit_code = NULL, setup_output = ?, setup_output_truncated = 0, \
             setup_started_at = COALESCE(setup_started_at, created_at), setup_finished_at = ?, \
             updated_at = ? WHERE organisation = ? AND id = ? AND setup_recorded = 0",
        )
        .bind(detail)
        .bind(output)
        .bind(at)
        .bind(at)
        .bind(organisation)
        .bind(id.as_str())
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 1 {
            self.events.publish(
                organisation,
                StatusEvent {
                    id: id.clone(),
                    status: Status::Unusable,
                    status_detail: Some(detail.to_owned()),
                    at: at.to_owned(),
                },
            );
        }
        Ok(())
    }

    /// Removes the rows of environments deleted before `before` (unix seconds); how many went.
    pub async fn purge_deleted(&self, before: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM environments WHERE deleted_at < ?")
            .bind(before)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
