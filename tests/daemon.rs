//! The daemon as a program: configuration refusals, socket handling, shutdown, and the CLI.

mod support;

use std::process::Command;

use hyper::{Method, StatusCode};
use serde_json::json;
use support::idp::IdentityProvider;
use support::{make_key, now, Daemon, LIMITS};

const IDENTITY: &str = "[identity]\nissuer = \"http://127.0.0.1:9\"\naudience = \"narya\"\n";

fn naryad_with(config: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("naryad.toml");
    std::fs::write(&path, config).unwrap();
    Command::new(env!("CARGO_BIN_EXE_naryad"))
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap()
}

#[test]
fn a_bad_configuration_stops_start_up_naming_the_key_and_file() {
    let cases = [
        (
            "unknown key",
            format!("{IDENTITY}\n[listen]\nsockett = \"/tmp/x.sock\"\n"),
            "sockett",
        ),
        (
            "bad duration",
            format!("{IDENTITY}\n[environment]\nsetup_timeout = \"soon\"\n"),
            "setup_timeout",
        ),
        (
            "missing identity",
            "state_dir = \"/tmp/narya-x\"\n".to_owned(),
            "identity",
        ),
        (
            "bad algorithm",
            format!("{IDENTITY}algorithms = [\"none\"]\n"),
            "algorithms",
        ),
        (
            "root as the environment's user",
            format!("{IDENTITY}\n[environment]\nuser = \"0:1000\"\n{LIMITS}"),
            "environment.user",
        ),
        (
            "/tmp as large as memory",
            format!("{IDENTITY}\n[limits]\nmemory = \"1GiB\"\ntmp = \"1GiB\"\nnofile = 1024\n"),
            "limits.tmp",
        ),
        (
            // Far above any host's hard limit of open files.
            "nofile above the host's hard limit",
            format!("{IDENTITY}\n[limits]\nnofile = 1099511627776\n"),
            "limits.nofile",
        ),
    ];
    for (case, config, key) in cases {
        let out = naryad_with(&config);
        assert_eq!(out.status.code(), Some(2), "{case}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(key), "{case}: {stderr}");
        assert!(
            stderr.contains("naryad.toml"),
            "{case}: the file is named: {stderr}"
        );
    }
    let missing = Command::new(env!("CARGO_BIN_EXE_naryad"))
        .args(["--config", "/nonexistent/naryad.toml"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/naryad.toml"));
}

#[test]
fn a_stale_socket_is_replaced_and_sigterm_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("deep/run/narya.sock");
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    // A socket file whose listener is gone, as a killed daemon leaves it.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());

    let mut daemon = Daemon::start_at(dir, socket.clone(), IDENTITY);
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok());
    let status = daemon.terminate();
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    assert!(!socket.exists(), "the socket file is removed on shutdown");
    assert!(daemon.log().contains("SIGTERM"));
}

#[test]
fn a_live_socket_is_refused() {
    let first = Daemon::start(IDENTITY);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("naryad.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = {:?}\n[listen]\nsocket = {:?}\n{IDENTITY}{LIMITS}",
            dir.path().join("state").display().to_string(),
            first.socket.display().to_string()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_naryad"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("another naryad is serving"), "{stderr}");
    assert!(
        std::os::unix::net::UnixStream::connect(&first.socket).is_ok(),
        "the first daemon still serves"
    );
}

#[test]
fn a_file_in_the_sockets_place_is_never_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("narya.sock");
    std::fs::write(&socket, "precious").unwrap();
    let config = dir.path().join("naryad.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = {:?}\n[listen]\nsocket = {:?}\n{IDENTITY}{LIMITS}",
            dir.path().join("state").display().to_string(),
            socket.display().to_string()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_naryad"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a socket"));
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "precious");
}

fn narya(args: &[&str], socket: &std::path::Path, token: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_narya"));
    cmd.arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("NARYA_TOKEN");
    if let Some(token) = token {
        cmd.env("NARYA_TOKEN", token);
    }
    cmd.output().unwrap()
}

