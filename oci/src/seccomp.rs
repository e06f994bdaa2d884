//! The seccomp filter every environment process runs under: the Docker Engine's default policy
//! as it resolves for a process with no capabilities on x86-64 (and its 32-bit ABIs) or arm64.
//!
//! An allowlist: anything not named fails with `EPERM`. Left out, as Docker leaves them out
//! without `CAP_SYS_ADMIN` and friends: new namespaces (`unshare`, `setns`, `clone` with any
//! namespace flag; `clone3` answers `ENOSYS` so C libraries fall back to `clone`), mounts
//! (`mount`, `umount2`, the new mount API), the kernel keyring (`add_key`, `keyctl`,
//! `request_key`), `bpf`, `perf_event_open`, module loading, `reboot`, clock setting, `ptrace`
//! before kernel 4.8 aside, and `AF_VSOCK` sockets. `io_uring_setup`, `io_uring_enter` and
//! `io_uring_register` are left out too, as the Docker Engine's profile leaves them out since
//! 25.0: the ring's asynchronous work runs in kernel threads beyond the filter's sight.

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompOperator,
    LinuxSyscall,
};

/// Every namespace flag `clone` takes (`CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS |
/// CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET`): a clone asking for none is
/// allowed.
const CLONE_NAMESPACE_FLAGS: u64 = 0x7E02_0000;
/// `AF_VSOCK`: a way out to the hypervisor.
const AF_VSOCK: u64 = 40;
/// `ENOSYS`, so that `clone3` callers fall back to `clone`, whose flags the filter can see.
const ENOSYS: u32 = 38;
/// The `personality` domains Docker allows: Linux, and the same with `UNAME26`,
/// `ADDR_NO_RANDOMIZE` or both, and the query.
const PERSONALITIES: [u64; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xFFFF_FFFF];
/// The btrfs ioctls that take a 4 KiB name (`_IOW(0x94, 1..=24, struct btrfs_ioctl_vol_args)`
/// and its v2): making subvolumes and snapshots (which would leave a workspace's tree in
/// pieces its removal cannot walk), adding and removing devices. Every other ioctl is allowed.
const BTRFS_VOL_IOCTLS: (u64, u64) = (0x5000_9401, 0x5000_9418);

