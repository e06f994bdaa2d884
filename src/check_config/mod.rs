//! `naryad check-config`: everything a start would need, checked without serving or touching
//! the daemon's state: the file parsed strictly, its paths and sockets, the runtime reached,
//! the identity provider's key set fetched, the image resolved, the GitHub App's JWT accepted.

mod paths;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use narya_runtimes::fetch::ImageFetcher;
use narya_runtimes::versions;

use crate::auth::Verifier;
use crate::config::{Backend, Config};
use crate::github::GitHubApp;

/// The longest one network check may take; each is also bounded by its own client.
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// One line of the report: what was checked, and whether it is a problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub problem: bool,
    /// Not a problem, but worth saying: exit 0 still (a runtime older than any tested).
    pub warning: bool,
    pub text: String,
}

impl Finding {
    fn ok(text: impl Into<String>) -> Finding {
        Finding {
            problem: false,
            warning: false,
            text: text.into(),
        }
    }

    fn warning(text: impl Into<String>) -> Finding {
        Finding {
            problem: false,
            warning: true,
            text: text.into(),
        }
    }

    fn problem(text: impl Into<String>) -> Finding {
        Finding {
            problem: true,
            warning: false,
            text: one_line(&text.into()),
        }
    }
}

/// A multi-line message (toml's parse errors quote the offending line under a gutter) as one
/// line: the gutter and the quote go, the rest is joined.
fn one_line(text: &str) -> String {
    let quoted = |line: &str| {
        let line = line.trim_start();
        line.is_empty()
            || line.starts_with('|')
            || line
                .split_once(" |")
                .is_some_and(|(number, _)| number.chars().all(|c| c.is_ascii_digit()))
    };
    text.lines()
        .filter(|line| !quoted(line))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(": ")
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tag = match (self.problem, self.warning) {
            (true, _) => "problem",
            (false, true) => "warning",
            (false, false) => "ok",
        };
        write!(f, "{tag}: {}", self.text)
    }
}

/// Checks the configuration at `path`; one finding per thing checked, in a fixed order.
/// `scratch` is a directory of the caller's the runtime client may use (containerd's FIFOs):
/// never the state directory.
pub async fn check(path: &Path, scratch: &Path) -> Vec<Finding> {
    let config = match Config::load(path) {
        Ok(config) => config,
        Err(e) => return vec![Finding::problem(e.to_string())],
    };
    let mut findings = vec![Finding::ok(format!("{} parses", path.display()))];
    findings.extend(local(&config));
    let (runtime, disk, identity, image, github) = tokio::join!(
        bounded("the container runtime", runtime(&config, scratch)),
        bounded("the disk bound", disk(&config, scratch)),
        bounded("the identity provider", identity(&config)),
        bounded("the image", image(&config)),
        async {
            tokio::time::timeout(CHECK_TIMEOUT, github(&config))
                .await
                .unwrap_or_else(|_| Some(timed_out("the GitHub App")))
        },
    );
    findings.extend([runtime, disk, identity, image]);
    findings.extend(github);
    findings
}

/// What can be checked on this machine alone: directories, the sockets served, TCP addresses.
fn local(config: &Config) -> Vec<Finding> {
    let mut findings = vec![
        path_finding(
            "state_dir",
            &config.state_dir,
            paths::directory_to_write(&config.state_dir),
        ),
        path_finding(
            "listen.socket",
            &config.listen.socket,
            paths::socket_to_serve(&config.listen.socket),
        ),
    ];
    if let Some(addr) = config.listen.tcp {
        findings.push(address_finding("listen.tcp", addr));
    }
    if let Some(addr) = config.listen.metrics {
        findings.push(if config.listen.tcp == Some(addr) {
            Finding::problem(format!(
                "listen.metrics {addr}: the same address as listen.tcp; give the metrics a port of their own"
            ))
        } else {
            address_finding("listen.metrics", addr)
        });
    }
    findings.push(pool_finding(config, host_memory()));
    // What start-up refuses of the limits on this host, check-config refuses too.
    if let Err(e) = config.check_host(narya_runtimes::host::hard_nofile()) {
        findings.push(Finding::problem(e));
    }
    if let Some(github) = &config.github {
        for (key, path) in [
            ("github.private_key", &github.private_key),
            ("github.client_secret_file", &github.client_secret_file),
        ] {
            if let Err(e) = paths::file_to_read(path) {
                findings.push(Finding::problem(format!("{key} {}: {e}", path.display())));
            }
        }
    }
    findings
}

