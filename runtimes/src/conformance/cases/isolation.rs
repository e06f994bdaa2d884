//! The isolation group: what a machine's processes cannot do, and the `[limits]` holding, as
//! seen from inside. Cgroup files are read as cgroup v2 (`memory.max`, `pids.max`, `cpu.max`)
//! or, on a v1 or hybrid host, per controller (`memory/memory.limit_in_bytes`, …).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{check, fail, text, CaseFn, Context, Outcome};
use crate::{MachineState, ProcessSpec, ThrowawaySpec, OOM_SCORE_ADJ};

pub(super) fn all() -> Vec<(&'static str, &'static str, CaseFn)> {
    vec![
        case!("isolation", seccomp_filter_is_on),
        case!("isolation", new_user_namespaces_are_refused),
        case!("isolation", mounts_and_the_keyring_are_refused),
        case!("isolation", io_uring_is_refused),
        case!("isolation", processes_have_no_capabilities),
        case!("isolation", limits_read_inside_equal_the_configuration),
        case!("isolation", cgroup_view_is_private),
        case!("isolation", tmp_is_bounded),
        case!(
            "isolation",
            the_writable_layer_shares_the_workspaces_disk_bound
        ),
        case!("isolation", pids_limit_holds_and_the_machine_recovers),
        case!("isolation", memory_limit_kills_inside_only),
        case!("isolation", throwaway_is_bounded_and_filtered_too),
    ]
}

/// Prints `name=value` lines: the cgroup limits as the kernel holds them, whichever cgroup
/// version, plus the process's own bounds.
const READ_LIMITS: &str = r#"
c=/sys/fs/cgroup
if [ -f $c/memory/memory.limit_in_bytes ]; then
  echo "memory=$(cat $c/memory/memory.limit_in_bytes)"
  echo "pids=$(cat $c/pids/pids.max)"
  echo "cpu=$(cat $c/cpu/cpu.cfs_quota_us) $(cat $c/cpu/cpu.cfs_period_us)"
else
  echo "memory=$(cat $c/memory.max)"
  echo "pids=$(cat $c/pids.max)"
  echo "cpu=$(cat $c/cpu.max)"
fi
echo "nofile=$(ulimit -Sn) $(ulimit -Hn)"
echo "oom=$(cat /proc/self/oom_score_adj)"
echo "seccomp=$(grep '^Seccomp:' /proc/self/status | tr -d ' \t' | cut -d: -f2)"
"#;

/// Under gVisor: the limits on the host cgroup of the sandbox whose host pid is `pid`, and its
/// `oom_score_adj`, as [`READ_LIMITS`] names them.
fn host_limits(pid: u32) -> Result<BTreeMap<String, String>, Outcome> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let path_of = |controller: &str| {
        cgroups.lines().find_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            controllers
                .split(',')
                .any(|c| c == controller)
                .then(|| path.to_owned())
        })
    };
    let read = |path: String| {
        std::fs::read_to_string(&path)
            .map(|t| t.trim().to_owned())
            .map_err(|e| fail(format!("{path}: {e}")))
    };
    let root = "/sys/fs/cgroup";
    let mut seen = BTreeMap::new();
    if let Some(memory) = path_of("memory") {
        let cpu = path_of("cpu").unwrap_or_default();
        let pids = path_of("pids").unwrap_or_default();
        seen.insert(
            "memory".to_owned(),
            read(format!("{root}/memory{memory}/memory.limit_in_bytes"))?,
        );
        seen.insert(
            "pids".to_owned(),
            read(format!("{root}/pids{pids}/pids.max"))?,
        );
        let quota = read(format!("{root}/cpu{cpu}/cpu.cfs_quota_us"))?;
        let period = read(format!("{root}/cpu{cpu}/cpu.cfs_period_us"))?;
        seen.insert("cpu".to_owned(), format!("{quota} {period}"));
    } else {
        let path = cgroups
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .ok_or_else(|| fail(format!("pid {pid} is in no cgroup: {cgroups:?}")))?;
        seen.insert(
            "memory".to_owned(),
            read(format!("{root}{path}/memory.max"))?,
        );
        seen.insert("pids".to_owned(), read(format!("{root}{path}/pids.max"))?);
        seen.insert("cpu".to_owned(), read(format!("{root}{path}/cpu.max"))?);
    }
    seen.insert(
        "oom".to_owned(),
        read(format!("/proc/{pid}/oom_score_adj"))?,
    );
    Ok(seen)
}

