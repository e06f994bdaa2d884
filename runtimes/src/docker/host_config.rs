//! What machines and throwaways share on the engine: the workspace bind mount, no
//! privileges, the seccomp filter, a private cgroup namespace, the network, the `[limits]`,
//! and no log of the init's own output.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{
    HostConfig, HostConfigCgroupnsModeEnum, HostConfigLogConfig, Mount, MountTypeEnum,
    ResourcesUlimits,
};
use bollard::Docker as Client;
use narya_oci::spec::CPU_PERIOD_US;
use nix::sys::resource::{getrlimit, Resource};

use super::Docker;
use crate::{ErrorKind, Limits, Network, Result, RuntimeError, OOM_SCORE_ADJ};

fn network_mode(network: Network) -> String {
    match network {
        Network::Host => "host",
        // An isolated machine joins the daemon's network (`join_network`), never none.
        Network::None | Network::Isolated => "none",
    }
    .to_owned()
}

/// What machines and throwaways share: the workspace bind mount read-write, no new privileges,
/// no capabilities, the seccomp filter, a private cgroup namespace, the network asked for, the
/// limits, and no init of Docker's (ours is tini, in the image).
fn host_config(
    workspace: &Path,
    mount_point: &str,
    network: Network,
    limits: &Limits,
    seccomp: &str,
) -> Result<HostConfig> {
    let source = workspace.to_str().ok_or_else(|| {
        RuntimeError::plain(
            ErrorKind::Other,
            format!("workspace path {} is not UTF-8", workspace.display()),
        )
    })?;
    Ok(HostConfig {
        // A bind *mount* (not a `Binds` entry): the engine refuses a missing source instead of
        // creating it as root.
        mounts: Some(vec![Mount {
            target: Some(mount_point.to_owned()),
            source: Some(source.to_owned()),
            typ: Some(MountTypeEnum::BIND),
            read_only: Some(false),
            ..Default::default()
        }]),
        security_opt: Some(vec![
            "no-new-privileges".to_owned(),
            format!("seccomp={seccomp}"),
        ]),
        cap_drop: Some(vec!["ALL".to_owned()]),
        network_mode: Some(network_mode(network)),
        init: Some(false),
        cgroupns_mode: Some(HostConfigCgroupnsModeEnum::PRIVATE),
        // Every output is read through exec attachments; what a machine writes to its init's
        // own output would otherwise grow the engine's log file without bound.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_owned()),
            config: None,
        }),
        ..bounded(limits)
    })
}

/// The lower of this process's hard `RLIMIT_NPROC` and the kernel's `pid_max`.
fn nproc_ceiling() -> Option<i64> {
    let hard = getrlimit(Resource::RLIMIT_NPROC)
        .ok()
        .map(|(_, hard)| hard)?;
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(hard);
    i64::try_from(hard.min(pid_max)).ok()
}

/// The `[limits]` as the engine takes them: the cgroup's memory (no swap on top), a CPU quota
/// (`NanoCpus` above the host's CPUs is refused), pids, the private `/tmp` with the same
/// options as on containerd, explicit rlimits (an engine's defaults may ask for more than the
/// host grants: Podman's fail with "error setting rlimit type 7") and the raised
/// `oom_score_adj`.
fn bounded(limits: &Limits) -> HostConfig {
    let memory = i64::try_from(limits.memory).unwrap_or(i64::MAX);
    let nofile = i64::try_from(limits.nofile).unwrap_or(i64::MAX);
    let mut ulimits = vec![ResourcesUlimits {
        name: Some("nofile".to_owned()),
        soft: Some(nofile),
        hard: Some(nofile),
    }];
    // RLIMIT_NPROC counts a uid's processes host-wide, so it cannot bound one environment (the
    // pids limit does); it is stated only so that the engine does not ask runc for more than it
    // may give: no more than ours, nor than the kernel's pid_max (what Podman raises its own
    // to, and the most processes there can be anyway).
    if let Some(nproc) = nproc_ceiling() {
        ulimits.push(ResourcesUlimits {
            name: Some("nproc".to_owned()),
            soft: Some(nproc),
            hard: Some(nproc),
        });
    }
    HostConfig {
        memory: Some(memory),
        memory_swap: Some(memory),
        cpu_period: Some(CPU_PERIOD_US as i64),
        cpu_quota: Some(limits.cpu_quota_us()),
        pids_limit: Some(i64::from(limits.pids)),
        tmpfs: Some(HashMap::from([(
            "/tmp".to_owned(),
            limits.tmp_options().join(","),
        )])),
        ulimits: Some(ulimits),
        oom_score_adj: Some(i64::from(OOM_SCORE_ADJ)),
        ..Default::default()
    }
}

impl Docker {
    /// [`host_config`] with the seccomp filter as this engine takes it, joined to the daemon's
    /// network when `network` is isolated.
    pub(super) async fn host_config(
        &self,
        client: &Client,
        workspace: &Path,
        mount_point: &str,
        network: Network,
        limits: &Limits,
    ) -> Result<HostConfig> {
        let seccomp = self.seccomp_option().await?;
        let mut host = host_config(workspace, mount_point, network, limits, &seccomp)?;
        host.runtime = self.oci_runtime.clone();
        self.join_network(client, &mut host, network).await?;
        Ok(host)
    }
}
