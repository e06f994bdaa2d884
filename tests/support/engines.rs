//! One end-to-end test per engine from one `async fn name(backend: Backend)`.

/// Generates, for an `async fn name(backend: Backend)`, one test per back end.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::support::e2e::Backend;

            #[tokio::test(flavor = "multi_thread")]
            async fn containerd() {
                super::$name(Backend::Containerd).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn docker() {
                super::$name(Backend::Docker).await
            }
        }
    )*};
}

/// Generates, for an `async fn name(backend: Backend)`, one test per engine: containerd,
/// Docker, and Podman's Docker-compatible service.
#[macro_export]
macro_rules! on_every_engine {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::support::e2e::Backend;

            #[tokio::test(flavor = "multi_thread")]
            async fn containerd() {
                super::$name(Backend::Containerd).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn docker() {
                super::$name(Backend::Docker).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn podman() {
                super::$name(Backend::Podman).await
            }
        }
    )*};
}
