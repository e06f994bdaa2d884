//! `RegistryClient` against a real distribution registry (`NARYA_TEST_REGISTRY`, default
//! 127.0.0.1:5000), and against small local HTTP doubles for what a real registry cannot be made
//! to do (serve wrong bytes, demand a bearer token).

use std::collections::HashMap;
use std::net::TcpListener as StdTcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use narya_oci::registry::{RegistryClient, RegistryError};
use narya_oci::{Digest, ImageReference, RegistryReference};
use serde_json::json;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

fn registry_address() -> String {
    std::env::var("NARYA_TEST_REGISTRY").unwrap_or_else(|_| "127.0.0.1:5000".to_owned())
}

/// The real registry's address, or `None` (with a message) when it is not answering. Under CI a
/// missing registry is a failure, never a skip.
async fn require_registry() -> Option<String> {
    let address = registry_address();
    let answered = reqwest::Client::new()
        .get(format!("http://{address}/v2/"))
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .map(|r| r.status().is_success() || r.status() == StatusCode::UNAUTHORIZED);
    match answered {
        Ok(true) => Some(address),
        other => {
            let why = format!(
                "no distribution registry answers at http://{address}/v2/ ({other:?}); set NARYA_TEST_REGISTRY or start one"
            );
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{why}");
            }
            eprintln!("skipping: {why}");
            None
        }
    }
}

fn reference(s: &str) -> RegistryReference {
    match s.parse::<ImageReference>() {
        Ok(ImageReference::Registry(r)) => r,
        other => panic!("{s:?} is not a registry reference: {other:?}"),
    }
}

fn unique_repository() -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "narya-test/reg-{}-{}-{}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A gzip member holding `data` in stored (uncompressed) deflate blocks.
fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let mut chunks: Vec<&[u8]> = data.chunks(0xffff).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.iter().enumerate() {
        let len = u16::try_from(chunk.len()).unwrap();
        out.push(u8::from(i == last));
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(chunk);
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&u32::try_from(data.len()).unwrap().to_le_bytes());
    out
}

/// A ustar archive with one regular file.
fn tar_with_file(name: &str, contents: &[u8]) -> Vec<u8> {
    let mut header = [0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    header[100..108].copy_from_slice(b"0000644\0");
    header[108..116].copy_from_slice(b"0000000\0");
    header[116..124].copy_from_slice(b"0000000\0");
    header[124..136].copy_from_slice(format!("{:011o}\0", contents.len()).as_bytes());
    header[136..148].copy_from_slice(b"00000000000\0");
    header[148..156].copy_from_slice(b"        ");
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = header.to_vec();
    out.extend_from_slice(contents);
    out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
    out
}

/// What `push_image` put in the registry.
struct Pushed {
    repository: String,
    config: Vec<u8>,
    layer: Vec<u8>,
    amd64_manifest: Vec<u8>,
    amd64_digest: Digest,
    arm64_digest: Digest,
    index_digest: Digest,
}

async fn push_blob(http: &reqwest::Client, address: &str, repository: &str, bytes: &[u8]) {
    let digest = Digest::of(bytes);
    let base =
        reqwest::Url::parse(&format!("http://{address}/v2/{repository}/blobs/uploads/")).unwrap();
    let started = http.post(base.clone()).send().await.unwrap();
    assert_eq!(started.status(), StatusCode::ACCEPTED, "starting an upload");
    let location = started
        .headers()
        .get(header::LOCATION)
        .expect("upload Location")
        .to_str()
        .unwrap();
    let mut upload = base.join(location).unwrap();
    upload
        .query_pairs_mut()
        .append_pair("digest", &digest.to_string());
    let put = http
        .put(upload)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::CREATED, "finishing an upload");
}

async fn push_manifest(
    http: &reqwest::Client,
    address: &str,
    repository: &str,
    tag: &str,
    media_type: &str,
    bytes: &[u8],
) -> Digest {
    let put = http
        .put(format!("http://{address}/v2/{repository}/manifests/{tag}"))
        .header(header::CONTENT_TYPE, media_type)
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap();
    let status = put.status();
    let digest = put
        .headers()
        .get("docker-content-digest")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(
        status,
        StatusCode::CREATED,
        "pushing manifest {tag}: {}",
        put.text().await.unwrap_or_default()
    );
    assert_eq!(digest, Some(Digest::of(bytes).to_string()));
    Digest::of(bytes)
}

