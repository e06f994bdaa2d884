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
pub mod disk;
pub mod docker;
pub mod fetch;
pub mod host;
pub mod network;
pub mod output;
pub mod sandbox;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod versions;

mod labels;
mod pinning;
mod watch;

pub use labels::{
    LABEL_DIGEST, LABEL_ENVIRONMENT, LABEL_ORGANISATION, LABEL_POOL, LABEL_THROWAWAY,
};
pub use narya_oci::spec::{Limits, OOM_SCORE_ADJ};
pub use sandbox::Sandbox;

/// The underlying failure a [`RuntimeError`] carries as its source.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How a runtime failed, so the daemon can tell waiting from giving up. Each variant says what
/// failed (`what`, written by the back end for a person to act on) and keeps the failure under
/// it as its source; its text follows `what` in the message, so a log line loses nothing.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The machine (or process, or image) asked for does not exist.
    #[error("{what}{}", because(.source))]
    NotFound {
        what: String,
        #[source]
        source: Option<Cause>,
    },
    /// A machine of that id exists already.
    #[error("{what}{}", because(.source))]
    AlreadyExists {
        what: String,
        #[source]
        source: Option<Cause>,
    },
    /// The runtime is not answering; retrying later may succeed.
    #[error("{what}{}", because(.source))]
    Unavailable {
        what: String,
        #[source]
        source: Option<Cause>,
    },
    /// The image could not be resolved, fetched or verified.
    #[error("{what}{}", because(.source))]
    Image {
        what: String,
        #[source]
        source: Option<Cause>,
    },
    /// Anything else; `what` says what failed.
    #[error("{what}{}", because(.source))]
    Other {
        what: String,
        #[source]
        source: Option<Cause>,
    },
}

