#!/usr/bin/env bash
# Builds Narya's official image from Debian bookworm with mmdebstrap, reproducibly: the same
# mirror content and SOURCE_DATE_EPOCH give the same manifest digest. Writes an OCI image layout
# in DIR (manifest named "official") and the same layout as an oci-archive in DIR.tar, and pushes
# it to a registry when asked. Prints the manifest digest (sha256:...) on stdout at the end.
#
# The image is a base a setup script can build on: fetching and unpacking tools, a C toolchain,
# Python with venv and pip, an SSH client, tzdata and the C.UTF-8 locale (built into glibc). The
# user narya (1000:1000) has its HOME in /home/narya, apart from the workspace, and owns
# /usr/local and /opt, so `make install` and tarball installers work without root.
#
# DIR is reused when it holds a layout this same recipe built: DIR/.narya-build-stamp records a
# hash of what decides the image's content (this script, the mirror helper, the packer's source,
# SOURCE_DATE_EPOCH); a layout without it or with another one is built afresh.
#
# Environment:
#   SOURCE_DATE_EPOCH   timestamps of the image (default: 1747699200, 2025-05-20T00:00:00Z)
#   DEBIAN_MIRROR       Debian archive (default: the host's apt source for Debian, else deb.debian.org)
#   DEBIAN_SECURITY_MIRROR  security archive (default: the host's, else deb.debian.org/debian-security)
#   NARYAD              the naryad binary that packs the layout (default: the newest cargo build
#                       under ${CARGO_TARGET_DIR:-target}, else naryad on PATH)
set -euo pipefail

usage() {
    cat >&2 <<'EOF'
usage: contrib/image/build.sh DIR [--rebuild] [--push HOST[:PORT]/REPO:TAG [--insecure]]

  DIR         where the OCI image layout goes (DIR.tar gets the same as an oci-archive);
              an existing layout there is reused when this recipe built it (its
              .narya-build-stamp matches) unless --rebuild is given
  --rebuild   build afresh even when DIR already holds a layout
  --push REF  copy the image to the registry at REF, keeping its manifest digest
  --insecure  talk to that registry over plain HTTP / without verifying TLS
              (implied for 127.0.0.1, localhost and [::1])
EOF
}

say() { echo "build.sh: $*" >&2; }
die() {
    say "$*"
    exit 1
}

dir=""
push=""
rebuild=0
insecure=0
while [ $# -gt 0 ]; do
    case "$1" in
    --push)
        [ $# -ge 2 ] || { usage; exit 2; }
        push=$2
        shift 2
        ;;
    --push=*) push=${1#--push=}; shift ;;
    --rebuild) rebuild=1; shift ;;
    --insecure) insecure=1; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) say "unknown option $1"; usage; exit 2 ;;
    *)
        [ -z "$dir" ] || { say "give one DIR, not \"$dir\" and \"$1\""; usage; exit 2; }
        dir=$1
        shift
        ;;
    esac
