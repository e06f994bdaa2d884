#!/usr/bin/env bash
# Refuses a matrix run whose runtimes are not the ones the README's table names: each socket must
# answer, and with a version of the series expected of it.
#
#   contrib/matrix/versions.sh containerd|docker SOCKET SERIES
#
# e.g. `versions.sh containerd /run/narya-test/containerd-2.1.sock 2.1`; `docker` also covers
# Podman's compatible service (`versions.sh docker /run/narya-test/podman-5.sock 5.`).
set -euo pipefail
kind=$1 socket=$2 series=$3

case "$kind" in
  containerd)
    version=$(ctr --address "$socket" version 2>/dev/null \
      | awk '/^Server:/ { server = 1 } server && $1 == "Version:" { print $2; exit }') || true
    ;;
  docker)
    version=$(curl -fsS --unix-socket "$socket" http://d/version 2>/dev/null \
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["Version"])') || true
    ;;
  *)
    echo "usage: $0 containerd|docker SOCKET SERIES" >&2
    exit 2
    ;;
esac
version=${version#v}
if [ -z "${version:-}" ]; then
  echo "versions.sh: nothing answers on $socket" >&2
  exit 1
fi
case "$version" in
  "$series"*) echo "versions.sh: $socket: $kind $version" ;;
  *)
    echo "versions.sh: $socket answers with $kind $version, not the $series series the matrix names" >&2
    exit 1
    ;;
esac
