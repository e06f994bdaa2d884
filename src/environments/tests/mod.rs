//! The create/delete/replace/reconcile state machine on the fake runtime: every path a real
//! back end would take seconds (and root) to reach, in milliseconds. The fake stands in for no
//! back end; the real ones are exercised end to end in `tests/`.

mod changes;
mod create;
mod events;
mod lifecycle;
mod pool;
mod pool_recovery;

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use narya_runtimes::testing::FakeRuntime;
use narya_runtimes::{MachineInfo, MachineState};

use tokio::task::JoinHandle;

use super::{CreateRequest, Created, EnvironmentError, Environments};
use crate::auth::Principal;
use crate::config::Config;
use crate::model::{Digest, EnvironmentId};
use crate::organisation::Organisations;
use crate::store::{EnvironmentRecord, Store};

/// A host with a fake runtime, a real store and real workspaces in a temporary directory.
struct Host {
    environments: Arc<Environments>,
    fake: Arc<FakeRuntime>,
    store: Store,
    config: Arc<Config>,
    _dir: tempfile::TempDir,
}

impl Host {
    async fn new() -> Host {
        Host::with_config("").await
    }

    /// A host whose configuration has `extra` TOML (sections after `[environment]`) added.
    async fn with_config(extra: &str) -> Host {
        let dir = tempfile::tempdir().unwrap();
        // Workspaces are chowned to the environment's user: ourselves, so no root is needed;
        // as root, an unprivileged user (uid 0 is refused), which root may chown to.
        let me = std::fs::metadata(dir.path()).unwrap();
        let (uid, gid) = match me.uid() {
            0 => (1000, 1000),
            _ => (me.uid(), me.gid()),
        };
        let config = Config::parse(&format!(
            "state_dir = {state:?}\n\n[identity]\nissuer = \"https://id.test\"\naudience = \"narya\"\n\n\
             [environment]\nuser = \"{uid}:{gid}\"\nworkspace = \"/workspace\"\ngone_retention = \"1h\"\n{extra}",
            state = dir.path().join("state").display().to_string(),
            uid = uid,
            gid = gid,
        ))
        .unwrap();
        let config = Arc::new(config);
        let store = Store::open(&config.database_path()).await.unwrap();
        let fake = Arc::new(FakeRuntime::new());
        let organisations = Arc::new(Organisations::new(store.clone(), None));
        let environments = Arc::new(Environments::new(
            store.clone(),
            fake.clone(),
            config.clone(),
            organisations,
        ));
        Host {
            environments,
            fake,
            store,
            config,
            _dir: dir,
        }
    }

    /// Creates `id` for acme; the create must be answered.
    async fn create(&self, id: &str, setup: Option<&str>) -> Created {
        self.try_create(acme(), id, setup).await.unwrap()
    }

    async fn try_create(
        &self,
        principal: Principal,
        id: &str,
        setup: Option<&str>,
    ) -> Result<Created, EnvironmentError> {
        self.environments
            .create(principal, request(id, setup))
            .await
    }

    /// A create of `id` for acme in a task of its own, to be held at a stall.
    fn create_in_background(
        &self,
        id: &str,
        setup: Option<&str>,
    ) -> JoinHandle<Result<Created, EnvironmentError>> {
        let environments = self.environments.clone();
        let request = request(id, setup);
        tokio::spawn(async move { environments.create(acme(), request).await })
    }

    async fn row(&self, organisation: &str, id: &str) -> Option<EnvironmentRecord> {
        self.store
            .get(organisation, &id.parse().unwrap())
            .await
            .unwrap()
    }

    fn workspace_exists(&self, id: &str) -> bool {
        self.config.workspaces_dir().join(id).exists()
    }

    /// The same host's environments as a daemon started again would have them: the same
    /// store, runtime and configuration, nothing in memory.
    fn restarted(&self) -> Arc<Environments> {
        let organisations = Arc::new(Organisations::new(self.store.clone(), None));
        Arc::new(Environments::new(
            self.store.clone(),
            self.fake.clone(),
            self.config.clone(),
            organisations,
        ))
    }

    /// The machine serving `id`, found by its label as an operator would.
    fn machine(&self, id: &str) -> Option<MachineInfo> {
        self.fake
            .machines()
            .into_iter()
            .find(|m| m.environment.as_deref() == Some(id))
    }

    /// The runtime's name for acme's machine of `id`.
    fn name(&self, id: &str) -> String {
        super::machine_name("acme", &id.parse().unwrap())
    }

    /// Leaves `id` as a daemon that died mid-create would: a row whose setup state was never
    /// recorded, pinned to `digest`, and (when `machine` says so) a machine in that state.
    async fn interrupted(&self, id: &str, digest: &Digest, machine: Option<MachineState>) {
        let mut row = row_for(id, "acme", digest);
        row.setup_recorded = false;
        row.setup_script = Some("make".to_owned());
        row.status = crate::model::Status::Degraded;
        row.status_detail = Some(super::PROVISIONING.to_owned());
        self.store.insert(&row).await.unwrap();
        let step = crate::model::SetupStep::Setup;
        self.store
            .set_step("acme", &row.id, step, "2026-12-01T00:00:01Z")
            .await
            .unwrap();
        if let Some(state) = machine {
            self.fake.add_machine(MachineInfo {
                id: self.name(id),
                environment: Some(id.to_owned()),
                organisation: Some("acme".to_owned()),
                digest: Some(digest.clone()),
                state,
                pool: None,
            });
        }
    }
}

fn row_for(id: &str, organisation: &str, digest: &Digest) -> EnvironmentRecord {
    EnvironmentRecord {
        id: id.parse().unwrap(),
        organisation: organisation.to_owned(),
        person: "someone".to_owned(),
        fingerprint: super::fingerprint(None, None),
        setup_script: None,
        repository: None,
        image_digest: digest.clone(),
        setup_recorded: true,
        status: crate::model::Status::Ready,
        status_detail: None,
        setup: None,
        created_at: "2026-12-01T00:00:00Z".to_owned(),
        updated_at: "2026-12-01T00:00:00Z".to_owned(),
        deleted_at: None,
        machine: super::machine_name(organisation, &id.parse().unwrap()),
    }
}

fn person(organisation: &str) -> Principal {
    Principal {
        person: "alice".to_owned(),
        organisation: organisation.to_owned(),
    }
}

fn acme() -> Principal {
    person("acme")
}

fn request(id: &str, setup: Option<&str>) -> CreateRequest {
    request_with(id, setup, None)
}

fn request_with(id: &str, setup: Option<&str>, repository: Option<&str>) -> CreateRequest {
    CreateRequest::validate(id, setup.map(str::to_owned), repository).unwrap()
}

fn id(text: &str) -> EnvironmentId {
    text.parse().unwrap()
}

fn digest(fill: char) -> Digest {
    format!("sha256:{}", fill.to_string().repeat(64))
        .parse()
        .unwrap()
}
