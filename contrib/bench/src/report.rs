//! The table on stdout and `BENCHMARKS.md`.

use std::fmt::Write;

use crate::bench::{ExecLoad, LoadSide, OutputLoad, Plan, PoolReport, Report};
use crate::raw::Backend;
use crate::stats::ms;

mod disk;
mod document;
mod matrix;
mod pool;
mod prebuild;
mod rows;
mod sandbox;
mod section;
mod table;

pub use document::document;
pub use matrix::section as matrix_section;
pub use sandbox::section as sandbox_section;
pub use table::table;

/// What ran where.
pub struct Context {
    pub date: String,
    pub nproc: usize,
    pub memory: String,
    pub kernel: String,
    pub cpu: String,
    pub commit: String,
    pub naryad: String,
    pub naryad_profile: String,
    pub bench_profile: &'static str,
    /// `/proc/loadavg`'s 1, 5 and 15 minute figures when the run began and ended: other work on
    /// the machine shows here.
    pub load_start: String,
    pub load_end: String,
}

pub struct Outcome {
    pub backend: Backend,
    pub runtime_version: String,
    pub result: Result<Report, String>,
    /// The pool's rows, from a daemon of their own; `None` when they did not run.
    pub pool: Option<Result<PoolReport, String>>,
    /// Create with `[limits] disk` (ours) against without (raw), from two daemons of their own;
    /// `None` when it did not run.
    pub disk: Option<Result<crate::bench::Pair, String>>,
    /// The daemon's memory with large rows in its store; `None` when it did not run.
    pub rows: Option<Result<crate::bench::RowsReport, String>>,
    /// First and repeat creates of a prebuilt key; `None` when they did not run.
    pub prebuild: Option<Result<crate::bench::PrebuildReport, String>>,
    /// The section "gVisor against runc"; `None` when it did not run.
    pub sandbox: Option<crate::bench::SandboxRun>,
    /// The section "Newer runtimes"; `None` when it did not run.
    pub matrix: Option<crate::bench::MatrixRun>,
}

pub const CREATE_RATIO: f64 = 1.10;
pub const REPEAT_MS: f64 = 2.0;
pub const CONCURRENT_RATIO: f64 = 1.2;
pub const EXEC_RATIO: f64 = 1.2;
pub const EXEC_LOAD_RATIO: f64 = 1.5;
pub const IDLE_MIB: f64 = 40.0;
pub const LOADED_MIB: f64 = 80.0;
pub const LIST_MS: f64 = 10.0;
/// The environment count the memory and list targets speak of.
pub const TARGET_LOAD: usize = 200;
/// The output load the memory-under-output target speaks of: 30 creates printing 100 MB each.
pub const OUTPUT_CREATES: usize = 30;
pub const OUTPUT_BYTES: u64 = 100 << 20;
pub const OUTPUT_MIB: f64 = 100.0;

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn yes(holds: bool) -> &'static str {
    if holds {
        "yes"
    } else {
        "**no**"
    }
}

