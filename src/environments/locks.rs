//! Keeping operations on one identifier apart: the per-identifier lock every create, delete,
//! replace and restart takes, and the creates in flight that a repeat may join.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use super::Progress;
use crate::model::EnvironmentId;

type IdLock = Arc<tokio::sync::Mutex<()>>;

#[derive(Default)]
pub(super) struct Locks {
    by_id: Mutex<HashMap<EnvironmentId, IdLock>>,
    /// The progress of creates that are provisioning now, for repeats that join them.
    in_flight: Mutex<HashMap<EnvironmentId, broadcast::Sender<Progress>>>,
}

/// Holds one identifier's lock; forgets the lock when nobody else waits for it.
pub(super) struct IdGuard<'a> {
    owner: &'a Locks,
    id: EnvironmentId,
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

/// Forgets a create's progress channel when it ends, however it ends.
pub(super) struct InFlight<'a> {
    owner: &'a Locks,
    id: EnvironmentId,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut in_flight) = self.owner.in_flight.lock() {
            in_flight.remove(&self.id);
        }
    }
}

impl Locks {
    fn lock_of(&self, id: &EnvironmentId) -> IdLock {
        let mut locks = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(id.clone()).or_default().clone()
    }

    /// Waits for `id`'s lock.
    pub(super) async fn lock(&self, id: &EnvironmentId) -> IdGuard<'_> {
        let lock = self.lock_of(id);
        let guard = lock.clone().lock_owned().await;
        IdGuard {
            owner: self,
            id: id.clone(),
            lock: Some(lock),
            _guard: guard,
        }
    }

    /// `id`'s lock if nobody holds it now (a create, delete or replace in progress).
    pub(super) fn try_lock(&self, id: &EnvironmentId) -> Option<IdGuard<'_>> {
        let lock = self.lock_of(id);
        let guard = lock.clone().try_lock_owned().ok()?;
        Some(IdGuard {
            owner: self,
            id: id.clone(),
            lock: Some(lock),
            _guard: guard,
        })
    }

    /// Makes `events` the progress a repeat of `id`'s create joins, until the guard drops.
    pub(super) fn in_flight(
        &self,
        id: &EnvironmentId,
        events: &broadcast::Sender<Progress>,
    ) -> InFlight<'_> {
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), events.clone());
        InFlight {
            owner: self,
            id: id.clone(),
        }
    }

    /// The progress of `id`'s create in flight, from now on.
    pub(super) fn join(&self, id: &EnvironmentId) -> Option<broadcast::Receiver<Progress>> {
        let in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        in_flight.get(id).map(broadcast::Sender::subscribe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_identifier_cannot_be_taken_and_is_forgotten_when_free() {
        let locks = Locks::default();
        let id: EnvironmentId = "demo".parse().unwrap();
        let held = locks.lock(&id).await;
        assert!(locks.try_lock(&id).is_none());
        assert!(locks.try_lock(&"other".parse().unwrap()).is_some());
        drop(held);
        assert!(locks.by_id.lock().unwrap().is_empty());
        assert!(locks.try_lock(&id).is_some());
    }

    #[tokio::test]
    async fn a_create_in_flight_can_be_joined_until_it_ends() {
        let locks = Locks::default();
        let id: EnvironmentId = "demo".parse().unwrap();
        assert!(locks.join(&id).is_none());
        let (events, _) = broadcast::channel(4);
        let in_flight = locks.in_flight(&id, &events);
        let mut joined = locks.join(&id).unwrap();
        events.send(Progress::started("setup")).unwrap();
        assert_eq!(joined.recv().await.unwrap(), Progress::started("setup"));
        drop(in_flight);
        assert!(locks.join(&id).is_none());
    }
}
