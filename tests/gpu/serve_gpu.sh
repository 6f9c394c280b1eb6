#!/bin/bash
# Serving on GPUs (issue 14): disaggregated P×D layouts against colocated
# decodes on the same GPU count, a Llama-3-8B-shaped bf16 model (random
# weights: `duet mkmodel --preset llama-3-8b-shape`), router + daemons on
# one host, `duet bench-serve` with a random workload (input 1024 ± 50 %,
# output 128 ± 50 %, --ignore-eos) at each rate of SERVE_RATES, SLO TTFT ≤
# 1000 ms and TPOT ≤ 50 ms.  Direct path with DUET_UCX_CUDA_LIB (e.g.
# .devcarry/ucxcuda).  Binaries: as daemons_env.sh finds them (tests/gpu/suite.sh
# serve runs this).
#
#   DUET_UCX_CUDA_LIB=$PWD/.devcarry/ucxcuda tests/gpu/serve_gpu.sh
#
# SERVE_WORKLOAD=shared: bench-serve's shared-prefix dataset instead (8
# system prompts of 1024 tokens + 128 unique, 128 out); SERVE_WORKLOAD=trace:
# the Mooncake conversation trace scaled by 1/8 (SERVE_TRACE: its path,
# default ../shared/traces/conversation_trace.jsonl); SERVE_CACHE=off:
# "prefix_cache": false on every instance (the prefix cache, on by
# default); SERVE_TAG is appended to the result names; SERVE_POLICY the
# router's policy (default least_load; cache_aware: docs/kv-aware-routing.md);
# SERVE_PAGES the instances' n_pages (default 4096).  SERVE_WORKLOAD=long:
# the prefill-heavy random workload (4K-8K tokens in, 256 out; model with
# max_position 16384); SERVE_CHUNK sets every instance's
# prefill_chunk_tokens (colocated chunked prefill; 0 = whole prompts);
# SERVE_SLO_TTFT_MS / SERVE_SLO_TPOT_MS the SLO (default 1000 / 50).
# SERVE_LAYOUTS picks layouts (names below), SERVE_PRESET another mkmodel
# preset (e.g. llama-3.2-1b-shape: a 2.5 GB checkpoint that loads in
# seconds); results: one line per (layout, rate) and the bench-serve JSON
# under ${OUT:-/tmp}/serve-*.json.  Each
# layout starts its daemons afresh: loading the 16 GB checkpoint takes ~2
# minutes per process on an H200 host (SERVE_READY_S, default 600), so a
# run of all five layouts needs more than one 10-minute device call.
# The first runs (2026-11-26) never got past start-up: the readiness check
# used curl, which the GPU hosts do not have (now python3).
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/daemons_env.sh
W=$(mktemp -d)
PRESET=${SERVE_PRESET:-llama-3-8b-shape}
M=${MODEL_DIR:-/tmp/duet-$PRESET}
MAXCTX=4096
if [ "${SERVE_WORKLOAD:-random}" = long ]; then
    MAXCTX=8704
    M=${MODEL_DIR:-/tmp/duet-$PRESET-16k}
fi
RATES=${SERVE_RATES:-2,4,8}
N=${SERVE_REQUESTS:-64}
echo "# $(date -u +%FT%TZ) $CARD x$NGPU, $PRESET, rates $RATES, $N requests each"
if [ ! -f "$M/config.json" ]; then
    t0=$(date +%s)
    "$BIN/duet" mkmodel --out "$M" --preset "$PRESET" --dtype bf16 \
        $([ "$MAXCTX" -gt 8192 ] && echo --max-pos 16384) >/dev/null || exit 1
    echo "# mkmodel $PRESET bf16: $(( $(date +%s) - t0 )) s"