/// The `name=value` lines of `output`.
fn values(output: &str) -> BTreeMap<String, String> {
    output
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

impl Context<'_> {
    /// The `name=value` pairs [`READ_LIMITS`] prints, read in machine `id`.
    async fn limits_inside(&self, id: &str) -> Result<BTreeMap<String, String>, Outcome> {
        let out = self.sh(id, READ_LIMITS).await?;
        check(out.exit_code == Some(0), || {
            format!("reading the limits failed: {}", text(&out))
        })?;
        Ok(values(&text(&out)))
    }

    /// What a process in machine `id` must see for the fixture's limits.
    fn expected_limits(&self) -> BTreeMap<String, String> {
        let limits = &self.fixture.limits;
        BTreeMap::from([
            ("memory".to_owned(), limits.memory.to_string()),
            ("pids".to_owned(), limits.pids.to_string()),
            (
                "cpu".to_owned(),
                format!(
                    "{} {}",
                    limits.cpu_quota_us(),
                    narya_oci::spec::CPU_PERIOD_US
                ),
            ),
            (
                "nofile".to_owned(),
                format!("{} {}", limits.nofile, limits.nofile),
            ),
            ("oom".to_owned(), OOM_SCORE_ADJ.to_string()),
            ("seccomp".to_owned(), "2".to_owned()),
        ])
    }

    /// Waits (generously: the host may be loaded) until machine `id` runs a process again.
    async fn answers_again(&self, id: &str) -> Result<(), Outcome> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.sh(id, "echo ok").await {
                Ok(out) if text(&out) == "ok\n" => return Ok(()),
                seen if Instant::now() > deadline => {
                    return Err(fail(format!("{id} no longer runs processes: {seen:?}")))
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
}

async fn seccomp_filter_is_on(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    for pid in ["1", "self"] {
        let out = c
            .sh(&id, &format!("grep '^Seccomp:' /proc/{pid}/status"))
            .await?;
        let mode = text(&out).split_whitespace().nth(1).map(str::to_owned);
        check(mode.as_deref() == Some("2"), || {
            format!("/proc/{pid}: {:?}, expected filter mode 2", text(&out))
        })?;
    }
    Ok(())
}

async fn new_user_namespaces_are_refused(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let out = c
        .sh(
            &id,
            "command -v unshare >/dev/null || { echo no-unshare; exit 0; }; unshare -Ur id; echo \"unshare=$?\"",
        )
        .await?;
    let t = text(&out);
    check(!t.contains("no-unshare"), || {
        "the image has no unshare to try with".to_owned()
    })?;
    check(!t.contains("uid=0") && !t.contains("unshare=0"), || {
        format!("a new user namespace was made: {t:?}")
    })
}

async fn mounts_and_the_keyring_are_refused(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    // A mount needs a namespace of its own or a capability; both are refused. The keyring is
    // reached through /proc/keys (masked) and keyctl (filtered); util-linux has no keyctl, so
    // the masked file stands for it.
    let out = c
        .sh(
            &id,
            "mkdir -p /tmp/m; mount -t tmpfs none /tmp/m 2>&1; echo \"mount=$?\"; \
             unshare -m true 2>&1; echo \"unshare=$?\"; \
             [ -n \"$(cat /proc/keys 2>/dev/null)\" ] && echo keys-visible; echo done",
        )
        .await?;
    let seen = values(&text(&out));
    check(seen.get("mount").is_some_and(|v| v != "0"), || {
        format!("a mount succeeded: {:?}", text(&out))
    })?;
    check(seen.get("unshare").is_some_and(|v| v != "0"), || {
        format!("a mount namespace was made: {:?}", text(&out))
    })?;
    check(!text(&out).contains("keys-visible"), || {
        "the kernel keyring is readable in /proc/keys".to_owned()
    })
}

/// `io_uring_setup` (425 on every architecture with the common numbering) answers `EPERM`
/// from the filter, not a ring, nor `ENOSYS` from a kernel without it. Perl, in every Debian
/// root, makes the raw call.
async fn io_uring_is_refused(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let out = c
        .sh(
            &id,
            "perl -e 'my $p = \"\\0\" x 120; my $r = syscall(425, 8, $p); printf \"ring=%d\\nerrno=%d\\n\", $r, $!+0'",
        )
        .await?;
    let seen = values(&text(&out));
    check(
        seen.get("ring").map(String::as_str) == Some("-1")
            && (seen.get("errno").map(String::as_str) == Some("1")
                // gVisor does not implement io_uring: refused before any kernel has it.
                || c.gvisor() && seen.get("errno").map(String::as_str) == Some("38")),
        || {
            format!(
                "io_uring_setup was not refused with EPERM: {:?}",
                text(&out)
            )
        },
    )
}

async fn processes_have_no_capabilities(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let out = c
        .sh(&id, "grep -E '^(Cap|NoNewPrivs)' /proc/self/status")
        .await?;
    let status = text(&out);
    for (field, want) in [
        ("CapInh:", "0000000000000000"),
        ("CapPrm:", "0000000000000000"),
        ("CapEff:", "0000000000000000"),
        ("CapBnd:", "0000000000000000"),
        ("CapAmb:", "0000000000000000"),
        ("NoNewPrivs:", "1"),
    ] {
        let seen = status
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1));
        // gVisor has no ambient capabilities at all, and keeps no-new-privs out of the status.
        match (seen, field) {
            (None, "CapAmb:") if c.gvisor() => continue,
            (None, "NoNewPrivs:") if c.gvisor() => {
                let asked = c.no_new_privs(&id).await?;
                check(asked == want, || {
                    format!("prctl(PR_GET_NO_NEW_PRIVS) {asked:?}")
                })?;
                continue;
            }
            _ => {}
        }
        check(seen == Some(want), || {
            format!("{field} {seen:?}, expected {want}")
        })?;
    }
    Ok(())
}

