//! Keeping operations on one environment apart: the lock every create, delete, replace and
//! restart takes, and the creates in flight that a repeat joins. Both are per organisation and
//! identifier, so another organisation's requests for the same identifier (refused, since
//! identifiers are unique on the host, by the store) never queue behind or ahead of its
//! holder's; two organisations racing for a free identifier are told apart by the store's
//! unique key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, watch};

use super::{EnvironmentError, Progress};
use crate::model::{EnvironmentId, Repository};
use crate::store::EnvironmentRecord;

type IdLock = Arc<tokio::sync::Mutex<()>>;

/// An environment as the locks know it: its organisation and identifier.
type Key = (String, EnvironmentId);

fn key(organisation: &str, id: &EnvironmentId) -> Key {
    (organisation.to_owned(), id.clone())
}

#[derive(Default)]
pub(super) struct Locks {
    by_id: Mutex<HashMap<Key, IdLock>>,
    /// The creates that are provisioning now, for repeats that join them.
    in_flight: Mutex<HashMap<Key, Flight>>,
}

/// How a create in flight ended, as its joiners see it.
pub(super) type FlightOutcome = Result<EnvironmentRecord, Arc<EnvironmentError>>;

/// A create provisioning now: whose, what it was asked, its progress and, once known, its outcome.
#[derive(Clone)]
pub(super) struct Flight {
    pub organisation: String,
    pub setup: Option<String>,
    pub repository: Option<Repository>,
    pub events: broadcast::Sender<Progress>,
    pub outcome: watch::Receiver<Option<FlightOutcome>>,
}

/// Holds one environment's lock; forgets the lock when nobody else waits for it.
pub(super) struct IdGuard<'a> {
    owner: &'a Locks,
    id: Key,
    lock: Option<IdLock>,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for IdGuard<'_> {
    fn drop(&mut self) {
        let Some(lock) = self.lock.take() else { return };
        let Ok(mut locks) = self.owner.by_id.lock() else {
            return;
        };
        // Ours and the map's: nobody else holds or waits for it.
        if Arc::strong_count(&lock) <= 3 {
            locks.remove(&self.id);
        }
    }
}

/// A create's registration as in flight: it lands with its outcome, and is forgotten when it
/// ends however it ends (a joiner of one that ended without landing hears so).
pub(super) struct InFlight<'a> {
    owner: &'a Locks,
    id: Key,
    outcome: watch::Sender<Option<FlightOutcome>>,
}

impl InFlight<'_> {
    /// Tells every joiner how the create ended.
    pub(super) fn land(self, outcome: FlightOutcome) {
        self.outcome.send_replace(Some(outcome));
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut in_flight) = self.owner.in_flight.lock() {
            in_flight.remove(&self.id);
        }
    }
}

impl Locks {
    fn lock_of(&self, id: &Key) -> IdLock {
        let mut locks = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(id.clone()).or_default().clone()
    }

    /// Waits for the lock of `organisation`'s `id`.
    pub(super) async fn lock(&self, organisation: &str, id: &EnvironmentId) -> IdGuard<'_> {
        let id = key(organisation, id);
        let lock = self.lock_of(&id);
        let guard = lock.clone().lock_owned().await;
        IdGuard {
            owner: self,
            id,
            lock: Some(lock),
            _guard: guard,
        }
    }

    /// The lock of `organisation`'s `id` if nobody holds it now (a create, delete or replace
    /// in progress).
    pub(super) fn try_lock(&self, organisation: &str, id: &EnvironmentId) -> Option<IdGuard<'_>> {
        let id = key(organisation, id);
        let lock = self.lock_of(&id);
        let guard = lock.clone().try_lock_owned().ok()?;
        Some(IdGuard {
            owner: self,
            id,
            lock: Some(lock),
            _guard: guard,
        })
    }

    /// Registers `id`'s create as in flight for `organisation`, asked for `setup` and
    /// `repository`, with its progress on `events`, until the returned registration drops.
    pub(super) fn in_flight(
        &self,
        id: &EnvironmentId,
        organisation: &str,
        setup: Option<String>,
        repository: Option<Repository>,
        events: &broadcast::Sender<Progress>,
    ) -> InFlight<'_> {
        let (outcome, outcome_rx) = watch::channel(None);
        let flight = Flight {
            organisation: organisation.to_owned(),
            setup,
            repository,
            events: events.clone(),
            outcome: outcome_rx,
        };
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key(organisation, id), flight);
        InFlight {
            owner: self,
            id: key(organisation, id),
            outcome,
        }
    }

    /// The create of `organisation`'s `id` in flight, if there is one.
    pub(super) fn flight(&self, organisation: &str, id: &EnvironmentId) -> Option<Flight> {
        let in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        in_flight.get(&key(organisation, id)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_identifier_cannot_be_taken_and_is_forgotten_when_free() {
        let locks = Locks::default();
        let id: EnvironmentId = "demo".parse().unwrap();
        let held = locks.lock("acme", &id).await;
        assert!(locks.try_lock("acme", &id).is_none());
        assert!(locks.try_lock("acme", &"other".parse().unwrap()).is_some());
        // Another organisation's requests for the same identifier never wait for acme's.
        assert!(locks.try_lock("globex", &id).is_some());
        drop(held);
        assert!(locks.by_id.lock().unwrap().is_empty());
        assert!(locks.try_lock("acme", &id).is_some());
    }

    #[tokio::test]
    async fn a_create_in_flight_can_be_joined_until_it_lands() {
        let locks = Locks::default();
        let id: EnvironmentId = "demo".parse().unwrap();
        assert!(locks.flight("acme", &id).is_none());
        let (events, _) = broadcast::channel(4);
        let in_flight = locks.in_flight(&id, "acme", Some("make".into()), None, &events);
        assert!(
            locks.flight("globex", &id).is_none(),
            "acme's, not globex's"
        );
        let flight = locks.flight("acme", &id).unwrap();
        assert_eq!(
            (flight.organisation.as_str(), flight.setup.as_deref()),
            ("acme", Some("make"))
        );
        let mut progress = flight.events.subscribe();
        events.send(Progress::started("setup")).unwrap();
        assert_eq!(progress.recv().await.unwrap(), Progress::started("setup"));
        let mut outcome = flight.outcome.clone();
        in_flight.land(Err(Arc::new(EnvironmentError::NotFound(id.clone()))));
        let landed = outcome.wait_for(Option::is_some).await.unwrap().clone();
        assert!(matches!(landed, Some(Err(_))));
        assert!(locks.flight("acme", &id).is_none());
    }
}
