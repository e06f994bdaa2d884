//! Podman's containers are made through its own API (`/libpod/containers/create`), never
//! through its Docker-compatible create, which cannot give them a private cgroup namespace:
//! Podman 4.3 to 5.5 drop `HostConfig.CgroupnsMode` when they turn a Docker create into their
//! own spec, and with no mode asked for, their default on a cgroup v1 host is the host's
//! namespace whatever `containers.conf` says. Their own spec takes the mode as it is asked.
//!
//! The body is the one made for Docker; each field it sets is carried over as Podman's
//! compatible service would carry it, and a field this translation does not know fails the
//! create rather than being lost.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigCgroupnsModeEnum, Mount, MountTypeEnum,
    RestartPolicy,
};
use bytes::Bytes;
use narya_oci::spec::{NETWORK_ANNOTATION, NO_NETWORK};
use serde_json::{json, Map, Value};

use super::runtime_check::under_the_runtime_asked;
use super::{expect, request, untranslated, LibpodError};
use crate::{Result, RuntimeError};

/// Creates container `name` from `body` through Podman's own API on `socket`; its id.
pub(in crate::docker) async fn create(
    socket: &Path,
    name: &str,
    body: &ContainerCreateBody,
) -> Result<String> {
    let what = || format!("docker: creating container {name} (Podman)");
    let created = async {
        let spec = spec_generator(name, body)?;
        let answer = request(
            socket,
            hyper::Method::POST,
            "/containers/create",
            Some(&spec),
        )
        .await?;
        let id = created_id(answer)?;
        if let Some(asked) = body.host_config.as_ref().and_then(|h| h.runtime.as_deref()) {
            under_the_runtime_asked(socket, &id, asked).await?;
        }
        Ok::<_, LibpodError>(id)
    };
    created
        .await
        .map_err(|e| RuntimeError::caused(e.kind(), what(), e))
}

/// The id in a create's answer, or the error it carries.
fn created_id(answer: (u16, Bytes)) -> Result<String, LibpodError> {
    #[derive(serde::Deserialize)]
    struct Created {
        #[serde(rename = "Id")]
        id: String,
    }
    let body = expect(201, answer)?;
    let created: Created =
        serde_json::from_slice(&body).map_err(|e| LibpodError::Decode("a created container", e))?;
    Ok(created.id)
}

/// Podman's spec (`SpecGenerator`) for what `body` asks of the Docker API.
fn spec_generator(name: &str, body: &ContainerCreateBody) -> Result<Value, LibpodError> {
    let mut spec = Map::new();
    let mut put = |key: &str, value: Value| {
        spec.insert(key.to_owned(), value);
    };
    put("name", json!(name));
    // What Podman's compatible create does for every container.
    put("create_working_dir", json!(true));
    put("terminal", json!(body.tty.unwrap_or(false)));
    put("stdin", json!(body.open_stdin.unwrap_or(false)));
    if let Some(image) = &body.image {
        put("image", json!(image));
    }
    if let Some(user) = &body.user {
        put("user", json!(user));
    }
    if let Some(entrypoint) = &body.entrypoint {
        put("entrypoint", json!(entrypoint));
    }
    if let Some(cmd) = &body.cmd {
        put("command", json!(cmd));
    }
    if let Some(dir) = &body.working_dir {
        put("work_dir", json!(dir));
    }
    if let Some(hostname) = &body.hostname {
        put("hostname", json!(hostname));
    }
    if let Some(labels) = &body.labels {
        put("labels", json!(labels));
    }
    if let Some(env) = &body.env {
        let env: HashMap<&str, &str> = env
            .iter()
            .map(|pair| pair.split_once('=').unwrap_or((pair.as_str(), "")))
            .collect();
        put("env", json!(env));
    }
    let mut rest = body.clone();
    (rest.image, rest.user, rest.entrypoint, rest.cmd) = (None, None, None, None);
    (rest.working_dir, rest.hostname, rest.labels, rest.env) = (None, None, None, None);
    (rest.tty, rest.open_stdin) = (None, None);
    // Attaching is its own call; Podman's compatible create takes none of these either.
    (rest.attach_stdin, rest.attach_stdout, rest.attach_stderr) = (None, None, None);
    rest.stdin_once = None;
    rest.host_config = None;
    let mut left = untranslated(&rest)?;
    if let Some(host) = &body.host_config {
        left.extend(host_spec(host, &mut spec)?);
    }
    if !left.is_empty() {
        return Err(LibpodError::Untranslated(left.join(", ")));
    }
    Ok(Value::Object(spec))
}

