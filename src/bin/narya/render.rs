//! How `narya` shows environments to a person: one as labelled lines, several as a table.

use std::io::Write;

use narya::api::types::{EnvironmentView, StatusView};

pub fn print_environment(
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
        if env.status == StatusView::Unusable {
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
    match env.status {
        StatusView::Ready => "ready",
        StatusView::Degraded => "degraded",
        StatusView::Gone => "gone",
        StatusView::Unusable => "unusable",
    }
}

pub fn print_table(out: &mut impl Write, envs: &[EnvironmentView]) -> std::io::Result<()> {
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
