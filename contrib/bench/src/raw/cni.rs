//! The raw side's network when it is the daemon's CNI network list: the copy `ctr` is shown in a
//! private mount namespace, the wrapper that shows it, and the release of what `ctr run --cni`
//! took.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::{Backend, Raw, NAMESPACE};

/// The network the raw side's machines get: the same as the daemon's.
pub enum RawNetwork {
    /// The host's (`--net-host`, `--network host`).
    Host,
    /// containerd: `ctr run --cni` with the daemon's own CNI network list. `ctr` reads its
    /// configuration only from `/etc/cni/net.d`, so `ctr run` runs in a private mount namespace
    /// where that directory is this one's `net.d`, holding a copy of the list the daemon wrote
    /// (and, for a `ctr` that finds plugins only in `/opt/cni/bin`, `/opt` is its `opt`, where
    /// `cni/bin` leads to Debian's plugins). `ctr` 1.6 never releases what `run --cni` took
    /// (1.7's `task rm` does, so `task rm` runs in that namespace too): the removal calls the
    /// plugins' DEL itself, as 1.7 would, untimed like every removal.
    Cni(tempfile::TempDir),
    /// Docker: the daemon's bridge network, by name.
    Bridge(String),
}

/// Where Debian's `containernetworking-plugins` puts the plugins (bookworm's `ctr` looks there
/// too; sid's only in `/opt/cni/bin`).
const CNI_PLUGINS: &str = "/usr/lib/cni";

/// The network list's file, in the raw side's `net.d`.
const CNI_LIST: &str = "10-narya-bench.conflist";

/// Releases what `ctr run --cni` took for machines `ids` (CNI DEL of the network list in `dir`,
/// as `ctr` 1.7's `task rm` does): their addresses, and whatever of the interface is left.
pub(super) async fn release_addresses(dir: &Path, ids: &[&str]) -> Result<()> {
    let path = dir.join("net.d").join(CNI_LIST);
    let text = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let list: serde_json::Value =
        serde_json::from_slice(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let plugins = list["plugins"].as_array().cloned().unwrap_or_default();
    for id in ids {
        // In reverse order, as CNI deletes a list.
        for plugin in plugins.iter().rev() {
            let mut conf = plugin.clone();
            conf["name"] = list["name"].clone();
            conf["cniVersion"] = list["cniVersion"].clone();
            let kind = conf["type"].as_str().unwrap_or_default().to_owned();
            let mut child = Command::new(Path::new(CNI_PLUGINS).join(&kind))
                .env("CNI_COMMAND", "DEL")
                // `ctr` names a machine to CNI as NAMESPACE-ID.
                .env("CNI_CONTAINERID", format!("{NAMESPACE}-{id}"))
                .env("CNI_NETNS", "")
                .env("CNI_IFNAME", "eth0")
                .env("CNI_PATH", CNI_PLUGINS)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("cannot run the CNI plugin {kind}"))?;
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(conf.to_string().as_bytes()).await?;
            }
            let out = child.wait_with_output().await?;
            if !out.status.success() {
                bail!(
                    "CNI DEL of {id} by {kind} failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout).trim()
                );
            }
        }
    }
    Ok(())
}

/// The wrapper that shows `ctr` a directory of the benchmark's as `/etc/cni/net.d`: `$0` is
/// the directory holding it (as `net.d`), the rest the command.
const CNI_WRAPPER: &str = "mount --bind \"$0/net.d\" /etc/cni/net.d && exec \"$@\"";

/// [`CNI_WRAPPER`] for a `ctr` that finds CNI plugins only in `/opt/cni/bin` (sid's): `/opt`
/// is the directory's `opt` too, where `cni/bin` leads to Debian's plugins. Nothing of the
/// host's `/opt` changes: the mount is in the wrapper's namespace alone.
pub(super) const CNI_WRAPPER_OPT: &str = "mount --bind \"$0/net.d\" /etc/cni/net.d && \
    mount --bind \"$0/opt\" /opt && exec \"$@\"";

impl Raw {
    /// The CNI wrapper this client needs.
    pub(super) fn wrapper(&self) -> &'static str {
        match self.plugins_in_opt {
            true => CNI_WRAPPER_OPT,
            false => CNI_WRAPPER,
        }
    }

    /// Gives the raw side's machines `network` from now on; the first call wins.
    pub fn adopt(&self, network: RawNetwork) {
        let _ = self.network.set(network);
    }

    /// The directory of the CNI configuration `ctr run` and `ctr task rm` must see (`net.d`,
    /// and `opt`), when there is one.
    pub(super) fn cni_dir(&self) -> Option<&Path> {
        match self.network.get() {
            Some(RawNetwork::Cni(dir)) => Some(dir.path()),
            _ => None,
        }
    }

    /// The network the daemon gave environment `environment`'s machine, for the raw side to
    /// use too: on containerd its CNI network list (written under `state_dir/net`), on Docker
    /// the network the machine joined.
    pub async fn network_like(&self, environment: &str, state_dir: &Path) -> Result<RawNetwork> {
        match self.backend {
            Backend::Containerd => {
                let net = state_dir.join("net");
                let lists: Vec<_> = match std::fs::read_dir(&net) {
                    Ok(entries) => entries
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|x| x == "conflist"))
                        .collect(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                    Err(e) => return Err(e).context(format!("cannot read {}", net.display())),
                };
                match lists.as_slice() {
                    [] => Ok(RawNetwork::Host),
                    [list] => {
                        let dir = tempfile::Builder::new()
                            .prefix("narya-bench-cni-")
                            .tempdir()
                            .context("cannot make the raw side's CNI directory")?;
                        let net_d = dir.path().join("net.d");
                        std::fs::create_dir(&net_d)?;
                        std::fs::copy(list, net_d.join(CNI_LIST))
                            .with_context(|| format!("cannot copy {}", list.display()))?;
                        if self.plugins_in_opt {
                            let opt = dir.path().join("opt/cni");
                            std::fs::create_dir_all(&opt)?;
                            std::os::unix::fs::symlink(CNI_PLUGINS, opt.join("bin"))?;
                        }
                        if !Path::new("/etc/cni/net.d").is_dir() {
                            // Only the mount point: what `ctr` reads there is the bench's.
                            std::fs::create_dir_all("/etc/cni/net.d")
                                .context("cannot make /etc/cni/net.d to mount over")?;
                        }
                        Ok(RawNetwork::Cni(dir))
                    }
                    _ => bail!(
                        "{} holds {} network lists, not one",
                        net.display(),
                        lists.len()
                    ),
                }
            }
            Backend::Docker => {
                let machine = self.machine_of(environment).await?;
                let format = "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}";
                let out = self.run(&["inspect", "--format", format, &machine]).await?;
                match out.split_whitespace().collect::<Vec<_>>().as_slice() {
                    ["host"] => Ok(RawNetwork::Host),
                    [name] => Ok(RawNetwork::Bridge((*name).to_owned())),
                    names => bail!("machine {machine} is on {names:?}, not on one network"),
                }
            }
        }
    }

    /// What the CNI wrapper alone costs: one run of it around `true`. `None` without CNI.
    pub async fn wrapper_alone(&self) -> Result<Option<Duration>> {
        let Some(dir) = self.cni_dir() else {
            return Ok(None);
        };
        let start = std::time::Instant::now();
        let status = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(self.wrapper())
            .arg(dir)
            .arg("true")
            .stdin(Stdio::null())
            .status()
            .await
            .context("cannot run unshare")?;
        let took = start.elapsed();
        if !status.success() {
            bail!("the CNI wrapper around `true` failed ({status})");
        }
        Ok(Some(took))
    }
}
