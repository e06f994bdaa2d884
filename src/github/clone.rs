//! The clone command: its throwaway container's name, its argv and environment (which hold no
//! secret), the token it reads on its standard input, and its output with the token taken out.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use super::Secret;

/// What a secret is replaced with in output.
const REDACTED: &[u8] = b"[redacted]";
/// A kept output tail that begins with at least this much of a secret's end loses it too.
const PARTIAL_MIN: usize = 4;

/// A name for the clone's throwaway container, unique per call and unguessable (208 bits of a
/// hash over the id, the time and a counter), so no environment id can be chosen to collide
/// with it. It is no longer than 64 characters because runtimes use it as the container's
/// hostname, which Linux limits to 64.
pub fn throwaway_name(id: &str) -> String {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = Sha256::new();
    hasher.update(id.as_bytes());
    hasher.update(std::process::id().to_be_bytes());
    hasher.update(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            .to_be_bytes(),
    );
    hasher.update(CALLS.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    let hex: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("narya-clone-{}", &hex[..52])
}

/// The clone's shell: it reads the token from its standard input (the one channel no runtime
/// records), then runs `git clone` with a credential helper that reads it from an inherited
/// pipe (fd 3), fed with the token for as long as git asks. So no argv, environment variable,
/// label, container spec or file ever holds it; the shell's variable is unexported.
/// Arguments: `$1` the helper's config key, `$2` the helper, `$3` the URL, `$4` the directory.
const CLONE_SCRIPT: &str = r#"IFS= read -r token || { echo "narya: no credential on standard input" >&2; exit 2; }
exec </dev/null
while printf '%s\n' "$token"; do :; done | {
    exec 3<&0 </dev/null
    exec git -c credential.helper= -c "$1=$2" clone -- "$3" "$4"
}"#;

/// The credential helper: on `get`, one line of fd 3 as the password of `x-access-token`
/// (how git hosts take an installation token); `store` and `erase` are ignored.
const CREDENTIAL_HELPER: &str = r#"!f() { test "$1" = get || exit 0; IFS= read -r t <&3 || exit 0; printf 'username=x-access-token\npassword=%s\n' "$t"; }; f"#;

/// `git clone -- URL INTO` through [`CLONE_SCRIPT`]; the credential helper answers only for
/// `git_url`'s origin, and the URL carries no credential, so none reaches `.git/config`.
pub fn clone_argv(git_url: &str, url: &str, into: &str) -> Vec<String> {
    let origin = reqwest::Url::parse(git_url)
        .map(|u| u.origin().ascii_serialization())
        .unwrap_or_else(|_| git_url.trim_end_matches('/').to_owned());
    vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        CLONE_SCRIPT.to_owned(),
        "narya-clone".to_owned(),
        format!("credential.{origin}.helper"),
        CREDENTIAL_HELPER.to_owned(),
        url.to_owned(),
        into.to_owned(),
    ]
}

/// What the clone reads on its standard input: the token, one line.
pub fn clone_stdin(token: &Secret) -> Vec<u8> {
    format!("{}\n", token.expose()).into_bytes()
}

/// `x-access-token:TOKEN` as HTTP Basic credentials, which is how git sends the token: output
/// holding it in this form is redacted too.
fn basic_credentials(token: &Secret) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{}", token.expose()))
}

/// The clone process's environment: no prompt, so a refused token fails at once instead of
/// waiting for a person. It holds no secret.
pub fn clone_env() -> BTreeMap<String, String> {
    BTreeMap::from([("GIT_TERMINAL_PROMPT".to_owned(), "0".to_owned())])
}

/// Whether `config` (a `.git/config`) holds the token in any form the clone was given it.
pub fn config_holds_secret(config: &[u8], token: &Secret) -> bool {
    Redactor::for_token(token)
        .secrets
        .iter()
        .any(|s| find(config, s).is_some())
}

/// Takes secrets out of output, also when it arrives in chunks that split one: the last bytes
/// that could begin a secret are held back until the next chunk shows what they are.
pub struct Redactor {
    secrets: Vec<Vec<u8>>,
    hold: usize,
    pending: Vec<u8>,
}

impl Redactor {
    /// Nothing to take out.
    pub fn none() -> Redactor {
        Redactor::new(Vec::new())
    }

    /// The token, and the Basic credentials it was given to git as.
    pub fn for_token(token: &Secret) -> Redactor {
        Redactor::new(vec![
            token.expose().as_bytes().to_vec(),
            basic_credentials(token).into_bytes(),
        ])
    }

    fn new(secrets: Vec<Vec<u8>>) -> Redactor {
        let secrets: Vec<Vec<u8>> = secrets.into_iter().filter(|s| !s.is_empty()).collect();
        let hold = secrets.iter().map(|s| s.len() - 1).max().unwrap_or(0);
        Redactor {
            secrets,
            hold,
            pending: Vec::new(),
        }
    }

