//! What the sections of their own (gVisor's, the newer runtimes') share: a table without
//! targets, two sides of each measure and their ratio; a row of its own for a back end where the
//! section was skipped or failed; a note when the section ran alone; its failures.

use std::fmt::Write;

use super::{cell, Context};
use crate::bench::{Plan, SectionReport, SectionRun};
use crate::raw::Backend;
use crate::stats::{spread, Samples};

/// What a section says around its rows.
pub(super) struct Layout<'a> {
    /// Its heading.
    pub title: &'a str,
    /// Its name to `--only`.
    pub only: &'a str,
    /// The paragraph under the heading.
    pub intro: String,
    /// The headings of the two sides' columns and of their ratio's.
    pub columns: [&'a str; 3],
    /// The paragraph under the table.
    pub method: String,
}

/// One row: `measure` on `name`, each side's figure followed by its note, and their `ratio`.
pub(super) fn row(
    t: &mut String,
    name: &str,
    measure: &str,
    sides: [(&Samples, &str); 2],
    ratio: f64,
) {
    let _ = writeln!(
        t,
        "| {name} | {measure} | {}{} | {}{} | {ratio:.2}× |",
        spread(sides[0].0),
        sides[0].1,
        spread(sides[1].0),
        sides[1].1,
    );
}

/// The section for `runs` (each back end's), `rows` writing a measured back end's rows;
/// `alone`: the run of this section by itself whose rows these are, said so, for a section
/// merged into a document of another run.
pub(super) fn render<R: SectionReport>(
    layout: &Layout<'_>,
    plan: &Plan,
    runs: &[(Backend, &SectionRun<R>)],
    alone: Option<&Context>,
    rows: impl Fn(&mut String, Backend, &R),
) -> String {
    let mut s = format!("## {}\n\n{}\n\n", layout.title, layout.intro);
    if let Some(c) = alone {
        let _ = writeln!(
            s,
            "These rows come from a run of this section alone (`narya-bench --only {}{}`) \
             on {}, on the machine described above, from source {}, naryad's {} profile; load \
             average {} at its start, {} at its end. The other sections come from the run \
             described above.\n",
            layout.only,
            if plan.short { " --short" } else { "" },
            c.date,
            c.commit,
            c.naryad_profile,
            c.load_start,
            c.load_end
        );
    }
    let [left, right, ratio] = layout.columns;
    let _ = writeln!(
        s,
        "| back end | measure | {left} | {right} | {ratio} |\n| --- | --- | --- | --- | --- |"
    );
    for (backend, run) in runs {
        let name = backend.name();
        match run {
            SectionRun::Measured(r) => rows(&mut s, *backend, r),
            SectionRun::Skipped(why) => {
                let _ = writeln!(s, "| {name} | **skipped**: {} | | | |", cell(why));
            }
            SectionRun::Failed(e) => {
                // Its first line: the whole, with the daemons' logs, is under the table.
                let first = e.lines().next().unwrap_or_default();
                let _ = writeln!(s, "| {name} | **the run failed** | {} | | |", cell(first));
            }
        }
    }
    let _ = writeln!(s, "\n{}", layout.method);
    let failures: Vec<String> = runs
        .iter()
        .filter_map(|(backend, run)| match run {
            SectionRun::Measured(r) if !r.failures().is_empty() => {
                Some(format!("- {}: {}", backend.name(), r.failures().join("; ")))
            }
            SectionRun::Failed(e) => Some(format!("- {}: {e}", backend.name())),
            _ => None,
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(s, "\nFailures:\n\n{}", failures.join("\n"));
    }
    s
}

/// A short run's plan, for the sections' tests.
#[cfg(test)]
pub(super) fn short_plan() -> Plan {
    Plan {
        short: true,
        samples: 3,
        repeat_samples: 20,
        concurrency: 64,
        rounds: 1,
        exec_loads: Vec::new(),
        exec_rounds: 1,
        loaded: 20,
        list_samples: 3,
        output_load: crate::bench::OutputLoad {
            creates: 4,
            bytes: 1 << 20,
        },
    }
}
