#!/usr/bin/env bash
# Installs gVisor's runsc for `[runtime] sandbox = "gvisor"` on Debian bookworm: bookworm's own
# runsc (20221219) is too old for these kernels, so it comes from bookworm-backports (20240729),
# on the host's own Debian mirror (the first `.../debian` URI of its apt sources), through a
# sources file of its own that adds only the backports suite (apt prefers bookworm's own
# packages otherwise). Run as root; idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
. contrib/lib/debian-mirror.sh

if runsc --version 2>/dev/null | grep -q '20240729'; then
  echo "runsc: $(runsc --version | head -n1)"
  exit 0
fi
mirror=$(host_mirror /debian)
mirror=${mirror:-http://deb.debian.org/debian}
cat > /etc/apt/sources.list.d/narya-backports.sources <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports runsc >/dev/null
echo "runsc: $(runsc --version | head -n1)"
