//! Podman's own API (`/libpod/…`), for what its Docker-compatible service cannot be asked:
//! containers with a private cgroup namespace ([`container`]) and networks without Podman's
//! DNS ([`network`]). The requests are the ones made for Docker, translated field by field; a
//! field a translation does not know fails the request rather than being lost. A container
//! made with a runtime asked for is checked to run under it ([`runtime_check`]).

mod container;
mod network;
mod runtime_check;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::ErrorKind;

pub(super) use container::create;
pub(super) use network::{create_network, network_dns_enabled};

/// Podman 4 and later serve this version of their own API.
const API: &str = "/v4.0.0/libpod";

/// Bounds each request, as the engine client bounds its requests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
enum LibpodError {
    #[error("the request sets what Podman's own API is not given here: {0}")]
    Untranslated(String),
    #[error("encoding the request: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("connecting to the engine: {0}")]
    Connect(#[source] std::io::Error),
    #[error("building the request: {0}")]
    Request(#[source] hyper::http::Error),
    #[error("talking to the engine: {0}")]
    Http(#[source] hyper::Error),
    #[error("no answer within {} s", REQUEST_TIMEOUT.as_secs())]
    Timeout,
    #[error("the engine answered {status}: {message}")]
    Answer { status: u16, message: String },
    #[error("the engine's answer is not {0}: {1}")]
    Decode(&'static str, #[source] serde_json::Error),
    #[error(
        "Podman made the container under {}, not the runtime {asked:?} it asked for, and {}: \
         Podman up to 5.8 ignores the runtime a container asks for (Podman issue 28429); make \
         {asked:?} its default (`runtime = {asked:?}` under [engine] in its containers.conf) \
         and restart it",
        made_under.as_deref().map_or("a runtime it did not say".to_owned(), |r| format!("{r:?}")),
        removal(*removed)
    )]
    WrongRuntime {
        asked: String,
        made_under: Option<String>,
        removed: bool,
    },
    #[error(
        "could not confirm that Podman made the container under the runtime {asked:?}, and {}: \
         {cause}",
        removal(*removed)
    )]
    Unconfirmed {
        asked: String,
        removed: bool,
        /// In the message rather than as a source: the chain would say it twice.
        cause: Box<LibpodError>,
    },
}

/// What became of a container made under another runtime than asked, for the error's message.
fn removal(removed: bool) -> &'static str {
    if removed {
        "it was removed"
    } else {
        "removing it failed too (see the log)"
    }
}

impl LibpodError {
    /// The kind, as `engine::classify` has it for the same answers of the compatible API.
    fn kind(&self) -> ErrorKind {
        match self {
            LibpodError::Answer { status: 404, .. } => ErrorKind::NotFound,
            LibpodError::Answer { status: 409, .. } => ErrorKind::AlreadyExists,
            LibpodError::Answer {
                status: 500,
                message,
            } if message.contains("is already in use") => ErrorKind::AlreadyExists,
            LibpodError::Answer {
                status: 500,
                message,
            } if message.contains("image not known") || message.contains("no such image") => {
                ErrorKind::NotFound
            }
            LibpodError::Unconfirmed { cause, .. } => cause.kind(),
            LibpodError::Answer { status: 503, .. }
            | LibpodError::Connect(_)
            | LibpodError::Http(_)
            | LibpodError::Timeout => ErrorKind::Unavailable,
            _ => ErrorKind::Other,
        }
    }
}

/// `method` on `API` + `path` (with `body` as JSON), on a connection of its own, within
/// [`REQUEST_TIMEOUT`]; the answer's status and body.
async fn request(
    socket: &Path,
    method: hyper::Method,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Bytes), LibpodError> {
    let body = match body {
        Some(value) => Bytes::from(serde_json::to_vec(value).map_err(LibpodError::Encode)?),
        None => Bytes::new(),
    };
    let uri = format!("{API}{path}");
    tokio::time::timeout(REQUEST_TIMEOUT, send(socket, method, &uri, body))
        .await
        .map_err(|_| LibpodError::Timeout)?
}

async fn send(
    socket: &Path,
    method: hyper::Method,
    uri: &str,
    body: Bytes,
) -> Result<(u16, Bytes), LibpodError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(LibpodError::Connect)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(LibpodError::Http)?;
    let driver = tokio::spawn(connection);
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(uri)
        .header(hyper::header::HOST, "podman");
    if !body.is_empty() {
        request = request.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(Full::new(body))
        .map_err(LibpodError::Request)?;
    let answer = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(LibpodError::Http)?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(LibpodError::Http)?
            .to_bytes();
        Ok((status, body))
    }
    .await;
    driver.abort();
    answer
}

/// The body of an answer of status `ok`, or the error an answer of any other status carries.
fn expect(ok: u16, (status, body): (u16, Bytes)) -> Result<Bytes, LibpodError> {
    if status == ok {
        return Ok(body);
    }
    let message = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
    Err(LibpodError::Answer { status, message })
}

/// The fields `value` still sets (serialised as the Docker API names them).
fn untranslated(value: &impl serde::Serialize) -> Result<Vec<String>, LibpodError> {
    let value = serde_json::to_value(value).map_err(LibpodError::Encode)?;
    Ok(value
        .as_object()
        .map(|fields| {
            fields
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default())
}
