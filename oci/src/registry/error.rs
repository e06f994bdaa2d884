//! Why a registry could not give us the image.

use crate::Digest;

/// Why a registry could not give us the image.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot set up the HTTP client for registries: {reason}")]
    Client { reason: String },
    #[error("registry {registry} is unreachable (fetching {repository}): {reason}; {hint}")]
    Unreachable {
        registry: String,
        repository: String,
        reason: String,
        hint: String,
    },
    #[error("registry {registry} stopped answering while sending {what} of {repository}: {reason}; check the registry and the network, then retry")]
    Interrupted {
        registry: String,
        repository: String,
        what: String,
        reason: String,
    },
    #[error("registry {registry} has no {what} in repository {repository}; check image.reference and that the image was pushed there")]
    NotFound {
        registry: String,
        repository: String,
        what: String,
    },
    #[error("registry {registry} refused anonymous access to {repository} (HTTP {status}); Narya pulls without credentials, so make the repository public")]
    Denied {
        registry: String,
        repository: String,
        status: u16,
    },
    #[error("registry {registry} sent us to the token service {realm} for {repository}, which failed: {reason}")]
    TokenService {
        registry: String,
        repository: String,
        realm: String,
        reason: String,
    },
    #[error("registry {registry} answered HTTP {status} for {what} of {repository}")]
    Status {
        registry: String,
        repository: String,
        what: String,
        status: u16,
    },
    #[error("registry {registry} served {what} of {repository} with digest {actual}, but {expected} was expected; the content was refused — the registry or something between us serves wrong content")]
    DigestMismatch {
        registry: String,
        repository: String,
        what: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("registry {registry} served an unusable {what} of {repository}: {reason}")]
    Invalid {
        registry: String,
        repository: String,
        what: String,
        reason: String,
    },
    #[error("image {registry}/{repository}:{reference} has no linux/amd64 manifest; push one for linux/amd64")]
    NoLinuxAmd64 {
        registry: String,
        repository: String,
        reference: String,
    },
}
