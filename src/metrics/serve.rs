//! What the metrics listener answers: `GET /metrics` in the text exposition format, no token;
//! nothing else. The API listeners never route here.

use std::path::PathBuf;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::Metrics;
use crate::store::Store;

/// The content type of what prometheus-client writes (OpenMetrics text).
const TEXT_FORMAT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
struct Scrape {
    metrics: Metrics,
    store: Store,
    state_dir: PathBuf,
}

/// The metrics listener's router; the free space is read on `state_dir`'s filesystem.
pub fn router(metrics: Metrics, store: Store, state_dir: PathBuf) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .fallback(|| async { (StatusCode::NOT_FOUND, "only GET /metrics is served here\n") })
        .with_state(Scrape {
            metrics,
            store,
            state_dir,
        })
}

async fn scrape(State(scrape): State<Scrape>) -> Response {
    // The environment gauges are counted from the store when asked, so they are never stale.
    match scrape.store.census().await {
        Ok(census) => scrape.metrics.census(&census),
        Err(e) => {
            tracing::error!(error = %e, "cannot count the environments for the metrics");
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot count the environments\n",
            )
                .into_response();
        }
    }
    match crate::disk::free_bytes(&scrape.state_dir) {
        Ok(free) => scrape.metrics.host_free(free),
        Err(e) => tracing::warn!(error = %e, "cannot read the free space of the state directory"),
    }
    (
        [(header::CONTENT_TYPE, TEXT_FORMAT)],
        scrape.metrics.encode(),
    )
        .into_response()
}
