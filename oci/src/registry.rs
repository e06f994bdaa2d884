//! Fetching the official image from a registry speaking the distribution API: resolving a
//! reference to the linux/amd64 manifest digest and fetching manifests and blobs, every byte
//! verified against the digest it was asked for.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{Response, StatusCode, Url};

use crate::manifest::{
    is_index, is_manifest, select_linux_amd64, ImageIndex, ImageManifest, MEDIA_TYPE_DOCKER_LIST,
    MEDIA_TYPE_DOCKER_MANIFEST, MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_OCI_MANIFEST,
};
use crate::{Digest, RegistryReference};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Manifests and tokens are small documents: a registry that takes longer is not healthy.
const DOCUMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Blobs may be hundreds of MiB, so they get no overall deadline, only this bound on silence.
const READ_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const MANIFEST_MAX_BYTES: usize = 4 * 1024 * 1024;
const TOKEN_MAX_BYTES: usize = 1024 * 1024;
/// An index may name an index (nested multi-platform images); deeper than this is refused.
const MAX_INDEX_DEPTH: usize = 2;
/// Pre-allocation never trusts a `Content-Length` beyond this.
const PREALLOCATE_MAX_BYTES: u64 = 64 * 1024 * 1024;
const DOCKER_CONTENT_DIGEST: &str = "docker-content-digest";

/// Why a registry could not give us the image.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot set up the HTTP client for registries: {reason}")]
    Client { reason: String },
    #[error("registry {registry} is unreachable (fetching {repository}): {reason}; {hint}")]
    Unreachable {
        registry: String,
        repository: String,
        reason: String,
        hint: String,
    },
    #[error("registry {registry} stopped answering while sending {what} of {repository}: {reason}; check the registry and the network, then retry")]
    Interrupted {
        registry: String,
        repository: String,
        what: String,
        reason: String,
    },
    #[error("registry {registry} has no {what} in repository {repository}; check image.reference and that the image was pushed there")]
    NotFound {
        registry: String,
        repository: String,
        what: String,
    },
    #[error("registry {registry} refused anonymous access to {repository} (HTTP {status}); Narya pulls without credentials, so make the repository public")]
    Denied {
        registry: String,
        repository: String,
        status: u16,
    },
    #[error("registry {registry} sent us to the token service {realm} for {repository}, which failed: {reason}")]
    TokenService {
        registry: String,
        repository: String,
        realm: String,
        reason: String,
    },
    #[error("registry {registry} answered HTTP {status} for {what} of {repository}")]
    Status {
        registry: String,
        repository: String,
        what: String,
        status: u16,
    },
    #[error("registry {registry} served {what} of {repository} with digest {actual}, but {expected} was expected; the content was refused — the registry or something between us serves wrong content")]
    DigestMismatch {
        registry: String,
        repository: String,
        what: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("registry {registry} served an unusable {what} of {repository}: {reason}")]
    Invalid {
        registry: String,
        repository: String,
        what: String,
        reason: String,
    },
    #[error("image {registry}/{repository}:{reference} has no linux/amd64 manifest; push one for linux/amd64")]
    NoLinuxAmd64 {
        registry: String,
        repository: String,
        reference: String,
    },
}

/// An anonymous bearer token; never printed.
#[derive(Clone)]
struct BearerToken(String);

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// A client for the distribution API (pull only, anonymous).
#[derive(Debug)]
pub struct RegistryClient {
    http: reqwest::Client,
    /// `host[:port]` of registries reached over plain HTTP; all others need HTTPS.
    insecure_registries: Vec<String>,
    /// Bearer tokens by (registry, repository), as tokens are scoped to one repository.
    tokens: Mutex<HashMap<(String, String), BearerToken>>,
}

/// A manifest document as fetched: its exact bytes, their digest, and what it parsed as.
struct Fetched {
    bytes: Vec<u8>,
    digest: Digest,
    document: Document,
}

enum Document {
    Index(ImageIndex),
    Manifest(ImageManifest),
}

