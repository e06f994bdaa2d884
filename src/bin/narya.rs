//! `narya`: the command-line client of Narya host.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use narya::api::types::{ConnectGitHubBody, CreateBody, EnvironmentView, ExecBody};
use narya::client::{Client, ClientError, Endpoint};
use narya::config::DEFAULT_SOCKET;
use narya::devkeys::{self, DevKey, TokenRequest};
use serde::Serialize;

#[path = "narya/render.rs"]
mod render;
#[path = "narya/stream.rs"]
mod stream;

use render::{print_environment, print_table};
use stream::{create_streamed, exec_streamed, watch};

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
    /// Connect the organisation's GitHub App installation, with the code GitHub handed you
    /// after installing the App (its setup page passes both on).
    Connect {
        installation_id: u64,
        /// The one-time OAuth code that proves you can access the installation.
        #[arg(long)]
        code: String,
    },
    /// Show the connected installation and its GitHub account.
    Show,
    /// Disconnect the installation: repository-carrying creates are refused from then on.
    Disconnect,
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
        Command::Github(github) => run_github(&client, github, cli.json).await,
        Command::Dev(_) => Ok(Outcome::Done),
    }
}

/// Usage errors exit 2, as clap's do.
fn usage(message: String) -> anyhow::Error {
    eprintln!("narya: {message}");
    std::process::exit(2)
}

async fn run_github(
    client: &Client,
    command: &GithubCommand,
    json_out: bool,
) -> anyhow::Result<Outcome> {
    match command {
        GithubCommand::Connect {
            installation_id,
            code,
        } => {
            let body = ConnectGitHubBody {
                installation_id: *installation_id,
                code: code.clone(),
            };
            client.connect_github(&body).await?;
            println!("connected GitHub installation {installation_id}");
        }
        GithubCommand::Show => {
            let connected = client.github().await?;
            if json_out {
                println!("{}", serde_json::to_string_pretty(&connected)?);
            } else {
                println!(
                    "GitHub installation {} of {}",
                    connected.installation_id,
                    connected.account.as_deref().unwrap_or("an unnamed account")
                );
            }
        }
        GithubCommand::Disconnect => {
            client.disconnect_github().await?;
            println!("disconnected the GitHub installation");
        }
    }
    Ok(Outcome::Done)
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
