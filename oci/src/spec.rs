//! OCI runtime specs (typed, from `oci-spec`) for Narya's machines and processes: always an
//! unprivileged user, no new privileges, no capabilities, the seccomp filter of
//! [`crate::seccomp`], private namespaces (cgroup included), the `[limits]` in the cgroup, an
//! explicit `RLIMIT_NOFILE` and a raised `oom_score_adj`.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use oci_spec::runtime::{
    LinuxBuilder, LinuxCapabilities, LinuxCpuBuilder, LinuxDeviceCgroupBuilder, LinuxMemoryBuilder,
    LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType, LinuxPidsBuilder,
    LinuxResourcesBuilder, Mount, MountBuilder, PosixRlimitBuilder, PosixRlimitType,
    ProcessBuilder, RootBuilder, SpecBuilder, UserBuilder,
};
/// A runtime spec and its process document, as `oci-spec` types them.
pub use oci_spec::runtime::{Process, Spec};

pub use oci_spec::OciSpecError as SpecError;

/// The `type_url` containerd expects for a runtime spec carried in an `Any`.
pub const SPEC_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";
/// The `type_url` containerd expects for an exec's process carried in an `Any`.
pub const PROCESS_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Process";

/// The `oom_score_adj` of every process of every environment, on every back end: positive, so
/// that under host memory pressure the kernel picks them before the daemon and the runtime.
pub const OOM_SCORE_ADJ: i32 = 500;

/// The CFS period the CPU quota is a share of, in microseconds (the kernel's default).
pub const CPU_PERIOD_US: u64 = 100_000;

/// The annotation a spec whose private network namespace is new and empty carries, with
/// [`NO_NETWORK`]: the runtime wrapper (`contrib/runsc/narya-runsc`) gives such a sandbox gVisor's
/// loopback-only network, since gVisor's netstack would otherwise take no interface from the
/// namespace (its loopback is down).
pub const NETWORK_ANNOTATION: &str = "org.narya.network";
/// [`NETWORK_ANNOTATION`]'s value for a network with nothing but loopback.
pub const NO_NETWORK: &str = "none";

const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// What bounds one environment (`[limits]`): its machine, every process in it, its throwaway.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Bytes of memory; past it the kernel kills a process inside.
    pub memory: u64,
    /// CPUs' worth of time (a CFS quota).
    pub cpus: f64,
    /// Processes and threads.
    pub pids: u32,
    /// Bytes of the private `/tmp` (a tmpfs; counted in `memory` too).
    pub tmp: u64,
    /// `RLIMIT_NOFILE`, soft and hard.
    pub nofile: u64,
}

impl Default for Limits {
    /// The contract's defaults.
    fn default() -> Self {
        Limits {
            memory: 4 << 30,
            cpus: 2.0,
            pids: 4096,
            tmp: 1 << 30,
            nofile: 65536,
        }
    }
}

impl Limits {
    /// The CFS quota per [`CPU_PERIOD_US`] that gives `cpus` CPUs.
    pub fn cpu_quota_us(&self) -> i64 {
        (self.cpus * CPU_PERIOD_US as f64).round() as i64
    }

    /// The options of the private `/tmp` tmpfs, the same on every back end.
    pub fn tmp_options(&self) -> Vec<String> {
        ["rw", "exec", "nosuid", "nodev", "mode=1777"]
            .map(str::to_owned)
            .into_iter()
            .chain([format!("size={}", self.tmp)])
            .collect()
    }
}

/// One process: who runs it, what, where, with which environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSpec {
    pub args: Vec<String>,
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    /// `RLIMIT_NOFILE`, soft and hard.
    pub nofile: u64,
}

/// A container: its process, its root, its workspace, its network, its limits.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerSpec<'a> {
    pub hostname: &'a str,
    pub process: ProcessSpec,
    /// Host directory bind-mounted read-write at `workspace_mount`.
    pub workspace: &'a Path,
    pub workspace_mount: &'a str,
    /// Share the host's network namespace (and its resolv.conf and hosts) or get a private one.
    pub host_network: bool,
    /// The private network namespace to join (made and wired by the caller) instead of a new,
    /// empty one.
    pub netns: Option<&'a Path>,
    /// Bind-mounted read-only as `/etc/resolv.conf` in a private network.
    pub resolv_conf: Option<&'a Path>,
    /// The cgroup path, e.g. `/narya/demo`.
    pub cgroups_path: &'a str,
    pub limits: Limits,
}

/// The process document of a spec (also what an exec takes): no capability in any set, no new
/// privileges, the raised `oom_score_adj` and the explicit `RLIMIT_NOFILE`.
pub fn process(p: &ProcessSpec) -> Result<Process, SpecError> {
    let none = || HashSet::new();
    let mut capabilities = LinuxCapabilities::default();
    capabilities.set_bounding(Some(none()));
    capabilities.set_effective(Some(none()));
    capabilities.set_inheritable(Some(none()));
    capabilities.set_permitted(Some(none()));
    capabilities.set_ambient(Some(none()));
    ProcessBuilder::default()
        .terminal(false)
        .user(
            UserBuilder::default()
                .uid(p.uid)
                .gid(p.gid)
                .additional_gids(vec![p.gid])
                .build()?,
        )
        .args(p.args.clone())
        .env(p.env.clone())
        .cwd(p.cwd.clone())
        .capabilities(capabilities)
        .rlimits(vec![PosixRlimitBuilder::default()
            .typ(PosixRlimitType::RlimitNofile)
            .soft(p.nofile)
            .hard(p.nofile)
            .build()?])
        .no_new_privileges(true)
        .oom_score_adj(OOM_SCORE_ADJ)
        .build()
}

