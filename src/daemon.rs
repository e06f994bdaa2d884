//! The daemon's life: open the store, bind the listeners, serve one router, shut down cleanly.

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
use crate::organisation::Organisations;
use crate::store::{Store, StoreError};

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
    #[error("cannot listen on TCP {addr}: {source}")]
    Tcp {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
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

/// Resolves when SIGTERM or SIGINT arrives.
async fn shutdown_signal() -> Result<&'static str, DaemonError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

/// Runs the daemon until SIGTERM/SIGINT, then stops accepting, lets requests and provisioning
/// in flight finish for at most `shutdown_timeout` (what is still provisioning then is recorded
/// as interrupted), removes its socket and returns.
pub async fn run(config: Config) -> Result<(), DaemonError> {
    let config = Arc::new(config);
    private_state_dir(&config.state_dir)?;
    let store = Store::open(&config.database_path()).await?;
    let verifier = Arc::new(Verifier::new(&config.identity)?);
    verifier.preload().await;

    let runtime = crate::backend::connect(&config)?;
    if config.environment.network == narya_runtimes::Network::Host {
        tracing::warn!("environment.network = \"host\": environments share the host's network and reach every service on it and each other; for a single-user development host only");
    }
    // A runtime that does not answer yet is waited for (environments read degraded); one that
    // answers but cannot be used stops start-up.
    match runtime.version().await {
        Ok(version) => tracing::info!(
            backend = runtime.name(),
            version,
            "container runtime answers"
        ),
        Err(e) if e.kind() == narya_runtimes::ErrorKind::Unavailable => {
            tracing::warn!(backend = runtime.name(), error = %e, "container runtime not answering yet; retrying in the background")
        }
        Err(e) => return Err(e.into()),
    }
    // A [github] section whose key is unusable is found at start-up, not at the first clone.
    let github = match &config.github {
        Some(github) => Some(Arc::new(GitHubApp::new(github)?)),
        None => None,
    };
    let organisations = Arc::new(Organisations::new(store.clone(), github));
    let environments = Arc::new(Environments::new(
        store.clone(),
        runtime.clone(),
        config.clone(),
        organisations.clone(),
    ));
    environments.mark_interrupted().await?;
    let reconciler = tokio::spawn(environments.clone().reconcile_forever());
    let state = AppState {
        config: config.clone(),
        verifier,
        environments: environments.clone(),
        organisations,
    };
    let router = api::router(state);

    let unix = bind_unix_socket(&config.listen.socket)?;
    let tcp = match config.listen.tcp {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| DaemonError::Tcp { addr, source })?,
        ),
        None => None,
    };

    let limits = transport::Limits {
        header_timeout: config.listen.header_timeout.0,
        idle_timeout: config.listen.idle_timeout.0,
        max_connections: config.listen.max_connections,
    };
    let stop = CancellationToken::new();
    let mut servers = tokio::task::JoinSet::new();
    tracing::info!(socket = %config.listen.socket.display(), "listening on the unix socket");
    servers.spawn(transport::serve(unix, router.clone(), limits, stop.clone()));
    if let Some(tcp) = tcp {
        tracing::info!(addr = %tcp.local_addr().map_err(DaemonError::Serve)?, "listening on TCP");
        servers.spawn(transport::serve(tcp, router, limits, stop.clone()));
    }
    tracing::info!(backend = ?config.runtime.backend, "naryad ready");

    let mut result = Ok(());
    tokio::select! {
        signal = shutdown_signal() => {
            let signal = signal?;
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
    stop.cancel();
    let finished = tokio::time::timeout(config.shutdown_timeout.0, async {
        while servers.join_next().await.is_some() {}
        reconciler.abort();
        tracing::info!("waiting for creates and deletes in flight to record their outcome");
        environments.drain().await;
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            shutdown_timeout = ?config.shutdown_timeout,
            "requests or provisioning still in flight at the shutdown timeout; ending them"
        );
        // Dropping the listeners' tasks drops their connections, streams included.
        servers.shutdown().await;
        reconciler.abort();
        // What is still provisioning will not finish: say so now rather than at the next start.
        if let Err(e) = environments.mark_interrupted().await {
            tracing::error!(error = %e, "could not record the creates still provisioning as interrupted");
        }
    }
    // The network's chains go with the last machine; with machines left they stay.
    if let Err(e) = runtime.shutdown().await {
        tracing::warn!(error = %e, "could not release the isolated network");
    }
    if let Err(e) = std::fs::remove_file(&config.listen.socket) {
        tracing::warn!(error = %e, "could not remove the socket file");
    }
    store.close().await;
    tracing::info!("naryad stopped");
    result
}
