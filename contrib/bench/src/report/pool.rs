//! The pool's rows of the table, their targets and their method, in `BENCHMARKS.md`.

use std::fmt::Write;

use super::{cell, mib, over, yes, Outcome, Verdict};
use crate::stats::{ms, spread};

pub const WARM_P50_MS: f64 = 10.0;
pub const WARM_RATIO: f64 = 0.15;
pub const WARM_P99_MS: f64 = 25.0;
pub const BURST_RATIO: f64 = 1.0;

pub const TARGETS: [&str; 2] = [
    "create from a warm pool: p50 ≤ 10 ms and ≤ 0.15× raw `run -d`, p99 ≤ 25 ms",
    "64 concurrent creates with a pool of 8: 0 errors, wall ≤ 1.0× raw",
];

/// The pool's verdicts on every back end whose pool rows ran.
pub(super) fn verdicts(outcomes: &[Outcome]) -> Vec<Verdict> {
    let mut all = Vec::new();
    for outcome in outcomes {
        let backend = outcome.backend;
        let Some(pool) = &outcome.pool else {
            continue;
        };
        let Ok(p) = pool else {
            for target in TARGETS {
                all.push(Verdict {
                    target: target.to_owned(),
                    backend,
                    holds: false,
                    detail: "not measured: the pool's run failed".to_owned(),
                });
            }
            continue;
        };
        let (p50, p99) = (p.warm.ours.median(), p.warm.ours.percentile(99.0));
        let ratio = p.warm.ratio();
        all.push(Verdict {
            target: TARGETS[0].to_owned(),
            backend,
            holds: p50 <= WARM_P50_MS && ratio <= WARM_RATIO && p99 <= WARM_P99_MS,
            detail: format!(
                "p50 {}{}, {ratio:.2}×{}, p99 {}{}, {} of {} served from the pool",
                ms(p50),
                over(p50, WARM_P50_MS),
                over(ratio, WARM_RATIO),
                ms(p99),
                over(p99, WARM_P99_MS),
                p.warm_from_pool,
                p.warm.ours.len()
            ),
        });
        let b = &p.burst;
        let ratio = b.ratio();
        all.push(Verdict {
            target: TARGETS[1].to_owned(),
            backend,
            holds: ratio <= BURST_RATIO && b.ours_errors == 0,
            detail: format!(
                "{ratio:.2}×{}, {} errors, served from the pool {:?}",
                over(ratio, BURST_RATIO),
                b.ours_errors,
                b.from_pool
            ),
        });
    }
    all
}

/// The pool's rows of the results table.
pub(super) fn rows(outcomes: &[Outcome], verdicts: &[Verdict]) -> String {
    let verdict_of = |outcome: &Outcome, target: &str| -> &'static str {
        verdicts
            .iter()
            .find(|v| v.backend == outcome.backend && v.target == target)
            .map_or("?", |v| yes(v.holds))
    };
    let mut t = String::new();
    for outcome in outcomes {
        let name = outcome.backend.name();
        let p = match &outcome.pool {
            None => continue,
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                let _ = writeln!(
                    t,
                    "| {name} | **the pool's run failed** | {} | | | | **no** |",
                    cell(e)
                );
                continue;
            }
        };
        let _ = writeln!(
            t,
            "| {name} | create from a warm pool of {}, no setup ({} a side; {} served from the pool) | {}; p99 {} | {} (`run -d`) | {:.2}× | p50 ≤ {WARM_P50_MS} ms and ≤ {WARM_RATIO}×, p99 ≤ {WARM_P99_MS} ms | {} |",
            p.size,
            p.warm.ours.len(),
            p.warm_from_pool,
            spread(&p.warm.ours),
            ms(p.warm.ours.percentile(99.0)),
            spread(&p.warm.raw),
            p.warm.ratio(),
            verdict_of(outcome, TARGETS[0])
        );
        let b = &p.burst;
        let _ = writeln!(
            t,
            "| {name} | {} concurrent creates with a pool of {}, wall ({} round{}) | {}; errors {}; from the pool {:?} | {}; errors {} | {:.2}× | ≤ {BURST_RATIO}×, 0 errors | {} |",
            b.creates,
            p.size,
            b.ours.len(),
            if b.ours.len() == 1 { "" } else { "s" },
            spread(&b.ours),
            b.ours_errors,
            b.from_pool,
            spread(&b.raw),
            b.raw_errors,
            b.ratio(),
            verdict_of(outcome, TARGETS[1])
        );
        let c = &p.cost;
        let _ = writeln!(
            t,
            "| {name} | the pool's cost: {} idle machines | {} processes in them and {} shims; RSS {:.1} MiB in all ({:.1} MiB a machine) | — | — | stated | — |",
            c.machines,
            c.processes,
            c.shims,
            mib(c.rss_kib),
            mib(c.rss_kib) / c.machines.max(1) as f64
        );
    }
    t
}

/// What went wrong in the pool's rows, a line per back end.
pub(super) fn failures(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|o| match o.pool.as_ref()? {
            Ok(p) => (!p.burst.failures.is_empty()).then(|| {
                format!(
                    "- {} with a pool: {}",
                    o.backend.name(),
                    p.burst.failures.join("; ")
                )
            }),
            Err(e) => Some(format!("- {} with a pool: {e}", o.backend.name())),
        })
        .collect()
}

pub const METHOD: &str = "- **pool**: one more `naryad` per back end, configured as the others but \
with `[pool] size = 8` and on the host's network, as the raw side is here (a claim costs the same \
on any network: the pool machine's was set up when it was made). **create from a warm pool**: before each sample the benchmark waits \
until 8 machines wait in the pool (a workspace directory of their own under \
`state_dir/workspaces/.pool` whose machine runs), then times a setup-less create (`201`, \
`ready`) and deletes it, alternating with the raw client's `run -d` of the same image (the \
same command as the create row's); p99 is the nearest-rank percentile of the daemon's samples, \
and a create counts as served from the pool when its workspace is linked from the pool's \
directory. **burst**: with the pool full, the concurrent creates of the row above, started at \
once, against as many raw `run -d` at once; wall time until the last answers. **cost**: with the \
pool full and idle, every process whose mounts include a pool machine's workspace (all of that \
machine's processes), plus the parent of each that is not itself in a machine (the runtime's \
shim); RSS is the sum of their VmRSS, shared pages counted in each.\n";