fn to_vec(value: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap()
}

/// A tiny image under a fresh repository: tag `amd64` is a linux/amd64 OCI manifest, tag `multi`
/// an OCI index naming an arm64 manifest and the amd64 one.
async fn push_image(address: &str) -> Pushed {
    let http = reqwest::Client::new();
    let repository = unique_repository();
    let tar = tar_with_file("hello.txt", b"hello\n");
    let layer = gzip(&tar);
    let config_for = |architecture: &str| {
        to_vec(&json!({
            "architecture": architecture,
            "os": "linux",
            "config": {"Cmd": ["/bin/true"]},
            "rootfs": {"type": "layers", "diff_ids": [Digest::of(&tar).to_string()]},
        }))
    };
    let manifest_for = |config: &[u8]| {
        to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": Digest::of(config).to_string(), "size": config.len()},
            "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": Digest::of(&layer).to_string(), "size": layer.len()}],
        }))
    };
    let config = config_for("amd64");
    let arm64_config = config_for("arm64");
    for blob in [&config, &arm64_config, &layer] {
        push_blob(&http, address, &repository, blob).await;
    }
    let amd64_manifest = manifest_for(&config);
    let arm64_manifest = manifest_for(&arm64_config);
    let amd64_digest = push_manifest(
        &http,
        address,
        &repository,
        "amd64",
        OCI_MANIFEST,
        &amd64_manifest,
    )
    .await;
    let arm64_digest = push_manifest(
        &http,
        address,
        &repository,
        "arm64",
        OCI_MANIFEST,
        &arm64_manifest,
    )
    .await;
    // arm64 first, so picking the first entry would be caught.
    let index = to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": arm64_digest.to_string(), "size": arm64_manifest.len(),
             "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"}},
            {"mediaType": OCI_MANIFEST, "digest": amd64_digest.to_string(), "size": amd64_manifest.len(),
             "platform": {"architecture": "amd64", "os": "linux"}},
        ],
    }));
    let index_digest = push_manifest(&http, address, &repository, "multi", OCI_INDEX, &index).await;
    Pushed {
        repository,
        config,
        layer,
        amd64_manifest,
        amd64_digest,
        arm64_digest,
        index_digest,
    }
}

fn client_for(address: &str) -> RegistryClient {
    RegistryClient::new(vec![address.to_owned()]).unwrap()
}

#[tokio::test]
async fn resolving_the_tag_of_a_manifest_gives_its_digest() {
    let Some(address) = require_registry().await else {
        return;
    };
    let image = push_image(&address).await;
    let client = client_for(&address);
    let r = reference(&format!("{address}/{}:amd64", image.repository));
    assert_eq!(client.resolve(&r).await.unwrap(), image.amd64_digest);
}

#[tokio::test]
async fn resolving_the_tag_of_an_index_gives_the_linux_amd64_manifest_digest() {
    let Some(address) = require_registry().await else {
        return;
    };
    let image = push_image(&address).await;
    let client = client_for(&address);
    let r = reference(&format!("{address}/{}:multi", image.repository));
    let resolved = client.resolve(&r).await.unwrap();
    assert_eq!(resolved, image.amd64_digest);
    assert_ne!(resolved, image.arm64_digest);
    assert_ne!(resolved, image.index_digest);
}

#[tokio::test]
async fn resolving_by_digest_verifies_and_follows_an_index() {
    let Some(address) = require_registry().await else {
        return;
    };
    let image = push_image(&address).await;
    let client = client_for(&address);
    let by_manifest = reference(&format!(
        "{address}/{}@{}",
        image.repository, image.amd64_digest
    ));
    assert_eq!(
        client.resolve(&by_manifest).await.unwrap(),
        image.amd64_digest
    );
    let by_index = reference(&format!(
        "{address}/{}@{}",
        image.repository, image.index_digest
    ));
    assert_eq!(client.resolve(&by_index).await.unwrap(), image.amd64_digest);
    let arm64 = reference(&format!(
        "{address}/{}@{}",
        image.repository, image.arm64_digest
    ));
    assert_eq!(client.resolve(&arm64).await.unwrap(), image.arm64_digest);
}