async fn limits_read_inside_equal_the_configuration(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let mut seen = c.limits_inside(&id).await?;
    if c.gvisor() {
        // gVisor's cgroup files inside are its own and hold no limit: the limits sit on the
        // sandbox's cgroup on the host, read there.
        let init = c
            .runtime
            .init_pid(&id)
            .await?
            .ok_or_else(|| fail("a running machine has no init pid"))?;
        seen.extend(host_limits(init)?);
        // No filter inside gVisor (a known gap of seccomp_filter_is_on).
        seen.remove("seccomp");
        let mut want = c.expected_limits();
        want.remove("seccomp");
        return check(seen == want, || {
            format!("on the host and inside: {seen:?}; configured: {want:?}")
        });
    }
    let want = c.expected_limits();
    check(seen == want, || {
        format!("inside: {seen:?}; configured: {want:?}")
    })?;
    // The machine's init carries the same oom_score_adj as its execs.
    let init = c.sh(&id, "cat /proc/1/oom_score_adj").await?;
    check(text(&init).trim() == OOM_SCORE_ADJ.to_string(), || {
        format!("init's oom_score_adj is {:?}", text(&init))
    })
}

async fn cgroup_view_is_private(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let (other, _) = c.machine(1).await?;
    // In a cgroup namespace every hierarchy's path is its root: `0::/`, `4:memory:/`. gVisor's
    // cgroup filesystem is its own, not the host's: in it, the machine's cgroup is one level
    // under the root, named as the runtime named it (the machine's or the engine's id).
    let out = c.sh(&id, "cat /proc/self/cgroup").await?;
    let own = text(&out);
    let one_level = |path: &str| path.len() > 1 && path.matches('/').count() == 1;
    let rooted = own
        .lines()
        .all(|l| l.ends_with(":/") || c.gvisor() && l.rsplit(':').next().is_some_and(one_level));
    check(!own.trim().is_empty() && rooted, || {
        format!("/proc/self/cgroup shows the host's tree: {own:?}")
    })?;
    // No other machine appears anywhere in the cgroup filesystem it sees.
    let listing = c
        .sh(
            &id,
            &format!("find /sys/fs/cgroup -maxdepth 4 -name '*{other}*' 2>/dev/null; echo listed"),
        )
        .await?;
    let listing = text(&listing);
    check(listing.trim() == "listed", || {
        format!("another machine is visible: {listing:?}")
    })
}

