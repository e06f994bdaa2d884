//! This daemon's iptables chains: written whole with `iptables-restore --noflush` (declaring a
//! chain there empties it, so a restart refills rather than appends), with one jump into each
//! from INPUT, FORWARD and nat POSTROUTING. Nothing else of the host's rules is touched, but for
//! jumps into the forward chain from the chains engines keep for their users' rules, evaluated
//! before their own, which they insert at the top of FORWARD later than ours:
//! - `DOCKER-USER`, where a Docker Engine with its own iptables rules runs: that engine inserts
//!   its bridge rules at the top of FORWARD whenever it makes a network or starts (among them an
//!   ACCEPT of everything leaving a bridge, which would pass traffic to link-local addresses and
//!   other subnets before our chain sees it), and promises to evaluate `DOCKER-USER` first and
//!   never to change it.
//! - `CNI-ADMIN`, on bridged networks: CNI's firewall plugin (Podman 4's networks) inserts its
//!   `CNI-FORWARD` jump at the top of FORWARD when it first starts a container on a host, with an
//!   ACCEPT of everything from each container, so machines on one network would reach each other.
//!   `CNI-FORWARD` jumps to `CNI-ADMIN` ("admin overrides") first; the plugin makes that chain only
//!   when it is missing and never changes it, so the daemon makes it ahead of the plugin.

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::Subnet;
use crate::{ErrorKind, Result, RuntimeError};

/// Link-local addresses, the cloud metadata service among them.
const LINK_LOCAL: &str = "169.254.0.0/16";

/// The chain in `table` hooked from `hook`, for `tag`.
fn chains(tag: &str) -> [(&'static str, &'static str, String); 3] {
    [
        ("filter", "INPUT", format!("NARYA-IN-{tag}")),
        ("filter", "FORWARD", format!("NARYA-FWD-{tag}")),
        ("nat", "POSTROUTING", format!("NARYA-NAT-{tag}")),
    ]
}

/// The Docker Engine's chain for its users' rules, evaluated first in FORWARD (when it exists).
const DOCKER_USER: &str = "DOCKER-USER";

/// CNI's firewall plugin's chain for the administrator's rules, evaluated first in its own.
const CNI_ADMIN: &str = "CNI-ADMIN";

/// The chains that get a jump into our forward chain besides FORWARD, where they exist.
const USER_CHAINS: [&str; 2] = [DOCKER_USER, CNI_ADMIN];

/// The `iptables-restore` input; `missing_jumps` are the hooks with no jump to ours yet
/// (the [`USER_CHAINS`] among them only where the chain exists).
pub(super) fn rules(tag: &str, subnet: Subnet, missing_jumps: &[&str]) -> String {
    let [(_, _, input), (_, _, forward), (_, _, nat)] = chains(tag);
    let jump = |hook: &str, chain: &str| {
        if missing_jumps.contains(&hook) {
            format!("-I {hook} 1 -j {chain}\n")
        } else {
            String::new()
        }
    };
    let forward_jumps: String = std::iter::once("FORWARD")
        .chain(USER_CHAINS)
        .map(|hook| jump(hook, &forward))
        .collect();
    format!(
        "*filter\n\
         :{input} - [0:0]\n\
         :{forward} - [0:0]\n\
         -A {input} -s {subnet} -j DROP\n\
         -A {forward} -s {subnet} -d {subnet} -j DROP\n\
         -A {forward} -s {subnet} -d {LINK_LOCAL} -j DROP\n\
         -A {forward} -s {subnet} -j ACCEPT\n\
         -A {forward} -d {subnet} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
         -A {forward} -d {subnet} -j DROP\n\
         {}{}COMMIT\n\
         *nat\n\
         :{nat} - [0:0]\n\
         -A {nat} -s {subnet} ! -d {subnet} -j MASQUERADE\n\
         {}COMMIT\n",
        jump("INPUT", &input),
        forward_jumps,
        jump("POSTROUTING", &nat),
    )
}

async fn iptables(args: &[&str]) -> std::io::Result<std::process::Output> {
    Command::new("iptables")
        .arg("-w")
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
}

fn failed(what: &str, e: impl Into<crate::Cause>) -> RuntimeError {
    RuntimeError::caused(ErrorKind::Other, format!("network: {what}"), e)
}

/// Puts the chains of `tag` in place for `subnet`; `bridged` (an engine's networks) also makes
/// `CNI-ADMIN` when it is missing. Other daemons (and other programs) change the ruleset at the
/// same time; a restore that lost such a race is tried again.
pub(super) async fn apply(tag: &str, subnet: Subnet, bridged: bool) -> Result<()> {
    let mut tries = 0;
    loop {
        tries += 1;
        match apply_once(tag, subnet, bridged).await {
            Err(e) if tries < 5 => {
                tracing::debug!(tag, error = %e, "network: applying the chains again");
                tokio::time::sleep(std::time::Duration::from_millis(200 * tries)).await;
            }
            done => return done,
        }
    }
}

