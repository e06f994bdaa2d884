//! What the conformance runs against each real back end share: the variables they need, the
//! fixture they make, and the verdict they print.

use std::path::Path;
use std::sync::Arc;

use narya_oci::ImageReference;
use narya_runtimes::conformance::{self, Fixture};
use narya_runtimes::{ImageSource, Limits, Network, Runtime, User};

/// Whether this run is CI's, where nothing may skip.
fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// The value of `var`, or a skip (outside CI) / failure (under CI=true) naming what is missing.
pub fn required(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            let message = format!(
                "{var} is not set: start the services and build the image with contrib/test.sh"
            );
            assert!(!under_ci(), "{message} (CI=true: not skipping)");
            eprintln!("skipped: {message}");
            None
        }
    }
}

/// The runtime's version, or a skip (outside CI) / failure (under CI=true) when it does not
/// answer on `socket`.
pub async fn answering(runtime: &dyn Runtime, socket: &str) -> Option<String> {
    match runtime.version().await {
        Ok(version) => Some(version),
        Err(e) => {
            let name = runtime.name();
            assert!(!under_ci(), "{name} is not answering: {e}");
            eprintln!("skipped: {name} is not answering on {socket}: {e}");
            None
        }
    }
}

/// The suite's fixture: the official image from `reference`, workspaces under `scratch`, the
/// unprivileged user 1000:1000 on the host's network, machines named from `prefix` and the process id.
pub fn fixture(
    reference: ImageReference,
    scratch: &Path,
    prefix: String,
    unreachable: Arc<dyn Runtime>,
    version: &str,
) -> Fixture {
    let fixture = Fixture {
        image: ImageSource {
            reference,
            pinned: None,
        },
        scratch: scratch.join("workspaces"),
        user: User {
            uid: 1000,
            gid: 1000,
        },
        network: Network::Host,
        limits: test_limits(),
        mount_point: "/workspace".to_owned(),
        // The process id keeps two runs (or a machine a crashed run leaked) from ever sharing a
        // prefix: the list case asserts exactly the machines named from it.
        prefix: format!("{prefix}-{}", std::process::id()),
        unreachable: Some(unreachable),
        known_gaps: conformance::known_gaps(version),
    };
    std::fs::create_dir_all(&fixture.scratch).unwrap();
    fixture
}

/// Small limits, quick to exceed, and a nofile within this host's hard limit.
pub fn test_limits() -> Limits {
    Limits {
        memory: 256 << 20,
        cpus: 1.0,
        pids: 128,
        tmp: 16 << 20,
        nofile: 1024,
    }
}

/// A machine-name prefix unique to this test process and `suite`: several test binaries (and
/// other runs) share the runtime, and a fixed prefix would let them remove each other's.
pub fn prefix(suite: &str) -> String {
    format!("{suite}{}", std::process::id())
}

/// Runs every case against `runtime` and fails the test unless all passed.
pub async fn run_and_judge(runtime: &dyn Runtime, fixture: &Fixture) {
    let reports = conformance::run(runtime, fixture).await;
    if let Err(failed) = conformance::print_and_judge(
        &reports,
        // Straight to the process's stderr, past the test harness's capture: CI's log names
        // every case, passed or not.
        &mut std::io::stderr(),
    ) {
        panic!("conformance against {}:\n{failed}", runtime.name());
    }
}
