//! The connection to the Docker engine: one client on the unix socket, made on first use and only
//! after the engine's API version was checked, and bollard's errors classified into our kinds.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use bollard::errors::Error as EngineError;
use bollard::models::ContainerWaitResponse;
use bollard::{ClientVersion, Docker as Client};

use crate::{ErrorKind, Result, RuntimeError};

/// The API version we speak and the oldest engine we accept: Docker 20.10 (Debian bookworm).
const API: ClientVersion = ClientVersion {
    major_version: 1,
    minor_version: 41,
};

/// Bounds a request until its response head arrives; streams are bounded by their callers.
const REQUEST_TIMEOUT_SECS: u64 = 120;

pub(super) struct Engine {
    socket: PathBuf,
    /// Set once the engine answered and its version was acceptable, so a daemon started before
    /// the engine (or pointed at a dead socket) keeps trying instead of failing for good.
    client: OnceLock<Client>,
    /// Whether the engine is Podman's Docker-compatible service, known with the client.
    podman: OnceLock<bool>,
}

impl Engine {
    pub(super) fn new(socket: &Path) -> Engine {
        Engine {
            socket: socket.to_owned(),
            client: OnceLock::new(),
            podman: OnceLock::new(),
        }
    }

    /// The client, after the engine's version was checked once.
    pub(super) async fn client(&self) -> Result<&Client> {
        if self.client.get().is_none() {
            self.version().await?;
        }
        self.client.get().ok_or_else(|| {
            RuntimeError::plain(
                ErrorKind::Other,
                "docker: the engine client was not kept after its check",
            )
        })
    }

    /// The engine's unix socket, for the requests the client does not make.
    pub(super) fn socket(&self) -> &Path {
        &self.socket
    }

    /// Whether the engine is Podman (which reads some options differently).
    pub(super) async fn is_podman(&self) -> Result<bool> {
        self.client().await?;
        Ok(self.podman.get().copied().unwrap_or(false))
    }

    /// Asks the engine for its version and refuses engines below API 1.41.
    pub(super) async fn version(&self) -> Result<String> {
        let client = match self.client.get() {
            Some(client) => client.clone(),
            None => self.connect()?,
        };
        let version = match client.version().await {
            Ok(v) => v,
            // bollard sends its paths unversioned, so every engine answers in its own API
            // (Docker 29 too, which refuses versioned paths below 1.44: tests/docker_api.rs);
            // a 400 here is an engine refusing the client for a reason of its own.
            Err(EngineError::DockerResponseServerError {
                status_code: 400,
                message,
            }) => {
                return Err(RuntimeError::plain(
                    ErrorKind::Other,
                    format!(
                    "docker: the engine on {} refuses API {}.{} ({message}); Narya needs Docker \
                     Engine API {}.{} or newer (Docker 20.10 or later)",
                    self.socket.display(),
                    API.major_version,
                    API.minor_version,
                    API.major_version,
                    API.minor_version
                ),
                ))
            }
            Err(e) => return Err(classify("asking for the engine's version", e)),
        };
        let api = version.api_version.clone().unwrap_or_default();
        if !supported(&api) {
            return Err(RuntimeError::plain(
                ErrorKind::Other,
                format!(
                "docker: the engine on {} speaks API {api:?}; Narya needs Docker Engine API {}.{} \
                 or newer (Docker 20.10 or later)",
                self.socket.display(),
                API.major_version,
                API.minor_version
            ),
            ));
        }
        let podman = version
            .components
            .iter()
            .flatten()
            .any(|c| c.name.contains("Podman"));
        let _ = self.podman.set(podman);
        let _ = self.client.set(client);
        let engine = if podman { "Podman" } else { "Docker Engine" };
        Ok(format!(
            "{engine} {} (API {api})",
            version.version.unwrap_or_default()
        ))
    }

