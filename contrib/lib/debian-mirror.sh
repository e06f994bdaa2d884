# Sourced by the scripts that run mmdebstrap (contrib/image/build.sh, contrib/deb/test.sh).

# The first URI of the host's apt sources whose path ends in $1 ("/debian", "/debian-security"):
# mmdebstrap does not read the host's sources, and on machines that reach only one Debian mirror
# its defaults (deb.debian.org, security.debian.org) may not answer.
host_mirror() {
    local suffix=$1 files=()
    [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
    for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] && files+=("$f")
    done
    [ ${#files[@]} -gt 0 ] || return 0
    awk -v suffix="$suffix" '
        /^[[:space:]]*#/ { next }
        /^deb[[:space:]]/ { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; break }; next }
        /^URIs:/ { for (i = 2; i <= NF; i++) print $i }
    ' "${files[@]}" | sed 's:/*$::' | grep -E "^https?://[^ ]+${suffix}\$" | head -n1 || true
}
