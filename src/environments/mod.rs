//! The environment domain: identifiers and requests validated on the way in, statuses, the
//! fingerprint that tells a repeat from a different create.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

mod exec;
mod progress;
mod provision;
mod reconcile;
mod replace;

pub use exec::ExecRequest;
pub use progress::{Progress, Utf8Chunks};
pub use provision::{now_rfc3339, Announce, Created, EnvironmentError, Environments, PROVISIONING};
pub use reconcile::RUNTIME_UNREACHABLE;

/// The longest a setup script may be, in characters.
pub const SETUP_MAX_CHARS: usize = 65536;
/// The longest a repository may be, in characters.
pub const REPOSITORY_MAX_CHARS: usize = 200;
/// The longest an identifier may be, in characters.
pub const ID_MAX_CHARS: usize = 64;

/// Why a request's fields were refused; each maps to its own NRY code at the HTTP edge.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidRequest {
    #[error("identifier {0:?} is invalid: use 1 to 64 characters of A-Z, a-z, 0-9, \".\", \"_\" and \"-\", starting with a letter or digit")]
    Id(String),
    #[error("setup script has {0} characters; the limit is 65536 — move bulk into the repository or fetch it from the script")]
    SetupTooLong(usize),
    #[error("repository {0:?} is invalid: give OWNER/NAME (at most 200 characters of A-Z, a-z, 0-9, \".\", \"_\" and \"-\", each part starting with a letter or digit)")]
    Repository(String),
}

fn segment_ok(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// An environment's identifier: one path segment, `^[A-Za-z0-9][A-Za-z0-9._-]*$`, 1–64 long.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EnvironmentId(String);

impl EnvironmentId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for EnvironmentId {
    type Err = InvalidRequest;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() > ID_MAX_CHARS || !segment_ok(s) {
            return Err(InvalidRequest::Id(s.to_owned()));
        }
        Ok(EnvironmentId(s.to_owned()))
    }
}

impl fmt::Display for EnvironmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A GitHub repository as `owner/name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repository {
    full: String,
    slash: usize,
}

impl Repository {
    pub fn as_str(&self) -> &str {
        &self.full
    }
    pub fn owner(&self) -> &str {
        &self.full[..self.slash]
    }
    pub fn name(&self) -> &str {
        &self.full[self.slash + 1..]
    }
}

impl FromStr for Repository {
    type Err = InvalidRequest;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidRequest::Repository(s.to_owned());
        if s.len() > REPOSITORY_MAX_CHARS {
            return Err(invalid());
        }
        let slash = s.find('/').ok_or_else(invalid)?;
        if !segment_ok(&s[..slash]) || !segment_ok(&s[slash + 1..]) {
            return Err(invalid());
        }
        Ok(Repository {
            full: s.to_owned(),
            slash,
        })
    }
}

impl fmt::Display for Repository {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

/// A create request that passed every rule of the contract.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateRequest {
    pub id: EnvironmentId,
    pub setup: Option<String>,
    pub repository: Option<Repository>,
}

impl CreateRequest {
    /// Checks the fields in the contract's order: identifier, setup, repository.
    pub fn validate(
        id: &str,
        setup: Option<String>,
        repository: Option<&str>,
    ) -> Result<CreateRequest, InvalidRequest> {
        let id = id.parse()?;
        if let Some(script) = &setup {
            let chars = script.chars().count();
            if chars > SETUP_MAX_CHARS {
                return Err(InvalidRequest::SetupTooLong(chars));
            }
        }
        let repository = repository.map(str::parse).transpose()?;
        Ok(CreateRequest {
            id,
            setup,
            repository,
        })
    }

    /// What makes two creates of one id "the same": the setup script and the repository.
    pub fn fingerprint(&self) -> String {
        fingerprint(
            self.setup.as_deref(),
            self.repository.as_ref().map(Repository::as_str),
        )
    }
}

/// The fingerprint of a setup script and repository: a hash of both, each tagged as present or
/// absent so that "no setup" differs from an empty one.
pub fn fingerprint(setup: Option<&str>, repository: Option<&str>) -> String {
    let mut hasher = Sha256::new();
    for part in [setup, repository] {
        match part {
            None => hasher.update(b"-"),
            Some(text) => {
                hasher.update(b"+");
                hasher.update((text.len() as u64).to_be_bytes());
                hasher.update(text.as_bytes());
            }
        }
    }
    let digest = hasher.finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The four statuses of the source text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ready,
    Degraded,
    Gone,
    Unusable,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ready => "ready",
            Status::Degraded => "degraded",
            Status::Gone => "gone",
            Status::Unusable => "unusable",
        }
    }
}

impl FromStr for Status {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ready" => Ok(Status::Ready),
            "degraded" => Ok(Status::Degraded),
            "gone" => Ok(Status::Gone),
            "unusable" => Ok(Status::Unusable),
            other => Err(format!("unknown status {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_follow_the_path_segment_rule() {
        for ok in ["a", "A9", "demo", "my.env_1-x", &"a".repeat(64)] {
            assert!(ok.parse::<EnvironmentId>().is_ok(), "{ok:?} refused");
        }
        for bad in [
            "",
            ".a",
            "-a",
            "_a",
            "a/b",
            "a?b",
            "a#b",
            "a b",
            "é",
            "a\u{301}",
            &"a".repeat(65),
        ] {
            assert!(bad.parse::<EnvironmentId>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn repositories_are_owner_slash_name() {
        let r: Repository = "acme/app.rs".parse().unwrap();
        assert_eq!((r.owner(), r.name()), ("acme", "app.rs"));
        for bad in [
            "acme",
            "/app",
            "acme/",
            "acme/app/x",
            "-acme/app",
            "acme/.app",
            "ac me/app",
        ] {
            assert!(bad.parse::<Repository>().is_err(), "{bad:?} accepted");
        }
        let long_ok = format!("{}/{}", "o".repeat(100), "n".repeat(99));
        assert_eq!(long_ok.len(), 200);
        assert!(long_ok.parse::<Repository>().is_ok());
        let too_long = format!("{}/{}", "o".repeat(100), "n".repeat(100));
        assert!(too_long.parse::<Repository>().is_err());
    }

    #[test]
    fn setup_is_limited_in_characters_not_bytes() {
        let at_limit = "é".repeat(SETUP_MAX_CHARS);
        assert!(CreateRequest::validate("a", Some(at_limit), None).is_ok());
        let over = "x".repeat(SETUP_MAX_CHARS + 1);
        assert_eq!(
            CreateRequest::validate("a", Some(over), None),
            Err(InvalidRequest::SetupTooLong(SETUP_MAX_CHARS + 1))
        );
    }

    #[test]
    fn fingerprint_tells_absent_from_empty_and_swapped_fields() {
        assert_ne!(fingerprint(None, None), fingerprint(Some(""), None));
        assert_ne!(
            fingerprint(Some("a/b"), None),
            fingerprint(None, Some("a/b"))
        );
        assert_eq!(
            fingerprint(Some("x"), Some("a/b")),
            fingerprint(Some("x"), Some("a/b"))
        );
    }
}
