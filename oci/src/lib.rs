//! OCI vocabulary for Narya host: content digests and image references, parsed and validated.

mod digest;
pub mod layout;
pub mod manifest;
mod reference;
pub mod registry;
pub mod seccomp;
pub mod spec;

pub use digest::{Digest, DigestError};
pub use reference::{ImageReference, ReferenceError, RegistryReference};