/// Allowed with any arguments.
#[rustfmt::skip]
const ALLOWED: &[&str] = &[
    "accept", "accept4", "access", "adjtimex", "alarm", "bind", "brk", "capget", "capset", "chdir",
    "chmod", "chown", "chown32", "clock_adjtime", "clock_adjtime64", "clock_getres",
    "clock_getres_time64", "clock_gettime", "clock_gettime64", "clock_nanosleep",
    "clock_nanosleep_time64", "close", "close_range", "connect", "copy_file_range", "creat", "dup",
    "dup2", "dup3", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait",
    "epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "execve", "execveat",
    "exit", "exit_group", "faccessat", "faccessat2", "fadvise64", "fadvise64_64", "fallocate",
    "fanotify_mark", "fchdir", "fchmod", "fchmodat", "fchown", "fchown32", "fchownat", "fcntl",
    "fcntl64", "fdatasync", "fgetxattr", "flistxattr", "flock", "fork", "fremovexattr",
    "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs", "fstatfs64", "fsync", "ftruncate",
    "ftruncate64", "futex", "futex_time64", "futex_waitv", "futimesat", "getcpu", "getcwd",
    "getdents", "getdents64", "getegid", "getegid32", "geteuid", "geteuid32", "getgid", "getgid32",
    "getgroups", "getgroups32", "getitimer", "getpeername", "getpgid", "getpgrp", "getpid",
    "getppid", "getpriority", "getrandom", "getresgid", "getresgid32", "getresuid", "getresuid32",
    "getrlimit", "get_robust_list", "getrusage", "getsid", "getsockname", "getsockopt",
    "get_thread_area", "gettid", "gettimeofday", "getuid", "getuid32", "getxattr",
    "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch", "io_cancel",
    "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64", "ioprio_get",
    "ioprio_set", "io_setup", "io_submit", "ipc", "kill", "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self",
    "lchown", "lchown32", "lgetxattr", "link", "linkat", "listen", "listxattr", "llistxattr",
    "_llseek", "lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64", "madvise", "membarrier",
    "memfd_create", "memfd_secret", "mincore", "mkdir", "mkdirat", "mknod", "mknodat", "mlock",
    "mlock2", "mlockall", "mmap", "mmap2", "mprotect", "mq_getsetattr", "mq_notify", "mq_open",
    "mq_timedreceive", "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64",
    "mq_unlink", "mremap", "msgctl", "msgget", "msgrcv", "msgsnd", "msync", "munlock",
    "munlockall", "munmap", "name_to_handle_at", "nanosleep", "newfstatat", "_newselect", "open",
    "openat", "openat2", "pause", "pidfd_open", "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc",
    "pkey_free", "pkey_mprotect", "poll", "ppoll", "ppoll_time64", "prctl", "pread64", "preadv",
    "preadv2", "prlimit64", "process_mrelease", "process_vm_readv", "process_vm_writev",
    "pselect6", "pselect6_time64", "ptrace", "pwrite64", "pwritev", "pwritev2", "read",
    "readahead", "readlink", "readlinkat", "readv", "recv", "recvfrom", "recvmmsg",
    "recvmmsg_time64", "recvmsg", "remap_file_pages", "removexattr", "rename", "renameat",
    "renameat2", "restart_syscall", "rmdir", "rseq", "rt_sigaction", "rt_sigpending",
    "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait",
    "rt_sigtimedwait_time64", "rt_tgsigqueueinfo", "sched_getaffinity", "sched_getattr",
    "sched_getparam", "sched_get_priority_max", "sched_get_priority_min", "sched_getscheduler",
    "sched_rr_get_interval", "sched_rr_get_interval_time64", "sched_setaffinity", "sched_setattr",
    "sched_setparam", "sched_setscheduler", "sched_yield", "seccomp", "select", "semctl", "semget",
    "semop", "semtimedop", "semtimedop_time64", "send", "sendfile", "sendfile64", "sendmmsg",
    "sendmsg", "sendto", "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32",
    "setgroups", "setgroups32", "setitimer", "setpgid", "setpriority", "setregid", "setregid32",
    "setresgid", "setresgid32", "setresuid", "setresuid32", "setreuid", "setreuid32", "setrlimit",
    "set_robust_list", "setsid", "setsockopt", "set_thread_area", "set_tid_address", "setuid",
    "setuid32", "setxattr", "shmat", "shmctl", "shmdt", "shmget", "shutdown", "sigaltstack",
    "signalfd", "signalfd4", "sigprocmask", "sigreturn", "socketcall", "socketpair", "splice",
    "stat", "stat64", "statfs", "statfs64", "statx", "symlink", "symlinkat", "sync",
    "sync_file_range", "syncfs", "sysinfo", "tee", "tgkill", "time", "timer_create",
    "timer_delete", "timer_getoverrun", "timer_gettime", "timer_gettime64", "timer_settime",
    "timer_settime64", "timerfd_create", "timerfd_gettime", "timerfd_gettime64", "timerfd_settime",
    "timerfd_settime64", "times", "tkill", "truncate", "truncate64", "ugetrlimit", "umask",
    "uname", "unlink", "unlinkat", "utime", "utimensat", "utimensat_time64", "utimes", "vfork",
    "vmsplice", "wait4", "waitid", "waitpid", "write", "writev",
    // x86 only; libseccomp skips names an architecture does not have.
    "arch_prctl", "modify_ldt",
    // arm64 and its 32-bit ABI.
    "arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint", "cacheflush",
    "set_tls",
];

fn rule(names: &[&str], action: LinuxSeccompAction) -> LinuxSyscall {
    let mut syscall = LinuxSyscall::default();
    syscall.set_names(names.iter().map(|n| (*n).to_owned()).collect());
    syscall.set_action(action);
    syscall
}

/// `name` allowed when argument `index` compares by `op` with `value` (for a masked
/// comparison: `arg & value == value_two`).
fn allowed_when(
    name: &str,
    index: usize,
    op: LinuxSeccompOperator,
    value: u64,
    value_two: Option<u64>,
) -> LinuxSyscall {
    let mut arg = LinuxSeccompArgBuilder::default()
        .index(index)
        .op(op)
        .value(value);
    if let Some(two) = value_two {
        arg = arg.value_two(two);
    }
    let mut syscall = rule(&[name], LinuxSeccompAction::ScmpActAllow);
    // Every field of the builder is set or defaulted: building cannot fail.
    syscall.set_args(arg.build().ok().map(|arg| vec![arg]));
    syscall
}

