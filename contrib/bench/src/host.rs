//! What ran where: the machine, the source and the build, for the report's first section.

use std::path::Path;
use std::time::SystemTime;

use crate::report;

fn first_line_with(path: &str, prefix: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().and_then(|text| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    })
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or("unknown".to_owned(), |l| {
        l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    })
}

/// What ran where; `out`, the report a previous run wrote, is no change to the source.
pub fn context(naryad: &Path, out: &Path) -> report::Context {
    let memory = first_line_with("/proc/meminfo", "MemTotal:")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or("unknown".to_owned(), |kib| {
            format!("{:.1} GiB", kib / 1024.0 / 1024.0)
        });
    let commit = match command_output("git", &["rev-parse", "--short", "HEAD"]) {
        Some(c) => {
            let exclude = format!(":(exclude){}", out.display());
            let status = ["status", "--porcelain", "--untracked-files=no", "--", ":/"];
            // git refuses a pathspec outside the repository (an `--out` elsewhere): then there
            // is nothing to exclude.
            let dirty = command_output("git", &[&status[..], &[&exclude]].concat())
                .or_else(|| command_output("git", &status))
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c} with uncommitted changes")
            } else {
                c
            }
        }
        None => "unknown".to_owned(),
    };
    let profile = naryad
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .map_or("unknown".to_owned(), |n| match n {
            "release" => "release".to_owned(),
            "debug" => "debug (unoptimised)".to_owned(),
            other => format!("unknown (built in {other}/)"),
        });
    report::Context {
        date: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or("unknown".to_owned(), |k| k.trim().to_owned()),
        cpu: first_line_with("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown".into()),
        commit,
        naryad: naryad.display().to_string(),
        naryad_profile: profile,
        bench_profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        load_start: load_average(),
        load_end: String::new(),
    }
}
