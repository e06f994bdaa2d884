//! `GET /v1/events`: the caller's organisation's status changes as NDJSON, from the moment of
//! the request, with a heartbeat while nothing happens; ends when the daemon stops.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use futures_util::Stream;
use serde_json::{json, Value};
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use super::stream::ndjson_values;
use super::types::{EventLine, StatusView};
use super::{ApiError, AppState, ErrorBody};
use crate::auth::Principal;
use crate::events::{Received, Subscription};
use crate::model::now_rfc3339;

/// How often a quiet stream says it is still there.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// The caller's organisation's status changes as they happen.
#[utoipa::path(get, path = "/v1/events", tag = "environments",
    description = "An NDJSON stream (`application/x-ndjson`) of the status changes of the caller's organisation's environments, from the moment of the request: one `EventLine` a line. While nothing changes, a `{\"heartbeat\": \"<RFC 3339>\"}` line comes every 15 s. A reader that falls more than 256 changes behind misses the oldest and is told `{\"lagged\": N}` (how many it missed) before the next change. The stream ends when the daemon stops.",
    responses(
        (status = 200, description = "NDJSON lines: an `EventLine`, `{\"heartbeat\": at}` or `{\"lagged\": N}`", body = EventLine, content_type = "application/x-ndjson"),
        (status = 401, description = "NRY-0011", body = ErrorBody),
        (status = 429, description = "NRY-0070: the organisation holds `[organisation] max_event_streams` open streams", body = ErrorBody),
    ))]
pub async fn events(
    State(state): State<AppState>,
    principal: Principal,
) -> Result<Response, ApiError> {
    let max = state.config.organisation.max_event_streams;
    let subscription = state
        .environments
        .events()
        .subscribe_within(&principal.organisation, max)
        .ok_or(ApiError::TooManyStreams { max })?;
    tracing::debug!("watching status changes");
    Ok(ndjson_values(
        StatusCode::OK,
        lines(subscription, HEARTBEAT),
    ))
}

/// The lines of one subscription: its changes, what it missed, and a heartbeat every
/// `heartbeat` whatever else was sent.
pub fn lines(subscription: Subscription, heartbeat: Duration) -> impl Stream<Item = Value> {
    let mut ticks = interval_at(Instant::now() + heartbeat, heartbeat);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    futures_util::stream::unfold(
        (subscription, ticks),
        |(mut subscription, mut ticks)| async move {
            let line = tokio::select! {
                received = subscription.next() => match received? {
                    Received::Event(event) => serde_json::to_value(EventLine {
                        id: event.id.to_string(),
                        status: StatusView::from(event.status),
                        status_detail: event.status_detail.clone(),
                        at: event.at.clone(),
                    })
                    .unwrap_or_default(),
                    Received::Lagged(missed) => json!({ "lagged": missed }),
                },
                _ = ticks.tick() => json!({ "heartbeat": now_rfc3339() }),
            };
            Some((line, (subscription, ticks)))
        },
    )
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;
    use crate::events::{Events, StatusEvent};
    use crate::model::Status;

    fn change(id: &str) -> StatusEvent {
        StatusEvent {
            id: id.parse().unwrap(),
            status: Status::Degraded,
            status_detail: Some("restarting".to_owned()),
            at: "2026-01-01T00:00:00Z".to_owned(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_beats_every_interval_and_changes_come_as_lines() {
        let events = Events::default();
        let mut lines = Box::pin(lines(events.subscribe("acme"), HEARTBEAT));
        let started = Instant::now();
        let first = lines.next().await.unwrap();
        assert!(first["heartbeat"].is_string(), "{first}");
        assert_eq!(started.elapsed(), HEARTBEAT);
        events.publish("acme", change("demo"));
        assert_eq!(
            lines.next().await.unwrap(),
            json!({"id": "demo", "status": "degraded", "status_detail": "restarting", "at": "2026-01-01T00:00:00Z"})
        );
        assert!(lines.next().await.unwrap()["heartbeat"].is_string());
        assert_eq!(started.elapsed(), HEARTBEAT * 2);
        events.close();
        assert!(lines.next().await.is_none(), "the stream ends on close");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_is_told_what_it_missed() {
        let events = Events::default();
        let mut lines = Box::pin(lines(events.subscribe("acme"), HEARTBEAT));
        for n in 0..crate::events::BACKLOG + 3 {
            events.publish("acme", change(&format!("e{n}")));
        }
        assert_eq!(lines.next().await.unwrap(), json!({"lagged": 3}));
        assert_eq!(lines.next().await.unwrap()["id"], "e3");
    }
}
