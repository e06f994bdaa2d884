//! The exposition as Prometheus reads it: every family typed and helped, samples named after
//! their family, counters moving by what happened, nothing that names an environment.

use std::collections::BTreeMap;

use super::*;

/// The samples of an OpenMetrics text exposition, `name{labels}` to value, after checking the
/// format's rules this crate relies on: each sample belongs to a declared family, the
/// exposition ends with `# EOF`.
fn samples(text: &str) -> BTreeMap<String, f64> {
    let mut families: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "# EOF" {
            assert!(lines.peek().is_none(), "lines after # EOF");
            return samples;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            families.insert(name.to_owned(), kind.to_owned());
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample is `series value`");
        let name = series.split('{').next().unwrap_or_default();
        let family = families
            .keys()
            .filter(|f| name.starts_with(f.as_str()))
            .max_by_key(|f| f.len())
            .unwrap_or_else(|| panic!("{name}: no # TYPE declares its family"));
        let suffix = &name[family.len()..];
        let allowed: &[&str] = match families[family].as_str() {
            "counter" => &["_total", "_created"],
            "gauge" => &[""],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            other => panic!("unexpected type {other}"),
        };
        assert!(allowed.contains(&suffix), "{name} in a {family} family");
        samples.insert(series.to_owned(), value.parse().expect("a number"));
    }
    panic!("no # EOF at the end:\n{text}");
}

#[test]
fn what_happened_is_counted_once_under_fixed_labels() {
    let metrics = Metrics::new();
    metrics.census(&Census {
        by_status: vec![(Status::Ready, 2), (Status::Gone, 1)],
        organisations: 2,
    });
    metrics.create_ended(Some(Status::Ready));
    metrics.create_ended(None);
    metrics.exec_ended(
        Some(&ProcessOutcome {
            exit_code: Some(0),
            output: Vec::new(),
            output_truncated: false,
            timed_out: false,
            duration: Duration::from_millis(30),
        }),
        Duration::from_millis(30),
    );
    metrics.jwt_refused(&AuthError::UnknownKey);
    metrics.runtime_failed(ErrorKind::Unavailable);
    metrics.reconciled(true);
    metrics.machine_restarted();
    let open = metrics.connections("unix");
    open.inc();

    let text = metrics.encode();
    let got = samples(&text);
    for (series, want) in [
        ("narya_environments{status=\"ready\"}", 2.0),
        ("narya_environments{status=\"degraded\"}", 0.0),
        ("narya_environments{status=\"gone\"}", 1.0),
        ("narya_organisations", 2.0),
        ("narya_creates_total{outcome=\"ready\"}", 1.0),
        ("narya_creates_total{outcome=\"failed\"}", 1.0),
        ("narya_execs_total{outcome=\"succeeded\"}", 1.0),
        ("narya_exec_duration_seconds_count", 1.0),
        ("narya_jwt_refusals_total{reason=\"unknown_key\"}", 1.0),
        ("narya_runtime_failures_total{kind=\"unavailable\"}", 1.0),
        ("narya_reconciler_passes_total{outcome=\"ok\"}", 1.0),
        ("narya_machine_restarts_total", 1.0),
        ("narya_open_connections{listener=\"unix\"}", 1.0),
    ] {
        assert_eq!(got.get(series), Some(&want), "{series} in:\n{text}");
    }
}

#[tokio::test]
async fn a_create_step_is_timed_whatever_it_answers() {
    let metrics = Metrics::new();
    let answered: Result<(), &str> = metrics.create_step("machine", async { Err("no") }).await;
    assert!(answered.is_err());
    let got = samples(&metrics.encode());
    assert_eq!(
        got.get("narya_create_step_duration_seconds_count{step=\"machine\"}"),
        Some(&1.0)
    );
    assert_eq!(
        got.get("narya_create_step_duration_seconds_bucket{le=\"+Inf\",step=\"machine\"}")
            .or_else(|| got
                .get("narya_create_step_duration_seconds_bucket{step=\"machine\",le=\"+Inf\"}")),
        Some(&1.0)
    );
}

#[tokio::test]
async fn a_failed_runtime_call_is_counted_by_kind_and_passed_on() {
    use narya_runtimes::testing::FakeRuntime;
    use narya_runtimes::Runtime;

    let metrics = Metrics::new();
    let fake = Arc::new(FakeRuntime::new());
    let metered = Metered::new(fake.clone(), metrics.clone());
    assert!(metered.list().await.is_ok());
    fake.set_down(true);
    let failed = metered.list().await.unwrap_err();
    assert_eq!(
        failed.kind(),
        ErrorKind::Unavailable,
        "the error is passed on as it is"
    );
    let got = samples(&metrics.encode());
    assert_eq!(
        got.get("narya_runtime_failures_total{kind=\"unavailable\"}"),
        Some(&1.0)
    );
    assert_eq!(
        got.keys()
            .filter(|s| s.starts_with("narya_runtime_failures"))
            .count(),
        1
    );
}
