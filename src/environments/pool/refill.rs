//! Keeping the pool full: the loop that resolves the image, looks at the pool's machines and
//! starts new ones, and the removal of those that leave it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use narya_runtimes::{ImageSource, MachineSpec, MachineState};

use crate::environments::{EnvironmentError, Environments};

/// How often the pool looks at its machines when no create wakes it: a machine that stopped
/// is replaced within this.
const LOOK_EVERY: Duration = Duration::from_secs(2);
/// How often the image reference is resolved again: a new digest behind a tag replaces the
/// pool's machines within this (and at every start).
const RESOLVE_EVERY: Duration = Duration::from_secs(5);
/// After a failure to find or make machines, how long before trying again.
const BACK_OFF: Duration = Duration::from_secs(5);

impl Environments {
    /// Keeps the pool full until the daemon stops: what a previous daemon left is found first
    /// (reused when it is fresh, removed when not), then a machine is made for each one
    /// claimed, and the pool is looked at every few seconds. A pool of size 0 only removes
    /// what an earlier configuration left.
    pub async fn keep_pool_forever(self: Arc<Self>) {
        while let Err(e) = self.recover_pool().await {
            tracing::warn!(error = %e, "cannot find the pool's machines yet; retrying");
            tokio::time::sleep(BACK_OFF).await;
        }
        if self.pool.size == 0 {
            return;
        }
        let mut resolved = Instant::now();
        loop {
            if resolved.elapsed() >= RESOLVE_EVERY {
                match self.resolve_pool_image().await {
                    Ok(()) => resolved = Instant::now(),
                    Err(e) => tracing::warn!(error = %e, "cannot resolve the image for the pool"),
                }
            }
            self.look_at_pool().await;
            let wait = match self.fill_pool().await {
                Ok(()) => LOOK_EVERY,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a machine for the pool; retrying");
                    BACK_OFF
                }
            };
            tokio::select! {
                _ = self.pool.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Resolves the image reference again; on a new digest, every pool machine of the old one
    /// is removed before any is served, and the pool refills with the new one.
    async fn resolve_pool_image(&self) -> Result<(), EnvironmentError> {
        let image = self.runtime.ensure_image(&self.unpinned_image()).await?;
        let stale: Vec<String> = {
            let mut ready = self.pool.lock();
            if ready.image.as_ref().map(|i| &i.digest) == Some(&image.digest) {
                return Ok(());
            }
            tracing::info!(digest = %image.digest, "the image resolves to a new digest: replacing the pool");
            ready.image = Some(image);
            ready.machines.drain(..).collect()
        };
        for name in stale {
            self.discard_pooled(&name).await;
        }
        Ok(())
    }

    /// Removes again what could not be removed before, and asks the runtime about every pool
    /// machine: one seen stopped or missing leaves the pool.
    pub(in crate::environments) async fn look_at_pool(&self) {
        let undiscarded = std::mem::take(
            &mut *self
                .pool
                .undiscarded
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for name in undiscarded {
            self.discard_pooled(&name).await;
        }
        let names: Vec<String> = self.pool.lock().machines.iter().cloned().collect();
        for name in names {
            match self.runtime.inspect(&name).await {
                Ok(MachineState::Stopped | MachineState::Missing) => {
                    if self.pool.forget(&name) {
                        tracing::info!(machine = %name, "a pool machine stopped: replacing it");
                        self.discard_pooled(&name).await;
                    }
                }
                Ok(MachineState::Running | MachineState::Unknown) => {}
                Err(e) => {
                    tracing::debug!(machine = %name, error = %e, "cannot look at a pool machine")
                }
            }
        }
    }

    /// Starts machines until the pool holds `size`, one at a time, and none while a create
    /// starts a machine of its own (a burst larger than the pool is served first; the pool is
    /// woken when the last of them has its machine). A machine made for a digest that changed
    /// meanwhile is removed.
    pub(in crate::environments) async fn fill_pool(&self) -> Result<(), EnvironmentError> {
        loop {
            if self.pool.starting.load(Ordering::Acquire) > 0 {
                return Ok(());
            }
            let image = {
                let ready = self.pool.lock();
                match &ready.image {
                    Some(image) if ready.machines.len() < self.pool.size => image.clone(),
                    _ => return Ok(()),
                }
            };
            let name = self.pool.new_name();
            let workspace = self.prepare_pool_workspace(&name)?;
            let spec = MachineSpec {
                id: name.clone(),
                environment: String::new(),
                organisation: String::new(),
                image: image.clone(),
                workspace,
                mount_point: self.config.environment.workspace.clone(),
                user: self.config.environment.user,
                network: self.config.environment.network,
                limits: self.config.limits.limits(),
                pool: Some(self.pool.configuration.clone()),
                labels: Default::default(),
                layer: None,
            };
            if let Err(e) = self.runtime.create_machine(&spec).await {
                self.discard_pooled(&name).await;
                return Err(e.into());
            }
            let pooled = {
                let mut ready = self.pool.lock();
                let current = ready.image.as_ref().map(|i| &i.digest) == Some(&image.digest);
                if current {
                    ready.machines.push_back(name.clone());
                }
                current
            };
            if pooled {
                tracing::debug!(machine = %name, "pool machine started");
            } else {
                self.discard_pooled(&name).await;
            }
        }
    }

    /// Removes pool machine `name` and its workspace; a machine that cannot be removed now is
    /// tried again at each look at the pool (and at the next start).
    pub(in crate::environments) async fn discard_pooled(&self, name: &str) {
        if let Err(e) = self.runtime.remove(name).await {
            tracing::warn!(machine = %name, error = %e, "cannot remove a pool machine; trying again");
            let mut undiscarded = self
                .pool
                .undiscarded
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !undiscarded.iter().any(|n| n == name) {
                undiscarded.push(name.to_owned());
            }
            return;
        }
        if let Err(e) = self.trash.discard(&self.pool_workspace(name)) {
            tracing::warn!(machine = %name, error = %e, "cannot remove a pool workspace");
        }
    }

    pub(super) fn unpinned_image(&self) -> ImageSource {
        ImageSource {
            reference: self.config.image.reference.clone(),
            pinned: None,
        }
    }
}
