//! The GitHub double's git server: smart HTTP for real bare repositories through
//! `git http-backend` as CGI, which takes only a live installation token as `x-access-token`
//! Basic credentials, for the repositories it covers, and can be told to stall or refuse.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use tokio::io::AsyncWriteExt;

use super::github::{live_token, GitRequest, Shared};

/// Whether `authorization` is `Basic x-access-token:TOKEN` for a live token that may read
/// `owner/name`.
fn git_authorised(shared: &Shared, authorization: Option<&str>, owner: &str, name: &str) -> bool {
    if shared.refuse_git.load(Ordering::SeqCst) {
        return false;
    }
    let Some(encoded) = authorization.and_then(|a| a.strip_prefix("Basic ")) else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    let Ok(decoded) = String::from_utf8(decoded) else {
        return false;
    };
    let Some(token) = decoded
        .strip_prefix("x-access-token:")
        .and_then(|t| live_token(shared, t))
    else {
        return false;
    };
    if token.permissions["contents"] != "read" {
        return false;
    }
    let installations = shared.installations.lock().unwrap();
    let Some(found) = installations.get(&token.installation) else {
        return false;
    };
    found.account == owner
        && found.selected.iter().any(|n| n == name)
        && token
            .repositories
            .as_ref()
            .is_none_or(|r| r.iter().any(|n| n == name))
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain")], text).into_response()
}

/// git's smart HTTP, served by `git http-backend` as CGI.
pub(super) async fn git(
    State(shared): State<Arc<Shared>>,
    UrlPath(path): UrlPath<String>,
    method: Method,
    headers: HeaderMap,
    query: axum::extract::RawQuery,
    body: Bytes,
) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let delay = *shared.git_delay.lock().unwrap();
    let answer = async {
        tokio::time::sleep(delay).await;
        let mut segments = path.splitn(3, '/');
        let (Some(owner), Some(repository)) = (segments.next(), segments.next()) else {
            return plain(StatusCode::NOT_FOUND, "Not Found");
        };
        let name = repository.trim_end_matches(".git");
        if !git_authorised(&shared, authorization.as_deref(), owner, name) {
            let mut refused = plain(StatusCode::UNAUTHORIZED, "");
            refused.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                "Basic realm=\"GitHub\"".parse().unwrap(),
            );
            return refused;
        }
        if !shared
            .repositories
            .join(owner)
            .join(format!("{name}.git"))
            .is_dir()
        {
            return plain(StatusCode::NOT_FOUND, "Repository not found.");
        }
        http_backend(&shared, &path, &method, &headers, query.0.as_deref(), body).await
    }
    .await;
    shared.git_requests.lock().unwrap().push(GitRequest {
        path: path.clone(),
        at: SystemTime::now(),
        authorization,
        status: answer.status().as_u16(),
    });
    answer
}

async fn http_backend(
    shared: &Shared,
    path: &str,
    method: &Method,
    headers: &HeaderMap,
    query: Option<&str>,
    body: Bytes,
) -> Response {
    let header_value = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let mut command = tokio::process::Command::new("git");
    command
        .arg("http-backend")
        .env("GIT_PROJECT_ROOT", &shared.repositories)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", format!("/{path}"))
        .env("QUERY_STRING", query.unwrap_or_default())
        .env("REQUEST_METHOD", method.as_str())
        .env("CONTENT_TYPE", header_value(header::CONTENT_TYPE))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("REMOTE_USER", "x-access-token")
        .env("REMOTE_ADDR", "127.0.0.1")
        .env(
            "HTTP_CONTENT_ENCODING",
            header_value(header::CONTENT_ENCODING),
        )
        .env(
            "GIT_PROTOCOL",
            headers
                .get("git-protocol")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default(),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("git http-backend starts");
    let mut stdin = child.stdin.take().unwrap();
    let feed = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let output = child
        .wait_with_output()
        .await
        .expect("git http-backend ran");
    let _ = feed.await;
    cgi_response(&output.stdout)
}

/// A CGI answer: header lines (`Status:` among them), a blank line, the body.
fn cgi_response(stdout: &[u8]) -> Response {
    let (head, body) = match find(stdout, b"\r\n\r\n") {
        Some(at) => (&stdout[..at], &stdout[at + 4..]),
        None => match find(stdout, b"\n\n") {
            Some(at) => (&stdout[..at], &stdout[at + 2..]),
            None => (&stdout[..0], stdout),
        },
    };
    let mut response = Response::builder().status(StatusCode::OK);
    for line in String::from_utf8_lossy(head).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().unwrap_or("500");
            response = response.status(code.parse::<u16>().unwrap_or(500));
        } else {
            response = response.header(name.trim(), value);
        }
    }
    response.body(Body::from(body.to_vec())).unwrap()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
