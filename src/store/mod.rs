//! The durable record of environments and GitHub installations: SQLite through sqlx, WAL,
//! migrations embedded. Every query that reads or changes an environment is scoped by
//! organisation; the one exception, [`Store::holder`], answers only "who holds this id".

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use crate::events::Events;
use crate::model::{Digest, EnvironmentId, Repository, SetupState, SetupStep, Status};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the state directory {path}: {source}")]
    StateDir {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot open the database {path}: {source}")]
    Open { path: String, source: sqlx::Error },
    #[error("cannot apply the database migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database query failed: {0}")]
    Query(#[from] sqlx::Error),
    /// An insert met a row of the same identifier (another organisation's create won a race).
    #[error("the identifier is held by another row")]
    Held(#[source] sqlx::Error),
    /// An insert would take an organisation past its `max_environments`.
    #[error("the organisation holds its limit of {0} environments")]
    AtLimit(usize),
    #[error("the database holds a {column} it cannot read back ({value:?}): {reason}")]
    Corrupt {
        column: &'static str,
        value: String,
        reason: String,
    },
}

/// What the setup (or a failed clone) did, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetupRecord {
    pub state: SetupState,
    pub step: SetupStep,
    pub exit_code: Option<i64>,
    pub output: String,
    pub output_truncated: bool,
    pub started_at: String,
    pub finished_at: String,
    /// When the run this record is of made the prebuild the environment was provisioned from;
    /// `None` when the setup ran for this environment itself.
    pub prebuilt_at: Option<String>,
}

/// One environment row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvironmentRecord {
    pub id: EnvironmentId,
    pub organisation: String,
    pub person: String,
    pub fingerprint: String,
    pub setup_script: Option<String>,
    pub repository: Option<Repository>,
    pub image_digest: Digest,
    /// False while provisioning; a row left false by a dead daemon has an unrecorded setup state.
    pub setup_recorded: bool,
    pub status: Status,
    pub status_detail: Option<String>,
    pub setup: Option<SetupRecord>,
    pub created_at: String,
    pub updated_at: String,
    /// When it was deleted (unix seconds): its row answers `gone` until the retention passes.
    pub deleted_at: Option<i64>,
    /// The runtime's name for its machine.
    pub machine: String,
}

/// What the reconciler and the sweeps read of every row not deleted: who, which machine, how it stands;
/// never the script or the output, so a pass over many rows costs little whatever they hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvironmentSummary {
    pub id: EnvironmentId,
    pub organisation: String,
    pub machine: String,
    pub status: Status,
    pub status_detail: Option<String>,
    pub setup_recorded: bool,
    /// Whether a setup (or clone) outcome is recorded.
    pub has_setup: bool,
}

/// The database, and the events every status it writes is published to: statuses are written
/// here and nowhere else, so a watcher misses none.
#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
    events: Events,
}

const COLUMNS: &str = "id, organisation, person, fingerprint, setup_script, repository, \
    image_digest, setup_recorded, status, status_detail, setup_state, setup_step, \
    setup_exit_code, setup_output, setup_output_truncated, setup_started_at, setup_finished_at, \
    created_at, updated_at, deleted_at, machine, setup_prebuilt_at";

/// Column `column` of `row`, parsed into its domain type: a value that does not parse is a
/// corrupt row, said at once rather than found later.
fn parsed<T>(row: &sqlx::sqlite::SqliteRow, column: &'static str) -> Result<T, StoreError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    let value: String = row.try_get(column)?;
    value.parse().map_err(|e: T::Err| StoreError::Corrupt {
        column,
        reason: e.to_string(),
        value,
    })
}

/// Like [`parsed`], for a column that may be NULL.
fn parsed_optional<T>(
    row: &sqlx::sqlite::SqliteRow,
    column: &'static str,
) -> Result<Option<T>, StoreError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    match row.try_get::<Option<String>, _>(column)? {
        None => Ok(None),
        Some(_) => parsed(row, column).map(Some),
    }
}

