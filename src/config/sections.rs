//! The configuration's sections (`[listen]`, `[identity]`, `[runtime]`, …) and their defaults.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use narya_oci::ImageReference;
use narya_runtimes::network::Subnet;
use narya_runtimes::{Limits, Network, User};
use serde::Deserialize;

use super::values::{bytes, from_str, network, user, DiskLimit, HumanDuration};
use super::DEFAULT_SOCKET;

/// `[pool]`: machines started ahead of creates.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// How many started, unclaimed machines the daemon keeps; 0: none, every create starts
    /// its own.
    #[serde(default = "default_pool_size")]
    pub size: usize,
}

/// The most machines a pool may hold: each is a started container with its limits reserved.
pub const MAX_POOL_SIZE: usize = 256;

fn default_pool_size() -> usize {
    2
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            size: default_pool_size(),
        }
    }
}

/// `[prebuild]`: the state after a successful setup, kept and reused by creates of the same key.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrebuildConfig {
    /// Whether prebuilds are made and served; off by default while they are new.
    #[serde(default)]
    pub enabled: bool,
    /// The most the prebuilds may hold on the host together; the least recently used leave
    /// first.
    #[serde(default = "default_prebuild_max_bytes", deserialize_with = "bytes")]
    pub max_bytes: u64,
}

fn default_prebuild_max_bytes() -> u64 {
    20 << 30
}

impl Default for PrebuildConfig {
    fn default() -> Self {
        PrebuildConfig {
            enabled: false,
            max_bytes: default_prebuild_max_bytes(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listen {
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    pub tcp: Option<SocketAddr>,
    /// Where Prometheus metrics are served (`GET /metrics`, no token); absent: nowhere.
    pub metrics: Option<SocketAddr>,
    /// A request whose headers are not complete by then is dropped: a silent or slow client
    /// costs one file descriptor for at most this long.
    #[serde(default = "default_header_timeout")]
    pub header_timeout: HumanDuration,
    /// A keep-alive connection with no request in flight for this long is closed.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout: HumanDuration,
    /// Connections served at once on each listener; beyond it, new ones wait in the backlog.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Log {
    #[serde(default)]
    pub format: LogFormat,
}

/// How log lines on stderr are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Readable lines; colour only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object a line, for log collectors.
    Json,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub issuer: String,
    pub audience: String,
    pub jwks_uri: Option<String>,
    #[serde(default = "default_person_claim")]
    pub person_claim: String,
    #[serde(default = "default_organisation_claim")]
    pub organisation_claim: String,
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<Algorithm>,
    #[serde(default = "default_leeway")]
    pub leeway: HumanDuration,
    /// The key set is fetched again at least this often, so a key the provider removed stops
    /// verifying within it.
    #[serde(default = "default_jwks_refresh")]
    pub jwks_refresh: HumanDuration,
}

/// An asymmetric JWS algorithm; symmetric ones and `none` cannot be configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Algorithm {
    RS256,
    RS384,
    RS512,
    PS256,
    PS384,
    PS512,
    ES256,
    ES384,
    EdDSA,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Containerd,
    Docker,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    #[serde(default = "default_backend")]
    pub backend: Backend,
    #[serde(default = "default_containerd_socket")]
    pub containerd_socket: PathBuf,
    #[serde(default = "default_containerd_namespace")]
    pub containerd_namespace: String,
    #[serde(default = "default_snapshotter")]
    pub snapshotter: String,
    #[serde(default = "default_docker_socket")]
    pub docker_socket: PathBuf,
    #[serde(default)]
    pub sandbox: SandboxKind,
    /// containerd: the runsc binary; Docker/Podman: the engine's name for it. `None`: the
    /// back end's default ([`RuntimeConfig::runsc`]).
    #[serde(default)]
    pub runsc: Option<String>,
}

/// `[runtime] sandbox`: the kernel machines run on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxKind {
    /// runc: the host's kernel.
    #[default]
    Container,
    /// gVisor's runsc: a kernel of its own.
    Gvisor,
}

impl RuntimeConfig {
    /// `runsc`, or its default for the back end: the binary for containerd, the engine's
    /// runtime name for Docker and Podman.
    pub fn runsc(&self) -> String {
        self.runsc.clone().unwrap_or_else(|| {
            match self.backend {
                Backend::Containerd => "/usr/bin/runsc",
                Backend::Docker => "runsc",
            }
            .to_owned()
        })
    }

