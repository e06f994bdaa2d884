//! The error catalogue: the one place that decides HTTP status and NRY code.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::environments::{EnvironmentError, InvalidRequest};
use crate::store::StoreError;

/// The body of every error answer.
#[derive(Debug, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorBody {
    /// `NRY-NNNN`, one of the contract's codes.
    #[schema(example = "NRY-0030")]
    pub code: String,
    /// One sentence a person can act on.
    pub message: String,
}

/// Every way a request can fail, as the API reports it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("a valid bearer token from the configured identity provider is required")]
    Unauthenticated,
    #[error("{0}")]
    BadBody(String),
    #[error("{0}")]
    Invalid(#[from] InvalidRequest),
    #[error("no environment {0:?} in your organisation")]
    NotFound(String),
    #[error("no route {method} {path}; the API is described at GET /v1/openapi.json")]
    NoRoute { method: String, path: String },
    #[error("{method} is not allowed on {path}; the API is described at GET /v1/openapi.json")]
    MethodNotAllowed { method: String, path: String },
    #[error("{0}")]
    IdInUse(String),
    #[error("{0}")]
    SetupUnrecorded(String),
    #[error("{0}")]
    NotReady(String),
    #[error("{0}")]
    GitHubNotConnected(String),
    #[error("{0}")]
    RepositoryNotSelected(String),
    #[error("{0}")]
    RuntimeUnavailable(String),
    #[error("{0}")]
    ImageUnavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthenticated => StatusCode::UNAUTHORIZED,
            ApiError::BadBody(_) | ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) | ApiError::NoRoute { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::IdInUse(_) | ApiError::SetupUnrecorded(_) | ApiError::NotReady(_) => {
                StatusCode::CONFLICT
            }
            ApiError::GitHubNotConnected(_) | ApiError::RepositoryNotSelected(_) => {
                StatusCode::FORBIDDEN
            }
            ApiError::RuntimeUnavailable(_) | ApiError::ImageUnavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Unauthenticated => "NRY-0011",
            ApiError::BadBody(_) | ApiError::MethodNotAllowed { .. } => "NRY-0020",
            ApiError::Invalid(InvalidRequest::Id(_)) => "NRY-0021",
            ApiError::Invalid(InvalidRequest::SetupTooLong(_)) => "NRY-0022",
            ApiError::Invalid(InvalidRequest::Repository(_)) => "NRY-0023",
            ApiError::NotFound(_) | ApiError::NoRoute { .. } => "NRY-0030",
            ApiError::IdInUse(_) => "NRY-0040",
            ApiError::SetupUnrecorded(_) => "NRY-0041",
            ApiError::NotReady(_) => "NRY-0042",
            ApiError::GitHubNotConnected(_) => "NRY-0050",
            ApiError::RepositoryNotSelected(_) => "NRY-0051",
            ApiError::RuntimeUnavailable(_) => "NRY-0060",
            ApiError::ImageUnavailable(_) => "NRY-0061",
            ApiError::Internal(_) => "NRY-0099",
        }
    }
}

impl From<EnvironmentError> for ApiError {
    fn from(e: EnvironmentError) -> Self {
        let message = e.to_string();
        match e {
            EnvironmentError::IdInUse(_) | EnvironmentError::DifferentCreate(_) => {
                ApiError::IdInUse(message)
            }
            EnvironmentError::SetupUnrecorded(_) => ApiError::SetupUnrecorded(message),
            EnvironmentError::NotFound(id) => ApiError::NotFound(id),
            EnvironmentError::NotReady(_) => ApiError::NotReady(message),
            EnvironmentError::GitHubNotConfigured
            | EnvironmentError::GitHubNotConnected { .. }
            | EnvironmentError::InstallationNotFound { .. } => {
                ApiError::GitHubNotConnected(message)
            }
            EnvironmentError::RepositoryNotSelected { .. } => {
                ApiError::RepositoryNotSelected(message)
            }
            // The contract has one code for a dependency that is not answering.
            EnvironmentError::GitHubUnavailable(_) => ApiError::RuntimeUnavailable(message),
            EnvironmentError::RuntimeUnavailable(_) => ApiError::RuntimeUnavailable(message),
            EnvironmentError::ImageUnavailable(_) => ApiError::ImageUnavailable(message),
            EnvironmentError::Internal(_) => ApiError::Internal(message),
            EnvironmentError::Store(e) => e.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::Internal(format!("the environment store failed: {e}"))
    }
}

/// Carried on 5xx responses so the request log can say what failed, once.
#[derive(Clone, Debug)]
pub struct ServerFault(pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = ErrorBody {
            code: self.code().to_owned(),
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
