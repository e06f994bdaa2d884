//! Handlers for `/v1/environments`: extract, call the domain, render.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::extract::{IdPath, JsonBody};
use super::types::{CreateBody, EnvironmentList, EnvironmentView, ExecBody, ExecResult};
use super::{stream, ApiError, AppState, ErrorBody};
use crate::auth::Principal;
use crate::environments::{CreateRequest, ExecRequest};

/// Provision an environment (idempotent on its identifier).
#[utoipa::path(post, path = "/v1/environments", tag = "environments",
    request_body = CreateBody,
    responses(
        (status = 201, description = "Provisioned now. With Accept: application/x-ndjson: step events, clone/setup output chunks, then {\"environment\": …}; a stream the host cuts short (it is shutting down, or the reader fell more than 64 lines behind) ends with {\"error\": {\"code\": \"NRY-0099\", …}} instead", body = EnvironmentView),
        (status = 200, description = "It already existed; nothing was provisioned and no setup ran, whatever this request's setup or repository (streamed: a repeat joining a create in flight sees its events from then on, and answers its outcome)", body = EnvironmentView,
            headers(("Narya-Create-Differs" = String, description = "Present when this request's setup or repository differ from the existing environment's: `setup`, `repository` or `setup, repository`. Nothing of the request was applied."))),
        (status = 400, description = "NRY-0020..0023: the body breaks a rule", body = ErrorBody),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 403, description = "NRY-0050/0051: GitHub installation missing or repository not selected", body = ErrorBody),
        (status = 409, description = "NRY-0040: the identifier is held by another organisation; NRY-0041: a setup-carrying create met a machine whose setup state was never recorded (`setup.state` `interrupted`)", body = ErrorBody),
        (status = 429, description = "NRY-0070: the organisation holds `[organisation] max_environments` environments, or its refused repository creates spent its share of calls to GitHub (the message says which, and when to retry)", body = ErrorBody),
        (status = 503, description = "NRY-0060/0061; NRY-0062: the host is short of disk (`[host] reserve_disk`)", body = ErrorBody),
    ))]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CreateBody>,
) -> Result<Response, ApiError> {
    let request = CreateRequest::validate(&body.id, body.setup, body.repository.as_deref())?;
    if stream::wants_ndjson(&headers) {
        let id = request.id.to_string();
        let run = state
            .environments
            .create_streamed(principal, request)
            .await?;
        return Ok(stream::create_progress(id, run, state.cut.clone()));
    }
    let created = state.environments.create(principal, request).await?;
    let status = if created.is_new() {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut response = (status, Json(EnvironmentView::from(created.record()))).into_response();
    stream::say_differs(&mut response, created.differs());
    Ok(response)
}

/// One environment of the caller's organisation.
#[utoipa::path(get, path = "/v1/environments/{id}", tag = "environments",
    params(("id" = String, Path, description = "The environment's identifier")),
    responses(
        (status = 200, description = "The environment; a deleted one answers `gone` with `status_detail` `deleted` for `environment.gone_retention`", body = EnvironmentView),
        (status = 400, description = "NRY-0021", body = ErrorBody),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 404, description = "NRY-0030", body = ErrorBody),
    ))]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    IdPath(id): IdPath,
) -> Result<Json<EnvironmentView>, ApiError> {
    let record = state.environments.get(&principal, &id).await?;
    Ok(Json(EnvironmentView::from(&record)))
}

/// Every environment of the caller's organisation, by id.
#[utoipa::path(get, path = "/v1/environments", tag = "environments",
    responses(
        (status = 200, description = "By id; deleted ones (`gone`, `deleted`) included until their retention passes", body = EnvironmentList),
        (status = 401, description = "NRY-0011", body = ErrorBody),
    ))]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
) -> Result<Json<EnvironmentList>, ApiError> {
    let records = state.environments.list(&principal).await?;
    Ok(Json(EnvironmentList {
        environments: records.iter().map(EnvironmentView::from).collect(),
    }))
}

/// Destroy an environment's machine and workspace; its record answers `gone` for a while.
#[utoipa::path(delete, path = "/v1/environments/{id}", tag = "environments",
    params(("id" = String, Path, description = "The environment's identifier")),
    responses(
        (status = 204, description = "Machine and workspace destroyed; the record stays `gone` (`status_detail` `deleted`) for `environment.gone_retention`, and a later create of the identifier provisions afresh. Deleting a deleted environment is 204 too."),
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
        (status = 200, description = "JSON result, or an NDJSON stream with Accept: application/x-ndjson (a stream the host cuts short, because it is shutting down, ends with {\"error\": {\"code\": \"NRY-0099\", …}} and the command is killed)", body = ExecResult),
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
    headers: HeaderMap,
    JsonBody(body): JsonBody<ExecBody>,
) -> Result<Response, ApiError> {
    let request = ExecRequest::validate(
        body.argv,
        body.env,
        body.cwd,
        body.timeout.as_deref(),
        body.stdin,
        state.config.environment.exec_timeout.0,
    )?;
    let run = state.environments.exec(&principal, id, request).await?;
    if stream::wants_ndjson(&headers) {
        return Ok(stream::exec_output(run, state.cut.clone()));
    }
    let outcome = run.outcome().await?;
    Ok(Json(ExecResult {
        exit_code: outcome.exit_code.map(i64::from),
        timed_out: outcome.timed_out,
        output: String::from_utf8_lossy(&outcome.output).into_owned(),
        output_truncated: outcome.output_truncated,
        duration_ms: stream::millis(outcome.duration),
    })
    .into_response())
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
    let record = state.environments.replace(principal, id).await?;
    Ok(Json(EnvironmentView::from(&record)))
}
