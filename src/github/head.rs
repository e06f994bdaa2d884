//! Which commit a clone gets: asked of the git server before cloning (its ref advertisement,
//! as `git ls-remote` reads it), and read from a fresh clone's `.git` afterwards, without
//! running git over what the repository holds.

use std::path::Path;

use reqwest::StatusCode;

use super::app::{not_answering, refused, unreachable, GitHubApp};
use super::{GitHubError, Secret};
use crate::model::Repository;

/// The most of a ref advertisement read: a repository with very many branches and tags is
/// cut short, and HEAD comes first anyway.
const MAX_ADVERTISEMENT: usize = 1 << 20;

/// The most of a ref file read from a clone.
const MAX_REF_FILE: u64 = 1 << 20;

fn is_object_name(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The commit `HEAD` names in a git smart-HTTP ref advertisement (protocol v0), if it names
/// one: an empty repository advertises none.
#[cfg(test)]
fn advertised_head(body: &[u8]) -> Option<String> {
    first_ref(body).flatten()
}

/// Like [`advertised_head`] on the beginning of an advertisement: `None` while `body` is too
/// short to tell, `Some(answer)` once its first ref line (or a malformed one) has arrived.
fn first_ref(body: &[u8]) -> Option<Option<String>> {
    let mut rest = body;
    loop {
        if rest.len() < 4 {
            return None;
        }
        let Some(len) = std::str::from_utf8(&rest[..4])
            .ok()
            .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|hex| usize::from_str_radix(hex, 16).ok())
        else {
            return Some(None);
        };
        if len == 0 {
            // A flush packet: after the service announcement, or at the end.
            rest = &rest[4..];
            continue;
        }
        if len < 4 {
            return Some(None);
        }
        if len > rest.len() {
            return None;
        }
        let line = &rest[4..len];
        rest = &rest[len..];
        if line.starts_with(b"# service=") {
            continue;
        }
        // "<object name> <ref>\0<capabilities>\n" for the first; HEAD, when there is one, is it.
        let line = line.split(|b| *b == 0).next().unwrap_or_default();
        let Some((name, reference)) = std::str::from_utf8(line)
            .ok()
            .and_then(|line| line.trim_end().split_once(' '))
        else {
            return Some(None);
        };
        return Some(
            (reference == "HEAD" && is_object_name(name)).then(|| name.to_ascii_lowercase()),
        );
    }
}

/// The commit a fresh clone in `workspace` checked out: `.git/HEAD`, followed to its branch's
/// ref (loose or packed). `None` when it cannot be told.
pub fn checked_out_commit(workspace: &Path) -> Option<String> {
    let git = workspace.join(".git");
    let read = |path: &Path| -> Option<String> {
        use std::io::Read;
        let file = std::fs::File::open(path).ok()?;
        if !file.metadata().ok()?.is_file() {
            return None;
        }
        let mut text = String::new();
        file.take(MAX_REF_FILE).read_to_string(&mut text).ok()?;
        Some(text)
    };
    let head = read(&git.join("HEAD"))?;
    let head = head.trim();
    if is_object_name(head) {
        return Some(head.to_ascii_lowercase());
    }
    let reference = head.strip_prefix("ref: ")?.trim();
    let safe = reference.starts_with("refs/")
        && reference
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if !safe {
        return None;
    }
    if let Some(loose) = read(&git.join(reference)) {
        let loose = loose.trim();
        return is_object_name(loose).then(|| loose.to_ascii_lowercase());
    }
    let packed = read(&git.join("packed-refs"))?;
    packed.lines().find_map(|line| {
        let (name, r) = line.split_once(' ')?;
        (r == reference && is_object_name(name)).then(|| name.to_ascii_lowercase())
    })
}

