//! What Podman's Docker-compatible service does differently, worked around in one place.
//!
//! Podman 4.3 writes its events (to its events file) but its `/events` stream delivers none of
//! them, so on Podman changes to machines are found by listing: every [`POLL`], the Narya
//! machines and their states; a listing that differs from the last one is a change.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bollard::query_parameters::ListContainersOptions;
use bollard::Docker as Client;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;

use crate::labels::LABEL_ENVIRONMENT;

/// How often Podman's machines are listed.
const POLL: Duration = Duration::from_secs(1);

/// Every Narya machine's engine id and state, or `None` when the engine did not answer.
async fn snapshot(client: &Client) -> Option<BTreeMap<String, String>> {
    let options = ListContainersOptions {
        all: true,
        filters: Some(HashMap::from([(
            "label".to_owned(),
            vec![LABEL_ENVIRONMENT.to_owned()],
        )])),
        ..Default::default()
    };
    let listed = client.list_containers(Some(options)).await.ok()?;
    Some(
        listed
            .into_iter()
            .map(|c| {
                let state = c.state.map(|s| s.to_string()).unwrap_or_default();
                (c.id.unwrap_or_default(), state)
            })
            .collect(),
    )
}

/// A stream that yields whenever the listing of Narya machines changes, and ends when the
/// engine stops answering.
pub(super) async fn polled_changes(client: Client) -> BoxStream<'static, ()> {
    let first = snapshot(&client).await;
    futures_util::stream::unfold((client, first), |(client, last)| async move {
        let mut last = last?;
        loop {
            tokio::time::sleep(POLL).await;
            let now = snapshot(&client).await?;
            if now != last {
                return Some(((), (client, Some(now))));
            }
            last = now;
        }
    })
    .boxed()
}
