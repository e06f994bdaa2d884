//! Handlers for `/v1/environments`: extract, call the domain, render.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::extract::{IdPath, JsonBody};
use futures_util::StreamExt;

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
) -> Result<Response, ApiError> {
    // The first page is read before answering, so a store that fails is an error answer.
    let first = state
        .environments
        .list_page(&principal, None, LIST_PAGE)
        .await?;
    let pages = futures_util::stream::unfold(ListPages::First(first), move |page| {
        let state = state.clone();
        let principal = principal.clone();
        async move { page.next(&state, &principal).await }
    });
    let body = futures_util::stream::once(std::future::ready(Ok::<_, std::io::Error>(
        axum::body::Bytes::from_static(b"{\"environments\":["),
    )))
    .chain(pages)
    .chain(futures_util::stream::once(std::future::ready(Ok(
        axum::body::Bytes::from_static(b"]}"),
    ))));
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}

/// Environments a list reads at a time: its answer holds one page of rows in memory (their
/// outputs are each bounded by `environment.output_limit`), however many the organisation has.
const LIST_PAGE: u32 = 32;

/// Where a list's answer is: at a page in hand, after the id it read last, or done.
enum ListPages {
    First(Vec<crate::store::EnvironmentRecord>),
    After(crate::model::EnvironmentId),
    Done,
}

impl ListPages {
    /// The next piece of the answer (a page of views, comma-separated and led by a comma but for
    /// the first), and where the list is then.
    async fn next(
        self,
        state: &AppState,
        principal: &Principal,
    ) -> Option<(Result<axum::body::Bytes, std::io::Error>, ListPages)> {
        let (records, first) = match self {
            ListPages::Done => return None,
            ListPages::First(records) => (records, true),
            ListPages::After(after) => {
                match state
                    .environments
                    .list_page(principal, Some(&after), LIST_PAGE)
                    .await
                {
                    Ok(records) => (records, false),
                    Err(e) => {
                        // The status is sent: the answer ends short, which no JSON reader takes
                        // for a whole list.
                        tracing::error!(error = %e, "a list failed after its first page");
                        return Some((Err(std::io::Error::other(e.to_string())), ListPages::Done));
                    }
                }
            }
        };
        // An empty page: the list is done.
        let last = records.last().map(|r| r.id.clone())?;
        let mut bytes = Vec::new();
        for (n, record) in records.iter().enumerate() {
            if !(first && n == 0) {
                bytes.push(b',');
            }
            if let Err(e) = serde_json::to_writer(&mut bytes, &EnvironmentView::from(record)) {
                return Some((Err(std::io::Error::other(e)), ListPages::Done));
            }
        }
        let next = match records.len() < LIST_PAGE as usize {
            true => ListPages::Done,
            false => ListPages::After(last),
        };
        Some((Ok(bytes.into()), next))
    }
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
