//! The repository step of a create: checked against the organisation's installation before
//! anything is made, then cloned into the empty workspace before the machine exists.

use std::path::Path;
use std::time::SystemTime;

use narya_runtimes::{Network, PinnedImage, ProcessOutcome, ProcessSpec, ThrowawaySpec};
use tokio::sync::broadcast;

use super::prebuild::Shape;
use super::setup::{forward_output, step_record};
use super::{EnvironmentError, Environments, Progress};
use crate::auth::Principal;
use crate::github::{self, GitHubApp, InstallationToken, Redactor, Secret};
use crate::model::{EnvironmentId, Repository, SetupState, SetupStep};
use crate::organisation::CloneSource;
use crate::store::{EnvironmentRecord, PrebuildRecord, SetupRecord};

/// What the repository step came to.
pub(super) enum Cloned {
    /// The clone ran (or could not): its record.
    Done(SetupRecord),
    /// The default branch points at a commit a prebuild of this create's key was made from:
    /// nothing was cloned, and the create is provisioned from it.
    Prebuilt(Box<PrebuildRecord>),
}

impl Environments {
    /// Step 4 of a create: the organisation's installation, and the repository among those it
    /// selected. Answers the installation to clone through.
    pub(super) async fn check_repository(
        &self,
        principal: &Principal,
        repository: &Repository,
    ) -> Result<CloneSource, EnvironmentError> {
        Ok(self
            .organisations
            .clone_source(principal, repository)
            .await?)
    }

    /// Clones the repository into the (empty) workspace before the machine exists: `git clone`
    /// in a throwaway container of the pinned image, as the environment's user, bounded by
    /// `environment.clone_timeout`, with a token minted for this one clone (that repository,
    /// `contents: read`) given only on that process's standard input and revoked right after.
    /// The throwaway is labelled with the environment, so one a dead daemon left is swept.
    /// A clone that fails is answered as a record, like a failed setup; only a runtime that
    /// fails is an error.
    ///
    /// `prebuilt`: the environment's row and its setup script, when prebuilds are on. Then the
    /// git server is first asked which commit the default branch points at, with the same
    /// token, and a prebuild of that key, if one is kept, is answered instead of cloning.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_clone(
        &self,
        organisation: &str,
        id: &EnvironmentId,
        image: &PinnedImage,
        workspace: &Path,
        source: &CloneSource,
        prebuilt: Option<(&EnvironmentRecord, &str)>,
        events: &broadcast::Sender<Progress>,
    ) -> Result<Cloned, EnvironmentError> {
        let github = self.organisations.github()?;
        let env = &self.config.environment;
        let started_at = SystemTime::now();
        let token = match github
            .mint_token(
                source.installation,
                Some(&[source.repository.name()][..]),
                serde_json::json!({"contents": "read"}),
            )
            .await
        {
            Ok(token) => token,
            // A token GitHub will not give fails the clone like a refused one would.
            Err(e) => {
                tracing::warn!(error = %e, "GitHub gave no token for the clone");
                let output = format!(
                    "narya: GitHub gave no token to clone {}: {e}\n",
                    source.repository
                );
                let _ = events.send(Progress::Output {
                    step: "clone",
                    output: output.clone(),
                });
                let refused = ProcessOutcome {
                    exit_code: None,
                    output: Vec::new(),
                    output_truncated: false,
                    timed_out: false,
                    duration: std::time::Duration::ZERO,
                };
                return Ok(Cloned::Done(step_record(
                    SetupStep::Clone,
                    &refused,
                    output.as_bytes(),
                    started_at,
                )));
            }
        };
        if let Some((row, script)) = prebuilt {
            if let Some(prebuild) = self
                .prebuild_at_head(row, script, image, source, &token.token)
                .await?
            {
                self.revoke_clone_token(github, &token).await;
                return Ok(Cloned::Prebuilt(Box::new(prebuild)));
            }
        }
        tracing::info!(repository = %source.repository, "cloning with a token minted for this clone");
        let redactor = Redactor::for_token(&token.token);
        let (chunks, forward) = forward_output("clone", events, Redactor::for_token(&token.token));
        let spec = ThrowawaySpec {
            name: github::throwaway_name(id.as_str()),
            image: image.clone(),
            workspace: workspace.to_owned(),
            mount_point: env.workspace.clone(),
            user: env.user,
            // The clone must reach GitHub whatever network the machine itself is given.
            network: Network::Host,
            environment: id.as_str().to_owned(),
            organisation: organisation.to_owned(),
            limits: self.config.limits.limits(),
            process: ProcessSpec {
                argv: github::clone_argv(
                    github.git_url(),
                    &github.clone_url(&source.repository),
                    &env.workspace,
                ),
                env: github::clone_env(),
                cwd: None,
                timeout: env.clone_timeout.0,
                output_limit: env.output_limit,
                // The one channel no runtime records.
                stdin: Some(github::clone_stdin(&token.token)),
                output: Some(chunks),
            },
        };
        let outcome = self.runtime.run_throwaway(&spec).await;
        drop(spec);
        let _ = forward.await;
        // Revoked whatever the clone did: the token was for this one command.
        self.revoke_clone_token(github, &token).await;
        let outcome = outcome?;
        let mut output = redactor.redact(&outcome.output, outcome.output_truncated);
        let mut record = step_record(SetupStep::Clone, &outcome, &output, started_at);
        if record.state == SetupState::Succeeded {
            let config = std::fs::read(workspace.join(".git/config")).unwrap_or_default();
            if github::config_holds_secret(&config, &token.token) {
                tracing::error!(
                    "the clone left its credential in .git/config; emptying the workspace"
                );
                self.prepare_workspace(id, true)?;
                output.extend_from_slice(
                    b"narya: the clone left its credential in .git/config; the workspace was emptied\n",
                );
                record = step_record(SetupStep::Clone, &outcome, &output, started_at);
                record.state = SetupState::Failed;
            }
        }
        tracing::info!(state = record.state.as_str(), exit_code = ?outcome.exit_code, "clone finished");
        Ok(Cloned::Done(record))
    }

    async fn revoke_clone_token(&self, github: &GitHubApp, token: &InstallationToken) {
        match github.revoke(&token.token).await {
            Ok(()) => tracing::info!("the clone's token is revoked"),
            Err(e) => {
                tracing::warn!(error = %e, expires_at = ?token.expires_at, "could not revoke the clone's token; it expires on its own")
            }
        }
    }

    /// The prebuild of this create's key at the commit `source`'s default branch points at
    /// now, if one is kept. A git server that cannot say is no reason to fail: the clone runs.
    async fn prebuild_at_head(
        &self,
        row: &EnvironmentRecord,
        script: &str,
        image: &PinnedImage,
        source: &CloneSource,
        token: &Secret,
    ) -> Result<Option<PrebuildRecord>, EnvironmentError> {
        let github = self.organisations.github()?;
        let head = match github.remote_head(token, &source.repository).await {
            Ok(Some(head)) => head,
            Ok(None) => return Ok(None),
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell the default branch's commit; cloning");
                return Ok(None);
            }
        };
        let key = self.prebuild_key(&Shape {
            organisation: &row.organisation,
            digest: &image.digest,
            script,
            source: Some((&source.repository, &head)),
        });
        let found = self.take_prebuild(row, &key).await?;
        tracing::info!(commit = %head, prebuilt = found.is_some(), "the default branch's commit");
        Ok(found)
    }
}
