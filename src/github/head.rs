//! Which commit a clone gets: asked of the git server before cloning (its ref advertisement,
//! as `git ls-remote` reads it), and read from a fresh clone's `.git` afterwards, without
//! running git over what the repository holds.

use std::path::Path;

use reqwest::StatusCode;

use super::app::{refused, send, GitHubApp};
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
pub fn advertised_head(body: &[u8]) -> Option<String> {
    let mut rest = body;
    while rest.len() >= 4 {
        let len = usize::from_str_radix(std::str::from_utf8(&rest[..4]).ok()?, 16).ok()?;
        if len == 0 {
            // A flush packet: after the service announcement, or at the end.
            rest = &rest[4..];
            continue;
        }
        if len < 4 || len > rest.len() {
            return None;
        }
        let line = &rest[4..len];
        rest = &rest[len..];
        if line.starts_with(b"# service=") {
            continue;
        }
        // "<object name> <ref>\0<capabilities>\n" for the first; HEAD, when there is one, is it.
        let line = line.split(|b| *b == 0).next()?;
        let line = std::str::from_utf8(line).ok()?.trim_end();
        let (name, reference) = line.split_once(' ')?;
        return (reference == "HEAD" && is_object_name(name)).then(|| name.to_ascii_lowercase());
    }
    None
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
        let request = self
            .http()
            .get(url)
            .basic_auth("x-access-token", Some(token.expose()));
        let (status, _, body) = send(WHAT, request).await?;
        if status != StatusCode::OK {
            return Err(refused(WHAT, status, &body));
        }
        let body = &body[..body.len().min(MAX_ADVERTISEMENT)];
        Ok(advertised_head(body))
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
        assert_eq!(advertised_head(body.as_bytes()), Some(sha));
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