    /// The sandbox as the back ends take it.
    pub fn sandbox(&self) -> narya_runtimes::Sandbox {
        match self.sandbox {
            SandboxKind::Container => narya_runtimes::Sandbox::Container,
            SandboxKind::Gvisor => narya_runtimes::Sandbox::Gvisor {
                runsc: self.runsc(),
            },
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Image {
    #[serde(default = "default_image_reference", deserialize_with = "from_str")]
    pub reference: ImageReference,
    #[serde(default)]
    pub insecure_registries: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentConfig {
    #[serde(default = "default_user", deserialize_with = "user")]
    pub user: User,
    #[serde(default = "default_workspace")]
    pub workspace: String,
    #[serde(default = "default_network", deserialize_with = "network")]
    pub network: Network,
    #[serde(default = "default_setup_timeout")]
    pub setup_timeout: HumanDuration,
    #[serde(default = "default_clone_timeout")]
    pub clone_timeout: HumanDuration,
    #[serde(default = "default_output_limit")]
    pub output_limit: usize,
    #[serde(default = "default_exec_timeout")]
    pub exec_timeout: HumanDuration,
    /// How long a deleted environment still answers as `gone` before its record is forgotten.
    #[serde(default = "default_gone_retention")]
    pub gone_retention: HumanDuration,
}

/// `[network]`: what `network = "isolated"` uses.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    /// Addresses of environments; must not overlap a network the host routes.
    #[serde(default = "default_subnet", deserialize_with = "from_str")]
    pub subnet: Subnet,
    /// Resolvers for environments; empty: the host's own non-loopback ones.
    #[serde(default)]
    pub dns: Vec<IpAddr>,
    /// Where the CNI plugins are looked for (containerd).
    #[serde(default = "default_cni_bin_dir")]
    pub cni_bin_dir: Vec<PathBuf>,
}

impl Default for NetworkSection {
    fn default() -> Self {
        NetworkSection {
            subnet: default_subnet(),
            dns: Vec::new(),
            cni_bin_dir: default_cni_bin_dir(),
        }
    }
}

/// `[host]`: what the host keeps for itself.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Below this much free space on `state_dir`'s filesystem, creates are refused: the
    /// database and the daemon's own files need room to write what they already hold.
    #[serde(default = "default_reserve_disk", deserialize_with = "bytes")]
    pub reserve_disk: u64,
}

fn default_reserve_disk() -> u64 {
    2 << 30
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            reserve_disk: default_reserve_disk(),
        }
    }
}

/// `[organisation]`: fair shares between the organisations of one host.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrganisationConfig {
    /// Recorded environments (not `gone`) one organisation may hold.
    #[serde(default = "default_max_environments")]
    pub max_environments: usize,
    /// Open `GET /v1/events` streams one organisation may hold.
    #[serde(default = "default_max_event_streams")]
    pub max_event_streams: usize,
}

fn default_max_environments() -> usize {
    100
}
fn default_max_event_streams() -> usize {
    8
}

impl Default for OrganisationConfig {
    fn default() -> Self {
        OrganisationConfig {
            max_environments: default_max_environments(),
            max_event_streams: default_max_event_streams(),
        }
    }
}

/// `[limits]`: what bounds each environment (machine, setup, exec and clone share them).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    #[serde(default = "default_memory", deserialize_with = "bytes")]
    pub memory: u64,
    #[serde(default = "default_cpus")]
    pub cpus: f64,
    #[serde(default = "default_pids")]
    pub pids: u32,
    #[serde(default = "default_tmp", deserialize_with = "bytes")]
    pub tmp: u64,
    /// `None` when the file does not say: the contract's default, lowered at start-up to what
    /// the host grants ([`super::Config::fit_to_host`]); a value the file gives is kept or refused.
    #[serde(default)]
    pub nofile: Option<u64>,
    /// What an environment may write to the host's disk (workspace, writable layer, clone).
    #[serde(default = "default_disk")]
    pub disk: DiskLimit,
}

impl LimitsConfig {
    /// The limits as the runtimes take them.
    pub fn limits(&self) -> Limits {
        Limits {
            memory: self.memory,
            cpus: self.cpus,
            pids: self.pids,
            tmp: self.tmp,
            nofile: self.nofile.unwrap_or_else(default_nofile),
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            memory: default_memory(),
            cpus: default_cpus(),
            pids: default_pids(),
            tmp: default_tmp(),
            nofile: None,
            disk: default_disk(),
        }
    }
}

