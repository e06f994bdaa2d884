//! The prebuild rows: a repeat create of a prebuilt key against the first one, their targets
//! and their method.

use std::fmt::Write;

use super::{cell, over, yes, Outcome, Verdict};
use crate::stats::{ms, spread};

/// A repeat create answers within this many milliseconds…
pub const REPEAT_MS: f64 = 1500.0;
/// …and within this share of the first create of its key.
pub const RATIO: f64 = 0.05;

pub const TARGETS: [&str; 2] = [
    "repeat create of a prebuilt key (repository + 30 s setup) ≤ 1.5 s",
    "repeat create of a prebuilt key ≤ 0.05× the first create of that key",
];

/// The rows' verdicts on every back end where they ran.
pub(super) fn verdicts(outcomes: &[Outcome]) -> Vec<Verdict> {
    let mut all = Vec::new();
    for outcome in outcomes {
        let Some(measured) = outcome.prebuild.as_ref() else {
            continue;
        };
        let [(repeat_holds, repeat), (ratio_holds, ratio)] = match measured {
            Ok(r) => {
                let (repeat, ratio) = (r.repeat.median(), r.repeat.median() / r.first.median());
                let short = if r.sleep < crate::bench::PREBUILD_SLEEP {
                    format!(" (short mode: a {} s setup)", r.sleep)
                } else {
                    String::new()
                };
                [
                    (
                        repeat <= REPEAT_MS,
                        format!("{}{}{short}", ms(repeat), over(repeat, REPEAT_MS)),
                    ),
                    (
                        ratio <= RATIO,
                        format!("{ratio:.3}×{}{short}", over(ratio, RATIO)),
                    ),
                ]
            }
            Err(_) => {
                let failed = (false, "not measured: the run failed".to_owned());
                [failed.clone(), failed]
            }
        };
        for (target, (holds, detail)) in TARGETS
            .iter()
            .zip([(repeat_holds, repeat), (ratio_holds, ratio)])
        {
            all.push(Verdict {
                target: (*target).to_owned(),
                backend: outcome.backend,
                holds,
                detail,
            });
        }
    }
    all
}

/// The prebuild row of the results table.
pub(super) fn rows(outcomes: &[Outcome], verdicts: &[Verdict]) -> String {
    let mut t = String::new();
    for outcome in outcomes {
        let name = outcome.backend.name();
        let verdict = |target: &str| {
            verdicts
                .iter()
                .find(|v| v.backend == outcome.backend && v.target == target)
                .map_or("?", |v| yes(v.holds))
        };
        let _ = match &outcome.prebuild {
            None => continue,
            Some(Err(e)) => writeln!(
                t,
                "| {name} | **the prebuild run failed** | {} | | | | **no** |",
                cell(e)
            ),
            Some(Ok(r)) => writeln!(
                t,
                "| {name} | create with a repository and a setup of `sleep {}` + {} MiB written (half in `/home/narya`, half in the workspace): a repeat of a prebuilt key under a new identifier (narya column, {}) vs the first create of a key (raw column, {}); one prebuild keeps {:.1} MiB | {} | {} | {:.3}× | ≤ {} and ≤ {RATIO}× | {} / {} |",
                r.sleep,
                r.mib,
                r.repeat.len(),
                r.first.len(),
                r.bytes as f64 / (1u64 << 20) as f64,
                spread(&r.repeat),
                spread(&r.first),
                r.repeat.median() / r.first.median(),
                ms(REPEAT_MS),
                verdict(TARGETS[0]),
                verdict(TARGETS[1]),
            ),
        };
    }
    t
}

/// What went wrong in the prebuild rows, a line per back end.
pub(super) fn failures(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|o| match o.prebuild.as_ref()? {
            Ok(_) => None,
            Err(e) => Some(format!("- {} with prebuilds: {e}", o.backend.name())),
        })
        .collect()
}

pub const METHOD: &str = "- **prebuilds**: one more `naryad` per back end with `[prebuild] enabled`, \
its machines isolated, and GitHub's double (the end-to-end tests' own: the REST API and `git \
http-backend` on loopback) holding a one-commit repository. Creates carry the repository and a \
setup that sleeps 30 s and writes 100 MiB of random bytes, half into `/home/narya` (the machine's \
writable layer) and half into the workspace. Three first creates, each of its own key (the \
scripts differ by a comment): clone, machine, setup, and the prebuild made before the answer. \
Then ten repeats of those keys under new identifiers: the default branch's commit read from the \
git server, the workspace copied with reflinks, the machine started from the committed layer, no \
setup. Each must answer `201` and `ready`, the repeats with `setup.prebuilt_at`. The disk a \
prebuild keeps is the committed layer's archive and the workspace copy, as the daemon records them. \
A short run sleeps 3 s and writes 10 MiB.\n";
