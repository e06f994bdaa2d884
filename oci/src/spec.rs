//! OCI runtime-spec documents for Narya's machines and processes: always an unprivileged user,
//! no new privileges, no capabilities, the default masked and read-only paths.

use std::path::Path;

use serde_json::{json, Value};

/// The `type_url` containerd expects for a runtime spec carried in an `Any`.
pub const SPEC_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";
/// The `type_url` containerd expects for an exec's process carried in an `Any`.
pub const PROCESS_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Process";

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

/// One process: who runs it, what, where, with which environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSpec {
    pub args: Vec<String>,
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
}

/// A container: its process, its root, its workspace, its network.
#[derive(Clone, Debug, PartialEq, Eq)]
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
}

/// The process document of a spec (also what an exec takes).
pub fn process(p: &ProcessSpec) -> Value {
    json!({
        "terminal": false,
        "user": { "uid": p.uid, "gid": p.gid, "additionalGids": [p.gid] },
        "args": p.args,
        "env": p.env,
        "cwd": p.cwd,
        // No capability in any set: the process can do nothing root could. No rlimits: they
        // are inherited from the runtime, as raising them needs a privilege we do not give.
        "capabilities": {
            "bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []
        },
        "noNewPrivileges": true
    })
}

fn mount(destination: &str, kind: &str, source: &str, options: &[&str]) -> Value {
    json!({ "destination": destination, "type": kind, "source": source, "options": options })
}

/// The full runtime spec of a container. `root.path` is `rootfs`, writable.
pub fn container(spec: &ContainerSpec<'_>) -> Value {
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]),
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
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
        ),
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        ),
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        ),
        mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        ),
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", "ro"],
        ),
        mount(
            "/run",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        mount("/tmp", "tmpfs", "tmpfs", &["nosuid", "nodev", "mode=1777"]),
        json!({
            "destination": spec.workspace_mount,
            "type": "bind",
            "source": spec.workspace.display().to_string(),
            "options": ["rbind", "rw"]
        }),
    ];
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
    ];
    if spec.host_network {
        for file in ["/etc/resolv.conf", "/etc/hosts"] {
            mounts.push(json!({
                "destination": file, "type": "bind", "source": file, "options": ["rbind", "ro"]
            }));
        }
    } else {
        match spec.netns {
            Some(path) => {
                namespaces.push(json!({"type": "network", "path": path.display().to_string()}))
            }
            None => namespaces.push(json!({"type": "network"})),
        }
        if let Some(resolv_conf) = spec.resolv_conf {
            mounts.push(json!({
                "destination": "/etc/resolv.conf",
                "type": "bind",
                "source": resolv_conf.display().to_string(),
                "options": ["rbind", "ro"]
            }));
        }
    }
    json!({
        "ociVersion": "1.0.2",
        "process": process(&spec.process),
        "root": { "path": "rootfs", "readonly": false },
        "hostname": spec.hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": spec.cgroups_path,
            "resources": { "devices": [{ "allow": false, "access": "rwm" }] },
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(host_network: bool) -> Value {
        container(&ContainerSpec {
            host_network,
            ..sample_spec()
        })
    }

    fn sample_spec() -> ContainerSpec<'static> {
        ContainerSpec {
            hostname: "demo",
            process: ProcessSpec {
                args: vec![
                    "/usr/bin/tini".into(),
                    "--".into(),
                    "sleep".into(),
                    "infinity".into(),
                ],
                env: vec!["PATH=/usr/bin:/bin".into()],
                cwd: "/workspace".into(),
                uid: 1000,
                gid: 1000,
            },
            workspace: Path::new("/var/lib/narya/workspaces/demo"),
            workspace_mount: "/workspace",
            host_network: true,
            netns: None,
            resolv_conf: None,
            cgroups_path: "/narya/demo",
        }
    }

    #[test]
    fn processes_are_unprivileged() {
        let spec = sample(true);
        let p = &spec["process"];
        assert_eq!(p["user"]["uid"], 1000);
        assert_eq!(p["user"]["gid"], 1000);
        assert_eq!(p["noNewPrivileges"], true);
        for set in [
            "bounding",
            "effective",
            "inheritable",
            "permitted",
            "ambient",
        ] {
            assert_eq!(p["capabilities"][set], json!([]), "{set}");
        }
        assert_eq!(spec["root"], json!({"path": "rootfs", "readonly": false}));
    }

    #[test]
    fn workspace_is_bound_read_write_and_network_follows_the_setting() {
        let spec = sample(true);
        let mounts = spec["mounts"].as_array().unwrap();
        let ws = mounts
            .iter()
            .find(|m| m["destination"] == "/workspace")
            .unwrap();
        assert_eq!(ws["source"], "/var/lib/narya/workspaces/demo");
        assert_eq!(ws["options"], json!(["rbind", "rw"]));
        let has_netns = |s: &Value| {
            s["linux"]["namespaces"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n["type"] == "network")
        };
        assert!(!has_netns(&spec));
        assert!(has_netns(&sample(false)));
        let joined = container(&ContainerSpec {
            netns: Some(Path::new("/run/narya/netns/demo")),
            resolv_conf: Some(Path::new("/run/narya/resolv.conf")),
            host_network: false,
            ..sample_spec()
        });
        let netns = joined["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["type"] == "network")
            .unwrap();
        assert_eq!(netns["path"], "/run/narya/netns/demo");
        assert!(joined["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["destination"] == "/etc/resolv.conf"
                && m["source"] == "/run/narya/resolv.conf"));
        assert!(spec["linux"]["maskedPaths"]
            .as_array()
            .unwrap()
            .contains(&json!("/proc/kcore")));
    }
}