async fn apply_once(tag: &str, subnet: Subnet, bridged: bool) -> Result<()> {
    let mut missing = Vec::new();
    for (table, hook, chain) in chains(tag) {
        let checked = iptables(&["-t", table, "-C", hook, "-j", &chain])
            .await
            .map_err(|e| failed("running iptables (is it installed?)", e))?;
        if !checked.status.success() {
            missing.push(hook);
        }
    }
    let [_, (_, _, forward), _] = chains(tag);
    if bridged {
        // Made by another at the same moment is as good: the check below finds it.
        let _ = iptables(&["-t", "filter", "-N", CNI_ADMIN]).await;
    }
    for user in USER_CHAINS {
        let exists = iptables(&["-t", "filter", "-S", user])
            .await
            .map_err(|e| failed("running iptables", e))?;
        if !exists.status.success() {
            continue;
        }
        let checked = iptables(&["-t", "filter", "-C", user, "-j", &forward])
            .await
            .map_err(|e| failed("running iptables", e))?;
        if !checked.status.success() {
            missing.push(user);
        }
    }
    let input = rules(tag, subnet, &missing);
    let mut child = Command::new("iptables-restore")
        .args(["-w", "--noflush"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| failed("running iptables-restore", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .await
            .map_err(|e| failed("writing to iptables-restore", e))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| failed("running iptables-restore", e))?;
    if !out.status.success() {
        return Err(RuntimeError::plain(
            ErrorKind::Other,
            format!(
                "network: iptables-restore refused the chains of {tag}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    tracing::info!(tag, %subnet, "network: firewall chains in place");
    Ok(())
}

/// Removes the chains of `tag` and every jump into them; what is gone already is fine.
pub(super) async fn remove(tag: &str) {
    let owned = tag.to_owned();
    let _ = tokio::task::spawn_blocking(move || remove_now(&owned)).await;
    tracing::info!(tag, "network: firewall chains removed");
}

/// As `remove`, blocking: also what tests call to clear what a killed daemon left.
pub fn remove_now(tag: &str) {
    for (table, hook, chain) in chains(tag) {
        let iptables = |args: &[&str]| {
            std::process::Command::new("iptables")
                .args(["-w", "-t", table])
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let hooks: &[&str] = if hook == "FORWARD" {
            &[hook, DOCKER_USER, CNI_ADMIN]
        } else {
            &[hook]
        };
        for hook in hooks {
            // A jump added twice (by hand, or by a daemon killed between check and restore)
            // goes too.
            for _ in 0..8 {
                if !iptables(&["-D", hook, "-j", &chain]) {
                    break;
                }
            }
        }
        iptables(&["-F", &chain]);
        iptables(&["-X", &chain]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_cover_host_peers_link_local_and_masquerade() {
        let subnet: Subnet = "10.89.0.0/16".parse().unwrap();
        let text = rules("abc", subnet, &["FORWARD"]);
        assert!(text.contains("-A NARYA-IN-abc -s 10.89.0.0/16 -j DROP\n"));
        assert!(text.contains("-A NARYA-FWD-abc -s 10.89.0.0/16 -d 10.89.0.0/16 -j DROP\n"));
        assert!(text.contains("-d 169.254.0.0/16 -j DROP\n"));
        assert!(text.contains("-A NARYA-NAT-abc -s 10.89.0.0/16 ! -d 10.89.0.0/16 -j MASQUERADE\n"));
        assert!(text.contains("-I FORWARD 1 -j NARYA-FWD-abc\n"));
        assert!(!text.contains("-I INPUT"));
        assert!(!text.contains("-I POSTROUTING"));
        assert!(!text.contains("-I DOCKER-USER"));
    }

    #[test]
    fn a_docker_engines_user_chain_gets_a_jump_into_the_forward_chain() {
        let subnet: Subnet = "10.89.0.0/16".parse().unwrap();
        let text = rules("abc", subnet, &["DOCKER-USER"]);
        assert!(text.contains("-I DOCKER-USER 1 -j NARYA-FWD-abc\n"));
        assert!(!text.contains("-I FORWARD"));
    }

    #[test]
    fn cnis_admin_chain_gets_a_jump_into_the_forward_chain() {
        let subnet: Subnet = "10.89.0.0/16".parse().unwrap();
        let text = rules("abc", subnet, &["FORWARD", "CNI-ADMIN"]);
        assert!(text.contains("-I FORWARD 1 -j NARYA-FWD-abc\n"));
        assert!(text.contains("-I CNI-ADMIN 1 -j NARYA-FWD-abc\n"));
        assert!(!text.contains("-I DOCKER-USER"));
    }
}
