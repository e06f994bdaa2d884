//! The section "gVisor against runc": a table of its own, without targets, its method, and what
//! failed or was skipped in it.

use std::fmt::Write;

use super::{cell, Context};
use crate::bench::{Plan, SandboxRun, Sides, BURST, FILES};
use crate::raw::Backend;
use crate::stats::spread;

/// `20 000`, as the rest of the document writes large counts.
fn count(n: usize) -> String {
    if n < 1000 {
        n.to_string()
    } else {
        format!("{} {:03}", n / 1000, n % 1000)
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// One row: the figure under each sandbox and their ratio; `notes` follow each side's figure.
fn row(t: &mut String, backend: Backend, measure: &str, sides: &Sides, notes: [&str; 2]) {
    let _ = writeln!(
        t,
        "| {} | {measure} | {}{} | {}{} | {:.2}× |",
        backend.name(),
        spread(&sides.container),
        notes[0],
        spread(&sides.gvisor),
        notes[1],
        sides.ratio()
    );
}

/// The table's rows for one back end.
fn rows(t: &mut String, backend: Backend, run: &SandboxRun) {
    let name = backend.name();
    let r = match run {
        SandboxRun::Measured(r) => r,
        SandboxRun::Skipped(why) => {
            let _ = writeln!(t, "| {name} | **skipped**: {} | | | |", cell(why));
            return;
        }
        SandboxRun::Failed(e) => {
            // Its first line: the whole, with the daemons' logs, is under the table.
            let first = e.lines().next().unwrap_or_default();
            let _ = writeln!(t, "| {name} | **the run failed** | {} | | |", cell(first));
            return;
        }
    };
    let create = format!(
        "create, no setup, no pool, image local, isolated network ({} a side)",
        r.create.container.len()
    );
    row(t, backend, &create, &r.create, ["", ""]);
    let exec = format!("exec `true` round trip ({} a side)", r.exec.container.len());
    row(t, backend, &exec, &r.exec, ["", ""]);
    let burst = format!(
        "{BURST} concurrent execs of `true` into one environment, wall ({})",
        plural(r.burst.container.len(), "round", "rounds")
    );
    let errors = [
        format!("; errors {}", r.burst_errors.0),
        format!("; errors {}", r.burst_errors.1),
    ];
    row(t, backend, &burst, &r.burst, [&errors[0], &errors[1]]);
    let build = format!(
        "{} small files, one exec: unpack a tarball, `git init`, `git add -A`, `git commit`, \
         `tar` them again ({})",
        count(FILES),
        plural(r.build.container.len(), "run", "runs")
    );
    row(t, backend, &build, &r.build, ["", ""]);
}

/// The section, for `runs` (each back end's); `alone`: the run of this section by itself whose
/// rows these are, said so, for a section merged into a document of another run.
pub fn section(plan: &Plan, runs: &[(Backend, &SandboxRun)], alone: Option<&Context>) -> String {
    let mut s = String::from("## gVisor against runc\n\n");
    let runsc = runs.iter().find_map(|(_, run)| match run {
        SandboxRun::Measured(r) => Some(format!(", here `{}`", r.runsc)),
        _ => None,
    });
    let _ = writeln!(
        s,
        "The same operations with every machine under `[runtime] sandbox = \"container\"` (runc: \
         the host's kernel) and under `sandbox = \"gvisor\"` (gVisor's runsc: a kernel of its own \
         between the machine and the host's{}). **No target holds on these ratios**: gVisor \
         trades speed for a smaller surface of the host's kernel, and the figures are here for \
         operators to choose a sandbox by.\n",
        runsc.unwrap_or_default()
    );
    if let Some(c) = alone {
        let _ = writeln!(
            s,
            "These rows come from a run of this section alone (`narya-bench --only gvisor{}`) \
             on {}, on the machine described above, from source {}, naryad's {} profile; load \
             average {} at its start, {} at its end. The other sections come from the run \
             described above.\n",
            if plan.short { " --short" } else { "" },
            c.date,
            c.commit,
            c.naryad_profile,
            c.load_start,
            c.load_end
        );
    }
    s.push_str(
        "| back end | measure | `sandbox = \"container\"`: median (min–max) | `sandbox = \"gvisor\"`: \
         median (min–max) | gVisor / container |\n| --- | --- | --- | --- | --- |\n",
    );
    for (backend, run) in runs {
        rows(&mut s, *backend, run);
    }
    let _ = writeln!(
        s,
        "\nMethod: two `naryad` per back end, started side by side and configured as the main \
         rows' daemon (machines isolated, no pool, so that each create starts its machine), one \
         with `sandbox = \"container\"` and one with `sandbox = \"gvisor\"` (its own `[network] \
         subnet`, as two isolating daemons need); on containerd the daemon runs \
         `/usr/bin/runsc` through its wrapper, on Docker the engine's runtime `runsc` \
         (`contrib/runsc/narya-runsc`). Every measurement alternates the two daemons. \
         **create**: `POST /v1/environments` without a repository until `201` and `ready`, \
         deleted untimed. **exec**: `POST …/exec {{\"argv\": [\"true\"]}}` (`200`, exit code 0) \
         into one environment a side, after one untimed exec. **concurrent execs**: {BURST} such \
         execs started at once into that environment; wall time until the last answers. \
         **files**: the benchmark packs {} files of 100 to 900 bytes in 200 directories into a \
         tarball on the host and copies it into each environment's workspace; one exec of `sh \
         -c` unpacks it into a fresh directory of `/workspace`, commits every file to a new git \
         repository and packs the directory with `tar` again (the exec allowed 20 minutes); the \
         directory is removed untimed. A short run takes few samples, one round of execs and one \
         run of the files.",
        count(FILES)
    );
    let failures: Vec<String> = runs
        .iter()
        .filter_map(|(backend, run)| match run {
            SandboxRun::Measured(r) if !r.failures.is_empty() => {
                Some(format!("- {}: {}", backend.name(), r.failures.join("; ")))
            }
            SandboxRun::Failed(e) => Some(format!("- {}: {e}", backend.name())),
            _ => None,
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(s, "\nFailures:\n\n{}", failures.join("\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short() -> Plan {
        crate::bench::Plan {
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

    #[test]
    fn a_skip_and_a_failure_each_say_so_in_a_row_of_their_own() {
        let skipped = SandboxRun::Skipped("no /usr/bin/runsc".to_owned());
        let failed = SandboxRun::Failed("create answered 500\nthe daemon's log:\n…".to_owned());
        let runs = [(Backend::Containerd, &skipped), (Backend::Docker, &failed)];
        let s = section(&short(), &runs, None);
        assert!(s.starts_with("## gVisor against runc\n"), "{s}");
        assert!(
            s.contains("| containerd | **skipped**: no /usr/bin/runsc | | | |"),
            "{s}"
        );
        assert!(
            s.contains("| docker | **the run failed** | create answered 500 | | |"),
            "{s}"
        );
        assert!(
            s.contains("- docker: create answered 500\nthe daemon's log:"),
            "{s}"
        );
        assert!(failed.failed() && !skipped.failed());
        assert_eq!(count(20_000), "20 000");
    }
}
