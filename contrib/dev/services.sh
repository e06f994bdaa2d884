#!/usr/bin/env bash
# Starts (or stops) the services Narya's tests and a development host use, on private paths:
#   containerd  unix://$NARYA_RUN_DIR/containerd.sock   (state under $NARYA_DATA_DIR/containerd)
#   dockerd     unix://$NARYA_RUN_DIR/docker.sock       (with its own containerd)
#   registry    http://$NARYA_REGISTRY                  (Debian's docker-registry, distribution 2.8)
#   podman      unix://$NARYA_RUN_DIR/podman.sock       (Podman's Docker-compatible service; its
#               own storage under $NARYA_DATA_DIR/podman, its own registries.conf)
# $NARYA_DATA_DIR is first mounted from a btrfs image with simple quotas on ($NARYA_DISK_IMAGE,
# sparse, kept between runs), so that `[limits] disk` can bound what environments write to the
# runtimes' writable layers and to workspaces under $NARYA_DATA_DIR/tests (tests' state dirs).
# Each is started only if it is not answering already. Needs root and the Debian packages
# containerd, runc, docker.io, docker-registry and podman (contrib/dev/setup.sh or .ci/run
# install them).
# Under CI=true any service that does not come up is a failure; otherwise a warning.
#
#   contrib/dev/services.sh start | stop | env
set -uo pipefail

NARYA_RUN_DIR=${NARYA_RUN_DIR:-/run/narya-test}
NARYA_DATA_DIR=${NARYA_DATA_DIR:-/var/lib/narya-test}
NARYA_REGISTRY=${NARYA_REGISTRY:-127.0.0.1:5000}
CONTAINERD_SOCK=$NARYA_RUN_DIR/containerd.sock
DOCKER_SOCK=$NARYA_RUN_DIR/docker.sock
PODMAN_SOCK=$NARYA_RUN_DIR/podman.sock
PODMAN_CONF=$NARYA_RUN_DIR/podman
LOG_DIR=$NARYA_RUN_DIR/logs
NARYA_DISK_IMAGE=${NARYA_DISK_IMAGE:-/var/tmp/narya-test-disk.btrfs}
NARYA_DISK_SIZE=${NARYA_DISK_SIZE:-64G}

failures=0
fail() {
  echo "services: $*" >&2
  failures=$((failures + 1))
}

# wait_for SECONDS COMMAND...: polls COMMAND until it succeeds.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.2
  done
}

