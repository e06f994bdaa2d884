# Sourced by the scripts that start services (contrib/dev/services.sh, contrib/matrix/podman-5.sh).

# wait_for SECONDS COMMAND...: polls COMMAND until it succeeds; 1 when SECONDS pass first.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.2
  done
}
