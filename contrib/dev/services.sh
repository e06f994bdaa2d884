#!/usr/bin/env bash
# Starts (or stops) the services Narya's tests and a development host use, on private paths:
#   containerd  unix://$NARYA_RUN_DIR/containerd.sock   (state under $NARYA_DATA_DIR/containerd)
#   dockerd     unix://$NARYA_RUN_DIR/docker.sock       (with its own containerd)
#   registry    http://$NARYA_REGISTRY                  (Debian's docker-registry, distribution 2.8)
#   podman      unix://$NARYA_RUN_DIR/podman.sock       (Podman's Docker-compatible service; its
#               own storage under $NARYA_DATA_DIR/podman, its own registries.conf)
#   podman-gvisor unix://$NARYA_RUN_DIR/podman-gvisor.sock (the same Podman with runsc as its
#               default runtime, when runsc is installed: gVisor on Podman)
# $NARYA_DATA_DIR is first mounted from a btrfs image with simple quotas on ($NARYA_DISK_IMAGE,
# sparse, kept between runs), so that `[limits] disk` can bound what environments write to the
# runtimes' writable layers and to workspaces under $NARYA_DATA_DIR/tests (tests' state dirs).
# Each is started only if it is not answering already. Needs root and the Debian packages
# containerd, runc, docker.io, docker-registry and podman (contrib/dev/setup.sh or .ci/run
# install them).
# Under CI=true any service that does not come up is a failure; otherwise a warning.
#
#   contrib/dev/services.sh start [matrix] | stop | fresh | env [matrix]
#
# `fresh` stops them and throws their state away (the btrfs image), so that the next `start`
# begins from empty runtimes: .ci/run does, because the image outlives a run on the same machine,
# and with it whatever that run left in a runtime's own store (a Docker network of a killed
# daemon, with its subnet routed again at every engine start and its stale endpoint refusing
# removal) would decide the next run.
# `start matrix` also starts the runtime matrix (start_matrix below); `env matrix` prints the
# variables that point the tests at it instead.
set -uo pipefail

NARYA_RUN_DIR=${NARYA_RUN_DIR:-/run/narya-test}
NARYA_DATA_DIR=${NARYA_DATA_DIR:-/var/lib/narya-test}
NARYA_REGISTRY=${NARYA_REGISTRY:-127.0.0.1:5000}
CONTAINERD_SOCK=$NARYA_RUN_DIR/containerd.sock
DOCKER_SOCK=$NARYA_RUN_DIR/docker.sock
PODMAN_SOCK=$NARYA_RUN_DIR/podman.sock
LOG_DIR=$NARYA_RUN_DIR/logs
NARYA_DISK_IMAGE=${NARYA_DISK_IMAGE:-/var/tmp/narya-test-disk.btrfs}
NARYA_DISK_SIZE=${NARYA_DISK_SIZE:-64G}

failures=0
fail() {
  echo "services: $*" >&2
  failures=$((failures + 1))
}

# shellcheck source=../lib/wait.sh
. "$(dirname "$0")/../lib/wait.sh"

registry_up() { curl -fsS "http://$NARYA_REGISTRY/v2/"; }

# Whether $NARYA_DATA_DIR is a btrfs mount with quotas on.
data_has_quotas() {
  [ "$(findmnt -n -o FSTYPE --mountpoint "$NARYA_DATA_DIR")" = btrfs ] || return 1
  local uuid; uuid=$(findmnt -n -o UUID --mountpoint "$NARYA_DATA_DIR")
  [ "$(cat "/sys/fs/btrfs/$uuid/qgroups/enabled" 2>/dev/null)" = 1 ]
}

# Turns simple quotas on for the btrfs filesystem mounted at $1 (`btrfs quota enable --simple`
# needs btrfs-progs 6.7; bookworm has 6.2, so the ioctl is made here: BTRFS_IOC_QUOTA_CTL with
# BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA).
enable_simple_quotas() {
  python3 - "$1" <<'PY'
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.ioctl(fd, (3 << 30) | (16 << 16) | (0x94 << 8) | 40, struct.pack("QQ", 4, 0))
PY
}

