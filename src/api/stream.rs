//! NDJSON answers: one JSON object per line, written as it happens.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

use super::types::EnvironmentView;
use super::ApiError;
use crate::environments::{Created, EnvironmentError, Progress, Utf8Chunks};

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
pub fn ndjson<S>(status: StatusCode, lines: S) -> Response
where
    S: Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
{
    let mut response = (status, Body::from_stream(lines)).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
    response
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

/// A create's progress events until it ends, then `{"environment": …}` (or `{"error": …}`).
pub fn create_progress(
    events: broadcast::Receiver<Progress>,
    task: JoinHandle<Result<Created, EnvironmentError>>,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    futures_util::stream::unfold(Some((Some(events), task)), |state| async move {
        let (events, task) = state?;
        if let Some(mut events) = events {
            loop {
                match events.recv().await {
                    Ok(progress) => {
                        let value = serde_json::to_value(&progress).unwrap_or_default();
                        return Some((line(&value), Some((Some(events), task))));
                    }
                    // A reader that fell behind misses some output; the final environment
                    // still carries the tail.
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => break,
                }
            }
        }
        let last = match task.await {
            Ok(Ok(Created::New(record) | Created::Existing(record))) => {
                json!({"environment": EnvironmentView::from(&record)})
            }
            Ok(Err(e)) => error_line(e.into()),
            Err(e) => error_line(ApiError::Internal(format!("the create task failed: {e}"))),
        };
        Some((line(&last), None))
    })
}

/// An exec's output chunks as they come, then `{"exit_code", "timed_out", "duration_ms"}`.
pub fn exec_output(
    chunks: mpsc::Receiver<Vec<u8>>,
    task: JoinHandle<Result<narya_runtimes::ProcessOutcome, EnvironmentError>>,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let state = (Some(chunks), Utf8Chunks::default(), Some(task));
    futures_util::stream::unfold(state, |(chunks, mut text, task)| async move {
        let task = task?;
        if let Some(mut chunks) = chunks {
            while let Some(chunk) = chunks.recv().await {
                let output = text.push(&chunk);
                if !output.is_empty() {
                    return Some((
                        line(&json!({"output": output})),
                        (Some(chunks), text, Some(task)),
                    ));
                }
            }
            let rest = text.finish();
            if !rest.is_empty() {
                return Some((line(&json!({"output": rest})), (None, text, Some(task))));
            }
        }
        let last = match task.await {
            Ok(Ok(outcome)) => json!({
                "exit_code": outcome.exit_code,
                "timed_out": outcome.timed_out,
                "duration_ms": u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX),
            }),
            Ok(Err(e)) => error_line(e.into()),
            Err(e) => error_line(ApiError::Internal(format!("the exec task failed: {e}"))),
        };
        Some((line(&last), (None, text, None)))
    })
}
