//! What the daemon keeps on the host is private: the state directory and the database to the
//! daemon's user, each workspace to its environment's user.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use hyper::StatusCode;
use serde_json::json;
use support::e2e::{create, unique_id, Backend, Host};

fn mode(path: &Path) -> u32 {
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    meta.permissions().mode() & 0o7777
}

async fn state_dir_database_and_workspaces_are_private(backend: Backend) {
    let Some(host) = Host::start_on(backend, "").await else {
        return;
    };
    let id = unique_id("private");
    let answer = create(
        &host.acme(),
        json!({"id": id, "setup": "echo hi > /workspace/notes"}),
    )
    .await;
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );

    let state = host.daemon.dir.path().join("state");
    assert_eq!(mode(&state), 0o700, "state_dir");
    // The daemon holds the database open, so its write-ahead log and shared memory exist.
    for file in ["narya.db", "narya.db-wal", "narya.db-shm"] {
        assert_eq!(mode(&state.join(file)), 0o600, "{file}");
    }
    let workspace = host.workspace(&id);
    assert_eq!(mode(&workspace), 0o700, "the workspace");
    let owner = std::fs::metadata(&workspace).unwrap();
    assert_eq!(
        (owner.uid(), owner.gid()),
        (1000, 1000),
        "the workspace belongs to the environment's user"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("notes")).unwrap(),
        "hi\n",
        "the environment's user still writes there"
    );
    // The fixture finds the machine by its labels, whatever the daemon named it.
    host.remove(&id).await;
}

on_every_engine!(state_dir_database_and_workspaces_are_private);