async fn tmp_is_bounded(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let tmp_mib = c.fixture.limits.tmp >> 20;
    let out = c
        .sh(
            &id,
            &format!(
                "grep ' /tmp ' /proc/mounts; \
                 dd if=/dev/zero of=/tmp/fill bs=1M count={} 2>/dev/null; echo \"dd=$?\"; \
                 echo \"size=$(stat -c %s /tmp/fill)\"; rm -f /tmp/fill",
                tmp_mib + 8
            ),
        )
        .await?;
    let t = text(&out);
    let seen = values(&t);
    check(seen.get("dd").is_some_and(|v| v != "0"), || {
        format!("writing past /tmp's size succeeded: {t:?}")
    })?;
    let size: u64 = seen
        .get("size")
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    check(size <= c.fixture.limits.tmp, || {
        format!("/tmp took {size} bytes, more than {}", c.fixture.limits.tmp)
    })?;
    let mount = t.lines().next().unwrap_or_default();
    // gVisor's own tmpfs lists its size, never the flags (it has no device files or setuid to
    // honour them for: the machine has no capability to make either).
    let flags = mount.contains("nosuid") && mount.contains("nodev");
    check(mount.contains("tmpfs") && (flags || c.gvisor()), || {
        format!("/tmp is mounted as {mount:?}")
    })
}

/// The bound of the disk test machines get (`[limits] disk`'s runtime half).
const DISK_BOUND: u64 = 64 << 20;

/// `[limits] disk`, the runtime's half: a machine made on a workspace heading a quota group
/// (`crate::disk::make_bounded`, as the daemon makes every workspace) puts its writable layer in
/// that group, so that `/var/tmp` and the workspace share one bound. Skipped where the scratch
/// directory is not on btrfs with quotas on.
async fn the_writable_layer_shares_the_workspaces_disk_bound(
    c: &Context<'_>,
) -> Result<(), Outcome> {
    if let Err(why) = crate::disk::check_enforced(&c.fixture.scratch) {
        return Err(Outcome::Skip(why));
    }
    let workspace = c.fixture.scratch.join(c.machine_id(0));
    crate::disk::make_bounded(&workspace, DISK_BOUND)?;
    nix::unistd::chown(
        &workspace,
        Some(nix::unistd::Uid::from_raw(c.fixture.user.uid)),
        Some(nix::unistd::Gid::from_raw(c.fixture.user.gid)),
    )?;
    let (id, _) = c.machine_on(0, workspace).await?;
    let mib = DISK_BOUND >> 20;
    let out = c
        .sh(
            &id,
            &format!(
                "dd if=/dev/zero of=/var/tmp/fill bs=1M count={} 2>&1; echo \"dd=$?\"; sync; \
                 echo \"size=$(stat -c %s /var/tmp/fill)\"; \
                 dd if=/dev/zero of={}/after bs=1M count=1 2>&1; echo \"after=$?\"; \
                 rm -f /var/tmp/fill {}/after",
                mib * 2,
                c.fixture.mount_point,
                c.fixture.mount_point
            ),
        )
        .await?;
    let t = text(&out);
    let seen = values(&t);
    check(seen.get("dd").is_some_and(|v| v != "0"), || {
        format!("writing twice the bound into the writable layer succeeded: {t:?}")
    })?;
    check(t.contains("Disk quota exceeded"), || {
        format!("the write past the bound did not fail with EDQUOT: {t:?}")
    })?;
    let size: u64 = seen
        .get("size")
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    check(size <= DISK_BOUND, || {
        format!("/var/tmp took {size} bytes, more than the bound of {DISK_BOUND}")
    })?;
    check(seen.get("after").is_some_and(|v| v != "0"), || {
        format!("the workspace still took writes once the layer had the whole bound: {t:?}")
    })?;
    // A subvolume made inside the workspace would split its tree; the filter refuses the ioctl
    // (BTRFS_IOC_SUBVOL_CREATE) with EPERM, where btrfs itself would let the user make one.
    let out = c
        .sh(
            &id,
            &format!(
                "perl -MFcntl -e 'sysopen(my $d, \"{}\", O_RDONLY|O_DIRECTORY) or die $!; \
                 my $args = pack(\"q\", 0) . \"sub\" . (\"\\0\" x 4085); \
                 print ioctl($d, 0x5000940e, $args) ? \"made\" : \"errno=\" . ($!+0), \"\\n\"'",
                c.fixture.mount_point
            ),
        )
        .await?;
    let t = text(&out);
    // gVisor passes no btrfs ioctl to the host's filesystem: ENOTTY.
    let refused = t.trim() == "errno=1" || c.gvisor() && t.trim() == "errno=25";
    check(refused, || {
        format!("making a subvolume in the workspace was not refused with EPERM: {t:?}")
    })
}