/// How far `value` is over `limit`, when it is.
fn over(value: f64, limit: f64) -> String {
    if value <= limit {
        String::new()
    } else {
        format!(", {:.0}% over", (value / limit - 1.0) * 100.0)
    }
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// One target's verdict on one back end.
struct Verdict {
    target: String,
    backend: Backend,
    holds: bool,
    detail: String,
}

fn verdicts(plan: &Plan, outcomes: &[Outcome]) -> Vec<Verdict> {
    let mut all = Vec::new();
    for outcome in outcomes {
        let backend = outcome.backend;
        let Ok(r) = &outcome.result else {
            // The pool's rows come from a daemon of their own and say for themselves.
            let own = targets(plan).into_iter().filter(|t| {
                !pool::TARGETS.contains(&t.as_str())
                    && !disk::TARGETS.contains(&t.as_str())
                    && !rows::TARGETS.contains(&t.as_str())
                    && !prebuild::TARGETS.contains(&t.as_str())
            });
            for target in own {
                all.push(Verdict {
                    target,
                    backend,
                    holds: false,
                    detail: "not measured: the run failed".to_owned(),
                });
            }
            continue;
        };
        let mut add = |target: &str, holds: bool, detail: String| {
            all.push(Verdict {
                target: target.to_owned(),
                backend,
                holds,
                detail,
            })
        };
        let ratio = r.create.ratio();
        add(
            TARGETS[0],
            ratio <= CREATE_RATIO,
            format!("{ratio:.2}×{}", over(ratio, CREATE_RATIO)),
        );
        let median = r.repeat.median();
        add(
            TARGETS[1],
            median <= REPEAT_MS,
            format!("{}{}", ms(median), over(median, REPEAT_MS)),
        );
        let c = &r.concurrent;
        let ratio = c.ratio();
        let machines_ok = c.ours_machines.iter().all(|m| *m == plan.concurrency);
        add(
            TARGETS[2],
            ratio <= CONCURRENT_RATIO && c.ours_errors == 0 && machines_ok,
            format!(
                "{ratio:.2}×{}, {} errors, machines {:?}",
                over(ratio, CONCURRENT_RATIO),
                c.ours_errors,
                c.ours_machines
            ),
        );
        let ratio = r.exec.ratio();
        add(
            TARGETS[3],
            ratio <= EXEC_RATIO,
            format!("{ratio:.2}×{}", over(ratio, EXEC_RATIO)),
        );
        for l in &r.exec_loads {
            let ratio = l.ratio();
            let o = &l.ours;
            add(
                &exec_load_target(l.load),
                ratio <= EXEC_LOAD_RATIO && o.errors == 0 && o.restarted == 0 && o.unanswering == 0,
                format!(
                    "{ratio:.2}×{}, {} errors, {}",
                    over(ratio, EXEC_LOAD_RATIO),
                    o.errors,
                    inits(o, l.load.environments)
                ),
            );
        }
        let idle = mib(r.memory.idle_kib);
        add(
            TARGETS[4],
            idle <= IDLE_MIB,
            format!("{idle:.1} MiB{}", over(idle, IDLE_MIB)),
        );
        let loaded = mib(r.memory.loaded_kib);
        let partial = if plan.loaded < TARGET_LOAD {
            format!(" with only {} environments (short mode)", plan.loaded)
        } else {
            String::new()
        };
        add(
            TARGETS[5],
            loaded <= LOADED_MIB,
            format!("{loaded:.1} MiB{}{partial}", over(loaded, LOADED_MIB)),
        );
        let median = r.list.median();
        let partial = if plan.loaded < TARGET_LOAD {
            format!(" for {} environments (short mode)", plan.loaded)
        } else {
            String::new()
        };
        add(
            TARGETS[6],
            median <= LIST_MS,
            format!("{}{}{partial}", ms(median), over(median, LIST_MS)),
        );
        let o = &r.output_memory;
        let peak = mib(o.peak_kib);
        let partial = if o.load != full_output_load() {
            format!(" under {} (short mode)", o.load.describe())
        } else {
            String::new()
        };
        add(
            OUTPUT_TARGET,
            peak <= OUTPUT_MIB && o.errors == 0,
            format!(
                "peak {peak:.1} MiB{}, {} errors{partial}",
                over(peak, OUTPUT_MIB),
                o.errors
            ),
        );
    }
    all.extend(pool::verdicts(outcomes));
    all.extend(disk::verdicts(outcomes));
    all.extend(rows::verdicts(outcomes));
    all.extend(prebuild::verdicts(outcomes));
    all
}

/// The output load of a full run.
fn full_output_load() -> OutputLoad {
    OutputLoad {
        creates: OUTPUT_CREATES,
        bytes: OUTPUT_BYTES,
    }
}

const OUTPUT_TARGET: &str = "RSS peak, 30 creates printing 100 MB each, ≤ 100 MB, 0 errors";

const TARGETS: [&str; 7] = [
    "create ≤ 1.10× raw",
    "repeat median ≤ 2 ms",
    "concurrent ≤ 1.2× raw, 0 errors, 64 machines",
    "exec ≤ 1.2× raw",
    "RSS idle ≤ 40 MB",
    "RSS with 200 environments ≤ 80 MB",
    "list of 200 ≤ 10 ms",
];

/// What became of the machines' inits under a load: "inits restarted 0 of 16", and how many
/// did not answer, if any.
fn inits(side: &LoadSide, machines: usize) -> String {
    let mut text = format!("inits restarted {} of {machines}", side.restarted);
    if side.unanswering > 0 {
        let _ = write!(text, ", {} not answering", side.unanswering);
    }
    text
}

/// The target of one concurrent exec load.
fn exec_load_target(load: ExecLoad) -> String {
    format!(
        "{} ≤ {EXEC_LOAD_RATIO}× raw, 0 errors, init never restarted",
        load.describe()
    )
}

/// Every target the plan measures, in the order of the table.
fn targets(plan: &Plan) -> Vec<String> {
    let mut all: Vec<String> = TARGETS[..4].iter().map(|t| (*t).to_owned()).collect();
    all.extend(plan.exec_loads.iter().copied().map(exec_load_target));
    all.extend(TARGETS[4..].iter().map(|t| (*t).to_owned()));
    all.push(OUTPUT_TARGET.to_owned());
    all.extend(pool::TARGETS.iter().map(|t| (*t).to_owned()));
    all.extend(disk::TARGETS.iter().map(|t| (*t).to_owned()));
    all.extend(rows::TARGETS.iter().map(|t| (*t).to_owned()));
    all.extend(prebuild::TARGETS.iter().map(|t| (*t).to_owned()));
    all
}

/// Which targets hold, one line each over both back ends.
pub fn summary(plan: &Plan, outcomes: &[Outcome]) -> (String, usize, usize) {
    let verdicts = verdicts(plan, outcomes);
    let mut s = String::new();
    let (mut held, mut total) = (0, 0);
    for target in targets(plan) {
        let these: Vec<&Verdict> = verdicts.iter().filter(|v| v.target == target).collect();
        if these.is_empty() {
            continue;
        }
        let holds = these.iter().all(|v| v.holds);
        total += 1;
        held += usize::from(holds);
        let details: Vec<String> = these
            .iter()
            .map(|v| {
                format!(
                    "{} {}: {}",
                    v.backend.name(),
                    if v.holds { "holds" } else { "fails" },
                    v.detail
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "- {} **{target}** — {}",
            if holds { "HOLDS" } else { "FAILS" },
            details.join("; ")
        );
    }
    (s, held, total)
}
