//! Podman 4.3 to 5.8 make every container under their default runtime whatever one a create
//! asks for (Podman issue 28429). A container made with a runtime asked for is inspected, and
//! removed when it runs under another or when Podman cannot say.

use std::path::Path;

use super::{expect, request, LibpodError};

/// Makes sure container `id` runs under the runtime `asked`, and removes it if not, or if
/// Podman cannot say: Podman 4.3 to 5.8 make every container under their default runtime
/// whatever one it asks for (Podman issue 28429), so a Podman whose default changed since the
/// daemon checked it would otherwise run a machine meant for gVisor under runc.
pub(super) async fn under_the_runtime_asked(
    socket: &Path,
    id: &str,
    asked: &str,
) -> Result<(), LibpodError> {
    #[derive(serde::Deserialize)]
    struct Inspected {
        #[serde(rename = "OCIRuntime", default)]
        runtime: String,
    }
    let path = format!("/containers/{id}/json");
    let inspected = async {
        let answer = request(socket, hyper::Method::GET, &path, None).await?;
        let body = expect(200, answer)?;
        serde_json::from_slice::<Inspected>(&body)
            .map_err(|e| LibpodError::Decode("an inspected container", e))
    }
    .await;
    if matches!(&inspected, Ok(i) if i.runtime == asked) {
        return Ok(());
    }
    let removed = remove(socket, id).await;
    let asked = asked.to_owned();
    Err(match inspected {
        Ok(inspected) => LibpodError::WrongRuntime {
            asked,
            made_under: Some(inspected.runtime).filter(|r| !r.is_empty()),
            removed,
        },
        Err(cause) => LibpodError::Unconfirmed {
            asked,
            removed,
            cause: Box::new(cause),
        },
    })
}

/// Removes container `id` with its anonymous volumes, whatever its state; whether it is gone.
async fn remove(socket: &Path, id: &str) -> bool {
    let removal = request(
        socket,
        hyper::Method::DELETE,
        &format!("/containers/{id}?force=true&v=true"),
        None,
    )
    .await
    .and_then(|(status, body)| {
        // Podman 4 answers 200 with a report, later ones may answer 204; gone already is fine.
        let ok = if (200..300).contains(&status) || status == 404 {
            status
        } else {
            200
        };
        expect(ok, (status, body)).map(drop)
    });
    match removal {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(container = id, error = %e, "docker: removing a container Podman made under another runtime than asked");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::under_the_runtime_asked;
    use crate::docker::libpod::LibpodError;
    use crate::ErrorKind;

    /// A Podman on a unix socket that answers an inspect with `inspect` (status, body) and a
    /// removal with 200; the request lines it was sent.
    fn fake_podman(
        dir: &std::path::Path,
        inspect: (&'static str, &'static str),
    ) -> (
        std::path::PathBuf,
        std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let socket = dir.join("podman.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = vec![0u8; 4096];
                let n = stream.read(&mut request).await.unwrap_or(0);
                let line = String::from_utf8_lossy(&request[..n])
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let (status, body) = if line.starts_with("GET") {
                    inspect
                } else {
                    ("200 OK", "[]")
                };
                log.lock().unwrap().push(line);
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        (socket, seen)
    }

    #[tokio::test]
    async fn a_container_under_another_runtime_is_removed_and_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, seen) = fake_podman(dir.path(), ("200 OK", r#"{"OCIRuntime":"runc"}"#));
        let e = under_the_runtime_asked(&socket, "c1", "runsc")
            .await
            .expect_err("runc is not runsc");
        assert!(
            matches!(&e, LibpodError::WrongRuntime { made_under: Some(r), removed: true, .. } if r == "runc"),
            "{e}"
        );
        assert_eq!(e.kind(), ErrorKind::Other);
        let seen = seen.lock().unwrap().clone();
        assert!(
            seen.iter()
                .any(|l| l.starts_with("DELETE") && l.contains("/containers/c1?force=true&v=true")),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn a_runtime_that_cannot_be_confirmed_removes_the_container_and_keeps_the_kind() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, seen) = fake_podman(
            dir.path(),
            ("503 Service Unavailable", r#"{"message":"busy"}"#),
        );
        let e = under_the_runtime_asked(&socket, "c2", "runsc")
            .await
            .expect_err("nothing confirmed");
        assert!(
            matches!(&e, LibpodError::Unconfirmed { removed: true, .. }),
            "{e}"
        );
        assert_eq!(
            e.kind(),
            ErrorKind::Unavailable,
            "retryable, as the inspect's failure was"
        );
        assert!(e.to_string().contains("could not confirm"), "{e}");
        assert!(seen.lock().unwrap().iter().any(|l| l.starts_with("DELETE")));
    }

    #[tokio::test]
    async fn the_runtime_asked_for_passes_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, seen) = fake_podman(dir.path(), ("200 OK", r#"{"OCIRuntime":"runsc"}"#));
        under_the_runtime_asked(&socket, "c3", "runsc")
            .await
            .expect("made under runsc");
        assert!(!seen.lock().unwrap().iter().any(|l| l.starts_with("DELETE")));
    }
}
