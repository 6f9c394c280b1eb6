#!/bin/bash
# The TTFT tax of disaggregation (issue 12): TTFT through a router and
# prefill + decode daemons minus the TTFT through a router and a colocated
# decode (prefill_local "always", the prefill's TP on the prefill's GPUs:
# the same prompt computation), divided by the prefill time, for a
# Llama-3-8B-shaped bf16 model at 1K, 4K and 8K prompt tokens.  KV moves
# over the direct packed path (UCX with CUDA transports: DUET_UCX_CUDA_LIB,
# e.g. .devcarry/ucxcuda).
#
# Both clusters run at once (each its own router, config and daemons), so
# one start-up serves both; `duet bench-serve` measures TTFT in one process
# (no client start-up in the figure), one request at a time, random prompts
# of exactly N tokens (a new seed per run: the prefix caches never hit),
# TTFT p50 of TTFT_REQUESTS (default 8) after 2 warm-up requests per
# length.  The prefill time is the prefill daemon's own compute time (the
# decode's debug line "prefill replied: ... compute C us transfer T us"),
# median over the measured requests; T, the part of the transfer left after
# the compute, is printed as well (the transfer's share of the tax), and
# where the rest of the disaggregated TTFT goes on decode (medians, ms):
# queue (prefill's queue), to_call (arrival -> the Prefill call sent),
# transit (the call -> every rank's KV in, less prefill's queue, compute
# and transfer) and to_first (KV in -> the first token out).
# Binaries: as daemons_env.sh finds them (tests/gpu/suite.sh ttft runs this).
#
#   DUET_UCX_CUDA_LIB=$PWD/.devcarry/ucxcuda tests/gpu/ttft_tax.sh
#
# TTFT_LAYOUTS picks layouts (p1d2, p2d4; default: p1d2, and p2d4 with 4
# GPUs), TTFT_TOKENS the prompt lengths (default "1024 4096 8000").  A dry
# run of the script itself on the CPU backend, without a GPU (DUET_BIN: a
# directory with duet, duet-prefill, duet-decode and duet-router):
#   DUET_BIN=/tmp/bin MODEL_DIR=../shared/models/stories260K TTFT_BACKEND=cpu \
#       TTFT_TOKENS="64 200" TTFT_PAGES=64 TTFT_STAGE_PAGES=32 tests/gpu/ttft_tax.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/daemons_env.sh
W=$(mktemp -d)
M=$(realpath -m "${MODEL_DIR:-/tmp/duet-8b}")
N=${TTFT_REQUESTS:-8}
echo "# $(date -u +%FT%TZ) $CARD x$NGPU"
if [ ! -f "$M/config.json" ]; then
    t0=$(date +%s)
    "$BIN/duet" mkmodel --out "$M" --preset llama-3-8b-shape --dtype bf16 >/dev/null || exit 1
    echo "# mkmodel llama-3-8b-shape bf16: $(( $(date +%s) - t0 )) s"
fi
# name: prefill TP : prefill devices : decode TP : decode devices.  P1xD2 on
# two GPUs: the decode's rank 0 shares GPU 0 with the prefill (on 3 or more
# GPUs, separate GPUs).  The colocated decode: the prefill's TP and GPUs.
declare -A L
L[p1d2]="1:0:2:0,1"
[ "$NGPU" -ge 3 ] && L[p1d2]="1:0:2:1,2"
L[p2d4]="2:0,1:4:0,1,2,3"
order=${TTFT_LAYOUTS:-p1d2}
[ "$NGPU" -ge 4 ] && order=${TTFT_LAYOUTS:-p1d2 p2d4}

instance() { # name port tp devices [prefill_local] (the port from the caller:
    # $RANDOM in a $(...) subshell repeats the parent's next value)
    local dev=", \"devices\": [$4]"
    [ "${TTFT_BACKEND:-cuda}" = cuda ] || dev=""
    echo "{\"name\": \"$1\", \"address\": \"127.0.0.1:$2\", \"tp\": $3,
      \"backend\": \"${TTFT_BACKEND:-cuda}\"$dev, \"n_pages\": ${TTFT_PAGES:-1100},
      \"stage_pages\": ${TTFT_STAGE_PAGES:-600}${5:+, \"prefill_local\": \"$5\"}}"
}
router() { # http-port grpc-port
    echo "\"router\": {\"http\": \"127.0.0.1:$1\", \"grpc\": \"127.0.0.1:$2\",
      \"request_timeout_ms\": 120000, \"max_tokens_limit\": 64}"
}
ready() { # base-url instances (python, not curl: the GPU hosts have no curl)
    python3 - "$1" "$2" <<'PY' 2>/dev/null
import json, sys, urllib.request
base, want = sys.argv[1], int(sys.argv[2])
urllib.request.urlopen(base + "/health", timeout=2).read()
w = json.load(urllib.request.urlopen(base + "/workers", timeout=2))
ws = w if isinstance(w, list) else w.get("workers", [])
sys.exit(0 if sum(1 for x in ws if x.get("healthy")) >= want else 1)
PY
}
ttft() { # base-url tokens requests seed -> TTFT p50 in ms, or nothing
    "$BIN/duet" bench-serve --base-url "$1" --ignore-eos --dataset random \
        --random-input-len "$2" --random-output-len 2 --range-ratio 0 --max-context 8192 \
        --concurrency 1 --num-requests "$3" --seed "$4" --no-progress \
        --result-json "$W/r.json" > "$W/bench.log" 2>&1 || { tail -n 5 "$W/bench.log" >&2; return; }
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["runs"][0]; print("%.1f" % r["median_ttft_ms"] if r["completed"] == r["num_requests"] else "")' "$W/r.json"
}
replied() { # decode log after line $2 -> medians (ms): compute transfer queue call kv first
    # ("prefill replied" and "first token" debug lines; call: arrival -> the
    # Prefill call sent; kv: the call -> every rank's KV in, less queue,
    # compute and transfer: the RPC's and the notifications' transit; first:
    # KV in -> the first token out: it goes before the unpack)
    tail -n +"$(($2 + 1))" "$1" | python3 -c 'import re, sys, statistics as s
rep, ph = [], []
for l in sys.stdin:
    m = re.search(r"queue (\d+) us compute (\d+) us transfer (\d+) us", l)
    if m: rep.append(tuple(int(x) for x in m.groups()))
    m = re.search(r"first token (\d+) us after arrival: Prefill call \+(\d+) us, KV in \+(\d+) us", l)
    if m: ph.append(tuple(int(x) for x in m.groups()))
med = lambda v: s.median(v) / 1e3 if v else 0
q, c, t = (med([r[i] for r in rep]) for i in range(3))
call = med([p[1] for p in ph]); kv = med([p[2] - p[1] for p in ph]); first = med([p[0] - p[2] for p in ph])
print("%.1f %.2f %.2f %.2f %.2f %.2f" % (c, t, q, call, kv - q - c - t, first))'
}

