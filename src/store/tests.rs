//! The store against a real SQLite file: rows round-trip, are scoped by organisation, survive
//! reopening, and a row that does not parse is said to be corrupt.

use super::*;

fn demo() -> EnvironmentId {
    "demo".parse().unwrap()
}

fn record(id: &str, organisation: &str) -> EnvironmentRecord {
    EnvironmentRecord {
        id: id.parse().unwrap(),
        organisation: organisation.to_owned(),
        person: "alice".to_owned(),
        fingerprint: "a fingerprint".to_owned(),
        setup_script: Some("make".to_owned()),
        repository: None,
        image_digest: format!("sha256:{}", "a".repeat(64)).parse().unwrap(),
        setup_recorded: true,
        status: Status::Unusable,
        status_detail: None,
        setup: Some(SetupRecord {
            state: SetupState::Failed,
            step: SetupStep::Setup,
            exit_code: Some(2),
            output: "make: *** No targets.  Stop.\n".to_owned(),
            output_truncated: false,
            started_at: "2026-11-30T00:00:00Z".to_owned(),
            finished_at: "2026-11-30T00:00:01Z".to_owned(),
            prebuilt_at: None,
        }),
        created_at: "2026-11-30T00:00:00Z".to_owned(),
        updated_at: "2026-11-30T00:00:01Z".to_owned(),
        deleted_at: None,
        machine: format!("narya-{id}"),
    }
}

#[tokio::test]
async fn rows_round_trip_and_are_scoped_by_organisation() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("state/narya.db"))
        .await
        .unwrap();
    let mine = record("demo", "acme");
    store.insert(&mine).await.unwrap();
    store.insert(&record("other", "globex")).await.unwrap();

    assert_eq!(
        store.get("acme", &demo()).await.unwrap(),
        Some(mine.clone())
    );
    assert_eq!(store.get("globex", &demo()).await.unwrap(), None);
    let ids: Vec<_> = store
        .list("acme")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id.to_string())
        .collect();
    assert_eq!(ids, ["demo"]);
    assert_eq!(
        store.holder(&demo()).await.unwrap().as_deref(),
        Some("acme")
    );
    assert!(!store.delete("globex", &demo()).await.unwrap());
    assert!(store.get("acme", &demo()).await.unwrap().is_some());
    assert!(store.delete("acme", &demo()).await.unwrap());
    assert_eq!(store.holder(&demo()).await.unwrap(), None);
}

#[tokio::test]
async fn an_outcome_is_recorded_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("narya.db")).await.unwrap();
    let mut row = record("demo", "acme");
    row.setup_recorded = false;
    row.status = Status::Degraded;
    row.status_detail = Some("provisioning".to_owned());
    row.setup = None;
    store.insert(&row).await.unwrap();
    assert_eq!(store.get("acme", &demo()).await.unwrap(), Some(row.clone()));
    let finished = record("demo", "acme");
    store.record(&finished).await.unwrap();
    assert_eq!(
        store.get("acme", &demo()).await.unwrap(),
        Some(finished.clone())
    );
    // Another organisation's record of the same id changes nothing.
    let mut foreign = finished.clone();
    foreign.organisation = "globex".to_owned();
    foreign.status = Status::Ready;
    store.record(&foreign).await.unwrap();
    assert_eq!(store.get("acme", &demo()).await.unwrap(), Some(finished));
}

#[tokio::test]
async fn an_id_is_unique_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("narya.db")).await.unwrap();
    store.insert(&record("demo", "acme")).await.unwrap();
    assert!(matches!(
        store.insert(&record("demo", "globex")).await,
        Err(StoreError::Held(_))
    ));
}

#[tokio::test]
async fn summaries_carry_no_script_no_output_and_no_deleted_row() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("narya.db")).await.unwrap();
    let mut row = record("demo", "acme");
    row.setup_script = Some("x".repeat(65536));
    store.insert(&row).await.unwrap();
    let mut deleted = record("old", "acme");
    deleted.deleted_at = Some(1);
    store.insert(&deleted).await.unwrap();
    let summaries = store.summaries().await.unwrap();
    assert_eq!(summaries.len(), 1, "deleted rows are left out");
    let summary = &summaries[0];
    assert_eq!(
        (
            summary.id.as_str(),
            summary.organisation.as_str(),
            summary.machine.as_str()
        ),
        ("demo", "acme", row.machine.as_str())
    );
    assert_eq!(summary.status, row.status);
    assert_eq!(summary.has_setup, row.setup.is_some());
}

#[tokio::test]
async fn rows_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("narya.db");
    let store = Store::open(&path).await.unwrap();
    store.insert(&record("demo", "acme")).await.unwrap();
    store.close().await;
    let store = Store::open(&path).await.unwrap();
    assert!(store.get("acme", &demo()).await.unwrap().is_some());
}

