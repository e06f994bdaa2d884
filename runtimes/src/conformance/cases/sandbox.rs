//! The sandbox group, run only under `sandbox = "gvisor"`: a machine's processes talk to a
//! kernel that is not the host's. What they read of "the kernel" is gVisor's, the host kernel's
//! own interfaces are not there, and a system call gVisor does not implement is answered by
//! gVisor, never by the host's kernel.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{check, fail, text, CaseFn, Context, Outcome};
use crate::{Network, ProcessSpec, ThrowawaySpec};

pub(super) fn all() -> Vec<(&'static str, &'static str, CaseFn)> {
    vec![
        case!("sandbox", the_kernel_a_machine_sees_is_not_the_hosts),
        case!("sandbox", host_kernel_interfaces_are_absent),
        case!("sandbox", an_unimplemented_syscall_never_reaches_the_host),
        case!(
            "sandbox",
            a_throwaway_on_the_hosts_network_leaves_the_hosts_addresses
        ),
    ]
}

/// `fanotify_init`: the host's kernel implements it (it answers bad arguments with `EINVAL`);
/// gVisor does not, and answers `ENOSYS` itself. (Under runc the seccomp filter refuses it with
/// `EPERM`.)
const FANOTIFY_INIT: i64 = 300;

/// Python run in the machine: calls syscall `sys.argv[1]` with bad arguments and prints its
/// errno's name.
const CALL: &str = "import ctypes, errno, sys\n\
libc = ctypes.CDLL(None, use_errno=True)\n\
r = libc.syscall(int(sys.argv[1]), -1, 0, 0, 0, 0, 0)\n\
print('errno=' + (errno.errorcode.get(ctypes.get_errno(), '?') if r < 0 else 'none'))\n";

async fn the_kernel_a_machine_sees_is_not_the_hosts(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let out = c.sh(&id, "uname -r; cat /proc/version").await?;
    let inside = text(&out);
    check(out.exit_code == Some(0), || {
        format!("reading the kernel's version failed: {inside}")
    })?;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?
        .trim()
        .to_owned();
    let version = std::fs::read_to_string("/proc/version")?;
    let mut lines = inside.lines();
    let seen_release = lines.next().unwrap_or_default();
    let seen_version = lines.next().unwrap_or_default();
    check(seen_release != release, || {
        format!("uname -r in the machine is the host's own ({release})")
    })?;
    check(seen_version.trim() != version.trim(), || {
        format!("/proc/version in the machine is the host's own: {seen_version}")
    })?;
    check(!inside.contains(&release), || {
        format!("the machine's kernel names the host's release {release}: {inside}")
    })
}

async fn host_kernel_interfaces_are_absent(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    // The kernel's symbol table: a container on the host's kernel sees the file (zeroed
    // addresses without CAP_SYSLOG, but every symbol of the host's kernel by name).
    let out = c
        .sh(
            &id,
            "if [ -e /proc/kallsyms ]; then echo kallsyms=$(wc -l < /proc/kallsyms 2>/dev/null || echo unreadable); else echo kallsyms=absent; fi",
        )
        .await?;
    let kallsyms = text(&out);
    check(
        kallsyms.contains("kallsyms=absent")
            || kallsyms.contains("kallsyms=0")
            || kallsyms.contains("kallsyms=unreadable"),
        || format!("/proc/kallsyms has the host kernel's symbols: {kallsyms}"),
    )?;
    // The kernel's log: what the machine reads must be none of the host's.
    let out = c.sh(&id, "dmesg 2>&1 | head -n 200").await?;
    let inside = text(&out);
    let host = std::process::Command::new("dmesg")
        .output()
        .map_err(|e| fail(format!("running the host's dmesg: {e}")))?;
    let host = String::from_utf8_lossy(&host.stdout).into_owned();
    let shared: Vec<&str> = host
        .lines()
        .filter_map(|line| line.split_once("] ").map(|(_, message)| message.trim()))
        .filter(|message| message.len() > 16)
        .filter(|message| inside.contains(*message))
        .take(3)
        .collect();
    check(shared.is_empty(), || {
        format!("the machine reads the host kernel's log: {shared:?}")
    })
}