fi
# name: prefill entries | decode entries (tp:devices[:prefill_local])
declare -A L
L[disagg-p1d1]="1:0|1:1"
L[coloc-2xtp1]="|1:0:always 1:1:always"
# one colocated decode on one GPU (the decode loop alone: cycle / forward)
L[coloc-tp1]="|1:0:always"
L[coloc-tp2]="|2:0,1:always"
L[disagg-p2d2]="2:0,1|2:2,3"
L[coloc-2xtp2]="|2:0,1:always 2:2,3:always"
L[cond-p1d1]="1:0|1:1:auto"
# 2 prefill + 2 decode instances of TP 1 on 2 GPUs (one of each per GPU): the
# prefix-cache comparison of issue 15 (SERVE_POLICY round_robin / cache_aware)
L[disagg-2p2d]="1:0 1:1|1:0 1:1"
order=${SERVE_LAYOUTS:-disagg-p1d1 coloc-2xtp1 coloc-tp2}
[ "$NGPU" -ge 4 ] && order=${SERVE_LAYOUTS:-disagg-p1d1 coloc-2xtp1 coloc-tp2 disagg-p2d2 coloc-2xtp2}

entries() { # role list -> JSON array
    local role=$1 list=$2 out="" i=0 tp devs mode port
    for e in $list; do
        IFS=: read -r tp devs mode <<< "$e"
        port=$((19100 + RANDOM % 800))
        [ -n "$out" ] && out="$out, "
        out="$out{\"name\": \"${role:0:1}$i\", \"address\": \"127.0.0.1:$port\", \"tp\": $tp, \"backend\": \"cuda\", \"devices\": [$devs], \"n_pages\": ${SERVE_PAGES:-4096}, \"max_seqs\": 64, \"max_batch_tokens\": 8192${mode:+, \"prefill_local\": \"$mode\", \"prefill_local_max_tokens\": 1024}${SERVE_CHUNK:+, \"prefill_chunk_tokens\": $SERVE_CHUNK}$([ "${SERVE_CACHE:-on}" = off ] && echo ', "prefix_cache": false')}"
        i=$((i + 1))
    done
    echo "[$out]"
}

for name in $order; do
    IFS='|' read -r pre dec <<< "${L[$name]}"
    hp=$((18100 + RANDOM % 400)) gp=$((18600 + RANDOM % 400))
    cat > "$W/c.json" <<JSON
{"model": "$M", "kv": {"page_size": 16}, "transfer": {"timeout_ms": 60000},
 "router": {"http": "127.0.0.1:$hp", "grpc": "127.0.0.1:$gp", "request_timeout_ms": 120000,
            "max_tokens_limit": $MAXCTX, "policy": "${SERVE_POLICY:-least_load}"},
 "prefill": $(entries prefill "$pre"),
 "decode": $(entries decode "$dec")}
