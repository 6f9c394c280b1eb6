#!/bin/bash
# The TTFT tax of disaggregation (issue 12): a Llama-3-8B-shaped bf16 model,
# prefill and decode daemons on GPUs over the direct packed path (UCX with
# CUDA transports: DUET_UCX_CUDA_LIB, e.g. .devcarry/ucxcuda).  Per prompt
# length, the decode's debug line "prefill replied: ... compute C us
# transfer T us" gives the prefill's compute time C (what a colocated
# instance spends on the prompt too) and T, the part of the transfer left
# after the compute (what disaggregation adds to TTFT, with the decode's
# unpack and first-token step); tax = T / C.  The TTFT the client sees is
# printed next to it.  Binaries: tests/gpu/build_carry_daemons.sh.
#
#   DUET_UCX_CUDA_LIB=$PWD/.devcarry/ucxcuda tests/gpu/ttft_tax.sh
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/daemons_env.sh
W=$(mktemp -d)
M=${MODEL_DIR:-/tmp/duet-8b}
ngpu=$NGPU
echo "# $(date -u +%FT%TZ) $CARD x$NGPU"
if [ ! -f "$M/config.json" ]; then
    t0=$(date +%s)
    "$BIN/duet" mkmodel --out "$M" --preset llama-3-8b-shape --dtype bf16 >/dev/null || exit 1
    echo "# mkmodel llama-3-8b-shape bf16: $(( $(date +%s) - t0 )) s"
fi
# P1xD2: on separate GPUs where there are 3 or more, else the decode's
# rank 0 shares GPU 0 with the prefill
layouts="1:0:2:0,1"
[ "$ngpu" -ge 3 ] && layouts="1:0:2:1,2"
[ "$ngpu" -ge 4 ] && layouts="$layouts 2:0,1:4:0,1,2,3"
printf "%-6s %7s %10s %12s %12s %8s\n" "# P×D" "tokens" "ttft_ms" "compute_ms" "transfer_ms" "tax"
# stage_pages: the staging arena must hold a whole 8000-token request (500
# pages; auto is n_pages / 4 = 275), or it moves unpacked, page by page
for lay in $layouts; do
    IFS=: read -r P pdev D ddev <<< "$lay"
    pp=$((19100 + RANDOM % 500)) dp=$((19700 + RANDOM % 500))
    cat > "$W/c.json" <<JSON
{"model": "$M", "kv": {"page_size": 16}, "transfer": {"timeout_ms": 60000},
 "prefill": [{"name": "p0", "address": "127.0.0.1:$pp", "tp": $P, "backend": "cuda",
              "devices": [$pdev], "n_pages": 1100, "stage_pages": 600}],
 "decode": [{"name": "d0", "address": "127.0.0.1:$dp", "tp": $D, "backend": "cuda",
             "devices": [$ddev], "n_pages": 1100, "stage_pages": 600}]}
JSON
    "$BIN/duet-prefill" --config "$W/c.json" --name p0 > "$W/p.log" 2>&1 &
    ppid=$!
    DUET_LOG_LEVEL=debug "$BIN/duet-decode" --config "$W/c.json" --name d0 > "$W/d.log" 2>&1 &
    dpid=$!
    for i in $(seq 1 900); do
        grep -q "serving on port" "$W/p.log" && grep -q "serving on port" "$W/d.log" && break
        kill -0 $ppid 2>/dev/null && kill -0 $dpid 2>/dev/null || break # one exited
        sleep 0.2
    done
    grep -h "packed\|transfer path" "$W/p.log" "$W/d.log" | grep "kv:" | sed 's/^/# /'
    for n in 1024 4096 8000; do
        for round in 0 1 2; do
            # a new prompt every round: the prefix caches would otherwise
            # hold it, and nothing would be prefilled or moved
            s=$((1000 + round * 9000 + n))
            prompt="1 $(seq -s ' ' $s $((s + n - 2)))"
            : > "$W/before"
            t0=$(date +%s%N)
            "$BIN/duet-client" --target "127.0.0.1:$dp" --prompt-ids "$prompt" --max-tokens 1 \
                --ignore-eos --output ids --timeout-ms 120000 > /dev/null 2> "$W/err" ||
                { echo "P${P}xD${D} $n: client failed: $(cat "$W/err")"
                  tail -n 4 "$W/p.log" "$W/d.log" | sed 's/^/#   /'; break; }
            t1=$(date +%s%N)
            [ $round -eq 0 ] && continue # warm-up
            line=$(grep "prefill replied" "$W/d.log" | tail -1)
            cu=$(echo "$line" | sed -n 's/.*compute \([0-9]*\) us.*/\1/p')
            tu=$(echo "$line" | sed -n 's/.*transfer \([0-9]*\) us.*/\1/p')
            awk -v p="${P}x${D}" -v n=$n -v t=$(( (t1 - t0) / 1000 )) -v c="$cu" -v x="$tu" \
                'BEGIN { printf "%-6s %7d %10.1f %12.1f %12.1f %8.3f\n", p, n, t/1e3, c/1e3, x/1e3, (c > 0 ? x/c : 0) }'
        done
    done
    kill -TERM $ppid $dpid 2>/dev/null
    wait $ppid $dpid 2>/dev/null
done
rm -rf "$W"