/// Puts what `host` asks into `spec`; the fields it sets that were not carried over.
fn host_spec(host: &HostConfig, spec: &mut Map<String, Value>) -> Result<Vec<String>, LibpodError> {
    let mut put = |key: &str, value: Value| {
        spec.insert(key.to_owned(), value);
    };
    let mut left = Vec::new();
    let mut mounts = Vec::new();
    for mount in host.mounts.iter().flatten() {
        match mount_spec(mount) {
            Some(m) => mounts.push(m),
            None => left.push(format!("HostConfig.Mounts {mount:?}")),
        }
    }
    for (target, options) in host.tmpfs.iter().flatten() {
        let options: Vec<&str> = options.split(',').filter(|o| !o.is_empty()).collect();
        mounts.push(json!({
            "destination": target,
            "type": "tmpfs",
            "source": "tmpfs",
            "options": options,
        }));
    }
    if !mounts.is_empty() {
        put("mounts", json!(mounts));
    }
    for option in host.security_opt.iter().flatten() {
        match option.split_once('=') {
            None if option == "no-new-privileges" => put("no_new_privileges", json!(true)),
            Some(("seccomp", profile)) => put("seccomp_profile_path", json!(profile)),
            _ => left.push(format!("HostConfig.SecurityOpt {option:?}")),
        }
    }
    if let Some(caps) = &host.cap_drop {
        put("cap_drop", json!(caps));
    }
    if let Some(caps) = &host.cap_add {
        put("cap_add", json!(caps));
    }
    match host.network_mode.as_deref() {
        None => {}
        Some("host") => put("netns", json!({ "nsmode": "host" })),
        Some("none") => {
            put("netns", json!({ "nsmode": "none" }));
            // Podman leaves the new namespace's loopback down and names no path for it in the
            // spec: the runsc wrapper reads this to give gVisor's loopback-only network.
            put("annotations", json!({ (NETWORK_ANNOTATION): NO_NETWORK }));
        }
        Some(network) => {
            put("netns", json!({ "nsmode": "bridge" }));
            put("Networks", json!({ network: {} }));
        }
    }
    if let Some(dns) = &host.dns {
        put("dns_server", json!(dns));
    }
    if let Some(sysctls) = &host.sysctls {
        put("sysctl", json!(sysctls));
    }
    if let Some(runtime) = &host.runtime {
        put("oci_runtime", json!(runtime));
    }
    if let Some(init) = host.init {
        put("init", json!(init));
    }
    match host.cgroupns_mode {
        Some(HostConfigCgroupnsModeEnum::PRIVATE) => put("cgroupns", json!({"nsmode": "private"})),
        Some(HostConfigCgroupnsModeEnum::HOST) => put("cgroupns", json!({"nsmode": "host"})),
        _ => {}
    }
    let mut resources = Map::new();
    let mut memory = Map::new();
    if let Some(limit) = host.memory {
        memory.insert("limit".to_owned(), json!(limit));
    }
    if let Some(swap) = host.memory_swap {
        memory.insert("swap".to_owned(), json!(swap));
    }
    if !memory.is_empty() {
        resources.insert("memory".to_owned(), Value::Object(memory));
    }
    let mut cpu = Map::new();
    if let Some(period) = host.cpu_period {
        cpu.insert("period".to_owned(), json!(period));
    }
    if let Some(quota) = host.cpu_quota {
        cpu.insert("quota".to_owned(), json!(quota));
    }
    if !cpu.is_empty() {
        resources.insert("cpu".to_owned(), Value::Object(cpu));
    }
    if let Some(pids) = host.pids_limit {
        resources.insert("pids".to_owned(), json!({ "limit": pids }));
    }
    if !resources.is_empty() {
        put("resource_limits", Value::Object(resources));
    }
    let mut rlimits = Vec::new();
    for ulimit in host.ulimits.iter().flatten() {
        match (&ulimit.name, ulimit.soft, ulimit.hard) {
            (Some(name), Some(soft), Some(hard)) => rlimits.push(json!({
                // Podman prefixes `RLIMIT_` itself (pkg/specgen/generate/oci.go, addRlimits).
                "type": name,
                "soft": soft,
                "hard": hard,
            })),
            _ => left.push(format!("HostConfig.Ulimits {ulimit:?}")),
        }
    }
    if !rlimits.is_empty() {
        put("r_limits", json!(rlimits));
    }
    if let Some(adj) = host.oom_score_adj {
        put("oom_score_adj", json!(adj));
    }
    if let Some(RestartPolicy {
        name: Some(policy),
        maximum_retry_count,
    }) = &host.restart_policy
    {
        put("restart_policy", json!(policy));
        if let Some(tries) = maximum_retry_count {
            put("restart_tries", json!(tries));
        }
    }
    if let Some(log) = &host.log_config {
        let mut config = Map::new();
        if let Some(driver) = &log.typ {
            config.insert("driver".to_owned(), json!(driver));
        }
        if let Some(options) = &log.config {
            config.insert("options".to_owned(), json!(options));
        }
        put("log_configuration", Value::Object(config));
    }
    let mut rest = host.clone();
    (rest.mounts, rest.tmpfs, rest.security_opt) = (None, None, None);
    (rest.cap_drop, rest.cap_add, rest.network_mode) = (None, None, None);
    (rest.dns, rest.sysctls, rest.init, rest.cgroupns_mode) = (None, None, None, None);
    (
        rest.memory,
        rest.memory_swap,
        rest.cpu_period,
        rest.cpu_quota,
    ) = (None, None, None, None);
    (rest.pids_limit, rest.ulimits, rest.oom_score_adj) = (None, None, None);
    (rest.restart_policy, rest.log_config, rest.runtime) = (None, None, None);
    left.extend(
        untranslated(&rest)?
            .into_iter()
            .map(|field| format!("HostConfig.{field}")),
    );
    Ok(left)
}

