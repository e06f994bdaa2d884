//! What a create answers: the environment made or found (and where a repeat's request differs
//! from it), a streamed create's progress and outcome, and a joined create's outcome.

use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::locks::FlightOutcome;
use super::{CreateRequest, EnvironmentError, Progress};
use crate::model::{EnvironmentId, Repository};
use crate::store::EnvironmentRecord;

/// How a create ended: made now, or found as it already was. A found one is answered as it
/// stands whatever this request asked; `Differs` says where the request and the record part.
#[derive(Debug)]
pub enum Created {
    New(EnvironmentRecord),
    Existing(EnvironmentRecord, Differs),
}

/// Where a repeat's request differs from the environment it found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Differs {
    pub setup: bool,
    pub repository: bool,
}

impl Differs {
    pub(super) fn between(
        setup: Option<&str>,
        repository: Option<&Repository>,
        request: &CreateRequest,
    ) -> Differs {
        Differs {
            setup: setup != request.setup.as_deref(),
            repository: repository != request.repository.as_ref(),
        }
    }

    pub(super) fn of(record: &EnvironmentRecord, request: &CreateRequest) -> Differs {
        Differs::between(
            record.setup_script.as_deref(),
            record.repository.as_ref(),
            request,
        )
    }
}

impl Created {
    /// Whether this create made the environment (`201`) rather than found it (`200`).
    pub fn is_new(&self) -> bool {
        matches!(self, Created::New(_))
    }

    pub fn record(&self) -> &EnvironmentRecord {
        match self {
            Created::New(record) | Created::Existing(record, _) => record,
        }
    }

    /// Where this request differs from the environment it found (nothing, for a new one).
    pub fn differs(&self) -> Differs {
        match self {
            Created::New(_) => Differs::default(),
            Created::Existing(_, differs) => *differs,
        }
    }
}

/// A create provisioning now that this request joined: its outcome, answered as this request's.
pub(super) struct Joined {
    pub(super) id: EnvironmentId,
    pub(super) outcome: watch::Receiver<Option<FlightOutcome>>,
    pub(super) differs: Differs,
}

impl Joined {
    pub(super) async fn outcome(mut self) -> Result<Created, EnvironmentError> {
        let landed = match self.outcome.wait_for(Option::is_some).await {
            Ok(landed) => landed.clone(),
            Err(_) => None,
        };
        match landed {
            Some(Ok(record)) => Ok(Created::Existing(record, self.differs)),
            Some(Err(shared)) => Err(EnvironmentError::Joined(shared)),
            None => Err(EnvironmentError::JoinedWithoutOutcome(self.id)),
        }
    }
}

/// A create whose progress is watched as it happens: its steps and output, then its outcome.
pub struct CreateStream {
    pub(super) new: bool,
    pub(super) differs: Differs,
    pub(super) events: Option<broadcast::Receiver<Progress>>,
    pub(super) outcome: Outcome,
    /// How many events this reader missed when it fell more than the backlog behind.
    pub(super) fell_behind: Option<u64>,
}

pub(super) enum Outcome {
    Running(JoinHandle<Result<Created, EnvironmentError>>),
    Joined(Box<Joined>),
    Known(Box<Created>),
}

impl CreateStream {
    /// Whether this create is making the environment (`201`) or joined one that exists or is
    /// being made (`200`).
    pub fn is_new(&self) -> bool {
        self.new
    }

    /// Where this request differs from the environment it found or joined.
    pub fn differs(&self) -> Differs {
        self.differs
    }

    /// The next event, or `None` once provisioning has ended, or once this reader fell more
    /// than the backlog ([`super::create::PROGRESS_BACKLOG`] events) behind: then it is let
    /// go, so a reader that stops reading pins no more than that, and [`Self::fell_behind`]
    /// says how many it missed. The create goes on either way.
    pub async fn next(&mut self) -> Option<Progress> {
        let events = self.events.as_mut()?;
        match events.recv().await {
            Ok(progress) => Some(progress),
            Err(RecvError::Lagged(missed)) => {
                self.fell_behind = Some(missed);
                self.events = None;
                None
            }
            Err(RecvError::Closed) => {
                self.events = None;
                None
            }
        }
    }

    /// How many events this reader missed, if it fell behind and was let go.
    pub fn fell_behind(&self) -> Option<u64> {
        self.fell_behind
    }

    /// How the create ended.
    pub async fn outcome(self) -> Result<Created, EnvironmentError> {
        match self.outcome {
            Outcome::Known(created) => Ok(*created),
            Outcome::Joined(joined) => joined.outcome().await,
            Outcome::Running(task) => task.await.map_err(EnvironmentError::task("create"))?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::environments::create::PROGRESS_BACKLOG;

    #[tokio::test]
    async fn a_reader_that_fell_behind_the_backlog_is_let_go() {
        let (events, receiver) = broadcast::channel(PROGRESS_BACKLOG);
        let id: EnvironmentId = "demo".parse().unwrap();
        let mut stream = CreateStream {
            new: true,
            differs: Differs::default(),
            events: Some(receiver),
            outcome: Outcome::Running(tokio::spawn(
                async move { Err(EnvironmentError::NotFound(id)) },
            )),
            fell_behind: None,
        };
        // The reader stopped; the create went on writing.
        for _ in 0..PROGRESS_BACKLOG + 3 {
            events.send(Progress::started("setup")).unwrap();
        }
        assert_eq!(stream.next().await, None, "let go, not fed what is left");
        assert_eq!(stream.fell_behind(), Some(3));
        assert_eq!(
            events.receiver_count(),
            0,
            "nothing is kept for it any more"
        );
        assert_eq!(stream.next().await, None);
    }
}
