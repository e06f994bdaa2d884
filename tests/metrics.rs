//! Metrics on `listen.metrics`: a create, an exec and a refused token each move their counter
//! by one and the status gauge reads right; `/metrics` never needs a token and is never served
//! on the API listeners; a real Prometheus scrapes it.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use narya::client::{Client, Endpoint};
use serde_json::{json, Value};
use support::e2e::{body, create, exec, unique_id, Backend, Host};
use support::{free_port, now};

/// A daemon with its metrics on a free loopback port; that address.
async fn host_with_metrics(backend: Backend) -> Option<(Host, String)> {
    let metrics = format!("127.0.0.1:{}", free_port());
    let extra = format!("[listen]\nmetrics = {metrics:?}\n");
    let host = Host::start_on(backend, &extra).await?;
    Some((host, metrics))
}

/// One scrape, without a token: series (`name{labels}`) to value.
async fn scrape(metrics: &str) -> BTreeMap<String, f64> {
    let answer = Client::new(Endpoint::Tcp(metrics.to_owned()), None)
        .send(Method::GET, "/metrics", None)
        .await
        .expect("the metrics listener answers");
    assert_eq!(answer.status, StatusCode::OK);
    let text = String::from_utf8(answer.body.to_vec()).expect("text");
    assert!(text.ends_with("# EOF\n"), "not OpenMetrics text:\n{text}");
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("`series value`");
            (series.to_owned(), value.parse().expect("a number"))
        })
        .collect()
}

fn moved(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, series: &str) -> f64 {
    after.get(series).copied().unwrap_or(0.0) - before.get(series).copied().unwrap_or(0.0)
}

async fn a_create_an_exec_and_a_refused_token_each_count_once(backend: Backend) {
    let Some((host, metrics)) = host_with_metrics(backend).await else {
        return;
    };
    let id = unique_id("metered");
    let _cleanup = host.cleanup(&id);
    let before = scrape(&metrics).await;

    let client = host.acme();
    assert_eq!(
        create(&client, json!({ "id": id })).await.status,
        StatusCode::CREATED
    );
    let ran = exec(&client, &id, &["true"]).await;
    assert_eq!(ran.status, StatusCode::OK, "{}", body(&ran));
    let expired = host
        .key
        .dev
        .sign(&json!({
            "iss": host.idp.issuer, "aud": "narya", "sub": "alice", "org": "acme",
            "exp": now() - 3600,
        }))
        .unwrap();
    let refused = host
        .daemon
        .unix(Some(&expired))
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);

    let after = scrape(&metrics).await;
    for series in [
        "narya_creates_total{outcome=\"ready\"}",
        "narya_create_step_duration_seconds_count{step=\"image\"}",
        "narya_create_step_duration_seconds_count{step=\"machine\"}",
        "narya_execs_total{outcome=\"succeeded\"}",
        "narya_exec_duration_seconds_count",
        "narya_jwt_refusals_total{reason=\"invalid\"}",
    ] {
        assert_eq!(moved(&before, &after, series), 1.0, "{series}: {after:#?}");
    }
    // The daemon's own store holds this one environment.
    assert_eq!(
        after.get("narya_environments{status=\"ready\"}"),
        Some(&1.0)
    );
    assert_eq!(
        after.get("narya_environments{status=\"degraded\"}"),
        Some(&0.0)
    );
    assert_eq!(after.get("narya_organisations"), Some(&1.0));
    assert!(after["narya_open_connections{listener=\"metrics\"}"] >= 1.0);
    // The reconciler's passes are its own; one has been counted soon enough.
    let deadline = Instant::now() + Duration::from_secs(60);
    while scrape(&metrics)
        .await
        .get("narya_reconciler_passes_total{outcome=\"ok\"}")
        .is_none_or(|passes| *passes < 1.0)
    {
        assert!(Instant::now() < deadline, "no reconciler pass counted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // No identifier is ever a label.
    assert!(
        after
            .keys()
            .all(|series| !series.contains(&id) && !series.contains("acme")),
        "{after:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_need_no_token_and_are_never_served_on_the_api_listeners() {
    let Some((host, metrics)) = host_with_metrics(Backend::Containerd).await else {
        return;
    };
    assert!(scrape(&metrics).await.contains_key("narya_organisations"));
    let token = host.token("acme");
    for (transport, client) in host.daemon.transports(None) {
        let answer = client.send(Method::GET, "/metrics", None).await.unwrap();
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{transport}");
    }
    for (transport, client) in host.daemon.transports(Some(&token)) {
        let answer = client.send(Method::GET, "/metrics", None).await.unwrap();
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{transport}");
    }
    // And the metrics listener serves nothing else.
    let other = Client::new(Endpoint::Tcp(metrics.clone()), Some(token))
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(other.status, StatusCode::NOT_FOUND);
}

/// A Prometheus server of the test's own, on a free loopback port, storing in a temporary
/// directory; killed on drop.
struct Prometheus {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts one scraping `target` every second; `None` to skip when it is not installed
    /// (never under CI).
    fn start(target: &str) -> Option<Prometheus> {
        let binary = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("prometheus"))
                .find(|candidate| candidate.is_file())
        });
        let Some(binary) = binary else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "prometheus is not installed (apt-get install prometheus); CI=true: not skipping"
            );
            eprintln!("skipped: prometheus is not installed");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: narya\n    static_configs:\n      - targets: [{target:?}]\n"
            ),
        )
        .unwrap();
        let address = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        Some(Prometheus {
            child,
            address,
            _dir: dir,
        })
    }

    fn log(&self) -> String {
        let path: PathBuf = self._dir.path().join("prometheus.log");
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// The value of the instant query `query`'s single series, once there is one.
    async fn value(&self, query: &str, deadline: Instant) -> f64 {
        let client = Client::new(Endpoint::Tcp(self.address.clone()), None);
        let path = format!("/api/v1/query?query={}", percent_encoded(query));
        loop {
            if let Ok(answer) = client.send(Method::GET, &path, None).await {
                if answer.status == StatusCode::OK {
                    let answer: Value = serde_json::from_slice(&answer.body).unwrap();
                    if let Some(value) = answer["data"]["result"][0]["value"][1].as_str() {
                        return value.parse().expect("a number");
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus has no {query} in time:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_prometheus_scrapes_the_metrics() {
    let Some((host, metrics)) = host_with_metrics(Backend::Containerd).await else {
        return;
    };
    let Some(prometheus) = Prometheus::start(&metrics) else {
        return;
    };
    let id = unique_id("scraped");
    let _cleanup = host.cleanup(&id);
    assert_eq!(
        create(&host.acme(), json!({ "id": id })).await.status,
        StatusCode::CREATED
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    assert_eq!(prometheus.value("up{job=\"narya\"}", deadline).await, 1.0);
    // Counted after the create: the first scrapes may predate it, so wait for the value.
    loop {
        let ready = prometheus
            .value("narya_environments{status=\"ready\"}", deadline)
            .await;
        let creates = prometheus
            .value("narya_creates_total{outcome=\"ready\"}", deadline)
            .await;
        if ready == 1.0 && creates == 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ready {ready}, creates {creates}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

on_every_engine!(a_create_an_exec_and_a_refused_token_each_count_once);
