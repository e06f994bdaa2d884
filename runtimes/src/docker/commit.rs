//! Keeping a machine's writable layer as an image with the engine's own commit: the container's
//! changes (never its bind-mounted workspace or its tmpfs) become a layer on top of its image.

use bollard::models::ContainerConfig;
use bollard::query_parameters::{
    CommitContainerOptions, InspectContainerOptions, RemoveImageOptions,
};

use super::engine::{classify, found};
use super::Docker;
use crate::{Committed, ErrorKind, Result, RuntimeError};

/// The repository committed layers are tagged in; the tag is the layer's name.
const PREBUILD_REPOSITORY: &str = "narya.local/prebuild";

/// The engine's name for committed layer `name`.
pub(super) fn committed_tag(name: &str) -> String {
    format!("{PREBUILD_REPOSITORY}:{name}")
}

impl Docker {
    /// `Runtime::commit`. The machine is not paused: the caller runs nothing in it meanwhile.
    pub(super) async fn commit_machine(&self, id: &str, name: &str) -> Result<Committed> {
        let client = self.engine.client().await?;
        let answer = client
            .inspect_container(id, None::<InspectContainerOptions>)
            .await;
        let container = found(&format!("looking up machine {id}"), answer)?.ok_or_else(|| {
            RuntimeError::plain(ErrorKind::NotFound, format!("docker: no machine {id}"))
        })?;
        let base = container.image.unwrap_or_default();
        let options = CommitContainerOptions {
            container: Some(id.to_owned()),
            repo: Some(PREBUILD_REPOSITORY.to_owned()),
            tag: Some(name.to_owned()),
            comment: Some("narya prebuild".to_owned()),
            author: None,
            pause: false,
            changes: None,
        };
        let committed = client
            .commit_container(options, ContainerConfig::default())
            .await
            .map_err(|e| classify(&format!("committing machine {id}"), e))?;
        let size = |image: Option<i64>| image.and_then(|s| u64::try_from(s).ok()).unwrap_or(0);
        let new = client
            .inspect_image(&committed_tag(name))
            .await
            .map_err(|e| classify(&format!("inspecting committed layer {name}"), e))?;
        let old = client
            .inspect_image(&base)
            .await
            .map_err(|e| classify(&format!("inspecting machine {id}'s image"), e))?;
        let bytes = size(new.size).saturating_sub(size(old.size));
        tracing::info!(machine = %id, image = %committed.id, bytes, "machine's layer committed");
        Ok(Committed {
            name: name.to_owned(),
            bytes,
        })
    }

    /// `Runtime::remove_committed`: the tag, and the layer with it unless a machine stands on it.
    pub(super) async fn remove_committed_image(&self, name: &str) -> Result<()> {
        let client = self.engine.client().await?;
        let answer = client
            .remove_image(
                &committed_tag(name),
                Some(RemoveImageOptions {
                    force: false,
                    noprune: false,
                }),
                None,
            )
            .await;
        found(&format!("removing committed layer {name}"), answer).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_layers_are_tagged_apart_from_the_official_image() {
        assert_eq!(committed_tag("p-1"), "narya.local/prebuild:p-1");
        assert!(!committed_tag("p-1").starts_with("narya.local/official"));
    }
}