impl RegistryClient {
    /// A client that speaks HTTPS to every registry except those whose `host[:port]` is listed
    /// in `insecure_registries`, which it reaches over plain HTTP.
    pub fn new(insecure_registries: Vec<String>) -> Result<RegistryClient, RegistryError> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_IDLE_TIMEOUT)
            .user_agent(concat!("narya-host/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| RegistryError::Client {
                reason: error_chain(&e),
            })?;
        Ok(RegistryClient {
            http,
            insecure_registries,
            tokens: Mutex::new(HashMap::new()),
        })
    }

    /// The digest of the linux/amd64 image manifest `r` names. When `r` names an index (or a
    /// Docker manifest list), the linux/amd64 entry is chosen and fetched, and its digest is
    /// returned. When `r` carries a digest, the fetched bytes must hash to it.
    ///
    /// Read-only and safe to repeat. Errors: `Unreachable`, `NotFound`, `Denied`,
    /// `DigestMismatch`, `NoLinuxAmd64`, `Invalid` and the other transport kinds.
    pub async fn resolve(&self, r: &RegistryReference) -> Result<Digest, RegistryError> {
        let reference = r.manifest_reference();
        let mut fetched = self
            .fetch_manifest(r, &reference, r.digest.as_ref())
            .await?;
        // Each pass follows one index to the entry it names for linux/amd64.
        for _ in 0..MAX_INDEX_DEPTH {
            let index = match fetched.document {
                Document::Manifest(_) => return Ok(fetched.digest),
                Document::Index(index) => index,
            };
            let chosen = select_linux_amd64(&index).ok_or_else(|| RegistryError::NoLinuxAmd64 {
                registry: r.registry.clone(),
                repository: r.repository.clone(),
                reference: reference.clone(),
            })?;
            let digest = chosen.digest.clone();
            fetched = self
                .fetch_manifest(r, &digest.to_string(), Some(&digest))
                .await?;
        }
        match fetched.document {
            Document::Manifest(_) => Ok(fetched.digest),
            Document::Index(_) => Err(RegistryError::Invalid {
                registry: r.registry.clone(),
                repository: r.repository.clone(),
                what: format!("manifest {reference}"),
                reason: format!("indexes are nested deeper than {MAX_INDEX_DEPTH} levels"),
            }),
        }
    }

    /// The image manifest with `digest` in `r`'s repository, parsed, with its exact bytes,
    /// which hash to `digest`.
    ///
    /// Read-only and safe to repeat. Errors as for [`RegistryClient::resolve`]; an index at
    /// `digest` is `Invalid`.
    pub async fn manifest(
        &self,
        r: &RegistryReference,
        digest: &Digest,
    ) -> Result<(ImageManifest, Vec<u8>), RegistryError> {
        let fetched = self
            .fetch_manifest(r, &digest.to_string(), Some(digest))
            .await?;
        match fetched.document {
            Document::Manifest(m) => Ok((m, fetched.bytes)),
            Document::Index(_) => Err(RegistryError::Invalid {
                registry: r.registry.clone(),
                repository: r.repository.clone(),
                what: format!("manifest {digest}"),
                reason: "it is an index, not an image manifest; resolve the reference first"
                    .to_owned(),
            }),
        }
    }

    /// The blob with `digest` in `r`'s repository, following redirects (registries often send
    /// blobs from a CDN). The bytes hash to `digest`.
    ///
    /// Read-only and safe to repeat. Errors: `Unreachable`, `Interrupted` (including a stall
    /// longer than the idle timeout), `NotFound`, `Denied`, `DigestMismatch`.
    pub async fn blob(
        &self,
        r: &RegistryReference,
        digest: &Digest,
    ) -> Result<Vec<u8>, RegistryError> {
        let what = format!("blob {digest}");
        let url = self.url(r, &format!("blobs/{digest}"), &what)?;
        let response = self.get(r, &url, &what, None, None).await?;
        let bytes = read_body(r, &what, response, None).await?;
        let actual = Digest::of(&bytes);
        if actual != *digest {
            return Err(RegistryError::DigestMismatch {
                registry: r.registry.clone(),
                repository: r.repository.clone(),
                what,
                expected: digest.clone(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// Fetches the manifest or index at `reference` (tag or digest) and checks its digest
    /// against `expected` and against the registry's own `Docker-Content-Digest`.
    async fn fetch_manifest(
        &self,
        r: &RegistryReference,
        reference: &str,
        expected: Option<&Digest>,
    ) -> Result<Fetched, RegistryError> {
        let what = format!("manifest {reference}");
        let url = self.url(r, &format!("manifests/{reference}"), &what)?;
        let accept = [
            MEDIA_TYPE_OCI_INDEX,
            MEDIA_TYPE_OCI_MANIFEST,
            MEDIA_TYPE_DOCKER_LIST,
            MEDIA_TYPE_DOCKER_MANIFEST,
        ]
        .join(", ");
        let response = self
            .get(r, &url, &what, Some(&accept), Some(DOCUMENT_TIMEOUT))
            .await?;
        let advertised = response
            .headers()
            .get(DOCKER_CONTENT_DIGEST)
            .map(|v| v.to_str().unwrap_or("(not text)").trim().to_owned());
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_owned());
        let bytes = read_body(r, &what, response, Some(MANIFEST_MAX_BYTES)).await?;
        let digest = Digest::of(&bytes);
        let mismatch = |expected: Digest| RegistryError::DigestMismatch {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            what: what.clone(),
            expected,
            actual: digest.clone(),
        };
        if let Some(expected) = expected {
            if *expected != digest {
                return Err(mismatch(expected.clone()));
            }
        }
        if let Some(advertised) = advertised {
            let advertised: Digest = advertised.parse().map_err(|e| RegistryError::Invalid {
                registry: r.registry.clone(),
                repository: r.repository.clone(),
                what: what.clone(),
                reason: format!("its Docker-Content-Digest header is unusable: {e}"),
            })?;
            if advertised != digest {
                return Err(mismatch(advertised));
            }
        }
        let document = parse_document(&bytes, content_type.as_deref()).map_err(|reason| {
            RegistryError::Invalid {
                registry: r.registry.clone(),
                repository: r.repository.clone(),
                what: what.clone(),
                reason,
            }
        })?;
        Ok(Fetched {
            bytes,
            digest,
            document,
        })
    }

    fn url(&self, r: &RegistryReference, path: &str, what: &str) -> Result<Url, RegistryError> {
        let scheme = if self
            .insecure_registries
            .iter()
            .any(|h| h.eq_ignore_ascii_case(&r.registry))
        {
            "http"
        } else {
            "https"
        };
        let raw = format!("{scheme}://{}/v2/{}/{path}", r.registry, r.repository);
        Url::parse(&raw).map_err(|e| RegistryError::Invalid {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            what: what.to_owned(),
            reason: format!("{raw:?} is not a valid URL ({e}); check image.reference"),
        })
    }

    /// GET `url`, answering one bearer challenge with an anonymous token if the registry asks
    /// for one; anything but a success status becomes an error.
    async fn get(
        &self,
        r: &RegistryReference,
        url: &Url,
        what: &str,
        accept: Option<&str>,
        timeout: Option<Duration>,
    ) -> Result<Response, RegistryError> {
        let key = (r.registry.clone(), r.repository.clone());
        let cached = self
            .tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .cloned();
        let response = self
            .send(r, url, what, accept, timeout, cached.as_ref())
            .await?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return check_status(r, what, response);
        }
        let challenge = response
            .headers()
            .get_all(WWW_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(parse_bearer_challenge);
        let Some(challenge) = challenge else {
            return Err(denied(r, StatusCode::UNAUTHORIZED));
        };
        let token = self.fetch_token(r, &challenge).await?;
        self.tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, token.clone());
        let response = self
            .send(r, url, what, accept, timeout, Some(&token))
            .await?;
        check_status(r, what, response)
    }

    async fn send(
        &self,
        r: &RegistryReference,
        url: &Url,
        what: &str,
        accept: Option<&str>,
        timeout: Option<Duration>,
        token: Option<&BearerToken>,
    ) -> Result<Response, RegistryError> {
        let mut request = self.http.get(url.clone());
        if let Some(accept) = accept {
            request = request.header(ACCEPT, accept);
        }
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        if let Some(token) = token {
            let mut value =
                HeaderValue::from_str(&format!("Bearer {}", token.0)).map_err(|_| {
                    RegistryError::TokenService {
                        registry: r.registry.clone(),
                        repository: r.repository.clone(),
                        realm: "(cached)".to_owned(),
                        reason: "the token is not a valid header value".to_owned(),
                    }
                })?;
            value.set_sensitive(true);
            request = request.header(AUTHORIZATION, value);
        }
        request
            .send()
            .await
            .map_err(|e| self.transport_error(r, what, &e))
    }

    /// Asks the token service named in a bearer challenge for an anonymous pull token.
    async fn fetch_token(
        &self,
        r: &RegistryReference,
        challenge: &BearerChallenge,
    ) -> Result<BearerToken, RegistryError> {
        let failed = |reason: String| RegistryError::TokenService {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            realm: challenge.realm.clone(),
            reason,
        };
        let mut realm = Url::parse(&challenge.realm)
            .map_err(|e| failed(format!("the realm is not a URL ({e})")))?;
        if !matches!(realm.scheme(), "https" | "http") {
            return Err(failed("the realm is not an http(s) URL".to_owned()));
        }
        {
            let mut query = realm.query_pairs_mut();
            if let Some(service) = &challenge.service {
                query.append_pair("service", service);
            }
            let scope = challenge
                .scope
                .clone()
                .unwrap_or_else(|| format!("repository:{}:pull", r.repository));
            query.append_pair("scope", &scope);
        }
        let mut response = self
            .http
            .get(realm)
            .timeout(DOCUMENT_TIMEOUT)
            .send()
            .await
            .map_err(|e| failed(error_chain(&e)))?;
        if !response.status().is_success() {
            return Err(failed(format!("it answered HTTP {}", response.status())));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| failed(error_chain(&e)))?
        {
            if body.len() + chunk.len() > TOKEN_MAX_BYTES {
                return Err(failed(format!(
                    "its answer is larger than {TOKEN_MAX_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        #[derive(serde::Deserialize)]
        struct TokenAnswer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: TokenAnswer = serde_json::from_slice(&body)
            .map_err(|e| failed(format!("its answer is not a token document ({e})")))?;
        answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .map(BearerToken)
            .ok_or_else(|| failed("its answer carries no token".to_owned()))
    }

    fn transport_error(
        &self,
        r: &RegistryReference,
        what: &str,
        e: &reqwest::Error,
    ) -> RegistryError {
        if e.is_connect() {
            let plain = self
                .insecure_registries
                .iter()
                .any(|h| h.eq_ignore_ascii_case(&r.registry));
            let hint = if plain {
                format!(
                    "check that it is running and reachable at http://{}",
                    r.registry
                )
            } else {
                format!(
                    "check that it is running and reachable over HTTPS; if it serves plain HTTP, add \"{}\" to image.insecure_registries",
                    r.registry
                )
            };
            return RegistryError::Unreachable {
                registry: r.registry.clone(),
                repository: r.repository.clone(),
                reason: error_chain(e),
                hint,
            };
        }
        RegistryError::Interrupted {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            what: what.to_owned(),
            reason: if e.is_timeout() {
                "timed out".to_owned()
            } else {
                error_chain(e)
            },
        }
    }
}

fn denied(r: &RegistryReference, status: StatusCode) -> RegistryError {
    RegistryError::Denied {
        registry: r.registry.clone(),
        repository: r.repository.clone(),
        status: status.as_u16(),
    }
}

fn check_status(
    r: &RegistryReference,
    what: &str,
    response: Response,
) -> Result<Response, RegistryError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    Err(match status {
        StatusCode::NOT_FOUND => RegistryError::NotFound {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            what: what.to_owned(),
        },
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => denied(r, status),
        _ => RegistryError::Status {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            what: what.to_owned(),
            status: status.as_u16(),
        },
    })
}

/// Reads the whole body, refusing more than `limit` bytes when one is given.
async fn read_body(
    r: &RegistryReference,
    what: &str,
    mut response: Response,
    limit: Option<usize>,
) -> Result<Vec<u8>, RegistryError> {
    let too_large = |limit: usize| RegistryError::Invalid {
        registry: r.registry.clone(),
        repository: r.repository.clone(),
        what: what.to_owned(),
        reason: format!("it is larger than {limit} bytes"),
    };
    let advertised = response.content_length().unwrap_or(0);
    if let Some(limit) = limit {
        if advertised > limit as u64 {
            return Err(too_large(limit));
        }
    }
    let capacity = usize::try_from(advertised.min(PREALLOCATE_MAX_BYTES)).unwrap_or(0);
    let mut body = Vec::with_capacity(capacity);
    loop {
        let chunk = response
            .chunk()
            .await
            .map_err(|e| RegistryError::Interrupted {
                registry: r.registry.clone(),
                repository: r.repository.clone(),
                what: what.to_owned(),
                reason: if e.is_timeout() {
                    "timed out".to_owned()
                } else {
                    error_chain(&e)
                },
            })?;
        let Some(chunk) = chunk else {
            return Ok(body);
        };
        if let Some(limit) = limit {
            if body.len() + chunk.len() > limit {
                return Err(too_large(limit));
            }
        }
        body.extend_from_slice(&chunk);
    }
}

/// Parses a manifest or index; its own `mediaType` field decides, the `Content-Type` header
/// stands in when the document has none.
fn parse_document(bytes: &[u8], content_type: Option<&str>) -> Result<Document, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        schema_version: Option<u32>,
        media_type: Option<String>,
    }
    let probe: Probe =
        serde_json::from_slice(bytes).map_err(|e| format!("it is not a JSON document ({e})"))?;
    if probe.schema_version != Some(2) {
        return Err(format!(
            "its schemaVersion is {:?}; only schema version 2 (OCI and Docker schema 2) is supported",
            probe.schema_version
        ));
    }
    let media_type = probe
        .media_type
        .or_else(|| content_type.map(str::to_owned))
        .unwrap_or_default();
    if is_index(&media_type) {
        serde_json::from_slice(bytes)
            .map(Document::Index)
            .map_err(|e| format!("it is not a valid image index ({e})"))
    } else if is_manifest(&media_type) {
        serde_json::from_slice(bytes)
            .map(Document::Manifest)
            .map_err(|e| format!("it is not a valid image manifest ({e})"))
    } else {
        Err(format!(
            "its media type {media_type:?} is neither an image index nor an image manifest"
        ))
    }
}

/// The parameters of a `WWW-Authenticate: Bearer …` challenge.
#[derive(Debug, PartialEq, Eq)]
struct BearerChallenge {
    realm: String,
    service: Option<String>,
    scope: Option<String>,
}

/// Parses `Bearer realm="…",service="…",scope="…"` (RFC 7235 auth-params, quoted or bare);
/// `None` for other schemes or a challenge without a realm.
fn parse_bearer_challenge(header: &str) -> Option<BearerChallenge> {
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

/// An error and its causes on one line: reqwest's own message rarely says what went wrong.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
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
    fn documents_are_told_apart_by_media_type() {
        let index =
            format!(r#"{{"schemaVersion":2,"mediaType":"{MEDIA_TYPE_OCI_INDEX}","manifests":[]}}"#);
        assert!(matches!(
            parse_document(index.as_bytes(), None),
            Ok(Document::Index(_))
        ));
        let bare_list = r#"{"schemaVersion":2,"manifests":[]}"#;
        assert!(matches!(
            parse_document(bare_list.as_bytes(), Some(MEDIA_TYPE_DOCKER_LIST)),
            Ok(Document::Index(_))
        ));
        assert!(parse_document(bare_list.as_bytes(), None).is_err());
        let schema1 = r#"{"schemaVersion":1,"name":"x"}"#;
        assert!(parse_document(schema1.as_bytes(), Some(MEDIA_TYPE_DOCKER_MANIFEST)).is_err());
        assert!(parse_document(b"not json", None).is_err());
    }

    #[test]
    fn tokens_are_not_printed() {
        assert_eq!(
            format!("{:?}", BearerToken("secret".to_owned())),
            "[redacted]"
        );
    }
}