JSON
    pids=()
    for n in $(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(' '.join(['prefill:'+e['name'] for e in c['prefill']]+['decode:'+e['name'] for e in c['decode']]))" "$W/c.json"); do
        role=${n%%:*} inst=${n#*:}
        "$BIN/duet-$role" --config "$W/c.json" --name "$inst" > "$W/$inst.log" 2>&1 &
        pids+=($!)
    done
    "$BIN/duet-router" --config "$W/c.json" > "$W/router.log" 2>&1 &
    rpid=$!
    ok=0
    # a 16 GB checkpoint of random weights loads in ~2 minutes per process
    for _ in $(seq 1 $((2 * ${SERVE_READY_S:-600}))); do
        # (python, not curl: the GPU hosts have no curl)
        if python3 - "http://127.0.0.1:$hp" "$(echo $pre $dec | wc -w)" <<'PY' 2>/dev/null; then
import json, sys, urllib.request
base, want = sys.argv[1], int(sys.argv[2])
urllib.request.urlopen(base + "/health", timeout=2).read()
w = json.load(urllib.request.urlopen(base + "/workers", timeout=2))
ws = w if isinstance(w, list) else w.get("workers", [])
sys.exit(0 if sum(1 for x in ws if x.get("healthy")) >= want else 1)
PY
            ok=1; break
        fi
        sleep 0.5
    done
    if [ $ok = 0 ]; then
        echo "$name: cluster not ready after ${SERVE_READY_S:-600} s"; tail -n 5 "$W"/*.log
    else
        if [ "${SERVE_WORKLOAD:-random}" = shared ]; then
            wl=(--dataset shared-prefix --prefix-len 1024 --suffix-len 128 --num-prefixes 8
                --output-len 128)
        elif [ "${SERVE_WORKLOAD:-random}" = trace ]; then
            # the Mooncake conversation trace, lengths and 512-token blocks
            # scaled by 1/8 (64-token blocks, ~1500 tokens in, ~86 out),
            # its first SERVE_REQUESTS requests at SERVE_RATES (Poisson)
            wl=(--dataset trace --trace "${SERVE_TRACE:-$ROOT/../shared/traces/conversation_trace.jsonl}"
                --trace-len-scale 0.125 --trace-output-scale 0.25 --trace-block-size 64)
        elif [ "${SERVE_WORKLOAD:-random}" = long ]; then
            # prefill-heavy (issue 24): 4K-8K tokens in, 256 out
            wl=(--dataset random --random-input-len 6144 --random-output-len 256 --range-ratio 0.33)
        else
            wl=(--dataset random --random-input-len 1024 --random-output-len 128 --range-ratio 0.5)
        fi
        "$BIN/duet" bench-serve --base-url "http://127.0.0.1:$hp" --ignore-eos "${wl[@]}" \
            --num-requests "$N" \
            --request-rate "$RATES" --seed 1 --slo-ttft-ms "${SERVE_SLO_TTFT_MS:-1000}" \
            --slo-tpot-ms "${SERVE_SLO_TPOT_MS:-50}" \
            --max-context "$MAXCTX" --result-json "${OUT:-/tmp}/serve-$name${SERVE_TAG:-}.json" > "$W/bench.log" 2>&1 ||
            { echo "$name: bench-serve failed"; tail -n 20 "$W/bench.log"; }
        python3 - "${OUT:-/tmp}/serve-$name${SERVE_TAG:-}.json" "$name${SERVE_TAG:-}" <<'PY'
import json, sys
try:
    runs = json.load(open(sys.argv[1]))["runs"]
except (OSError, ValueError, KeyError) as e:
    print(sys.argv[2], "no results:", e); sys.exit(0)
for r in runs:
    print("%-12s %5s/s: %5.2f req/s goodput %5.2f out %6.0f tok/s TTFT p50/p99 %7.1f/%7.1f ms "
          "TPOT p50/p99 %5.1f/%5.1f ms done %d/%d" % (
              sys.argv[2], r["request_rate"], r["request_throughput"], r["request_goodput"],
              r["output_throughput"], r["median_ttft_ms"], r["p99_ttft_ms"], r["median_tpot_ms"],
              r["p99_tpot_ms"], r["completed"], r["num_requests"]))
PY
        # the prefix cache's counters and the decodes' step timing, as the
        # router exports them
        python3 - "http://127.0.0.1:$hp/metrics" "$name${SERVE_TAG:-}" <<'PY' 2>/dev/null
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
vals = {}
for line in text.splitlines():
    if line.startswith("duet_prefix_cache_") and "_bucket" not in line:
        print("%-12s %s" % (sys.argv[2], line))
    if line.startswith("duet_router_worker_decode_"):
        key, v = line.rsplit(" ", 1)
        metric, labels = key.split("{", 1)
        vals.setdefault(labels, {})[metric[len("duet_router_worker_decode_"):]] = float(v)
# the decode loop against its engine: mean step cycle (what a running
# stream's TPOT is) over mean forward time, all rates of this layout together
for labels, m in sorted(vals.items()):
    if m.get("steps") and m.get("cycles"):
        fwd = m["forward_seconds"] / m["steps"] * 1e3
        cyc = m["cycle_seconds"] / m["cycles"] * 1e3
        print("%-12s decode %s: %d steps, forward %.2f ms, cycle %.2f ms, cycle / forward %.2f"
              % (sys.argv[2], labels.rstrip("}"), m["steps"], fwd, cyc, cyc / fwd))
PY
    fi
    kill -TERM $rpid "${pids[@]}" 2>/dev/null
    wait $rpid "${pids[@]}" 2>/dev/null
done
rm -rf "$W"