    /// Refuses an engine that has no OCI runtime registered as `name`, and a Podman whose
    /// default runtime is not `name`: Podman's API ignores a container's own `oci_runtime`
    /// (Podman issue 28429: 4.3 to 5.8; fixed in 6, which needs cgroup v2), so only its default
    /// can be relied on. Each container Podman makes is checked again (`libpod::create`).
    pub(super) async fn check_runtime(&self, name: &str) -> Result<()> {
        let info = self
            .client()
            .await?
            .info()
            .await
            .map_err(|e| classify("asking for the engine's runtimes", e))?;
        let socket = self.socket.display();
        let runtimes = info.runtimes.unwrap_or_default();
        if !runtimes.contains_key(name) {
            let mut known: Vec<&String> = runtimes.keys().collect();
            known.sort();
            return Err(RuntimeError::plain(
                ErrorKind::Other,
                format!(
                    "docker: the engine on {socket} has no runtime {name:?} (it has {known:?}), \
                     which [runtime] sandbox = \"gvisor\" needs: install {}, and register \
                     /usr/libexec/narya/runsc (the Debian package's copy of \
                     contrib/runsc/narya-runsc) with the engine as {name:?} (dockerd: \
                     \"runtimes\" in /etc/docker/daemon.json; Podman: [engine.runtimes] in \
                     containers.conf)",
                    crate::sandbox::RUNSC_PACKAGE,
                ),
            ));
        }
        let default = info.default_runtime.unwrap_or_default();
        if self.is_podman().await? && default != name {
            return Err(RuntimeError::plain(
                ErrorKind::Other,
                format!(
                    "docker: Podman on {socket} runs containers under {default:?} by default, \
                     and its API ignores the runtime a container asks for (Podman issue 28429): \
                     for [runtime] sandbox = \"gvisor\" make {name:?} its default (`runtime = \
                     {name:?}` under [engine] in its containers.conf)"
                ),
            ));
        }
        Ok(())
    }

    fn connect(&self) -> Result<Client> {
        let path = self.socket.to_str().ok_or_else(|| {
            RuntimeError::plain(
                ErrorKind::Other,
                format!(
                    "docker: the socket path {} is not UTF-8",
                    self.socket.display()
                ),
            )
        })?;
        Client::connect_with_unix(path, REQUEST_TIMEOUT_SECS, &API)
            .map_err(|e| classify(&format!("connecting to {path}"), e))
    }
}

/// Whether an engine API version such as `1.41` is at least the one we speak.
fn supported(api: &str) -> bool {
    let mut parts = api.split('.').map(str::parse::<usize>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => {
            (major, minor) >= (API.major_version, API.minor_version)
        }
        _ => false,
    }
}

/// Classifies an engine error into our kinds, saying what we were doing. The one place that
/// knows which of bollard's errors mean what.
pub(super) fn classify(what: &str, error: EngineError) -> RuntimeError {
    let kind = match &error {
        EngineError::DockerResponseServerError {
            status_code: 404, ..
        } => ErrorKind::NotFound,
        EngineError::DockerResponseServerError {
            status_code: 409, ..
        } => ErrorKind::AlreadyExists,
        // Podman answers a name in use with 500 and these words, where Docker answers 409.
        EngineError::DockerResponseServerError {
            status_code: 500,
            message,
        } if message.contains("is already in use") => ErrorKind::AlreadyExists,
        // … and an image it does not have with 500 where Docker answers 404.
        EngineError::DockerResponseServerError {
            status_code: 500,
            message,
        } if message.contains("image not known") || message.contains("no such image") => {
            ErrorKind::NotFound
        }
        // … and an exec it forgot (with its container, stopped under it) with 500 too.
        EngineError::DockerResponseServerError {
            status_code: 500,
            message,
        } if message.contains("no such exec session") => ErrorKind::NotFound,
        // The engine itself saying it cannot serve now (e.g. shutting down).
        EngineError::DockerResponseServerError {
            status_code: 503, ..
        } => ErrorKind::Unavailable,
        // Nobody listening, a connection refused or dropped, or no answer in time: the engine
        // is not answering, which is a reason to retry later, never a verdict on a machine.
        EngineError::SocketNotFoundError(_)
        | EngineError::HyperLegacyError { .. }
        | EngineError::HyperResponseError { .. }
        | EngineError::IOError { .. }
        | EngineError::RequestTimeoutError => ErrorKind::Unavailable,
        _ => ErrorKind::Other,
    };
    RuntimeError::caused(kind, format!("docker: {what}"), error)
}

/// What the engine answered, or `None` when it answered 404: the thing asked about is not there,
/// which is an answer to the caller, not a failure.
pub(super) fn found<T>(what: &str, answer: Result<T, EngineError>) -> Result<Option<T>> {
    match answer {
        Ok(value) => Ok(Some(value)),
        Err(e) => match classify(what, e) {
            e if e.kind() == ErrorKind::NotFound => Ok(None),
            other => Err(other),
        },
    }
}