/// The source's text after the colon that joins it to what failed; nothing without a source.
fn because(source: &Option<Cause>) -> String {
    source
        .as_ref()
        .map(|source| format!(": {source}"))
        .unwrap_or_default()
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
            RuntimeError::NotFound { .. } => ErrorKind::NotFound,
            RuntimeError::AlreadyExists { .. } => ErrorKind::AlreadyExists,
            RuntimeError::Unavailable { .. } => ErrorKind::Unavailable,
            RuntimeError::Image { .. } => ErrorKind::Image,
            RuntimeError::Other { .. } => ErrorKind::Other,
        }
    }

    /// A failure of `kind` with no underlying error: a refusal, or a fault a fake injects.
    pub fn plain(kind: ErrorKind, message: impl Into<String>) -> RuntimeError {
        RuntimeError::new(kind, message.into(), None)
    }

    /// A failure of `kind` while doing `what`, caused by `source`.
    pub fn caused(
        kind: ErrorKind,
        what: impl Into<String>,
        source: impl Into<Cause>,
    ) -> RuntimeError {
        RuntimeError::new(kind, what.into(), Some(source.into()))
    }

    /// The same failure counted as another kind: what a back end learns from the context of a
    /// call (a missing image where a container was made is an image failure).
    pub(crate) fn into_kind(self, kind: ErrorKind) -> RuntimeError {
        let (what, source) = match self {
            RuntimeError::NotFound { what, source }
            | RuntimeError::AlreadyExists { what, source }
            | RuntimeError::Unavailable { what, source }
            | RuntimeError::Image { what, source }
            | RuntimeError::Other { what, source } => (what, source),
        };
        RuntimeError::new(kind, what, source)
    }

    fn new(kind: ErrorKind, what: String, source: Option<Cause>) -> RuntimeError {
        match kind {
            ErrorKind::NotFound => RuntimeError::NotFound { what, source },
            ErrorKind::AlreadyExists => RuntimeError::AlreadyExists { what, source },
            ErrorKind::Unavailable => RuntimeError::Unavailable { what, source },
            ErrorKind::Image => RuntimeError::Image { what, source },
            ErrorKind::Other => RuntimeError::Other { what, source },
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

/// [`Runtime::kill_marked`] through the host's `/proc`, for a machine whose init is `init`.
pub async fn kill_marked_from_the_host(init: Option<u32>, entry: &str) -> Result<usize> {
    let Some(init) = init else {
        return Ok(0);
    };
    let entry = entry.to_owned();
    tokio::task::spawn_blocking(move || host::kill_marked(init, &entry))
        .await
        .map_err(|e| RuntimeError::caused(ErrorKind::Other, "killing marked processes", e))
}

/// Which network a machine joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    /// The host's network namespace: no isolation at all.
    Host,
    /// A private namespace with loopback only.
    None,
    /// A private namespace with one interface routed through the host: outbound connections
    /// work, the host, other machines and link-local addresses do not (see [`network`]).
    Isolated,
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
    /// The runtime's own name for the machine, chosen by the daemon: internal, unique, and a
    /// valid container name on every back end (`[a-z0-9]`, `-`; at most 63 characters).
    pub id: String,
    /// The identifier of the environment the machine serves ([`LABEL_ENVIRONMENT`]): any text.
    pub environment: String,
    /// The organisation that owns it ([`LABEL_ORGANISATION`]): any text.
    pub organisation: String,
    pub image: PinnedImage,
    /// The workspace directory on the host, bind-mounted read-write.
    pub workspace: PathBuf,
    /// Where the workspace appears inside the machine.
    pub mount_point: String,
    pub user: User,
    pub network: Network,
    /// What bounds the machine and everything run in it.
    pub limits: Limits,
    /// `Some(configuration)`: a machine started ahead of creates, serving nobody yet. It is
    /// labelled [`LABEL_POOL`] with `configuration` and carries no identifier or organisation
    /// (`environment` and `organisation` are not used) until [`Runtime::claim`].
    pub pool: Option<String>,
    /// Labels added to Narya's own ([`LABEL_ENVIRONMENT`], [`LABEL_ORGANISATION`],
    /// [`LABEL_DIGEST`]), which win over these.
    pub labels: BTreeMap<String, String>,
    /// `Some(name)`: the machine starts from the layer [`Runtime::commit`] kept under `name` on
    /// top of `image` (a prebuild), instead of from `image` alone. Its labels still name
    /// `image`'s digest.
    pub layer: Option<String>,
}

/// A machine's writable layer kept by [`Runtime::commit`] as a layer of its own on top of the
/// machine's pinned image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    /// The name it was kept under, as given to `commit`.
    pub name: String,
    /// What it holds on the host, in bytes: everything the runtime keeps of it (on containerd
    /// the layer's archive and its unpacked snapshot; on Docker the layer).
    pub bytes: u64,
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
    /// The environment it works for and that environment's organisation, labelled on it so that
    /// one left behind by a daemon that died can be found and removed.
    pub environment: String,
    pub organisation: String,
    /// The same bounds as the environment's machine.
    pub limits: Limits,
    /// The process. Secrets go on its `stdin`, which no runtime records, never in its `env`
    /// or `argv`, which the runtime's records (spec, `inspect`) keep.
    pub process: ProcessSpec,
}

/// A throwaway container found in the runtime, by its labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThrowawayInfo {
    /// Its name, as `ThrowawaySpec::name` gave it.
    pub name: String,
    pub environment: Option<String>,
    pub organisation: Option<String>,
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
    /// The runtime cannot tell right now (a busy shim answering late or "unknown", a paused or
    /// restarting container): neither running nor stopped. Ask again later; never act on it.
    Unknown,
}

/// What the runtime reported changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Something happened to the machine (or throwaway container) of this name: look at it.
    Machine(String),
    /// Something happened that the runtime did not say of which machine: look at every one.
    Unknown,
}

/// A Narya-labelled machine found in the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineInfo {
    /// The runtime's name for it, as the daemon gave it.
    pub id: String,
    /// The environment it serves and the organisation that owns it, from its labels.
    pub environment: Option<String>,
    pub organisation: Option<String>,
    pub digest: Option<Digest>,
    pub state: MachineState,
    /// The [`LABEL_POOL`] configuration of a machine started ahead of creates. A claimed
    /// machine loses it where the runtime can change labels (containerd) and keeps it where it
    /// cannot (Docker, Podman): there the daemon's store alone says it is claimed.
    pub pool: Option<String>,
}

