#!/usr/bin/env bash
# Builds the Debian package of naryad and narya with cargo-deb (metadata: [package.metadata.deb]
# in Cargo.toml) and prints the .deb's path on stdout. cargo-deb is installed first when missing,
# at a pinned version, into $NARYA_TOOLS (default /var/tmp/narya-tools), which later runs reuse.
#
#   contrib/deb/build.sh [--out DIR] [--binaries DIR]   # the package (default: release build)
#   contrib/deb/build.sh --tool                         # only make sure cargo-deb is there
#
#   --out DIR        where the .deb goes (default: $CARGO_TARGET_DIR/debian or target/debian)
#   --binaries DIR   package the naryad and narya already built in DIR instead of building
#                    release ones (the package test uses the test build's binaries)
set -euo pipefail

readonly cargo_deb_version=3.8.0
NARYA_TOOLS=${NARYA_TOOLS:-/var/tmp/narya-tools}
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

say() { echo "deb/build.sh: $*" >&2; }
die() {
    say "$*"
    exit 1
}
usage() { sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; }

out=""
binaries=""
tool_only=0
while [ $# -gt 0 ]; do
    case "$1" in
    --out) [ $# -ge 2 ] || { usage; exit 2; }; out=$2; shift 2 ;;
    --binaries) [ $# -ge 2 ] || { usage; exit 2; }; binaries=$2; shift 2 ;;
    --tool) tool_only=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) say "unknown argument $1"; usage; exit 2 ;;
    esac
done

# cargo-deb at the pinned version: from PATH when that is the one, else from $NARYA_TOOLS,
# installed there when missing (a few minutes once; --locked keeps its dependencies as released).
ensure_cargo_deb() {
    export PATH="$NARYA_TOOLS/bin:$PATH"
    if cargo deb --version 2>/dev/null | grep -qF "$cargo_deb_version"; then
        return
    fi
    say "installing cargo-deb $cargo_deb_version into $NARYA_TOOLS"
    # Its own target directory, so a shared CARGO_TARGET_DIR is neither used nor locked.
    CARGO_TARGET_DIR="$NARYA_TOOLS/build" cargo install --quiet --locked \
        --root "$NARYA_TOOLS" --version "$cargo_deb_version" cargo-deb >&2 ||
        die "cannot install cargo-deb $cargo_deb_version"
    rm -rf "$NARYA_TOOLS/build"
    cargo deb --version 2>/dev/null | grep -qF "$cargo_deb_version" ||
        die "cargo-deb $cargo_deb_version is not the cargo deb on PATH after installing it"
}

ensure_cargo_deb
[ "$tool_only" = 0 ] || exit 0

cd "$repo_root"
target=${CARGO_TARGET_DIR:-$repo_root/target}
out=${out:-$target/debian}
mkdir -p "$out"
if [ -n "$binaries" ]; then
    for bin in naryad narya; do
        [ -x "$binaries/$bin" ] || die "$binaries/$bin is not an executable"
    done
    # cargo-deb takes binaries from <target dir>/release: a staging target dir holds copies.
    staging=$(mktemp -d)
    trap 'rm -rf "$staging"' EXIT
    mkdir -p "$staging/release"
    cp "$binaries/naryad" "$binaries/narya" "$staging/release/"
    CARGO_TARGET_DIR=$staging cargo deb -p narya --no-build --strip --fast --output "$out" --quiet >&2
else
    cargo deb -p narya --output "$out" --quiet >&2
fi
deb=$(ls -t "$out"/narya_*.deb | head -n1)
[ -f "$deb" ] || die "cargo deb wrote no package into $out"
echo "$deb"
