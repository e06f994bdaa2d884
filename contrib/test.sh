#!/usr/bin/env bash
# Runs the whole test suite. As root it first starts containerd, dockerd, the registry and Podman on
# their private paths when they are not answering (contrib/dev/services.sh), builds the official
# image once into $NARYA_IMAGE_DIR (reused afterwards) and pushes it to the test registry; then
# `cargo test --workspace`. Under CI=true a service or image that is missing fails the run;
# otherwise the tests that need it skip with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
NARYA_IMAGE_DIR=${NARYA_IMAGE_DIR:-/var/tmp/narya-image/official}

eval "$(contrib/dev/services.sh env)"
if [ "$(id -u)" = 0 ]; then
  contrib/dev/services.sh start
  cargo build --bin naryad
  if contrib/image/build.sh "$NARYA_IMAGE_DIR" --push "$NARYA_TEST_REGISTRY/narya/official:test" >/dev/null; then
    export NARYA_TEST_IMAGE_LAYOUT=$NARYA_IMAGE_DIR
    export NARYA_TEST_IMAGE_REF=$NARYA_TEST_REGISTRY/narya/official:test
  else
    [ "${CI:-}" != "true" ] || { echo "test.sh: the official image could not be built or pushed" >&2; exit 1; }
    echo "test.sh: no official image; tests that need it will skip" >&2
  fi
else
  echo "test.sh: not root, so the runtimes are not started; tests that need them will skip" >&2
fi
exec cargo test --workspace --no-fail-fast "$@"
