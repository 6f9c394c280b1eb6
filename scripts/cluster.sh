#!/usr/bin/env bash
# Start a local heterogeneous duet cluster and serve until Ctrl-C:
#   duet-router + duet-prefill (TP=2) + duet-decode (TP=4), CPU backend,
#   the shipped model models/stories260K, all on 127.0.0.1
# as described by deploy/configs/local.json.
#
#   scripts/cluster.sh                 build, start, wait for /health, serve
#   DUET_CLUSTER_CONFIG=FILE           another cluster config
#   DUET_BUILD_DIR=DIR                 build directory (default build/release)
#   DUET_SKIP_BUILD=1                  use the binaries already built
#   DUET_CLUSTER_LOGS=DIR              where daemon logs go (default: a temp dir)
#   DUET_CLUSTER_TIMEOUT=SECONDS       start-up limit (default 120)
#   DUET_CLUSTER_AUTH=0                authentication off (default on, below)
#
# Authentication (docs/security.md "Authentication") is on by default: a CA,
# one certificate per process naming its identity (spiffe://duet/<role>/
# <name>, docs/security.md "Identities and roles") and a random shared
# secret are made by
# scripts/gen-auth.sh in a private temp dir (0700, files 0600, removed at
# exit); every gRPC server then wants mutual TLS and the secret, and the
# router's HTTP side is HTTPS (curl --cacert <dir>/ca.pem).  A config that
# has its own auth section or router.https_cert is used as it is.
#
# Every daemon runs in its own session, so Ctrl-C reaches this script only;
# it then stops the router first (it drains in-flight requests), then the
# decode and prefill daemons, waits for each, and exits 0.  A daemon that
# dies at start-up (or later) has its log tail printed and the script exits
# non-zero after stopping the others.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
config=${DUET_CLUSTER_CONFIG:-deploy/configs/local.json}
build=${DUET_BUILD_DIR:-build/release}
timeout_s=${DUET_CLUSTER_TIMEOUT:-120}

if [ ! -f "$config" ]; then
  echo "cluster: no config $config" >&2
  exit 2
fi
if [ "${DUET_SKIP_BUILD:-0}" != "1" ]; then
  DUET_BUILD_DIR="$build" scripts/build.sh
fi
for exe in router/duet-router prefill/duet-prefill decode/duet-decode; do
  if [ ! -x "$build/$exe" ]; then
    echo "cluster: $build/$exe is missing (build failed?)" >&2
    exit 1
  fi
done

# Authentication material, unless off or the config brings its own.
auth_dir=""
auth_args=()
https_args=()
router_own=()
has_own=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(1 if c.get("auth") or c.get("router",{}).get("https_cert") else 0)' "$config")
if [ "${DUET_CLUSTER_AUTH:-1}" != "0" ] && [ "$has_own" = 0 ]; then
  auth_dir=$(mktemp -d -t duet-auth.XXXXXX)
  trap 'rm -rf "$auth_dir"' EXIT
  # one certificate per process, naming spiffe://duet/<role>/<name>
  # (docs/security.md "Identities and roles"); node.pem (no identity) for
  # the router's HTTPS and duet-client through the router
  read -r -a ids < <(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(" ".join(["router/" + c.get("router", {}).get("name", "router")] + ["%s/%s" % (r, e["name"]) for r in ("prefill", "decode") for e in c.get(r, [])]))' "$config")
  scripts/gen-auth.sh "$auth_dir" "${ids[@]}"
  auth_args=(--auth-ca "$auth_dir/ca.pem" --auth-cert "$auth_dir/node.pem"
             --auth-key "$auth_dir/node.key" --auth-secret-file "$auth_dir/secret")
  https_args=(--https-cert "$auth_dir/node.pem" --https-key "$auth_dir/node.key")
  rname=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("router", {}).get("name", "router"))' "$config")
  router_own=(--auth-cert "$auth_dir/router-$rname.pem" --auth-key "$auth_dir/router-$rname.key")
fi
"$build/router/duet-router" --config "$config" --check-config "${auth_args[@]}" \
  "${https_args[@]}" "${router_own[@]}" >/dev/null

# Instance names and the router's HTTP address from the config.
read -r http grpc prefills decodes keyvar scheme cacert < <(python3 - "$config" "$auth_dir" <<'PY'
import json, os, sys
c = json.load(open(sys.argv[1]))
r = c.get("router", {})
ca = (c.get("auth") or {}).get("ca") or ""
if ca and not ca.startswith("/"):
    ca = os.path.join(os.path.dirname(sys.argv[1]), ca)
if sys.argv[2]:
    ca = os.path.join(sys.argv[2], "ca.pem")
print(r.get("http", "127.0.0.1:8000") or "-", r.get("grpc", "127.0.0.1:8001") or "-",
      ",".join(p["name"] for p in c.get("prefill", [])) or "-",
      ",".join(d["name"] for d in c.get("decode", [])) or "-",
      "literal" if r.get("api_key") else (r.get("api_key_env") or "-"),
      "https" if sys.argv[2] or r.get("https_cert") else "http", ca or "-")
PY
)
# curl options for our own requests (and the hints printed below)
tls=()
tls_hint=""
if [ "$scheme" = https ] && [ "$cacert" != "-" ]; then
  tls=(--cacert "$cacert")
  tls_hint=" --cacert $cacert"