/// A container runtime as Narya uses it: one long-running machine per environment.
#[async_trait::async_trait]
pub trait Runtime: Send + Sync {
    /// The back end's name, for logs and the conformance report.
    fn name(&self) -> &'static str;

    /// The runtime's version, which also proves it answers. Errors: `Unavailable` when it does
    /// not answer; `Other` when it answers but is too old to be used.
    async fn version(&self) -> Result<String>;

    /// The host directory under which the runtime keeps machines' writable layers, where it
    /// knows one: the disk bound ([`disk`]) needs project quotas on its filesystem.
    async fn layers_dir(&self) -> Result<Option<std::path::PathBuf>> {
        Ok(None)
    }

    /// Resolves `source` to a manifest digest (unless pinned) and makes exactly that digest
    /// available locally, verified against its digests. Idempotent and safe to race.
    /// Errors: `Image` when it cannot be resolved, fetched or verified; `Unavailable`.
    async fn ensure_image(&self, source: &ImageSource) -> Result<PinnedImage>;

    /// Creates and starts the machine described by `spec`.
    /// Errors: `AlreadyExists` when a machine of that id exists; `Unavailable`; `Other`.
    async fn create_machine(&self, spec: &MachineSpec) -> Result<MachineInfo>;

    /// Binds machine `id`, started ahead of creates (`MachineSpec::pool`), to `environment` of
    /// `organisation`: its labels then say so (and no longer mark it a pool machine) where the
    /// runtime can change a container's labels. Returns whether it could: a back end that
    /// cannot (Docker, Podman) answers `false` and changes nothing, and the daemon's record of
    /// the machine's name alone binds it. Repeat-safe. Errors: `NotFound` (from a back end that
    /// asks the runtime); `Unavailable`.
    async fn claim(&self, id: &str, environment: &str, organisation: &str) -> Result<bool>;

    /// Runs one process in the running machine `id` as the machine's unprivileged user, bounded
    /// by `spec.timeout`; on time-out the process and all it started are killed.
    /// Errors: `NotFound` when there is no such running machine; `Unavailable`.
    async fn run(&self, id: &str, spec: &ProcessSpec) -> Result<ProcessOutcome>;

    /// Runs one process in a throwaway container and removes the container whatever happened.
    async fn run_throwaway(&self, spec: &ThrowawaySpec) -> Result<ProcessOutcome>;

    /// Every throwaway container in the runtime, running or not: those a daemon that died
    /// mid-run left behind among them. Errors: `Unavailable`.
    async fn list_throwaways(&self) -> Result<Vec<ThrowawayInfo>>;

    /// Kills and removes throwaway `name` (and nothing that is not a throwaway of that name).
    /// Idempotent. Errors: `Unavailable`; `Other`.
    async fn remove_throwaway(&self, name: &str) -> Result<()>;

    /// The machine's state; `Missing` only when the runtime answered that it has no such machine.
    /// Errors: `Unavailable`, never `Missing`, when the runtime is not answering.
    async fn inspect(&self, id: &str) -> Result<MachineState>;

    /// The host pid of the running machine `id`'s init, through which the host finds the
    /// processes in its pid namespace; `None` when the machine is missing or not running.
    /// Errors: `Unavailable`, also while the runtime cannot tell a running machine's pid (a busy
    /// containerd shim), never `None` then.
    async fn init_pid(&self, id: &str) -> Result<Option<u32>>;

    /// Kills every process in machine `id` whose environment has `entry` (`KEY=VALUE`) as it
    /// was started (its init excepted), and answers how many; 0 when the machine is missing or
    /// not running. This default finds them from the host through [`Runtime::init_pid`]; a
    /// back end whose machines' processes are not the host's (gVisor) sweeps from inside.
    /// Errors: as `init_pid`.
    async fn kill_marked(&self, id: &str, entry: &str) -> Result<usize> {
        kill_marked_from_the_host(self.init_pid(id).await?, entry).await
    }

