//! `naryad conformance`: the runtime conformance suite against the configured back end.

use std::path::Path;

use narya_runtimes::conformance::{self, Fixture};
use narya_runtimes::ImageSource;

use crate::config::Config;

#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    #[error("cannot set up the conformance run: {0}")]
    Setup(String),
    #[error("{failed} of {total} conformance cases failed")]
    Failed { failed: usize, total: usize },
}

/// Runs every case, prints a line per case, and fails when any case did not pass.
pub async fn run(config: &Config) -> Result<(), ConformanceError> {
    let runtime =
        crate::backend::connect(config).map_err(|e| ConformanceError::Setup(e.to_string()))?;
    let version = runtime
        .version()
        .await
        .map_err(|e| ConformanceError::Setup(e.to_string()))?;
    let scratch = config.state_dir.join("conformance");
    std::fs::create_dir_all(&scratch)
        .map_err(|e| ConformanceError::Setup(format!("{}: {e}", scratch.display())))?;
    let mut unreachable_config = config.clone();
    let nobody = scratch.join("nobody.sock");
    unreachable_config.runtime.containerd_socket = nobody.clone();
    unreachable_config.runtime.docker_socket = nobody;
    let unreachable = crate::backend::connect(&unreachable_config)
        .map_err(|e| ConformanceError::Setup(e.to_string()))?;
    // The network group needs somewhere outside the host to reach: a namespace of the run's own.
    let outside =
        if config.environment.network == narya_runtimes::Network::Isolated {
            Some(conformance::Outside::start(&scratch).map_err(|e| {
                ConformanceError::Setup(format!("a stand-in for the internet: {e}"))
            })?)
        } else {
            None
        };
    let fixture = Fixture {
        image: ImageSource {
            reference: config.image.reference.clone(),
            pinned: None,
        },
        scratch: scratch.clone(),
        user: config.environment.user,
        network: config.environment.network,
        limits: suite_limits(config),
        mount_point: config.environment.workspace.clone(),
        prefix: format!("narya-conformance-{}", std::process::id()),
        unreachable: Some(unreachable),
        outside: outside.as_ref().map(|o| o.addr),
        known_gaps: conformance::known_gaps(&version, &config.runtime.sandbox()),
        sandbox: config.runtime.sandbox(),
    };
    println!(
        "conformance: {} back end ({version}), image {}",
        runtime.name(),
        config.image.reference
    );
    let reports = conformance::run(runtime.as_ref(), &fixture).await;
    drop(outside);
    if let Err(e) = runtime.shutdown().await {
        eprintln!("conformance: releasing the isolated network: {e}");
    }
    let _ = remove_empty(&scratch);
    if let Err(failed) = conformance::print_and_judge(&reports, &mut std::io::stdout()) {
        return Err(ConformanceError::Failed {
            failed: failed.lines().count(),
            total: reports.len(),
        });
    }
    println!("all {} cases passed", reports.len());
    Ok(())
}

fn remove_empty(dir: &Path) -> std::io::Result<()> {
    std::fs::remove_dir(dir)
}

/// The configured limits with memory, pids and `/tmp` made small, so the isolation cases that
/// go past them (and allocate twice the memory limit) stay quick and light on the host.
fn suite_limits(config: &Config) -> narya_runtimes::Limits {
    let configured = config.limits.limits();
    narya_runtimes::Limits {
        memory: configured.memory.min(256 << 20),
        pids: configured.pids.min(128),
        tmp: configured.tmp.min(16 << 20),
        ..configured
    }
}
