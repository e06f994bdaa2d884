//! NDJSON answers: one JSON object per line, written as it happens.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::{FutureExt, Stream};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::types::EnvironmentView;
use super::ApiError;
use crate::environments::{CreateStream, Differs, ExecRun};

pub const NDJSON: &str = "application/x-ndjson";

/// Whether the client asked for a stream.
pub fn wants_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|t| t.trim().starts_with(NDJSON)))
}

/// A streamed answer with `status`.
fn ndjson<S>(status: StatusCode, lines: S) -> Response
where
    S: Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
{
    let mut response = (status, Body::from_stream(lines)).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
    response
}

/// A streamed answer of JSON values, one a line.
pub fn ndjson_values<S>(status: StatusCode, values: S) -> Response
where
    S: Stream<Item = Value> + Send + 'static,
{
    use futures_util::StreamExt;
    ndjson(status, values.map(|value| line(&value)))
}

fn line(value: &Value) -> Result<Bytes, Infallible> {
    let mut bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    bytes.push(b'\n');
    Ok(Bytes::from(bytes))
}

/// The last line of a stream that failed after it began.
fn error_line(e: ApiError) -> Value {
    json!({"error": {"code": e.code(), "message": e.to_string()}})
}

/// The most lines a cut stream still sends of what was ready when it was cut.
const DRAINED_AT_CUT: usize = 256;

/// The last bytes of a stream cut at shutdown: `ready` (what was produced already), then the
/// error line that says why it ends.
fn cut_short(ready: Vec<Value>) -> Result<Bytes, Infallible> {
    let mut bytes = Vec::new();
    for value in ready.iter().chain([&error_line(ApiError::ShuttingDown)]) {
        let Ok(chunk) = line(value);
        bytes.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(bytes))
}

/// A create's progress events until it ends, then `{"environment": …}` (or `{"error": …}`);
/// `201` when it is making the environment, `200` when it joined or found one.
/// When `cut` is cancelled (the shutdown timeout), it ends with an error line instead; so it
/// does when its reader fell further behind than the host keeps for it (the create of `id`
/// goes on).
pub fn create_progress(id: String, run: CreateStream, cut: CancellationToken) -> Response {
    let differs = run.differs();
    let status = if run.is_new() {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let value = |progress| serde_json::to_value(&progress).unwrap_or_default();
    let lines = futures_util::stream::unfold(Some((run, cut)), move |state| {
        let id = id.clone();
        async move {
            let (mut run, cut) = state?;
            let next = tokio::select! {
                biased;
                next = run.next() => next,
                () = cut.cancelled() => {
                    let ready = std::iter::from_fn(|| run.next().now_or_never().flatten())
                        .take(DRAINED_AT_CUT)
                        .map(value)
                        .collect();
                    return Some((cut_short(ready), None));
                }
            };
            if let Some(progress) = next {
                return Some((line(&value(progress)), Some((run, cut))));
            }
            if let Some(missed) = run.fell_behind() {
                return Some((
                    line(&error_line(ApiError::StreamFellBehind { id, missed })),
                    None,
                ));
            }
            let last = match run.outcome().await {
                Ok(created) => json!({"environment": EnvironmentView::from(created.record())}),
                Err(e) => error_line(e.into()),
            };
            Some((line(&last), None))
        }
    });
    let mut response = ndjson(status, lines);
    say_differs(&mut response, differs);
    response
}

/// The header that names where a repeat's request differs from the environment it found.
pub const CREATE_DIFFERS: &str = "narya-create-differs";

/// Adds [`CREATE_DIFFERS`] to a create's answer when the request differs from what it found.
pub fn say_differs(response: &mut Response, differs: Differs) {
    let value = match (differs.setup, differs.repository) {
        (true, true) => "setup, repository",
        (true, false) => "setup",
        (false, true) => "repository",
        (false, false) => return,
    };
    response
        .headers_mut()
        .insert(CREATE_DIFFERS, HeaderValue::from_static(value));
}

/// An exec's output chunks as they come, then `{"exit_code", "timed_out", "duration_ms"}`.
/// When `cut` is cancelled (the shutdown timeout), it ends with an error line instead, and the
/// command, nobody reading it any more, is killed.
pub fn exec_output(run: ExecRun, cut: CancellationToken) -> Response {
    let lines = futures_util::stream::unfold(Some((run, cut)), |state| async move {
        let (mut run, cut) = state?;
        let next = tokio::select! {
            biased;
            next = run.next_output() => next,
            () = cut.cancelled() => {
                let ready = std::iter::from_fn(|| run.next_output().now_or_never().flatten())
                    .take(DRAINED_AT_CUT)
                    .map(|output| json!({ "output": output }))
                    .collect();
                return Some((cut_short(ready), None));
            }
        };
        if let Some(output) = next {
            return Some((line(&json!({ "output": output })), Some((run, cut))));
        }
        let last = match run.outcome().await {
            Ok(outcome) => json!({
                "exit_code": outcome.exit_code,
                "timed_out": outcome.timed_out,
                "duration_ms": millis(outcome.duration),
            }),
            Err(e) => error_line(e.into()),
        };
        Some((line(&last), None))
    });
    ndjson(StatusCode::OK, lines)
}

/// A duration as the contract's `duration_ms`.
pub fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
