#!/usr/bin/env bash
# Fetches the newer (and one older) runtimes the test matrix runs beside bookworm's own, from
# Debian's registry, without installing anything on the host: a private apt state (its own
# sources, lists and cache) downloads each pinned package and `dpkg -x` unpacks it into a
# directory of its own under $NARYA_RUNTIMES_DIR, kept between runs. Their binaries need only
# libc, so they run on bookworm as they are.
#
#   contrib/matrix/fetch.sh               fetch every package below (cached: a no-op once done)
#   contrib/matrix/fetch.sh --dir NAME    print NAME's directory (after fetching it if needed)
#   contrib/matrix/fetch.sh --cached NAME print NAME's directory if it is fetched; else exit 1
#
# NAME        package     suite     pinned version
PINNED='
containerd-2.1 containerd sid      2.1.9+ds1-5
docker-28      docker.io  sid      28.5.2+dfsg4-5
containerd-1.7 containerd trixie   1.7.24~ds1-6+deb13u1
containerd-1.4 containerd bullseye 1.4.13~ds1-1~deb11u4
'
# A suite that moved past a pinned version keeps its series: the suite's own version of the same
# major.minor is taken instead, and the run says so (the versions check then names it).
set -euo pipefail
cd "$(dirname "$0")/../.."
. contrib/lib/debian-mirror.sh

NARYA_RUNTIMES_DIR=${NARYA_RUNTIMES_DIR:-/var/tmp/narya-runtimes}
APT_DIR=$NARYA_RUNTIMES_DIR/apt

row() { awk -v name="$1" '$1 == name' <<<"$PINNED"; }

dir_of() { echo "$NARYA_RUNTIMES_DIR/$1"; }

apt_opts() {
  echo "-o Dir::Etc::SourceList=$APT_DIR/sources.list -o Dir::Etc::SourceParts=/dev/null" \
    "-o Dir::State=$APT_DIR/state -o Dir::State::status=$APT_DIR/state/status" \
    "-o Dir::Cache=$APT_DIR/cache -o Debug::NoLocking=1 -o APT::Sandbox::User=root"
}

# The private apt state, updated at most once per run.
updated=
apt_update() {
  [ -z "$updated" ] || return 0
  local mirror; mirror=$(host_mirror /debian)
  mirror=${mirror:-http://deb.debian.org/debian}
  mkdir -p "$APT_DIR/state/lists/partial" "$APT_DIR/cache/archives/partial"
  : > "$APT_DIR/state/status"
  : > "$APT_DIR/sources.list"
  local suite
  for suite in $(awk 'NF { print $3 }' <<<"$PINNED" | sort -u); do
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" >> "$APT_DIR/sources.list"
  done
  # shellcheck disable=SC2046
  apt-get $(apt_opts) update -qq >/dev/null
  updated=1
}

# The version of $1 in suite $2 closest to $3: $3 itself if the suite has it, else the suite's
# version of the same major.minor. (`apt-cache show` answers 0 for a version it lacks, so the
# suite's versions come from madison.)
version_in_suite() {
  local package=$1 suite=$2 pinned=$3 versions
  # shellcheck disable=SC2046
  versions=$(apt-cache $(apt_opts) madison "$package" | awk -F'|' -v suite=" $suite/" \
    'index($3, suite) { gsub(/ /, "", $2); print $2 }')
  if grep -qxF "$pinned" <<<"$versions"; then echo "$pinned"; return; fi
  local series=${pinned%.*}.
  grep -m1 -F "$series" <<<"$versions" | grep -E "^${series//./\\.}" || true
}

fetch() {
  local name=$1 package suite pinned version dir
  read -r _ package suite pinned <<<"$(row "$name")"
  [ -n "$package" ] || { echo "fetch.sh: no runtime named $name" >&2; exit 2; }
  dir=$(dir_of "$name")
  [ -f "$dir/.fetched" ] && return 0
  apt_update
  version=$(version_in_suite "$package" "$suite" "$pinned")
  [ -n "$version" ] || { echo "fetch.sh: $suite has no $package of the ${pinned%.*} series" >&2; exit 1; }
  [ "$version" = "$pinned" ] || echo "fetch.sh: $suite has $package $version, not the pinned $pinned; taking it" >&2
  rm -rf "$dir" "$dir.tmp"
  mkdir -p "$dir.tmp"
  (cd "$APT_DIR/cache/archives" && apt-get $(apt_opts) download -qq "$package=$version" >/dev/null)
  dpkg -x "$APT_DIR/cache/archives/${package}_${version//:/%3a}_amd64.deb" "$dir.tmp"
  echo "$package $version ($suite)" > "$dir.tmp/.fetched"
  mv "$dir.tmp" "$dir"
  echo "fetch.sh: $name: $package $version from $suite in $dir"
}

case "${1:-}" in
  "")
    for name in $(awk 'NF { print $1 }' <<<"$PINNED"); do fetch "$name"; done
    ;;
  --dir)
    fetch "$2"
    dir_of "$2"
    ;;
  --cached)
    [ -f "$(dir_of "$2")/.fetched" ] || exit 1
    dir_of "$2"
    ;;
  *)
    echo "usage: $0 [--dir NAME | --cached NAME]" >&2
    exit 2
    ;;
esac