/// The exit code a container wait reported, if it reported one: bollard turns a non-zero exit
/// into an error carrying the code, which is no failure of ours.
pub(super) fn wait_outcome(
    waited: Option<Result<ContainerWaitResponse, EngineError>>,
) -> Result<Option<i64>, EngineError> {
    match waited {
        Some(Ok(answer)) => Ok(Some(answer.status_code)),
        Some(Err(EngineError::DockerContainerWaitError { code, .. })) => Ok(Some(code)),
        Some(Err(e)) => Err(e),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_versions_below_1_41_are_refused() {
        assert!(supported("1.41"));
        assert!(supported("1.47"));
        assert!(supported("2.0"));
        assert!(!supported("1.40"));
        assert!(!supported("1.9"));
        assert!(!supported(""));
        assert!(!supported("one.41"));
    }

    #[test]
    fn an_answer_of_404_is_found_to_be_missing() {
        let missing = EngineError::DockerResponseServerError {
            status_code: 404,
            message: "no such container".into(),
        };
        assert!(matches!(found("x", Err::<(), _>(missing)), Ok(None)));
        assert!(matches!(found("x", Ok(1)), Ok(Some(1))));
        let down = found::<()>("x", Err(EngineError::RequestTimeoutError));
        assert_eq!(
            down.map_err(|e| e.kind()).err(),
            Some(ErrorKind::Unavailable)
        );
    }

    #[test]
    fn engine_failures_keep_their_source() {
        let e = classify("looking up machine m", EngineError::RequestTimeoutError);
        assert_eq!(
            e.to_string(),
            format!(
                "docker: looking up machine m: {}",
                EngineError::RequestTimeoutError
            )
        );
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<EngineError>());
        assert!(matches!(source, Some(EngineError::RequestTimeoutError)));
    }

    #[test]
    fn engine_answers_are_classified() {
        let answer = |status_code| EngineError::DockerResponseServerError {
            status_code,
            message: "m".into(),
        };
        assert!(matches!(
            classify("x", answer(404)),
            RuntimeError::NotFound { .. }
        ));
        assert!(matches!(
            classify("x", answer(409)),
            RuntimeError::AlreadyExists { .. }
        ));
        assert!(matches!(
            classify("x", answer(500)),
            RuntimeError::Other { .. }
        ));
        // Podman's words for what Docker answers 404 and 409 to.
        let podman = |message: &str| EngineError::DockerResponseServerError {
            status_code: 500,
            message: message.into(),
        };
        let forgotten = "retrieving exec session 1124a0 from container fceec3: no exec session \
                         with ID 1124a0 found in container fceec3: no such exec session";
        assert!(matches!(
            classify("x", podman(forgotten)),
            RuntimeError::NotFound { .. }
        ));
        assert!(matches!(
            classify("x", podman("42: image not known")),
            RuntimeError::NotFound { .. }
        ));
        assert!(matches!(
            classify(
                "x",
                podman("the container name \"m\" is already in use by 42")
            ),
            RuntimeError::AlreadyExists { .. }
        ));
        assert!(matches!(
            classify("x", EngineError::SocketNotFoundError("/nowhere".into())),
            RuntimeError::Unavailable { .. }
        ));
        assert!(matches!(
            classify("x", EngineError::RequestTimeoutError),
            RuntimeError::Unavailable { .. }
        ));
    }

    /// An engine on a unix socket that answers every request with `status` and `body`.
    fn fake_engine(dir: &Path, status: &'static str, body: &'static str) -> PathBuf {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let socket = dir.join("engine.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = vec![0u8; 4096];
                let _ = stream.read(&mut request).await;
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        socket
    }

    #[tokio::test]
    async fn an_engine_refusing_api_1_41_is_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let socket = fake_engine(
            dir.path(),
            "400 Bad Request",
            r#"{"message":"client version 1.41 is too new. Maximum supported API version is 1.40"}"#,
        );
        let engine = Engine::new(&socket);
        match engine.version().await {
            Err(e @ RuntimeError::Other { .. }) => {
                assert!(
                    e.to_string().contains("needs Docker Engine API 1.41"),
                    "{e}"
                )
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(
            engine.client().await.is_err(),
            "a refused engine is never used"
        );
    }

    #[tokio::test]
    async fn an_engine_reporting_an_older_api_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let socket = fake_engine(
            dir.path(),
            "200 OK",
            r#"{"Version":"19.03.15","ApiVersion":"1.40"}"#,
        );
        match Engine::new(&socket).version().await {
            Err(e @ RuntimeError::Other { .. }) => {
                assert!(e.to_string().contains("speaks API \"1.40\""), "{e}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn nobody_on_the_socket_is_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::new(&dir.path().join("nobody.sock"));
        assert!(matches!(
            engine.version().await,
            Err(RuntimeError::Unavailable { .. })
        ));
        // A socket file nobody listens on: refused, also Unavailable.
        let socket = dir.path().join("dead.sock");
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        assert!(matches!(
            Engine::new(&socket).client().await,
            Err(RuntimeError::Unavailable { .. })
        ));
    }
}