impl GitHubApp {
    /// The commit `repository`'s default branch points at now, as a clone would check it out:
    /// the git server's ref advertisement, asked with `token`. `None` for an empty repository.
    /// Errors: `Unavailable`; `Refused` when the server will not answer (a refused token).
    pub async fn remote_head(
        &self,
        token: &Secret,
        repository: &Repository,
    ) -> Result<Option<String>, GitHubError> {
        const WHAT: &str = "asking the git server for the default branch";
        let url = format!(
            "{}/info/refs?service=git-upload-pack",
            self.clone_url(repository)
        );
        let mut response = self
            .http()
            .get(url)
            .basic_auth("x-access-token", Some(token.expose()))
            .send()
            .await
            .map_err(unreachable(WHAT))?;
        let status = response.status();
        if status != StatusCode::OK {
            let headers = response.headers().clone();
            let body = response.bytes().await.map_err(unreachable(WHAT))?;
            return Err(not_answering(WHAT, status, &headers, &body)
                .unwrap_or_else(|| refused(WHAT, status, &body)));
        }
        // Read only as far as HEAD's line: a repository's whole list of refs (every pull
        // request's among them) can be many megabytes.
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreachable(WHAT))? {
            body.extend_from_slice(&chunk);
            if let Some(head) = first_ref(&body) {
                return Ok(head);
            }
            if body.len() > MAX_ADVERTISEMENT {
                break;
            }
        }
        Ok(first_ref(&body).flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(line: &str) -> String {
        format!("{:04x}{line}", line.len() + 4)
    }

    #[test]
    fn head_is_read_from_a_ref_advertisement() {
        let sha = "a".repeat(40);
        let body = format!(
            "{}0000{}{}0000",
            pkt("# service=git-upload-pack\n"),
            pkt(&format!(
                "{sha} HEAD\0multi_ack symref=HEAD:refs/heads/main agent=git/2\n"
            )),
            pkt(&format!("{sha} refs/heads/main\n")),
        );
        assert_eq!(advertised_head(body.as_bytes()), Some(sha.clone()));
        // Read as it arrives: undecided until HEAD's line is whole, decided from then on.
        let head_line_ends = body.find("refs/heads/main\n").unwrap();
        assert_eq!(first_ref(&body.as_bytes()[..20]), None);
        assert_eq!(first_ref(&body.as_bytes()[..60]), None);
        assert_eq!(
            first_ref(&body.as_bytes()[..head_line_ends]),
            Some(Some(sha))
        );
    }

    #[test]
    fn an_empty_repository_or_garbage_names_no_head() {
        let empty = format!(
            "{}0000{}0000",
            pkt("# service=git-upload-pack\n"),
            pkt(&format!(
                "{} capabilities^{{}}\0agent=git/2\n",
                "0".repeat(40)
            ))
        );
        assert_eq!(advertised_head(empty.as_bytes()), None);
        assert_eq!(advertised_head(b"zzzz"), None);
        assert_eq!(advertised_head(b"00ff short"), None);
        assert_eq!(advertised_head(b""), None);
    }

    #[test]
    fn a_clone_names_its_commit_from_a_loose_or_packed_ref() {
        let dir = tempfile::tempdir().unwrap();
        let git = dir.path().join(".git");
        std::fs::create_dir_all(git.join("refs/heads")).unwrap();
        std::fs::write(git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        let sha = "b".repeat(40);
        std::fs::write(
            git.join("packed-refs"),
            format!("# pack-refs\n{sha} refs/heads/main\n"),
        )
        .unwrap();
        assert_eq!(checked_out_commit(dir.path()), Some(sha));
        let loose = "c".repeat(40);
        std::fs::write(git.join("refs/heads/main"), format!("{loose}\n")).unwrap();
        assert_eq!(checked_out_commit(dir.path()), Some(loose.clone()));
        std::fs::write(git.join("HEAD"), "ref: refs/../../etc/passwd\n").unwrap();
        assert_eq!(checked_out_commit(dir.path()), None);
        std::fs::write(git.join("HEAD"), format!("{loose}\n")).unwrap();
        assert_eq!(checked_out_commit(dir.path()), Some(loose));
        assert_eq!(checked_out_commit(&dir.path().join("nowhere")), None);
    }
}
