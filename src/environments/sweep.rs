//! Throwaway clone containers a daemon that died mid-clone left behind, swept at start-up and
//! on every reconciler pass: those of this host's environments whose create is no longer in
//! flight are killed and removed. Throwaways of environments this store does not know are
//! left alone: other daemons may share the runtime.

use narya_runtimes::ThrowawayInfo;

use super::Environments;
use crate::model::EnvironmentId;

impl Environments {
    /// Removes the throwaways left behind; how many went. A runtime that does not answer is
    /// the reconciler's to report, so it is only logged here.
    pub async fn sweep_throwaways(&self) -> usize {
        let throwaways = match self.runtime.list_throwaways().await {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!(error = %e, "could not list throwaways");
                return 0;
            }
        };
        let mut swept = 0;
        for throwaway in throwaways {
            if self.sweep_one(&throwaway).await {
                swept += 1;
            }
        }
        swept
    }

    /// Removes `throwaway` if it is one of this host's and its create is not in flight.
    async fn sweep_one(&self, throwaway: &ThrowawayInfo) -> bool {
        let (Some(environment), Some(organisation)) =
            (&throwaway.environment, &throwaway.organisation)
        else {
            return false;
        };
        let Ok(id) = environment.parse::<EnvironmentId>() else {
            return false;
        };
        match self.store.get(organisation, &id).await {
            Ok(Some(_)) => {}
            // Not this store's (or unreadable now): not ours to judge.
            Ok(None) | Err(_) => return false,
        }
        // A create holds the identifier's lock while it clones; held, it may be in flight.
        let Some(_guard) = self.locks.try_lock(organisation, &id) else {
            return false;
        };
        match self.runtime.remove_throwaway(&throwaway.name).await {
            Ok(()) => {
                tracing::warn!(environment.id = %id, %organisation, throwaway = %throwaway.name, "removed a clone container a stopped daemon left behind");
                true
            }
            Err(e) => {
                tracing::warn!(environment.id = %id, throwaway = %throwaway.name, error = %e, "could not remove a clone container left behind; retrying on the next pass");
                false
            }
        }
    }
}
