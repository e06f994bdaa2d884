//! The container-runtime boundary of Narya host: the `Runtime` trait, its types and error kinds.
//!
//! Everything above this crate speaks of machines, processes and pinned images; nothing above it
//! names containerd or Docker. Back ends live in their own modules and pass the same conformance
//! suite.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use narya_oci::{Digest, ImageReference};

pub mod conformance;
pub mod containerd;
pub mod docker;
pub mod fetch;
pub mod host;
pub mod output;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

/// The label every Narya machine carries, valued with its environment id.
pub const LABEL_ENVIRONMENT: &str = "dev.narya.environment";
/// The label carrying the pinned manifest digest a machine was made from.
pub const LABEL_DIGEST: &str = "dev.narya.image-digest";

/// How a runtime failed, so the daemon can tell waiting from giving up.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The machine (or process, or image) asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A machine of that id exists already.
    #[error("{0}")]
    AlreadyExists(String),
    /// The runtime is not answering; retrying later may succeed.
    #[error("{0}")]
    Unavailable(String),
    /// The image could not be resolved, fetched or verified.
    #[error("{0}")]
    Image(String),
    /// Anything else; the message says what failed.
    #[error("{0}")]
    Other(String),
}

/// The kind of a [`RuntimeError`]: what the daemon decides on, whatever the back end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    Unavailable,
    Image,
    Other,
}

impl RuntimeError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RuntimeError::NotFound(_) => ErrorKind::NotFound,
            RuntimeError::AlreadyExists(_) => ErrorKind::AlreadyExists,
            RuntimeError::Unavailable(_) => ErrorKind::Unavailable,
            RuntimeError::Image(_) => ErrorKind::Image,
            RuntimeError::Other(_) => ErrorKind::Other,
        }
    }

    /// A failure of `kind` with no underlying error: a refusal, or a fault a fake injects.
    pub fn plain(kind: ErrorKind, message: impl Into<String>) -> RuntimeError {
        let message = message.into();
        match kind {
            ErrorKind::NotFound => RuntimeError::NotFound(message),
            ErrorKind::AlreadyExists => RuntimeError::AlreadyExists(message),
            ErrorKind::Unavailable => RuntimeError::Unavailable(message),
            ErrorKind::Image => RuntimeError::Image(message),
            ErrorKind::Other => RuntimeError::Other(message),
        }
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// A user and group id on the host and in the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.uid, self.gid)
    }
}

/// Which network a machine joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    /// The host's network namespace.
    Host,
    /// A private namespace with loopback only.
    None,
}

/// The official image as configured, and the digest it is pinned to once known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSource {
    pub reference: ImageReference,
    /// `None`: resolve the reference to its current manifest digest. `Some`: make exactly this
    /// digest available (recovery and replace never float).
    pub pinned: Option<Digest>,
}

/// An image available locally under its manifest digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinnedImage {
    pub reference: ImageReference,
    pub digest: Digest,
}

/// Everything a back end needs to make one environment's machine.
#[derive(Clone, Debug)]
pub struct MachineSpec {
    /// The environment id; the machine's name.
    pub id: String,
    pub image: PinnedImage,
    /// The workspace directory on the host, bind-mounted read-write.
    pub workspace: PathBuf,
    /// Where the workspace appears inside the machine.
    pub mount_point: String,
    pub user: User,
    pub network: Network,
    /// Labels added to Narya's own ([`LABEL_ENVIRONMENT`], [`LABEL_DIGEST`]).
    pub labels: BTreeMap<String, String>,
}

/// One process to run inside a machine.
#[derive(Clone, Debug)]
pub struct ProcessSpec {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Working directory inside the machine; the workspace when `None`.
    pub cwd: Option<String>,
    pub timeout: Duration,
    /// Bytes of combined output kept; the tail is kept.
    pub output_limit: usize,
    /// Bytes given to the process on its standard input, then end of file; `None`: no input.
    pub stdin: Option<Vec<u8>>,
    /// Where to send output chunks as they are produced, besides keeping the tail. When the
    /// receiving end goes away, the process and everything it started are killed (the outcome
    /// then has no exit code and is not timed out).
    pub output: Option<tokio::sync::mpsc::Sender<Vec<u8>>>,
}

