//! The gRPC connection to containerd: one lazily (re)connecting channel, requests stamped with
//! the namespace (and a lease where content must outlive the call), status codes classified.

use std::path::Path;
use std::time::Duration;

use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::diff_client::DiffClient;
use containerd_client::services::v1::events_client::EventsClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::version_client::VersionClient;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::RuntimeError;

#[derive(Clone)]
pub(crate) struct Connection {
    channel: Channel,
    namespace: MetadataValue<tonic::metadata::Ascii>,
}

impl Connection {
    /// A channel to `socket` that connects on first use and reconnects after failures, so a
    /// containerd restart needs no daemon restart.
    pub(crate) fn new(socket: &Path, namespace: &str) -> Result<Connection, RuntimeError> {
        let namespace = namespace.parse().map_err(|_| {
            RuntimeError::Other(format!(
                "containerd namespace {namespace:?} is not a valid header value"
            ))
        })?;
        let path = socket.to_owned();
        let endpoint = Endpoint::try_from("http://[::]")
            .map_err(|e| RuntimeError::Other(e.to_string()))?
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

/// Classifies a containerd status into our error kinds, saying what we were doing.
pub(crate) fn classify(what: &str, status: Status) -> RuntimeError {
    let message = format!("containerd: {what}: {}", status.message());
    match status.code() {
        Code::NotFound => RuntimeError::NotFound(message),
        Code::AlreadyExists => RuntimeError::AlreadyExists(message),
        // A refused or dropped connection arrives as Unavailable (or Unknown with a transport
        // error underneath); either way nobody answered.
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
            RuntimeError::Unavailable(message)
        }
        Code::Unknown if status.message().contains("transport error") => {
            RuntimeError::Unavailable(message)
        }
        _ => RuntimeError::Other(message),
    }
}

/// Whether a status means "not there", which teardown treats as done.
pub(crate) fn is_not_found(status: &Status) -> bool {
    status.code() == Code::NotFound
}
