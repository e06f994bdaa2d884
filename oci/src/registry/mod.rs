//! Fetching the official image from a registry speaking the distribution API: resolving a
//! reference to the linux/amd64 manifest digest and fetching manifests and blobs, every byte
//! verified against the digest it was asked for.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{Response, StatusCode, Url};

use crate::manifest::{
    select_linux_amd64, ImageIndex, ImageManifest, MEDIA_TYPE_DOCKER_LIST,
    MEDIA_TYPE_DOCKER_MANIFEST, MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_OCI_MANIFEST,
};
use crate::{Digest, RegistryReference};

mod auth;
mod error;
mod response;

pub use error::RegistryError;

use auth::{parse_bearer_challenge, BearerChallenge, BearerToken};
use response::{check_status, denied, error_chain, parse_document, read_body};

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
