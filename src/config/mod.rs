//! The daemon's TOML configuration: one strict serde struct with the contract's defaults.

mod limits;
mod sections;
mod values;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use sections::{
    Algorithm, Backend, EnvironmentConfig, GitHub, HostConfig, Identity, Image, LimitsConfig,
    Listen, Log, LogFormat, NetworkSection, OrganisationConfig, PoolConfig, PrebuildConfig,
    RuntimeConfig, SandboxKind, MAX_POOL_SIZE,
};
pub use values::{
    is_plain_http_off_loopback, parse_bytes, parse_duration, parse_user, DiskLimit, HumanDuration,
};

/// Where `naryad` looks when neither `--config` nor `NARYA_CONFIG` is given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/narya/naryad.toml";
/// The most connections a listener may be configured to serve at once.
const MAX_CONNECTIONS_LIMIT: usize = 1 << 20;
/// The most clock skew `identity.leeway` may allow: more keeps expired tokens alive too long.
const MAX_LEEWAY: Duration = Duration::from_secs(5 * 60);
/// The default unix socket, also the CLI's default.
pub const DEFAULT_SOCKET: &str = "/run/narya/narya.sock";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("configuration file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// The longest a stop waits for requests and provisioning in flight before it exits anyway.
    #[serde(default = "default_shutdown_timeout")]
    pub shutdown_timeout: HumanDuration,
    #[serde(default)]
    pub listen: Listen,
    pub identity: Identity,
    #[serde(default)]
    pub runtime: RuntimeConfig,
    #[serde(default)]
    pub image: Image,
    #[serde(default)]
    pub environment: EnvironmentConfig,
    #[serde(default)]
    pub network: NetworkSection,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub host: HostConfig,
    #[serde(default)]
    pub organisation: OrganisationConfig,
    #[serde(default)]
    pub pool: PoolConfig,
    #[serde(default)]
    pub prebuild: PrebuildConfig,
    pub github: Option<GitHub>,
    #[serde(default)]
    pub log: Log,
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/narya")
}

fn default_shutdown_timeout() -> HumanDuration {
    HumanDuration(std::time::Duration::from_secs(30))
}

impl Config {
    /// Reads and checks the file at `path`; every error names the file and the key.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text).map_err(|message| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses configuration text; the error is a message naming the offending key.
    pub fn parse(text: &str) -> Result<Config, String> {
        let config: Config = toml::from_str(text).map_err(|e| describe_toml_error(&e))?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        let id = &self.identity;
        if id.issuer.trim().is_empty() {
            return Err("key `identity.issuer` must not be empty".to_owned());
        }
        if id.audience.trim().is_empty() {
            return Err("key `identity.audience` must not be empty".to_owned());
        }
        if id.algorithms.is_empty() {
            return Err("key `identity.algorithms` must name at least one algorithm".to_owned());
        }
        if id.person_claim.is_empty() || id.organisation_claim.is_empty() {
            return Err(
                "keys `identity.person_claim` and `identity.organisation_claim` must not be empty"
                    .to_owned(),
            );
        }
        if id.leeway.0 > MAX_LEEWAY {
            return Err(format!(
                "key `identity.leeway`: {:?} is more than the allowed \"5m\"",
                id.leeway
            ));
        }
        // Zero would refetch the key set on every request.
        if id.jwks_refresh.0 < Duration::from_secs(1) {
            return Err("key `identity.jwks_refresh` must be at least \"1s\"".to_owned());
        }
        // Plain HTTP to anything but this host lets the network forge the keys or the issuer.
        if is_plain_http_off_loopback(&id.issuer) {
            return Err(format!(
                "key `identity.issuer`: {:?} uses http:// on a host other than loopback; use https://",
                id.issuer
            ));
        }
        if let Some(uri) = &id.jwks_uri {
            if !(uri.starts_with("https://")
                || uri.starts_with("http://")
                || uri.starts_with("file://"))
            {
                return Err(format!(
                    "key `identity.jwks_uri`: {uri:?} must be an http(s):// or file:// URL"
                ));
            }
            if is_plain_http_off_loopback(uri) {
                return Err(format!(
                    "key `identity.jwks_uri`: {uri:?} uses http:// on a host other than loopback; use https://"
                ));
            }
        }
        if !self.environment.workspace.starts_with('/') {
            return Err(format!(
                "key `environment.workspace`: {:?} must be an absolute path inside the machine",
                self.environment.workspace
            ));
        }
        if self.environment.user.uid == 0 {
            return Err(
                "key `environment.user`: uid 0 is root; environments run as an unprivileged user, \
                 e.g. \"1000:1000\""
                    .to_owned(),
            );
        }
        self.check_limits()?;
        if self.environment.output_limit == 0 {
            return Err("key `environment.output_limit` must be at least 1 byte".to_owned());
        }
        let listen = &self.listen;
        if listen.max_connections == 0 {
            return Err("key `listen.max_connections` must be at least 1".to_owned());
        }
        // The semaphore that enforces it has a ceiling; no host needs anywhere near this many.
        if listen.max_connections > MAX_CONNECTIONS_LIMIT {
            return Err(format!(
                "key `listen.max_connections` must be at most {MAX_CONNECTIONS_LIMIT}"
            ));
        }
        // A zero bound would close every connection before its first request.
        for (key, value) in [
            ("listen.header_timeout", listen.header_timeout),
            ("listen.idle_timeout", listen.idle_timeout),
        ] {
            if value.0.is_zero() {
                return Err(format!("key `{key}` must be longer than zero"));
            }
        }
        let shares = &self.organisation;
        if shares.max_environments == 0 || shares.max_event_streams == 0 {
            return Err("keys `organisation.max_environments` and `organisation.max_event_streams` must be at least 1".to_owned());
        }
        if self.pool.size > MAX_POOL_SIZE {
            return Err(format!("key `pool.size` must be at most {MAX_POOL_SIZE}"));
        }
        if self.runtime.containerd_namespace.is_empty() {
            return Err("key `runtime.containerd_namespace` must not be empty".to_owned());
        }
        if let Some(runsc) = &self.runtime.runsc {
            if runsc.is_empty() {
                return Err("key `runtime.runsc` must not be empty".to_owned());
            }
            if self.runtime.backend == Backend::Containerd && !runsc.starts_with('/') {
                return Err(format!(
                    "key `runtime.runsc`: {runsc:?} must be the absolute path of the runsc binary \
                     on containerd (e.g. \"/usr/bin/runsc\")"
                ));
            }
        }
        Ok(())
    }

    /// The SQLite database file.
    pub fn database_path(&self) -> PathBuf {
        self.state_dir.join("narya.db")
    }

    /// The directory holding every environment's workspace.
    pub fn workspaces_dir(&self) -> PathBuf {
        self.state_dir.join("workspaces")
    }
}

/// toml's rendered error quotes the offending line and names the key; it is the clearest pointer.
fn describe_toml_error(e: &toml::de::Error) -> String {
    e.to_string().trim_end().to_owned()
}

#[cfg(test)]
mod tests;
