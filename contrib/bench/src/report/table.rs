//! The results table (Markdown, readable as plain text too): one row per measure and back end,
//! with its target's verdict.

use std::fmt::Write;

use super::{
    cell, disk, exec_load_target, inits, mib, pool, prebuild, rows, verdicts, yes, Outcome,
    CONCURRENT_RATIO, CREATE_RATIO, EXEC_LOAD_RATIO, EXEC_RATIO, IDLE_MIB, LIST_MS, LOADED_MIB,
    OUTPUT_BYTES, OUTPUT_CREATES, OUTPUT_MIB, OUTPUT_TARGET, REPEAT_MS, TARGETS, TARGET_LOAD,
};
use crate::bench::{LoadSide, Plan};
use crate::raw::Backend;
use crate::stats::{ms, spread};

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
