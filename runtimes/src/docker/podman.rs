//! Podman's Docker-compatible service and its events, worked around in one place (its containers
//! are made through its own API: `libpod`).
//!
//! Podman 4.3 writes its events (to its events file) but its `/events` stream delivers none of
//! them, so on Podman changes to machines are found by listing: every [`POLL`], the Narya
//! machines and their states; each machine whose state differs from the last listing (or that
//! came or went) is a change of that machine.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bollard::query_parameters::ListContainersOptions;
use bollard::Docker as Client;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;

use crate::labels::{self, LABEL_ENVIRONMENT};
use crate::Change;

/// How often Podman's machines are listed.
const POLL: Duration = Duration::from_secs(1);

/// Every Narya machine's state by its name (what [`Change::Machine`] carries), or `None` when
/// the engine did not answer.
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
            .filter_map(|c| {
                let state = c.state.map(|s| s.to_string()).unwrap_or_default();
                let labels = c.labels.unwrap_or_default();
                let name = labels::machine_name(&labels)?.to_owned();
                Some((name, state))
            })
            .collect(),
    )
}

/// The machines whose state differs between `before` and `after`, or that are in one only.
fn differences(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<Change> {
    let mut names: Vec<&String> = before.keys().chain(after.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|name| before.get(*name) != after.get(*name))
        .map(|name| Change::Machine(name.clone()))
        .collect()
}

/// A stream of the machines whose state changed, found by listing, that ends when the engine
/// stops answering.
pub(super) async fn polled_changes(client: Client) -> BoxStream<'static, Change> {
    let first = snapshot(&client).await;
    futures_util::stream::unfold((client, first), |(client, last)| async move {
        let mut last = last?;
        loop {
            tokio::time::sleep(POLL).await;
            let now = snapshot(&client).await?;
            let changed = differences(&last, &now);
            if !changed.is_empty() {
                return Some((changed, (client, Some(now))));
            }
            last = now;
        }
    })
    .flat_map(futures_util::stream::iter)
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_that_changed_came_or_went_is_a_change_of_it() {
        let listing = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(n, s)| ((*n).to_owned(), (*s).to_owned()))
                .collect()
        };
        let before = listing(&[("a", "running"), ("b", "running"), ("c", "running")]);
        let after = listing(&[("a", "running"), ("b", "exited"), ("d", "created")]);
        assert_eq!(
            differences(&before, &after),
            ["b", "c", "d"]
                .map(|n| Change::Machine(n.to_owned()))
                .to_vec()
        );
        assert!(differences(&before, &before).is_empty());
    }
}
