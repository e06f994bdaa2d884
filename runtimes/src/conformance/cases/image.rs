//! The image group: the fixture's image pinned by digest, again and by two callers at once,
//! and an unknown digest failing as an image error.

use narya_oci::Digest;

use super::{check, fail, CaseFn, Context, Outcome};
use crate::{ImageSource, RuntimeError};

pub(super) fn all() -> Vec<(&'static str, &'static str, CaseFn)> {
    vec![
        case!("image", image_pinned_by_digest_is_idempotent),
        case!("image", unknown_digest_fails_as_an_image_error),
    ]
}

async fn image_pinned_by_digest_is_idempotent(c: &Context<'_>) -> Result<(), Outcome> {
    let first = c.pinned().await?;
    let again = c
        .runtime
        .ensure_image(&ImageSource {
            reference: c.fixture.image.reference.clone(),
            pinned: Some(first.digest.clone()),
        })
        .await?;
    check(again.digest == first.digest, || {
        format!("pinned {} then {}", first.digest, again.digest)
    })?;
    // Two callers at once both succeed with the same digest.
    let (a, b) = tokio::join!(
        c.runtime.ensure_image(&c.fixture.image),
        c.runtime.ensure_image(&c.fixture.image)
    );
    check(
        a?.digest == first.digest && b?.digest == first.digest,
        || "concurrent pins disagreed".to_owned(),
    )
}

async fn unknown_digest_fails_as_an_image_error(c: &Context<'_>) -> Result<(), Outcome> {
    let unknown: Digest = format!("sha256:{}", "0".repeat(64)).parse()?;
    match c
        .runtime
        .ensure_image(&ImageSource {
            reference: c.fixture.image.reference.clone(),
            pinned: Some(unknown),
        })
        .await
    {
        Err(RuntimeError::Image { .. }) => Ok(()),
        other => Err(fail(format!("expected an Image error, got {other:?}"))),
    }
}
