//! Reading a registry's answers: the status mapped to our errors, a body within its bound, a
//! manifest or index told apart by its media type.

use reqwest::{Response, StatusCode};

use super::{Document, RegistryError, PREALLOCATE_MAX_BYTES};
use crate::manifest::{is_index, is_manifest};
use crate::RegistryReference;

pub(super) fn denied(r: &RegistryReference, status: StatusCode) -> RegistryError {
    RegistryError::Denied {
        registry: r.registry.clone(),
        repository: r.repository.clone(),
        status: status.as_u16(),
    }
}

pub(super) fn check_status(
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
pub(super) async fn read_body(
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
pub(super) fn parse_document(bytes: &[u8], content_type: Option<&str>) -> Result<Document, String> {
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

/// An error and its causes on one line: reqwest's own message rarely says what went wrong.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
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
    use crate::manifest::{
        MEDIA_TYPE_DOCKER_LIST, MEDIA_TYPE_DOCKER_MANIFEST, MEDIA_TYPE_OCI_INDEX,
    };

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
}
