//! The daemon's API as typed calls, over HTTP/1.1 on its unix socket or TCP.

mod http;
mod stream;

use std::path::PathBuf;

use hyper::{Method, StatusCode};

use crate::api::routes;
use crate::api::types::{
    ConnectGitHubBody, CreateBody, EnvironmentList, EnvironmentView, ExecBody, ExecResult,
};
use crate::api::ErrorBody;
pub use http::{Answer, Streamed};
pub use stream::{
    CreateEvent, CreateStream, ExecEvent, ExecExit, ExecStream, StepState, WatchEvent, WatchStream,
};

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
    /// The daemon refused the request: the answer's status and its error body.
    #[error("naryad answered {status}: {} {}", error.code, error.message)]
    Api {
        status: StatusCode,
        error: ErrorBody,
    },
    /// A streamed request failed after its stream began with a success status.
    #[error("naryad's stream ended with {} {}", error.code, error.message)]
    Failed { error: ErrorBody },
    /// An answer that is neither what was asked for nor an error body (not naryad, or a proxy).
    #[error("the daemon answered {status} with {body}")]
    Unexpected { status: StatusCode, body: String },
    #[error("the daemon's answer is not {expected}")]
    Decode {
        expected: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("the daemon sent a line that is not JSON: {line:?}")]
    NotJson {
        line: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A create's answer, whole.
#[derive(Debug)]
pub struct Created {
    /// 201 when it was provisioned now, 200 when it already existed.
    pub status: StatusCode,
    /// What the existing environment was made with that the request differs in, if anything.
    pub differs: Option<String>,
    pub environment: EnvironmentView,
}

impl Created {
    /// Whether the environment existed before: nothing was provisioned, no setup ran.
    pub fn existed(&self) -> bool {
        self.status == StatusCode::OK
    }
}

/// The `Narya-Create-Differs` header of a create's answer: what the existing environment was
/// made with that the request differs in.
fn differs(headers: &hyper::HeaderMap) -> Option<&str> {
    headers
        .get(crate::api::CREATE_DIFFERS)
        .and_then(|v| v.to_str().ok())
}

#[derive(Clone, Debug)]
pub struct Client {
    endpoint: Endpoint,
    token: Option<String>,
}

/// The API's operations, one method each. A refusal is `ClientError::Api`.
impl Client {
    pub fn new(endpoint: Endpoint, token: Option<String>) -> Client {
        Client { endpoint, token }
    }

    /// Provisions an environment, answering when it is over (a repeat answers the existing one).
    pub async fn create(&self, body: &CreateBody) -> Result<Created, ClientError> {
        let answer = self
            .send_json(Method::POST, routes::ENVIRONMENTS, body)
            .await?
            .success()?;
        Ok(Created {
            status: answer.status,
            differs: differs(&answer.headers).map(str::to_owned),
            environment: answer.decode("an environment")?,
        })
    }

    /// Provisions an environment, its progress read as it happens.
    pub async fn create_streamed(&self, body: &CreateBody) -> Result<CreateStream, ClientError> {
        let lines = self
            .stream_json(Method::POST, routes::ENVIRONMENTS, body)
            .await?;
        Ok(CreateStream {
            lines: lines.into_stream().await?,
        })
    }

    /// One environment of the organisation.
    pub async fn get(&self, id: &str) -> Result<EnvironmentView, ClientError> {
        let path = routes::environment(id);
        let answer = self.send(Method::GET, &path, None).await?.success()?;
        answer.decode("an environment")
    }

    /// The organisation's environments.
    pub async fn list(&self) -> Result<EnvironmentList, ClientError> {
        let answer = self
            .send(Method::GET, routes::ENVIRONMENTS, None)
            .await?
            .success()?;
        answer.decode("an environment list")
    }

    /// Destroys an environment's machine and workspace.
    pub async fn delete(&self, id: &str) -> Result<(), ClientError> {
        let path = routes::environment(id);
        self.send(Method::DELETE, &path, None).await?.success()?;
        Ok(())
    }

    /// Makes a gone environment again from its pinned digest, keeping its workspace.
    pub async fn replace(&self, id: &str) -> Result<EnvironmentView, ClientError> {
        let path = routes::environment_replace(id);
        let answer = self.send(Method::POST, &path, None).await?.success()?;
        answer.decode("an environment")
    }

    /// Runs a command in a ready environment, answering when it ends.
    pub async fn exec(&self, id: &str, body: &ExecBody) -> Result<ExecResult, ClientError> {
        let path = routes::environment_exec(id);
        let answer = self.send_json(Method::POST, &path, body).await?.success()?;
        answer.decode("a command's result")
    }

    /// Runs a command in a ready environment, its output read as it comes.
    pub async fn exec_streamed(
        &self,
        id: &str,
        body: &ExecBody,
    ) -> Result<ExecStream, ClientError> {
        let path = routes::environment_exec(id);
        let lines = self.stream_json(Method::POST, &path, body).await?;
        Ok(ExecStream {
            lines: lines.into_stream().await?,
        })
    }

    /// The organisation's status changes from now on, read as they happen. Returns once the
    /// daemon has subscribed: nothing written after that is missed.
    pub async fn watch(&self) -> Result<WatchStream, ClientError> {
        let lines = self.stream(Method::GET, routes::EVENTS, None).await?;
        Ok(WatchStream {
            lines: lines.into_stream().await?,
        })
    }

    /// Connects the organisation's GitHub App installation.
    pub async fn connect_github(&self, body: &ConnectGitHubBody) -> Result<(), ClientError> {
        self.send_json(Method::PUT, routes::ORGANISATION_GITHUB, body)
            .await?
            .success()?;
        Ok(())
    }
}
