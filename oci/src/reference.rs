//! The official image's reference: an OCI image layout on disk or a repository in a registry.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::Digest;

/// Where the official image comes from (`image.reference`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageReference {
    /// `oci-layout:PATH` — an OCI image layout directory; its `index.json` names the manifest.
    Layout(PathBuf),
    /// `HOST[:PORT]/REPO[:TAG|@DIGEST]` in a registry speaking the distribution API.
    Registry(RegistryReference),
}

/// A repository in a registry, with a tag or a digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryReference {
    /// `HOST` or `HOST:PORT`.
    pub registry: String,
    /// The repository path, lower-case components separated by `/`.
    pub repository: String,
    /// The tag; `latest` when neither a tag nor a digest was given.
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReferenceError {
    #[error("image reference is empty; give \"oci-layout:PATH\" or \"HOST[:PORT]/REPO:TAG\"")]
    Empty,
    #[error("image reference {0:?}: \"oci-layout:\" needs an absolute path after it")]
    LayoutPath(String),
    #[error("image reference {0:?} names no registry host; give \"HOST[:PORT]/REPO:TAG\" (e.g. \"127.0.0.1:5000/narya/official:1\")")]
    NoRegistry(String),
    #[error("image reference {reference:?}: {reason}")]
    Invalid { reference: String, reason: String },
}

impl RegistryReference {
    /// What a registry's manifest endpoint takes: the digest when pinned, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".to_owned(),
        }
    }

    /// `HOST/REPO` without tag or digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }
}

fn invalid(reference: &str, reason: impl Into<String>) -> ReferenceError {
    ReferenceError::Invalid {
        reference: reference.to_owned(),
        reason: reason.into(),
    }
}

fn valid_host(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (host, None),
    };
    let name_ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok());
    name_ok && port_ok
}

fn valid_component(c: &str) -> bool {
    let bytes = c.as_bytes();
    !bytes.is_empty()
        && bytes[0].is_ascii_lowercase() | bytes[0].is_ascii_digit()
        && bytes[bytes.len() - 1].is_ascii_lowercase() | bytes[bytes.len() - 1].is_ascii_digit()
        && bytes
            .iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

fn valid_tag(t: &str) -> bool {
    let bytes = t.as_bytes();
    (1..=128).contains(&bytes.len())
        && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl FromStr for ImageReference {
    type Err = ReferenceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(ReferenceError::Empty);
        }
        if let Some(path) = s.strip_prefix("oci-layout:") {
            if !path.starts_with('/') {
                return Err(ReferenceError::LayoutPath(s.to_owned()));
            }
            return Ok(ImageReference::Layout(PathBuf::from(path)));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((rest, d)) => (
                rest,
                Some(d.parse::<Digest>().map_err(|e| invalid(s, e.to_string()))?),
            ),
            None => (s, None),
        };
        let (host, path) = rest
            .split_once('/')
            .ok_or_else(|| ReferenceError::NoRegistry(s.to_owned()))?;
        // As in the distribution reference grammar: the first component is a host only if it
        // looks like one; we insist on an explicit host, so anything else is refused.
        if !(host.contains('.') || host.contains(':') || host == "localhost") {
            return Err(ReferenceError::NoRegistry(s.to_owned()));
        }
        if !valid_host(host) {
            return Err(invalid(
                s,
                format!("{host:?} is not a registry host[:port]"),
            ));
        }
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag)),
            _ => (path, None),
        };
        if !repository.split('/').all(valid_component) {
            return Err(invalid(
                s,
                format!(
                    "repository {repository:?} must be lower-case components separated by \"/\""
                ),
            ));
        }
        if let Some(t) = tag {
            if !valid_tag(t) {
                return Err(invalid(s, format!("tag {t:?} is not a valid tag")));
            }
        }
        Ok(ImageReference::Registry(RegistryReference {
            registry: host.to_owned(),
            repository: repository.to_owned(),
            tag: tag.map(str::to_owned),
            digest,
        }))
    }
}

impl fmt::Display for ImageReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageReference::Layout(p) => write!(f, "oci-layout:{}", p.display()),
            ImageReference::Registry(r) => {
                write!(f, "{}/{}", r.registry, r.repository)?;
                if let Some(t) = &r.tag {
                    write!(f, ":{t}")?;
                }
                if let Some(d) = &r.digest {
                    write!(f, "@{d}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_reference_needs_an_absolute_path() {
        assert_eq!(
            "oci-layout:/var/lib/narya/images/official".parse::<ImageReference>(),
            Ok(ImageReference::Layout(PathBuf::from(
                "/var/lib/narya/images/official"
            )))
        );
        assert!(matches!(
            "oci-layout:images".parse::<ImageReference>(),
            Err(ReferenceError::LayoutPath(_))
        ));
    }

    #[test]
    fn registry_reference_with_port_and_tag() {
        let r: ImageReference = "127.0.0.1:5000/narya/official:1".parse().unwrap();
        let ImageReference::Registry(r) = r else {
            panic!("not a registry reference")
        };
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "narya/official");
        assert_eq!(r.tag.as_deref(), Some("1"));
        assert_eq!(r.manifest_reference(), "1");
        assert_eq!(r.name(), "127.0.0.1:5000/narya/official");
    }

    #[test]
    fn registry_reference_with_digest_prefers_the_digest() {
        let s = format!("registry.example.com/official@sha256:{}", "a".repeat(64));
        let r: ImageReference = s.parse().unwrap();
        assert_eq!(r.to_string(), s);
        let ImageReference::Registry(r) = r else {
            panic!("not a registry reference")
        };
        assert_eq!(r.manifest_reference(), format!("sha256:{}", "a".repeat(64)));
    }

    #[test]
    fn references_without_a_registry_or_with_bad_parts_are_refused() {
        for bad in [
            "",
            "official:1",
            "library/official:1",
            "127.0.0.1:5000/Official:1",
            "127.0.0.1:5000/narya/official:bad tag",
            "127.0.0.1:99999/narya/official",
            "127.0.0.1:5000/narya/official@sha256:xyz",
        ] {
            assert!(
                bad.parse::<ImageReference>().is_err(),
                "{bad:?} was accepted"
            );
        }
    }
}
