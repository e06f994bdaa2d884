//! Requests checked on the way in: a create and an exec that passed every rule of the contract
//! and this host's limits.

use std::collections::BTreeMap;
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use crate::config::parse_duration;
use crate::model::{EnvironmentId, InvalidRequest, Repository, SETUP_MAX_CHARS};

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

/// Why an exec body was refused (`400 NRY-0020`), naming the field and what to send instead.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidExec {
    #[error("argv must name a command: give a non-empty array of strings")]
    NoCommand,
    #[error("timeout: {0}")]
    Timeout(String),
    #[error("timeout {given:?} must be more than zero and at most this host's limit of {limit}")]
    TimeoutOutOfRange { given: String, limit: String },
    #[error("env key {0:?} is not a variable name: no \"=\", no NUL, not empty")]
    EnvKey(String),
    #[error("cwd {0:?} must be an absolute path inside the environment")]
    Cwd(String),
}

/// A command, checked: what the person asked to run and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub timeout: Duration,
    pub stdin: Option<Vec<u8>>,
}

impl ExecRequest {
    /// Checks an exec's fields against the contract and this host's `limit` on its time.
    pub fn validate(
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
        timeout: Option<&str>,
        stdin: Option<String>,
        limit: Duration,
    ) -> Result<ExecRequest, InvalidExec> {
        if argv.first().is_none_or(String::is_empty) {
            return Err(InvalidExec::NoCommand);
        }
        let timeout = match timeout {
            None => limit,
            Some(text) => {
                let timeout = parse_duration(text).map_err(InvalidExec::Timeout)?;
                if timeout > limit || timeout.is_zero() {
                    return Err(InvalidExec::TimeoutOutOfRange {
                        given: text.to_owned(),
                        limit: humantime::format_duration(limit).to_string(),
                    });
                }
                timeout
            }
        };
        if let Some(bad) = env
            .keys()
            .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return Err(InvalidExec::EnvKey(bad.clone()));
        }
        if let Some(cwd) = cwd.as_deref().filter(|c| !c.starts_with('/')) {
            return Err(InvalidExec::Cwd(cwd.to_owned()));
        }
        Ok(ExecRequest {
            argv,
            env,
            cwd,
            timeout,
            stdin: stdin.map(String::into_bytes),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn exec(argv: &[&str], timeout: Option<&str>) -> Result<ExecRequest, InvalidExec> {
        let argv = argv.iter().map(|a| a.to_string()).collect();
        ExecRequest::validate(
            argv,
            BTreeMap::new(),
            None,
            timeout,
            None,
            Duration::from_secs(600),
        )
    }

    #[test]
    fn an_exec_names_a_command_within_the_hosts_time_limit() {
        assert_eq!(exec(&[], None), Err(InvalidExec::NoCommand));
        assert_eq!(exec(&[""], None), Err(InvalidExec::NoCommand));
        assert_eq!(
            exec(&["true"], None).unwrap().timeout,
            Duration::from_secs(600)
        );
        assert_eq!(
            exec(&["true"], Some("90s")).unwrap().timeout,
            Duration::from_secs(90)
        );
        assert!(matches!(
            exec(&["true"], Some("2h")),
            Err(InvalidExec::TimeoutOutOfRange { .. })
        ));
        assert!(matches!(
            exec(&["true"], Some("0s")),
            Err(InvalidExec::TimeoutOutOfRange { .. })
        ));
        assert!(matches!(
            exec(&["true"], Some("soon")),
            Err(InvalidExec::Timeout(_))
        ));
    }

    #[test]
    fn an_exec_refuses_bad_variable_names_and_relative_directories() {
        let limit = Duration::from_secs(60);
        let argv = || vec!["true".to_owned()];
        let env = BTreeMap::from([("A=B".to_owned(), "x".to_owned())]);
        assert_eq!(
            ExecRequest::validate(argv(), env, None, None, None, limit),
            Err(InvalidExec::EnvKey("A=B".to_owned()))
        );
        assert_eq!(
            ExecRequest::validate(
                argv(),
                BTreeMap::new(),
                Some("src".into()),
                None,
                None,
                limit
            ),
            Err(InvalidExec::Cwd("src".to_owned()))
        );
        let ok = ExecRequest::validate(
            argv(),
            BTreeMap::new(),
            Some("/tmp".into()),
            None,
            Some("in".into()),
            limit,
        );
        assert_eq!(ok.unwrap().stdin, Some(b"in".to_vec()));
    }
}
