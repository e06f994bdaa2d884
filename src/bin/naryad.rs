//! `naryad`: the Narya host daemon.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use narya::config::{Config, DEFAULT_CONFIG_PATH};

/// The Narya host daemon: provisions development environments on this machine.
#[derive(Parser)]
#[command(name = "naryad", version)]
struct Args {
    /// The TOML configuration file.
    #[arg(long, env = "NARYA_CONFIG", default_value = DEFAULT_CONFIG_PATH)]
    config: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();

    let config = match Config::load(&args.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("naryad: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("naryad: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(narya::daemon::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "naryad stopped on an error");
            eprintln!("naryad: {e}");
            ExitCode::FAILURE
        }
    }
}