/// An exec's process in a machine made from `machine`: the machine's own process (user,
/// capabilities, rlimits, `oom_score_adj`, no new privileges) with `args`, `env` and `cwd`
/// of the exec.
pub fn exec_process(machine: &Process, args: Vec<String>, env: Vec<String>, cwd: &str) -> Process {
    let mut process = machine.clone();
    process.set_args(Some(args));
    process.set_env(Some(env));
    process.set_cwd(cwd.into());
    process.set_terminal(Some(false));
    process
}

fn mount(
    destination: &str,
    kind: &str,
    source: &str,
    options: &[&str],
) -> Result<Mount, SpecError> {
    MountBuilder::default()
        .destination(destination)
        .typ(kind)
        .source(source)
        .options(options.iter().map(|o| (*o).to_owned()).collect::<Vec<_>>())
        .build()
}

/// The filesystems every container gets, `/tmp` sized by `limits`.
fn mounts(limits: &Limits) -> Result<Vec<Mount>, SpecError> {
    let tmp = limits.tmp_options();
    let tmp: Vec<&str> = tmp.iter().map(String::as_str).collect();
    Ok(vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        )?,
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        )?,
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        )?,
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", "ro"],
        )?,
        mount(
            "/run",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount("/tmp", "tmpfs", "tmpfs", &tmp)?,
    ])
}

fn namespace(kind: LinuxNamespaceType) -> Result<LinuxNamespace, SpecError> {
    LinuxNamespaceBuilder::default().typ(kind).build()
}

/// The namespaces of a container (the cgroup one included) and the mounts its network choice
/// brings: the host's network comes with the host's resolv.conf and hosts; a private one is
/// new and empty, or the namespace the caller made and wired, with its resolv.conf.
fn network(
    spec: &ContainerSpec<'_>,
    namespaces: &mut Vec<LinuxNamespace>,
    mounts: &mut Vec<Mount>,
) -> Result<(), SpecError> {
    if spec.host_network {
        for file in ["/etc/resolv.conf", "/etc/hosts"] {
            mounts.push(mount(file, "bind", file, &["rbind", "ro"])?);
        }
        return Ok(());
    }
    match spec.netns {
        Some(path) => namespaces.push(
            LinuxNamespaceBuilder::default()
                .typ(LinuxNamespaceType::Network)
                .path(path)
                .build()?,
        ),
        None => namespaces.push(namespace(LinuxNamespaceType::Network)?),
    }
    if let Some(resolv_conf) = spec.resolv_conf {
        mounts.push(
            MountBuilder::default()
                .destination("/etc/resolv.conf")
                .typ("bind")
                .source(resolv_conf)
                .options(vec!["rbind".to_owned(), "ro".to_owned()])
                .build()?,
        );
    }
    Ok(())
}

/// The cgroup resources of `limits`: memory (swap included, so no swap on top), CPU quota,
/// pids, and no device.
fn resources(limits: &Limits) -> Result<oci_spec::runtime::LinuxResources, SpecError> {
    let memory = i64::try_from(limits.memory).unwrap_or(i64::MAX);
    LinuxResourcesBuilder::default()
        .devices(vec![LinuxDeviceCgroupBuilder::default()
            .allow(false)
            .access("rwm")
            .build()?])
        .memory(
            LinuxMemoryBuilder::default()
                .limit(memory)
                .swap(memory)
                .build()?,
        )
        .cpu(
            LinuxCpuBuilder::default()
                .quota(limits.cpu_quota_us())
                .period(CPU_PERIOD_US)
                .build()?,
        )
        .pids(
            LinuxPidsBuilder::default()
                .limit(i64::from(limits.pids))
                .build()?,
        )
        .build()
}

/// The full runtime spec of a container. `root.path` is `rootfs`, writable.
pub fn container(spec: &ContainerSpec<'_>) -> Result<Spec, SpecError> {
    let mut mounts = mounts(&spec.limits)?;
    mounts.push(
        MountBuilder::default()
            .destination(spec.workspace_mount)
            .typ("bind")
            .source(spec.workspace)
            .options(vec!["rbind".to_owned(), "rw".to_owned()])
            .build()?,
    );
    let mut namespaces = [
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Cgroup,
    ]
    .into_iter()
    .map(namespace)
    .collect::<Result<Vec<_>, _>>()?;
    network(spec, &mut namespaces, &mut mounts)?;
    let to_strings = |paths: &[&str]| paths.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>();
    let linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .cgroups_path(spec.cgroups_path)
        .resources(resources(&spec.limits)?)
        .seccomp(crate::seccomp::default_profile())
        .masked_paths(to_strings(MASKED_PATHS))
        .readonly_paths(to_strings(READONLY_PATHS))
        .build()?;
    SpecBuilder::default()
        .version("1.0.2")
        .process(process(&spec.process)?)
        .root(
            RootBuilder::default()
                .path("rootfs")
                .readonly(false)
                .build()?,
        )
        .hostname(spec.hostname)
        .mounts(mounts)
        .linux(linux)
        .annotations(annotations(spec))
        .build()
}

/// What a runtime wrapper reads of a container's network: [`NO_NETWORK`] for a new, empty
/// namespace.
fn annotations(spec: &ContainerSpec<'_>) -> HashMap<String, String> {
    let mut annotations = HashMap::new();
    if !spec.host_network && spec.netns.is_none() {
        annotations.insert(NETWORK_ANNOTATION.to_owned(), NO_NETWORK.to_owned());
    }
    annotations
}

#[cfg(test)]
mod tests;
