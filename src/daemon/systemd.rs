//! What naryad speaks with systemd: the `sd_notify` datagram (`READY=1`, `STATUS=…`,
//! `STOPPING=1`) and socket activation of the unix socket (`LISTEN_FDS`/`LISTEN_PID`, fd 3).
//! Both are tiny protocols, written out here rather than pulled in as a crate.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

/// The first file descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: i32 = 3;

/// Where readiness and status are reported: `NOTIFY_SOCKET`, when systemd set it.
pub struct Notifier {
    socket: Option<UnixDatagram>,
    target: Option<Target>,
}

/// A notify socket is a path, or a name in the abstract namespace when it begins with `@`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

impl Target {
    fn parse(value: &OsString) -> Option<Target> {
        let bytes = value.as_bytes();
        match bytes.first() {
            Some(b'@') if bytes.len() > 1 => Some(Target::Abstract(bytes[1..].to_vec())),
            Some(b'/') => Some(Target::Path(PathBuf::from(value))),
            _ => None,
        }
    }
}

impl Notifier {
    /// The notifier `NOTIFY_SOCKET` names, or one that says nothing when it is unset. An
    /// unusable value is logged, never fatal: the daemon serves the same either way.
    pub fn from_environment() -> Notifier {
        let Some(value) = std::env::var_os("NOTIFY_SOCKET") else {
            return Notifier::silent();
        };
        let Some(target) = Target::parse(&value) else {
            tracing::warn!(notify_socket = ?value, "NOTIFY_SOCKET is neither a path nor an abstract name; not reporting readiness to systemd");
            return Notifier::silent();
        };
        match UnixDatagram::unbound() {
            Ok(socket) => Notifier {
                socket: Some(socket),
                target: Some(target),
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot make a socket to report readiness to systemd");
                Notifier::silent()
            }
        }
    }

    /// A notifier that sends nothing.
    pub fn silent() -> Notifier {
        Notifier {
            socket: None,
            target: None,
        }
    }

    /// Sends `state` (newline-separated `KEY=VALUE` assignments) to systemd. A failure is
    /// logged: systemd is a spectator here, never a reason to stop serving.
    pub fn notify(&self, state: &str) {
        let (Some(socket), Some(target)) = (&self.socket, &self.target) else {
            return;
        };
        let sent = match target {
            Target::Path(path) => socket.send_to(state.as_bytes(), path),
            Target::Abstract(name) => send_abstract(socket, name, state.as_bytes()),
        };
        if let Err(e) = sent {
            tracing::warn!(error = %e, state, "cannot report to systemd's NOTIFY_SOCKET");
        }
    }
}

fn send_abstract(socket: &UnixDatagram, name: &[u8], bytes: &[u8]) -> std::io::Result<usize> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    socket.send_to_addr(bytes, &addr)
}

/// Why a socket systemd passed cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error("systemd passed {0} sockets (LISTEN_FDS); naryad takes exactly one, its unix socket")]
    Count(u32),
    #[error("the socket systemd passed (fd 3) is not a listening unix stream socket: {0}")]
    NotUnix(std::io::Error),
}

/// The unix socket systemd passed to this process, when it was socket-activated: `LISTEN_PID`
/// names this process and `LISTEN_FDS` is 1. `None` when it was not activated.
pub fn activated_unix_listener(
) -> Result<Option<(std::os::unix::net::UnixListener, Option<PathBuf>)>, ActivationError> {
    let for_us = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|pid| pid.trim().parse::<u32>().ok())
        == Some(std::process::id());
    if !for_us {
        return Ok(None);
    }
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.trim().parse::<u32>().ok())
        .unwrap_or(0);
    match count {
        0 => Ok(None),
        1 => adopt_fd(LISTEN_FDS_START).map(Some),
        n => Err(ActivationError::Count(n)),
    }
}

/// Takes ownership of `fd` as a unix listener and returns a close-on-exec copy of it (systemd
/// passes it inheritable) with the path it is bound to.
fn adopt_fd(
    fd: i32,
) -> Result<(std::os::unix::net::UnixListener, Option<PathBuf>), ActivationError> {
    use std::os::fd::FromRawFd;
    // SAFETY: under socket activation, systemd guarantees fd 3 is an open socket handed to this
    // process (LISTEN_PID matched); nothing else in naryad opens, closes or owns fd 3 before
    // start-up reaches here, and this is called at most once.
    let inherited = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
    // getsockname on anything but an AF_UNIX socket is refused by std's address type.
    let addr = inherited.local_addr().map_err(ActivationError::NotUnix)?;
    let listener = inherited.try_clone().map_err(ActivationError::NotUnix)?;
    drop(inherited);
    listener
        .set_nonblocking(true)
        .map_err(ActivationError::NotUnix)?;
    Ok((listener, addr.as_pathname().map(Path::to_owned)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_socket_values_are_paths_or_abstract_names() {
        assert_eq!(
            Target::parse(&OsString::from("/run/systemd/notify")),
            Some(Target::Path(PathBuf::from("/run/systemd/notify")))
        );
        assert_eq!(
            Target::parse(&OsString::from("@/org/freedesktop/systemd1/notify/1")),
            Some(Target::Abstract(
                b"/org/freedesktop/systemd1/notify/1".to_vec()
            ))
        );
        assert_eq!(Target::parse(&OsString::from("relative/path")), None);
        assert_eq!(Target::parse(&OsString::from("@")), None);
        assert_eq!(Target::parse(&OsString::from("")), None);
    }

    #[test]
    fn notify_sends_one_datagram_to_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let receiver = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier {
            socket: Some(UnixDatagram::unbound().unwrap()),
            target: Some(Target::Path(path)),
        };
        notifier.notify("READY=1\nSTATUS=serving");
        let mut buffer = [0u8; 64];
        let n = receiver.recv(&mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"READY=1\nSTATUS=serving");
    }

    #[test]
    fn notify_to_an_abstract_name_arrives() {
        let name = format!("narya-notify-test-{}", std::process::id());
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let receiver = UnixDatagram::bind_addr(&addr).unwrap();
        let notifier = Notifier {
            socket: Some(UnixDatagram::unbound().unwrap()),
            target: Some(Target::Abstract(name.into_bytes())),
        };
        notifier.notify("STOPPING=1");
        let mut buffer = [0u8; 64];
        let n = receiver.recv(&mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"STOPPING=1");
    }

    #[test]
    fn notify_to_a_missing_socket_is_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let notifier = Notifier {
            socket: Some(UnixDatagram::unbound().unwrap()),
            target: Some(Target::Path(dir.path().join("nobody"))),
        };
        notifier.notify("READY=1");
        Notifier::silent().notify("READY=1");
    }
}
