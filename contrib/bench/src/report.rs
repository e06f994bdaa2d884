//! The table on stdout and `BENCHMARKS.md`.

use std::fmt::Write;

use crate::bench::{ExecLoad, LoadSide, OutputLoad, Plan, PoolReport, Report};
use crate::raw::Backend;
use crate::stats::{ms, spread};

mod disk;
mod matrix;
mod pool;
mod prebuild;
mod rows;
mod sandbox;
mod section;

pub use matrix::section as matrix_section;
pub use sandbox::section as sandbox_section;

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

/// The results table (Markdown, readable as plain text too).
pub fn table(plan: &Plan, outcomes: &[Outcome]) -> String {
    let verdicts = verdicts(plan, outcomes);
    let verdict_of = |backend: Backend, target: &str| -> &'static str {
        verdicts
            .iter()
            .find(|v| v.backend == backend && v.target == target)
            .map_or("?", |v| yes(v.holds))
    };
    let verdict = |backend: Backend, i: usize| verdict_of(backend, TARGETS[i]);
    let mut t = String::new();
    t.push_str("| back end | measure | narya: median (min–max) | raw runtime: median (min–max) | ratio | target | holds |\n");
    t.push_str("| --- | --- | --- | --- | --- | --- | --- |\n");
    for outcome in outcomes {
        let b = outcome.backend;
        let name = b.name();
        let r = match &outcome.result {
            Ok(r) => r,
            Err(e) => {
                let _ = writeln!(
                    t,
                    "| {name} | **the run failed** | {} | | | | **no** |",
                    cell(e)
                );
                continue;
            }
        };
        let _ = writeln!(
            t,
            "| {name} | create, no setup, image local, isolated network ({} a side) | {} | {} | {:.2}× | ≤ {CREATE_RATIO:.2}× | {} |",
            r.create.ours.len(),
            spread(&r.create.ours),
            spread(&r.create.raw),
            r.create.ratio(),
            verdict(b, 0)
        );
        let _ = writeln!(
            t,
            "| {name} | create, `network = \"isolated\"` (narya column) vs `\"host\"` (raw column, a second daemon) ({} a side) | {} | {} | {:.2}× | none: the cost of isolation, shown | — |",
            r.network_cost.ours.len(),
            spread(&r.network_cost.ours),
            spread(&r.network_cost.raw),
            r.network_cost.ratio(),
        );
        let _ = writeln!(
            t,
            "| {name} | idempotent repeat ({}) | {}; p99 {} | — | — | median ≤ {REPEAT_MS} ms | {} |",
            r.repeat.len(),
            spread(&r.repeat),
            ms(r.repeat.percentile(99.0)),
            verdict(b, 1)
        );
        let c = &r.concurrent;
        let _ = writeln!(
            t,
            "| {name} | {} concurrent creates, wall ({} round{}) | {}; errors {}; machines {:?} | {}; errors {}; machines {:?} | {:.2}× | ≤ {CONCURRENT_RATIO}×, 0 errors | {} |",
            plan.concurrency,
            c.ours.len(),
            if c.ours.len() == 1 { "" } else { "s" },
            spread(&c.ours),
            c.ours_errors,
            c.ours_machines,
            spread(&c.raw),
            c.raw_errors,
            c.raw_machines,
            c.ratio(),
            verdict(b, 2)
        );
        let _ = writeln!(
            t,
            "| {name} | exec `true` round trip ({} a side) | {} | {} | {:.2}× | ≤ {EXEC_RATIO}× | {} |",
            r.exec.ours.len(),
            spread(&r.exec.ours),
            spread(&r.exec.raw),
            r.exec.ratio(),
            verdict(b, 3)
        );
        for l in &r.exec_loads {
            let rounds = l.ours.wall.len();
            let side = |s: &LoadSide| {
                // The raw side stops after a round it failed.
                let given_up = if s.wall.len() < rounds {
                    format!(
                        "; given up after {} round{}",
                        s.wall.len(),
                        if s.wall.len() == 1 { "" } else { "s" }
                    )
                } else {
                    String::new()
                };
                format!(
                    "{}; errors {}; {}{given_up}",
                    spread(&s.wall),
                    s.errors,
                    inits(s, l.load.environments)
                )
            };
            let _ = writeln!(
                t,
                "| {name} | {}, wall ({rounds} round{}) | {} | {} | {:.2}× | ≤ {EXEC_LOAD_RATIO}×, 0 errors, 0 restarted | {} |",
                l.load.describe(),
                if rounds == 1 { "" } else { "s" },
                side(&l.ours),
                side(&l.raw),
                l.ratio(),
                verdict_of(b, &exec_load_target(l.load))
            );
        }
        let _ = writeln!(
            t,
            "| {name} | daemon RSS, idle after warm-up | {:.1} MiB | — | — | ≤ {IDLE_MIB} MB | {} |",
            mib(r.memory.idle_kib),
            verdict(b, 4)
        );
        let _ = writeln!(
            t,
            "| {name} | daemon RSS, {} environments recorded | {:.1} MiB (peak of the run {:.1} MiB) | — | — | ≤ {LOADED_MIB} MB at {TARGET_LOAD} | {} |",
            plan.loaded,
            mib(r.memory.loaded_kib),
            mib(r.memory.peak_kib),
            verdict(b, 5)
        );
        let rows = if r.list_rows == plan.loaded {
            String::new()
        } else {
            format!(", {} rows with deleted ones", r.list_rows)
        };
        let _ = writeln!(
            t,
            "| {name} | list of {} environments{rows} ({}) | {} | — | — | ≤ {LIST_MS} ms at {TARGET_LOAD} | {} |",
            plan.loaded,
            r.list.len(),
            spread(&r.list),
            verdict(b, 6)
        );
        let o = &r.output_memory;
        let _ = writeln!(
            t,
            "| {name} | daemon peak RSS, {} (JSON answers), wall {} | {:.1} MiB; errors {} | — | — | ≤ {OUTPUT_MIB} MB at {OUTPUT_CREATES} × {} MB | {} |",
            o.load.describe(),
            ms(o.wall.as_secs_f64() * 1000.0),
            mib(o.peak_kib),
            o.errors,
            OUTPUT_BYTES >> 20,
            verdict_of(b, OUTPUT_TARGET)
        );
    }
    t.push_str(&pool::rows(outcomes, &verdicts));
    t.push_str(&disk::rows(outcomes, &verdicts));
    t.push_str(&rows::rows(outcomes, &verdicts));
    t.push_str(&prebuild::rows(outcomes, &verdicts));
    t
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

