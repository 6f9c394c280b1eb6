# shellcheck shell=bash
# Sourced by scripts/images.sh and the container tests (tests/ops): pick
# the container engine and make podman usable on hosts like Debian 12's
# CI machines.
#
#   duet_engine             podman (preferred) or docker, or fails
#   duet_podman_conf        exports CONTAINERS_CONF (see below)
#   duet_cache_dir          ${DUET_CACHE:-$HOME/.cache/duet}
#
# podman's defaults do not run everywhere: Debian's crun refuses a kernel
# with a hybrid cgroup v1/v2 layout ("cgroups in hybrid mode not
# supported"), and its default ulimits (nofile 1048576) can exceed the
# host's hard limits ("setrlimit RLIMIT_NOFILE: Operation not permitted").
# Unless CONTAINERS_CONF is already set (or DUET_PODMAN_CONF=system),
# duet_podman_conf writes a containers.conf under the cache directory
# with runtime = "runc" (when runc is installed) and default ulimits equal
# to this shell's hard limits, and points CONTAINERS_CONF at it.  That
# file replaces /etc/containers/containers.conf for the commands run from
# the scripts only.  Where the hard RLIMIT_NOFILE is below 1048576 the
# runtime is scripts/lib/runc-clamp, runc behind a wrapper that lowers the
# rlimits of each container to the hard limits: `podman kube play` (4.3)
# ignores default_ulimits and asks for nofile 1048576 as root.

duet_cache_dir() {
  printf '%s\n' "${DUET_CACHE:-${HOME:-/root}/.cache/duet}"
}

# "N:N" for ulimit -H<flag> (n: nofile, u: nproc): the hard limit, at
# most 1048576 open files and 4096 processes (runc is refused a higher
# RLIMIT_NPROC on some hosts even below the shell's hard limit)
duet_ulimit() {
  local v cap=1048576
  [ "$1" = u ] && cap=4096
  v=$(ulimit -H"$1")
  if [ "$v" = unlimited ] || [ "$v" -gt "$cap" ]; then
    v=$cap
  fi
  printf '%s:%s\n' "$v" "$v"
}

duet_podman_conf() {
  [ -n "${CONTAINERS_CONF:-}" ] && return 0
  [ "${DUET_PODMAN_CONF:-}" = system ] && return 0
  local dir nofile nproc conf
  dir="$(duet_cache_dir)/containers"
  mkdir -p "$dir"
  nofile=$(duet_ulimit n)
  nproc=$(duet_ulimit u)
  # one file per checkout: it names this checkout's runc-clamp
  conf="$dir/containers-$(printf '%s' "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" | cksum | cut -d' ' -f1).conf"
  {
    echo "# written by scripts/lib/containers.sh (duet); safe to delete"
    echo "[containers]"
    echo "default_ulimits = [\"nofile=$nofile\", \"nproc=$nproc\"]"
    echo "[engine]"
    if command -v runc >/dev/null 2>&1; then
      if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt 1048576 ]; then
        echo 'runtime = "duet-runc"'
        echo '[engine.runtimes]'
        echo "duet-runc = [\"$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/runc-clamp\"]"
      else
        echo 'runtime = "runc"'
      fi
    fi
  } > "$conf.$$"
  mv "$conf.$$" "$conf"
  export CONTAINERS_CONF="$conf"
}

# podman when installed, else a docker whose daemon answers.
duet_engine() {
  if [ -n "${DUET_ENGINE:-}" ]; then
    command -v "$DUET_ENGINE" >/dev/null 2>&1 || { echo "DUET_ENGINE=$DUET_ENGINE: not installed" >&2; return 1; }
    printf '%s\n' "$DUET_ENGINE"
    return 0
  fi
  if command -v podman >/dev/null 2>&1; then
    echo podman
    return 0
  fi
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo docker
    return 0
  fi
  echo "no container engine: install podman (apt-get install podman runc) or start a Docker daemon" >&2
  return 1
}