printf "%-6s %6s %12s %12s %11s %11s %7s %9s %8s %8s %8s %8s\n" "# P×D" "tokens" "ttft_disagg" \
    "ttft_coloc" "prefill_ms" "transfer_ms" "tax" "xfer_tax" "queue" "to_call" "transit" "to_first"
for name in $order; do
    IFS=: read -r P pdev D ddev <<< "${L[$name]}"
    dh=$((18100 + RANDOM % 300)) dg=$((18400 + RANDOM % 300))
    ch=$((18700 + RANDOM % 300)) cg=$((19000 + RANDOM % 90))
    pp=$((19100 + RANDOM % 300)) dp=$((19400 + RANDOM % 300)) cp=$((19700 + RANDOM % 300))
    cat > "$W/d.json" <<JSON
{"model": "$M", "kv": {"page_size": 16}, "transfer": {"timeout_ms": 60000}, $(router $dh $dg),
 "prefill": [$(instance p0 $pp "$P" "$pdev")], "decode": [$(instance d0 $dp "$D" "$ddev")]}
JSON
    cat > "$W/c.json" <<JSON
{"model": "$M", "kv": {"page_size": 16}, $(router $ch $cg),
 "prefill": [], "decode": [$(instance c0 $cp "$P" "$pdev" always)]}
JSON
    t0=$(date +%s)
    "$BIN/duet-prefill" --config "$W/d.json" --name p0 > "$W/p0.log" 2>&1 &
    pids=($!)
    DUET_LOG_LEVEL=debug "$BIN/duet-decode" --config "$W/d.json" --name d0 > "$W/d0.log" 2>&1 &
    pids+=($!)
    "$BIN/duet-decode" --config "$W/c.json" --name c0 > "$W/c0.log" 2>&1 &
    pids+=($!)
    "$BIN/duet-router" --config "$W/d.json" > "$W/rd.log" 2>&1 &
    pids+=($!)
    "$BIN/duet-router" --config "$W/c.json" > "$W/rc.log" 2>&1 &
    pids+=($!)
    ok=0
    for _ in $(seq 1 1200); do
        ready "http://127.0.0.1:$dh" 2 && ready "http://127.0.0.1:$ch" 1 && { ok=1; break; }
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done # one exited
        sleep 0.5
    done
    if [ $ok = 0 ]; then
        echo "P${P}xD${D}: not ready after $(( $(date +%s) - t0 )) s"
        tail -n 4 "$W"/*.log | sed 's/^/#   /'
    else
        echo "# P${P}xD${D}: ready after $(( $(date +%s) - t0 )) s"
        grep -h "packed\|transfer path" "$W/p0.log" "$W/d0.log" | grep "kv:" | sed 's/^/# /'
        seed=1
        for n in ${TTFT_TOKENS:-1024 4096 8000}; do
            # warm-up, then the measured requests; alternating which cluster
            # goes first would not matter: they do not share a request
            ttft "http://127.0.0.1:$dh" "$n" 2 $((seed++)) > /dev/null
            ttft "http://127.0.0.1:$ch" "$n" 2 $((seed++)) > /dev/null
            mark=$(wc -l < "$W/d0.log")
            td=$(ttft "http://127.0.0.1:$dh" "$n" "$N" $((seed++)))
            tc=$(ttft "http://127.0.0.1:$ch" "$n" "$N" $((seed++)))
            read -r cu tu qu call kv first <<< "$(replied "$W/d0.log" "$mark")"
            awk -v p="${P}x${D}" -v n="$n" -v d="${td:-0}" -v c="${tc:-0}" -v cu="$cu" -v tu="$tu" \
                -v qu="$qu" -v call="$call" -v kv="$kv" -v first="$first" \
                'BEGIN { printf "%-6s %6d %12.1f %12.1f %11.1f %11.2f %7.3f %9.4f %8.2f %8.2f %8.2f %8.2f\n",
                         p, n, d, c, cu, tu, (cu > 0 && d > 0 && c > 0 ? (d - c) / cu : -1),
                         (cu > 0 ? tu / cu : -1), qu, call, kv, first }'
        done
    fi
    kill -TERM "${pids[@]}" 2>/dev/null
    wait "${pids[@]}" 2>/dev/null
done
rm -rf "$W"