#[tokio::test]
async fn manifest_and_blobs_are_fetched_verified() {
    let Some(address) = require_registry().await else {
        return;
    };
    let image = push_image(&address).await;
    let client = client_for(&address);
    let r = reference(&format!("{address}/{}:multi", image.repository));
    let digest = client.resolve(&r).await.unwrap();
    let (manifest, bytes) = client.manifest(&r, &digest).await.unwrap();
    assert_eq!(bytes, image.amd64_manifest);
    assert_eq!(manifest.config.digest, Digest::of(&image.config));
    assert_eq!(manifest.layers.len(), 1);
    assert_eq!(manifest.layers[0].digest, Digest::of(&image.layer));

    let config = client.blob(&r, &manifest.config.digest).await.unwrap();
    assert_eq!(config, image.config);
    let layer = client.blob(&r, &manifest.layers[0].digest).await.unwrap();
    assert_eq!(layer, image.layer);
    assert_eq!(&layer[..2], &[0x1f, 0x8b]);

    let index = client.manifest(&r, &image.index_digest).await;
    assert!(
        matches!(index, Err(RegistryError::Invalid { .. })),
        "an index is not an image manifest: {index:?}"
    );
}

#[tokio::test]
async fn missing_tags_blobs_and_repositories_are_not_found() {
    let Some(address) = require_registry().await else {
        return;
    };
    let image = push_image(&address).await;
    let client = client_for(&address);
    let missing_tag = reference(&format!("{address}/{}:no-such-tag", image.repository));
    let err = client.resolve(&missing_tag).await.unwrap_err();
    assert!(matches!(err, RegistryError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains(&image.repository), "{err}");

    let missing_repository = reference(&format!("{address}/{}:amd64", unique_repository()));
    let err = client.resolve(&missing_repository).await.unwrap_err();
    assert!(matches!(err, RegistryError::NotFound { .. }), "{err:?}");

    let r = reference(&format!("{address}/{}:amd64", image.repository));
    let err = client
        .blob(&r, &Digest::of(b"never pushed"))
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::NotFound { .. }), "{err:?}");
}

#[tokio::test]
async fn a_registry_on_a_closed_port_is_unreachable() {
    let port = {
        let listener = StdTcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let address = format!("127.0.0.1:{port}");
    let client = client_for(&address);
    let err = client
        .resolve(&reference(&format!("{address}/narya/official:1")))
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains(&address), "{err}");
}

#[tokio::test]
async fn a_plain_http_registry_not_listed_as_insecure_is_refused_with_a_hint() {
    let Some(address) = require_registry().await else {
        return;
    };
    let client = RegistryClient::new(vec![]).unwrap();
    let err = client
        .resolve(&reference(&format!("{address}/narya/official:1")))
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::Unreachable { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("insecure_registries"), "{message}");
    assert!(message.contains(&address), "{message}");
}

/// A local stand-in for a registry, for behaviour a real one cannot be made to show.
#[derive(Clone)]
struct DoubleState {
    address: String,
    token_requests: Arc<AtomicUsize>,
}

const DOUBLE_TOKEN: &str = "anonymous-pull-token";

fn double_manifest() -> Vec<u8> {
    let config = b"{}";
    to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": Digest::of(config).to_string(), "size": 2},
        "layers": [],
    }))
}

