//! Handlers for `/v1/environments` and `/v1/organisation`: extract, call the domain, map.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::extract::{IdPath, JsonBody};
use super::types::{
    ConnectGitHubBody, CreateBody, EnvironmentList, EnvironmentView, ExecBody, ExecResult,
};
use super::{stream, ApiError, AppState, ErrorBody};
use crate::auth::Principal;
use crate::config::parse_duration;
use crate::environments::{CreateRequest, Created, ExecRequest};

/// Provision an environment (idempotent on its identifier).
#[utoipa::path(post, path = "/v1/environments", tag = "environments",
    request_body = CreateBody,
    responses(
        (status = 201, description = "Provisioned now. With Accept: application/x-ndjson: step events, clone/setup output chunks, then {\"environment\": …}", body = EnvironmentView),
        (status = 200, description = "It already existed; nothing was provisioned and no setup ran (streamed: a repeat joining a create in flight sees its events from then on)", body = EnvironmentView),
        (status = 400, description = "NRY-0020..0023: the body breaks a rule", body = ErrorBody),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 403, description = "NRY-0050/0051: GitHub installation missing or repository not selected", body = ErrorBody),
        (status = 409, description = "NRY-0040/0041", body = ErrorBody),
        (status = 503, description = "NRY-0060/0061", body = ErrorBody),
    ))]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CreateBody>,
) -> Result<Response, ApiError> {
    let request = CreateRequest::validate(&body.id, body.setup, body.repository.as_deref())?;
    if !stream::wants_ndjson(&headers) {
        return Ok(match state.environments.create(principal, request).await? {
            Created::New(record) => {
                (StatusCode::CREATED, Json(EnvironmentView::from(&record))).into_response()
            }
            Created::Existing(record) => {
                (StatusCode::OK, Json(EnvironmentView::from(&record))).into_response()
            }
        });
    }
    // A repeat of a create still provisioning streams its progress from here on.
    if let Some(events) = state
        .environments
        .join_in_flight(&principal, &request)
        .await?
    {
        let task = state.environments.start_create(principal, request, None);
        return Ok(stream::ndjson(
            StatusCode::OK,
            stream::create_progress(events, task),
        ));
    }
    let (announce, announced) = tokio::sync::oneshot::channel();
    let task = state
        .environments
        .start_create(principal, request, Some(announce));
    match announced.await {
        Ok(events) => Ok(stream::ndjson(
            StatusCode::CREATED,
            stream::create_progress(events, task),
        )),
        // Provisioning never started: the create's answer is known now, and errors are plain.
        Err(_) => {
            let created = task
                .await
                .map_err(|e| ApiError::Internal(format!("the create task failed: {e}")))??;
            let (status, record) = match created {
                Created::New(record) => (StatusCode::CREATED, record),
                Created::Existing(record) => (StatusCode::OK, record),
            };
            let line = serde_json::json!({"environment": EnvironmentView::from(&record)});
            let bytes = format!("{line}\n");
            Ok(stream::ndjson(
                status,
                futures_util::stream::iter([Ok(axum::body::Bytes::from(bytes))]),
            ))
        }
    }
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
    headers: HeaderMap,
    JsonBody(body): JsonBody<ExecBody>,
) -> Result<Response, ApiError> {
    let request = exec_request(&state, body)?;
    state.environments.check_ready(&principal, &id).await?;
    let (chunks, mut chunks_rx) = tokio::sync::mpsc::channel(64);
    // The command runs in a task of its own that ends when it does; this request holds the
    // receiving end of its output, so a client that goes away takes the command with it.
    let task = tokio::spawn(
        state
            .environments
            .clone()
            .exec(principal, id, request, chunks),
    );
    if stream::wants_ndjson(&headers) {
        return Ok(stream::ndjson(
            StatusCode::OK,
            stream::exec_output(chunks_rx, task),
        ));
    }
    while chunks_rx.recv().await.is_some() {}
    let outcome = task
        .await
        .map_err(|e| ApiError::Internal(format!("the exec task failed: {e}")))??;
    Ok(Json(ExecResult {
        exit_code: outcome.exit_code.map(i64::from),
        timed_out: outcome.timed_out,
        output: String::from_utf8_lossy(&outcome.output).into_owned(),
        output_truncated: outcome.output_truncated,
        duration_ms: u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX),
    })
    .into_response())
}

/// Checks an exec body against the contract and this host's limits.
fn exec_request(state: &AppState, body: ExecBody) -> Result<ExecRequest, ApiError> {
    if body.argv.is_empty() || body.argv[0].is_empty() {
        return Err(ApiError::BadBody(
            "argv must name a command: give a non-empty array of strings".to_owned(),
        ));
    }
    let limit = state.config.environment.exec_timeout.0;
    let timeout = match &body.timeout {
        None => limit,
        Some(text) => {
            let timeout =
                parse_duration(text).map_err(|e| ApiError::BadBody(format!("timeout: {e}")))?;
            if timeout > limit || timeout.is_zero() {
                return Err(ApiError::BadBody(format!(
                    "timeout {text:?} must be more than zero and at most this host's limit of {}",
                    humantime::format_duration(limit)
                )));
            }
            timeout
        }
    };
    if let Some(bad) = body
        .env
        .keys()
        .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
    {
        return Err(ApiError::BadBody(format!(
            "env key {bad:?} is not a variable name: no \"=\", no NUL, not empty"
        )));
    }
    if let Some(cwd) = body.cwd.as_deref().filter(|c| !c.starts_with('/')) {
        return Err(ApiError::BadBody(format!(
            "cwd {cwd:?} must be an absolute path inside the environment"
        )));
    }
    Ok(ExecRequest {
        argv: body.argv,
        env: body.env,
        cwd: body.cwd,
        timeout,
        stdin: body.stdin.map(String::into_bytes),
    })
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
        .environments
        .connect_github(&principal, body.installation_id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
