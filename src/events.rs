//! Status changes as they happen, for `GET /v1/events`. The store publishes every status it
//! writes (the one place statuses are written); each subscriber sees its own organisation's
//! only, from the moment it subscribed, through a bounded backlog of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::broadcast;

use crate::model::{EnvironmentId, Status};

/// How many status changes a subscriber may fall behind before it misses the oldest ones (and
/// is told how many).
pub const BACKLOG: usize = 256;

/// One environment's status as it was just written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusEvent {
    pub id: EnvironmentId,
    pub status: Status,
    pub status_detail: Option<String>,
    /// When it was written (RFC 3339), as the record's `updated_at`.
    pub at: String,
}

/// The publishers' and subscribers' meeting point; clones share it.
#[derive(Clone, Default)]
pub struct Events {
    hub: Arc<Mutex<Hub>>,
}

#[derive(Default)]
struct Hub {
    /// Set at shutdown: every stream ends, and new subscriptions end at once.
    closed: bool,
    /// One channel per organisation somebody is watching.
    organisations: HashMap<String, broadcast::Sender<Arc<StatusEvent>>>,
}

/// What a subscriber receives next.
#[derive(Debug)]
pub enum Received {
    Event(Arc<StatusEvent>),
    /// The subscriber fell this many changes behind the backlog; they are lost to it.
    Lagged(u64),
}

/// One subscriber's view of its organisation's status changes.
pub struct Subscription {
    receiver: broadcast::Receiver<Arc<StatusEvent>>,
}

impl Events {
    fn hub(&self) -> std::sync::MutexGuard<'_, Hub> {
        self.hub.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells `organisation`'s subscribers, if it has any, of `event`.
    pub fn publish(&self, organisation: &str, event: StatusEvent) {
        let mut hub = self.hub();
        let Some(sender) = hub.organisations.get(organisation) else {
            return;
        };
        if sender.send(Arc::new(event)).is_err() {
            // Its last subscriber went.
            hub.organisations.remove(organisation);
        }
    }

    /// `organisation`'s status changes from now on; after [`Events::close`], none.
    pub fn subscribe(&self, organisation: &str) -> Subscription {
        // No organisation holds usize::MAX subscriptions: never refused.
        self.subscribe_within(organisation, usize::MAX)
            .unwrap_or_else(closed)
    }

    /// As [`Events::subscribe`], unless `organisation` already holds `max` open subscriptions:
    /// then `None`.
    pub fn subscribe_within(&self, organisation: &str, max: usize) -> Option<Subscription> {
        let mut hub = self.hub();
        if hub.closed {
            return Some(closed());
        }
        hub.organisations.retain(|_, s| s.receiver_count() > 0);
        let sender = hub
            .organisations
            .entry(organisation.to_owned())
            .or_insert_with(|| broadcast::channel(BACKLOG).0);
        // Each open subscription is one receiver of its organisation's channel.
        if sender.receiver_count() >= max {
            return None;
        }
        Some(Subscription {
            receiver: sender.subscribe(),
        })
    }

    /// Ends every subscription once it has read what it was sent; later ones end at once.
    pub fn close(&self) {
        let mut hub = self.hub();
        hub.closed = true;
        hub.organisations.clear();
    }
}

/// A subscription that has ended already.
fn closed() -> Subscription {
    let (_, receiver) = broadcast::channel(1);
    Subscription { receiver }
}

impl Subscription {
    /// The next change, or how many were missed; `None` once the events are closed.
    pub async fn next(&mut self) -> Option<Received> {
        match self.receiver.recv().await {
            Ok(event) => Some(Received::Event(event)),
            Err(broadcast::error::RecvError::Lagged(missed)) => Some(Received::Lagged(missed)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_organisation_holds_at_most_its_share_of_subscriptions() {
        let events = Events::default();
        let first = events.subscribe_within("acme", 2).unwrap();
        let second = events.subscribe_within("acme", 2).unwrap();
        assert!(events.subscribe_within("acme", 2).is_none());
        assert!(
            events.subscribe_within("globex", 2).is_some(),
            "another organisation's share is its own"
        );
        drop(first);
        let third = events.subscribe_within("acme", 2);
        assert!(third.is_some(), "a closed stream frees its place");
        drop((second, third));
    }

    fn event(id: &str, status: Status) -> StatusEvent {
        StatusEvent {
            id: id.parse().unwrap(),
            status,
            status_detail: None,
            at: "2026-01-01T00:00:00Z".to_owned(),
        }
    }

    fn id_of(received: Option<Received>) -> String {
        match received {
            Some(Received::Event(e)) => e.id.to_string(),
            other => panic!("not an event: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_subscriber_sees_its_organisations_changes_from_the_moment_it_subscribed() {
        let events = Events::default();
        events.publish("acme", event("before", Status::Ready));
        let mut acme = events.subscribe("acme");
        let mut globex = events.subscribe("globex");
        events.publish("globex", event("theirs", Status::Degraded));
        events.publish("acme", event("mine", Status::Ready));
        assert_eq!(id_of(acme.next().await), "mine");
        assert_eq!(id_of(globex.next().await), "theirs");
        events.close();
        assert!(acme.next().await.is_none());
        assert!(globex.next().await.is_none());
        assert!(events.subscribe("acme").next().await.is_none());
    }

    #[tokio::test]
    async fn a_slow_subscriber_is_told_how_many_it_missed_then_reads_on() {
        let events = Events::default();
        let mut slow = events.subscribe("acme");
        let extra = 5;
        for n in 0..BACKLOG + extra {
            events.publish("acme", event(&format!("e{n}"), Status::Ready));
        }
        match slow.next().await {
            Some(Received::Lagged(missed)) => assert_eq!(missed, extra as u64),
            other => panic!("not told of the lag: {other:?}"),
        }
        assert_eq!(id_of(slow.next().await), format!("e{extra}"));
    }

    #[tokio::test]
    async fn another_organisations_burst_never_makes_a_subscriber_lag() {
        let events = Events::default();
        let mut acme = events.subscribe("acme");
        let _globex = events.subscribe("globex");
        for n in 0..BACKLOG * 2 {
            events.publish("globex", event(&format!("e{n}"), Status::Ready));
        }
        events.publish("acme", event("mine", Status::Ready));
        assert_eq!(id_of(acme.next().await), "mine");
    }

    #[test]
    fn an_organisation_nobody_watches_any_more_is_forgotten() {
        let events = Events::default();
        drop(events.subscribe("acme"));
        events.publish("acme", event("x", Status::Ready));
        assert!(events.hub().organisations.is_empty());
    }
}
