//! OCI vocabulary for Narya host: content digests and image references, parsed and validated.

mod digest;
mod reference;

pub use digest::{Digest, DigestError};
pub use reference::{ImageReference, ReferenceError, RegistryReference};
