//! naryad under systemd: readiness and stopping reported on `NOTIFY_SOCKET`, the unix socket
//! taken from socket activation, and the shipped units passing `systemd-analyze verify`.

mod support;

use std::io::{Read, Write};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::e2e::{requirements_for, Backend, NAMESPACE};
use support::private::PrivateContainerd;
use support::{free_port, make_key};

/// Things that take a second on a quiet machine get this long on a loaded one.
const PATIENCE: Duration = Duration::from_secs(60);

/// A tool the test needs: its path, or `None` to skip (a failure under CI).
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    });
    if found.is_none() {
        let message = format!("{name} is not installed (Debian package systemd)");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{message} (CI=true: not skipping)"
        );
        eprintln!("skipped: {message}");
    }
    found
}

/// A process killed when the test ends, however it ends.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Running {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status (within `PATIENCE`).
    fn terminate(&mut self) -> std::process::ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "no exit after SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Running {
    /// Stops the process; when the test is failing, prints its log.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("----- {} -----\n{}", self.log.display(), self.log());
        }
    }
}

/// A daemon configuration in `dir` trusting a local key set (no identity provider needed).
fn write_config(dir: &Path, runtime_toml: &str) -> (PathBuf, PathBuf, String) {
    let key = make_key(dir, "idp", "P-256");
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, key.dev.jwks().to_string()).unwrap();
    let socket = dir.join("run/narya.sock");
    let tcp = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "state_dir = {state:?}\n\n[listen]\nsocket = {socket:?}\ntcp = {tcp:?}\n\n\
         [identity]\nissuer = \"narya-systemd-test\"\naudience = \"narya\"\njwks_uri = \"file://{jwks}\"\n\n\
         [pool]\nsize = 0\n\n[limits]\ndisk = \"unbounded\"\n\n{runtime_toml}\n",
        state = dir.join("state").display().to_string(),
        socket = socket.display().to_string(),
        jwks = jwks.display(),
    );
    let path = dir.join("naryad.toml");
    std::fs::write(&path, config).unwrap();
    (path, socket, tcp)
}

fn spawn(program: &Path, args: &[&std::ffi::OsStr], env: &[(&str, &str)], log: PathBuf) -> Running {
    let mut command = Command::new(program);
    command
        .args(args)
        .env("RUST_LOG", "narya=debug,info")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for (key, value) in env {
        command.env(key, value);
    }
    Running {
        child: command.spawn().expect("the program starts"),
        log,
    }
}

/// The next datagram on `socket`, as text.
fn next_notification(socket: &UnixDatagram, daemon: &Running) -> String {
    let mut buffer = [0u8; 4096];
    match socket.recv(&mut buffer) {
        Ok(n) => String::from_utf8_lossy(&buffer[..n]).into_owned(),
        Err(e) => panic!("no notification within {PATIENCE:?}: {e}\n{}", daemon.log()),
    }
}

#[test]
fn the_daemon_reports_ready_once_it_serves_and_stopping_at_sigterm() {
    let Some((runtime_socket, _)) = requirements_for(Backend::Containerd) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (config, socket, tcp) = write_config(
        dir.path(),
        &format!(
            "[runtime]\ncontainerd_socket = {runtime_socket:?}\ncontainerd_namespace = {NAMESPACE:?}\n"
        ),
    );
    let notify_path = dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(PATIENCE)).unwrap();
    let notify_env = notify_path.display().to_string();
    let mut daemon = spawn(
        Path::new(env!("CARGO_BIN_EXE_naryad")),
        &["--config".as_ref(), config.as_os_str()],
        &[("NOTIFY_SOCKET", &notify_env)],
        dir.path().join("naryad.log"),
    );

    let mut ready = next_notification(&notify, &daemon);
    // Status lines may come first; readiness is the one with READY=1.
    while !ready.lines().any(|line| line == "READY=1") {
        ready = next_notification(&notify, &daemon);
    }
    assert!(
        UnixStream::connect(&socket).is_ok(),
        "READY=1 before the unix socket serves:\n{}",
        daemon.log()
    );
    assert!(
        std::net::TcpStream::connect(&tcp).is_ok(),
        "READY=1 before the TCP listener serves:\n{}",
        daemon.log()
    );

    let status = daemon.terminate();
    assert!(status.success(), "{status}:\n{}", daemon.log());
    let mut stopping = next_notification(&notify, &daemon);
    while !stopping.lines().any(|line| line == "STOPPING=1") {
        stopping = next_notification(&notify, &daemon);
    }
}

