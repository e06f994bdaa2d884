//! The labels that make a container a Narya machine or throwaway, on every back end: the keys,
//! the label map a machine is made with, and what is read back from it.

use std::collections::HashMap;

use crate::{
    ErrorKind, MachineInfo, MachineSpec, MachineState, ProcessSpec, Result, RuntimeError,
    ThrowawayInfo, ThrowawaySpec, User,
};

/// The label every Narya machine carries, valued with its environment's identifier.
pub const LABEL_ENVIRONMENT: &str = "dev.narya.environment";
/// The label carrying the organisation that owns a machine.
pub const LABEL_ORGANISATION: &str = "dev.narya.organisation";
/// The runtime's own name for a machine, so a namesake is never taken for it. Machines made
/// before names were internal lack it: their name is their environment's identifier.
const LABEL_MACHINE: &str = "dev.narya.machine";
/// The label carrying the pinned manifest digest a machine was made from.
pub const LABEL_DIGEST: &str = "dev.narya.image-digest";
/// Marks containers that exist only for one command (clones), never machines; valued with the
/// throwaway's name.
pub const LABEL_THROWAWAY: &str = "dev.narya.throwaway";
/// Marks a machine started ahead of creates, valued with the configuration it was started
/// for (the daemon's fingerprint). Such a machine carries an empty [`LABEL_ENVIRONMENT`], so
/// that every listing and event filter on that label's presence finds it, and no
/// organisation, until a create claims it.
pub const LABEL_POOL: &str = "dev.narya.pool";
/// Where the workspace is mounted inside, so execs default to it.
const LABEL_WORKSPACE: &str = "dev.narya.workspace";
/// The user machines run as, so execs after a daemon restart run as the same one.
const LABEL_USER: &str = "dev.narya.user";

/// The labels of the machine `spec` describes: the caller's, with Narya's own over them.
pub(crate) fn machine_labels(spec: &MachineSpec) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
    labels.insert(LABEL_MACHINE.to_owned(), spec.id.clone());
    match &spec.pool {
        Some(configuration) => {
            labels.insert(LABEL_POOL.to_owned(), configuration.clone());
            labels.insert(LABEL_ENVIRONMENT.to_owned(), String::new());
            labels.remove(LABEL_ORGANISATION);
        }
        None => {
            labels.remove(LABEL_POOL);
            labels.insert(LABEL_ENVIRONMENT.to_owned(), spec.environment.clone());
            labels.insert(LABEL_ORGANISATION.to_owned(), spec.organisation.clone());
        }
    }
    labels.insert(LABEL_DIGEST.to_owned(), spec.image.digest.to_string());
    labels.insert(LABEL_WORKSPACE.to_owned(), spec.mount_point.clone());
    labels.insert(LABEL_USER.to_owned(), spec.user.to_string());
    labels
}

/// `labels` of a pool machine made those of a machine serving `environment` of `organisation`:
/// the identifier and organisation set, the pool mark gone.
pub(crate) fn claimed_labels(
    mut labels: HashMap<String, String>,
    environment: &str,
    organisation: &str,
) -> HashMap<String, String> {
    labels.remove(LABEL_POOL);
    labels.insert(LABEL_ENVIRONMENT.to_owned(), environment.to_owned());
    labels.insert(LABEL_ORGANISATION.to_owned(), organisation.to_owned());
    labels
}

/// The labels of throwaway `spec`: its name, and the environment and organisation it works
/// for; never a machine, so machine listings pass it over.
pub(crate) fn throwaway_labels(spec: &ThrowawaySpec) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_THROWAWAY.to_owned(), spec.name.clone()),
        (LABEL_ENVIRONMENT.to_owned(), spec.environment.clone()),
        (LABEL_ORGANISATION.to_owned(), spec.organisation.clone()),
    ])
}

/// The throwaways among `found` (each container's labels), by name.
pub(crate) fn throwaways(
    found: impl IntoIterator<Item = HashMap<String, String>>,
) -> Vec<ThrowawayInfo> {
    let mut throwaways: Vec<ThrowawayInfo> = found
        .into_iter()
        .filter_map(|labels| {
            Some(ThrowawayInfo {
                name: labels.get(LABEL_THROWAWAY)?.clone(),
                environment: labels.get(LABEL_ENVIRONMENT).cloned(),
                organisation: labels.get(LABEL_ORGANISATION).cloned(),
            })
        })
        .collect();
    throwaways.sort_by(|a, b| a.name.cmp(&b.name));
    throwaways
}

/// Whether `labels` mark machine `id`, not merely a namesake.
pub(crate) fn is_machine(labels: &HashMap<String, String>, id: &str) -> bool {
    machine_name(labels) == Some(id)
}

