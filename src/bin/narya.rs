//! `narya`: the command-line client of Narya host.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use hyper::{Method, StatusCode};
use narya::api::types::{EnvironmentList, EnvironmentView};
use narya::client::{Answer, Client, Endpoint};
use narya::config::DEFAULT_SOCKET;
use narya::devkeys::{self, DevKey, TokenRequest};
use serde_json::json;

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
            eprintln!("narya: {e:#}");
            ExitCode::from(1)
        }
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
            let answer = client
                .send_json(
                    Method::PUT,
                    "/v1/organisation/github",
                    &json!({ "installation_id": installation_id }),
                )
                .await?;
            if report_error(&answer) {
                return Ok(Outcome::ApiError);
            }
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
    let answer = match command {
        EnvCommand::Create {
            id,
            setup,
            repository,
            follow,
        } => {
            let mut body = json!({ "id": id });
            if let Some(path) = setup {
                let script = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read the setup script {}", path.display()))?;
                body["setup"] = json!(script);
            }
            if let Some(repository) = repository {
                body["repository"] = json!(repository);
            }
            return create_streamed(client, &body, json_out, *follow).await;
        }
        EnvCommand::Get { id } => {
            client
                .send(
                    Method::GET,
                    &format!("/v1/environments/{}", path_segment(id)),
                    None,
                )
                .await?
        }
        EnvCommand::List => client.send(Method::GET, "/v1/environments", None).await?,
        EnvCommand::Replace { id } => {
            client
                .send(
                    Method::POST,
                    &format!("/v1/environments/{}/replace", path_segment(id)),
                    None,
                )
                .await?
        }
        EnvCommand::Delete { id } => {
            client
                .send(
                    Method::DELETE,
                    &format!("/v1/environments/{}", path_segment(id)),
                    None,
                )
                .await?
        }
        EnvCommand::Exec {
            id,
            timeout,
            cwd,
            env,
            no_stdin,
            command,
        } => {
            let mut body = json!({ "argv": command });
            if let Some(timeout) = timeout {
                body["timeout"] = json!(timeout);
            }
            if let Some(cwd) = cwd {
                body["cwd"] = json!(cwd);
            }
            let mut vars = serde_json::Map::new();
            for pair in env {
                let Some((key, value)) = pair.split_once('=') else {
                    return Err(usage(format!("--env {pair:?}: write KEY=VALUE")));
                };
                vars.insert(key.to_owned(), json!(value));
            }
            if !vars.is_empty() {
                body["env"] = serde_json::Value::Object(vars);
            }
            if !no_stdin && !std::io::stdin().is_terminal() {
                let mut input = String::new();
                std::io::stdin()
                    .read_to_string(&mut input)
                    .context("cannot read standard input (pass -n to send none)")?;
                if !input.is_empty() {
                    body["stdin"] = json!(input);
                }
            }
            let path = format!("/v1/environments/{}/exec", path_segment(id));
            return exec_streamed(client, &path, &body).await;
        }
    };
    if report_error(&answer) {
        return Ok(Outcome::ApiError);
    }
    let mut out = std::io::stdout().lock();
    if json_out && !answer.body.is_empty() {
        out.write_all(&answer.body)?;
        writeln!(out)?;
        return Ok(Outcome::Done);
    }
    match command {
        EnvCommand::List => {
            let list: EnvironmentList = serde_json::from_slice(&answer.body)
                .context("the daemon's answer is not an environment list")?;
            print_table(&mut out, &list.environments)?;
        }
        EnvCommand::Delete { id } => writeln!(out, "deleted {id}")?,
        EnvCommand::Exec { .. } => {}
        EnvCommand::Create { .. } | EnvCommand::Get { .. } | EnvCommand::Replace { .. } => {
            let env: EnvironmentView = serde_json::from_slice(&answer.body)
                .context("the daemon's answer is not an environment")?;
            // A create that leaves an unusable environment did not give the person what they
            // asked for; a get that shows one did.
            let created = matches!(command, EnvCommand::Create { .. });
            print_environment(&mut out, &env, created && answer.status == StatusCode::OK)?;
            if created && env.status == narya::api::types::StatusView::Unusable {
                return Ok(Outcome::ApiError);
            }
        }
    }
    Ok(Outcome::Done)
}