async fn an_unimplemented_syscall_never_reaches_the_host(c: &Context<'_>) -> Result<(), Outcome> {
    // The host's kernel implements the call: anything but ENOSYS from it.
    // SAFETY: bad flags, no pointers: the kernel refuses the call before touching memory.
    let host = unsafe { nix::libc::syscall(FANOTIFY_INIT, -1i64, 0i64) };
    let host_errno = std::io::Error::last_os_error();
    check(
        host == -1 && host_errno.raw_os_error() != Some(nix::libc::ENOSYS),
        || {
            format!("the host's kernel does not implement fanotify_init ({host_errno}): the case cannot tell the two kernels apart")
        },
    )?;
    let (id, _) = c.machine(0).await?;
    let script = format!("python3 -c \"$CALL\" {FANOTIFY_INIT}");
    let out = c
        .run(
            &id,
            &script,
            [("CALL".to_owned(), CALL.to_owned())].into(),
            None,
            std::time::Duration::from_secs(60),
            1 << 16,
        )
        .await?;
    let seen = text(&out);
    if seen.contains("python3: not found") {
        return Err(Outcome::Skip(
            "the image has no python3 to make a raw system call".into(),
        ));
    }
    check(seen.contains("errno=ENOSYS"), || {
        format!("fanotify_init in the machine did not meet a kernel that lacks it (the host's answers {host_errno}): {seen}")
    })
}

/// The host's interfaces and their addresses, one line each, as `ip -o addr` prints them.
fn host_addresses() -> Result<Vec<String>, Outcome> {
    let out = std::process::Command::new("ip")
        .args(["-o", "addr", "show"])
        .output()
        .map_err(|e| fail(format!("running the host's ip: {e}")))?;
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        // Interface, family and address: what netstack would take; not lifetimes or veths that
        // other tests make and remove meanwhile.
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (name, family, address) = (fields.get(1)?, fields.get(2)?, fields.get(3)?);
            (!name.starts_with("veth") && !name.starts_with("nry-"))
                .then(|| format!("{name} {family} {address}"))
        })
        .collect();
    lines.sort();
    Ok(lines)
}

/// A clone's throwaway shares the host's network. With gVisor's own network stack there, runsc
/// would take the host's addresses into the sandbox (its check for the host's namespace fails
/// on Linux 6.11 and later); it must get `--network=host` instead, and still run under gVisor.
async fn a_throwaway_on_the_hosts_network_leaves_the_hosts_addresses(
    c: &Context<'_>,
) -> Result<(), Outcome> {
    let before = host_addresses()?;
    let name = c.machine_id(0);
    let workspace = c.workspace(&name)?;
    let outcome = c
        .runtime
        .run_throwaway(&ThrowawaySpec {
            name: name.clone(),
            image: c.pinned().await?,
            workspace,
            mount_point: c.fixture.mount_point.clone(),
            user: c.fixture.user,
            network: Network::Host,
            environment: name.clone(),
            organisation: "conformance".to_owned(),
            limits: c.fixture.limits,
            process: ProcessSpec {
                argv: vec!["/bin/sh".into(), "-c".into(), "uname -r".into()],
                env: BTreeMap::new(),
                cwd: None,
                timeout: Duration::from_secs(60),
                output_limit: 4096,
                stdin: None,
                output: None,
            },
        })
        .await?;
    let after = host_addresses()?;
    check(before == after, || {
        format!("the host's addresses changed: before {before:?}, after {after:?}")
    })?;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let seen = text(&outcome);
    check(outcome.exit_code == Some(0), || {
        format!("the throwaway failed: {seen}")
    })?;
    check(seen.trim() != release.trim(), || {
        format!("the throwaway ran on the host's kernel ({seen})")
    })
}