/// What `[pool] size` costs: that many started machines, each allowed `[limits] memory`. Idle
/// machines hold little, and one environment's limit is no reservation either, so a pool that
/// may together outgrow the host is said, not refused.
fn pool_finding(config: &Config, host_memory: Option<u64>) -> Finding {
    let size = config.pool.size;
    if size == 0 {
        return Finding::ok("pool.size 0: no machines started ahead of creates".to_owned());
    }
    let allowed = config.limits.memory.saturating_mul(size as u64);
    let note = match host_memory {
        Some(total) if allowed > total => format!(
            "; together they may use {allowed} bytes (limits.memory each), more than the host's \
             {total}"
        ),
        _ => String::new(),
    };
    Finding::ok(format!(
        "pool.size {size}: {size} machines kept started ahead of creates{note}"
    ))
}

/// The host's memory in bytes, from `/proc/meminfo`; `None` when it cannot be read.
fn host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

fn path_finding(key: &str, path: &Path, result: Result<String, String>) -> Finding {
    match result {
        Ok(said) => Finding::ok(format!("{key} {}: {said}", path.display())),
        Err(e) => Finding::problem(format!("{key} {}: {e}", path.display())),
    }
}

/// The TCP address must be one of this host's: binding its IP on a port of the kernel's choice
/// tells, without taking the configured port (a running daemon may hold it).
fn address_finding(key: &str, addr: SocketAddr) -> Finding {
    let probe = SocketAddr::new(addr.ip(), 0);
    match std::net::TcpListener::bind(probe) {
        Ok(_) => Finding::ok(format!("{key} {addr}: an address of this host")),
        Err(e) => Finding::problem(format!("{key} {addr}: cannot listen on {}: {e}", addr.ip())),
    }
}

async fn bounded(what: &str, check: impl Future<Output = Finding>) -> Finding {
    tokio::time::timeout(CHECK_TIMEOUT, check)
        .await
        .unwrap_or_else(|_| timed_out(what))
}

fn timed_out(what: &str) -> Finding {
    Finding::problem(format!(
        "{what} did not answer within {}s",
        CHECK_TIMEOUT.as_secs()
    ))
}

async fn runtime(config: &Config, scratch: &Path) -> Finding {
    let (key, socket) = match config.runtime.backend {
        Backend::Containerd => (
            "runtime.containerd_socket",
            &config.runtime.containerd_socket,
        ),
        Backend::Docker => ("runtime.docker_socket", &config.runtime.docker_socket),
    };
    if let Err(e) = paths::socket_to_reach(socket) {
        return Finding::problem(format!("{key} {}: {e}", socket.display()));
    }
    let mut scratch_config = config.clone();
    scratch_config.state_dir = scratch.to_owned();
    let runtime = match crate::backend::connect(&scratch_config) {
        Ok(runtime) => runtime,
        Err(e) => return Finding::problem(format!("{key} {}: {e}", socket.display())),
    };
    let version = match runtime.version().await {
        Ok(version) => version,
        Err(e) => return Finding::problem(format!("{key} {}: {e}", socket.display())),
    };
    let answers = format!(
        "runtime {} at {} answers: version {version}",
        runtime.name(),
        socket.display()
    );
    match versions::older_than_tested(runtime.name(), &version) {
        None => Finding::ok(answers),
        Some(oldest) => Finding::warning(format!(
            "{answers}, older than any tested: the oldest tested {} is {oldest} (the README's \
             \"Tested runtime versions\"); it may work, but nothing shows that it does",
            versions::engine_of(runtime.name(), &version)
        )),
    }
}

/// Whether `[limits] disk` can be held: what start-up refuses, said here first.
async fn disk(config: &Config, scratch: &Path) -> Finding {
    let Some(bytes) = config.limits.disk.bytes() else {
        return Finding::ok(
            "limits.disk \"unbounded\": one environment can fill the host's disk (naryad warns at every start)",
        );
    };
    let mut scratch_config = config.clone();
    scratch_config.state_dir = scratch.to_owned();
    let runtime = crate::backend::connect(&scratch_config).ok();
    let answering = match &runtime {
        Some(runtime) => runtime.version().await.is_ok().then_some(runtime.as_ref()),
        None => None,
    };
    let layers = match answering {
        Some(_) => " and the runtime's layers",
        None => " (the runtime's layers unchecked: it does not answer)",
    };
    match crate::disk::check_bound(&config.workspaces_dir(), answering).await {
        Ok(()) => Finding::ok(format!(
            "limits.disk {bytes} bytes: held by btrfs quota groups on the workspaces' filesystem{layers}"
        )),
        Err(e) => Finding::problem(format!(
            "limits.disk cannot be held: {e}; or set `disk = \"unbounded\"` under [limits]"
        )),
    }
}

