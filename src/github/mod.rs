//! Narya's GitHub App: its JWT, the organisation's installation, the repositories it selected,
//! and the installation tokens minted for one clone each; the secrets it handles never print.

mod app;
mod clone;
mod head;
mod oauth;
mod rate;

use std::fmt;

pub use app::{GitHubApp, Installation, InstallationToken};
pub use clone::{
    clone_argv, clone_env, clone_stdin, config_holds_secret, throwaway_name, Redactor,
};
pub use head::checked_out_commit;
pub use oauth::{Membership, Person, UserToken};

/// A secret (the App's JWT, an installation token) that prints as `[redacted]` wherever it
/// is formatted, so a log line or an error message cannot carry it by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// How talking to GitHub failed. No variant carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum GitHubError {
    #[error("cannot use the GitHub App private key {path}: {reason}")]
    Key { path: String, reason: String },
    #[error("cannot use the GitHub App's OAuth client secret {path}: {reason}")]
    ClientSecret { path: String, reason: String },
    #[error("GitHub did not take the code: {0}")]
    BadCode(String),
    #[error("GitHub knows no installation {0} of Narya's GitHub App")]
    InstallationNotFound(i64),
    #[error("GitHub refused a token for the repository: {0}")]
    RepositoryNotAccessible(String),
    #[error("GitHub is not answering ({0})")]
    Unavailable(String),
    #[error("GitHub limits this host's calls ({what}): retry in {retry_after} s")]
    RateLimited {
        what: &'static str,
        retry_after: u64,
    },
    #[error("GitHub refused {what} with {status}: {message}")]
    Refused {
        what: &'static str,
        status: u16,
        message: String,
    },
    #[error("GitHub answered {what} with something that is not its documented shape: {reason}")]
    Unexpected { what: &'static str, reason: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("ghs_0123456789".to_owned());
        assert_eq!(format!("{secret}"), "[redacted]");
        assert_eq!(format!("{secret:?}"), "[redacted]");
        assert_eq!(format!("{:?}", Some(&secret)), "Some([redacted])");
        assert_eq!(secret.expose(), "ghs_0123456789");
    }
}
