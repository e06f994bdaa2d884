//! The raw HTTP/1.1 exchange underneath the typed calls: one request per connection.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::{TcpStream, UnixStream};

use super::{Client, ClientError, Endpoint};
use crate::api::ErrorBody;

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

    /// The answer when it is a success; otherwise the daemon's error.
    pub(super) fn success(self) -> Result<Answer, ClientError> {
        if self.status.is_success() {
            return Ok(self);
        }
        Err(match self.error() {
            Some(error) => ClientError::Api {
                status: self.status,
                error,
            },
            None => ClientError::Unexpected {
                status: self.status,
                body: String::from_utf8_lossy(&self.body).into_owned(),
            },
        })
    }

    /// The body read as the operation's answer, `expected` naming it for the error.
    pub(super) fn decode<T: DeserializeOwned>(
        &self,
        expected: &'static str,
    ) -> Result<T, ClientError> {
        serde_json::from_slice(&self.body)
            .map_err(|source| ClientError::Decode { expected, source })
    }
}

/// An answer whose body is read line by line as it arrives.
pub struct Streamed {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
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

    /// The next line read as JSON; `None` at the end.
    pub(super) async fn next_json(&mut self) -> Result<Option<serde_json::Value>, ClientError> {
        let Some(line) = self.next_line().await? else {
            return Ok(None);
        };
        match serde_json::from_str(&line) {
            Ok(value) => Ok(Some(value)),
            Err(source) => Err(ClientError::NotJson { line, source }),
        }
    }

    /// The answer when the daemon streams it; otherwise (an error found before anything started,
    /// answered as plain JSON) the daemon's error.
    pub(super) async fn into_stream(self) -> Result<Streamed, ClientError> {
        if self.streaming {
            return Ok(self);
        }
        let status = self.status;
        let body = self.rest().await?;
        let answer = Answer {
            status,
            headers: Default::default(),
            body,
        };
        // A plain success to a streamed request is no stream either.
        let answer = answer.success()?;
        Err(ClientError::Unexpected {
            status,
            body: String::from_utf8_lossy(&answer.body).into_owned(),
        })
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

/// The raw requests underneath, public for what the typed methods cannot say (tests send
/// malformed bodies and unknown routes).
impl Client {
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
    pub async fn stream_json<T: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        value: &T,
    ) -> Result<Streamed, ClientError> {
        let body = serde_json::to_vec(value).map_err(|e| self.http_error(e))?;
        self.stream(method, path, Some(body)).await
    }

    /// Sends a request asking for an NDJSON stream; the answer's lines can be read as they
    /// arrive.
    pub async fn stream(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Streamed, ClientError> {
        let response = self
            .open(method, path, body, Some("application/x-ndjson"))
            .await?;
        let status = response.status();
        let streaming = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-ndjson"));
        Ok(Streamed {
            status,
            headers: response.headers().clone(),
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
    pub async fn send_json<T: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        value: &T,
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
