//! Handlers for `/v1/organisation`: extract, call the domain, render.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use super::extract::JsonBody;
use super::types::{ConnectGitHubBody, GitHubView};
use super::{ApiError, AppState, ErrorBody};
use crate::auth::Principal;

/// Connect the organisation's GitHub App installation, once the person's OAuth code proves
/// they can access it.
#[utoipa::path(put, path = "/v1/organisation/github", tag = "organisation",
    request_body = ConnectGitHubBody,
    responses(
        (status = 204, description = "Connected: repository-carrying creates of this organisation clone through this installation"),
        (status = 400, description = "NRY-0020", body = ErrorBody),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 403, description = "NRY-0052: the code is not valid, or its person cannot access the installation or does not administer its account (an active owner of the organisation, or the user whose account it is); NRY-0050: this host has no GitHub App configured", body = ErrorBody),
        (status = 409, description = "NRY-0053: the installation is connected to another organisation", body = ErrorBody),
        (status = 429, description = "NRY-0070: the organisation's failed requests spent its share of calls to GitHub; the message says when to retry", body = ErrorBody),
        (status = 503, description = "NRY-0060: GitHub is not answering, or limits this host's calls (the message says when to retry); nothing was changed", body = ErrorBody),
    ))]
pub async fn connect_github(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody<ConnectGitHubBody>,
) -> Result<StatusCode, ApiError> {
    state
        .organisations
        .connect_github(&principal, body.installation_id, &body.code)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The organisation's connected GitHub App installation and its account.
#[utoipa::path(get, path = "/v1/organisation/github", tag = "organisation",
    responses(
        (status = 200, description = "The connected installation", body = GitHubView),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 403, description = "NRY-0050: this host has no GitHub App configured", body = ErrorBody),
        (status = 404, description = "NRY-0030: no installation is connected", body = ErrorBody),
    ))]
pub async fn github(
    State(state): State<AppState>,
    principal: Principal,
) -> Result<Json<GitHubView>, ApiError> {
    let connected = state.organisations.github_connection(&principal).await?;
    Ok(Json(GitHubView {
        installation_id: connected.installation_id,
        account: connected.account,
    }))
}

/// Disconnect the organisation's GitHub App installation: its repository-carrying creates are
/// refused from then on.
#[utoipa::path(delete, path = "/v1/organisation/github", tag = "organisation",
    responses(
        (status = 204, description = "Disconnected (or none was connected)"),
        (status = 401, description = "NRY-0011", body = ErrorBody),
    ))]
pub async fn disconnect_github(
    State(state): State<AppState>,
    principal: Principal,
) -> Result<StatusCode, ApiError> {
    state.organisations.disconnect_github(&principal).await?;
    Ok(StatusCode::NO_CONTENT)
}