/// The name a machine with `labels` was made under; `None` for a container that is no machine
/// (a throwaway carries its environment's label too).
pub(crate) fn machine_name(labels: &HashMap<String, String>) -> Option<&str> {
    if labels.contains_key(LABEL_THROWAWAY) {
        return None;
    }
    labels
        .get(LABEL_MACHINE)
        .or_else(|| labels.get(LABEL_ENVIRONMENT).filter(|e| !e.is_empty()))
        .map(String::as_str)
}

/// Whether `labels` mark a throwaway container, whichever.
pub(crate) fn is_any_throwaway(labels: &HashMap<String, String>) -> bool {
    labels.contains_key(LABEL_THROWAWAY)
}

/// Whether `labels` mark throwaway `name`.
pub(crate) fn is_throwaway(labels: &HashMap<String, String>, name: &str) -> bool {
    labels.get(LABEL_THROWAWAY).map(String::as_str) == Some(name)
}

/// Who a process runs as in a machine, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RunAs {
    pub user: User,
    pub cwd: String,
}

/// How `process` runs in machine `id` with `labels`: as the machine's user, in the directory
/// asked for, else the workspace, else `/`.
pub(crate) fn run_as(
    id: &str,
    labels: &HashMap<String, String>,
    process: &ProcessSpec,
) -> Result<RunAs> {
    let user = labels
        .get(LABEL_USER)
        .and_then(|label| parse_user(label))
        .ok_or_else(|| {
            RuntimeError::plain(
                ErrorKind::Other,
                format!("machine {id} carries no {LABEL_USER} label"),
            )
        })?;
    let cwd = process
        .cwd
        .clone()
        .or_else(|| labels.get(LABEL_WORKSPACE).cloned())
        .unwrap_or_else(|| "/".to_owned());
    Ok(RunAs { user, cwd })
}

fn parse_user(label: &str) -> Option<User> {
    let (uid, gid) = label.split_once(':')?;
    Some(User {
        uid: uid.parse().ok()?,
        gid: gid.parse().ok()?,
    })
}

/// The machine `spec` describes, as listings report it once it is made and running.
pub(crate) fn running_machine(spec: &MachineSpec) -> MachineInfo {
    let pooled = spec.pool.is_some();
    MachineInfo {
        id: spec.id.clone(),
        environment: (!pooled).then(|| spec.environment.clone()),
        organisation: (!pooled).then(|| spec.organisation.clone()),
        digest: Some(spec.image.digest.clone()),
        state: MachineState::Running,
        pool: spec.pool.clone(),
    }
}

