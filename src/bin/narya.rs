//! `narya`: the command-line client of Narya host.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use narya::api::types::{ConnectGitHubBody, CreateBody, EnvironmentView, ExecBody, StatusView};
use narya::client::{Client, ClientError, CreateEvent, Endpoint, ExecEvent, StepState, WatchEvent};
use narya::config::DEFAULT_SOCKET;
use narya::devkeys::{self, DevKey, TokenRequest};
use serde::Serialize;

#[path = "narya/render.rs"]
mod render;

use render::{print_environment, print_table};

/// Ask the Narya host for development environments.
#[derive(Parser)]
#[command(name = "narya", version)]
struct Cli {
    /// The daemon's unix socket.
    #[arg(long, global = true, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Talk to the daemon over TCP instead, e.g. http://127.0.0.1:7070.
    #[arg(long, global = true)]
    url: Option<String>,
    /// The bearer token (a JWT from your identity provider).
    #[arg(long, global = true, env = "NARYA_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print JSON instead of a readable table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Environments: create, get, list, delete, exec.
    #[command(subcommand)]
    Env(EnvCommand),
    /// The organisation's GitHub App installation.
    #[command(subcommand)]
    Github(GithubCommand),
    /// Development helpers: tokens and key sets from a local key.
    #[command(subcommand)]
    Dev(DevCommand),
}

#[derive(Subcommand)]
enum EnvCommand {
    /// Provision an environment (a repeat answers with the one that exists).
    Create {
        id: String,
        /// A file holding the setup script, run once inside the new environment.
        #[arg(long)]
        setup: Option<PathBuf>,
        /// A repository the organisation connected, as OWNER/NAME.
        #[arg(long)]
        repository: Option<String>,
        /// Print the clone and setup output as it happens.
        #[arg(long, short)]
        follow: bool,
    },
    /// Show one environment.
    Get { id: String },
    /// List the organisation's environments.
    List,
    /// Destroy an environment's machine and workspace.
    Delete { id: String },
    /// Make a gone environment again from its pinned digest, keeping its workspace.
    Replace { id: String },
    /// Print the organisation's status changes as they happen (of one environment with ID),
    /// until the daemon stops.
    Watch { id: Option<String> },
    /// Run a command in a ready environment.
    Exec {
        id: String,
        /// The longest the command may run, e.g. "10m" (default: the host's limit).
        #[arg(long)]
        timeout: Option<String>,
        /// The working directory inside the environment (default: the workspace).
        #[arg(long)]
        cwd: Option<String>,
        /// An environment variable for the command, KEY=VALUE; repeatable.
        #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// Do not send this terminal's standard input (it is sent when it is not a terminal).
        #[arg(long, short = 'n')]
        no_stdin: bool,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

#[derive(Subcommand)]
enum GithubCommand {
    /// Connect the organisation's GitHub App installation.
    Connect { installation_id: u64 },
}

#[derive(Subcommand)]
enum DevCommand {
    /// Mint a development token from a local PEM private key.
    Token(TokenArgs),
    /// Print the public key set (JWKS) of a local PEM private key.
    Jwks {
        #[arg(long)]
        key: PathBuf,
    },
}

#[derive(Args)]
struct TokenArgs {
    #[arg(long)]
    key: PathBuf,
    #[arg(long)]
    issuer: String,
    #[arg(long)]
    audience: String,
    #[arg(long)]
    person: String,
    #[arg(long)]
    organisation: String,
    /// How long the token is valid, e.g. "1h".
    #[arg(long, default_value = "1h")]
    ttl: String,
    #[arg(long, default_value = "sub")]
    person_claim: String,
    #[arg(long, default_value = "org")]
    organisation_claim: String,
}

/// How a command ended, for the exit code.
enum Outcome {
    Done,
    ApiError,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(run(cli)),
        Err(e) => Err(anyhow::anyhow!("cannot start the async runtime: {e}")),
    };
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::ApiError) => ExitCode::from(1),
        Err(e) => {
            report(&e);
            ExitCode::from(1)
        }
    }
}

/// Prints why a command failed: the daemon's refusal as `error NRY-NNNN: message`, anything
/// else as `narya: …` with its causes.
fn report(e: &anyhow::Error) {
    match e.downcast_ref::<ClientError>() {
        Some(ClientError::Api { error, .. } | ClientError::Failed { error }) => {
            eprintln!("error {}: {}", error.code, error.message);
        }
        Some(unexpected @ ClientError::Unexpected { .. }) => eprintln!("error: {unexpected}"),
        _ => eprintln!("narya: {e:#}"),
    }
}

async fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match &cli.command {
        Command::Dev(dev) => return run_dev(dev),
        Command::Env(_) | Command::Github(_) => {}
    }
    let endpoint = match &cli.url {
        Some(url) => Endpoint::from_url(url).map_err(usage)?,
        None => Endpoint::Unix(cli.socket.clone()),
    };
    let Some(token) = cli.token.clone() else {
        return Err(usage(
            "no token: pass --token or set NARYA_TOKEN (on a dev host, see README.md)".to_owned(),
        ));
    };
    let client = Client::new(endpoint, Some(token));
    match &cli.command {
        Command::Env(env) => run_env(&client, env, cli.json).await,
        Command::Github(GithubCommand::Connect { installation_id }) => {
            let body = ConnectGitHubBody {
                installation_id: *installation_id,
            };
            client.connect_github(&body).await?;
            println!("connected GitHub installation {installation_id}");
            Ok(Outcome::Done)
        }
        Command::Dev(_) => Ok(Outcome::Done),
    }
}

/// Usage errors exit 2, as clap's do.
fn usage(message: String) -> anyhow::Error {
    eprintln!("narya: {message}");
    std::process::exit(2)
}

async fn run_env(client: &Client, command: &EnvCommand, json_out: bool) -> anyhow::Result<Outcome> {
    match command {
        EnvCommand::Create {
            id,
            setup,
            repository,
            follow,
        } => {
            let setup =
                match setup {
                    Some(path) => Some(std::fs::read_to_string(path).with_context(|| {
                        format!("cannot read the setup script {}", path.display())
                    })?),
                    None => None,
                };
            let body = CreateBody {
                id: id.clone(),
                setup,
                repository: repository.clone(),
            };
            create_streamed(client, &body, json_out, *follow).await
        }
        EnvCommand::Get { id } => {
            let environment = client.get(id).await?;
            show_environment(&environment, json_out)
        }
        EnvCommand::Replace { id } => {
            let environment = client.replace(id).await?;
            show_environment(&environment, json_out)
        }
        EnvCommand::Watch { id } => watch(client, id.as_deref(), json_out).await,
        EnvCommand::List => {
            let list = client.list().await?;
            let mut out = std::io::stdout().lock();
            if json_out {
                print_json(&mut out, &list)?;
            } else {
                print_table(&mut out, &list.environments)?;
            }
            Ok(Outcome::Done)
        }
        EnvCommand::Delete { id } => {
            client.delete(id).await?;
            println!("deleted {id}");
            Ok(Outcome::Done)
        }
        EnvCommand::Exec {
            id,
            timeout,
            cwd,
            env,
            no_stdin,
            command,
        } => {
            let mut vars = BTreeMap::new();
            for pair in env {
                let Some((key, value)) = pair.split_once('=') else {
                    return Err(usage(format!("--env {pair:?}: write KEY=VALUE")));
                };
                vars.insert(key.to_owned(), value.to_owned());
            }
            let mut stdin = None;
            if !no_stdin && !std::io::stdin().is_terminal() {
                let mut input = String::new();
                std::io::stdin()
                    .read_to_string(&mut input)
                    .context("cannot read standard input (pass -n to send none)")?;
                if !input.is_empty() {
                    stdin = Some(input);
                }
            }
            let body = ExecBody {
                argv: command.clone(),
                env: vars,
                cwd: cwd.clone(),
                timeout: timeout.clone(),
                stdin,
            };
            exec_streamed(client, id, &body).await
        }
    }
}

/// An environment a get or replace answered. Shown, even when unusable: the get did what it was
/// asked.
fn show_environment(environment: &EnvironmentView, json_out: bool) -> anyhow::Result<Outcome> {
    let mut out = std::io::stdout().lock();
    if json_out {
        print_json(&mut out, environment)?;
    } else {
        print_environment(&mut out, environment, false)?;
    }
    Ok(Outcome::Done)
}

/// `--json` prints an answer as the daemon sends it: compact, on one line.
fn print_json(out: &mut impl Write, value: &impl Serialize) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    writeln!(out)?;
    Ok(())
}

