//! The Docker back end against a double of the engine's API on a unix socket, for what the real
//! engines in the matrix cannot show: an engine newer than any in Debian (Docker 29 refuses
//! every API version below 1.44) and one older than the oldest we accept (API 1.41).

use std::path::Path;
use std::sync::{Arc, Mutex};

use narya_runtimes::docker::{Docker, DockerConfig};
use narya_runtimes::{Runtime, Sandbox};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

/// An engine that answers `/version` as `version` with `api`, refusing (as Docker 29 does) any
/// path that asks for an API version below `min_api`; it records every path asked.
struct Engine {
    paths: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
}

fn minor(api: &str) -> u32 {
    api.rsplit('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

impl Engine {
    fn start(version: &'static str, api: &'static str, min_api: &'static str) -> Engine {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("docker.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let paths = Arc::new(Mutex::new(Vec::new()));
        let seen = paths.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => break,
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                seen.lock().unwrap().push(path.clone());
                let asked = path
                    .strip_prefix("/v")
                    .filter(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
                    .and_then(|rest| rest.split('/').next())
                    .map(str::to_owned);
                let (status, body) = match asked {
                    Some(asked) if minor(&asked) < minor(min_api) => (
                        "400 Bad Request",
                        format!(
                            "{{\"message\":\"client version {asked} is too old. Minimum supported \
                             API version is {min_api}, please upgrade your client to a newer \
                             version\"}}"
                        ),
                    ),
                    _ if path.ends_with("/version") => (
                        "200 OK",
                        format!(
                            "{{\"Version\":\"{version}\",\"ApiVersion\":\"{api}\",\
                             \"MinAPIVersion\":\"{min_api}\",\"Os\":\"linux\",\
                             \"Components\":[{{\"Name\":\"Engine\",\"Version\":\"{version}\"}}]}}"
                        ),
                    ),
                    _ => (
                        "404 Not Found",
                        "{\"message\":\"page not found\"}".to_owned(),
                    ),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            }
        });
        Engine {
            paths,
            _dir: dir,
            socket,
        }
    }

    fn back_end(&self, scratch: &Path) -> Docker {
        Docker::new(DockerConfig {
            socket: self.socket.clone(),
            insecure_registries: Vec::new(),
            network: None,
            profile_dir: scratch.join("profiles"),
            sandbox: Sandbox::Container,
        })
        .unwrap()
    }
}

/// Docker 29 refuses API versions below 1.44 on versioned paths; the client sends its paths
/// unversioned, so the engine answers in its own API and the back end takes it.
#[tokio::test]
async fn an_engine_that_refuses_old_api_versions_is_answered_in_its_own() {
    let engine = Engine::start("29.0.0", "1.52", "1.44");
    let scratch = tempfile::tempdir().unwrap();
    let version = engine.back_end(scratch.path()).version().await;
    let paths = engine.paths.lock().unwrap().clone();
    assert_eq!(
        version.as_deref().ok(),
        Some("Docker Engine 29.0.0 (API 1.52)"),
        "{version:?}; asked {paths:?}"
    );
    assert!(
        paths.iter().all(|p| !p.starts_with("/v1.")),
        "the client asked for an API version: {paths:?}"
    );
}

/// An engine whose API is older than 1.41 (Docker 20.10) is refused, naming what is needed.
#[tokio::test]
async fn an_engine_older_than_api_1_41_is_refused_naming_the_oldest_accepted() {
    let engine = Engine::start("19.03.15", "1.40", "1.12");
    let scratch = tempfile::tempdir().unwrap();
    let refused = engine.back_end(scratch.path()).version().await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("speaks API \"1.40\"") && message.contains("API 1.41 or newer"),
        "{message:?}"
    );
}