# Mounts $NARYA_DATA_DIR from a btrfs image with simple quotas on, made once (sparse: it takes
# only what is written). Before any runtime starts: their storage lives there.
mount_data() {
  if data_has_quotas; then echo "data: $NARYA_DATA_DIR already has quotas"; return; fi
  command -v mkfs.btrfs >/dev/null || { fail "mkfs.btrfs is missing (apt-get install btrfs-progs)"; return; }
  if ! blkid -p -s TYPE -o value "$NARYA_DISK_IMAGE" 2>/dev/null | grep -qx btrfs; then
    rm -f "$NARYA_DISK_IMAGE"
    truncate -s "$NARYA_DISK_SIZE" "$NARYA_DISK_IMAGE" && mkfs.btrfs -q "$NARYA_DISK_IMAGE" >/dev/null \
      || { fail "cannot make the btrfs image $NARYA_DISK_IMAGE"; return; }
  fi
  mkdir -p "$NARYA_DATA_DIR"
  if ! findmnt -n --mountpoint "$NARYA_DATA_DIR" >/dev/null; then
    mount -o loop "$NARYA_DISK_IMAGE" "$NARYA_DATA_DIR" \
      || { fail "cannot mount $NARYA_DISK_IMAGE at $NARYA_DATA_DIR"; return; }
  fi
  if data_has_quotas || enable_simple_quotas "$NARYA_DATA_DIR"; then
    echo "data: $NARYA_DATA_DIR mounted from $NARYA_DISK_IMAGE (btrfs, simple quotas)"
  else
    fail "cannot turn quotas on for $NARYA_DATA_DIR"
  fi
}

# start_containerd [NAME [BIN_DIR]]: containerd named NAME (default "containerd": the host's own
# package) on $NARYA_RUN_DIR/NAME.sock, its state under $NARYA_DATA_DIR/NAME, from BIN_DIR (the
# host's PATH when empty): the matrix starts the newer ones from their unpacked packages.
start_containerd() {
  local name=${1:-containerd} bin_dir=${2:-}
  local sock=$NARYA_RUN_DIR/$name.sock ctr_bin=ctr containerd_bin=containerd
  if [ -n "$bin_dir" ]; then ctr_bin=$bin_dir/ctr containerd_bin=$bin_dir/containerd; fi
  if "$ctr_bin" --address "$sock" version >/dev/null 2>&1; then echo "$name: already answering on $sock"; return; fi
  command -v "$containerd_bin" >/dev/null || { fail "$name is not installed (apt-get install containerd runc, or contrib/matrix/fetch.sh)"; return; }
  mkdir -p "$NARYA_DATA_DIR/$name" "$NARYA_RUN_DIR/$name-state"
  rm -f "$sock"
  # A config file of its own: the package's /etc/containerd/config.toml must not leak in. 2.x reads
  # version 3 (a version 2 file is migrated, with a warning, at every start).
  local config_version=2
  case "$("$containerd_bin" --version | awk '{ print $3 }')" in 2.*|v2.*) config_version=3 ;; esac
  printf 'version = %s\n' "$config_version" > "$NARYA_RUN_DIR/$name.toml"
  # The shim is found beside the containerd that starts it.
  PATH=${bin_dir:+$bin_dir:}$PATH setsid "$containerd_bin" --config "$NARYA_RUN_DIR/$name.toml" \
    --root "$NARYA_DATA_DIR/$name" --state "$NARYA_RUN_DIR/$name-state" \
    --address "$sock" >"$LOG_DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$NARYA_RUN_DIR/$name.pid"
  if wait_for 30 "$ctr_bin" --address "$sock" version; then
    echo "$name: answering on $sock"
  else
    fail "$name did not answer on $sock within 30 s; see $LOG_DIR/$name.log"
    tail -n 20 "$LOG_DIR/$name.log" >&2
  fi
}

# gVisor for `[runtime] sandbox = "gvisor"`, when runsc is installed (.ci/run installs it from
# bookworm-backports): its wrapper (contrib/runsc/narya-runsc) goes where the Debian package puts
# it, and dockerd and Podman register it as the runtime "runsc". containerd needs no registration:
# naryad names the runtime per container.
RUNSC_WRAPPER=/usr/libexec/narya/runsc
install_runsc_wrapper() {
  [ -x /usr/bin/runsc ] || return 0
  install -D -m 0755 "$(dirname "$0")/../runsc/narya-runsc" "$RUNSC_WRAPPER"
}

