//! The row of the daemon's memory with a store full of large rows, its target and its method.

use std::fmt::Write;

use super::{cell, mib, over, yes, Outcome, Verdict};

pub const LOADED_MB: f64 = 100.0;

pub const TARGETS: [&str; 1] =
    ["daemon peak RSS with 10 000 deleted rows of 64 KiB scripts and outputs < 100 MB"];

/// The row's verdict on every back end where it ran.
pub(super) fn verdicts(outcomes: &[Outcome]) -> Vec<Verdict> {
    outcomes
        .iter()
        .filter_map(|outcome| {
            let (holds, detail) = match outcome.rows.as_ref()? {
                Ok(r) => {
                    let peak = mib(r.loaded_kib);
                    let partial = match r.rows == crate::bench::ROWS {
                        true => String::new(),
                        false => format!(" with {} rows (short mode)", r.rows),
                    };
                    (
                        peak < LOADED_MB,
                        format!("{peak:.1} MiB{}{partial}", over(peak, LOADED_MB)),
                    )
                }
                Err(_) => (false, "not measured: the run failed".to_owned()),
            };
            Some(Verdict {
                target: TARGETS[0].to_owned(),
                backend: outcome.backend,
                holds,
                detail,
            })
        })
        .collect()
}

/// The row of the results table.
pub(super) fn rows(outcomes: &[Outcome], verdicts: &[Verdict]) -> String {
    let mut t = String::new();
    for outcome in outcomes {
        let name = outcome.backend.name();
        let verdict = verdicts
            .iter()
            .find(|v| v.backend == outcome.backend && v.target == TARGETS[0])
            .map_or("?", |v| yes(v.holds));
        let _ = match &outcome.rows {
            None => continue,
            Some(Err(e)) => writeln!(
                t,
                "| {name} | **the large rows' run failed** | {} | | | | **no** |",
                cell(e)
            ),
            Some(Ok(r)) => writeln!(
                t,
                "| {name} | daemon peak RSS with {} deleted rows of 64 KiB scripts and outputs (narya column) vs an empty store (raw column), one create, 10 s of passes | {:.1} MiB | {:.1} MiB | {:.2}× | < {LOADED_MB} MB | {verdict} |",
                r.rows,
                mib(r.loaded_kib),
                mib(r.empty_kib),
                r.loaded_kib as f64 / r.empty_kib.max(1) as f64,
            ),
        };
    }
    t
}

/// What went wrong in the row, a line per back end.
pub(super) fn failures(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|o| match o.rows.as_ref()? {
            Ok(_) => None,
            Err(e) => Some(format!("- {} with large rows: {e}", o.backend.name())),
        })
        .collect()
}

pub const METHOD: &str = "- **memory with large rows**: two more `naryad` per back end on the \
host's network with no pool: one on an empty store, one whose store was seeded before it \
started with 10 000 deleted environments of another organisation (64 KiB setup scripts, 64 KiB \
of output that is not UTF-8, within their retention, as churn leaves them); each makes one \
environment, runs 10 s (five of the reconciler's full passes), and its VmHWM is read.\n";