/// Creates with a streamed answer: progress on stderr as it happens (the clone and setup output
/// too with `--follow`), the environment on stdout at the end.
async fn create_streamed(
    client: &Client,
    body: &serde_json::Value,
    json_out: bool,
    follow: bool,
) -> anyhow::Result<Outcome> {
    let mut answer = client
        .stream_json(Method::POST, "/v1/environments", body)
        .await?;
    if !answer.streaming {
        return report_plain_error(answer).await;
    }
    let terminal = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    let mut step_started: std::collections::HashMap<String, std::time::Instant> =
        Default::default();
    let mut environment = None;
    while let Some(line) = answer.next_line().await? {
        let event: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("the daemon sent a line that is not JSON: {line:?}"))?;
        if let Some(env) = event.get("environment") {
            environment = Some(env.clone());
            continue;
        }
        if let Some(error) = event.get("error") {
            return Ok(report_stream_error(error));
        }
        if json_out {
            continue;
        }
        let step = event["step"].as_str().unwrap_or("?").to_owned();
        if let Some(output) = event.get("output").and_then(|o| o.as_str()) {
            if follow {
                print!("{output}");
                std::io::stdout().flush()?;
            }
            continue;
        }
        match event["state"].as_str() {
            Some("started") => {
                step_started.insert(step.clone(), std::time::Instant::now());
                if terminal {
                    eprintln!("  {step:<8} …");
                } else {
                    eprintln!("{step} started");
                }
            }
            Some("finished") => {
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
            _ => {}
        }
    }
    let Some(environment) = environment else {
        eprintln!("error: the daemon's stream ended without the environment");
        return Ok(Outcome::ApiError);
    };
    let mut out = std::io::stdout().lock();
    if json_out {
        writeln!(out, "{environment}")?;
    } else {
        let env: EnvironmentView = serde_json::from_value(environment.clone())
            .context("the daemon's answer is not an environment")?;
        print_environment(&mut out, &env, answer.status == StatusCode::OK)?;
        if !terminal {
            writeln!(out, "({:.1}s)", started.elapsed().as_secs_f64())?;
        }
    }
    let unusable = environment["status"] == "unusable";
    Ok(if unusable {
        Outcome::ApiError
    } else {
        Outcome::Done
    })
}

/// Runs a command with its output streamed to stdout; exits with the command's exit code
/// (124 when it ran past its time-out, as timeout(1) does; 137 when it was killed).
async fn exec_streamed(
    client: &Client,
    path: &str,
    body: &serde_json::Value,
) -> anyhow::Result<Outcome> {
    let mut answer = client.stream_json(Method::POST, path, body).await?;
    if !answer.streaming {
        return report_plain_error(answer).await;
    }
    let mut stdout = std::io::stdout();
    while let Some(line) = answer.next_line().await? {
        let event: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("the daemon sent a line that is not JSON: {line:?}"))?;
        if let Some(output) = event.get("output").and_then(|o| o.as_str()) {
            stdout.write_all(output.as_bytes())?;
            stdout.flush()?;
        } else if let Some(error) = event.get("error") {
            return Ok(report_stream_error(error));
        } else if event.get("timed_out").is_some() {
            let code = if event["timed_out"] == true {
                124
            } else {
                match event["exit_code"].as_i64() {
                    Some(code) => i32::try_from(code).unwrap_or(1),
                    None => 137,
                }
            };
            std::process::exit(code);
        }
    }
    eprintln!("error: the daemon's stream ended without the command's exit");
    Ok(Outcome::ApiError)
}

