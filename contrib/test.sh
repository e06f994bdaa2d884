#!/usr/bin/env bash
# Runs the whole test suite. As root it first starts containerd, dockerd, the registry and Podman on
# their private paths when they are not answering (contrib/dev/services.sh), builds the official
# image once into $NARYA_IMAGE_DIR (reused afterwards) and pushes it to the test registry; then
# `cargo test --workspace`. Under CI=true a service or image that is missing fails the run;
# otherwise the tests that need it skip with a message. A whole-suite run then runs the
# end-to-end tests again with machines under gVisor.
set -euo pipefail
cd "$(dirname "$0")/.."
NARYA_IMAGE_DIR=${NARYA_IMAGE_DIR:-/var/tmp/narya-image/official}

eval "$(contrib/dev/services.sh env)"
if [ "$(id -u)" = 0 ]; then
  # A whole-suite run also starts the runtime matrix (the newer runtimes, fetched once).
  if [ $# -eq 0 ]; then contrib/dev/services.sh start matrix; else contrib/dev/services.sh start; fi
  # Read again: what `start` fetched (the old containerd for check-config) is named now.
  eval "$(contrib/dev/services.sh env)"
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
status=0
cargo test --workspace --no-fail-fast "$@" || status=$?

# The gVisor half: the end-to-end create, exec, limits, network, bounds and pool tests again,
# with the daemons' machines under gVisor (`[runtime] sandbox = "gvisor"`), on containerd, Docker
# and the Podman whose default runtime is runsc (Podman's API ignores the runtime a container
# asks for: see the README). The conformance suite's gVisor runs are in the workspace run above.
# Only for a whole-suite run.
if [ $# -eq 0 ] && [ "$(id -u)" = 0 ]; then
  if [ -x /usr/bin/runsc ]; then
    NARYA_TEST_SANDBOX=gvisor NARYA_TEST_PODMAN_SOCKET=$NARYA_TEST_PODMAN_GVISOR_SOCKET \
      NARYA_TEST_PODMAN_DIRS=$NARYA_TEST_PODMAN_GVISOR_DIRS cargo test --no-fail-fast \
      --test create --test identifiers --test exec --test limits --test network --test bounds \
      --test pool || status=$?
  elif [ "${CI:-}" = "true" ]; then
    echo "test.sh: no /usr/bin/runsc for the gVisor half (contrib/runsc/install.sh installs it)" >&2
    status=1
  else
    echo "test.sh: no /usr/bin/runsc: the gVisor half is skipped (contrib/runsc/install.sh)" >&2
  fi
fi

# The matrix half: the conformance suite and the end-to-end tests again on the newer runtimes
# (containerd 2.1, Docker 28 and Podman 5), and the conformance suite alone on containerd 1.7
# (contrib/dev/services.sh's start_matrix). Only for a whole-suite run.
if [ $# -eq 0 ] && [ "$(id -u)" = 0 ]; then
  run_dir=${NARYA_RUN_DIR:-/run/narya-test}
  if contrib/matrix/versions.sh containerd "$run_dir/containerd-2.1.sock" 2.1. \
    && contrib/matrix/versions.sh docker "$run_dir/docker-28.sock" 28. \
    && contrib/matrix/versions.sh docker "$run_dir/podman-5.sock" 5. \
    && contrib/matrix/versions.sh containerd "$run_dir/containerd-1.7.sock" 1.7.; then
    (
      eval "$(contrib/dev/services.sh env matrix)"
      status=0
      cargo test -p narya-runtimes --no-fail-fast --test containerd --test docker -- conformance \
        || status=$?
      NARYA_TEST_CONTAINERD_SOCKET=$NARYA_TEST_CONTAINERD17_SOCKET \
        cargo test -p narya-runtimes --no-fail-fast --test containerd -- conformance_with || status=$?
      cargo test --no-fail-fast --test check_config --test create --test identifiers --test exec --test limits \
        --test network --test pool --test recovery || status=$?
      exit $status
    ) || status=$?
  elif [ "${CI:-}" = "true" ]; then
    echo "test.sh: the runtime matrix is not answering with the versions it names" >&2
    status=1
  else
    echo "test.sh: the runtime matrix is not answering: its half is skipped" >&2
  fi
fi
exit $status
