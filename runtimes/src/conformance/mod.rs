//! The runtime conformance suite: the semantics of the `Runtime` trait, checked against a live
//! runtime. Public so that any back end can run it; each case is named and reports passed,
//! skipped with a reason, or failed with what was seen.

mod cases;
mod network;
mod outside;

pub use outside::{lease_subnet, Outside, SubnetLease};

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::{Duration, Instant};

use crate::{ImageSource, Limits, Network, Runtime, Sandbox, User};

/// What the suite needs besides the runtime under test.
pub struct Fixture {
    /// The official image (or any image with `/bin/sh`, `sleep`, `tini` and coreutils).
    pub image: ImageSource,
    /// A host directory the suite may fill with workspaces; it must exist.
    pub scratch: PathBuf,
    pub user: User,
    pub network: Network,
    /// What bounds every machine and throwaway the suite makes; the isolation group checks
    /// them from inside. Small enough to exceed quickly (`memory` well under the host's).
    pub limits: Limits,
    /// Where workspaces are mounted inside machines.
    pub mount_point: String,
    /// Prefixes every machine the suite makes, so parallel runs do not meet.
    pub prefix: String,
    /// The same back end pointed at a socket nobody listens on.
    pub unreachable: Option<std::sync::Arc<dyn Runtime>>,
    /// A listener outside the host (in a namespace of the caller's, like [`Outside`]) that
    /// isolated machines must reach; the network group runs only for `Network::Isolated`.
    pub outside: Option<std::net::SocketAddr>,
    /// Cases this engine is known to fail, with why ([`known_gaps`]): run and reported, a
    /// failure as a gap, never as a pass.
    pub known_gaps: Vec<(&'static str, &'static str)>,
    /// The kernel the back end runs machines on; the sandbox group runs only under gVisor.
    pub sandbox: Sandbox,
}

/// What the engine whose version text is `version` (from `Runtime::version`) is known not to
/// do under `sandbox`, case by case. On runc none: Podman's one gap, the cgroup namespace its
/// Docker-compatible create drops, is closed by creating its containers through its own API.
/// Under gVisor, what its kernel does differently by design (README, "Sandboxes"), and on Docker
/// Engine after 20.10 the loopback's IPv6 address ([`GVISOR_DOCKER_IPV6_GAP`]).
pub fn known_gaps(version: &str, sandbox: &Sandbox) -> Vec<(&'static str, &'static str)> {
    match sandbox {
        Sandbox::Container => Vec::new(),
        Sandbox::Gvisor { .. } => {
            let mut gaps = GVISOR_GAPS.to_vec();
            let docker_after_20 = version.starts_with("Docker Engine")
                && crate::versions::release(version).is_some_and(|[major, ..]| major > 20);
            if docker_after_20 {
                gaps.push(GVISOR_DOCKER_IPV6_GAP);
            }
            gaps
        }
    }
}

/// Docker Engine after 20.10 gives a machine's loopback `::1` while it sets up the network;
/// under runc the spec's `net.ipv6.conf.all.disable_ipv6` sysctl then takes it away, but gVisor
/// applies no `net` sysctl and copies the address into its netstack. The machine's own interface
/// has no IPv6 address, and the network's firewall and routes carry no IPv6: only the loopback
/// answers on `::1`.
const GVISOR_DOCKER_IPV6_GAP: (&str, &str) = (
    "ipv6_is_off",
    "Docker Engine after 20.10 gives the loopback ::1 before gVisor's netstack copies the \
     namespace's addresses, and gVisor applies no net sysctl to take it away: only the \
     machine's own loopback has an IPv6 address",
);

/// What does not hold under gVisor, and why.
const GVISOR_GAPS: &[(&str, &str)] = &[
    (
        "seccomp_filter_is_on",
        "the OCI seccomp filter is not applied inside gVisor (runsc's --oci-seccomp made thread \
         creation fail under Narya's filter, so git could not clone): a machine's processes talk \
         to gVisor's kernel, and only gVisor reaches the host's, through a filter of its own",
    ),
    (
        "new_user_namespaces_are_refused",
        "gVisor implements user namespaces in its own kernel: one made inside a machine grants \
         nothing on the host, whose kernel never sees it",
    ),
    (
        "pids_limit_holds_and_the_machine_recovers",
        "under gVisor the pids cgroup bounds the sandbox's own host threads and address-space \
         stubs, not the machine's processes one by one: a fork loop past it ends the whole \
         machine (the daemon then reads it degraded) instead of failing one fork",
    ),
    (
        "memory_limit_kills_inside_only",
        "gVisor's kernel is one host process: past the memory limit the host's OOM killer ends \
         the whole machine (the daemon then reads it degraded), not the one process that asked",
    ),
    (
        "throwaway_is_bounded_and_filtered_too",
        "under gVisor the limits sit on the sandbox's host cgroup, which gVisor's own cgroup \
         files inside do not show; a throwaway gets them from the same spec as a machine, whose \
         host cgroup limits_read_inside_equal_the_configuration reads",
    ),
];