/// A bind mount as Podman's spec has it; `None` for any other kind.
fn mount_spec(mount: &Mount) -> Option<Value> {
    let (Some(MountTypeEnum::BIND), Some(target), Some(source)) =
        (mount.typ, &mount.target, &mount.source)
    else {
        return None;
    };
    if mount.bind_options.is_some() || mount.volume_options.is_some() {
        return None;
    }
    let access = if mount.read_only.unwrap_or(false) {
        "ro"
    } else {
        "rw"
    };
    Some(json!({
        "destination": target,
        "type": "bind",
        "source": source,
        "options": ["rbind", access],
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use bollard::models::{
        ContainerCreateBody, HostConfig, HostConfigCgroupnsModeEnum, HostConfigLogConfig, Mount,
        MountTypeEnum, ResourcesUlimits, RestartPolicy, RestartPolicyNameEnum,
    };
    use bytes::Bytes;
    use serde_json::json;

    use super::{created_id, spec_generator};
    use crate::docker::libpod::LibpodError;
    use crate::ErrorKind;

    fn host() -> HostConfig {
        HostConfig {
            mounts: Some(vec![Mount {
                target: Some("/workspace".to_owned()),
                source: Some("/srv/ws".to_owned()),
                typ: Some(MountTypeEnum::BIND),
                read_only: Some(false),
                ..Default::default()
            }]),
            security_opt: Some(vec![
                "no-new-privileges".to_owned(),
                "seccomp=/var/lib/narya/seccomp.json".to_owned(),
            ]),
            cap_drop: Some(vec!["ALL".to_owned()]),
            network_mode: Some("narya-isolated".to_owned()),
            dns: Some(vec!["10.0.0.1".to_owned()]),
            init: Some(false),
            cgroupns_mode: Some(HostConfigCgroupnsModeEnum::PRIVATE),
            memory: Some(1 << 30),
            memory_swap: Some(1 << 30),
            cpu_period: Some(100_000),
            cpu_quota: Some(200_000),
            pids_limit: Some(512),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_owned(),
                "rw,exec,nosuid,nodev,mode=1777,size=1048576".to_owned(),
            )])),
            ulimits: Some(vec![ResourcesUlimits {
                name: Some("nofile".to_owned()),
                soft: Some(1024),
                hard: Some(1024),
            }]),
            oom_score_adj: Some(500),
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::ON_FAILURE),
                maximum_retry_count: Some(0),
            }),
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".to_owned()),
                config: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_create_becomes_podmans_spec_with_a_private_cgroup_namespace() {
        let body = ContainerCreateBody {
            image: Some("narya/official:x".to_owned()),
            user: Some("1000:1000".to_owned()),
            entrypoint: Some(vec!["/usr/bin/tini".to_owned()]),
            cmd: Some(vec!["/bin/sleep".to_owned(), "infinity".to_owned()]),
            env: Some(vec!["A=1".to_owned(), "B=x=y".to_owned()]),
            working_dir: Some("/workspace".to_owned()),
            hostname: Some("m1".to_owned()),
            labels: Some(HashMap::from([(
                "dev.narya.machine".to_owned(),
                "m1".to_owned(),
            )])),
            attach_stdout: Some(true),
            open_stdin: Some(true),
            stdin_once: Some(true),
            host_config: Some(host()),
            ..Default::default()
        };
        let spec = spec_generator("m1", &body).expect("everything is carried over");
        assert_eq!(spec["cgroupns"], json!({"nsmode": "private"}));
        assert_eq!(spec["name"], json!("m1"));
        assert_eq!(spec["image"], json!("narya/official:x"));
        assert_eq!(spec["command"], json!(["/bin/sleep", "infinity"]));
        assert_eq!(spec["env"], json!({"A": "1", "B": "x=y"}));
        assert_eq!(spec["stdin"], json!(true));
        assert_eq!(spec["netns"], json!({"nsmode": "bridge"}));
        assert_eq!(spec["Networks"], json!({"narya-isolated": {}}));
        assert_eq!(spec["no_new_privileges"], json!(true));
        assert_eq!(
            spec["seccomp_profile_path"],
            json!("/var/lib/narya/seccomp.json")
        );
        assert_eq!(
            spec["resource_limits"],
            json!({
                "memory": {"limit": 1 << 30, "swap": 1 << 30},
                "cpu": {"period": 100_000, "quota": 200_000},
                "pids": {"limit": 512},
            })
        );
        assert_eq!(
            spec["r_limits"],
            json!([{"type": "nofile", "soft": 1024, "hard": 1024}])
        );
        assert_eq!(spec["restart_policy"], json!("on-failure"));
        assert_eq!(spec["restart_tries"], json!(0));
        assert_eq!(spec["log_configuration"], json!({"driver": "none"}));
        let mounts = spec["mounts"].as_array().expect("mounts");
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0]["options"], json!(["rbind", "rw"]));
        assert_eq!(mounts[1]["type"], json!("tmpfs"));
    }

    #[test]
    fn no_network_is_annotated_for_the_runsc_wrapper() {
        let body = ContainerCreateBody {
            host_config: Some(HostConfig {
                network_mode: Some("none".to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let spec = spec_generator("m1", &body).expect("everything is carried over");
        assert_eq!(spec["netns"], json!({"nsmode": "none"}));
        assert_eq!(spec["annotations"], json!({"org.narya.network": "none"}));
    }

    #[test]
    fn what_is_not_translated_fails_the_create() {
        let body = ContainerCreateBody {
            image: Some("i".to_owned()),
            domainname: Some("example.org".to_owned()),
            host_config: Some(HostConfig {
                privileged: Some(true),
                security_opt: Some(vec!["apparmor=x".to_owned()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        match spec_generator("m", &body) {
            Err(LibpodError::Untranslated(left)) => {
                assert!(left.contains("Domainname"), "{left}");
                assert!(left.contains("HostConfig.Privileged"), "{left}");
                assert!(left.contains("apparmor=x"), "{left}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn answers_are_classified_as_the_compatible_api_s() {
        let id = created_id((201, Bytes::from_static(br#"{"Id":"abc","Warnings":[]}"#)));
        assert_eq!(id.expect("created"), "abc");
        let kind = |status, message: &'static [u8]| {
            created_id((status, Bytes::from_static(message)))
                .expect_err("refused")
                .kind()
        };
        assert_eq!(
            kind(
                500,
                br#"{"message":"the container name \"m\" is already in use by abc"}"#
            ),
            ErrorKind::AlreadyExists
        );
        assert_eq!(
            kind(500, br#"{"message":"x: image not known"}"#),
            ErrorKind::NotFound
        );
        assert_eq!(kind(500, b"boom"), ErrorKind::Other);
    }
}