    /// The redacted bytes that can be let out after `bytes` arrived.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(bytes);
        self.pending = replace_all(&self.pending, &self.secrets);
        let out = self.pending.len().saturating_sub(self.hold);
        self.pending.drain(..out).collect()
    }

    /// Whatever is still held back, at the end of the output.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }

    /// A whole output. `truncated`: it is a tail, which may begin inside a secret, so a
    /// beginning that is a secret's end goes too.
    pub fn redact(&self, bytes: &[u8], truncated: bool) -> Vec<u8> {
        let mut text = replace_all(bytes, &self.secrets);
        if truncated {
            for secret in &self.secrets {
                let cut = (PARTIAL_MIN..secret.len())
                    .rev()
                    .find(|&k| text.starts_with(&secret[secret.len() - k..]));
                if let Some(k) = cut {
                    text.splice(..k, REDACTED.iter().copied());
                }
            }
        }
        text
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn replace_all(bytes: &[u8], secrets: &[Vec<u8>]) -> Vec<u8> {
    let mut text = bytes.to_vec();
    for secret in secrets {
        let mut out = Vec::with_capacity(text.len());
        let mut rest = &text[..];
        while let Some(at) = find(rest, secret) {
            out.extend_from_slice(&rest[..at]);
            out.extend_from_slice(REDACTED);
            rest = &rest[at + secret.len()..];
        }
        out.extend_from_slice(rest);
        text = out;
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Secret {
        Secret::new("ghs_16C7e42F292c6912E7710c838347Ae178B4a".to_owned())
    }

    #[test]
    fn throwaway_names_are_unique_and_fit_a_hostname() {
        let id = "a".repeat(64);
        let a = throwaway_name(&id);
        let b = throwaway_name(&id);
        assert_ne!(a, b);
        assert_eq!(a.len(), 64, "{a}");
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'));
    }

    #[test]
    fn the_token_goes_on_standard_input_only() {
        let argv = clone_argv(
            "https://github.com/",
            "https://github.com/acme/app.git",
            "/workspace",
        );
        assert_eq!(argv[4], "credential.https://github.com.helper");
        assert_eq!(argv[6..], ["https://github.com/acme/app.git", "/workspace"]);
        let env = clone_env();
        assert_eq!(env["GIT_TERMINAL_PROMPT"], "0");
        for text in argv.iter().chain(env.values()) {
            assert!(!text.contains(token().expose()), "{text}");
            assert!(!text.contains(&basic_credentials(&token())), "{text}");
        }
        assert_eq!(
            clone_stdin(&token()),
            format!("{}\n", token().expose()).into_bytes()
        );
        let local = clone_argv("http://127.0.0.1:8080/git", "u", "d");
        assert_eq!(local[4], "credential.http://127.0.0.1:8080.helper");
    }

    /// The script and helper run as they will in the throwaway: a fake `git` on PATH reports
    /// what the credential helper answers, asked twice.
    #[test]
    fn the_helper_answers_every_ask_from_the_piped_token() {
        let dir = tempfile::tempdir().unwrap();
        let fake_git = dir.path().join("git");
        // Like git, it runs a `!` helper as `sh -c 'HELPER "$@"' HELPER ACTION`.
        let script = r#"#!/bin/sh
helper="${4#*=}"
helper="${helper#!}"
for n in 1 2; do printf 'protocol=https\nhost=github.com\n\n' | sh -c "$helper \"\$@\"" "$helper" get; done
printf 'x\n' | sh -c "$helper \"\$@\"" "$helper" store
echo "args: $5 $6 $7 $8"
"#;
        std::fs::write(&fake_git, script).unwrap();
        std::fs::set_permissions(
            &fake_git,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let argv = clone_argv("https://github.com", "https://github.com/a/b.git", "/w");
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env("PATH", format!("{}:/usr/bin:/bin", dir.path().display()))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), &clone_stdin(&token())).unwrap();
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let expected = format!("username=x-access-token\npassword={}\n", token().expose());
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!("{expected}{expected}args: clone -- https://github.com/a/b.git /w\n")
        );
    }

    #[test]
    fn secrets_split_across_chunks_are_taken_out() {
        let t = token();
        let text = format!(
            "before {} middle {} after",
            t.expose(),
            basic_credentials(&t)
        );
        for size in [1, 3, 7, 40, 1000] {
            let mut redactor = Redactor::for_token(&t);
            let mut out = Vec::new();
            for chunk in text.as_bytes().chunks(size) {
                out.extend(redactor.push(chunk));
            }
            out.extend(redactor.finish());
            assert_eq!(
                String::from_utf8(out).unwrap(),
                "before [redacted] middle [redacted] after",
                "chunks of {size}"
            );
        }
        let mut none = Redactor::none();
        assert_eq!(none.push(b"as is"), b"as is");
    }

    #[test]
    fn a_tail_cut_inside_a_secret_loses_its_end() {
        let t = token();
        let whole = format!("x {} fatal: no\n", t.expose());
        let tail = &whole.as_bytes()[10..];
        let redactor = Redactor::for_token(&t);
        let out = String::from_utf8(redactor.redact(tail, true)).unwrap();
        assert_eq!(out, "[redacted] fatal: no\n");
        assert_eq!(redactor.redact(b"fatal\n", true), b"fatal\n");
    }

    #[test]
    fn a_config_with_the_token_is_found() {
        let t = token();
        assert!(!config_holds_secret(
            b"[remote \"origin\"]\n\turl = https://github.com/acme/app.git\n",
            &t
        ));
        let leaked = format!(
            "[http]\n\textraHeader = Authorization: Basic {}\n",
            basic_credentials(&t)
        );
        assert!(config_holds_secret(leaked.as_bytes(), &t));
        let in_url = format!("url = https://x-access-token:{}@github.com/a/b", t.expose());
        assert!(config_holds_secret(in_url.as_bytes(), &t));
    }
}