containerd_up() { ctr --address "$CONTAINERD_SOCK" version; }
docker_up() { docker -H "unix://$DOCKER_SOCK" version; }
registry_up() { curl -fsS "http://$NARYA_REGISTRY/v2/"; }
podman_up() { curl -fsS --unix-socket "$PODMAN_SOCK" http://d/_ping; }

# Podman reads its configuration from files; these keep it off the host's own (its storage,
# registries and containers.conf) and let it pull from the plain-HTTP test registry.
podman_env() {
  export CONTAINERS_REGISTRIES_CONF=$PODMAN_CONF/registries.conf
  export CONTAINERS_STORAGE_CONF=$PODMAN_CONF/storage.conf
  export CONTAINERS_CONF=$PODMAN_CONF/containers.conf
}

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

start_containerd() {
  if containerd_up >/dev/null 2>&1; then echo "containerd: already answering on $CONTAINERD_SOCK"; return; fi
  command -v containerd >/dev/null || { fail "containerd is not installed (apt-get install containerd runc)"; return; }
  mkdir -p "$NARYA_DATA_DIR/containerd" "$NARYA_RUN_DIR/containerd-state"
  rm -f "$CONTAINERD_SOCK"
  # An empty config file: the package's /etc/containerd/config.toml must not leak in.
  printf 'version = 2\n' > "$NARYA_RUN_DIR/containerd.toml"
  setsid containerd --config "$NARYA_RUN_DIR/containerd.toml" \
    --root "$NARYA_DATA_DIR/containerd" --state "$NARYA_RUN_DIR/containerd-state" \
    --address "$CONTAINERD_SOCK" >"$LOG_DIR/containerd.log" 2>&1 < /dev/null &
  echo $! > "$NARYA_RUN_DIR/containerd.pid"
  if wait_for 30 containerd_up; then
    echo "containerd: answering on $CONTAINERD_SOCK"
  else
    fail "containerd did not answer on $CONTAINERD_SOCK within 30 s; see $LOG_DIR/containerd.log"
    tail -n 20 "$LOG_DIR/containerd.log" >&2
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

start_dockerd() {
  # One started before runsc was installed lacks the runtime: it starts again with it.
  if docker_up >/dev/null 2>&1 && [ -x "$RUNSC_WRAPPER" ] \
    && ! curl -fsS --unix-socket "$DOCKER_SOCK" http://d/info | grep -q '"runsc"'; then
    echo "dockerd: restarting to register runsc"
    stop_pidfile "$NARYA_RUN_DIR/docker.pid"
  fi
  if docker_up >/dev/null 2>&1; then echo "dockerd: already answering on $DOCKER_SOCK"; return; fi
  command -v dockerd >/dev/null || { fail "dockerd is not installed (apt-get install docker.io)"; return; }
  mkdir -p "$NARYA_DATA_DIR/docker" "$NARYA_RUN_DIR/docker-exec"
  rm -f "$DOCKER_SOCK"
  local runtimes=()
  [ ! -x "$RUNSC_WRAPPER" ] || runtimes=(--add-runtime "runsc=$RUNSC_WRAPPER")
  setsid dockerd "${runtimes[@]}" --data-root "$NARYA_DATA_DIR/docker" --exec-root "$NARYA_RUN_DIR/docker-exec" \
    -H "unix://$DOCKER_SOCK" --pidfile "$NARYA_RUN_DIR/docker.pid" \
    --bridge=none --storage-driver overlay2 \
    >"$LOG_DIR/dockerd.log" 2>&1 < /dev/null &
  if wait_for 60 docker_up; then
    echo "dockerd: answering on $DOCKER_SOCK"
  else
    fail "dockerd did not answer on $DOCKER_SOCK within 60 s; see $LOG_DIR/dockerd.log"
    tail -n 20 "$LOG_DIR/dockerd.log" >&2
  fi
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

start_podman() {
  if podman_up >/dev/null 2>&1; then echo "podman: already answering on $PODMAN_SOCK"; return; fi
  command -v podman >/dev/null || { fail "podman is not installed (apt-get install podman)"; return; }
  mkdir -p "$PODMAN_CONF" "$NARYA_DATA_DIR/podman/storage" "$NARYA_RUN_DIR/podman-run" "$NARYA_RUN_DIR/podman-tmp"
  cat > "$PODMAN_CONF/registries.conf" <<CONF
unqualified-search-registries = []

[[registry]]
location = "$NARYA_REGISTRY"
insecure = true
CONF
  cat > "$PODMAN_CONF/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$NARYA_DATA_DIR/podman/storage"
runroot = "$NARYA_RUN_DIR/podman-run"
CONF
  # cgroupfs: no systemd runs here. No `cgroupns`: naryad asks each container's private cgroup
  # namespace itself (Podman reads the setting only on cgroup v2, where private is its default).
  cat > "$PODMAN_CONF/containers.conf" <<CONF
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$NARYA_RUN_DIR/podman-events.log"
tmp_dir = "$NARYA_RUN_DIR/podman-tmp"
static_dir = "$NARYA_DATA_DIR/podman/libpod"
volume_path = "$NARYA_DATA_DIR/podman/volumes"

[network]
network_config_dir = "$PODMAN_CONF/networks"
CONF
  if [ -x "$RUNSC_WRAPPER" ]; then
    printf '\n[engine.runtimes]\nrunsc = ["%s"]\n' "$RUNSC_WRAPPER" >> "$PODMAN_CONF/containers.conf"
  fi
  rm -f "$PODMAN_SOCK"
  podman_env
  # From /: conmon, which starts every container, inherits the service's working directory and
  # fails each start ("Failed to get working directory") once that directory is deleted.
  (cd / && exec setsid podman --root "$NARYA_DATA_DIR/podman/storage" --runroot "$NARYA_RUN_DIR/podman-run" \
    --cgroup-manager cgroupfs --tmpdir "$NARYA_RUN_DIR/podman-tmp" \
    system service --time=0 "unix://$PODMAN_SOCK") \
    >"$LOG_DIR/podman.log" 2>&1 < /dev/null &
  echo $! > "$NARYA_RUN_DIR/podman.pid"
  if wait_for 60 podman_up; then
    echo "podman: answering on $PODMAN_SOCK"
  else
    fail "podman did not answer on $PODMAN_SOCK within 60 s; see $LOG_DIR/podman.log"
    tail -n 20 "$LOG_DIR/podman.log" >&2
  fi
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
    start_podman
    ;;
  stop)
    stop_pidfile "$NARYA_RUN_DIR/podman.pid"
    stop_pidfile "$NARYA_RUN_DIR/docker.pid"
    stop_pidfile "$NARYA_RUN_DIR/registry.pid"
    stop_pidfile "$NARYA_RUN_DIR/containerd.pid"
    ;;
  env)
    echo "export NARYA_TEST_CONTAINERD_SOCKET=$CONTAINERD_SOCK"
    echo "export NARYA_TEST_DOCKER_SOCKET=$DOCKER_SOCK"
    echo "export NARYA_TEST_REGISTRY=$NARYA_REGISTRY"
    # Where the runtimes keep their state, for tests that look for what must never be there.
    echo "export NARYA_RUN_DIR=$NARYA_RUN_DIR"
    echo "export NARYA_DATA_DIR=$NARYA_DATA_DIR"
    echo "export NARYA_TEST_PODMAN_SOCKET=$PODMAN_SOCK"
    # Tests' state directories go here: the filesystem the runtimes' layers are on, with quotas.
    echo "export NARYA_TEST_STATE_ROOT=$NARYA_DATA_DIR/tests"
    exit 0
    ;;
  *)
    echo "usage: $0 start|stop|env" >&2
    exit 2
    ;;
esac

if [ "$failures" -gt 0 ]; then
  if [ "${CI:-}" = "true" ]; then
    echo "services: $failures service(s) failed to start; under CI=true that fails the run" >&2
    exit 1
  fi
  echo "services: $failures service(s) not running; tests that need them will skip (never under CI=true)" >&2
fi
exit 0