async fn registry_double(State(state): State<DoubleState>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let manifest = || {
        (
            [(header::CONTENT_TYPE, OCI_MANIFEST)],
            Body::from(double_manifest()),
        )
            .into_response()
    };
    match path.as_str() {
        // Serves the same manifest whatever digest is asked for.
        p if p.starts_with("/v2/double/wrong/manifests/") => manifest(),
        // Claims a digest the bytes do not have.
        "/v2/double/lying/manifests/latest" => {
            let mut response = manifest();
            response.headers_mut().insert(
                "docker-content-digest",
                Digest::of(b"something else").to_string().parse().unwrap(),
            );
            response
        }
        p if p.starts_with("/v2/double/wrong/blobs/") => Body::from("not the blob").into_response(),
        "/v2/double/basic/manifests/latest" => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, r#"Basic realm="double""#)],
        )
            .into_response(),
        "/v2/double/private/manifests/latest" => {
            let authorised = request
                .headers()
                .get(header::AUTHORIZATION)
                .is_some_and(|v| v.as_bytes() == format!("Bearer {DOUBLE_TOKEN}").as_bytes());
            if authorised {
                return manifest();
            }
            let challenge = format!(
                r#"Bearer realm="http://{}/token",service="double",scope="repository:double/private:pull""#,
                state.address
            );
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, challenge)],
            )
                .into_response()
        }
        "/token" => {
            state.token_requests.fetch_add(1, Ordering::SeqCst);
            let Ok(Query(query)) = Query::<HashMap<String, String>>::try_from_uri(request.uri())
            else {
                return StatusCode::BAD_REQUEST.into_response();
            };
            if query.get("service").map(String::as_str) != Some("double")
                || query.get("scope").map(String::as_str) != Some("repository:double/private:pull")
            {
                return StatusCode::BAD_REQUEST.into_response();
            }
            axum::Json(json!({"token": DOUBLE_TOKEN})).into_response()
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn start_double() -> DoubleState {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let state = DoubleState {
        address: listener.local_addr().unwrap().to_string(),
        token_requests: Arc::new(AtomicUsize::new(0)),
    };
    let app = axum::Router::new()
        .fallback(registry_double)
        .with_state(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    state
}

#[tokio::test]
async fn a_manifest_not_matching_the_requested_digest_is_refused() {
    let double = start_double().await;
    let client = client_for(&double.address);
    let requested = Digest::of(b"the manifest we pinned");
    let r = reference(&format!("{}/double/wrong@{requested}", double.address));
    for result in [
        client.resolve(&r).await.map(|_| ()),
        client.manifest(&r, &requested).await.map(|_| ()),
    ] {
        match result {
            Err(RegistryError::DigestMismatch {
                expected, actual, ..
            }) => {
                assert_eq!(expected, requested);
                assert_eq!(actual, Digest::of(&double_manifest()));
            }
            other => panic!("expected a digest mismatch, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_docker_content_digest_not_matching_the_bytes_is_refused() {
    let double = start_double().await;
    let client = client_for(&double.address);
    let r = reference(&format!("{}/double/lying:latest", double.address));
    match client.resolve(&r).await {
        Err(RegistryError::DigestMismatch {
            expected, actual, ..
        }) => {
            assert_eq!(expected, Digest::of(b"something else"));
            assert_eq!(actual, Digest::of(&double_manifest()));
        }
        other => panic!("expected a digest mismatch, got {other:?}"),
    }
}

#[tokio::test]
async fn a_blob_not_matching_its_digest_is_refused() {
    let double = start_double().await;
    let client = client_for(&double.address);
    let r = reference(&format!("{}/double/wrong:latest", double.address));
    let requested = Digest::of(b"the layer");
    match client.blob(&r, &requested).await {
        Err(RegistryError::DigestMismatch {
            expected, actual, ..
        }) => {
            assert_eq!(expected, requested);
            assert_eq!(actual, Digest::of(b"not the blob"));
        }
        other => panic!("expected a digest mismatch, got {other:?}"),
    }
}

#[tokio::test]
async fn an_anonymous_bearer_token_is_fetched_once_and_reused() {
    let double = start_double().await;
    let client = client_for(&double.address);
    let r = reference(&format!("{}/double/private:latest", double.address));
    let expected = Digest::of(&double_manifest());
    assert_eq!(client.resolve(&r).await.unwrap(), expected);
    assert_eq!(client.resolve(&r).await.unwrap(), expected);
    assert_eq!(double.token_requests.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_registry_wanting_credentials_is_denied() {
    let double = start_double().await;
    let client = client_for(&double.address);
    let r = reference(&format!("{}/double/basic:latest", double.address));
    let err = client.resolve(&r).await.unwrap_err();
    assert!(matches!(err, RegistryError::Denied { .. }), "{err:?}");
}
