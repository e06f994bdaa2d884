//! The gRPC connection to containerd: one lazily (re)connecting channel, requests stamped with
//! the namespace (and a lease where content must outlive the call), status codes classified.

use std::path::Path;
use std::time::Duration;

use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::diff_client::DiffClient;
use containerd_client::services::v1::events_client::EventsClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::introspection_client::IntrospectionClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::version_client::VersionClient;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::{ErrorKind, RuntimeError};

#[derive(Clone)]
pub(crate) struct Connection {
    channel: Channel,
    namespace: MetadataValue<tonic::metadata::Ascii>,
}

impl Connection {
    /// A channel to `socket` that connects on first use and reconnects after failures, so a
    /// containerd restart needs no daemon restart.
    pub(crate) fn new(socket: &Path, namespace: &str) -> Result<Connection, RuntimeError> {
        let namespace = namespace.parse().map_err(|e| {
            RuntimeError::caused(
                ErrorKind::Other,
                format!("containerd namespace {namespace:?} is not a valid header value"),
                e,
            )
        })?;
        let path = socket.to_owned();
        let endpoint = Endpoint::try_from("http://[::]")
            .map_err(|e| RuntimeError::caused(ErrorKind::Other, "the containerd endpoint", e))?
            .connect_timeout(Duration::from_secs(5));
        let channel = endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }));
        Ok(Connection { channel, namespace })
    }

    /// `message` stamped with our namespace.
    pub(crate) fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request
            .metadata_mut()
            .insert("containerd-namespace", self.namespace.clone());
        request
    }

    /// `message` stamped with our namespace and `lease`.
    pub(crate) fn leased<T>(&self, message: T, lease: &str) -> Request<T> {
        let mut request = self.request(message);
        if let Ok(value) = lease.parse() {
            request.metadata_mut().insert("containerd-lease", value);
        }
        request
    }

    pub(crate) fn containers(&self) -> ContainersClient<Channel> {
        ContainersClient::new(self.channel.clone())
    }
    pub(crate) fn content(&self) -> ContentClient<Channel> {
        ContentClient::new(self.channel.clone())
    }
    pub(crate) fn diff(&self) -> DiffClient<Channel> {
        DiffClient::new(self.channel.clone())
    }
    pub(crate) fn events(&self) -> EventsClient<Channel> {
        EventsClient::new(self.channel.clone())
    }
    pub(crate) fn images(&self) -> ImagesClient<Channel> {
        ImagesClient::new(self.channel.clone())
    }
    pub(crate) fn introspection(&self) -> IntrospectionClient<Channel> {
        IntrospectionClient::new(self.channel.clone())
    }
    pub(crate) fn leases(&self) -> LeasesClient<Channel> {
        LeasesClient::new(self.channel.clone())
    }
    pub(crate) fn snapshots(&self) -> SnapshotsClient<Channel> {
        SnapshotsClient::new(self.channel.clone())
    }
    pub(crate) fn tasks(&self) -> TasksClient<Channel> {
        TasksClient::new(self.channel.clone())
    }
    pub(crate) fn version(&self) -> VersionClient<Channel> {
        VersionClient::new(self.channel.clone())
    }
}

/// Classifies a containerd status into our error kinds, saying what we were doing. The one place
/// that knows which statuses mean what: by code, and for a connection that broke under a call,
/// by the type of the failure tonic keeps as the status's source, never by its text.
pub(crate) fn classify(what: &str, status: Status) -> RuntimeError {
    let kind = match status.code() {
        Code::NotFound => ErrorKind::NotFound,
        Code::AlreadyExists => ErrorKind::AlreadyExists,
        // tonic answers Unavailable when it cannot connect, and DeadlineExceeded or Cancelled
        // when no answer came in time: either way nobody answered.
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => ErrorKind::Unavailable,
        // A connection dropped mid-call arrives as Unknown (or Internal) with the transport's
        // failure underneath; statuses containerd itself answered carry no source at all.
        _ if broke_in_transport(&status) => ErrorKind::Unavailable,
        _ => ErrorKind::Other,
    };
    RuntimeError::caused(kind, format!("containerd: {what}"), Answer(status))
}

/// Whether the failure under `status` is the connection's: a transport error, a failed connect,
/// an HTTP/2 connection that broke, or the socket's own I/O error (refused, missing, broken pipe).
fn broke_in_transport(status: &Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(error) = cause {
        if error.is::<tonic::transport::Error>()
            || error.is::<tonic::ConnectError>()
            || error.is::<hyper::Error>()
            || error.is::<std::io::Error>()
        {
            return true;
        }
        cause = error.source();
    }
    false
}

/// A status as a source: shown by its message (its code is what `classify` read), with the
/// status, and the transport failure under it, kept as its own source.
#[derive(Debug)]
struct Answer(Status);

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.message() {
            "" => write!(f, "{}", self.0.code()),
            message => f.write_str(message),
        }
    }
}

impl std::error::Error for Answer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Whether a status means "not there", which teardown treats as done.
pub(crate) fn is_not_found(status: &Status) -> bool {
    status.code() == Code::NotFound
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::io;

    use super::*;

    fn kind_of(status: Status) -> ErrorKind {
        classify("doing something", status).kind()
    }

    #[test]
    fn answers_are_classified_by_code() {
        assert_eq!(kind_of(Status::not_found("no such")), ErrorKind::NotFound);
        assert_eq!(
            kind_of(Status::already_exists("taken")),
            ErrorKind::AlreadyExists
        );
        assert_eq!(kind_of(Status::unavailable("down")), ErrorKind::Unavailable);
        assert_eq!(
            kind_of(Status::deadline_exceeded("late")),
            ErrorKind::Unavailable
        );
        assert_eq!(kind_of(Status::internal("broken")), ErrorKind::Other);
        assert_eq!(kind_of(Status::failed_precondition("no")), ErrorKind::Other);
    }

    #[test]
    fn transport_failures_are_unavailable_by_type_not_text() {
        // What tonic makes of a socket nobody listens on: a failed connect.
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        let connect = Status::from_error(Box::new(tonic::ConnectError(Box::new(refused))));
        assert_eq!(kind_of(connect), ErrorKind::Unavailable);
        // A connection that broke mid-call: Unknown, with the I/O error underneath.
        let broken = Status::from_error(Box::new(io::Error::from(io::ErrorKind::BrokenPipe)));
        assert_eq!(broken.code(), Code::Unknown);
        assert_eq!(kind_of(broken), ErrorKind::Unavailable);
        // containerd answering Unknown with these words is still containerd answering.
        assert_eq!(
            kind_of(Status::unknown("transport error")),
            ErrorKind::Other
        );
    }

    #[test]
    fn the_message_says_what_failed_and_keeps_the_status() {
        let e = classify(
            "looking up machine m",
            Status::not_found("container m: not found"),
        );
        assert_eq!(
            e.to_string(),
            "containerd: looking up machine m: container m: not found"
        );
        let answer = e.source().and_then(|a| a.source());
        let status = answer.and_then(|s| s.downcast_ref::<Status>());
        assert_eq!(status.map(Status::code), Some(Code::NotFound));
    }
}
