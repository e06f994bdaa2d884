//! The disk bound's row of the table, its target and its method, in `BENCHMARKS.md`.

use std::fmt::Write;

use super::{cell, over, yes, Outcome, Verdict};
use crate::bench::DISK_BOUND;
use crate::stats::spread;

pub const RATIO: f64 = 1.10;

pub const TARGETS: [&str; 1] = ["create with `[limits] disk` ≤ 1.10× create without it"];

/// The disk row's verdict on every back end where it ran.
pub(super) fn verdicts(outcomes: &[Outcome]) -> Vec<Verdict> {
    outcomes
        .iter()
        .filter_map(|outcome| {
            let measured = outcome.disk.as_ref()?;
            let (holds, detail) = match measured {
                Ok(pair) => {
                    let ratio = pair.ratio();
                    (ratio <= RATIO, format!("{ratio:.2}×{}", over(ratio, RATIO)))
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

/// The disk row of the results table.
pub(super) fn rows(outcomes: &[Outcome], verdicts: &[Verdict]) -> String {
    let mut t = String::new();
    for outcome in outcomes {
        let name = outcome.backend.name();
        let verdict = verdicts
            .iter()
            .find(|v| v.backend == outcome.backend && v.target == TARGETS[0])
            .map_or("?", |v| yes(v.holds));
        let _ = match &outcome.disk {
            None => continue,
            Some(Err(e)) => writeln!(
                t,
                "| {name} | **the disk bound's run failed** | {} | | | | **no** |",
                cell(e)
            ),
            Some(Ok(pair)) => writeln!(
                t,
                "| {name} | create with `[limits] disk = \"{DISK_BOUND}\"` (narya column) vs `\"unbounded\"` (raw column, a second daemon) ({} a side) | {} | {} | {:.2}× | ≤ {RATIO}× | {verdict} |",
                pair.ours.len(),
                spread(&pair.ours),
                spread(&pair.raw),
                pair.ratio(),
            ),
        };
    }
    t
}

/// What went wrong in the disk row, a line per back end.
pub(super) fn failures(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|o| match o.disk.as_ref()? {
            Ok(_) => None,
            Err(e) => Some(format!("- {} with a disk bound: {e}", o.backend.name())),
        })
        .collect()
}

pub const METHOD: &str = "- **disk bound**: two more `naryad` per back end, both with their state \
on the test services' btrfs filesystem with simple quotas, on the host's network and with no pool: one \
with `[limits] disk = \"10GiB\"` (each workspace made a subvolume heading a quota group, the \
machine's writable layer made a subvolume in it before the machine starts), one with `disk = \
\"unbounded\"`; a setup-less create on each (`201`, `ready`), deleted again, alternated. Not run \
where there is no such filesystem.\n";