fn record_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<EnvironmentRecord, StoreError> {
    let setup = match parsed_optional::<SetupState>(row, "setup_state")? {
        None => None,
        Some(state) => Some(SetupRecord {
            state,
            step: parsed(row, "setup_step")?,
            exit_code: row.try_get("setup_exit_code")?,
            // Read as bytes: output is a tenant's, and a row holding bytes that are not UTF-8
            // (written by an older daemon, or by hand) must not make its organisation's list
            // fail; they read as U+FFFD.
            output: row
                .try_get::<Option<Vec<u8>>, _>("setup_output")?
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_default(),
            output_truncated: row
                .try_get::<Option<bool>, _>("setup_output_truncated")?
                .unwrap_or(false),
            started_at: row.try_get("setup_started_at")?,
            finished_at: row.try_get("setup_finished_at")?,
            prebuilt_at: row.try_get("setup_prebuilt_at")?,
        }),
    };
    Ok(EnvironmentRecord {
        id: parsed(row, "id")?,
        organisation: row.try_get("organisation")?,
        person: row.try_get("person")?,
        fingerprint: row.try_get("fingerprint")?,
        setup_script: row.try_get("setup_script")?,
        repository: parsed_optional(row, "repository")?,
        image_digest: parsed(row, "image_digest")?,
        setup_recorded: row.try_get("setup_recorded")?,
        status: parsed(row, "status")?,
        status_detail: row.try_get("status_detail")?,
        setup,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        deleted_at: row.try_get("deleted_at")?,
        machine: row.try_get("machine")?,
    })
}

type Query<'q> = sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

/// Binds the columns a row's life changes, from `fingerprint` to `deleted_at`, in table order,
/// then `setup_prebuilt_at`.
fn bind_changing<'q>(query: Query<'q>, record: &'q EnvironmentRecord) -> Query<'q> {
    let setup = record.setup.as_ref();
    query
        .bind(&record.fingerprint)
        .bind(&record.setup_script)
        .bind(record.repository.as_ref().map(Repository::as_str))
        .bind(record.image_digest.to_string())
        .bind(record.setup_recorded)
        .bind(record.status.as_str())
        .bind(&record.status_detail)
        .bind(setup.map(|s| s.state.as_str()))
        .bind(setup.map(|s| s.step.as_str()))
        .bind(setup.and_then(|s| s.exit_code))
        .bind(setup.map(|s| &s.output))
        .bind(setup.map(|s| s.output_truncated))
        .bind(setup.map(|s| &s.started_at))
        .bind(setup.map(|s| &s.finished_at))
        .bind(&record.updated_at)
        .bind(record.deleted_at)
        .bind(setup.and_then(|s| s.prebuilt_at.as_deref()))
}

impl Store {
    /// Opens (creating if needed) the database at `path` and applies the embedded migrations.
    pub async fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::StateDir {
                path: dir.display().to_string(),
                source,
            })?;
        }
        // The database holds every environment's setup output: it is the daemon's alone.
        // SQLite gives the -wal and -shm files it creates the database file's mode, so the file
        // is created 0600 before SQLite opens it; files an older daemon left are tightened.
        let private = |file: &Path| -> std::io::Result<()> {
            match std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                done => done,
            }
        };
        let made_private = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .and_then(|_| {
                ["", "-wal", "-shm"].iter().try_for_each(|suffix| {
                    let mut file = path.as_os_str().to_owned();
                    file.push(suffix);
                    private(Path::new(&file))
                })
            });
        made_private.map_err(|e| StoreError::Open {
            path: path.display().to_string(),
            source: sqlx::Error::Io(e),
        })?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // A recorded setup state must survive a crash of the host, not only of the daemon.
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|source| StoreError::Open {
                path: path.display().to_string(),
                source,
            })?;
        sqlx::migrate!("src/store/migrations").run(&pool).await?;
        Ok(Store {
            pool,
            events: Events::default(),
        })
    }

    /// Where the statuses this store writes are published.
    pub fn events(&self) -> &Events {
        &self.events
    }

    /// Closes the pool, checkpointing the WAL.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

mod census;
mod github;
mod prebuilds;
mod read;
mod write;

pub use census::Census;
#[cfg(test)]
mod tests;

pub use github::{ConnectedInstallation, Connecting};
pub use prebuilds::{PrebuildRecord, PrebuildSummary};
