//! Every status an environment passes through reaches its organisation's watchers, in order,
//! whichever operation wrote it: create, the reconciler's restart, delete.

use std::collections::HashSet;

use futures_util::FutureExt;

use super::{acme, id, Host};
use crate::events::{Received, Subscription};
use crate::model::Status;

/// What `watch` has been told so far, as (id, status, detail).
fn told(watch: &mut Subscription) -> Vec<(String, Status, Option<String>)> {
    let mut seen = Vec::new();
    while let Some(Some(received)) = watch.next().now_or_never() {
        match received {
            Received::Event(e) => seen.push((e.id.to_string(), e.status, e.status_detail.clone())),
            Received::Lagged(n) => panic!("lagged {n}"),
        }
    }
    seen
}

#[tokio::test]
async fn a_watcher_sees_every_status_of_its_organisations_environments_in_order() {
    let host = Host::new().await;
    let mut acme_watch = host.environments.events().subscribe("acme");
    let mut globex_watch = host.environments.events().subscribe("globex");
    host.create("demo", None).await;
    let status =
        |status, detail: Option<&str>| ("demo".to_owned(), status, detail.map(str::to_owned));
    assert_eq!(
        told(&mut acme_watch),
        [
            status(Status::Degraded, Some(super::super::PROVISIONING)),
            status(Status::Ready, None)
        ]
    );

    host.fake.stop_machine(&host.name("demo"));
    host.environments
        .reconcile_once(&mut HashSet::new())
        .await
        .unwrap();
    let restarted = told(&mut acme_watch);
    assert_eq!(restarted.len(), 2, "{restarted:?}");
    assert_eq!(restarted[0].1, Status::Degraded);
    assert_eq!(restarted[1], status(Status::Ready, None));

    // A pass that finds everything as recorded says nothing.
    host.environments
        .reconcile_once(&mut HashSet::new())
        .await
        .unwrap();
    assert_eq!(told(&mut acme_watch), []);

    host.environments.delete(acme(), id("demo")).await.unwrap();
    assert_eq!(
        told(&mut acme_watch),
        [status(
            Status::Gone,
            Some(crate::environments::delete::DELETED)
        )]
    );
    assert_eq!(
        told(&mut globex_watch),
        [],
        "another organisation hears nothing"
    );
}
