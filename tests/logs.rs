//! The daemon's stderr log as a file or a collector reads it: plain text without colour codes,
//! or one JSON object a line.

mod support;

use std::time::Duration;

use hyper::{Method, StatusCode};
use support::Daemon;

const IDENTITY: &str = "[identity]\nissuer = \"http://127.0.0.1:9\"\naudience = \"narya\"\n";

/// Runs a daemon with `extra` configuration through start, one refused request and a stop, and
/// returns everything it logged.
async fn log_of_a_daemon_with(extra: &str) -> String {
    let config = format!("{IDENTITY}\n{extra}");
    let mut daemon = tokio::task::spawn_blocking(move || Daemon::start(&config))
        .await
        .unwrap();
    let answer = daemon
        .unix(None)
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    let status = tokio::task::block_in_place(|| daemon.terminate());
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    // The stop is logged last; give the file a moment if the exit raced the write.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let log = daemon.log();
    assert!(log.contains("naryad stopped"), "{log}");
    log
}

#[tokio::test(flavor = "multi_thread")]
async fn text_logs_to_a_file_carry_no_colour_codes() {
    let log = log_of_a_daemon_with("").await;
    assert!(log.lines().count() >= 3, "{log}");
    assert!(!log.contains("\x1b["), "colour codes in a file:\n{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn json_logs_are_one_object_a_line() {
    let log = log_of_a_daemon_with("[log]\nformat = \"json\"\n").await;
    assert!(!log.contains("\x1b["), "colour codes in JSON:\n{log}");
    let mut lines = 0;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let entry: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\n{log}"));
        assert!(entry.is_object(), "{line}");
        assert!(entry["level"].is_string(), "{line}");
        assert!(entry["fields"].is_object(), "{line}");
        lines += 1;
    }
    assert!(lines >= 3, "{log}");
    assert!(log.contains("\"naryad ready\""), "{log}");
}