done
[ -n "$dir" ] || { usage; exit 2; }
dir=${dir%/}
case "$push" in
"" | */*:*) ;;
*) die "--push wants HOST[:PORT]/REPO:TAG, e.g. 127.0.0.1:5000/narya/official:1 (got \"$push\")" ;;
esac

readonly suite=bookworm
readonly tag=official
readonly user_id=1000
readonly group_id=1000
readonly workspace=/workspace
readonly home=/home/narya
# Besides minbase (Essential and apt): what a setup script reaches for first.
readonly packages=(
    bash ca-certificates git tini
    curl wget openssh-client
    xz-utils zstd bzip2 unzip zip
    build-essential pkg-config
    python3 python3-venv python3-pip
    procps less jq file tzdata
)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1747699200}
case "$SOURCE_DATE_EPOCH" in
'' | *[!0-9]*) die "SOURCE_DATE_EPOCH must be a number of seconds (got \"$SOURCE_DATE_EPOCH\")" ;;
esac
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
started=$(date +%s)

# What decides the image's content besides the mirror: a layout whose stamp differs was built by
# another recipe (say, before a package was added) and is not reused.
readonly stamp_file=.narya-build-stamp
recipe_stamp() {
    {
        echo "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH"
        for f in contrib/image/build.sh contrib/lib/debian-mirror.sh oci/src/layout/pack.rs; do
            if [ -f "$repo_root/$f" ]; then
                echo "$f $(sha256sum <"$repo_root/$f" | cut -d' ' -f1)"
            else
                echo "$f absent"
            fi
        done
    } | sha256sum | cut -d' ' -f1
}
stamp=$(recipe_stamp)

# The manifest digest a layout's index.json names (the packer writes exactly one).
layout_digest() {
    grep -o '"digest":"sha256:[0-9a-f]\{64\}"' "$1/index.json" | head -n1 | cut -d'"' -f4
}

# host_mirror SUFFIX: the host's Debian mirror (see contrib/lib/debian-mirror.sh).
# shellcheck source=../lib/debian-mirror.sh
. "$repo_root/contrib/lib/debian-mirror.sh"

find_naryad() {
    if [ -n "${NARYAD:-}" ]; then
        [ -x "$NARYAD" ] || die "NARYAD=$NARYAD is not an executable"
        echo "$NARYAD"
        return
    fi
    local target=${CARGO_TARGET_DIR:-$repo_root/target} best=""
    for candidate in "$target/release/naryad" "$target/debug/naryad"; do
        if [ -x "$candidate" ] && { [ -z "$best" ] || [ "$candidate" -nt "$best" ]; }; then
            best=$candidate
        fi
    done
    if [ -z "$best" ]; then
        best=$(command -v naryad || true)
    fi
    [ -n "$best" ] || die "no naryad binary to pack the image with: run 'cargo build --bin naryad' or set NARYAD"
    echo "$best"
}

push_image() {
    local digest=$1 host=${push%%/*} tls=true pushed
    case "$host" in
    127.0.0.1 | 127.0.0.1:* | localhost | localhost:* | "[::1]" | "[::1]:"*) tls=false ;;
    esac
    if [ "$insecure" = 1 ]; then tls=false; fi
    command -v skopeo >/dev/null || die "skopeo is needed for --push (apt-get install skopeo)"
    say "pushing $digest to $push"
    # --preserve-digests: fail rather than let skopeo convert the manifest to another digest.
    skopeo copy --quiet --preserve-digests --dest-tls-verify="$tls" \
        "oci:$dir:$tag" "docker://$push" >&2 ||
        die "pushing to $push failed (is the registry up? plain HTTP needs --insecure)"
    pushed=$(skopeo inspect --raw --tls-verify="$tls" "docker://$push" | sha256sum | cut -d' ' -f1) ||
        die "cannot read the manifest back from $push"
    [ "sha256:$pushed" = "$digest" ] ||
        die "the registry holds manifest sha256:$pushed for $push, not the layout's $digest"
    say "pushed: $push@$digest"
}

if [ -f "$dir/index.json" ] && [ "$rebuild" = 0 ] &&
    [ "$(cat "$dir/$stamp_file" 2>/dev/null)" != "$stamp" ]; then
    say "$dir holds a layout built by another recipe (its $stamp_file differs): building afresh"
    rebuild=1
fi
if [ -f "$dir/index.json" ] && [ "$rebuild" = 0 ]; then
    digest=$(layout_digest "$dir")
    [ -n "$digest" ] || die "$dir/index.json names no manifest; rebuild with --rebuild"
    say "$dir already holds the image $digest (reused; --rebuild to build afresh)"
    [ -z "$push" ] || push_image "$digest"
    echo "$digest"
    exit 0
fi

command -v mmdebstrap >/dev/null || die "mmdebstrap is needed (apt-get install mmdebstrap)"
naryad=$(find_naryad)
mirror=${DEBIAN_MIRROR:-$(host_mirror /debian)}
mirror=${mirror:-http://deb.debian.org/debian}
security_mirror=${DEBIAN_SECURITY_MIRROR:-$(host_mirror /debian-security)}
security_mirror=${security_mirror:-http://deb.debian.org/debian-security}

parent=$(dirname "$dir")
mkdir -p "$parent"
# Built beside DIR (same file system, so the final renames are atomic) and cleaned up on any exit.
work=$(mktemp -d "$parent/.$(basename "$dir").build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Runs inside mmdebstrap with the chroot as $1. Writes the account lines itself: minbase has no
# useradd (passwd is not Essential).
shadow_day=$((SOURCE_DATE_EPOCH / 86400))
customize=$(
    cat <<EOF
set -eu
root="\$1"
# The runtime provides these; the build host's must not end up in the image.
: > "\$root/etc/resolv.conf"
: > "\$root/etc/hostname"
chmod 0644 "\$root/etc/resolv.conf" "\$root/etc/hostname"
if ! grep -q '^narya:' "\$root/etc/passwd"; then
    echo 'narya:x:$group_id:' >> "\$root/etc/group"
    echo 'narya:x:$user_id:$group_id:Narya:$home:/bin/bash' >> "\$root/etc/passwd"
    if [ -f "\$root/etc/gshadow" ]; then echo 'narya:!::' >> "\$root/etc/gshadow"; fi
    if [ -f "\$root/etc/shadow" ]; then echo 'narya:*:$shadow_day:0:99999:7:::' >> "\$root/etc/shadow"; fi
fi
install -d -m 0755 -o $user_id -g $group_id "\$root$workspace"
# The user's home, as useradd -m would make it (with /etc/skel's dotfiles).
install -d -m 0755 -o $user_id -g $group_id "\$root$home"
cp -a "\$root/etc/skel/." "\$root$home/"
chown -R -h $user_id:$group_id "\$root$home"
# Installers (make install, tarballs) write here as the user, without root.
install -d -m 0755 "\$root/opt"
chown -R -h $user_id:$group_id "\$root/usr/local" "\$root/opt"
rm -rf "\$root"/var/lib/apt/lists/* "\$root"/var/cache/apt/* \\
    "\$root"/var/cache/debconf/*-old "\$root"/var/lib/dpkg/*-old
EOF
)

say "building $suite (minbase) from $mirror and $security_mirror, SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH"
# Standard input is closed: without it, mmdebstrap would read apt sources from a non-terminal stdin.
TMPDIR=$work mmdebstrap \
    --variant=minbase \
    --include="$(IFS=,; echo "${packages[*]}")" \
    --format=tar \
    --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --customize-hook="$customize" \
    "$suite" "$work/rootfs.tar" \
    "deb $mirror $suite main" \
    "deb $mirror $suite-updates main" \
    "deb $security_mirror $suite-security main" \
    </dev/null || die "mmdebstrap failed (see above); is $mirror reachable?"

say "packing with $naryad"
digest=$("$naryad" pack-image \
    --rootfs "$work/rootfs.tar" \
    --out "$work/layout" \
    --archive "$work/layout.tar" \
    --tag "$tag" \
    --user "$user_id:$group_id" \
    --workdir "$workspace") || die "packing the layout failed (see above)"

# skopeo reading the layout back to the same manifest is the check that matters to runtimes.
if command -v skopeo >/dev/null; then
    check=$(skopeo inspect --raw "oci:$work/layout:$tag" | sha256sum | cut -d' ' -f1) ||
        die "skopeo cannot read the layout the packer wrote (see above)"
    [ "sha256:$check" = "$digest" ] || die "skopeo reads manifest sha256:$check from the layout, not $digest"
fi

# DIR appears whole or not at all: the archive first, then the layout (its index.json is what
# marks DIR as built).
if [ -e "$dir" ]; then
    mv "$dir" "$work/previous"
fi
mv -f "$work/layout.tar" "$dir.tar"
echo "$stamp" > "$work/layout/$stamp_file"
mv "$work/layout" "$dir"

rootfs_size=$(stat -c %s "$work/rootfs.tar")
image_size=$(du -sb "$dir/blobs" | cut -f1)
say "built $dir ($((image_size / 1024 / 1024)) MiB compressed, rootfs $((rootfs_size / 1024 / 1024)) MiB) in $(($(date +%s) - started)) s: $digest"
[ -z "$push" ] || push_image "$digest"
echo "$digest"
