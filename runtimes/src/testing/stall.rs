//! Holding a fake runtime's calls at a gate until a test lets them through.

use std::sync::Arc;

use tokio::sync::watch;

/// A gate that calls of one operation wait at; shared by the [`Stall`] and the waiting calls.
#[derive(Debug)]
pub(super) struct Gate {
    released: watch::Sender<bool>,
    /// How many calls have come to the gate, so a test can wait until one is held.
    arrived: watch::Sender<usize>,
}

impl Gate {
    pub(super) fn is_released(&self) -> bool {
        *self.released.borrow()
    }

    /// Waits until the gate is released.
    pub(super) async fn pass(&self) {
        // Subscribed before announcing the arrival, so a release that follows it is never missed.
        let mut released = self.released.subscribe();
        self.arrived.send_modify(|n| *n += 1);
        // The sender lives in `self`, so the wait ends only by release.
        let _ = released.wait_for(|r| *r).await;
    }
}

/// Calls of one operation are held while this lives: released by [`Stall::release`] or by
/// dropping it. Bind it (`let stall = fake.stall(op)`), or it is released at once.
#[must_use = "a stall is released as soon as it is dropped"]
#[derive(Debug)]
pub struct Stall {
    gate: Arc<Gate>,
}

impl Stall {
    pub(super) fn new() -> (Stall, Arc<Gate>) {
        let gate = Arc::new(Gate {
            released: watch::Sender::new(false),
            arrived: watch::Sender::new(0),
        });
        (
            Stall {
                gate: Arc::clone(&gate),
            },
            gate,
        )
    }

    /// Resolves once a call has come to this stall and is held there.
    pub async fn reached(&self) {
        let mut arrived = self.gate.arrived.subscribe();
        let _ = arrived.wait_for(|n| *n > 0).await;
    }

    /// Lets every held call, and every later one, through.
    pub fn release(self) {
        drop(self);
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        self.gate.released.send_replace(true);
    }
}
