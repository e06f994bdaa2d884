#!/usr/bin/env bash
# Builds, once, the Debian trixie root Podman 5 runs from (contrib/matrix/podman-5.sh): trixie's
# podman needs glibc 2.38, which bookworm lacks, so it gets a root of its own made with mmdebstrap
# from the host's Debian mirror (bookworm's debian-archive-keyring verifies trixie).
#
#   contrib/matrix/podman-root.sh [DIR]   (default: $NARYA_RUNTIMES_DIR/podman-5-root,
#                                          NARYA_RUNTIMES_DIR defaulting to /var/tmp/narya-runtimes)
#
# DIR/.narya-root-stamp marks a complete root and records what it was built from (the recipe
# below and the versions installed): with the same recipe, a run does nothing. The root is built
# beside DIR and renamed into place whole. runc, never crun: crun refuses this host's hybrid
# cgroups. Needs root and mmdebstrap (apt-get install mmdebstrap).
set -euo pipefail
NARYA_RUNTIMES_DIR=${NARYA_RUNTIMES_DIR:-/var/tmp/narya-runtimes}
dir=$(realpath -m "${1:-$NARYA_RUNTIMES_DIR/podman-5-root}")
cd "$(dirname "$0")/../.."
# shellcheck source=../lib/debian-mirror.sh
. contrib/lib/debian-mirror.sh

suite=trixie
# podman's own dependencies come with it; these are what it would otherwise pick or recommend:
# runc (crun is podman's first choice), netavark with aardvark-dns and the firewall tools it
# calls, catatonit (a container's `init`).
packages=(podman runc conmon netavark aardvark-dns nftables iptables catatonit)
stamp_file=.narya-root-stamp
recipe="suite=$suite packages=${packages[*]}"

say() { echo "podman-root: $*" >&2; }
die() { say "$*"; exit 1; }

if [ -f "$dir/$stamp_file" ] && [ "$(head -n1 "$dir/$stamp_file")" = "$recipe" ]; then
  exit 0
fi
[ "$(id -u)" = 0 ] || die "needs root"
# A root another recipe built is replaced: never under a Podman 5 that runs from it.
pid_file=${NARYA_RUN_DIR:-/run/narya-test}/podman-5.pid
if [ -d "$dir" ] && [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
  die "$dir is from another recipe and Podman 5 runs from it: contrib/matrix/podman-5.sh stop, then again"
fi
command -v mmdebstrap >/dev/null || die "mmdebstrap is needed (apt-get install mmdebstrap)"
mirror=${DEBIAN_MIRROR:-$(host_mirror /debian)}
mirror=${mirror:-http://deb.debian.org/debian}

parent=$(dirname "$dir")
mkdir -p "$parent"
work=$(mktemp -d "$parent/.$(basename "$dir").build.XXXXXX")
trap 'rm -rf "$work"' EXIT

say "building a $suite root with ${packages[*]} from $mirror into $dir"
started=$SECONDS
# Standard input is closed: without it, mmdebstrap would read apt sources from a non-terminal stdin.
# shellcheck disable=SC2016
mmdebstrap \
  --variant=minbase \
  --include="$(IFS=,; echo "${packages[*]}")" \
  --aptopt='Acquire::Languages "none"' \
  --aptopt='APT::Install-Recommends "false"' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  "$suite" "$work/root" \
  "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" \
  </dev/null || die "mmdebstrap failed (see above); is $mirror reachable?"

[ ! -e "$work/root/usr/bin/crun" ] || die "crun was installed (it refuses hybrid cgroups): check the package list"
for bin in podman runc conmon; do
  command -v "$work/root/usr/bin/$bin" >/dev/null || [ -x "$work/root/usr/libexec/podman/$bin" ] ||
    die "the root has no $bin"
done
versions=$(chroot "$work/root" dpkg-query -W -f '${Package} ${Version}\n' podman runc conmon netavark aardvark-dns)
printf '%s\n%s\n' "$recipe" "$versions" > "$work/root/$stamp_file"

# DIR appears whole: a root of an older recipe is moved aside, then removed with the work dir.
if [ -e "$dir" ]; then
  mv "$dir" "$work/previous"
fi
mv "$work/root" "$dir"
say "built in $((SECONDS - started)) s ($(du -sh "$dir" | cut -f1)): $(tr '\n' ' ' <<<"$versions")"
