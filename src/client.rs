//! A small HTTP/1.1 client for the daemon's API over its unix socket or TCP.

use std::path::PathBuf;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixStream};

use crate::api::ErrorBody;

/// Where the daemon listens.
#[derive(Clone, Debug)]
pub enum Endpoint {
    Unix(PathBuf),
    /// `host:port`, from a `http://host:port` URL.
    Tcp(String),
}

impl Endpoint {
    /// Parses `http://HOST:PORT` (a trailing `/` allowed); other schemes are refused.
    pub fn from_url(url: &str) -> Result<Endpoint, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url:?}: only http://HOST:PORT URLs are supported"))?;
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(format!("{url:?}: give http://HOST:PORT without a path"));
        }
        Ok(Endpoint::Tcp(authority.to_owned()))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "http://{a}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach naryad at {endpoint}: {reason}")]
    Connect { endpoint: String, reason: String },
    #[error("talking to naryad at {endpoint} failed: {reason}")]
    Http { endpoint: String, reason: String },
}

/// An answer, whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The error body, when the answer is one.
    pub fn error(&self) -> Option<ErrorBody> {
        if self.status.is_success() {
            return None;
        }
        serde_json::from_slice(&self.body).ok()
    }
}

/// An answer whose body is read line by line as it arrives.
pub struct Streamed {
    pub status: StatusCode,
    /// Whether the daemon answered with an NDJSON stream (errors come as plain JSON).
    pub streaming: bool,
    body: hyper::body::Incoming,
    buffer: Vec<u8>,
    endpoint: String,
}

impl Streamed {
    /// The next line without its newline; `None` at the end.
    pub async fn next_line(&mut self) -> Result<Option<String>, ClientError> {
        loop {
            if let Some(at) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=at).collect();
                return Ok(Some(String::from_utf8_lossy(&line[..at]).into_owned()));
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    return Err(ClientError::Http {
                        endpoint: self.endpoint.clone(),
                        reason: e.to_string(),
                    })
                }
                None if self.buffer.is_empty() => return Ok(None),
                None => {
                    let rest = std::mem::take(&mut self.buffer);
                    return Ok(Some(String::from_utf8_lossy(&rest).into_owned()));
                }
            }
        }
    }

    /// Everything left, as one body (for plain JSON answers).
    pub async fn rest(mut self) -> Result<Bytes, ClientError> {
        let mut all = std::mem::take(&mut self.buffer);
        while let Some(frame) = self.body.frame().await {
            let frame = frame.map_err(|e| ClientError::Http {
                endpoint: self.endpoint.clone(),
                reason: e.to_string(),
            })?;
            if let Ok(data) = frame.into_data() {
                all.extend_from_slice(&data);
            }
        }
        Ok(Bytes::from(all))
    }
}

#[derive(Clone, Debug)]
pub struct Client {
    endpoint: Endpoint,
    token: Option<String>,
}

impl Client {
    pub fn new(endpoint: Endpoint, token: Option<String>) -> Client {
        Client { endpoint, token }
    }

    /// Sends one request on a fresh connection and reads the whole answer.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, ClientError> {
        let response = self.open(method, path, body, None).await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| self.http_error(e))?
            .to_bytes();
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// Sends `value` as a JSON body asking for an NDJSON stream; the answer's lines can be read
    /// as they arrive.
    pub async fn stream_json(
        &self,
        method: Method,
        path: &str,
        value: &serde_json::Value,
    ) -> Result<Streamed, ClientError> {
        let body = serde_json::to_vec(value).map_err(|e| self.http_error(e))?;
        let response = self
            .open(method, path, Some(body), Some("application/x-ndjson"))
            .await?;
        let status = response.status();
        let streaming = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-ndjson"));
        Ok(Streamed {
            status,
            streaming,
            body: response.into_body(),
            buffer: Vec::new(),
            endpoint: self.endpoint.to_string(),
        })
    }

    async fn open(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        accept: Option<&str>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let mut request = Request::builder().method(method).uri(path);
        request = match &self.endpoint {
            Endpoint::Unix(_) => request.header("host", "naryad"),
            Endpoint::Tcp(authority) => request.header("host", authority.as_str()),
        };
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| self.http_error(e))?;
        match &self.endpoint {
            Endpoint::Unix(path) => {
                let stream = UnixStream::connect(path)
                    .await
                    .map_err(|e| self.connect_error(e))?;
                self.exchange(stream, request).await
            }
            Endpoint::Tcp(authority) => {
                let stream = TcpStream::connect(authority.as_str())
                    .await
                    .map_err(|e| self.connect_error(e))?;
                self.exchange(stream, request).await
            }
        }
    }

    /// Sends `value` as a JSON body.
    pub async fn send_json(
        &self,
        method: Method,
        path: &str,
        value: &serde_json::Value,
    ) -> Result<Answer, ClientError> {
        let body = serde_json::to_vec(value).map_err(|e| self.http_error(e))?;
        self.send(method, path, Some(body)).await
    }

    async fn exchange<S>(
        &self,
        stream: S,
        request: Request<Full<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.http_error(e))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        sender
            .send_request(request)
            .await
            .map_err(|e| self.http_error(e))
    }

    fn connect_error(&self, e: impl std::fmt::Display) -> ClientError {
        ClientError::Connect {
            endpoint: self.endpoint.to_string(),
            reason: e.to_string(),
        }
    }

    fn http_error(&self, e: impl std::fmt::Display) -> ClientError {
        ClientError::Http {
            endpoint: self.endpoint.to_string(),
            reason: e.to_string(),
        }
    }
}
