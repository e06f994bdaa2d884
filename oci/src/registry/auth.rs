//! Anonymous bearer authentication: the `WWW-Authenticate` challenge a registry answers with,
//! and the token it grants, which is never printed.

use std::collections::HashMap;
use std::fmt;

/// An anonymous bearer token; never printed.
#[derive(Clone)]
pub(super) struct BearerToken(pub(super) String);

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// The parameters of a `WWW-Authenticate: Bearer …` challenge.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BearerChallenge {
    pub(super) realm: String,
    pub(super) service: Option<String>,
    pub(super) scope: Option<String>,
}

/// Parses `Bearer realm="…",service="…",scope="…"` (RFC 7235 auth-params, quoted or bare);
/// `None` for other schemes or a challenge without a realm.
pub(super) fn parse_bearer_challenge(header: &str) -> Option<BearerChallenge> {
    let header = header.trim_start();
    let (scheme, mut rest) = header.split_once(char::is_whitespace)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut params: HashMap<String, String> = HashMap::new();
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        if rest.is_empty() {
            break;
        }
        let (key, after) = rest.split_once('=')?;
        let key = key.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (value, remainder) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.push(chars.next()?.1),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    _ => value.push(c),
                }
            }
            (value, &quoted[end?..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_owned(), &after[end..])
        };
        params.insert(key, value);
        rest = remainder;
    }
    Some(BearerChallenge {
        realm: params.remove("realm").filter(|r| !r.is_empty())?,
        service: params.remove("service"),
        scope: params.remove("scope"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_hub_challenge_is_parsed() {
        let c = parse_bearer_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/debian:pull""#,
        )
        .unwrap();
        assert_eq!(
            c,
            BearerChallenge {
                realm: "https://auth.docker.io/token".to_owned(),
                service: Some("registry.docker.io".to_owned()),
                scope: Some("repository:library/debian:pull".to_owned()),
            }
        );
    }

    #[test]
    fn challenge_with_spaces_escapes_bare_values_and_commas_in_scope() {
        let c = parse_bearer_challenge(
            r#"bearer  realm = "https://ghcr.io/token" , Service=ghcr.io, scope="repository:a/b:pull,push", error="say \"hi\"""#,
        )
        .unwrap();
        assert_eq!(c.realm, "https://ghcr.io/token");
        assert_eq!(c.service.as_deref(), Some("ghcr.io"));
        assert_eq!(c.scope.as_deref(), Some("repository:a/b:pull,push"));
    }

    #[test]
    fn other_schemes_and_realmless_or_broken_challenges_are_not_bearer_challenges() {
        for header in [
            r#"Basic realm="registry""#,
            r#"Bearer service="x""#,
            r#"Bearer realm="unterminated"#,
            "Bearer",
            r#"Bearer realm"#,
        ] {
            assert_eq!(parse_bearer_challenge(header), None, "{header}");
        }
    }

    #[test]
    fn tokens_are_not_printed() {
        assert_eq!(
            format!("{:?}", BearerToken("secret".to_owned())),
            "[redacted]"
        );
    }
}
