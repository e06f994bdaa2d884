//! What the raw runtime holds, asked through its client: the daemon's machines by label, the
//! running machines, the image the daemon pinned, and the runtime's version.

use std::collections::BTreeSet;

use anyhow::{bail, Result};

use super::{Backend, Raw, LABEL_ENVIRONMENT};

impl Raw {
    /// The runtime's name of the one machine labelled as environment `environment`'s: the
    /// daemon names machines itself, and the label is what it promises to set.
    pub async fn machine_of(&self, environment: &str) -> Result<String> {
        let out = match self.backend {
            Backend::Containerd => {
                let filter = format!("labels.\"{LABEL_ENVIRONMENT}\"=={environment}");
                self.run(&["containers", "ls", "-q", &filter]).await?
            }
            Backend::Docker => {
                let filter = format!("label={LABEL_ENVIRONMENT}={environment}");
                self.run(&["ps", "-a", "--filter", &filter, "--format", "{{.Names}}"])
                    .await?
            }
        };
        let names: Vec<&str> = out.split_whitespace().collect();
        match names.as_slice() {
            [name] => Ok((*name).to_owned()),
            _ => bail!(
                "{} holds {} machines labelled {LABEL_ENVIRONMENT}={environment}, not one: {names:?}",
                self.backend.name(),
                names.len()
            ),
        }
    }

    /// How many machines whose name starts with `prefix` are running.
    pub async fn running(&self, prefix: &str) -> Result<usize> {
        match self.backend {
            Backend::Containerd => Ok(self
                .running_tasks()
                .await?
                .iter()
                .filter(|id| id.starts_with(prefix))
                .count()),
            Backend::Docker => {
                let out = self.run(&["ps", "--format", "{{.Names}}"]).await?;
                Ok(out.lines().filter(|n| n.starts_with(prefix)).count())
            }
        }
    }

    /// How many of the daemon's machines are running for environments whose identifier starts
    /// with `prefix`: the daemon names its machines itself, so they are found by label.
    pub async fn running_for_environments(&self, prefix: &str) -> Result<usize> {
        match self.backend {
            Backend::Containerd => {
                let filter = format!("labels.\"{LABEL_ENVIRONMENT}\"~=\"^{prefix}\"");
                let machines = self.run(&["containers", "ls", "-q", &filter]).await?;
                let running = self.running_tasks().await?;
                Ok(machines
                    .split_whitespace()
                    .filter(|m| running.contains(*m))
                    .count())
            }
            Backend::Docker => {
                let filter = format!("label={LABEL_ENVIRONMENT}");
                let format = format!("{{{{.Label \"{LABEL_ENVIRONMENT}\"}}}}");
                let out = self
                    .run(&["ps", "--filter", &filter, "--format", &format])
                    .await?;
                Ok(out.lines().filter(|e| e.starts_with(prefix)).count())
            }
        }
    }

    /// The names of containerd's running tasks.
    async fn running_tasks(&self) -> Result<BTreeSet<String>> {
        let out = self.run(&["task", "ls"]).await?;
        Ok(out
            .lines()
            .skip(1)
            .filter_map(
                |line| match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                    [id, _pid, "RUNNING", ..] => Some((*id).to_owned()),
                    _ => None,
                },
            )
            .collect())
    }

    /// The local name of the image the daemon pinned to `digest` (`sha256:…`).
    pub async fn image_for(&self, digest: &str) -> Result<String> {
        let (listing, wanted) = match self.backend {
            Backend::Containerd => (
                self.run(&["images", "ls", "-q"]).await?,
                format!("narya.local/official@{digest}"),
            ),
            Backend::Docker => (
                self.run(&["images", "--format", "{{.Repository}}:{{.Tag}}"])
                    .await?,
                format!(
                    "narya.local/official:{}",
                    digest.strip_prefix("sha256:").unwrap_or(digest)
                ),
            ),
        };
        if listing.lines().any(|l| l.trim() == wanted) {
            Ok(wanted)
        } else {
            bail!(
                "the daemon pinned {digest}, but {} holds no image {wanted}",
                self.backend.name()
            )
        }
    }

    /// The runtime's server version, for the report.
    pub async fn version(&self) -> String {
        self.server_version()
            .await
            .unwrap_or_else(|e| format!("unknown ({e})"))
    }

    /// The runtime's server version, or why it did not answer.
    pub async fn server_version(&self) -> Result<String> {
        match self.backend {
            Backend::Containerd => self.run(&["version"]).await.map(|out| {
                // The second "Version:" is the server's.
                out.lines()
                    .filter_map(|l| l.trim().strip_prefix("Version:"))
                    .nth(1)
                    .unwrap_or("?")
                    .trim()
                    .to_owned()
            }),
            Backend::Docker => self
                .run(&["version", "--format", "{{.Server.Version}}"])
                .await
                .map(|out| out.trim().to_owned()),
        }
    }
}
