use serde_json::{json, Value};

use super::*;

fn limits() -> Limits {
    Limits {
        memory: 512 << 20,
        cpus: 1.5,
        pids: 256,
        tmp: 64 << 20,
        nofile: 4096,
    }
}

fn sample(host_network: bool) -> Value {
    to_value(&ContainerSpec {
        host_network,
        ..sample_spec()
    })
}

fn to_value(spec: &ContainerSpec<'_>) -> Value {
    serde_json::to_value(container(spec).expect("a spec")).expect("serialisable")
}

fn sample_spec() -> ContainerSpec<'static> {
    ContainerSpec {
        hostname: "demo",
        process: ProcessSpec {
            args: ["/usr/bin/tini", "--", "sleep", "infinity"]
                .map(str::to_owned)
                .to_vec(),
            env: vec!["PATH=/usr/bin:/bin".into()],
            cwd: "/workspace".into(),
            uid: 1000,
            gid: 1000,
            nofile: 4096,
        },
        workspace: Path::new("/var/lib/narya/workspaces/demo"),
        workspace_mount: "/workspace",
        host_network: true,
        netns: None,
        resolv_conf: None,
        cgroups_path: "/narya/demo",
        limits: limits(),
    }
}

#[test]
fn a_private_network_joins_the_namespace_made_for_it_with_its_resolv_conf() {
    let joined = to_value(&ContainerSpec {
        host_network: false,
        netns: Some(Path::new("/run/narya/netns/demo")),
        resolv_conf: Some(Path::new("/run/narya/resolv.conf")),
        ..sample_spec()
    });
    let netns = joined["linux"]["namespaces"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["type"] == "network"))
        .expect("a network namespace");
    assert_eq!(netns["path"], "/run/narya/netns/demo");
    assert!(
        joined["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .any(|m| m["destination"] == "/etc/resolv.conf"
                && m["source"] == "/run/narya/resolv.conf")
    );
}

#[test]
fn only_a_new_empty_network_namespace_is_annotated_as_no_network() {
    let annotation = |spec: &Value| spec["annotations"][NETWORK_ANNOTATION].clone();
    let empty = sample(false);
    assert_eq!(annotation(&empty), json!(NO_NETWORK));
    assert_eq!(annotation(&sample(true)), Value::Null, "the host's network");
    let joined = to_value(&ContainerSpec {
        host_network: false,
        netns: Some(Path::new("/run/narya/netns/demo")),
        ..sample_spec()
    });
    assert_eq!(
        annotation(&joined),
        Value::Null,
        "a namespace made and wired"
    );
}

#[test]
fn processes_are_unprivileged_and_bounded() {
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
    assert_eq!(p["oomScoreAdj"], OOM_SCORE_ADJ);
    assert_eq!(
        p["rlimits"],
        json!([{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}])
    );
    assert_eq!(spec["root"], json!({"path": "rootfs", "readonly": false}));
}

#[test]
fn limits_land_in_the_cgroup_and_tmp() {
    let spec = sample(false);
    let resources = &spec["linux"]["resources"];
    assert_eq!(resources["memory"]["limit"], 512 << 20);
    assert_eq!(resources["cpu"]["quota"], 150_000);
    assert_eq!(resources["cpu"]["period"], 100_000);
    assert_eq!(resources["pids"]["limit"], 256);
    let tmp = spec["mounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["destination"] == "/tmp"))
        .expect("a /tmp mount");
    assert_eq!(tmp["type"], "tmpfs");
    assert_eq!(
        tmp["options"],
        json!([
            "rw",
            "exec",
            "nosuid",
            "nodev",
            "mode=1777",
            format!("size={}", 64 << 20)
        ])
    );
}

#[test]
fn namespaces_include_cgroup_and_seccomp_is_set() {
    let kinds = |s: &Value| -> Vec<String> {
        s["linux"]["namespaces"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n["type"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let host = sample(true);
    assert!(kinds(&host).contains(&"cgroup".to_owned()));
    assert!(!kinds(&host).contains(&"network".to_owned()));
    assert!(kinds(&sample(false)).contains(&"network".to_owned()));
    assert_eq!(host["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ERRNO");
    assert!(host["linux"]["maskedPaths"]
        .as_array()
        .is_some_and(|a| a.contains(&json!("/proc/kcore"))));
}

#[test]
fn workspace_is_bound_read_write() {
    let spec = sample(true);
    let ws = spec["mounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["destination"] == "/workspace"))
        .expect("a workspace mount");
    assert_eq!(ws["source"], "/var/lib/narya/workspaces/demo");
    assert_eq!(ws["options"], json!(["rbind", "rw"]));
}

#[test]
fn an_exec_keeps_the_machines_bounds() {
    let machine = process(&ProcessSpec {
        args: vec!["sleep".into()],
        env: vec![],
        cwd: "/".into(),
        uid: 1000,
        gid: 1000,
        nofile: 2048,
    })
    .expect("a process");
    let exec = exec_process(
        &machine,
        vec!["id".into()],
        vec!["A=b".into()],
        "/workspace",
    );
    let json = serde_json::to_value(&exec).expect("serialisable");
    assert_eq!(json["args"], json!(["id"]));
    assert_eq!(json["cwd"], "/workspace");
    assert_eq!(json["oomScoreAdj"], OOM_SCORE_ADJ);
    assert_eq!(json["rlimits"][0]["hard"], 2048);
    assert_eq!(json["noNewPrivileges"], true);
}
