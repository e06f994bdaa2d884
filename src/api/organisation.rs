//! Handlers for `/v1/organisation`: extract, call the domain, render.

use axum::extract::State;
use axum::http::StatusCode;

use super::extract::JsonBody;
use super::types::ConnectGitHubBody;
use super::{ApiError, AppState, ErrorBody};
use crate::auth::Principal;

/// Connect the organisation's GitHub App installation, once GitHub says it exists.
#[utoipa::path(put, path = "/v1/organisation/github", tag = "organisation",
    request_body = ConnectGitHubBody,
    responses(
        (status = 204, description = "Connected: repository-carrying creates of this organisation clone through this installation"),
        (status = 400, description = "NRY-0020", body = ErrorBody),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 403, description = "NRY-0050: GitHub knows no such installation of the App, or this host has no GitHub App configured", body = ErrorBody),
        (status = 503, description = "NRY-0060: GitHub is not answering; nothing was changed", body = ErrorBody),
    ))]
pub async fn connect_github(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody<ConnectGitHubBody>,
) -> Result<StatusCode, ApiError> {
    state
        .organisations
        .connect_github(&principal, body.installation_id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
