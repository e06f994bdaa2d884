//! The pool of machines started ahead of creates (`[pool] size`): made in the background with
//! what the next create would get, kept fresh (a new digest, a stopped machine, another
//! configuration: removed and made again), and found again by label after a restart.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use narya_runtimes::PinnedImage;
use sha2::{Digest as _, Sha256};

use crate::config::Config;

mod claimed;
mod recover;
mod refill;
mod workspace;

/// How the runtime's names of pool machines begin; a claimed machine keeps its name.
pub(super) const NAME_PREFIX: &str = "narya-pool-";

/// The machines started ahead of creates, and what they must have been made for to be served.
pub(super) struct Pool {
    size: usize,
    /// This daemon's mark (from its workspaces directory): pool machines another daemon keeps
    /// in the same runtime are never served, removed or counted here.
    owner: String,
    /// The `dev.narya.pool` label of a machine this daemon may serve: its owner, and what the
    /// environment's machine is made with besides the image (user, mount point, network,
    /// limits, resolvers).
    configuration: String,
    ready: Mutex<Ready>,
    wake: tokio::sync::Notify,
    /// Creates starting a machine of their own right now: the pool makes none meanwhile.
    starting: AtomicUsize,
    /// Machines out of the pool whose removal failed: tried again at each look at the pool,
    /// so that none keeps running (and holding its limits) until the next start.
    undiscarded: Mutex<Vec<String>>,
}

/// A create starting a machine of its own, counted while it lives.
pub(super) struct Starting<'a>(&'a Pool);

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        if self.0.starting.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.wake.notify_one();
        }
    }
}

#[derive(Default)]
struct Ready {
    /// The image the next create would be pinned to, once resolved: no machine of another is
    /// served.
    image: Option<PinnedImage>,
    /// Started machines nobody has claimed, oldest first.
    machines: VecDeque<String>,
}

/// A pool machine taken by one create.
pub(super) struct Pooled {
    pub name: String,
    pub image: PinnedImage,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The mark of the daemon whose workspaces are in `workspaces`: what every `dev.narya.pool`
/// label it writes begins with, before a `-` and the mark of its configuration.
pub fn owner_mark(workspaces: &Path) -> String {
    hex(&Sha256::digest(workspaces.to_string_lossy().as_bytes())[..6])
}

impl Pool {
    pub(super) fn new(config: &Config) -> Pool {
        let owner = owner_mark(&config.workspaces_dir());
        // The resolvers are fixed when a machine is made (Docker writes them into it), so a
        // change of them makes every pool machine stale too.
        let made_with = format!(
            "{}|{}|{:?}|{:?}|{:?}|{:?}",
            config.environment.user,
            config.environment.workspace,
            config.environment.network,
            config.limits.limits(),
            config.network.dns,
            config.limits.disk,
        );
        let configuration = format!("{owner}-{}", hex(&Sha256::digest(made_with)[..8]));
        Pool {
            size: config.pool.size,
            owner,
            configuration,
            ready: Mutex::new(Ready::default()),
            wake: tokio::sync::Notify::new(),
            starting: AtomicUsize::new(0),
            undiscarded: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ready> {
        self.ready.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a machine labelled `configuration` was made by this daemon, whatever for.
    fn owns(&self, configuration: &str) -> bool {
        configuration
            .split_once('-')
            .is_some_and(|(owner, _)| owner == self.owner)
    }

    /// A fresh name for a pool machine: valid on every back end, never used before.
    fn new_name(&self) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let seed = format!(
            "{}|{}|{now}|{}",
            self.owner,
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        format!("{NAME_PREFIX}{}", hex(&Sha256::digest(seed)[..12]))
    }

    /// The oldest unclaimed machine, taken out of the pool (nobody else can take it) and the
    /// pool woken to replace it. `None` when the pool is empty.
    pub(super) fn take(&self) -> Option<Pooled> {
        let taken = {
            let mut ready = self.lock();
            let image = ready.image.clone()?;
            ready
                .machines
                .pop_front()
                .map(|name| Pooled { name, image })
        };
        if self.size > 0 {
            self.wake.notify_one();
        }
        taken
    }

    /// Counts a create starting its own machine until the returned guard goes; the pool
    /// resumes when none is left.
    pub(super) fn starting(&self) -> Starting<'_> {
        self.starting.fetch_add(1, Ordering::AcqRel);
        Starting(self)
    }

    /// Returns `pooled`, taken but not served, to the front of the pool, unless the image
    /// moved on meanwhile; whether it went back.
    pub(super) fn put_back(&self, pooled: Pooled) -> bool {
        let mut ready = self.lock();
        if ready.image.as_ref().map(|i| &i.digest) != Some(&pooled.image.digest) {
            return false;
        }
        ready.machines.push_front(pooled.name);
        true
    }

    /// Takes `name` out of the pool if it is still there; whether it was.
    fn forget(&self, name: &str) -> bool {
        let mut ready = self.lock();
        let before = ready.machines.len();
        ready.machines.retain(|m| m != name);
        ready.machines.len() != before
    }

    /// The `dev.narya.pool` label this daemon's servable machines carry.
    #[cfg(test)]
    pub(super) fn configuration_mark(&self) -> &str {
        &self.configuration
    }

    /// How many machines are waiting to be claimed.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().machines.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(state_dir: &str, extra: &str) -> Config {
        Config::parse(&format!(
            "state_dir = {state_dir:?}\n[identity]\nissuer = \"https://id.test\"\naudience = \"narya\"\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn a_pool_knows_its_own_machines_and_their_configuration() {
        let pool = Pool::new(&config("/srv/a", ""));
        assert!(pool.owns(&pool.configuration));
        let other_daemon = Pool::new(&config("/srv/b", ""));
        assert!(!pool.owns(&other_daemon.configuration));
        let other_limits = Pool::new(&config("/srv/a", "[limits]\ncpus = 1.0\n"));
        assert!(pool.owns(&other_limits.configuration));
        assert_ne!(pool.configuration, other_limits.configuration);
        let other_user = Pool::new(&config("/srv/a", "[environment]\nuser = \"1001:1001\"\n"));
        assert_ne!(pool.configuration, other_user.configuration);
        assert_eq!(
            pool.configuration,
            Pool::new(&config("/srv/a", "")).configuration
        );
    }

    #[test]
    fn pool_machine_names_are_fresh_and_valid_container_names() {
        let pool = Pool::new(&config("/srv/a", ""));
        let names: std::collections::HashSet<String> = (0..1000).map(|_| pool.new_name()).collect();
        assert_eq!(names.len(), 1000);
        for name in names {
            assert!(name.starts_with(NAME_PREFIX) && name.len() <= 63, "{name}");
            assert!(name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        }
    }
}
