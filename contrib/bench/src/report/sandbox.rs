//! The section "gVisor against runc": a table of its own, without targets, its method, and what
//! failed or was skipped in it.

use super::section::{render, row, Layout};
use super::Context;
use crate::bench::{Plan, SandboxReport, SandboxRun, Sides, BURST, FILES};
use crate::raw::Backend;

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
fn sides_row(t: &mut String, backend: Backend, measure: &str, sides: &Sides, notes: [&str; 2]) {
    let figures = [(&sides.container, notes[0]), (&sides.gvisor, notes[1])];
    row(t, backend.name(), measure, figures, sides.ratio());
}

/// The table's rows for one back end where the section was measured.
fn rows(t: &mut String, backend: Backend, r: &SandboxReport) {
    let create = format!(
        "create, no setup, no pool, image local, isolated network ({} a side)",
        r.create.container.len()
    );
    sides_row(t, backend, &create, &r.create, ["", ""]);
    let exec = format!("exec `true` round trip ({} a side)", r.exec.container.len());
    sides_row(t, backend, &exec, &r.exec, ["", ""]);
    let burst = format!(
        "{BURST} concurrent execs of `true` into one environment, wall ({})",
        plural(r.burst.container.len(), "round", "rounds")
    );
    let errors = [
        format!("; errors {}", r.burst_errors.0),
        format!("; errors {}", r.burst_errors.1),
    ];
    sides_row(t, backend, &burst, &r.burst, [&errors[0], &errors[1]]);
    let build = format!(
        "{} small files, one exec: unpack a tarball, `git init`, `git add -A`, `git commit`, \
         `tar` them again ({})",
        count(FILES),
        plural(r.build.container.len(), "run", "runs")
    );
    sides_row(t, backend, &build, &r.build, ["", ""]);
}

/// The section, for `runs` (each back end's); `alone`: the run of this section by itself whose
/// rows these are, said so, for a section merged into a document of another run.
pub fn section(plan: &Plan, runs: &[(Backend, &SandboxRun)], alone: Option<&Context>) -> String {
    let runsc = runs.iter().find_map(|(_, run)| match run {
        SandboxRun::Measured(r) => Some(format!(", here `{}`", r.runsc)),
        _ => None,
    });
    let intro = format!(
        "The same operations with every machine under `[runtime] sandbox = \"container\"` (runc: \
         the host's kernel) and under `sandbox = \"gvisor\"` (gVisor's runsc: a kernel of its own \
         between the machine and the host's{}). **No target holds on these ratios**: gVisor \
         trades speed for a smaller surface of the host's kernel, and the figures are here for \
         operators to choose a sandbox by.",
        runsc.unwrap_or_default()
    );
    let method = format!(
        "Method: two `naryad` per back end, started side by side and configured as the main \
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
    let layout = Layout {
        title: "gVisor against runc",
        only: "gvisor",
        intro,
        columns: [
            "`sandbox = \"container\"`: median (min–max)",
            "`sandbox = \"gvisor\"`: median (min–max)",
            "gVisor / container",
        ],
        method,
    };
    render(&layout, plan, runs, alone, rows)
}

#[cfg(test)]
mod tests {
    use super::super::section::short_plan as short;
    use super::*;

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