#[test]
fn readiness_waits_for_a_runtime_that_is_late_while_the_daemon_already_serves() {
    if requirements_for(Backend::Containerd).is_none() {
        return;
    }
    let mut containerd = PrivateContainerd::start();
    containerd.stop();
    let dir = tempfile::tempdir().unwrap();
    let (config, socket, _) = write_config(
        dir.path(),
        &format!(
            "[runtime]\ncontainerd_socket = {:?}\n",
            containerd.socket.display().to_string()
        ),
    );
    let notify_path = dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(PATIENCE)).unwrap();
    let notify_env = notify_path.display().to_string();
    let daemon = spawn(
        Path::new(env!("CARGO_BIN_EXE_naryad")),
        &["--config".as_ref(), config.as_os_str()],
        &[("NOTIFY_SOCKET", &notify_env)],
        dir.path().join("naryad.log"),
    );

    // The runtime is away: the daemon says why it is not ready, yet serves.
    let waiting = next_notification(&notify, &daemon);
    assert!(
        waiting.starts_with("STATUS=") && waiting.contains("waiting for the container runtime"),
        "{waiting:?}:\n{}",
        daemon.log()
    );
    assert!(!waiting.contains("READY=1"), "{waiting:?}");
    assert!(
        status_line(&socket).starts_with("HTTP/1.1 401"),
        "{}",
        daemon.log()
    );

    containerd.resume();
    let mut ready = next_notification(&notify, &daemon);
    while !ready.lines().any(|line| line == "READY=1") {
        ready = next_notification(&notify, &daemon);
    }
}

/// A request on `socket`, answered within `PATIENCE`: the status line.
fn status_line(socket: &Path) -> String {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
        .write_all(b"GET /v1/environments HTTP/1.1\r\nHost: naryad\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn a_socket_systemd_passes_is_served_and_left_in_place() {
    let Some(activate) = tool("systemd-socket-activate") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // No runtime: the daemon serves degraded, which is all socket activation needs.
    let runtime = dir.path().join("no-runtime/containerd.sock");
    let (config, socket, _) = write_config(
        dir.path(),
        &format!(
            "[runtime]\ncontainerd_socket = {:?}\n",
            runtime.display().to_string()
        ),
    );
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    // systemd-socket-activate binds the socket, waits for the first connection, then becomes
    // naryad with LISTEN_FDS=1, LISTEN_PID its own pid, and only the environment given with
    // -E. The NOTIFY_SOCKET is unusable on purpose: that is logged, never fatal.
    let mut daemon = spawn(
        &activate,
        &[
            "-l".as_ref(),
            socket.as_os_str(),
            "-E".as_ref(),
            "NOTIFY_SOCKET=not-a-socket-path".as_ref(),
            "-E".as_ref(),
            "RUST_LOG=narya=debug,info".as_ref(),
            env!("CARGO_BIN_EXE_naryad").as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
        ],
        &[],
        dir.path().join("naryad.log"),
    );
    let deadline = Instant::now() + PATIENCE;
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "systemd-socket-activate made no socket:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let answer = status_line(&socket);
    assert!(
        answer.starts_with("HTTP/1.1 401"),
        "{answer:?}:\n{}",
        daemon.log()
    );
    let log = daemon.log();
    assert!(
        log.contains("serving the unix socket systemd passed"),
        "{log}"
    );
    assert!(log.contains("NOTIFY_SOCKET"), "{log}");

    let status = daemon.terminate();
    assert!(status.success(), "{status}:\n{}", daemon.log());
    assert!(
        socket.exists(),
        "naryad removed the socket systemd owns:\n{}",
        daemon.log()
    );
}

#[test]
fn the_units_pass_systemd_analyze_verify() {
    let Some(analyze) = tool("systemd-analyze") else {
        return;
    };
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd");
    let dir = tempfile::tempdir().unwrap();
    // verify wants ExecStart's binary to exist: the one this test run built stands in.
    for unit in ["naryad.service", "naryad.socket"] {
        let text = std::fs::read_to_string(units.join(unit)).unwrap();
        let text = text.replace("/usr/bin/naryad", env!("CARGO_BIN_EXE_naryad"));
        std::fs::write(dir.path().join(unit), text).unwrap();
    }
    let verified = Command::new(analyze)
        .arg("verify")
        .arg(dir.path().join("naryad.service"))
        .arg(dir.path().join("naryad.socket"))
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&verified.stdout),
        String::from_utf8_lossy(&verified.stderr)
    );
    assert!(verified.status.success(), "{said}");
    // Unknown keys and bad values are only warnings to verify: none may name our units.
    let ours: Vec<&str> = said.lines().filter(|l| l.contains("naryad")).collect();
    assert!(ours.is_empty(), "{said}");
}
