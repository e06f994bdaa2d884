//! The streamed commands: a create or an exec printed as it runs, and the event watch.

use std::io::{IsTerminal, Write};

use narya::api::types::{CreateBody, ExecBody, StatusView};
use narya::client::{Client, CreateEvent, ExecEvent, StepState, WatchEvent};

use crate::render::print_environment;
use crate::{print_json, Outcome};

/// Creates with a streamed answer: progress on stderr as it happens (the clone and setup output
/// too with `--follow`), the environment on stdout at the end.
pub(crate) async fn create_streamed(
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
pub(crate) async fn watch(
    client: &Client,
    only: Option<&str>,
    json_out: bool,
) -> anyhow::Result<Outcome> {
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
pub(crate) async fn exec_streamed(
    client: &Client,
    id: &str,
    body: &ExecBody,
) -> anyhow::Result<Outcome> {
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