/// The outcome of one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Passed,
    Skipped(String),
    Failed(String),
    /// Failed, as this engine is known to (the fixture's `known_gaps` says why).
    KnownGap(String),
}

/// One case's report.
#[derive(Clone, Debug)]
pub struct CaseReport {
    pub group: &'static str,
    pub name: &'static str,
    pub verdict: Verdict,
    pub duration: Duration,
}

impl std::fmt::Display for CaseReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.duration.as_millis();
        match &self.verdict {
            Verdict::Passed => write!(f, "pass  {}/{} ({ms} ms)", self.group, self.name),
            Verdict::Skipped(why) => write!(f, "skip  {}/{}: {why}", self.group, self.name),
            Verdict::Failed(why) => {
                write!(f, "FAIL  {}/{} ({ms} ms): {why}", self.group, self.name)
            }
            Verdict::KnownGap(why) => {
                write!(f, "GAP   {}/{} ({ms} ms): {why}", self.group, self.name)
            }
        }
    }
}

type CaseFuture<'a> = Pin<Box<dyn Future<Output = Result<(), Outcome>> + Send + 'a>>;
type CaseFn = for<'a> fn(&'a Context<'a>) -> CaseFuture<'a>;

/// How a case ended other than passing.
#[derive(Debug)]
pub enum Outcome {
    Skip(String),
    Fail(String),
}

impl<E: std::fmt::Display> From<E> for Outcome {
    fn from(e: E) -> Self {
        Outcome::Fail(e.to_string())
    }
}

/// What a case sees.
pub struct Context<'a> {
    pub runtime: &'a dyn Runtime,
    pub fixture: &'a Fixture,
    pub case: &'static str,
}

/// Every case, grouped by what it checks.
pub fn cases() -> Vec<(&'static str, &'static str, CaseFn)> {
    cases::all()
}

/// Writes a line per case to `out`; the failed (and skipped) ones, one per line, when any case
/// did not pass. A suite that skips is not a suite that passed; a known gap of the engine is
/// printed as such and does not fail it.
pub fn print_and_judge(reports: &[CaseReport], out: &mut dyn std::io::Write) -> Result<(), String> {
    for report in reports {
        let _ = writeln!(out, "{report}");
    }
    let not_passed: Vec<String> = reports
        .iter()
        .filter(|r| !matches!(r.verdict, Verdict::Passed | Verdict::KnownGap(_)))
        .map(ToString::to_string)
        .collect();
    if not_passed.is_empty() {
        Ok(())
    } else {
        Err(not_passed.join("\n"))
    }
}

/// Runs every case against `runtime`, one after another, and reports each.
pub async fn run(runtime: &dyn Runtime, fixture: &Fixture) -> Vec<CaseReport> {
    let mut reports = Vec::new();
    for (group, name, case) in cases() {
        // What the network group checks is what `isolated` promises; other networks promise none.
        if group == "network" && fixture.network != Network::Isolated {
            continue;
        }
        // What the sandbox group checks is what gVisor promises; runc promises none of it.
        if group == "sandbox" && fixture.sandbox == Sandbox::Container {
            continue;
        }
        let context = Context {
            runtime,
            fixture,
            case: name,
        };
        let started = Instant::now();
        let verdict = match case(&context).await {
            Ok(()) => Verdict::Passed,
            Err(Outcome::Skip(why)) => Verdict::Skipped(why),
            Err(Outcome::Fail(why)) => match fixture.known_gaps.iter().find(|(n, _)| *n == name) {
                Some((_, gap)) => Verdict::KnownGap(format!("{gap}; seen: {why}")),
                None => Verdict::Failed(why),
            },
        };
        cases::clean_up(&context).await;
        reports.push(CaseReport {
            group,
            name,
            verdict,
            duration: started.elapsed(),
        });
    }
    reports
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopbacks_ipv6_is_a_gap_only_under_gvisor_on_docker_after_20_10() {
        let gvisor = Sandbox::Gvisor {
            runsc: "runsc".to_owned(),
        };
        let names = |version: &str, sandbox: &Sandbox| -> Vec<&str> {
            known_gaps(version, sandbox)
                .into_iter()
                .map(|g| g.0)
                .collect()
        };
        let docker_28 = "Docker Engine 28.5.2+dfsg4 (API 1.51), machines under gVisor";
        assert!(names(docker_28, &gvisor).contains(&"ipv6_is_off"));
        assert!(!names(docker_28, &Sandbox::Container).contains(&"ipv6_is_off"));
        let docker_20 = "Docker Engine 20.10.24+dfsg1 (API 1.41), machines under gVisor";
        assert!(!names(docker_20, &gvisor).contains(&"ipv6_is_off"));
        for other in ["2.1.9+unknown", "1.6.20~ds1", "Podman 5.4.2 (API 1.41)"] {
            assert!(!names(other, &gvisor).contains(&"ipv6_is_off"), "{other}");
        }
    }
}