fi
# The bearer token, when the router wants one (for our own requests).
auth=()
auth_hint=""
if [ "$keyvar" = "literal" ]; then
  key=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["router"]["api_key"])' "$config")
  auth=(-H "Authorization: Bearer $key")
  auth_hint=" -H 'Authorization: Bearer <router.api_key>'"
elif [ "$keyvar" != "-" ]; then
  auth=(-H "Authorization: Bearer ${!keyvar:-}")
  auth_hint=" -H \"Authorization: Bearer \$$keyvar\""
fi
if [ "$http" = "-" ]; then
  echo "cluster: router.http is off in $config; this script needs it" >&2
  exit 2
fi

logs=${DUET_CLUSTER_LOGS:-$(mktemp -d -t duet-cluster.XXXXXX)}
mkdir -p "$logs"
export DUET_LOG_LEVEL=${DUET_LOG_LEVEL:-info}

names=()
pids=()
start() { # role name
  local role=$1 name=$2
  local own=()
  [ -n "$auth_dir" ] && own=(--auth-cert "$auth_dir/$role-$name.pem" --auth-key "$auth_dir/$role-$name.key")
  setsid "$build/$role/duet-$role" --config "$config" --name "$name" "${auth_args[@]}" "${own[@]}" \
    >"$logs/$name.log" 2>&1 </dev/null &
  names+=("$name")
  pids+=("$!")
}

stopping=0
stop_all() {
  [ "$stopping" = 1 ] && return
  stopping=1
  local status=0 i pid deadline
  # router first (index of the last started), then the workers
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    pid=${pids[$i]}
    kill -0 "$pid" 2>/dev/null || continue
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 40))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "cluster: ${names[$i]} did not stop in 40 s; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
      status=1
    fi
  done
  for i in "${!pids[@]}"; do
    local rc=0
    wait "${pids[$i]}" 2>/dev/null || rc=$?
    if [ "$rc" != 0 ] && [ "$rc" != 127 ]; then
      echo "cluster: ${names[$i]} exited with status $rc (log: $logs/${names[$i]}.log)" >&2
      status=1
    fi
  done
  return $status
}

died() { # index
  local i=$1
  local rc=0
  wait "${pids[$i]}" 2>/dev/null || rc=$?
  echo "cluster: ${names[$i]} exited with status $rc; the end of its log:" >&2
  tail -n 30 "$logs/${names[$i]}.log" >&2 || true
}

on_signal() {
  echo
  echo "cluster: shutting down"
  if stop_all; then
    echo "cluster: stopped"
    exit 0
  fi
  exit 1
}
trap on_signal INT TERM
trap 'stop_all >/dev/null 2>&1 || true; [ -n "$auth_dir" ] && rm -rf "$auth_dir"' EXIT

IFS=, read -r -a plist <<<"$prefills"
IFS=, read -r -a dlist <<<"$decodes"
for n in "${plist[@]}"; do [ "$n" != "-" ] && start prefill "$n"; done
for n in "${dlist[@]}"; do [ "$n" != "-" ] && start decode "$n"; done
setsid "$build/router/duet-router" --config "$config" "${auth_args[@]}" "${https_args[@]}" \
  "${router_own[@]}" >"$logs/router.log" 2>&1 </dev/null &
names+=("router")
pids+=("$!")

echo "cluster: starting ${#pids[@]} processes (logs in $logs)"
deadline=$((SECONDS + timeout_s))
while :; do
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      died "$i"
      stop_all || true
      exit 1
    fi
  done
  if curl -sf "${tls[@]}" "$scheme://$http/health" >/dev/null 2>&1; then
    break
  fi
  if [ $SECONDS -ge $deadline ]; then
    echo "cluster: not ready after ${timeout_s} s; router /health says:" >&2
    curl -s "${tls[@]}" "$scheme://$http/health" >&2 || true
    stop_all || true
    exit 1
  fi
  sleep 0.2
done

model=$(curl -sf "${tls[@]}" "${auth[@]}" "$scheme://$http/v1/models" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])' || echo "?")
auth_lines=""
if [ -n "$auth_dir" ]; then
  auth_lines="  auth         mutual TLS + shared secret, material in $auth_dir (removed at exit)
  duet-client  $build/tools/duet-client --target $grpc --router \\
                 --ca $auth_dir/ca.pem --cert $auth_dir/node.pem \\
                 --key $auth_dir/node.key --secret-file $auth_dir/secret --prompt 'Once'
"
fi
cat <<EOF2
cluster: ready
  OpenAI API   $scheme://$http/v1  (model "$model")
  workers      $scheme://$http/workers     metrics  $scheme://$http/metrics
  logs         $logs
$auth_lines
  curl$tls_hint $scheme://$http/v1/completions -H 'Content-Type: application/json'$auth_hint \\
    -d '{"model": "$model", "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0}'

Press Ctrl-C to stop.
EOF2

# Serve until Ctrl-C, or until a process dies.
while :; do
  wait -n "${pids[@]}" 2>/dev/null || true
  [ "$stopping" = 1 ] && break
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      died "$i"
      stop_all || true
      exit 1
    fi
  done
done
