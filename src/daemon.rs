//! The daemon's life: open the store, bind the listeners, serve one router, shut down cleanly.

mod systemd;
mod transport;

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState};
use crate::auth::{JwksError, Verifier};
use crate::config::Config;
use crate::environments::Environments;
use crate::github::{GitHubApp, GitHubError};
use crate::metrics::{Metered, Metrics};
use crate::organisation::Organisations;
use crate::store::{Store, StoreError};

pub use systemd::{ActivationError, Notifier};

/// How often start-up asks a runtime that did not answer yet whether it does now, to tell
/// systemd the daemon is ready.
const RUNTIME_READY_POLL: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Identity(#[from] JwksError),
    #[error("cannot set up the GitHub App ([github]): {0}")]
    GitHub(#[from] GitHubError),
    #[error("cannot set up the container runtime back end: {0}")]
    Runtime(#[from] narya_runtimes::RuntimeError),
    #[error("cannot make the state directory {path} private (0700): {source}")]
    StateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the state directory {0} is a shared directory (its sticky bit is set); set state_dir to a directory of naryad's own")]
    SharedStateDir(PathBuf),
    #[error("another naryad is serving {0}; stop it first, or set listen.socket to another path")]
    SocketInUse(PathBuf),
    #[error("{0} exists and is not a socket; move it away or set listen.socket to another path")]
    NotASocket(PathBuf),
    #[error("cannot listen on the unix socket {path}: {source}")]
    Socket {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Activation(#[from] ActivationError),
    #[error("cannot listen on TCP {addr}: {source}")]
    Tcp {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("[limits] disk cannot be enforced: {0}; or write `disk = \"unbounded\"` under [limits] to run without a bound")]
    Disk(String),
    #[error("cannot wait for shutdown signals: {0}")]
    Signals(std::io::Error),
    #[error("serving failed: {0}")]
    Serve(std::io::Error),
    #[error("a listener stopped serving: {0}")]
    Listener(#[source] tokio::task::JoinError),
}

/// Binds the unix socket at `path`: the parent directory is created, a stale socket left by a
/// dead daemon is replaced, a live one is refused.
pub fn bind_unix_socket(path: &Path) -> Result<UnixListener, DaemonError> {
    let socket_error = |source| DaemonError::Socket {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(socket_error)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(DaemonError::NotASocket(path.to_owned()))
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(DaemonError::SocketInUse(path.to_owned())),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                tracing::info!(socket = %path.display(), "replacing the stale socket of a daemon that is gone");
                std::fs::remove_file(path).map_err(socket_error)?;
            }
            Err(e) => return Err(socket_error(e)),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(socket_error(e)),
    }
    let listener = UnixListener::bind(path).map_err(socket_error)?;
    // Every request carries a verified token; the file mode is transport, not authorisation.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(socket_error)?;
    Ok(listener)
}

/// The unix socket systemd passed (socket activation), else one bound at `path`; and whether
/// the socket file is naryad's own to remove at exit.
fn unix_listener(path: &Path) -> Result<(UnixListener, bool), DaemonError> {
    let Some((listener, bound_at)) = systemd::activated_unix_listener()? else {
        return Ok((bind_unix_socket(path)?, true));
    };
    let socket_error = |source| DaemonError::Socket {
        path: path.to_owned(),
        source,
    };
    match bound_at {
        Some(bound_at) if bound_at != path => tracing::warn!(
            activated = %bound_at.display(),
            configured = %path.display(),
            "serving the unix socket systemd passed, which is not listen.socket; make the two agree (naryad.socket's ListenStream)"
        ),
        _ => tracing::info!(socket = %path.display(), "serving the unix socket systemd passed"),
    }
    Ok((
        UnixListener::from_std(listener).map_err(socket_error)?,
        false,
    ))
}

/// Tells systemd the daemon is ready once the runtime, which did not answer at start-up, does:
/// until then the daemon serves, with environments reading `degraded`.
async fn notify_ready_when_runtime_answers(
    runtime: Arc<dyn narya_runtimes::Runtime>,
    notifier: Arc<Notifier>,
) {
    notifier.notify(&format!(
        "STATUS=serving; waiting for the container runtime ({}) to answer",
        runtime.name()
    ));
    loop {
        tokio::time::sleep(RUNTIME_READY_POLL).await;
        if let Ok(version) = runtime.version().await {
            tracing::info!(
                backend = runtime.name(),
                version,
                "container runtime answers"
            );
            notifier.notify("READY=1\nSTATUS=serving");
            return;
        }
    }
}

/// How long streams cut at the shutdown timeout have to send their last line.
const CUT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Creates the state directory private to the daemon's user (0700), or makes an existing one
/// so: it holds the database and every environment's workspace.
pub fn private_state_dir(dir: &Path) -> Result<(), DaemonError> {
    use std::os::unix::fs::DirBuilderExt;
    let state_dir_error = |source| DaemonError::StateDir {
        path: dir.to_owned(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(state_dir_error)?;
    let mode = std::fs::metadata(dir)
        .map_err(state_dir_error)?
        .permissions()
        .mode();
    // Making a directory such as /tmp private would break everyone else who uses it.
    if mode & 0o1000 != 0 {
        return Err(DaemonError::SharedStateDir(dir.to_owned()));
    }
    if mode & 0o777 != 0o700 {
        tracing::info!(state_dir = %dir.display(), was = format!("{:o}", mode & 0o777), "making the state directory private (0700)");
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(state_dir_error)?;
    }
    Ok(())
}

/// SIGTERM and SIGINT, caught from start-up on: a stop sent the moment the daemon said it is
/// ready (or even before) is a clean shutdown, never the default action's instant death.
struct ShutdownSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> Result<ShutdownSignals, DaemonError> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(ShutdownSignals {
            term: signal(SignalKind::terminate()).map_err(DaemonError::Signals)?,
            int: signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?,
        })
    }

    /// Resolves when SIGTERM or SIGINT arrives (or arrived since `install`).
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// The bound of each environment's disk, once this host is seen to enforce it: project quotas
/// on the workspaces' filesystem and on the one the runtime keeps writable layers on (asked
/// when the runtime answers; otherwise each create finds out). `None`: unbounded, as the
/// configuration says in so many words (warned at every start).
async fn disk_bound(
    config: &Config,
    runtime: &dyn narya_runtimes::Runtime,
    runtime_answers: bool,
) -> Result<Option<Arc<crate::disk::Quotas>>, DaemonError> {
    let Some(bytes) = config.limits.disk.bytes() else {
        tracing::warn!("[limits] disk = \"unbounded\": one environment can fill the host's disk, and with it the database and every other environment");
        return Ok(None);
    };
    let workspaces = config.workspaces_dir();
    std::fs::create_dir_all(&workspaces)
        .map_err(|e| DaemonError::Disk(format!("cannot make {}: {e}", workspaces.display())))?;
    crate::disk::check_bound(&workspaces, runtime_answers.then_some(runtime))
        .await
        .map_err(DaemonError::Disk)?;
    tracing::info!(
        bytes,
        "each environment's disk is bounded by a btrfs quota group"
    );
    Ok(Some(Arc::new(crate::disk::Quotas::new(bytes))))
}

/// Binds TCP `addr`, when one is configured.
async fn bind_tcp(addr: Option<std::net::SocketAddr>) -> Result<Option<TcpListener>, DaemonError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| DaemonError::Tcp { addr, source })?;
    Ok(Some(listener))
}

/// Runs the daemon until SIGTERM/SIGINT, then stops accepting, lets requests and provisioning
/// in flight finish for at most `shutdown_timeout` (what is still provisioning then is recorded
/// as interrupted), removes its socket and returns.
pub async fn run(config: Config) -> Result<(), DaemonError> {
    let mut signals = ShutdownSignals::install()?;
    let notifier = Arc::new(Notifier::from_environment());
    let config = Arc::new(config);
    private_state_dir(&config.state_dir)?;
    let store = Store::open(&config.database_path()).await?;
    let verifier = Arc::new(Verifier::new(&config.identity)?);
    verifier.preload().await;

    let metrics = Metrics::new();
    let runtime: Arc<dyn narya_runtimes::Runtime> = Arc::new(Metered::new(
        crate::backend::connect(&config)?,
        metrics.clone(),
    ));
    if config.environment.network == narya_runtimes::Network::Host {
        tracing::warn!("environment.network = \"host\": environments share the host's network and reach every service on it and each other; for a single-user development host only");
    }
    // A runtime that does not answer yet is waited for (environments read degraded); one that
    // answers but cannot be used stops start-up.
    let runtime_answers = match runtime.version().await {
        Ok(version) => {
            tracing::info!(
                backend = runtime.name(),
                version,
                "container runtime answers"
            );
            true
        }
        Err(e) if e.kind() == narya_runtimes::ErrorKind::Unavailable => {
            tracing::warn!(backend = runtime.name(), error = %e, "container runtime not answering yet; retrying in the background");
            false
        }
        Err(e) => return Err(e.into()),
    };
    let quotas = disk_bound(&config, runtime.as_ref(), runtime_answers).await?;
    let readiness_runtime = runtime.clone();
    // A [github] section whose key is unusable is found at start-up, not at the first clone.
    let github = match &config.github {
        Some(github) => Some(Arc::new(GitHubApp::new(github)?)),
        None => None,
    };
    let organisations = Arc::new(Organisations::new(store.clone(), github));
    let mut environments = Environments::new(
        store.clone(),
        runtime.clone(),
        config.clone(),
        organisations.clone(),
    )
    .with_metrics(metrics.clone());
    if let Some(quotas) = quotas {
        environments = environments.with_disk_bound(quotas);
    }
    let environments = Arc::new(environments);
    environments.mark_interrupted().await?;
    // Clones a previous daemon died during leave their throwaways: removed before serving.
    environments.sweep_throwaways().await;
    let reconciler = tokio::spawn(environments.clone().reconcile_forever());
    // Pool machines stay when the daemon stops: the next start finds them and reuses them.
    let pool = tokio::spawn(environments.clone().keep_pool_forever());
    let cut = CancellationToken::new();
    let state = AppState {
        cut: cut.clone(),
        config: config.clone(),
        verifier,
        environments: environments.clone(),
        organisations,
        metrics: metrics.clone(),
    };
    let router = api::router(state);

    let (unix, owns_socket_file) = unix_listener(&config.listen.socket)?;
    let tcp = bind_tcp(config.listen.tcp).await?;
    let metrics_listener = bind_tcp(config.listen.metrics).await?;

    let limits = transport::Limits {
        header_timeout: config.listen.header_timeout.0,
        idle_timeout: config.listen.idle_timeout.0,
        max_connections: config.listen.max_connections,
    };
    let stop = CancellationToken::new();
    let mut servers = tokio::task::JoinSet::new();
    tracing::info!(socket = %config.listen.socket.display(), "listening on the unix socket");
    let open = |listener| metrics.connections(listener);
    servers.spawn(transport::serve(
        unix,
        router.clone(),
        limits,
        stop.clone(),
        open("unix"),
    ));
    if let Some(tcp) = tcp {
        tracing::info!(addr = %tcp.local_addr().map_err(DaemonError::Serve)?, "listening on TCP");
        servers.spawn(transport::serve(
            tcp,
            router,
            limits,
            stop.clone(),
            open("tcp"),
        ));
    }
    if let Some(listener) = metrics_listener {
        tracing::info!(addr = %listener.local_addr().map_err(DaemonError::Serve)?, "serving metrics (no token) at /metrics");
        let scrape =
            crate::metrics::router(metrics.clone(), store.clone(), config.state_dir.clone());
        servers.spawn(transport::serve(
            listener,
            scrape,
            limits,
            stop.clone(),
            open("metrics"),
        ));
    }
    tracing::info!(backend = ?config.runtime.backend, "naryad ready");
    let readiness = if runtime_answers {
        notifier.notify("READY=1\nSTATUS=serving");
        None
    } else {
        Some(tokio::spawn(notify_ready_when_runtime_answers(
            readiness_runtime,
            notifier.clone(),
        )))
    };

    let mut result = Ok(());
    tokio::select! {
        signal = signals.recv() => {
            tracing::info!(signal, "shutting down: no new requests, finishing those in flight");
        }
        // A listener only ends on a stop, so this one failed.
        Some(ended) = servers.join_next() => {
            tracing::error!("a listener stopped serving on its own; shutting down");
            if let Err(e) = ended {
                result = Err(DaemonError::Listener(e));
            }
        }
    }
    notifier.notify("STOPPING=1\nSTATUS=finishing the requests in flight");
    if let Some(readiness) = readiness {
        readiness.abort();
    }
    stop.cancel();
    // Event streams never end on their own: they end here, so connections can close.
    environments.events().close();
    let finished = tokio::time::timeout(config.shutdown_timeout.0, async {
        while servers.join_next().await.is_some() {}
        reconciler.abort();
        pool.abort();
        tracing::info!("waiting for creates and deletes in flight to record their outcome");
        environments.drain().await;
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            shutdown_timeout = ?config.shutdown_timeout,
            "requests or provisioning still in flight at the shutdown timeout; ending them"
        );
        // Open streams end with a line that says why, after what they had ready; then
        // dropping the listeners' tasks drops whatever connection is left.
        cut.cancel();
        let _ = tokio::time::timeout(CUT_GRACE, async {
            while servers.join_next().await.is_some() {}
        })
        .await;
        servers.shutdown().await;
        reconciler.abort();
        pool.abort();
        // What is still provisioning will not finish: say so now rather than at the next start.
        if let Err(e) = environments.mark_interrupted().await {
            tracing::error!(error = %e, "could not record the creates still provisioning as interrupted");
        }
    }
    // The network's chains go with the last machine; with machines left they stay.
    if let Err(e) = runtime.shutdown().await {
        tracing::warn!(error = %e, "could not release the isolated network");
    }
    // A socket systemd passed stays systemd's: it keeps listening for the next start.
    if owns_socket_file {
        if let Err(e) = std::fs::remove_file(&config.listen.socket) {
            tracing::warn!(error = %e, "could not remove the socket file");
        }
    }
    store.close().await;
    tracing::info!("naryad stopped");
    result
}