async fn pids_limit_holds_and_the_machine_recovers(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    let (bystander, _) = c.machine(1).await?;
    let tries = c.fixture.limits.pids + 64;
    // A subshell forks sleepers until the kernel refuses, noting each pid; the outer shell
    // then counts and kills them with builtins only (no pid is left to fork with).
    let script = format!(
        "rm -f /tmp/pids; \
         ( i=0; while [ $i -lt {tries} ]; do sleep 120 & echo $! >> /tmp/pids; i=$((i+1)); done ) 2>/dev/null; \
         n=0; while read p; do n=$((n+1)); kill -KILL $p 2>/dev/null; done < /tmp/pids; \
         echo \"forked=$n\""
    );
    let out = c.sh(&id, &script).await?;
    let forked: u32 = values(&text(&out))
        .get("forked")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| fail(format!("the fork loop reported nothing: {:?}", text(&out))))?;
    check(forked < c.fixture.limits.pids, || {
        format!(
            "{forked} processes forked, the limit is {}",
            c.fixture.limits.pids
        )
    })?;
    check(forked > 0, || "nothing could be forked at all".to_owned())?;
    c.answers_again(&id).await?;
    c.answers_again(&bystander).await?;
    check(
        c.runtime.inspect(&id).await? == MachineState::Running,
        || "the machine stopped".to_owned(),
    )
}

async fn memory_limit_kills_inside_only(c: &Context<'_>) -> Result<(), Outcome> {
    let (id, _) = c.machine(0).await?;
    // dd holds one block of `bs` bytes in memory: twice the limit cannot fit.
    let mib = (c.fixture.limits.memory >> 20) * 2;
    let out = c
        .sh(
            &id,
            &format!("dd if=/dev/zero of=/dev/null bs={mib}M count=1 2>/dev/null; echo \"dd=$?\""),
        )
        .await?;
    let seen = values(&text(&out));
    check(seen.get("dd").map(String::as_str) == Some("137"), || {
        format!(
            "allocating {mib} MiB was not killed (137): {:?}",
            text(&out)
        )
    })?;
    c.answers_again(&id).await?;
    check(
        c.runtime.inspect(&id).await? == MachineState::Running,
        || "the machine stopped after a process in it ran out of memory".to_owned(),
    )
}

async fn throwaway_is_bounded_and_filtered_too(c: &Context<'_>) -> Result<(), Outcome> {
    let (_, workspace) = c.machine(0).await?;
    let out = c
        .runtime
        .run_throwaway(&ThrowawaySpec {
            name: c.machine_id(2),
            image: c.pinned().await?,
            workspace,
            mount_point: c.fixture.mount_point.clone(),
            user: c.fixture.user,
            network: c.fixture.network,
            limits: c.fixture.limits,
            environment: c.machine_id(2),
            organisation: "conformance".to_owned(),
            process: ProcessSpec {
                argv: vec!["/bin/sh".into(), "-c".into(), READ_LIMITS.into()],
                env: BTreeMap::new(),
                cwd: None,
                timeout: Duration::from_secs(60),
                output_limit: 4096,
                stdin: None,
                output: None,
            },
        })
        .await?;
    let seen = values(&text(&out));
    let want = c.expected_limits();
    check(out.exit_code == Some(0) && seen == want, || {
        format!(
            "throwaway: {seen:?} ({:?}); configured: {want:?}",
            out.exit_code
        )
    })
}
