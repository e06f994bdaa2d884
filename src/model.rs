//! The leaf types of the domain, validated when parsed: identifiers, repositories, digests,
//! statuses and what a setup did. `store/`, `github/` and `environments/` all import these; this
//! module imports none of them.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

pub use narya_oci::Digest;

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

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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

/// `at` as the contract writes times: RFC 3339, UTC.
pub fn rfc3339(at: SystemTime) -> String {
    OffsetDateTime::from(at)
        .format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned())
}

/// Now, as the contract writes times.
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

/// How a setup (or the clone before it) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetupState {
    Succeeded,
    Failed,
    TimedOut,
    /// The host stopped during the step: nobody can say what it left behind.
    Interrupted,
}

impl SetupState {
    pub fn as_str(self) -> &'static str {
        match self {
            SetupState::Succeeded => "succeeded",
            SetupState::Failed => "failed",
            SetupState::TimedOut => "timed_out",
            SetupState::Interrupted => "interrupted",
        }
    }

    /// The state of a process that ended with `exit_code` (`None`: killed), or ran out of time.
    pub fn of(exit_code: Option<i32>, timed_out: bool) -> SetupState {
        if timed_out {
            SetupState::TimedOut
        } else if exit_code == Some(0) {
            SetupState::Succeeded
        } else {
            SetupState::Failed
        }
    }
}

impl FromStr for SetupState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "succeeded" => Ok(SetupState::Succeeded),
            "failed" => Ok(SetupState::Failed),
            "timed_out" => Ok(SetupState::TimedOut),
            "interrupted" => Ok(SetupState::Interrupted),
            other => Err(format!("unknown setup state {other:?}")),
        }
    }
}

/// Which step of a create a setup record speaks of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetupStep {
    Clone,
    Setup,
}

impl SetupStep {
    pub fn as_str(self) -> &'static str {
        match self {
            SetupStep::Clone => "clone",
            SetupStep::Setup => "setup",
        }
    }
}

impl FromStr for SetupStep {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "clone" => Ok(SetupStep::Clone),
            "setup" => Ok(SetupStep::Setup),
            other => Err(format!("unknown setup step {other:?}")),
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
    fn setup_states_and_steps_read_back_what_they_write() {
        for state in [
            SetupState::Succeeded,
            SetupState::Failed,
            SetupState::TimedOut,
        ] {
            assert_eq!(state.as_str().parse::<SetupState>(), Ok(state));
        }
        for step in [SetupStep::Clone, SetupStep::Setup] {
            assert_eq!(step.as_str().parse::<SetupStep>(), Ok(step));
        }
        assert!("done".parse::<SetupState>().is_err());
        assert_eq!(SetupState::of(Some(0), false), SetupState::Succeeded);
        assert_eq!(SetupState::of(Some(0), true), SetupState::TimedOut);
        assert_eq!(SetupState::of(None, false), SetupState::Failed);
        assert_eq!(SetupState::of(Some(2), false), SetupState::Failed);
    }
}
