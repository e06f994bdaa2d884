//! `naryad`: the Narya host daemon, and the offline tools that go with it (`pack-image`).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use narya::config::{Config, LogFormat, DEFAULT_CONFIG_PATH};
use narya_oci::layout::{self, PackOptions};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The Narya host daemon: provisions development environments on this machine.
///
/// Without a subcommand it serves, configured by `--config` (or `NARYA_CONFIG`).
#[derive(Parser)]
#[command(name = "naryad", version)]
struct Args {
    /// The TOML configuration file.
    #[arg(long, global = true, env = "NARYA_CONFIG", default_value = DEFAULT_CONFIG_PATH)]
    config: PathBuf,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Check the configuration as a start would (paths, sockets, the runtime, the identity
    /// provider's keys, the image, the GitHub App) without serving; exit 1 on any problem.
    CheckConfig,
    /// Run the runtime conformance suite against the configured back end.
    Conformance,
    /// Pack a rootfs tar into an OCI image layout and print the manifest digest on stdout.
    PackImage(PackImageArgs),
}

#[derive(clap::Args)]
struct PackImageArgs {
    /// The uncompressed rootfs tar (as mmdebstrap writes it).
    #[arg(long, value_name = "ROOTFS.tar")]
    rootfs: PathBuf,
    /// The directory to write the OCI image layout into (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Also write the layout as an oci-archive tar here.
    #[arg(long, value_name = "FILE")]
    archive: Option<PathBuf>,
    /// The name of the manifest in index.json (`oci:DIR:TAG`).
    #[arg(long, default_value = "official")]
    tag: String,
    /// The `uid:gid` the image's processes run as.
    #[arg(long, default_value = "1000:1000")]
    user: String,
    /// The working directory (the user's HOME is /home/narya, apart from it).
    #[arg(long, default_value = "/workspace")]
    workdir: String,
    /// The image's creation time, RFC 3339 [default: from SOURCE_DATE_EPOCH, else the epoch].
    #[arg(long, value_name = "RFC3339", value_parser = parse_rfc3339)]
    created: Option<String>,
}

const BOLLARD_QUIET: &str = "bollard=info";

fn main() -> ExitCode {
    let args = Args::parse();
    match args.command {
        None => serve(args.config),
        Some(Command::CheckConfig) => check_config(&args.config),
        Some(Command::Conformance) => conformance(args.config),
        Some(Command::PackImage(pack)) => pack_image(pack),
    }
}

/// The configuration, logging to stderr (`RUST_LOG` filters, `default` otherwise) in its
/// `[log] format`, and an async runtime: what serving and the conformance run both start with.
/// Errors are printed here.
fn start(config_path: &Path, default: &str) -> Result<(Config, tokio::runtime::Runtime), ExitCode> {
    let mut config = Config::load(config_path).map_err(|e| {
        eprintln!("naryad: {e}");
        ExitCode::from(2)
    })?;
    let hard_nofile = narya_runtimes::host::hard_nofile();
    if let Err(e) = config.check_host(hard_nofile) {
        eprintln!("naryad: configuration file {}: {e}", config_path.display());
        return Err(ExitCode::from(2));
    }
    let lowered = config.fit_to_host(hard_nofile);
    start_logging(config.log.format, default);
    if let Some(nofile) = lowered {
        tracing::info!(
            nofile,
            "limits.nofile not set: environments get this host's hard limit of open files, below the default"
        );
    }
    let runtime = tokio::runtime::Runtime::new().map_err(|e| {
        eprintln!("naryad: cannot start the async runtime: {e}");
        ExitCode::FAILURE
    })?;
    Ok((config, runtime))
}

/// Logs to stderr: readable lines, coloured only on a terminal (colour codes garble files and
/// journals), or one JSON object a line for collectors.
fn start_logging(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
        // bollard logs request bodies at debug level, and a throwaway's body carries its
        // secret environment: never below info, whatever RUST_LOG says.
        .add_directive(BOLLARD_QUIET.parse().unwrap_or_default());
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
}

fn conformance(config_path: PathBuf) -> ExitCode {
    let (config, runtime) = match start(&config_path, "warn") {
        Ok(started) => started,
        Err(code) => return code,
    };
    match runtime.block_on(narya::conformance::run(&config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("naryad conformance: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints one line per thing checked (`ok: …`, `warning: …` or `problem: …`) and a summary on stderr.
fn check_config(config_path: &Path) -> ExitCode {
    // Logs only when asked: the report is the output.
    start_logging(LogFormat::Text, "off");
    let scratch = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("naryad check-config: cannot make a scratch directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("naryad check-config: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let findings = runtime.block_on(narya::check_config::check(config_path, scratch.path()));
    runtime.shutdown_background();
    for finding in &findings {
        println!("{finding}");
    }
    let problems = findings.iter().filter(|f| f.problem).count();
    let warnings = match findings.iter().filter(|f| f.warning).count() {
        0 => String::new(),
        n => format!(", {n} warning(s)"),
    };
    if problems == 0 {
        eprintln!(
            "naryad check-config: {}: no problems{warnings}",
            config_path.display()
        );
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "naryad check-config: {}: {problems} problem(s){warnings}",
            config_path.display()
        );
        ExitCode::FAILURE
    }
}

fn serve(config_path: PathBuf) -> ExitCode {
    let (config, runtime) = match start(&config_path, "info") {
        Ok(started) => started,
        Err(code) => return code,
    };
    let result = runtime.block_on(narya::daemon::run(config));
    // Past the shutdown timeout, a create may still be in a blocking step; it must not hold
    // the exit, and what it was doing is already recorded as interrupted.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "naryad stopped on an error");
            eprintln!("naryad: {e}");
            ExitCode::FAILURE
        }
    }
}

fn pack_image(args: PackImageArgs) -> ExitCode {
    let created = match args.created {
        Some(created) => created,
        None => match created_from_environment() {
            Ok(created) => created,
            Err(e) => {
                eprintln!("naryad pack-image: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let options = PackOptions {
        tag: args.tag,
        user: args.user,
        workdir: args.workdir,
        created,
    };
    let digest = match layout::pack(&args.rootfs, &args.out, &options) {
        Ok(digest) => digest,
        Err(e) => {
            eprintln!("naryad pack-image: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(archive) = &args.archive {
        if let Err(e) = layout::write_archive(&args.out, archive) {
            eprintln!("naryad pack-image: {e}");
            return ExitCode::FAILURE;
        }
    }
    println!("{digest}");
    ExitCode::SUCCESS
}

/// The creation time reproducible builds agree on: `SOURCE_DATE_EPOCH` when set, else the epoch.
fn created_from_environment() -> Result<String, String> {
    let seconds = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(value) => value.trim().parse::<i64>().map_err(|_| {
            format!("SOURCE_DATE_EPOCH={value:?} is not a number of seconds; unset it or pass --created")
        })?,
        Err(_) => 0,
    };
    let time = OffsetDateTime::from_unix_timestamp(seconds)
        .map_err(|e| format!("SOURCE_DATE_EPOCH={seconds} is out of range: {e}"))?;
    time.format(&Rfc3339)
        .map_err(|e| format!("cannot format SOURCE_DATE_EPOCH={seconds}: {e}"))
}

/// Accepts any RFC 3339 time and writes it in UTC, so equal instants give equal images.
fn parse_rfc3339(value: &str) -> Result<String, String> {
    let time = OffsetDateTime::parse(value, &Rfc3339)
        .map_err(|e| format!("not an RFC 3339 time such as 2025-05-20T00:00:00Z: {e}"))?;
    time.to_offset(time::UtcOffset::UTC)
        .format(&Rfc3339)
        .map_err(|e| format!("cannot write {value:?} as RFC 3339: {e}"))
}