#[tokio::test]
async fn an_interrupted_step_is_recorded_in_the_step_it_was_in() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("narya.db")).await.unwrap();
    let mut row = record("demo", "acme");
    row.setup_recorded = false;
    row.setup = None;
    store.insert(&row).await.unwrap();
    store
        .set_step("acme", &demo(), SetupStep::Clone, "t1")
        .await
        .unwrap();
    store
        .record_interrupted("acme", &demo(), "stopped", "narya: stopped", "t2")
        .await
        .unwrap();
    let read = store.get("acme", &demo()).await.unwrap().unwrap();
    assert_eq!(
        (read.status, read.setup_recorded),
        (Status::Unusable, false)
    );
    let setup = read.setup.unwrap();
    assert_eq!(
        (setup.state, setup.step),
        (SetupState::Interrupted, SetupStep::Clone)
    );
    assert_eq!(
        (setup.started_at.as_str(), setup.finished_at.as_str()),
        ("t1", "t2")
    );
}

#[tokio::test]
async fn deleted_rows_are_purged_once_their_retention_passed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("narya.db")).await.unwrap();
    let mut gone = record("demo", "acme");
    gone.deleted_at = Some(100);
    store.insert(&gone).await.unwrap();
    store.insert(&record("kept", "acme")).await.unwrap();
    assert_eq!(store.purge_deleted(100).await.unwrap(), 0);
    assert_eq!(store.get("acme", &demo()).await.unwrap(), Some(gone));
    assert_eq!(store.purge_deleted(101).await.unwrap(), 1);
    assert_eq!(store.list("acme").await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_row_that_does_not_parse_is_a_corrupt_store_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("narya.db")).await.unwrap();
    store.insert(&record("demo", "acme")).await.unwrap();
    sqlx::query("UPDATE environments SET image_digest = 'sha256:short'")
        .execute(&store.pool)
        .await
        .unwrap();
    match store.get("acme", &demo()).await {
        Err(StoreError::Corrupt { column, value, .. }) => {
            assert_eq!((column, value.as_str()), ("image_digest", "sha256:short"))
        }
        other => panic!("expected a corrupt row, got {other:?}"),
    }
}

#[tokio::test]
async fn a_list_read_page_by_page_is_the_whole_list_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("narya.db")).await.unwrap();
    for n in 0..70 {
        store
            .insert(&record(&format!("env-{n:03}"), "acme"))
            .await
            .unwrap();
    }
    store
        .insert(&record("env-foreign", "globex"))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list_page("acme", after.as_deref(), 32).await.unwrap();
        assert!(page.len() <= 32);
        let Some(last) = page.last() else { break };
        after = Some(last.id.to_string());
        seen.extend(page.into_iter().map(|r| r.id.to_string()));
    }
    let whole: Vec<String> = store
        .list("acme")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id.to_string())
        .collect();
    assert_eq!(seen.len(), 70);
    assert_eq!(seen, whole, "the pages, in order, are the list");
}

#[tokio::test]
async fn output_that_is_not_utf8_reads_lossily_and_never_fails_a_list() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("narya.db")).await.unwrap();
    store.insert(&record("demo", "acme")).await.unwrap();
    sqlx::query("UPDATE environments SET setup_output = CAST(? AS TEXT)")
        .bind(b"ok \xff\xfe done".to_vec())
        .execute(&store.pool)
        .await
        .unwrap();
    let listed = store.list("acme").await.unwrap();
    assert_eq!(listed.len(), 1);
    let output = &listed[0].setup.as_ref().unwrap().output;
    assert_eq!(output, "ok \u{fffd}\u{fffd} done");
}

/// The next status change `subscription` was told of, at once (the store publishes as it writes).
fn told(
    subscription: &mut crate::events::Subscription,
) -> Option<(String, Status, Option<String>)> {
    use futures_util::FutureExt;
    match subscription.next().now_or_never() {
        Some(Some(crate::events::Received::Event(e))) => {
            Some((e.id.to_string(), e.status, e.status_detail.clone()))
        }
        None => None,
        Some(other) => panic!("not an event: {other:?}"),
    }
}

#[tokio::test]
async fn every_status_written_is_published_to_its_organisation_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("narya.db")).await.unwrap();
    let mut acme = store.events().subscribe("acme");
    let mut globex = store.events().subscribe("globex");
    let mut row = record("demo", "acme");
    store.insert(&row).await.unwrap();
    assert_eq!(
        told(&mut acme),
        Some(("demo".into(), Status::Unusable, None))
    );

    // A record that leaves the status as it was says nothing.
    row.fingerprint = "another".to_owned();
    store.record(&row).await.unwrap();
    assert_eq!(told(&mut acme), None);
    row.status = Status::Ready;
    store.record(&row).await.unwrap();
    assert_eq!(told(&mut acme), Some(("demo".into(), Status::Ready, None)));

    let at = "2026-11-30T00:00:02Z";
    let detail = Some("restarting");
    store
        .set_status("acme", &demo(), Status::Degraded, detail, at)
        .await
        .unwrap();
    store
        .set_status("acme", &demo(), Status::Degraded, detail, at)
        .await
        .unwrap();
    let degraded = Some((
        "demo".into(),
        Status::Degraded,
        Some("restarting".to_owned()),
    ));
    assert_eq!(told(&mut acme), degraded);
    assert_eq!(told(&mut acme), None, "an unchanged status is not news");
    // Another organisation's write of the same id changes nothing and says nothing.
    store
        .set_status("globex", &demo(), Status::Ready, None, at)
        .await
        .unwrap();
    assert_eq!(told(&mut globex), None);
    assert_eq!(told(&mut acme), None);
}
