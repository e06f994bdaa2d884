# Sourced by the scripts that start a Podman service for tests (contrib/dev/services.sh's Podman,
# contrib/matrix/podman-5.sh's). Podman reads its configuration from files; these keep a service
# off the host's own (its storage, registries and containers.conf) and let it pull from the
# plain-HTTP test registry.

# write_podman_conf CONF_DIR DATA_DIR RUN_PREFIX REGISTRY [RUNTIME [RUNSC]]: writes
# CONF_DIR/{registries,storage,containers}.conf for a service whose storage is DATA_DIR/storage
# (its database and volumes beside it in DATA_DIR), whose run directory is RUN_PREFIX-run (its
# scratch RUN_PREFIX-tmp, its events RUN_PREFIX-events.log) and whose networks are kept in
# CONF_DIR/networks; REGISTRY is reached over plain HTTP. RUNTIME, when given, is the default OCI
# runtime; RUNSC, when given, the path of the runtime registered as "runsc". Makes the
# directories.
write_podman_conf() {
  local conf=$1 data=$2 run=$3 registry=$4 runtime=${5:-} runsc=${6:-}
  mkdir -p "$conf" "$data/storage" "$run-run" "$run-tmp" || return
  cat > "$conf/registries.conf" <<CONF || return
unqualified-search-registries = []

[[registry]]
location = "$registry"
insecure = true
CONF
  cat > "$conf/storage.conf" <<CONF || return
[storage]
driver = "overlay"
graphroot = "$data/storage"
runroot = "$run-run"
CONF
  # cgroupfs: no systemd runs here. No `cgroupns`: naryad asks each container's private cgroup
  # namespace itself (Podman reads the setting only on cgroup v2, where private is its default).
  {
    cat <<CONF
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$run-events.log"
tmp_dir = "$run-tmp"
static_dir = "$data/libpod"
volume_path = "$data/volumes"
CONF
    [ -z "$runtime" ] || printf 'runtime = "%s"\n' "$runtime"
    printf '\n[network]\nnetwork_config_dir = "%s"\n' "$conf/networks"
    [ -z "$runsc" ] || printf '\n[engine.runtimes]\nrunsc = ["%s"]\n' "$runsc"
  } > "$conf/containers.conf"
}

# podman_conf_env CONF_DIR: points Podman at the files write_podman_conf wrote there.
podman_conf_env() {
  export CONTAINERS_REGISTRIES_CONF=$1/registries.conf
  export CONTAINERS_STORAGE_CONF=$1/storage.conf
  export CONTAINERS_CONF=$1/containers.conf
}
