#!/usr/bin/env bash
# Podman 5 (trixie's) as a Docker-compatible service beside the host's own Podman 4.3, on
# unix://$NARYA_RUN_DIR/podman-5.sock, for the runtime matrix. trixie's podman needs a newer glibc
# than bookworm's, so it runs from a trixie root of its own (contrib/matrix/podman-root.sh builds
# it once): in a mount namespace of its own, the host's paths that Podman, its containers and the
# tests share are bound into the root at the same places, and the service pivot_roots into it
# (under a chroot, `runc exec` entered the containers from the host's `/`). Its storage,
# run directory and configuration are its own ($NARYA_DATA_DIR/podman-5,
# $NARYA_RUN_DIR/podman-5-run, $NARYA_RUN_DIR/podman-5), apart from the host Podman's.
#
#   contrib/matrix/podman-5.sh start   start it unless it answers (builds the root if needed)
#   contrib/matrix/podman-5.sh stop    stop it (its containers live on under conmon)
#   contrib/matrix/podman-5.sh env     the variable that points the tests at it
#
# Needs root; runc, never crun (crun refuses this host's hybrid cgroups).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/podman-conf.sh
. "$here/../lib/podman-conf.sh"

NARYA_RUN_DIR=${NARYA_RUN_DIR:-/run/narya-test}
NARYA_DATA_DIR=${NARYA_DATA_DIR:-/var/lib/narya-test}
NARYA_REGISTRY=${NARYA_REGISTRY:-127.0.0.1:5000}
NARYA_RUNTIMES_DIR=${NARYA_RUNTIMES_DIR:-/var/tmp/narya-runtimes}
ROOT=${NARYA_PODMAN_5_ROOT:-$NARYA_RUNTIMES_DIR/podman-5-root}
SOCK=$NARYA_RUN_DIR/podman-5.sock
CONF=$NARYA_RUN_DIR/podman-5
DATA=$NARYA_DATA_DIR/podman-5
PID_FILE=$NARYA_RUN_DIR/podman-5.pid
LOG=$NARYA_RUN_DIR/logs/podman-5.log
RUNSC_WRAPPER=/usr/libexec/narya/runsc

# The host's paths the service sees at the same places: the kernel's (/proc, /sys with the
# cgroups, /dev, modules), the sockets and run directories of the test services, the storage
# (NARYA_DATA_DIR: a btrfs mount with its own submounts), network namespaces, the tests'
# scratch and image layouts (/tmp, /var/tmp), the resolvers and hosts a container on the host's
# network reads, and gVisor (its wrapper and runsc) when installed. Bound recursively, except
# /var/tmp: the root itself lies below it.
SHARED=(/proc /sys /dev /lib/modules "$NARYA_RUN_DIR" "$NARYA_DATA_DIR" /run/netns /tmp
  /etc/resolv.conf /etc/hosts /usr/libexec/narya /usr/bin/runsc)

up() { curl -fsS --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1; }

# shellcheck source=../lib/wait.sh
. "$here/../lib/wait.sh"

# Runs in the new mount namespace (as bash -c, arguments: the root, then the shared paths):
# binds the paths into the root, pivots into it and becomes the service.
# shellcheck disable=SC2016
INSIDE='
set -eu
root=$1; shift
# pivot_root wants the new root to be a mount point.
mount --bind "$root" "$root"
mkdir -p "$root/var/tmp"
mount --bind /var/tmp "$root/var/tmp"
for path in "$@"; do
  [ -e "$path" ] || continue
  if [ -d "$path" ]; then
    mkdir -p "$root$path"
  else
    mkdir -p "$root$(dirname "$path")"
    [ -e "$root$path" ] || : > "$root$path"
  fi
  mount --rbind "$path" "$root$path"
done
mkdir -p "$root/.host-root"
cd "$root"
pivot_root . .host-root
cd /
umount -l /.host-root
# conmon, which starts every container, inherits the working directory: / never goes away.
exec podman --root "$DATA/storage" --runroot "$RUN-run" --tmpdir "$RUN-tmp" \
  --cgroup-manager cgroupfs system service --time=0 "unix://$SOCK"
'

start() {
  if up; then echo "podman-5: already answering on $SOCK"; return; fi
  [ "$(id -u)" = 0 ] || { echo "podman-5: needs root" >&2; exit 1; }
  local started=$SECONDS
  "$here/podman-root.sh" "$ROOT"
  local runsc=
  [ ! -x "$RUNSC_WRAPPER" ] || runsc=$RUNSC_WRAPPER
  write_podman_conf "$CONF" "$DATA" "$NARYA_RUN_DIR/podman-5" "$NARYA_REGISTRY" runc "$runsc"
  mkdir -p "$(dirname "$LOG")" /run/netns
  stop_running
  rm -f "$SOCK"
  # A clean environment: only what Podman is told here, and paths of the root's own.
  (cd / && exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 PODMAN_IGNORE_CGROUPSV1_WARNING=1 \
    CONTAINERS_REGISTRIES_CONF="$CONF/registries.conf" \
    CONTAINERS_STORAGE_CONF="$CONF/storage.conf" CONTAINERS_CONF="$CONF/containers.conf" \
    DATA="$DATA" RUN="$NARYA_RUN_DIR/podman-5" SOCK="$SOCK" \
    setsid unshare --mount --propagation slave -- bash -c "$INSIDE" podman-5 "$ROOT" "${SHARED[@]}") \
    >"$LOG" 2>&1 </dev/null &
  echo $! > "$PID_FILE"
  if wait_for 60 up; then
    echo "podman-5: answering on $SOCK ($((SECONDS - started)) s)"
  else
    echo "podman-5: did not answer on $SOCK within 60 s; the end of $LOG:" >&2
    tail -n 20 "$LOG" >&2
    exit 1
  fi
}

# Stops the service the pid file names, if it runs.
stop_running() {
  [ -f "$PID_FILE" ] || return 0
  local pid; pid=$(cat "$PID_FILE")
  if kill "$pid" 2>/dev/null && ! wait_for 20 sh -c "! kill -0 $pid"; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$PID_FILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop_running ;;
  env) echo "export NARYA_TEST_PODMAN_SOCKET=$SOCK" ;;
  *)
    echo "usage: $0 start|stop|env" >&2
    exit 2
    ;;
esac