/// The README's development flow: a key, its JWKS as a file, tokens minted by `narya dev token`.
#[test]
fn the_cli_works_with_a_dev_key_and_reports_errors_by_code() {
    let dir = tempfile::tempdir().unwrap();
    let key = make_key(dir.path(), "dev", "P-256");
    let jwks = Command::new(env!("CARGO_BIN_EXE_narya"))
        .args(["dev", "jwks", "--key"])
        .arg(&key.private_path)
        .output()
        .unwrap();
    assert!(jwks.status.success());
    let jwks_path = dir.path().join("jwks.json");
    std::fs::write(&jwks_path, &jwks.stdout).unwrap();
    let identity = format!(
        "[identity]\nissuer = \"narya-dev\"\naudience = \"narya\"\njwks_uri = \"file://{}\"\n",
        jwks_path.display()
    );
    let daemon = Daemon::start(&identity);
    let token_out = Command::new(env!("CARGO_BIN_EXE_narya"))
        .args([
            "dev",
            "token",
            "--issuer",
            "narya-dev",
            "--audience",
            "narya",
            "--person",
            "alice",
            "--organisation",
            "acme",
            "--ttl",
            "10m",
            "--key",
        ])
        .arg(&key.private_path)
        .output()
        .unwrap();
    assert!(
        token_out.status.success(),
        "{}",
        String::from_utf8_lossy(&token_out.stderr)
    );
    let token = String::from_utf8(token_out.stdout)
        .unwrap()
        .trim()
        .to_owned();

    let list = narya(&["env", "list"], &daemon.socket, Some(&token));
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&list.stdout).trim(),
        "no environments"
    );

    let list_json = narya(&["env", "list", "--json"], &daemon.socket, Some(&token));
    let value: serde_json::Value = serde_json::from_slice(&list_json.stdout).unwrap();
    assert_eq!(value, json!({"environments": []}));

    let get = narya(&["env", "get", "nope"], &daemon.socket, Some(&token));
    assert_eq!(get.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&get.stderr).contains("NRY-0030"));

    let bad_id = narya(&["env", "get", "a b"], &daemon.socket, Some(&token));
    assert_eq!(bad_id.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad_id.stderr).contains("NRY-0021"));

    let create = narya(&["env", "create", "demo"], &daemon.socket, Some(&token));
    assert_eq!(create.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&create.stderr).contains("NRY-0060"));

    let no_token = narya(&["env", "list"], &daemon.socket, None);
    assert_eq!(no_token.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_token.stderr).contains("NARYA_TOKEN"));

    let forged = narya(&["env", "list"], &daemon.socket, Some("not-a-token"));
    assert_eq!(forged.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&forged.stderr).contains("NRY-0011"));

    let over_tcp = Command::new(env!("CARGO_BIN_EXE_narya"))
        .args([
            "--url",
            &format!("http://{}", daemon.tcp),
            "--token",
            &token,
            "env",
            "list",
        ])
        .output()
        .unwrap();
    assert!(
        over_tcp.status.success(),
        "{}",
        String::from_utf8_lossy(&over_tcp.stderr)
    );

    let unreachable = narya(
        &["env", "list"],
        &dir.path().join("nothing.sock"),
        Some(&token),
    );
    assert_eq!(unreachable.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unreachable.stderr).contains("cannot reach naryad"));
}

