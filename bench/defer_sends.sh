#!/bin/bash
# The decode scheduler's socket writes (rpc defer_sends, docs/performance.md
# "Decode steps and the socket"): the same local cluster (router + prefill
# TP1 + decode TP1, CPU backend, stories260K) run with the decode's token
# writes made by the scheduler itself (DUET_DECODE_DEFER_SENDS=0) and by the
# server's sender thread (the default), alternating ROUNDS times; per run
# the bench-serve throughput and TPOT and the decode's step timing from the
# router's /metrics (forward per step, cycle between steps, their ratio).
#
#   bench/defer_sends.sh [BUILD_DIR] [ROUNDS]    (default build/dev, 2)
#   CONCURRENCY=48 OUT_LEN=300 REQUESTS=400
set -u
cd "$(dirname "$0")/.." || exit 1
B=$(realpath "${1:-build/dev}")
ROUNDS=${2:-2}
T=$(mktemp -d)
trap 'pkill -f "config $T/c.json"; rm -rf "$T"' EXIT
cat > "$T/c.json" <<JSON
{
  "model": "$PWD/models/stories260K",
  "kv": {"page_size": 16},
  "router": {"http": "127.0.0.1:18000", "grpc": "127.0.0.1:18001", "policy": "least_load",
             "max_concurrent": 128, "queue_limit": 512, "max_tokens_limit": 512,
             "health_interval_ms": 500},
  "prefill": [{"name": "prefill-0", "address": "127.0.0.1:19100", "tp": 1, "backend": "cpu",
               "threads": 1, "n_pages": 4096, "grpc_threads": 2}],
  "decode": [{"name": "decode-0", "address": "127.0.0.1:19200", "tp": 1, "backend": "cpu",
              "threads": 1, "n_pages": 4096, "max_seqs": 64, "grpc_threads": 2}]
}
JSON
run() { # DUET_DECODE_DEFER_SENDS value
    pkill -f "config $T/c.json"
    sleep 1
    setsid "$B/prefill/duet-prefill" --config "$T/c.json" --name prefill-0 > "$T/p.log" 2>&1 &
    DUET_DECODE_DEFER_SENDS=$1 setsid "$B/decode/duet-decode" --config "$T/c.json" \
        --name decode-0 > "$T/d.log" 2>&1 &
    sleep 1.5
    setsid "$B/router/duet-router" --config "$T/c.json" > "$T/r.log" 2>&1 &
    for _ in $(seq 100); do curl -sf localhost:18000/health > /dev/null && break; sleep 0.2; done
    "$B/tools/duet" bench-serve --base-url http://127.0.0.1:18000 \
        --concurrency "${CONCURRENCY:-48}" --num-requests "${REQUESTS:-400}" \
        --random-input-len 32 --random-output-len "${OUT_LEN:-300}" --ignore-eos > "$T/bs.log" 2>&1
    printf "defer_sends %s: %s\n" "$([ "$1" = 0 ] && echo off || echo on)" \
        "$(grep -E 'Output token throughput|Mean TPOT' "$T/bs.log" | tr -s ' ' | tr '\n' ' ')"
    curl -s localhost:18000/metrics | grep "^duet_router_worker_decode_" |
        awk '{split($1, a, "{"); v[a[1]] += $2}
             END {f = v["duet_router_worker_decode_forward_seconds"] / v["duet_router_worker_decode_steps"];
                  c = v["duet_router_worker_decode_cycle_seconds"] / v["duet_router_worker_decode_cycles"];
                  printf "  forward %.3f ms/step, cycle %.3f ms, cycle / forward %.3f\n", 1e3 * f, 1e3 * c, c / f}'
}
nproc
for _ in $(seq "$ROUNDS"); do run 0; run 1; done