/// The machines among `found` (each container's labels and state), in id order; containers
/// without our label are not machines.
pub(crate) fn machines(
    found: impl IntoIterator<Item = (HashMap<String, String>, MachineState)>,
) -> Vec<MachineInfo> {
    let mut machines: Vec<MachineInfo> = found
        .into_iter()
        .filter_map(|(labels, state)| {
            Some(MachineInfo {
                id: machine_name(&labels)?.to_owned(),
                environment: labels
                    .get(LABEL_ENVIRONMENT)
                    .filter(|e| !e.is_empty())
                    .cloned(),
                organisation: labels.get(LABEL_ORGANISATION).cloned(),
                digest: labels.get(LABEL_DIGEST).and_then(|d| d.parse().ok()),
                state,
                pool: labels.get(LABEL_POOL).cloned(),
            })
        })
        .collect();
    machines.sort_by(|a, b| a.id.cmp(&b.id));
    machines
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::{Network, PinnedImage};

    fn digest() -> narya_oci::Digest {
        format!("sha256:{}", "ab".repeat(32)).parse().unwrap()
    }

    fn spec() -> MachineSpec {
        MachineSpec {
            id: "env-1".to_owned(),
            environment: "a..b-".to_owned(),
            organisation: "acme".to_owned(),
            image: PinnedImage {
                reference: "oci-layout:/nowhere".parse().unwrap(),
                digest: digest(),
            },
            workspace: "/srv/env-1".into(),
            mount_point: "/workspace".to_owned(),
            user: User {
                uid: 1000,
                gid: 1001,
            },
            network: Network::None,
            limits: crate::Limits::default(),
            pool: None,
            labels: BTreeMap::from([
                ("team".to_owned(), "blue".to_owned()),
                (LABEL_ENVIRONMENT.to_owned(), "forged".to_owned()),
                (LABEL_MACHINE.to_owned(), "forged".to_owned()),
            ]),
            layer: None,
        }
    }

    fn process(cwd: Option<&str>) -> ProcessSpec {
        ProcessSpec {
            argv: vec!["true".to_owned()],
            env: BTreeMap::new(),
            cwd: cwd.map(str::to_owned),
            timeout: Duration::from_secs(1),
            output_limit: 1,
            stdin: None,
            output: None,
        }
    }

    #[test]
    fn a_machine_is_read_back_as_it_was_labelled() {
        let labels = machine_labels(&spec());
        assert_eq!(labels["team"], "blue");
        assert!(is_machine(&labels, "env-1"), "ours win over the caller's");
        assert!(!is_machine(&labels, "env-2"));
        assert!(!is_throwaway(&labels, "env-1"));
        let run = run_as("env-1", &labels, &process(None)).unwrap();
        assert_eq!(
            run,
            RunAs {
                user: User {
                    uid: 1000,
                    gid: 1001
                },
                cwd: "/workspace".to_owned()
            }
        );
        let elsewhere = run_as("env-1", &labels, &process(Some("/tmp"))).unwrap();
        assert_eq!(elsewhere.cwd, "/tmp");
        let listed = machines([(labels, MachineState::Running)]);
        assert_eq!(listed, [running_machine(&spec())]);
        assert_eq!(listed[0].environment.as_deref(), Some("a..b-"));
        assert_eq!(listed[0].organisation.as_deref(), Some("acme"));
        assert_eq!(listed[0].digest, Some(digest()));
    }

    #[test]
    fn a_throwaway_is_no_machine_and_names_its_environment() {
        let throwaway = ThrowawaySpec {
            name: "narya-clone-1".to_owned(),
            image: spec().image,
            workspace: "/srv/env-1".into(),
            mount_point: "/workspace".to_owned(),
            user: spec().user,
            network: Network::Host,
            environment: "env-1".to_owned(),
            organisation: "acme".to_owned(),
            limits: crate::Limits::default(),
            process: process(None),
        };
        let labels = throwaway_labels(&throwaway);
        assert!(is_throwaway(&labels, "narya-clone-1"));
        assert!(!is_machine(&labels, "narya-clone-1"));
        assert!(!is_machine(&labels, "env-1"));
        assert!(machines([(labels.clone(), MachineState::Running)]).is_empty());
        assert_eq!(
            throwaways([labels, machine_labels(&spec())]),
            [ThrowawayInfo {
                name: "narya-clone-1".to_owned(),
                environment: Some("env-1".to_owned()),
                organisation: Some("acme".to_owned()),
            }]
        );
    }

    #[test]
    fn a_machine_without_its_user_cannot_run_a_process() {
        let e = run_as("env-1", &HashMap::new(), &process(None)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Other);
        assert!(e.to_string().contains(LABEL_USER), "{e}");
    }

    #[test]
    fn a_machine_made_before_names_were_internal_is_named_by_its_environment() {
        let labels = HashMap::from([(LABEL_ENVIRONMENT.to_owned(), "demo".to_owned())]);
        assert!(is_machine(&labels, "demo"));
        let listed = machines([(labels, MachineState::Running)]);
        assert_eq!(
            (listed[0].id.as_str(), listed[0].organisation.as_ref()),
            ("demo", None)
        );
    }

    #[test]
    fn a_pool_machine_carries_no_identifier_until_it_is_claimed() {
        let pooled = MachineSpec {
            id: "narya-pool-1".to_owned(),
            pool: Some("config-1".to_owned()),
            ..spec()
        };
        let labels = machine_labels(&pooled);
        assert_eq!(labels[LABEL_POOL], "config-1");
        assert_eq!(
            labels[LABEL_ENVIRONMENT], "",
            "present, so filters find it; empty"
        );
        assert!(!labels.contains_key(LABEL_ORGANISATION));
        assert!(is_machine(&labels, "narya-pool-1"));
        let listed = machines([(labels.clone(), MachineState::Running)]);
        assert_eq!(listed, [running_machine(&pooled)]);
        assert_eq!(listed[0].environment, None);
        assert_eq!(listed[0].organisation, None);
        assert_eq!(listed[0].pool.as_deref(), Some("config-1"));

        let claimed = claimed_labels(labels, "demo", "acme");
        assert!(!claimed.contains_key(LABEL_POOL));
        assert!(
            is_machine(&claimed, "narya-pool-1"),
            "its name does not change"
        );
        let listed = machines([(claimed, MachineState::Running)]);
        assert_eq!(listed[0].environment.as_deref(), Some("demo"));
        assert_eq!(listed[0].organisation.as_deref(), Some("acme"));
        assert_eq!(listed[0].pool, None);
    }

    #[test]
    fn machines_are_listed_in_id_order() {
        let found = ["b", "a", "c"].map(|id| {
            (
                HashMap::from([(LABEL_ENVIRONMENT.to_owned(), id.to_owned())]),
                MachineState::Stopped,
            )
        });
        let ids: Vec<String> = machines(found).into_iter().map(|m| m.id).collect();
        assert_eq!(ids, ["a", "b", "c"]);
    }
}
