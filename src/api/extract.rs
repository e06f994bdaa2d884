//! Extractors whose rejections are our own errors: the principal, JSON bodies, path ids.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::ApiError;
use crate::auth::Principal;
use crate::model::{EnvironmentId, InvalidRequest};

impl<S: Send + Sync> FromRequestParts<S> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or(ApiError::Unauthenticated)
    }
}

/// A JSON body parsed strictly (unknown fields refused by the target type); failures are
/// `400 NRY-0020` with serde's account of what was wrong.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::BadBody(format!("cannot read the request body: {e}")))?;
        if bytes.is_empty() {
            return Err(ApiError::BadBody(
                "the request body is empty; send a JSON object".to_owned(),
            ));
        }
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::BadBody(format!("the request body is not acceptable JSON: {e}")))
    }
}

/// The `{id}` path segment, validated as an environment identifier (`400 NRY-0021`).
pub struct IdPath(pub EnvironmentId);

impl<S: Send + Sync> FromRequestParts<S> for IdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| {
                ApiError::Invalid(InvalidRequest::Id(
                    parts
                        .uri
                        .path()
                        .rsplit('/')
                        .next()
                        .unwrap_or_default()
                        .to_owned(),
                ))
            })?;
        Ok(IdPath(raw.parse()?))
    }
}