async fn identity(config: &Config) -> Finding {
    let verifier = match Verifier::new(&config.identity) {
        Ok(verifier) => verifier,
        Err(e) => return Finding::problem(format!("identity: {e}")),
    };
    match verifier.check_key_set().await {
        Ok((0, uri)) => Finding::problem(format!(
            "identity: the key set at {uri} holds no key usable with identity.algorithms"
        )),
        Ok((keys, uri)) => Finding::ok(format!("identity: {keys} key(s) fetched from {uri}")),
        Err(e) => Finding::problem(format!("identity: the key set cannot be fetched: {e}")),
    }
}

async fn image(config: &Config) -> Finding {
    let reference = &config.image.reference;
    let resolved = match ImageFetcher::new(config.image.insecure_registries.clone()) {
        Ok(fetcher) => fetcher.resolve(reference).await,
        Err(e) => Err(e),
    };
    match resolved {
        Ok(digest) => Finding::ok(format!("image.reference {reference}: {digest}")),
        Err(e) => Finding::problem(format!("image.reference {reference}: {e}")),
    }
}

/// `None` when no `[github]` section is configured, or its key or client secret file was
/// already found missing (one line per problem).
async fn github(config: &Config) -> Option<Finding> {
    let github = config.github.as_ref()?;
    paths::file_to_read(&github.private_key).ok()?;
    paths::file_to_read(&github.client_secret_file).ok()?;
    let app = match GitHubApp::new(github) {
        Ok(app) => app,
        Err(e) => return Some(Finding::problem(format!("github: {e}"))),
    };
    Some(match app.check_app().await {
        Ok(name) => Finding::ok(format!(
            "github: {} accepted the JWT of App {} ({name})",
            github.api_url, github.app_id
        )),
        Err(e) => Finding::problem(format!("github: {e}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_toml_error_becomes_one_line() {
        let text = "configuration file /x.toml: TOML parse error at line 1, column 1\n  |\n1 | statedir = \"/tmp\"\n  | ^^^^^^^^\nunknown field `statedir`, expected one of `state_dir`\n";
        assert_eq!(
            Finding::problem(text).to_string(),
            "problem: configuration file /x.toml: TOML parse error at line 1, column 1: unknown field `statedir`, expected one of `state_dir`"
        );
        assert_eq!(one_line("plain"), "plain");
    }

    #[test]
    fn a_pool_is_described_and_one_that_may_outgrow_the_hosts_memory_says_so() {
        let config = |pool: &str| {
            let text = format!(
                "[identity]\nissuer = \"https://id.test\"\naudience = \"narya\"\n\
                 [limits]\nmemory = \"1GiB\"\ntmp = \"64MiB\"\n[pool]\n{pool}\n"
            );
            Config::parse(&text).unwrap()
        };
        let gib = 1 << 30;
        let fits = pool_finding(&config("size = 2"), Some(4 * gib)).to_string();
        assert!(fits.starts_with("ok: pool.size 2"), "{fits}");
        let outgrows = pool_finding(&config("size = 8"), Some(4 * gib)).to_string();
        assert!(outgrows.starts_with("ok: pool.size 8"), "{outgrows}");
        assert!(outgrows.contains("more than the host's"), "{outgrows}");
        assert!(!fits.contains("more than"), "{fits}");
        let off = pool_finding(&config("size = 0"), Some(gib / 2)).to_string();
        assert!(off.starts_with("ok: pool.size 0"), "{off}");
        let unknown = pool_finding(&config("size = 8"), None).to_string();
        assert!(unknown.starts_with("ok"), "{unknown}");
    }

    #[test]
    fn a_metrics_address_is_checked_like_the_tcp_one_and_kept_apart_from_it() {
        let findings = |listen: &str| -> Vec<String> {
            let text = format!(
                "state_dir = \"/nonexistent/narya\"\n[listen]\n{listen}\n\
                 [identity]\nissuer = \"https://id.test\"\naudience = \"narya\"\n"
            );
            let config = Config::parse(&text).unwrap();
            local(&config)
                .iter()
                .map(ToString::to_string)
                .filter(|f| f.contains("listen.metrics"))
                .collect()
        };
        let fine = findings("metrics = \"127.0.0.1:9464\"");
        assert_eq!(fine.len(), 1);
        assert!(!fine[0].starts_with("problem"), "{fine:?}");
        let shared = findings("tcp = \"127.0.0.1:7070\"\nmetrics = \"127.0.0.1:7070\"");
        assert!(shared[0].starts_with("problem"), "{shared:?}");
        // TEST-NET-1: never an address of this host.
        let foreign = findings("metrics = \"192.0.2.1:9464\"");
        assert!(foreign[0].starts_with("problem"), "{foreign:?}");
        assert!(findings("").is_empty(), "off by default: nothing to check");
    }
}
