#!/usr/bin/env bash
# Sets up a development host on Debian bookworm and runs naryad with embedded defaults:
# the packages, containerd/dockerd/registry (contrib/dev/services.sh), the binaries in
# /usr/local/bin, the official image as an OCI layout in /var/lib/narya/images/official
# (built once, reused), a development identity key whose key set naryad reads from a file, a
# configuration at /etc/narya/naryad.toml (kept if present), the daemon in the background,
# and a 24-hour development token. Run as root from the repository; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/../.."

DEV_DIR=/var/lib/narya/dev
CONFIG=/etc/narya/naryad.toml
SOCKET=/run/narya/narya.sock
LOG=/var/log/naryad.log

[ "$(id -u)" = 0 ] || { echo "setup.sh: run as root (it installs packages and starts services)" >&2; exit 1; }

echo "== packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  protobuf-compiler containerd runc docker.io docker-registry mmdebstrap skopeo \
  podman openssl ca-certificates curl git iproute2 iptables containernetworking-plugins btrfs-progs python3 >/dev/null

echo "== services"
# gVisor for [runtime] sandbox = "gvisor" and the test suite's gVisor half (bookworm-backports).
contrib/runsc/install.sh
contrib/dev/services.sh start
eval "$(contrib/dev/services.sh env)"

echo "== build"
cargo build --release --bins --locked
target=${CARGO_TARGET_DIR:-target}
install -m 0755 "$target/release/naryad" "$target/release/narya" /usr/local/bin/

echo "== official image"
NARYAD=/usr/local/bin/naryad contrib/image/build.sh /var/lib/narya/images/official

echo "== development identity"
mkdir -p "$DEV_DIR"
chmod 0700 "$DEV_DIR"
if [ ! -f "$DEV_DIR/identity.pem" ]; then
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$DEV_DIR/identity.pem" 2>/dev/null
fi
narya dev jwks --key "$DEV_DIR/identity.pem" > "$DEV_DIR/jwks.json"

echo "== configuration"
if [ ! -f "$CONFIG" ]; then
  # naryad refuses a limits.nofile above its own hard limit of open files.
  NOFILE=$(ulimit -Hn)
  if [ "$NOFILE" = unlimited ] || [ "$NOFILE" -gt 65536 ]; then NOFILE=65536; fi
  mkdir -p "$(dirname "$CONFIG")"
  cat > "$CONFIG" <<TOML
# Development host configuration written by contrib/dev/setup.sh; every other key has its default.
# The state (workspaces) shares the runtimes' XFS filesystem with project quotas, so that
# [limits] disk bounds each environment (services.sh mounts it).
state_dir = "$NARYA_DATA_DIR/naryad"

[identity]
issuer = "narya-dev"
audience = "narya"
jwks_uri = "file://$DEV_DIR/jwks.json"

[runtime]
containerd_socket = "$NARYA_TEST_CONTAINERD_SOCKET"
docker_socket = "$NARYA_TEST_DOCKER_SOCKET"

[image]
insecure_registries = ["$NARYA_TEST_REGISTRY"]

[limits]
nofile = $NOFILE                        # the default 65536, or this host's hard limit if lower
TOML
  echo "wrote $CONFIG"
else
  echo "keeping $CONFIG"
fi

echo "== naryad"
if [ -f /run/narya/naryad.pid ] && kill -0 "$(cat /run/narya/naryad.pid)" 2>/dev/null; then
  kill "$(cat /run/narya/naryad.pid)"
  for _ in $(seq 100); do kill -0 "$(cat /run/narya/naryad.pid)" 2>/dev/null || break; sleep 0.1; done
fi
mkdir -p /run/narya
setsid naryad --config "$CONFIG" >>"$LOG" 2>&1 < /dev/null &
echo $! > /run/narya/naryad.pid
for _ in $(seq 100); do [ -S "$SOCKET" ] && break; sleep 0.1; done
[ -S "$SOCKET" ] || { echo "naryad did not start; see $LOG" >&2; tail -n 20 "$LOG" >&2; exit 1; }

narya dev token --key "$DEV_DIR/identity.pem" --issuer narya-dev --audience narya \
  --person "$(id -un)" --organisation dev --ttl 24h > "$DEV_DIR/token"
chmod 0600 "$DEV_DIR/token"

cat <<DONE

naryad is running (pid $(cat /run/narya/naryad.pid), log $LOG, socket $SOCKET).
A development token valid for 24 hours is in $DEV_DIR/token:

  export NARYA_TOKEN=\$(cat $DEV_DIR/token)
  narya env list
DONE
