//! Throwaway containers a daemon that died mid-run left behind: found by their label, and
//! removed (task killed, container and snapshot deleted).

use containerd_client::services::v1::ListContainersRequest;

use super::client::classify;
use super::Containerd;
use crate::labels::{self, LABEL_THROWAWAY};
use crate::{ErrorKind, Result, ThrowawayInfo};

impl Containerd {
    /// `Runtime::list_throwaways`.
    pub(super) async fn list_throwaway_containers(&self) -> Result<Vec<ThrowawayInfo>> {
        let containers = self
            .conn
            .containers()
            .list(self.conn.request(ListContainersRequest {
                filters: vec![format!("labels.\"{LABEL_THROWAWAY}\"")],
            }))
            .await
            .map_err(|e| classify("listing throwaways", e))?
            .into_inner()
            .containers;
        Ok(labels::throwaways(containers.into_iter().map(|c| c.labels)))
    }

    /// `Runtime::remove_throwaway`.
    pub(super) async fn remove_throwaway_container(&self, name: &str) -> Result<()> {
        let container = match self.container(name).await {
            Ok(container) => container,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        // Only a throwaway of that name is ours to remove.
        if !labels::is_throwaway(&container.labels, name) {
            return Ok(());
        }
        self.stop_task(name).await?;
        self.delete_container(name).await;
        Ok(())
    }
}