# start_dockerd [NAME [BIN_DIR]]: dockerd named NAME (default "docker") on $NARYA_RUN_DIR/NAME.sock,
# with its own containerd, from BIN_DIR (whose containerd it starts) or the host's PATH.
start_dockerd() {
  local name=${1:-docker} bin_dir=${2:-}
  local sock=$NARYA_RUN_DIR/$name.sock dockerd_bin=dockerd
  [ -z "$bin_dir" ] || dockerd_bin=$bin_dir/dockerd
  local up=(curl -fsS --unix-socket "$sock" http://d/_ping)
  # One started before runsc was installed lacks the runtime: it starts again with it.
  if "${up[@]}" >/dev/null 2>&1 && [ -x "$RUNSC_WRAPPER" ] \
    && ! curl -fsS --unix-socket "$sock" http://d/info | grep -q '"runsc"'; then
    echo "$name: restarting to register runsc"
    stop_pidfile "$NARYA_RUN_DIR/$name.pid"
  fi
  if "${up[@]}" >/dev/null 2>&1; then echo "$name: already answering on $sock"; return; fi
  command -v "$dockerd_bin" >/dev/null || { fail "$name: dockerd is not installed (apt-get install docker.io, or contrib/matrix/fetch.sh)"; return; }
  mkdir -p "$NARYA_DATA_DIR/$name" "$NARYA_RUN_DIR/$name-exec"
  rm -f "$sock"
  local runtimes=()
  [ ! -x "$RUNSC_WRAPPER" ] || runtimes=(--add-runtime "runsc=$RUNSC_WRAPPER")
  PATH=${bin_dir:+$bin_dir:}$PATH setsid "$dockerd_bin" "${runtimes[@]}" \
    --data-root "$NARYA_DATA_DIR/$name" --exec-root "$NARYA_RUN_DIR/$name-exec" \
    -H "unix://$sock" --pidfile "$NARYA_RUN_DIR/$name.pid" \
    --bridge=none --storage-driver overlay2 \
    >"$LOG_DIR/$name.log" 2>&1 < /dev/null &
  if wait_for 60 "${up[@]}"; then
    echo "$name: answering on $sock"
  else
    fail "$name did not answer on $sock within 60 s; see $LOG_DIR/$name.log"
    tail -n 20 "$LOG_DIR/$name.log" >&2
  fi
}

# The runtime matrix: the newer runtimes beside the host's (contrib/matrix/fetch.sh fetches them,
# once): containerd 2.1 and Docker 28 (with its own containerd 2.1) from sid, containerd 1.7 from
# trixie, and Podman 5 from a trixie root of its own (contrib/matrix/podman-5.sh).
MATRIX_BIN=$NARYA_RUN_DIR/matrix-bin
start_matrix() {
  local fetch; fetch="$(dirname "$0")/../matrix/fetch.sh"
  if ! "$fetch" >"$LOG_DIR/matrix-fetch.log" 2>&1; then
    fail "the matrix's runtimes could not be fetched; see $LOG_DIR/matrix-fetch.log"
    tail -n 20 "$LOG_DIR/matrix-fetch.log" >&2
    return
  fi
  local c21 d28 c17
  c21=$("$fetch" --cached containerd-2.1) d28=$("$fetch" --cached docker-28) c17=$("$fetch" --cached containerd-1.7)
  # One directory with Docker 28's binaries and containerd 2.1's, for dockerd to start its
  # containerd from and for tests that run `ctr` or `containerd` of the newer series.
  mkdir -p "$MATRIX_BIN"
  ln -sf "$c21"/usr/bin/* "$d28"/usr/sbin/* "$d28"/usr/bin/* "$MATRIX_BIN/"
  start_containerd containerd-2.1 "$MATRIX_BIN"
  start_dockerd docker-28 "$MATRIX_BIN"
  start_containerd containerd-1.7 "$c17/usr/bin"
  "$(dirname "$0")/../matrix/podman-5.sh" start || fail "Podman 5 did not start"
}

start_registry() {
  if registry_up >/dev/null 2>&1; then echo "registry: already answering on $NARYA_REGISTRY"; return; fi
  command -v docker-registry >/dev/null || { fail "docker-registry is not installed (apt-get install docker-registry)"; return; }
  mkdir -p "$NARYA_DATA_DIR/registry"
  cat > "$NARYA_RUN_DIR/registry.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $NARYA_DATA_DIR/registry
  delete:
    enabled: true
http:
  addr: $NARYA_REGISTRY
YAML
  setsid docker-registry serve "$NARYA_RUN_DIR/registry.yml" >"$LOG_DIR/registry.log" 2>&1 < /dev/null &
  echo $! > "$NARYA_RUN_DIR/registry.pid"
  if wait_for 30 registry_up; then
    echo "registry: answering on http://$NARYA_REGISTRY"
  else
    fail "the registry did not answer on $NARYA_REGISTRY within 30 s; see $LOG_DIR/registry.log"
    tail -n 20 "$LOG_DIR/registry.log" >&2
  fi
}

# start_podman [NAME [RUNTIME]]: the host's Podman as the Docker-compatible service NAME (default
# "podman") on $NARYA_RUN_DIR/NAME.sock, its storage under $NARYA_DATA_DIR/NAME and its
# configuration in $NARYA_RUN_DIR/NAME; RUNTIME, when given, its default OCI runtime. runsc is
# registered with it when installed. Podman reads its configuration from files (written by
# contrib/lib/podman-conf.sh): these keep it off the host's own (storage, registries,
# containers.conf) and let it pull from the plain-HTTP test registry.
start_podman() {
  local name=${1:-podman} runtime=${2:-}
  local sock=$NARYA_RUN_DIR/$name.sock conf=$NARYA_RUN_DIR/$name
  local up=(curl -fsS --unix-socket "$sock" http://d/_ping)
  if "${up[@]}" >/dev/null 2>&1; then echo "$name: already answering on $sock"; return; fi
  command -v podman >/dev/null || { fail "podman is not installed (apt-get install podman)"; return; }
  # shellcheck source=../lib/podman-conf.sh
  . "$(dirname "$0")/../lib/podman-conf.sh"
  local runsc=
  [ ! -x "$RUNSC_WRAPPER" ] || runsc=$RUNSC_WRAPPER
  write_podman_conf "$conf" "$NARYA_DATA_DIR/$name" "$NARYA_RUN_DIR/$name" "$NARYA_REGISTRY" "$runtime" "$runsc" \
    || { fail "cannot write $name's configuration in $conf"; return; }
  rm -f "$sock"
  # From /: conmon, which starts every container, inherits the service's working directory and
  # fails each start ("Failed to get working directory") once that directory is deleted.
  (podman_conf_env "$conf" && cd / && exec setsid podman --root "$NARYA_DATA_DIR/$name/storage" \
    --runroot "$NARYA_RUN_DIR/$name-run" --cgroup-manager cgroupfs --tmpdir "$NARYA_RUN_DIR/$name-tmp" \
    system service --time=0 "unix://$sock") \
    >"$LOG_DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$NARYA_RUN_DIR/$name.pid"
  if wait_for 60 "${up[@]}"; then
    echo "$name: answering on $sock"
  else
    fail "$name did not answer on $sock within 60 s; see $LOG_DIR/$name.log"
    tail -n 20 "$LOG_DIR/$name.log" >&2
  fi
}

# The host's Podman again with runsc as its default runtime, for gVisor on Podman: Podman's API
# ignores the runtime a container asks for (Podman issue 28429; 4.3 to 5.8), so the daemon runs
# Podman's machines under gVisor only where runsc is the default.
start_podman_gvisor() {
  [ -x "$RUNSC_WRAPPER" ] || return 0
  start_podman podman-gvisor runsc
}

stop_pidfile() {
  local file=$1
  [ -f "$file" ] || return 0
  local pid; pid=$(cat "$file")
  kill "$pid" 2>/dev/null && wait_for 20 sh -c "! kill -0 $pid"
  rm -f "$file"
}

case "${1:-start}" in
  start)
    mkdir -p "$NARYA_RUN_DIR" "$LOG_DIR"
    mount_data
    mkdir -p "$NARYA_DATA_DIR/tests"
    install_runsc_wrapper
    start_containerd
    start_dockerd
    start_registry
    # runc by name: crun, Podman's first choice where installed, refuses this host's hybrid cgroups.
    start_podman podman runc
    start_podman_gvisor
    [ "${2:-}" != matrix ] || start_matrix
    ;;
  stop)
    "$(dirname "$0")/../matrix/podman-5.sh" stop
    stop_pidfile "$NARYA_RUN_DIR/containerd-1.7.pid"
    stop_pidfile "$NARYA_RUN_DIR/docker-28.pid"
    stop_pidfile "$NARYA_RUN_DIR/containerd-2.1.pid"
    stop_pidfile "$NARYA_RUN_DIR/podman-gvisor.pid"
    stop_pidfile "$NARYA_RUN_DIR/podman.pid"
    stop_pidfile "$NARYA_RUN_DIR/docker.pid"
    stop_pidfile "$NARYA_RUN_DIR/registry.pid"
    stop_pidfile "$NARYA_RUN_DIR/containerd.pid"
    ;;
  fresh)
    "$0" stop
    if findmnt -n --mountpoint "$NARYA_DATA_DIR" >/dev/null; then
      # A machine left running keeps its layers mounted below: those go with it, or at once
      # from sight (lazily) while what still uses them lets go.
      umount -R "$NARYA_DATA_DIR" 2>/dev/null || umount -R -l "$NARYA_DATA_DIR" \
        || fail "cannot unmount $NARYA_DATA_DIR"
    fi
    if [ "$failures" -eq 0 ]; then
      rm -f "$NARYA_DISK_IMAGE" && echo "data: $NARYA_DISK_IMAGE removed" \
        || fail "cannot remove $NARYA_DISK_IMAGE"
    fi
    ;;
  env)
    if [ "${2:-}" = matrix ]; then
      # The tests against the matrix's newer runtimes: the same variables, pointed at them, and
      # their binaries first on PATH for the tests that start a runtime of their own.
      echo "export NARYA_TEST_CONTAINERD_SOCKET=$NARYA_RUN_DIR/containerd-2.1.sock"
      echo "export NARYA_TEST_DOCKER_SOCKET=$NARYA_RUN_DIR/docker-28.sock"
      echo "export NARYA_TEST_PODMAN_SOCKET=$NARYA_RUN_DIR/podman-5.sock"
      echo "export NARYA_TEST_CONTAINERD_DIRS=$NARYA_DATA_DIR/containerd-2.1:$NARYA_RUN_DIR/containerd-2.1-state"
      echo "export NARYA_TEST_DOCKER_DIRS=$NARYA_DATA_DIR/docker-28:$NARYA_RUN_DIR/docker-28-exec"
      echo "export NARYA_TEST_PODMAN_DIRS=$NARYA_DATA_DIR/podman-5:$NARYA_RUN_DIR/podman-5-run"
      echo "export NARYA_TEST_CONTAINERD17_SOCKET=$NARYA_RUN_DIR/containerd-1.7.sock"
      echo "export PATH=$MATRIX_BIN:\$PATH"
      exit 0
    fi
    echo "export NARYA_TEST_CONTAINERD_SOCKET=$CONTAINERD_SOCK"
    echo "export NARYA_TEST_DOCKER_SOCKET=$DOCKER_SOCK"
    echo "export NARYA_TEST_REGISTRY=$NARYA_REGISTRY"
    # Where the runtimes keep their state, for tests that look for what must never be there.
    echo "export NARYA_RUN_DIR=$NARYA_RUN_DIR"
    echo "export NARYA_DATA_DIR=$NARYA_DATA_DIR"
    echo "export NARYA_TEST_PODMAN_SOCKET=$PODMAN_SOCK"
    # Podman with runsc as its default runtime, for gVisor on Podman (start_podman_gvisor).
    echo "export NARYA_TEST_PODMAN_GVISOR_SOCKET=$NARYA_RUN_DIR/podman-gvisor.sock"
    echo "export NARYA_TEST_PODMAN_GVISOR_DIRS=$NARYA_DATA_DIR/podman-gvisor:$NARYA_RUN_DIR/podman-gvisor-run"
    # Tests' state directories go here: the filesystem the runtimes' layers are on, with quotas.
    echo "export NARYA_TEST_STATE_ROOT=$NARYA_DATA_DIR/tests"
    # The matrix's newer engines, for the benchmark's rows beside the host's (`start matrix`).
    echo "export NARYA_MATRIX_CONTAINERD_SOCKET=$NARYA_RUN_DIR/containerd-2.1.sock"
    echo "export NARYA_MATRIX_DOCKER_SOCKET=$NARYA_RUN_DIR/docker-28.sock"
    echo "export NARYA_MATRIX_BIN=$MATRIX_BIN"
    # A containerd older than any tested (bullseye's 1.4), for check-config's warning.
    if old=$("$(dirname "$0")/../matrix/fetch.sh" --cached containerd-1.4); then
      echo "export NARYA_TEST_OLD_CONTAINERD=$old/usr/bin"
    fi
    exit 0
    ;;
  *)
    echo "usage: $0 start [matrix] | stop | fresh | env [matrix]" >&2
    exit 2
    ;;
esac

if [ "$failures" -gt 0 ]; then
  if [ "${CI:-}" = "true" ]; then
    echo "services: $failures problem(s) (above); under CI=true that fails the run" >&2
    exit 1
  fi
  echo "services: $failures service(s) not running; tests that need them will skip (never under CI=true)" >&2
fi
exit 0