    /// Every Narya-labelled machine in the runtime.
    async fn list(&self) -> Result<Vec<MachineInfo>>;

    /// The machines labelled as serving environment `environment`, of any organisation: who
    /// holds an identifier in the runtime, whatever the store says. Repeat-safe.
    /// Errors: `Unavailable`. Back ends that can ask the runtime to filter by label do.
    async fn machines_of(&self, environment: &str) -> Result<Vec<MachineInfo>> {
        let mut machines = self.list().await?;
        machines.retain(|m| m.environment.as_deref() == Some(environment));
        Ok(machines)
    }

    /// A stream of the changes the runtime reports to its machines (a machine's init exited,
    /// a container went), each naming the machine when the runtime does; it ends when the
    /// runtime stops reporting. A nudge to look again with `inspect` (or `list`, for
    /// [`Change::Unknown`]), never the truth itself. Processes run with `run` ending are not
    /// changes to machines and are not reported. Errors: `Unavailable`.
    async fn changes(&self) -> Result<futures_util::stream::BoxStream<'static, Change>>;

    /// Keeps machine `id`'s writable layer (never its workspace, `/tmp` or other mounts) as a
    /// layer on top of its pinned image under `name`, for [`MachineSpec::layer`] to start
    /// later machines from. The machine keeps running; what it writes meanwhile may or may not
    /// be kept, so the caller runs nothing in it while it commits. A layer of that name kept
    /// before is replaced. Errors: `NotFound` when there is no such machine; `Unavailable`;
    /// `Other`.
    async fn commit(&self, id: &str, name: &str) -> Result<Committed>;

    /// Removes the layer kept under `name` by [`Runtime::commit`]. Idempotent: a missing one is
    /// removed. Errors: `Unavailable`; `Other`, also while a machine still starts from it.
    async fn remove_committed(&self, name: &str) -> Result<()>;

    /// Starts a stopped machine again with its workspace. Idempotent on a running machine.
    /// A machine whose state the runtime cannot tell is left alone: `Unavailable`, never a
    /// restart that could kill a busy, healthy machine. Errors: `NotFound`; `Unavailable`.
    async fn start(&self, id: &str) -> Result<()>;

    /// Stops and deletes the machine and its writable layer, never the workspace, and releases
    /// what its network held on the host. Idempotent: removing a missing machine succeeds.
    /// Errors: `Unavailable`; `Other`.
    async fn remove(&self, id: &str) -> Result<()>;

    /// Isolated networking as this back end was given it, if at all.
    fn isolation(&self) -> Option<&network::Isolation> {
        None
    }

    /// On a clean stop: removes what isolated networking set up on the host (firewall chains,
    /// a Docker network) once no machine of this daemon is left. Machines still there keep it,
    /// so that they stay isolated while the daemon is away. Errors: `Unavailable`.
    async fn shutdown(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_plain_failure_reads_as_its_message() {
        let e = RuntimeError::plain(ErrorKind::NotFound, "docker: machine m is not running");
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(e.to_string(), "docker: machine m is not running");
        assert!(e.source().is_none());
    }

    #[test]
    fn a_caused_failure_reads_as_what_then_its_source_and_keeps_it() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let text = refused.to_string();
        let e = RuntimeError::caused(ErrorKind::Unavailable, "containerd: listing", refused);
        assert_eq!(e.to_string(), format!("containerd: listing: {text}"));
        let source = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            source.map(std::io::Error::kind),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
    }

    #[test]
    fn another_kind_keeps_the_words_and_the_source() {
        let e = RuntimeError::caused(ErrorKind::NotFound, "docker: creating c", "no such image");
        let text = e.to_string();
        let image = e.into_kind(ErrorKind::Image);
        assert!(matches!(image, RuntimeError::Image { .. }));
        assert_eq!(image.to_string(), text);
        assert!(image.source().is_some());
    }
}
