//! The API's paths, written once: the templates the router matches and the paths clients send.

/// `POST` creates an environment, `GET` lists the organisation's.
pub const ENVIRONMENTS: &str = "/v1/environments";
/// `GET` shows one environment, `DELETE` destroys it.
pub const ENVIRONMENT: &str = "/v1/environments/{id}";
/// `POST` runs a command in a ready environment.
pub const ENVIRONMENT_EXEC: &str = "/v1/environments/{id}/exec";
/// `POST` makes a gone environment again from its pinned digest.
pub const ENVIRONMENT_REPLACE: &str = "/v1/environments/{id}/replace";
/// `GET` streams the organisation's status changes.
pub const EVENTS: &str = "/v1/events";
/// `PUT` connects the organisation's GitHub App installation.
pub const ORGANISATION_GITHUB: &str = "/v1/organisation/github";
/// `GET` answers the OpenAPI document.
pub const OPENAPI: &str = "/v1/openapi.json";

/// The placeholder the templates above use for an environment's identifier.
const ID: &str = "{id}";

/// The path of environment `id`.
pub fn environment(id: &str) -> String {
    with_id(ENVIRONMENT, id)
}

/// The path that runs a command in environment `id`.
pub fn environment_exec(id: &str) -> String {
    with_id(ENVIRONMENT_EXEC, id)
}

/// The path that replaces environment `id`.
pub fn environment_replace(id: &str) -> String {
    with_id(ENVIRONMENT_REPLACE, id)
}

fn with_id(template: &str, id: &str) -> String {
    template.replacen(ID, &path_segment(id), 1)
}

/// Identifiers are sent as one path segment; anything outside the id alphabet is escaped so the
/// daemon sees (and refuses) it as the person typed it.
fn path_segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"._-".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id `path` carries where `template` has `{id}`, when `path` matches `template`.
    fn matched_id(template: &str, path: &str) -> Option<String> {
        let templates: Vec<&str> = template.split('/').collect();
        let segments: Vec<&str> = path.split('/').collect();
        if templates.len() != segments.len() {
            return None;
        }
        let mut id = None;
        for (want, got) in templates.iter().zip(&segments) {
            if *want == ID {
                id = Some(percent_decode(got)?);
            } else if want != got {
                return None;
            }
        }
        id
    }

    fn percent_decode(segment: &str) -> Option<String> {
        let bytes = segment.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut at = 0;
        while at < bytes.len() {
            if bytes[at] == b'%' {
                let hex = std::str::from_utf8(bytes.get(at + 1..at + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                at += 3;
            } else {
                out.push(bytes[at]);
                at += 1;
            }
        }
        String::from_utf8(out).ok()
    }

    #[test]
    fn each_built_path_matches_its_template_and_gives_back_the_id() {
        for id in [
            "demo",
            "a.b_c-1",
            "a b",
            "../x",
            "x?y#z",
            "100%",
            "ünïcode/slash",
        ] {
            for (template, path) in [
                (ENVIRONMENT, environment(id)),
                (ENVIRONMENT_EXEC, environment_exec(id)),
                (ENVIRONMENT_REPLACE, environment_replace(id)),
            ] {
                assert_eq!(matched_id(template, &path).as_deref(), Some(id), "{path}");
                // Nothing in the id can end the path or start a query or fragment.
                assert!(
                    path.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"/._-%".contains(&b)),
                    "{path}"
                );
            }
        }
    }

    #[test]
    fn a_valid_id_is_sent_as_typed() {
        assert_eq!(environment("demo-1.x_y"), "/v1/environments/demo-1.x_y");
        assert_eq!(environment_exec("demo"), "/v1/environments/demo/exec");
        assert_eq!(environment_replace("demo"), "/v1/environments/demo/replace");
    }

    #[test]
    fn the_fixed_paths_have_no_placeholder() {
        for path in [ENVIRONMENTS, EVENTS, ORGANISATION_GITHUB, OPENAPI] {
            assert!(!path.contains('{'), "{path}");
        }
    }
}
