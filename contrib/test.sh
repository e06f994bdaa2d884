#!/usr/bin/env bash
# Runs the whole test suite: starts containerd, dockerd and the registry on their private paths
# when they are not answering (needs root and the packages; contrib/dev/setup.sh installs them),
# then `cargo test --workspace`. Under CI=true a service that fails to start fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then
  contrib/dev/services.sh start
else
  echo "test.sh: not root, so the runtimes are not started; tests that need them will skip" >&2
fi
eval "$(contrib/dev/services.sh env)"
exec cargo test --workspace "$@"