pub fn document(context: &Context, plan: &Plan, outcomes: &[Outcome]) -> String {
    let (summary, held, total) = summary(plan, outcomes);
    let mut d = String::new();
    d.push_str("# Benchmarks\n\n");
    let _ = writeln!(
        d,
        "Generated by `narya-bench` (`contrib/bench/`) on {}, in {} mode. Do not edit by hand: \
         run `cargo build --release --workspace --bin naryad --bin narya-bench` and then \
         `$CARGO_TARGET_DIR/release/narya-bench` as root with the test services up \
         (see `contrib/bench/src/main.rs`).\n",
        context.date,
        if plan.short {
            "**short** (it proves the benchmark works; the figures mean little)"
        } else {
            "full"
        }
    );
    d.push_str("## Machine and build\n\n");
    let _ = writeln!(d, "- CPU: {} ({} CPUs online)", context.cpu, context.nproc);
    let _ = writeln!(d, "- memory: {}", context.memory);
    let _ = writeln!(d, "- kernel: {}", context.kernel);
    let _ = writeln!(
        d,
        "- load average (1, 5, 15 min): {} at the start, {} at the end",
        context.load_start, context.load_end
    );
    for outcome in outcomes {
        let _ = writeln!(
            d,
            "- {}: {}",
            outcome.backend.name(),
            outcome.runtime_version
        );
    }
    let _ = writeln!(d, "- source: {}", context.commit);
    let _ = writeln!(
        d,
        "- naryad: `{}`, **{}** profile; narya-bench: {} profile",
        context.naryad, context.naryad_profile, context.bench_profile
    );
    let loads: Vec<String> = plan.exec_loads.iter().map(|l| l.describe()).collect();
    let _ = writeln!(
        d,
        "- samples: {} a side for create and exec, {} repeats, {} round{} of {} concurrent creates, \
         {} round{} a side of each concurrent exec load ({}), \
         {} environments recorded for memory and list ({} list samples)\n",
        plan.samples,
        plan.repeat_samples,
        plan.rounds,
        if plan.rounds == 1 { "" } else { "s" },
        plan.concurrency,
        plan.exec_rounds,
        if plan.exec_rounds == 1 { "" } else { "s" },
        loads.join("; "),
        plan.loaded,
        plan.list_samples
    );
    d.push_str("## Results\n\n");
    d.push_str(&table(plan, outcomes));
    let _ = writeln!(
        d,
        "\n## Targets: {held} of {total} hold on every back end\n"
    );
    d.push_str(&summary);
    let runs: Vec<_> = outcomes
        .iter()
        .filter_map(|o| Some((o.backend, o.sandbox.as_ref()?)))
        .collect();
    if !runs.is_empty() {
        d.push('\n');
        d.push_str(&sandbox::section(plan, &runs, None));
    }
    let runs: Vec<_> = outcomes
        .iter()
        .filter_map(|o| Some((o.backend, o.matrix.as_ref()?)))
        .collect();
    if !runs.is_empty() {
        d.push('\n');
        d.push_str(&matrix::section(plan, &runs, None));
    }
    d.push_str("\n## Method\n\n");
    d.push_str(
        "- One `naryad` per back end, started by the benchmark with a temporary configuration: a \
         development identity (a fresh P-256 key, its key set as a `file://` JWKS; every request \
         carries a token the daemon verifies), state and socket in a temporary directory, \
         containerd namespace `narya-bench`, the official image from its OCI layout, \
         `environment.gone_retention = \"1s\"` (the run deletes hundreds of environments before \
         it lists the ones it keeps; with the default day they would stay listed as `gone`), \
         `limits.nofile = 1024`, every other key at its default: machines get isolated \
         networking (`environment.network = \"isolated\"`). A second daemon, configured the same \
         but with `network = \"host\"`, serves only the isolated-vs-host row. Requests go over \
         the unix socket, one fresh connection each, from the benchmark process.\n\
         - Warm-up before any timing: one create and delete through the daemon (which loads the \
         image into the runtime) and one raw create and removal.\n\
         - The raw side is the runtime's own command-line client, started afresh for every \
         operation as a person or a script would run it, so it includes that client's start \
         (a Go program) and its connection to the runtime; the daemon's side includes the HTTP \
         exchange, the token's verification, the record in SQLite and the workspace. A ratio \
         below 1 means the daemon's long-lived connection to the runtime costs less than a \
         client start.\n\
         - Every comparison alternates the two sides within one run (narya, raw, narya, raw, …) \
         so drift cancels; the ratio is median(narya) / median(raw). Removal is never timed.\n\
         - **create**: `POST /v1/environments {\"id\": fresh}` until `201` with a `ready` \
         environment, vs the raw client starting the same image with tini and `sleep infinity` \
         as its running process, on the same network as the daemon's machines (commands \
         below): on containerd `ctr run --cni` with the network list the daemon wrote (the \
         `ptp` and `host-local` plugins, the same subnet, address pool and firewall chains; the \
         daemon also brings up `lo` with the `loopback` plugin, which `ctr` does not). `ctr` \
         reads CNI configuration only from `/etc/cni/net.d`, so its `run` runs in a private \
         mount namespace where that directory holds a copy of the daemon's list; that \
         wrapper's own cost is measured alone and given below, and counts on the raw side. \
         `ctr` 1.6 never releases what `run --cni` took, so the untimed removal calls the \
         plugins' DEL itself (as `ctr` 1.7's `task rm` does). \
         On Docker, `docker run --network` the daemon's own bridge network. The daemon's \
         machines carry a seccomp filter like the Docker Engine's default: `docker run` applies \
         that default by itself, `ctr run` with `--seccomp` (containerd's default profile), so \
         that both sides pay for loading a filter into every process runc starts (about 20 ms \
         an exec here).\n\
         - **isolated vs host**: the same create through two daemons alternately, one giving \
         machines isolated networking and one the host's; the ratio is the cost of isolation.\n\
         - **idempotent repeat**: `POST` of an already recorded create (`200`), each with its \
         token verified.\n\
         - **concurrent**: all creates started at once; wall time until the last answers; \
         machines = runtime tasks/containers of that round running afterwards (the daemon's \
         found by their `dev.narya.environment` label: it names its machines itself).\n\
         - **exec**: `POST /v1/environments/{id}/exec {\"argv\": [\"true\"]}` (`200`, exit code \
         0) vs `ctr task exec --exec-id UNIQUE ID true` resp. `docker exec ID true` in a raw \
         machine.\n\
         - **concurrent execs**: environments made through the daemon and as many raw machines, \
         one untimed exec in each; then all execs of `true` started at once, spread round-robin \
         over the environments, the daemon's side (`POST …/exec`, each must answer `200` with \
         exit code 0) and the raw side (`ctr task exec --exec-id UNIQUE MACHINE true` resp. \
         `docker exec MACHINE true`) alternating round by round; wall time until the last \
         answers. **Inits restarted**: pid 1's start time (field 22 of `/proc/1/stat`, read \
         with the raw client's exec of `cat`) before the first round and after the last; a \
         machine whose init started anew, or that is gone, counts; one that does not answer \
         the read within 30 s is counted as not answering. Every exec and raw command is given \
         120 s, then counts as an error; the raw side stops after a round with errors (its \
         machine is most likely wedged: more rounds would only wait out the limit again), and \
         a raw machine whose shim no longer answers even a forced removal is removed by \
         killing that shim. The daemon's machine is found \
         by its `dev.narya.environment` label. The raw side starts every exec at once; on \
         containerd the daemon lets a few into one machine at a time and queues the rest.\n\
         - **memory**: VmRSS of the daemon from `/proc/PID/status` one second after warm-up \
         (idle), and one second after the environments were created and the deleted ones \
         forgotten (peak = VmHWM at the end of the run, the concurrent creates and execs \
         included); MB in the targets are MiB here. The concurrent exec loads run last, after \
         memory and list, so that what the allocator keeps after them does not count there.\n\
         - **list**: `GET /v1/environments` answering all recorded environments, after one \
         untimed list, once the environments deleted before are forgotten.\n\
         - **memory under output**: last, the daemon's peak resident memory (VmHWM) reset with \
         `echo 5 > /proc/PID/clear_refs`, then all creates started at once with the setup \
         `yes narya-bench-output | head -c BYTES`, each answered as plain JSON (`201`, \
         `ready`); VmHWM read once the last answered, then the environments deleted.\n",
    );
    d.push_str(pool::METHOD);
    d.push_str(disk::METHOD);
    d.push_str(rows::METHOD);
    d.push_str(prebuild::METHOD);
    d.push('\n');
    d.push_str("Raw commands:\n\n");
    for outcome in outcomes {
        if let Ok(r) = &outcome.result {
            let wrapper = match &r.wrapper {
                Some(w) => format!(
                    "; the wrapper alone, around `true`: {} ({} samples)",
                    spread(w),
                    w.len()
                ),
                None => String::new(),
            };
            let _ = writeln!(
                d,
                "- {}: `{}` (image `{}`){wrapper}",
                outcome.backend.name(),
                r.raw_create,
                r.image
            );
        }
    }
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|o| match &o.result {
            Ok(r) => {
                let mut all = r.concurrent.failures.clone();
                for l in &r.exec_loads {
                    all.extend(
                        l.failures
                            .iter()
                            .map(|f| format!("{}: {f}", l.load.describe())),
                    );
                }
                let out = &r.output_memory;
                all.extend(
                    out.failures
                        .iter()
                        .map(|f| format!("{}: {f}", out.load.describe())),
                );
                (!all.is_empty()).then(|| format!("- {}: {}", o.backend.name(), all.join("; ")))
            }
            Err(e) => Some(format!("- {}: {}", o.backend.name(), e)),
        })
        .collect();
    let failures: Vec<String> = failures
        .into_iter()
        .chain(pool::failures(outcomes))
        .chain(disk::failures(outcomes))
        .chain(rows::failures(outcomes))
        .chain(prebuild::failures(outcomes))
        .collect();
    if !failures.is_empty() {
        d.push_str("\n## Failures\n\n");
        d.push_str(&failures.join("\n"));
        d.push('\n');
    }
    d
}
