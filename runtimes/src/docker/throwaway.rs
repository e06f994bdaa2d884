//! Throwaway containers a daemon that died mid-run left behind: found by their label, and
//! removed with force.

use std::collections::HashMap;

use bollard::query_parameters::{InspectContainerOptions, ListContainersOptions};

use super::engine::{classify, found};
use super::Docker;
use crate::labels::{self, LABEL_THROWAWAY};
use crate::{Result, ThrowawayInfo};

impl Docker {
    /// `Runtime::list_throwaways`.
    pub(super) async fn list_throwaway_containers(&self) -> Result<Vec<ThrowawayInfo>> {
        let client = self.engine.client().await?;
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_owned(),
                vec![LABEL_THROWAWAY.to_owned()],
            )])),
            ..Default::default()
        };
        let containers = client
            .list_containers(Some(options))
            .await
            .map_err(|e| classify("listing throwaways", e))?;
        Ok(labels::throwaways(
            containers.into_iter().map(|c| c.labels.unwrap_or_default()),
        ))
    }

    /// `Runtime::remove_throwaway`.
    pub(super) async fn remove_throwaway_container(&self, name: &str) -> Result<()> {
        let client = self.engine.client().await?;
        let answer = client
            .inspect_container(name, None::<InspectContainerOptions>)
            .await;
        let Some(container) = found(&format!("looking up throwaway {name}"), answer)? else {
            return Ok(());
        };
        let labels = container.config.and_then(|c| c.labels).unwrap_or_default();
        // Only a throwaway of that name is ours to remove.
        match container.id {
            Some(id) if labels::is_throwaway(&labels, name) => {
                self.remove_container(client, &id).await
            }
            _ => Ok(()),
        }
    }
}