/// The filter, as the `linux.seccomp` of a runtime spec (and, serialised, a Docker profile).
pub fn default_profile() -> LinuxSeccomp {
    use LinuxSeccompOperator::{ScmpCmpEq, ScmpCmpGt, ScmpCmpLt, ScmpCmpMaskedEq, ScmpCmpNe};
    let mut syscalls = vec![rule(ALLOWED, LinuxSeccompAction::ScmpActAllow)];
    syscalls.push(allowed_when("socket", 0, ScmpCmpNe, AF_VSOCK, None));
    // ioctl(fd, request, …) with any request below or above the btrfs range.
    let (first, last) = BTRFS_VOL_IOCTLS;
    syscalls.push(allowed_when("ioctl", 1, ScmpCmpLt, first, None));
    syscalls.push(allowed_when("ioctl", 1, ScmpCmpGt, last, None));
    for persona in PERSONALITIES {
        syscalls.push(allowed_when("personality", 0, ScmpCmpEq, persona, None));
    }
    // clone(flags, …) with no namespace flag set: `flags & mask == 0`.
    syscalls.push(allowed_when(
        "clone",
        0,
        ScmpCmpMaskedEq,
        CLONE_NAMESPACE_FLAGS,
        Some(0),
    ));
    let mut clone3 = rule(&["clone3"], LinuxSeccompAction::ScmpActErrno);
    clone3.set_errno_ret(Some(ENOSYS));
    syscalls.push(clone3);

    let mut profile = LinuxSeccomp::default();
    profile.set_default_action(LinuxSeccompAction::ScmpActErrno);
    profile.set_architectures(Some(vec![
        Arch::ScmpArchX86_64,
        Arch::ScmpArchX86,
        Arch::ScmpArchX32,
        Arch::ScmpArchAarch64,
        Arch::ScmpArchArm,
    ]));
    profile.set_syscalls(Some(syscalls));
    profile
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(profile: &LinuxSeccomp) -> Vec<String> {
        profile
            .syscalls()
            .iter()
            .flatten()
            .filter(|s| s.action() == LinuxSeccompAction::ScmpActAllow && s.args().is_none())
            .flat_map(|s| s.names().clone())
            .collect()
    }

    #[test]
    fn refuses_by_default_and_leaves_out_what_docker_leaves_out() {
        let profile = default_profile();
        assert_eq!(profile.default_action(), LinuxSeccompAction::ScmpActErrno);
        let allowed = names(&profile);
        for refused in [
            "unshare",
            "setns",
            "mount",
            "umount2",
            "add_key",
            "keyctl",
            "request_key",
            "bpf",
            "perf_event_open",
            "init_module",
            "reboot",
            "clone",
            "clone3",
        ] {
            assert!(!allowed.iter().any(|n| n == refused), "{refused}");
        }
        assert!(allowed.iter().any(|n| n == "execve"));
    }

    #[test]
    fn clone_is_allowed_only_without_namespace_flags() {
        let profile = default_profile();
        let clone = profile
            .syscalls()
            .iter()
            .flatten()
            .find(|s| s.names() == &["clone".to_owned()])
            .expect("a clone rule");
        let arg = clone.args().as_ref().and_then(|a| a.first()).copied();
        let arg = arg.expect("a condition");
        assert_eq!(arg.op(), LinuxSeccompOperator::ScmpCmpMaskedEq);
        // CLONE_NEWUSER (0x10000000) is under the mask.
        assert_ne!(arg.value() & 0x1000_0000, 0);
        assert_eq!(arg.value_two(), Some(0));
        let json = serde_json::to_value(&profile).expect("serialisable");
        assert_eq!(json["defaultAction"], "SCMP_ACT_ERRNO");
    }

    #[test]
    fn ioctl_is_allowed_but_for_the_btrfs_requests_that_make_subvolumes() {
        let profile = default_profile();
        assert!(
            !names(&profile).iter().any(|n| n == "ioctl"),
            "not unconditionally"
        );
        let rules: Vec<_> = profile
            .syscalls()
            .iter()
            .flatten()
            .filter(|s| s.names() == &["ioctl".to_owned()])
            .filter_map(|s| s.args().as_ref().and_then(|a| a.first()).copied())
            .collect();
        // A request passes when some rule lets it (the rules are alternatives).
        let passes = |request: u64| {
            rules.iter().any(|arg| {
                assert_eq!(arg.index(), 1);
                match arg.op() {
                    LinuxSeccompOperator::ScmpCmpLt => request < arg.value(),
                    LinuxSeccompOperator::ScmpCmpGt => request > arg.value(),
                    other => panic!("unexpected {other:?}"),
                }
            })
        };
        // BTRFS_IOC_SNAP_CREATE, SUBVOL_CREATE, SNAP_CREATE_V2, SUBVOL_CREATE_V2.
        for refused in [0x5000_9401, 0x5000_940e, 0x5000_9417, 0x5000_9418] {
            assert!(!passes(refused), "{refused:#x}");
        }
        // TCGETS, FIONREAD, TIOCGWINSZ, FICLONE, FS_IOC_GETFLAGS, a sign-extended request.
        for allowed in [
            0x5401,
            0x541b,
            0x5413,
            0x4004_9409,
            0x8008_6601,
            0xffff_ffff_8004_5430,
        ] {
            assert!(passes(allowed), "{allowed:#x}");
        }
    }
}