/// A short-lived container of the official image over a workspace, removed afterwards.
#[derive(Clone, Debug)]
pub struct ThrowawaySpec {
    /// The container's name, unique among running throwaways (e.g. `{environment}-clone`);
    /// no container of that name exists once `run_throwaway` returns.
    pub name: String,
    pub image: PinnedImage,
    pub workspace: PathBuf,
    pub mount_point: String,
    pub user: User,
    pub network: Network,
    /// The process; its `env` is the only place secrets given to it live.
    pub process: ProcessSpec,
}

/// What became of one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessOutcome {
    /// `None` when the process was killed (time-out or signal).
    pub exit_code: Option<i32>,
    /// The tail of combined stdout and stderr, at most `output_limit` bytes.
    pub output: Vec<u8>,
    pub output_truncated: bool,
    pub timed_out: bool,
    pub duration: Duration,
}

/// Where a machine is in its life, as the runtime sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MachineState {
    Running,
    Stopped,
    Missing,
}

/// A Narya-labelled machine found in the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineInfo {
    pub id: String,
    pub digest: Option<Digest>,
    pub state: MachineState,
}

/// A container runtime as Narya uses it: one long-running machine per environment.
#[async_trait::async_trait]
pub trait Runtime: Send + Sync {
    /// The back end's name, for logs and the conformance report.
    fn name(&self) -> &'static str;

    /// The runtime's version, which also proves it answers. Errors: `Unavailable` when it does
    /// not answer; `Other` when it answers but is too old to be used.
    async fn version(&self) -> Result<String>;

    /// Resolves `source` to a manifest digest (unless pinned) and makes exactly that digest
    /// available locally, verified against its digests. Idempotent and safe to race.
    /// Errors: `Image` when it cannot be resolved, fetched or verified; `Unavailable`.
    async fn ensure_image(&self, source: &ImageSource) -> Result<PinnedImage>;

    /// Creates and starts the machine described by `spec`.
    /// Errors: `AlreadyExists` when a machine of that id exists; `Unavailable`; `Other`.
    async fn create_machine(&self, spec: &MachineSpec) -> Result<MachineInfo>;

    /// Runs one process in the running machine `id` as the machine's unprivileged user, bounded
    /// by `spec.timeout`; on time-out the process and all it started are killed.
    /// Errors: `NotFound` when there is no such running machine; `Unavailable`.
    async fn run(&self, id: &str, spec: &ProcessSpec) -> Result<ProcessOutcome>;

    /// Runs one process in a throwaway container and removes the container whatever happened.
    async fn run_throwaway(&self, spec: &ThrowawaySpec) -> Result<ProcessOutcome>;

    /// The machine's state; `Missing` only when the runtime answered that it has no such machine.
    /// Errors: `Unavailable`, never `Missing`, when the runtime is not answering.
    async fn inspect(&self, id: &str) -> Result<MachineState>;

    /// Every Narya-labelled machine in the runtime.
    async fn list(&self) -> Result<Vec<MachineInfo>>;

    /// A stream that yields whenever the runtime reports a change to its machines (a process
    /// exited, a container went), and ends when the runtime stops reporting. A nudge to look
    /// again with `list`/`inspect`, never the truth itself. Errors: `Unavailable`.
    async fn changes(&self) -> Result<futures_util::stream::BoxStream<'static, ()>>;

    /// Starts a stopped machine again with its workspace. Idempotent on a running machine.
    /// Errors: `NotFound`; `Unavailable`.
    async fn start(&self, id: &str) -> Result<()>;

    /// Stops and deletes the machine and its writable layer, never the workspace. Idempotent:
    /// removing a missing machine succeeds. Errors: `Unavailable`; `Other`.
    async fn remove(&self, id: &str) -> Result<()>;
}
