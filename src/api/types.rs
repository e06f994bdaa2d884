//! Request and response bodies of the HTTP API, with their OpenAPI schemas.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::model::Status;
use crate::store::{EnvironmentRecord, SetupRecord};

/// Request to provision an environment. No image is named: there is one official image.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    /// The environment's identifier, unique on this host; one path segment.
    #[schema(
        min_length = 1,
        max_length = 64,
        pattern = "^[A-Za-z0-9][A-Za-z0-9._-]*$",
        example = "demo"
    )]
    pub id: String,
    /// A script run once inside the new environment, bounded in time, as the unprivileged user,
    /// in the workspace.
    #[schema(max_length = 65536)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub setup: Option<String>,
    /// A repository the organisation selected when it installed Narya's GitHub App.
    #[schema(
        max_length = 200,
        pattern = "^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$",
        example = "acme/app"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
}

/// Whether an environment is answering and, when not, whether waiting is the right move.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StatusView {
    Ready,
    Degraded,
    Gone,
    Unusable,
}

/// What the setup script (or a failed clone) did.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct SetupView {
    /// `succeeded`, `failed`, `timed_out`, or `interrupted` (the host stopped during the step:
    /// nobody can say what it left behind, so the environment is `unusable`, a setup-carrying
    /// create of it is refused with NRY-0041 and a setup-less one adopts it).
    #[schema(example = "succeeded")]
    pub state: String,
    /// `clone` or `setup`: which step the output belongs to.
    #[schema(example = "setup")]
    pub step: String,
    /// Null when the step was killed.
    pub exit_code: Option<i64>,
    /// The tail of combined stdout and stderr.
    pub output: String,
    pub output_truncated: bool,
    pub started_at: String,
    pub finished_at: String,
    /// Present only when the environment was provisioned from a prebuild: then this is the
    /// record of the run that made it, at that time, and no setup ran for this environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "2026-01-01T12:00:00Z")]
    pub prebuilt_at: Option<String>,
}

/// A place a session's code lives and its commands run.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct EnvironmentView {
    #[schema(example = "demo")]
    pub id: String,
    pub status: StatusView,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_detail: Option<String>,
    /// The digest of the image this environment runs, pinned at creation.
    #[schema(example = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")]
    pub image_digest: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub setup: Option<SetupView>,
    pub created_at: String,
}

/// The caller's organisation's environments, by id.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EnvironmentList {
    pub environments: Vec<EnvironmentView>,
}

/// A command to run in a ready environment.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    #[schema(example = json!(["bash", "-lc", "make test"]))]
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Defaults to the workspace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Defaults to, and may not exceed, `environment.exec_timeout`.
    #[schema(example = "10m")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
}

/// What became of an exec.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    pub exit_code: Option<i64>,
    pub timed_out: bool,
    pub output: String,
    pub output_truncated: bool,
    pub duration_ms: u64,
}

/// The organisation's GitHub App installation, and the proof that the person connecting it can
/// access it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectGitHubBody {
    pub installation_id: u64,
    /// The one-time OAuth code GitHub hands the person after they install the App (the App's
    /// setup URL receives it with `installation_id`).
    pub code: String,
}

/// The organisation's connected GitHub App installation.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct GitHubView {
    pub installation_id: i64,
    /// The login of the GitHub account the installation belongs to.
    pub account: Option<String>,
}

impl From<Status> for StatusView {
    fn from(status: Status) -> Self {
        match status {
            Status::Ready => StatusView::Ready,
            Status::Degraded => StatusView::Degraded,
            Status::Gone => StatusView::Gone,
            Status::Unusable => StatusView::Unusable,
        }
    }
}

/// One line of `GET /v1/events`: an environment's status as it was just written.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct EventLine {
    #[schema(example = "demo")]
    pub id: String,
    pub status: StatusView,
    /// Null when the status says it all.
    pub status_detail: Option<String>,
    /// When the status was written (RFC 3339).
    #[schema(example = "2026-01-01T12:00:00Z")]
    pub at: String,
}

impl From<&SetupRecord> for SetupView {
    fn from(s: &SetupRecord) -> Self {
        SetupView {
            state: s.state.as_str().to_owned(),
            step: s.step.as_str().to_owned(),
            exit_code: s.exit_code,
            output: s.output.clone(),
            output_truncated: s.output_truncated,
            started_at: s.started_at.clone(),
            finished_at: s.finished_at.clone(),
            prebuilt_at: s.prebuilt_at.clone(),
        }
    }
}

impl From<&EnvironmentRecord> for EnvironmentView {
    fn from(r: &EnvironmentRecord) -> Self {
        EnvironmentView {
            id: r.id.to_string(),
            status: StatusView::from(r.status),
            status_detail: r.status_detail.clone(),
            image_digest: r.image_digest.to_string(),
            repository: r.repository.as_ref().map(ToString::to_string),
            setup: r.setup.as_ref().map(SetupView::from),
            created_at: r.created_at.clone(),
        }
    }
}