#[tokio::test(flavor = "multi_thread")]
async fn environments_of_another_organisation_do_not_exist_for_you() {
    // Rows are put in the database directly (no runtime back end exists yet to make them);
    // the daemon must show each organisation only its own.
    let dir = tempfile::tempdir().unwrap();
    let idp = IdentityProvider::start().await;
    let key = make_key(dir.path(), "k", "RSA");
    idp.publish(&key.dev);
    let identity = idp.identity_toml("");
    let mut daemon = tokio::task::spawn_blocking(move || Daemon::start(&identity))
        .await
        .unwrap();
    let state = daemon.dir.path().join("state/narya.db");
    {
        let store = narya::store::Store::open(&state).await.unwrap();
        for (id, org) in [("shared-name", "globex"), ("mine", "acme")] {
            store
                .insert(&narya::store::EnvironmentRecord {
                    id: id.parse().unwrap(),
                    organisation: org.to_owned(),
                    person: "p".to_owned(),
                    fingerprint: narya::environments::fingerprint(None, None),
                    setup_script: None,
                    repository: None,
                    image_digest: format!("sha256:{}", "b".repeat(64)).parse().unwrap(),
                    setup_recorded: true,
                    status: narya::model::Status::Ready,
                    status_detail: None,
                    setup: None,
                    created_at: "2026-11-30T00:00:00Z".to_owned(),
                    updated_at: "2026-11-30T00:00:00Z".to_owned(),
                    deleted_at: None,
                    machine: narya::environments::machine_name(org, &id.parse().unwrap()),
                })
                .await
                .unwrap();
        }
        store.close().await;
    }
    let token = |org: &str| {
        key.dev
            .sign(&json!({"iss": idp.issuer, "aud": "narya", "sub": "alice", "org": org, "exp": now() + 600}))
            .unwrap()
    };
    let acme = daemon.unix(Some(&token("acme")));
    let list = acme
        .send(Method::GET, "/v1/environments", None)
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&list.body).unwrap();
    assert_eq!(body["environments"].as_array().unwrap().len(), 1);
    assert_eq!(body["environments"][0]["id"], "mine");
    assert!(body["environments"][0].get("setup").is_none());
    // This daemon's runtime (the default containerd socket) does not answer: the recorded
    // environment stops claiming ready within a few seconds and says why.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let mine = acme
            .send(Method::GET, "/v1/environments/mine", None)
            .await
            .unwrap();
        let mine: serde_json::Value = serde_json::from_slice(&mine.body).unwrap();
        if mine["status"] == "degraded" {
            assert!(
                mine["status_detail"]
                    .as_str()
                    .unwrap()
                    .contains("not answering"),
                "{mine}"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still {mine}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let theirs = acme
        .send(Method::GET, "/v1/environments/shared-name", None)
        .await
        .unwrap();
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);
    assert_eq!(theirs.error().unwrap().code, "NRY-0030");
    let delete_theirs = acme
        .send(Method::DELETE, "/v1/environments/shared-name", None)
        .await
        .unwrap();
    assert_eq!(delete_theirs.status, StatusCode::NOT_FOUND);
    let globex = daemon.tcp(Some(&token("globex")));
    let mine = globex
        .send(Method::GET, "/v1/environments/shared-name", None)
        .await
        .unwrap();
    assert_eq!(mine.status, StatusCode::OK);
    let status = tokio::task::spawn_blocking(move || daemon.terminate())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

/// A disk bound this host cannot hold (a state directory off any quota filesystem) stops
/// start-up, naming the key, what is missing and the explicit way out.
#[test]
fn a_disk_bound_the_host_cannot_hold_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let out = naryad_with(&format!(
        "state_dir = {:?}\n[listen]\nsocket = {:?}\n{IDENTITY}\n[limits]\ndisk = \"1GiB\"\n",
        dir.path().join("state").display().to_string(),
        dir.path().join("run/narya.sock").display().to_string(),
    ));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[limits] disk")
            && stderr.contains("btrfs")
            && stderr.contains("unbounded"),
        "{stderr}"
    );
}

/// gVisor asked for on a host without runsc stops start-up, naming the key and the package to
/// install (before any runtime is asked anything).
#[test]
fn gvisor_without_runsc_stops_start_up_naming_the_package() {
    let dir = tempfile::tempdir().unwrap();
    let out = naryad_with(&format!(
        "state_dir = {:?}\n[listen]\nsocket = {:?}\n{IDENTITY}\n[limits]\ndisk = \"unbounded\"\n\
         [runtime]\nsandbox = \"gvisor\"\nrunsc = {:?}\n",
        dir.path().join("state").display().to_string(),
        dir.path().join("run/narya.sock").display().to_string(),
        dir.path().join("no/runsc").display().to_string(),
    ));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("runtime.runsc")
            && stderr.contains("apt-get install -t bookworm-backports runsc"),
        "{stderr}"
    );
}