/// Creates with a streamed answer: progress on stderr as it happens (the clone and setup output
/// too with `--follow`), the environment on stdout at the end.
async fn create_streamed(
    client: &Client,
    body: &CreateBody,
    json_out: bool,
    follow: bool,
) -> anyhow::Result<Outcome> {
    let mut answer = client.create_streamed(body).await?;
    if let Some(differs) = answer.differs() {
        eprintln!(
            "warning: {} already exists and was made with another {differs}; it is answered as it is and nothing ran — delete it and create it again to apply this request's {differs}",
            body.id
        );
    }
    let terminal = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    let mut step_started: std::collections::HashMap<String, std::time::Instant> =
        Default::default();
    let mut environment = None;
    while let Some(event) = answer.next_event().await? {
        match event {
            CreateEvent::Environment(env) => environment = Some(*env),
            _ if json_out => {}
            CreateEvent::Output { output, .. } => {
                if follow {
                    print!("{output}");
                    std::io::stdout().flush()?;
                }
            }
            CreateEvent::Step {
                step,
                state: StepState::Started,
            } => {
                if terminal {
                    eprintln!("  {step:<8} …");
                } else {
                    eprintln!("{step} started");
                }
                step_started.insert(step, std::time::Instant::now());
            }
            CreateEvent::Step {
                step,
                state: StepState::Finished,
            } => {
                let took = step_started
                    .get(&step)
                    .map(|at| at.elapsed().as_secs_f64())
                    .unwrap_or_default();
                if terminal {
                    eprintln!("\x1b[1A\x1b[2K  {step:<8} done  {took:.1}s");
                } else {
                    eprintln!("{step} finished in {took:.1}s");
                }
            }
        }
    }
    let Some(environment) = environment else {
        eprintln!("error: the daemon's stream ended without the environment");
        return Ok(Outcome::ApiError);
    };
    let mut out = std::io::stdout().lock();
    if json_out {
        // Through a JSON value, whose keys print sorted: the line reads as it always has.
        writeln!(out, "{}", serde_json::to_value(&environment)?)?;
    } else {
        print_environment(&mut out, &environment, answer.existed())?;
        if !terminal {
            writeln!(out, "({:.1}s)", started.elapsed().as_secs_f64())?;
        }
    }
    // A create that leaves an unusable environment did not give the person what they asked for.
    Ok(if environment.status == StatusView::Unusable {
        Outcome::ApiError
    } else {
        Outcome::Done
    })
}

/// Prints status changes as they come, one a line, until the daemon ends the stream. "watching"
/// goes to stderr once the daemon has subscribed, so a script knows nothing later is missed.
async fn watch(client: &Client, only: Option<&str>, json_out: bool) -> anyhow::Result<Outcome> {
    let mut changes = client.watch().await?;
    match only {
        Some(id) => eprintln!("watching {id}"),
        None => eprintln!("watching every environment of the organisation"),
    }
    let mut out = std::io::stdout();
    while let Some(event) = changes.next_event().await? {
        match event {
            WatchEvent::Lagged(missed) => {
                eprintln!("warning: fell behind and missed {missed} status changes");
            }
            WatchEvent::Changed(change) if only.is_some_and(|id| id != change.id) => {}
            WatchEvent::Changed(change) if json_out => print_json(&mut out, &change)?,
            WatchEvent::Changed(change) => {
                let status = serde_json::to_value(change.status)?;
                let status = status.as_str().unwrap_or_default();
                match &change.status_detail {
                    Some(detail) => {
                        writeln!(out, "{}  {}  {status}  {detail}", change.at, change.id)?
                    }
                    None => writeln!(out, "{}  {}  {status}", change.at, change.id)?,
                }
            }
        }
        out.flush()?;
    }
    Ok(Outcome::Done)
}

/// Runs a command with its output streamed to stdout; exits with the command's exit code
/// (124 when it ran past its time-out, as timeout(1) does; 137 when it was killed).
async fn exec_streamed(client: &Client, id: &str, body: &ExecBody) -> anyhow::Result<Outcome> {
    let mut answer = client.exec_streamed(id, body).await?;
    let mut stdout = std::io::stdout();
    while let Some(event) = answer.next_event().await? {
        match event {
            ExecEvent::Output(output) => {
                stdout.write_all(output.as_bytes())?;
                stdout.flush()?;
            }
            ExecEvent::Exited(exit) => {
                let code = if exit.timed_out {
                    124
                } else {
                    match exit.exit_code {
                        Some(code) => i32::try_from(code).unwrap_or(1),
                        None => 137,
                    }
                };
                std::process::exit(code);
            }
        }
    }
    eprintln!("error: the daemon's stream ended without the command's exit");
    Ok(Outcome::ApiError)
}

fn run_dev(command: &DevCommand) -> anyhow::Result<Outcome> {
    let read_key = |path: &PathBuf| -> anyhow::Result<DevKey> {
        let pem = std::fs::read(path)
            .with_context(|| format!("cannot read the key {}", path.display()))?;
        DevKey::from_pem(&pem).with_context(|| format!("{}", path.display()))
    };
    match command {
        DevCommand::Jwks { key } => {
            let key = read_key(key)?;
            println!("{}", serde_json::to_string_pretty(&key.jwks())?);
        }
        DevCommand::Token(args) => {
            let key = read_key(&args.key)?;
            let ttl: Duration = humantime::parse_duration(&args.ttl)
                .map_err(|e| usage(format!("--ttl {:?}: {e}", args.ttl)))?;
            let token = devkeys::mint(
                &key,
                &TokenRequest {
                    issuer: &args.issuer,
                    audience: &args.audience,
                    person: &args.person,
                    organisation: &args.organisation,
                    person_claim: &args.person_claim,
                    organisation_claim: &args.organisation_claim,
                    ttl,
                },
            )?;
            println!("{token}");
        }
    }
    Ok(Outcome::Done)
}
