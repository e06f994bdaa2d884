#!/usr/bin/env bash
# Installs a narya .deb with dpkg -i into a clean Debian bookworm root and checks what an
# operator gets: the binaries, the shipped configuration as a conffile, the units installed but
# neither enabled nor started, the narya group, `naryad check-config` running there (in a
# network namespace of its own, so nothing leaves this host), and a purge that keeps
# /var/lib/narya. Needs root, mmdebstrap and chroot.
#
#   contrib/deb/test.sh PATH/TO/narya_VERSION_ARCH.deb
#
# The root (minbase plus the package's dependencies, as apt would install them) is made once a
# day into $NARYA_DEB_ROOT_CACHE (default /var/tmp/narya-deb-root) with the host's Debian mirror.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../lib/debian-mirror.sh
. "$repo_root/contrib/lib/debian-mirror.sh"

say() { echo "deb/test.sh: $*" >&2; }
failures=0
check() {
    local what=$1
    shift
    if "$@" >/dev/null 2>&1; then
        say "ok: $what"
    else
        say "FAILED: $what"
        failures=$((failures + 1))
    fi
}
die() {
    say "$*"
    exit 1
}

[ $# -eq 1 ] || die "usage: contrib/deb/test.sh PATH/TO/narya.deb"
deb=$(readlink -f "$1")
[ -f "$deb" ] || die "$1 is not a file"
[ "$(id -u)" = 0 ] || die "needs root (chroot, dpkg into a root of its own)"
command -v mmdebstrap >/dev/null || die "mmdebstrap is needed (apt-get install mmdebstrap)"

# What apt would install with the package: its Depends (containerd as the back end) and the
# Recommends that the back end needs.
readonly include=passwd,containerd,runc
cache=${NARYA_DEB_ROOT_CACHE:-/var/tmp/narya-deb-root}
tarball=$cache/bookworm-minbase-$(echo "$include" | tr ',' '-').tar
mkdir -p "$cache"
if [ -z "$(find "$tarball" -mmin -1440 2>/dev/null)" ]; then
    mirror=${DEBIAN_MIRROR:-$(host_mirror /debian)}
    mirror=${mirror:-http://deb.debian.org/debian}
    say "making a clean bookworm root with $include from $mirror (cached for a day)"
    partial=$(mktemp --suffix=.tar "$cache/.partial.XXXXXX")
    mmdebstrap --quiet --variant=minbase --include="$include" bookworm "$partial" "$mirror" \
        </dev/null >&2 || { rm -f "$partial"; die "mmdebstrap failed; is $mirror reachable?"; }
    mv "$partial" "$tarball"
fi

root=$(mktemp -d /var/tmp/narya-deb-test.XXXXXX)
cleanup() {
    # Only what this script made; --one-file-system never follows a mount out of the root.
    rm -rf --one-file-system "$root"
}
trap cleanup EXIT
tar -xf "$tarball" -C "$root"
in_root() { chroot "$root" /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

cp "$deb" "$root/tmp/narya.deb"
in_root dpkg -i /tmp/narya.deb >&2 || die "dpkg -i failed"

check "naryad and narya are in /usr/bin" test -x "$root/usr/bin/naryad" -a -x "$root/usr/bin/narya"
check "naryad runs in the root" in_root /usr/bin/naryad --version
check "narya runs in the root" in_root /usr/bin/narya --version
check "the example configuration is /etc/narya/naryad.toml" \
    cmp "$repo_root/contrib/naryad.example.toml" "$root/etc/narya/naryad.toml"
check "/etc/narya/naryad.toml is a conffile" \
    sh -c "chroot '$root' dpkg-query -W -f='\${Conffiles}' narya | grep -q ' /etc/narya/naryad.toml '"
for unit in naryad.service naryad.socket; do
    check "$unit is installed" cmp "$repo_root/contrib/systemd/$unit" "$root/lib/systemd/system/$unit"
done
check "the units are not enabled" \
    sh -c "! find '$root/etc/systemd/system' -name 'naryad*' 2>/dev/null | grep -q ."
not_started() {
    local pid
    for pid in /proc/[0-9]*; do
        [ "$(readlink "$pid/root" 2>/dev/null)" = "$root" ] && return 1
    done
    return 0
}
check "nothing of the package runs in the root" not_started
check "the narya group exists" in_root getent group narya

# check-config runs on the shipped configuration: it parses, and the identity provider, the
# runtime and the image are reported missing (an unshared network reaches nothing).
report=$root/tmp/check-config.out
set +e
unshare --net chroot "$root" /usr/bin/naryad check-config --config /etc/narya/naryad.toml \
    >"$report" 2>&1
status=$?
set -e
sed 's/^/  check-config: /' "$report" >&2
check "check-config exits 1 on the unconfigured host" test "$status" = 1
check "check-config parsed the shipped file" grep -q '^ok: /etc/narya/naryad.toml parses' "$report"
check "check-config reported the missing runtime socket" grep -q '^problem: runtime.containerd_socket' "$report"
check "check-config reported the unreachable identity provider" grep -q '^problem: identity' "$report"

mkdir -p "$root/var/lib/narya"
echo "an environment's workspace" >"$root/var/lib/narya/keep"
in_root dpkg --purge narya >&2 || die "dpkg --purge failed"
check "purge removes the binaries" test ! -e "$root/usr/bin/naryad"
check "purge removes the configuration" test ! -e "$root/etc/narya/naryad.toml"
check "purge keeps /var/lib/narya" test -f "$root/var/lib/narya/keep"

[ "$failures" = 0 ] || die "$failures check(s) failed"
say "the package installs, checks its configuration and purges cleanly"
