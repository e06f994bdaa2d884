//! Handlers for `/v1/environments` and `/v1/organisation`: extract, call the domain, map.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use super::extract::{IdPath, JsonBody};
use super::types::{
    ConnectGitHubBody, CreateBody, EnvironmentList, EnvironmentView, ExecBody, ExecResult,
};
use super::{ApiError, AppState, ErrorBody};
use crate::auth::Principal;
use crate::config::parse_duration;
use crate::environments::{CreateRequest, Created};

/// The answer of operations whose runtime back end this daemon does not have yet.
fn no_backend(what: &str) -> ApiError {
    ApiError::RuntimeUnavailable(format!(
        "{what} needs a container runtime back end, and this build of naryad has none yet; nothing was changed"
    ))
}

/// Provision an environment (idempotent on its identifier).
#[utoipa::path(post, path = "/v1/environments", tag = "environments",
    request_body = CreateBody,
    responses(
        (status = 201, description = "Provisioned now", body = EnvironmentView),
        (status = 200, description = "It already existed; nothing was provisioned and no setup ran", body = EnvironmentView),
        (status = 400, description = "NRY-0020..0023: the body breaks a rule", body = ErrorBody),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 403, description = "NRY-0050/0051: GitHub installation missing or repository not selected", body = ErrorBody),
        (status = 409, description = "NRY-0040/0041", body = ErrorBody),
        (status = 503, description = "NRY-0060/0061", body = ErrorBody),
    ))]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody<CreateBody>,
) -> Result<(StatusCode, Json<EnvironmentView>), ApiError> {
    let request = CreateRequest::validate(&body.id, body.setup, body.repository.as_deref())?;
    Ok(match state.environments.create(principal, request).await? {
        Created::New(record) => (StatusCode::CREATED, Json(EnvironmentView::from(&record))),
        Created::Existing(record) => (StatusCode::OK, Json(EnvironmentView::from(&record))),
    })
}

/// One environment of the caller's organisation.
#[utoipa::path(get, path = "/v1/environments/{id}", tag = "environments",
    params(("id" = String, Path, description = "The environment's identifier")),
    responses(
        (status = 200, body = EnvironmentView),
        (status = 400, description = "NRY-0021", body = ErrorBody),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 404, description = "NRY-0030", body = ErrorBody),
    ))]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    IdPath(id): IdPath,
) -> Result<Json<EnvironmentView>, ApiError> {
    let record = state
        .store
        .get(&principal.organisation, id.as_str())
        .await?
        .ok_or_else(|| ApiError::NotFound(id.to_string()))?;
    Ok(Json(EnvironmentView::from(&record)))
}

/// Every environment of the caller's organisation, by id.
#[utoipa::path(get, path = "/v1/environments", tag = "environments",
    responses(
        (status = 200, body = EnvironmentList),
        (status = 401, description = "NRY-0011", body = ErrorBody),
    ))]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
) -> Result<Json<EnvironmentList>, ApiError> {
    let records = state.store.list(&principal.organisation).await?;
    Ok(Json(EnvironmentList {
        environments: records.iter().map(EnvironmentView::from).collect(),
    }))
}

/// Destroy an environment's machine and workspace and free its identifier.
#[utoipa::path(delete, path = "/v1/environments/{id}", tag = "environments",
    params(("id" = String, Path, description = "The environment's identifier")),
    responses(
        (status = 204, description = "Machine and workspace destroyed"),
        (status = 400, description = "NRY-0021", body = ErrorBody),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 404, description = "NRY-0030", body = ErrorBody),
        (status = 503, description = "NRY-0060", body = ErrorBody),
    ))]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    IdPath(id): IdPath,
) -> Result<StatusCode, ApiError> {
    state.environments.delete(principal, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Run a command in a ready environment.
#[utoipa::path(post, path = "/v1/environments/{id}/exec", tag = "environments",
    params(("id" = String, Path, description = "The environment's identifier")),
    request_body = ExecBody,
    responses(
        (status = 200, description = "JSON result, or an NDJSON stream with Accept: application/x-ndjson", body = ExecResult),
        (status = 400, description = "NRY-0020/0021", body = ErrorBody),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 404, description = "NRY-0030", body = ErrorBody),
        (status = 409, description = "NRY-0042: not ready", body = ErrorBody),
        (status = 503, description = "NRY-0060", body = ErrorBody),
    ))]
pub async fn exec(
    State(state): State<AppState>,
    principal: Principal,
    IdPath(id): IdPath,
    JsonBody(body): JsonBody<ExecBody>,
) -> Result<Json<ExecResult>, ApiError> {
    if body.argv.is_empty() {
        return Err(ApiError::BadBody(
            "argv must name a command: give a non-empty array of strings".to_owned(),
        ));
    }
    if let Some(timeout) = &body.timeout {
        let timeout =
            parse_duration(timeout).map_err(|e| ApiError::BadBody(format!("timeout: {e}")))?;
        let limit = state.config.environment.exec_timeout.0;
        if timeout > limit {
            return Err(ApiError::BadBody(format!(
                "timeout {} exceeds this host's limit of {}",
                humantime::format_duration(timeout),
                humantime::format_duration(limit)
            )));
        }
    }
    state
        .store
        .get(&principal.organisation, id.as_str())
        .await?
        .ok_or_else(|| ApiError::NotFound(id.to_string()))?;
    Err(no_backend("running a command"))
}

/// Re-provision a `gone` environment from its pinned digest.
#[utoipa::path(post, path = "/v1/environments/{id}/replace", tag = "environments",
    params(("id" = String, Path, description = "The environment's identifier")),
    responses(
        (status = 200, body = EnvironmentView),
        (status = 400, description = "NRY-0021", body = ErrorBody),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 404, description = "NRY-0030", body = ErrorBody),
        (status = 409, description = "NRY-0042: the environment is not gone", body = ErrorBody),
        (status = 503, description = "NRY-0060/0061", body = ErrorBody),
    ))]
pub async fn replace(
    State(state): State<AppState>,
    principal: Principal,
    IdPath(id): IdPath,
) -> Result<Json<EnvironmentView>, ApiError> {
    state
        .store
        .get(&principal.organisation, id.as_str())
        .await?
        .ok_or_else(|| ApiError::NotFound(id.to_string()))?;
    Err(no_backend("replacing an environment"))
}

/// Connect the organisation's GitHub App installation.
#[utoipa::path(put, path = "/v1/organisation/github", tag = "organisation",
    request_body = ConnectGitHubBody,
    responses(
        (status = 204, description = "Connected"),
        (status = 400, description = "NRY-0020", body = ErrorBody),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 503, description = "NRY-0060", body = ErrorBody),
    ))]
pub async fn connect_github(
    State(_state): State<AppState>,
    _principal: Principal,
    JsonBody(_body): JsonBody<ConnectGitHubBody>,
) -> Result<StatusCode, ApiError> {
    Err(ApiError::RuntimeUnavailable(
        "connecting a GitHub installation needs the GitHub App client, which this build of naryad does not have yet; nothing was changed".to_owned(),
    ))
}
