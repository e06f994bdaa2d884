//! The section "Newer runtimes": the create and exec rows on the test matrix's newer runtimes,
//! each against its own raw client, beside the host's runtimes measured in the same run.

use std::fmt::Write;

use super::section::{render, row, Layout};
use super::Context;
use crate::bench::{MatrixReport, MatrixRun, Pair, Plan, RuntimeRows, MATRIX_SUBNET};
use crate::raw::Backend;

/// One row: `measure` on `name`, naryad's figure and the raw client's, and their ratio.
fn pair_row(t: &mut String, name: &str, measure: &str, pair: &Pair) {
    row(
        t,
        name,
        measure,
        [(&pair.ours, ""), (&pair.raw, "")],
        pair.ratio(),
    );
}

/// The table's rows for one back end where the section was measured: each measure on the
/// host's runtime, then on the newer one.
fn rows(t: &mut String, backend: Backend, r: &MatrixReport) {
    let runtimes = [
        (
            format!("{} {} (host)", backend.name(), r.host.version),
            &r.host,
        ),
        (format!("{} {}", backend.name(), r.newer.version), &r.newer),
    ];
    let create = |rows: &RuntimeRows| {
        format!(
            "create, no setup, image local, isolated network ({} a side)",
            rows.create.ours.len()
        )
    };
    for (name, rows) in &runtimes {
        pair_row(t, name, &create(rows), &rows.create);
    }
    for (name, rows) in &runtimes {
        let exec = format!("exec `true` round trip ({} a side)", rows.exec.ours.len());
        pair_row(t, name, &exec, &rows.exec);
    }
}

/// The section, for `runs` (each back end's); `alone`: the run of this section by itself whose
/// rows these are, said so, for a section merged into a document of another run.
pub fn section(plan: &Plan, runs: &[(Backend, &MatrixRun)], alone: Option<&Context>) -> String {
    let intro = "The main rows' create and exec round trip on the newer runtimes of the test \
        matrix (`contrib/dev/services.sh start matrix`: containerd 2.1 and Docker Engine 28, \
        Debian sid's packages), naryad against each runtime's own raw client as above, with the \
        host's runtime of the same back end measured in the same run as the reference. The ratio \
        naryad / raw is the figure to compare across runtimes: the raw client's start and the \
        runtime's own speed differ between versions, and the ratio is what naryad adds on each. \
        The targets stand on the host's runtimes above; these ratios are shown, not judged."
        .to_owned();
    let mut method = format!(
        "Method: two `naryad` per back end, started side by side and configured as the main \
         rows' daemon (machines isolated, no pool, so that each create starts its machine), one \
         on the host's runtime and one on the newer runtime (its own `[network] subnet`, \
         {MATRIX_SUBNET}, as two isolating daemons need). Each runtime's raw side is driven as \
         the main rows' is, with that runtime's own client where it has one: containerd 2.1's \
         own `ctr`, which finds CNI plugins only in `/opt/cni/bin`, so its wrapper also shows it \
         Debian's plugins (`/usr/lib/cni`) there, in its private mount namespace alone; for \
         both Docker Engines the host's `docker` (the matrix has no client of its own for \
         Docker 28, and one client speaks to any engine). \
         Every sample goes round the four sides, naryad then the raw client on the host's \
         runtime, then on the newer one, so that drift cancels between the runtimes as between \
         the sides; the ratio is median(naryad) / median(raw). **create** and **exec**: as in \
         the main rows (the same code), after the same warm-up. A short run takes few samples. \
         Raw commands:\n"
    );
    for (backend, run) in runs {
        if let MatrixRun::Measured(r) = run {
            for rows in [&r.host, &r.newer] {
                let _ = write!(
                    method,
                    "\n- {} {}: `{}`",
                    backend.name(),
                    rows.version,
                    rows.raw_create
                );
            }
        }
    }
    let layout = Layout {
        title: "Newer runtimes",
        only: "matrix",
        intro,
        columns: [
            "naryad: median (min–max)",
            "raw client: median (min–max)",
            "naryad / raw",
        ],
        method,
    };
    render(&layout, plan, runs, alone, rows)
}

#[cfg(test)]
mod tests {
    use super::super::section::short_plan;
    use super::*;
    use crate::stats::Samples;
    use std::time::Duration;

    fn samples(ms: &[u64]) -> Samples {
        let mut s = Samples::default();
        for m in ms {
            s.push(Duration::from_millis(*m));
        }
        s
    }

    fn runtime(version: &str, ours: &[u64], raw: &[u64]) -> RuntimeRows {
        RuntimeRows {
            version: version.to_owned(),
            raw_create: "ctr run ID".to_owned(),
            create: Pair {
                ours: samples(ours),
                raw: samples(raw),
            },
            exec: Pair {
                ours: samples(ours),
                raw: samples(raw),
            },
        }
    }

    #[test]
    fn each_runtime_has_its_rows_and_a_missing_matrix_says_so() {
        let measured = MatrixRun::Measured(Box::new(MatrixReport {
            host: runtime("1.6.20", &[100, 110, 120], &[200, 220, 240]),
            newer: runtime("2.1.9", &[150], &[100]),
        }));
        let skipped =
            MatrixRun::Skipped("NARYA_MATRIX_DOCKER_SOCKET is not set: start it".to_owned());
        let runs = [
            (Backend::Containerd, &measured),
            (Backend::Docker, &skipped),
        ];
        let s = section(&short_plan(), &runs, None);
        assert!(s.starts_with("## Newer runtimes\n\n"), "{s}");
        assert!(
            s.contains("| containerd 1.6.20 (host) | create, no setup, image local, isolated network (3 a side) | 110 ms (100 ms–120 ms) | 220 ms (200 ms–240 ms) | 0.50× |"),
            "{s}"
        );
        assert!(
            s.contains("| containerd 2.1.9 | exec `true` round trip (1 a side) | 150 ms (150 ms–150 ms) | 100 ms (100 ms–100 ms) | 1.50× |"),
            "{s}"
        );
        assert!(
            s.contains(
                "| docker | **skipped**: NARYA_MATRIX_DOCKER_SOCKET is not set: start it | | | |"
            ),
            "{s}"
        );
        assert!(s.contains("- containerd 2.1.9: `ctr run ID`"), "{s}");
        assert!(!measured.failed() && !skipped.failed());
        assert!(MatrixRun::Failed("no".to_owned()).failed());
    }
}
