//! The HTTP API: one router served on every listener, authentication on every route.

mod environments;
mod error;
mod events;
mod extract;
mod organisation;
pub mod routes;
mod stream;
pub mod types;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::OpenApi;

use crate::auth::Verifier;
use crate::config::Config;
use crate::environments::Environments;
use crate::metrics::Metrics;
use crate::organisation::Organisations;
pub use error::{ApiError, ErrorBody, ServerFault};
pub use stream::CREATE_DIFFERS;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub verifier: Arc<Verifier>,
    pub environments: Arc<Environments>,
    pub organisations: Arc<Organisations>,
    /// Cancelled when the shutdown timeout expires: open streams end with an error line.
    pub cut: tokio_util::sync::CancellationToken,
    pub metrics: Metrics,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Narya host", description = "Provisions development environments for coding sessions on one host."),
    paths(
        environments::create,
        environments::list,
        environments::get,
        environments::delete,
        environments::exec,
        environments::replace,
        events::events,
        organisation::connect_github,
        openapi_document,
    ),
    modifiers(&BearerSecurity),
    security(("bearer" = [])),
)]
struct ApiDoc;

struct BearerSecurity;

impl utoipa::Modify for BearerSecurity {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .build(),
            ),
        );
    }
}

/// The OpenAPI 3.1 document of this API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The OpenAPI 3.1 document of this API.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "The OpenAPI document"), (status = 401, description = "NRY-0011", body = ErrorBody)))]
async fn openapi_document(_principal: crate::auth::Principal) -> impl IntoResponse {
    Json(openapi())
}

/// Every route of the contract, behind authentication, with request logging outermost.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(
            routes::ENVIRONMENTS,
            post(environments::create).get(environments::list),
        )
        .route(
            routes::ENVIRONMENT,
            get(environments::get).delete(environments::delete),
        )
        .route(routes::ENVIRONMENT_EXEC, post(environments::exec))
        .route(routes::ENVIRONMENT_REPLACE, post(environments::replace))
        .route(routes::EVENTS, get(events::events))
        .route(
            routes::ORGANISATION_GITHUB,
            put(organisation::connect_github),
        )
        .route(routes::OPENAPI, get(openapi_document))
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

async fn no_route(request: Request) -> ApiError {
    ApiError::NoRoute {
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
    }
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::MethodNotAllowed {
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
    }
}

fn bearer_token(request: &Request) -> Option<&str> {
    let value = request.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Verifies the bearer token of every request, whatever its path, before any routing happens.
async fn authenticate(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let verdict = match bearer_token(&request) {
        None => Err(crate::auth::AuthError::Missing),
        Some(token) => state.verifier.verify(token).await,
    };
    match verdict {
        Ok(principal) => {
            tracing::Span::current().record("organisation", principal.organisation.as_str());
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(reason) => {
            tracing::info!(%reason, "request refused: not authenticated");
            state.metrics.jwt_refused(&reason);
            ApiError::Unauthenticated.into_response()
        }
    }
}

/// One span per request; one line per answer; 5xx logged once, here, with what failed.
async fn log_request(request: Request, next: Next) -> Response {
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path(),
        organisation = tracing::field::Empty,
    );
    let started = Instant::now();
    let response = {
        use tracing::Instrument;
        next.run(request).instrument(span.clone()).await
    };
    let _entered = span.enter();
    let status = response.status().as_u16();
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    match response.extensions().get::<ServerFault>() {
        Some(ServerFault(fault)) => tracing::error!(status, elapsed_ms, %fault, "answered"),
        None => tracing::info!(status, elapsed_ms, "answered"),
    }
    response
}
