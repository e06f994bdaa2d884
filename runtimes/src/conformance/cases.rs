//! The cases of the conformance suite.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::network::{
    another_machine_is_unreachable, host_addresses_are_unreachable, ipv6_is_off,
    outbound_reaches_the_outside, resolv_conf_names_the_resolvers,
};
use super::{CaseFn, Context, Outcome};
use crate::{MachineSpec, PinnedImage, ProcessOutcome, ProcessSpec, RuntimeError};

macro_rules! case {
    ($group:literal, $name:ident) => {
        (
            $group,
            stringify!($name),
            (|c| Box::pin($name(c))) as CaseFn,
        )
    };
}

mod image;
mod isolation;
mod machine;
mod output;
mod process;
mod sandbox;
mod throwaway;

pub(super) fn all() -> Vec<(&'static str, &'static str, CaseFn)> {
    let mut cases = image::all();
    cases.extend(machine::all());
    cases.extend(process::all());
    cases.extend(throwaway::all());
    cases.extend([
        case!("errors", unreachable_runtime_is_unavailable),
        case!("network", host_addresses_are_unreachable),
        case!("network", another_machine_is_unreachable),
        case!("network", outbound_reaches_the_outside),
        case!("network", ipv6_is_off),
        case!("network", resolv_conf_names_the_resolvers),
    ]);
    cases.extend(output::all());
    cases.extend(isolation::all());
    cases.extend(sandbox::all());
    cases
}

pub(super) fn fail(message: impl Into<String>) -> Outcome {
    Outcome::Fail(message.into())
}

pub(super) fn check(condition: bool, message: impl FnOnce() -> String) -> Result<(), Outcome> {
    if condition {
        Ok(())
    } else {
        Err(fail(message()))
    }
}

impl Context<'_> {
    /// Whether machines run under gVisor, whose kernel keeps some of its `/proc` differently.
    pub(super) fn gvisor(&self) -> bool {
        matches!(self.fixture.sandbox, crate::Sandbox::Gvisor { .. })
    }

    /// `prctl(PR_GET_NO_NEW_PRIVS)` of a process run in machine `id`, for a kernel whose
    /// `/proc/<pid>/status` has no `NoNewPrivs` line (gVisor's).
    pub(super) async fn no_new_privs(&self, id: &str) -> Result<String, Outcome> {
        let out = self
            .sh(id, r#"perl -e 'print syscall(157, 39, 0, 0, 0, 0), "\n"'"#)
            .await?;
        Ok(text(&out).trim().to_owned())
    }

    /// The id of machine `n` of this case.
    pub(super) fn machine_id(&self, n: u32) -> String {
        let short: String = self
            .case
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(24)
            .collect();
        format!("{}-{short}-{n}", self.fixture.prefix)
    }

    pub(super) fn workspace(&self, id: &str) -> Result<PathBuf, Outcome> {
        let dir = self.fixture.scratch.join(id);
        std::fs::create_dir_all(&dir)?;
        nix::unistd::chown(
            &dir,
            Some(nix::unistd::Uid::from_raw(self.fixture.user.uid)),
            Some(nix::unistd::Gid::from_raw(self.fixture.user.gid)),
        )?;
        Ok(dir)
    }

    pub(super) async fn pinned(&self) -> Result<PinnedImage, Outcome> {
        Ok(self.runtime.ensure_image(&self.fixture.image).await?)
    }

    /// Makes and starts machine `n` with a fresh workspace.
    pub(super) async fn machine(&self, n: u32) -> Result<(String, PathBuf), Outcome> {
        let workspace = self.workspace(&self.machine_id(n))?;
        self.machine_on(n, workspace).await
    }

    /// Makes and starts machine `n` on `workspace`, a directory the case made.
    pub(super) async fn machine_on(
        &self,
        n: u32,
        workspace: PathBuf,
    ) -> Result<(String, PathBuf), Outcome> {
        let id = self.machine_id(n);
        let spec = MachineSpec {
            id: id.clone(),
            environment: environment_of(&id),
            organisation: self.fixture.prefix.clone(),
            image: self.pinned().await?,
            workspace: workspace.clone(),
            mount_point: self.fixture.mount_point.clone(),
            user: self.fixture.user,
            network: self.fixture.network,
            limits: self.fixture.limits,
            pool: None,
            labels: BTreeMap::new(),
            layer: None,
        };
        self.runtime.create_machine(&spec).await?;
        Ok((id, workspace))
    }

    pub(super) async fn sh(&self, id: &str, script: &str) -> Result<ProcessOutcome, Outcome> {
        self.run(
            id,
            script,
            BTreeMap::new(),
            None,
            Duration::from_secs(60),
            1 << 20,
        )
        .await
    }

    async fn run(
        &self,
        id: &str,
        script: &str,
        env: BTreeMap<String, String>,
        cwd: Option<&str>,
        timeout: Duration,
        output_limit: usize,
    ) -> Result<ProcessOutcome, Outcome> {
        Ok(self
            .runtime
            .run(
                id,
                &ProcessSpec {
                    argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
                    env,
                    cwd: cwd.map(str::to_owned),
                    timeout,
                    output_limit,
                    stdin: None,
                    output: None,
                },
            )
            .await?)
    }
}

pub(super) fn text(outcome: &ProcessOutcome) -> String {
    String::from_utf8_lossy(&outcome.output).into_owned()
}

/// Removes whatever machines a case made, whether it passed or not.
pub(super) async fn clean_up(context: &Context<'_>) {
    for n in 0..4 {
        let _ = context.runtime.remove(&context.machine_id(n)).await;
        let _ = std::fs::remove_dir_all(context.fixture.scratch.join(context.machine_id(n)));
    }
}

/// The environment identifier machine `id` serves: a shape no container name allows, so that
/// every identifier the contract allows must travel in a label, never in the machine's name.
fn environment_of(id: &str) -> String {
    format!("{id}..A_b-")
}

async fn unreachable_runtime_is_unavailable(c: &Context<'_>) -> Result<(), Outcome> {
    let Some(unreachable) = c.fixture.unreachable.as_deref() else {
        return Err(Outcome::Skip(
            "the fixture gives no unreachable runtime".into(),
        ));
    };
    match unreachable.inspect(&c.machine_id(0)).await {
        Err(RuntimeError::Unavailable { .. }) => {}
        other => {
            return Err(fail(format!(
                "inspect: expected Unavailable, got {other:?}"
            )))
        }
    }
    match unreachable.list().await {
        Err(RuntimeError::Unavailable { .. }) => {}
        other => return Err(fail(format!("list: expected Unavailable, got {other:?}"))),
    }
    match unreachable.remove(&c.machine_id(0)).await {
        Err(RuntimeError::Unavailable { .. }) => Ok(()),
        other => Err(fail(format!("remove: expected Unavailable, got {other:?}"))),
    }
}