/// A streamed request answered with a plain error (found before anything started): printed.
async fn report_plain_error(answer: narya::client::Streamed) -> anyhow::Result<Outcome> {
    let status = answer.status;
    let body = answer.rest().await?;
    report_error(&Answer {
        status,
        headers: Default::default(),
        body,
    });
    Ok(Outcome::ApiError)
}

/// A stream's last line `{"error": {code, message}}`: printed like any API error.
fn report_stream_error(error: &serde_json::Value) -> Outcome {
    eprintln!(
        "error {}: {}",
        error["code"].as_str().unwrap_or("NRY-0099"),
        error["message"].as_str().unwrap_or("the request failed")
    );
    Outcome::ApiError
}

/// Prints an error answer as `error NRY-NNNN: message`; whether the answer was one.
fn report_error(answer: &Answer) -> bool {
    if answer.status.is_success() {
        return false;
    }
    match answer.error() {
        Some(e) => eprintln!("error {}: {}", e.code, e.message),
        None => eprintln!(
            "error: the daemon answered {} with {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        ),
    }
    true
}

/// Identifiers are sent as one path segment; anything outside the id alphabet is escaped so the
/// daemon sees (and refuses) it as the person typed it.
fn path_segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"._-".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn print_environment(
    out: &mut impl Write,
    env: &EnvironmentView,
    existed: bool,
) -> std::io::Result<()> {
    let status = match &env.status_detail {
        Some(detail) => format!("{} ({detail})", status_word(env)),
        None => status_word(env).to_owned(),
    };
    writeln!(out, "id          {}", env.id)?;
    writeln!(out, "status      {status}")?;
    writeln!(out, "image       {}", env.image_digest)?;
    if let Some(repository) = &env.repository {
        writeln!(out, "repository  {repository}")?;
    }
    writeln!(out, "created     {}", env.created_at)?;
    if let Some(setup) = &env.setup {
        let exit = match setup.exit_code {
            Some(code) => format!("exit {code}"),
            None => "killed".to_owned(),
        };
        writeln!(
            out,
            "{:<12}{} ({exit}), {} → {}",
            setup.step, setup.state, setup.started_at, setup.finished_at
        )?;
        if env.status == narya::api::types::StatusView::Unusable {
            writeln!(
                out,
                "--- {} output{} ---",
                setup.step,
                if setup.output_truncated {
                    " (tail)"
                } else {
                    ""
                }
            )?;
            out.write_all(setup.output.as_bytes())?;
            if !setup.output.ends_with('\n') {
                writeln!(out)?;
            }
        }
    }
    if existed {
        writeln!(
            out,
            "(it already existed: nothing was provisioned, no setup ran)"
        )?;
    }
    Ok(())
}

fn status_word(env: &EnvironmentView) -> &'static str {
    use narya::api::types::StatusView;
    match env.status {
        StatusView::Ready => "ready",
        StatusView::Degraded => "degraded",
        StatusView::Gone => "gone",
        StatusView::Unusable => "unusable",
    }
}

fn print_table(out: &mut impl Write, envs: &[EnvironmentView]) -> std::io::Result<()> {
    if envs.is_empty() {
        return writeln!(out, "no environments");
    }
    let rows: Vec<[String; 5]> = envs
        .iter()
        .map(|e| {
            [
                e.id.clone(),
                status_word(e).to_owned(),
                e.image_digest
                    .strip_prefix("sha256:")
                    .map(|h| h.chars().take(12).collect())
                    .unwrap_or_else(|| e.image_digest.clone()),
                e.created_at.clone(),
                e.setup
                    .as_ref()
                    .map(|s| s.state.clone())
                    .unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    let header = ["ID", "STATUS", "DIGEST", "CREATED", "SETUP"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 5]| {
        cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    writeln!(out, "{}", line(header))?;
    for row in &rows {
        writeln!(
            out,
            "{}",
            line([&row[0], &row[1], &row[2], &row[3], &row[4]])
        )?;
    }
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
