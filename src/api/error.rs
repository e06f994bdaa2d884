//! The error catalogue: the one place that decides HTTP status and NRY code.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use narya_runtimes::ErrorKind;
use serde::Serialize;
use utoipa::ToSchema;

use crate::environments::{EnvironmentError, InvalidExec};
use crate::model::InvalidRequest;
use crate::organisation::OrganisationError;

/// The body of every error answer.
#[derive(Debug, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorBody {
    /// `NRY-NNNN`, one of the contract's codes.
    #[schema(example = "NRY-0030")]
    pub code: String,
    /// One sentence a person can act on.
    pub message: String,
}

/// Every way a request can fail, as the API reports it: the transport's own refusals, and the
/// domain's errors wrapped whole.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("a valid bearer token from the configured identity provider is required")]
    Unauthenticated,
    #[error("{0}")]
    BadBody(String),
    #[error("no route {method} {path}; the API is described at GET /v1/openapi.json")]
    NoRoute { method: String, path: String },
    #[error("{method} is not allowed on {path}; the API is described at GET /v1/openapi.json")]
    MethodNotAllowed { method: String, path: String },
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
    #[error(transparent)]
    InvalidExec(#[from] InvalidExec),
    #[error(transparent)]
    Environment(#[from] EnvironmentError),
    #[error(transparent)]
    Organisation(#[from] OrganisationError),
    /// The daemon stopped at its shutdown timeout with the answer still streaming.
    #[error("the host is shutting down and its shutdown timeout ended this stream; what it ran was stopped; repeat the request once the host is back")]
    ShuttingDown,
    /// The organisation holds its share of open event streams.
    #[error("your organisation holds {max} open event streams, its limit on this host (`[organisation] max_event_streams`); close one before opening another")]
    TooManyStreams { max: usize },
    /// A streaming reader fell further behind than the host keeps for it.
    #[error("this stream fell {missed} progress lines behind its reader and was ended so that it holds no more of the host's memory; the create goes on: GET /v1/environments/{id} for its outcome")]
    StreamFellBehind { id: String, missed: u64 },
}

const BAD_REQUEST: StatusCode = StatusCode::BAD_REQUEST;
const FORBIDDEN: StatusCode = StatusCode::FORBIDDEN;
const NOT_FOUND: StatusCode = StatusCode::NOT_FOUND;
const CONFLICT: StatusCode = StatusCode::CONFLICT;
const UNAVAILABLE: StatusCode = StatusCode::SERVICE_UNAVAILABLE;
const INTERNAL: (StatusCode, &str) = (StatusCode::INTERNAL_SERVER_ERROR, "NRY-0099");

impl ApiError {
    /// The HTTP status and NRY code of this error: the contract's catalogue, in one place.
    pub fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Unauthenticated => (StatusCode::UNAUTHORIZED, "NRY-0011"),
            ApiError::BadBody(_) | ApiError::InvalidExec(_) => (BAD_REQUEST, "NRY-0020"),
            ApiError::MethodNotAllowed { .. } => (StatusCode::METHOD_NOT_ALLOWED, "NRY-0020"),
            ApiError::Invalid(InvalidRequest::Id(_)) => (BAD_REQUEST, "NRY-0021"),
            ApiError::Invalid(InvalidRequest::SetupTooLong(_)) => (BAD_REQUEST, "NRY-0022"),
            ApiError::Invalid(InvalidRequest::Repository(_)) => (BAD_REQUEST, "NRY-0023"),
            ApiError::NoRoute { .. } => (NOT_FOUND, "NRY-0030"),
            ApiError::Environment(e) => environment_parts(e.cause()),
            ApiError::Organisation(o) => organisation_parts(o),
            ApiError::TooManyStreams { .. } => (StatusCode::TOO_MANY_REQUESTS, "NRY-0070"),
            ApiError::ShuttingDown | ApiError::StreamFellBehind { .. } => INTERNAL,
        }
    }

    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    pub fn code(&self) -> &'static str {
        self.parts().1
    }
}

fn environment_parts(e: &EnvironmentError) -> (StatusCode, &'static str) {
    use EnvironmentError as E;
    match e {
        E::NotFound(_) => (NOT_FOUND, "NRY-0030"),
        E::IdInUse(_) => (CONFLICT, "NRY-0040"),
        E::SetupUnrecorded(_) => (CONFLICT, "NRY-0041"),
        E::AtEnvironmentLimit { .. } => (StatusCode::TOO_MANY_REQUESTS, "NRY-0070"),
        E::HostShortOfDisk { .. } => (UNAVAILABLE, "NRY-0062"),
        E::NotReady { .. } | E::NotGone { .. } | E::Deleted(_) | E::NoRunningMachine { .. } => {
            (CONFLICT, "NRY-0042")
        }
        E::GitHub(o) => organisation_parts(o),
        E::Runtime(e) => match e.kind() {
            ErrorKind::Unavailable => (UNAVAILABLE, "NRY-0060"),
            ErrorKind::Image => (UNAVAILABLE, "NRY-0061"),
            ErrorKind::NotFound | ErrorKind::AlreadyExists | ErrorKind::Other => INTERNAL,
        },
        E::Joined(shared) => environment_parts(shared),
        E::Workspace { .. }
        | E::WorkspaceRemoval(_)
        | E::MachineVanished(_)
        | E::MachineUnlabelled(_)
        | E::Task { .. }
        | E::Store(_)
        | E::JoinedWithoutOutcome(_) => INTERNAL,
    }
}

fn organisation_parts(o: &OrganisationError) -> (StatusCode, &'static str) {
    use OrganisationError as O;
    match o {
        O::GitHubNotConfigured | O::NotConnected { .. } | O::InstallationNotFound { .. } => {
            (FORBIDDEN, "NRY-0050")
        }
        O::RepositoryNotSelected { .. } => (FORBIDDEN, "NRY-0051"),
        O::NotProved { .. } | O::NotOwner { .. } => (FORBIDDEN, "NRY-0052"),
        O::GitHubShareSpent { .. } => (StatusCode::TOO_MANY_REQUESTS, "NRY-0070"),
        O::GitHubRateLimited { .. } => (UNAVAILABLE, "NRY-0060"),
        O::HeldByAnother { .. } => (CONFLICT, "NRY-0053"),
        O::NoInstallation { .. } => (NOT_FOUND, "NRY-0030"),
        // The contract has one code for a dependency that is not answering.
        O::GitHubUnavailable(_) => (UNAVAILABLE, "NRY-0060"),
        O::GitHub(_) | O::Store(_) => INTERNAL,
    }
}

/// Carried on 5xx responses so the request log can say what failed, once.
#[derive(Clone, Debug)]
pub struct ServerFault(pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        let body = ErrorBody {
            code: code.to_owned(),
            message: self.to_string(),
        };
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if status.is_server_error() {
            response
                .extensions_mut()
                .insert(ServerFault(self.to_string()));
        }
        response
    }
}
