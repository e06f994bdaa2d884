//! containerd's side of isolated networking: the daemon makes each machine's namespace and wires
//! it with the standard CNI plugins (`loopback`; `ptp` with `host-local` addresses from the
//! subnet), called as the CNI specification says: configuration on stdin, `CNI_*` variables,
//! the result on stdout. `ptp` routes every machine through the host, so the firewall sees
//! (and drops) traffic between machines without a bridge.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::{netns, other, Isolation};
use crate::{ErrorKind, Result, RuntimeError};

const CNI_VERSION: &str = "1.0.0";
/// How long one plugin call may take.
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// What the daemon's machines hold on the host, for checks that nothing leaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Namespace files under the run directory.
    pub namespaces: usize,
    /// Addresses `host-local` holds reserved.
    pub reservations: usize,
}

impl Isolation {
    fn cni_network(&self) -> String {
        format!("narya-{}", self.config.tag)
    }

    fn ipam_dir(&self) -> PathBuf {
        self.config.run_dir.join("ipam")
    }

    /// Where machine `id`'s namespace is bound.
    pub fn namespace_path(&self, id: &str) -> PathBuf {
        self.config.run_dir.join("netns").join(id)
    }

    /// The CNI network list machines get (also written beside the namespaces, for `ctr run
    /// --cni` and for people).
    pub fn conflist(&self) -> Value {
        let subnet = self.config.subnet;
        json!({
            "cniVersion": CNI_VERSION,
            "name": self.cni_network(),
            "plugins": [{
                "type": "ptp",
                // Masquerading is the daemon's own chain, not one per machine.
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": subnet.to_string(), "gateway": subnet.gateway().to_string() }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": self.ipam_dir().display().to_string(),
                },
            }],
        })
    }

    fn loopback(&self) -> Value {
        json!({ "cniVersion": CNI_VERSION, "name": format!("{}-lo", self.cni_network()), "type": "loopback" })
    }

    /// Writes the network list to `<run_dir>/<name>.conflist`.
    pub fn write_conflist(&self) -> Result<PathBuf> {
        let path = self
            .config
            .run_dir
            .join(format!("{}.conflist", self.cni_network()));
        let text = serde_json::to_vec_pretty(&self.conflist())
            .map_err(|e| other("encoding the CNI network list".to_owned(), e))?;
        std::fs::write(&path, text)
            .map_err(|e| other(format!("cannot write {}", path.display()), e))?;
        Ok(path)
    }

    /// Gives machine `id` a namespace of its own wired to the host, and returns its path;
    /// nothing is left behind when a step fails. A namespace there already is rewired.
    pub async fn attach(&self, id: &str) -> Result<PathBuf> {
        let path = self.namespace_path(id);
        let target = path.clone();
        tokio::task::spawn_blocking(move || netns::create(&target))
            .await
            .map_err(|e| other("making a network namespace".to_owned(), e))?
            .map_err(|e| {
                other(
                    format!("network: cannot make namespace {}", path.display()),
                    e,
                )
            })?;
        if let Err(e) = self.add(id, &path).await {
            if let Err(undo) = self.detach(id).await {
                tracing::warn!(machine = id, error = %undo, "network: undoing a failed attach");
            }
            return Err(e);
        }
        Ok(path)
    }

    async fn add(&self, id: &str, path: &Path) -> Result<()> {
        self.invoke("ADD", id, path, "lo", &self.loopback()).await?;
        let mut previous: Option<Value> = None;
        for plugin in self.plugins() {
            let mut conf = plugin;
            if let Some(previous) = previous.take() {
                conf["prevResult"] = previous;
            }
            previous = Some(self.invoke("ADD", id, path, "eth0", &conf).await?);
        }
        Ok(())
    }

    /// Releases what [`Isolation::attach`] took for `id`: interface, address, namespace.
    /// Repeat-safe: what is gone already is fine.
    pub async fn detach(&self, id: &str) -> Result<()> {
        let path = self.namespace_path(id);
        let mut plugins = self.plugins();
        plugins.reverse();
        for conf in plugins {
            self.invoke("DEL", id, &path, "eth0", &conf).await?;
        }
        let target = path.clone();
        tokio::task::spawn_blocking(move || netns::remove(&target))
            .await
            .map_err(|e| other("removing a network namespace".to_owned(), e))?
            .map_err(|e| other(format!("network: cannot remove {}", path.display()), e))
    }

    /// Whether machine `id`'s namespace is in place (a reboot leaves only its file).
    pub fn is_attached(&self, id: &str) -> bool {
        netns::is_namespace(&self.namespace_path(id))
    }

    /// Refuses a subnet other than the one the machines still there have addresses from: the
    /// rules fence the configured subnet only, and would leave those machines outside them.
    pub fn check_reservations(&self) -> Result<()> {
        let dir = self.ipam_dir().join(self.cni_network());
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        let outside: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_string_lossy()
                    .parse::<std::net::Ipv4Addr>()
                    .ok()
            })
            .filter(|ip| !self.config.subnet.contains(*ip))
            .map(|ip| ip.to_string())
            .collect();
        if outside.is_empty() {
            return Ok(());
        }
        Err(RuntimeError::plain(
            ErrorKind::Other,
            format!(
                "network: machines hold addresses {outside:?} outside [network] subnet {}; delete those environments first, or set the subnet back",
                self.config.subnet
            ),
        ))
    }

    /// The addresses `host-local` holds reserved for this daemon's machines.
    pub(super) fn reserved_addresses(&self) -> std::collections::HashSet<std::net::Ipv4Addr> {
        std::fs::read_dir(self.ipam_dir().join(self.cni_network())).map_or_else(
            |_| std::collections::HashSet::new(),
            |entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            },
        )
    }

    /// What the machines hold now: namespace files and address reservations.
    pub fn leftovers(&self) -> Leftovers {
        let count = |dir: PathBuf, keep: fn(&str) -> bool| {
            std::fs::read_dir(dir).map_or(0, |entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| keep(&e.file_name().to_string_lossy()))
                    .count()
            })
        };
        Leftovers {
            namespaces: count(self.config.run_dir.join("netns"), |_| true),
            // host-local keeps one file per address, named after it, beside its lock and
            // its last-reserved marker.
            reservations: count(self.ipam_dir().join(self.cni_network()), |name| {
                name.parse::<std::net::IpAddr>().is_ok()
            }),
        }
    }

    /// Each plugin of the list with the list's name and version, as the specification hands
    /// them over.
    fn plugins(&self) -> Vec<Value> {
        let list = self.conflist();
        let plugins = list["plugins"].as_array().cloned().unwrap_or_default();
        plugins
            .into_iter()
            .map(|mut p| {
                p["name"] = list["name"].clone();
                p["cniVersion"] = list["cniVersion"].clone();
                p
            })
            .collect()
    }

    fn plugin_binary(&self, kind: &str) -> Result<PathBuf> {
        self.config
            .cni_bin_dirs
            .iter()
            .map(|dir| dir.join(kind))
            .find(|path| path.is_file())
            .ok_or_else(|| {
                RuntimeError::plain(
                    ErrorKind::Other,
                    format!(
                        "network: CNI plugin {kind:?} not found in {:?} ([network] cni_bin_dir; Debian: containernetworking-plugins)",
                        self.config.cni_bin_dirs
                    ),
                )
            })
    }

    /// Calls the plugin `conf` names with `command`; its result on success.
    async fn invoke(
        &self,
        command: &str,
        id: &str,
        netns: &Path,
        ifname: &str,
        conf: &Value,
    ) -> Result<Value> {
        let kind = conf["type"].as_str().unwrap_or_default();
        let binary = self.plugin_binary(kind)?;
        let cni_path = std::env::join_paths(&self.config.cni_bin_dirs)
            .map_err(|e| other("joining [network] cni_bin_dir".to_owned(), e))?;
        let what = format!("network: CNI {kind} {command} for {id}");
        let mut child = Command::new(&binary)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", ifname)
            .env("CNI_PATH", cni_path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| other(what.clone(), e))?;
        let input = serde_json::to_vec(conf).map_err(|e| other(what.clone(), e))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(&input)
                .await
                .map_err(|e| other(what.clone(), e))?;
        }
        let out = tokio::time::timeout(PLUGIN_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| {
                RuntimeError::plain(
                    ErrorKind::Other,
                    format!("{what}: no answer in {} s", PLUGIN_TIMEOUT.as_secs()),
                )
            })?
            .map_err(|e| other(what.clone(), e))?;
        if !out.status.success() {
            // A failing plugin prints an error object: {"code", "msg", "details"}.
            let said: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            let message = match said["msg"].as_str() {
                Some(msg) => format!("{msg} {}", said["details"].as_str().unwrap_or("")),
                None => String::from_utf8_lossy(&out.stderr).into_owned(),
            };
            return Err(RuntimeError::plain(
                ErrorKind::Other,
                format!("{what}: {}", message.trim()),
            ));
        }
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&out.stdout).map_err(|e| other(format!("{what}: its result"), e))
    }
}