fn default_memory() -> u64 {
    Limits::default().memory
}
fn default_cpus() -> f64 {
    Limits::default().cpus
}
fn default_pids() -> u32 {
    Limits::default().pids
}
fn default_tmp() -> u64 {
    Limits::default().tmp
}
/// The contract's default bound of an environment's disk.
pub const DEFAULT_DISK: u64 = 10 << 30;

fn default_disk() -> DiskLimit {
    DiskLimit::Bytes(DEFAULT_DISK)
}
fn default_nofile() -> u64 {
    Limits::default().nofile
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitHub {
    pub app_id: u64,
    pub private_key: PathBuf,
    /// The App's OAuth client, with which the person connecting an installation proves it.
    pub client_id: String,
    pub client_secret_file: PathBuf,
    #[serde(default = "default_github_api_url")]
    pub api_url: String,
    #[serde(default = "default_github_git_url")]
    pub git_url: String,
    #[serde(default = "default_github_connect_url")]
    pub connect_url: String,
}

fn default_socket() -> PathBuf {
    PathBuf::from(DEFAULT_SOCKET)
}
fn default_header_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}
fn default_idle_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(120))
}
fn default_max_connections() -> usize {
    1024
}
fn default_person_claim() -> String {
    "sub".to_owned()
}
fn default_organisation_claim() -> String {
    "org".to_owned()
}
fn default_algorithms() -> Vec<Algorithm> {
    vec![Algorithm::RS256, Algorithm::ES256]
}
fn default_leeway() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
fn default_jwks_refresh() -> HumanDuration {
    HumanDuration(Duration::from_secs(15 * 60))
}
fn default_backend() -> Backend {
    Backend::Containerd
}
fn default_containerd_socket() -> PathBuf {
    PathBuf::from("/run/containerd/containerd.sock")
}
fn default_containerd_namespace() -> String {
    "narya".to_owned()
}
fn default_snapshotter() -> String {
    "overlayfs".to_owned()
}
fn default_docker_socket() -> PathBuf {
    PathBuf::from("/var/run/docker.sock")
}
fn default_image_reference() -> ImageReference {
    ImageReference::Layout(PathBuf::from("/var/lib/narya/images/official"))
}
fn default_user() -> User {
    User {
        uid: 1000,
        gid: 1000,
    }
}
fn default_workspace() -> String {
    "/workspace".to_owned()
}
fn default_network() -> Network {
    Network::Isolated
}
fn default_subnet() -> Subnet {
    Subnet::from_str("10.89.0.0/16").unwrap_or_else(|_| unreachable!("a valid literal"))
}
fn default_cni_bin_dir() -> Vec<PathBuf> {
    vec![PathBuf::from("/usr/lib/cni"), PathBuf::from("/opt/cni/bin")]
}
fn default_setup_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(15 * 60))
}
fn default_clone_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10 * 60))
}
fn default_output_limit() -> usize {
    65536
}
fn default_exec_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30 * 60))
}
fn default_gone_retention() -> HumanDuration {
    HumanDuration(Duration::from_secs(24 * 60 * 60))
}
fn default_github_api_url() -> String {
    "https://api.github.com".to_owned()
}
fn default_github_git_url() -> String {
    "https://github.com".to_owned()
}
fn default_github_connect_url() -> String {
    "https://github.com/apps/narya/installations/new".to_owned()
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            socket: default_socket(),
            tcp: None,
            metrics: None,
            header_timeout: default_header_timeout(),
            idle_timeout: default_idle_timeout(),
            max_connections: default_max_connections(),
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            backend: default_backend(),
            containerd_socket: default_containerd_socket(),
            containerd_namespace: default_containerd_namespace(),
            snapshotter: default_snapshotter(),
            docker_socket: default_docker_socket(),
            sandbox: SandboxKind::default(),
            runsc: None,
        }
    }
}

impl Default for Image {
    fn default() -> Self {
        Image {
            reference: default_image_reference(),
            insecure_registries: Vec::new(),
        }
    }
}

impl Default for EnvironmentConfig {
    fn default() -> Self {
        EnvironmentConfig {
            user: default_user(),
            workspace: default_workspace(),
            network: default_network(),
            setup_timeout: default_setup_timeout(),
            clone_timeout: default_clone_timeout(),
            output_limit: default_output_limit(),
            exec_timeout: default_exec_timeout(),
            gone_retention: default_gone_retention(),
        }
    }
}
