#!/bin/bash
# duet's GPU suite: one entry, named phases, one log per phase.
# tests/gpu/README.md says what to install, how to build and what each
# phase checks.
#
#   tests/gpu/suite.sh [OPTIONS] PHASE [PHASE-OPTIONS] [PHASE [PHASE-OPTIONS]...]
#   tests/gpu/suite.sh all            every phase below, in this order
#   tests/gpu/suite.sh build          configure and build the build tree
#                                     (not part of all)
#   tests/gpu/suite.sh --list         the phases and their options
#
# OPTIONS
#   --results DIR   where the logs go (DUET_GPU_RESULTS; default
#                   tests/gpu/results): DIR/<date>-<phase>-<card>.log, and
#                   DIR/<date>-<phase>-<card>/ for the files a phase writes
#                   besides its log (bench-serve JSON, per-mode bench logs)
#   --build DIR     the build tree (DUET_GPU_BUILD; default build/cuda)
#   --bin DIR       a directory holding the binaries themselves (DUET_GPU_BIN),
#                   instead of a build tree
# Without a build tree or --bin the binaries staged under .devcarry/ by
# tests/gpu/build_carry*.sh are used (built on another machine).
#
# Every log starts with the card's name (nvidia-smi --query-gpu=name).
# Exit status: 0 when every phase passed.
#
# Adding a phase: write phase_NAME (it runs with the log open, PHASE_OPTS
# holding its options and OUT its directory for extra files), add NAME to
# PHASES (if `all` should run it) and its lines to list_phases.
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
PHASES="unit compare bench decode long transfer disagg ttft serve"

list_phases() {
    cat <<'EOF'
unit                 every test_cuda_* program: kernels against the CPU backend,
                     the engine against the CPU engine, graphs against eager,
                     NCCL and TP=2/4 with 2/4 GPUs, KV pack/unpack and CRC kernels
  --sanitize         also compute-sanitizer memcheck on the kernel tests
compare              duet generate --backend cuda against the fp32 CPU backend
                     (stories260K + three synthetic models); TP=2 (2 GPUs) and
                     TP=4 (4 GPUs) against TP=1
bench                bench_gpu on the Llama-3.2-1B and Llama-3-8B shapes (bf16),
                     then the Hugging Face transformers peer when python3 has
                     torch and transformers
  --tp               TP scaling instead: bench_gpu --tp 1, 2, 4 (as GPUs allow)
  --variants         also the kernel variants (attention kernels, GEMV off)
  --fp8              also FP8: test_cuda_matmul_fp8, then bench_gpu on the 8B shape
                     in bf16 and FP8 (per channel) in one run (decode ratio,
                     prefill against cuBLASLt FP8; docs/fp8.md)
  --no-hf            without the transformers peer
decode               decode at serving contexts (tests/gpu/decode_attn.sh): the
                     attention kernels against the CPU backend to 16K tokens,
                     bench_attention (flash-decoding on tensor cores, on CUDA
                     cores, legacy) next to PyTorch's scaled_dot_product_attention
                     (cuDNN, flash) when python3 has torch, and bench_gpu at ctx
                     16/1024/4096/8192 x batch 1/16/64 (fraction of the roofline)
  --sweep            also the split-count sweep (DUET_CUDA_FD_BLOCKS)
  --sanitize         also compute-sanitizer memcheck on test_cuda_attention
long                 long contexts (tests/gpu/long_context.sh): attention kernels
                     against the CPU backend over 32K-64K contexts, and duet
                     generate --backend cuda against the CPU backend on a
                     33000-token prompt of a llama3-scaled model (TP 2 with 2 GPUs)
  --full             also the llama-3.2-1b shape with Llama-3.2's scaling
transfer             bench_gpu_transfer as the daemons run it (--mirror auto:
                     packed when P != D), every P x D pair the GPUs allow, every
                     byte verified, a corrupted put must be caught; 2+ GPUs
  --modes="M ..."    run_packed.sh modes (default "auto auto-noprog"; also
                     auto-arm, auto-event, auto-old, auto-progN, packed,
                     packed-progN, device)
  --checksum         with transfer.checksum (the GPUs' CRC32C): its cost
  --staged           the staged path (pinned host mirrors), --rounds 4
  --timeline         per-request timeline of 4x2 and 2x4 (1x2, 2x1 on fewer
                     than 4 GPUs) at 1024 tokens, read by timeline.py
disagg               prefill and decode daemons on different GPUs against the
                     colocated TP=1 GPU run (tokens, top-5 logprobs, prefix
                     cache, next turn); KV path auto; 2+ GPUs (4: TP 2x4, 4x2)
  --checksum         transfer.checksum on
  --coloc            the colocated and conditional cases instead
  --direct           force the direct path (needs a UCX with CUDA transports)
  --staged           force the staged path
ttft                 the TTFT tax of disaggregation, Llama-3-8B shape, 1K/4K/8K
                     tokens, P1xD2 (and P2xD4 with 4 GPUs); 2+ GPUs
serve                duet bench-serve against disaggregated and colocated
                     layouts on the same GPUs (SERVE_* variables: see
                     serve_gpu.sh); 2+ GPUs; the 8B shape needs long
EOF
}

usage() {
    sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'
}

RESULTS=${DUET_GPU_RESULTS:-$ROOT/tests/gpu/results}
BUILD=${DUET_GPU_BUILD:-$ROOT/build/cuda}
BINDIR=${DUET_GPU_BIN:-}
while [ $# -gt 0 ]; do
    case $1 in
    --results) RESULTS=$2; shift 2 ;;
    --results=*) RESULTS=${1#*=}; shift ;;
    --build) BUILD=$2; shift 2 ;;
    --build=*) BUILD=${1#*=}; shift ;;
    --bin) BINDIR=$2; shift 2 ;;
    --bin=*) BINDIR=${1#*=}; shift ;;
    --list) list_phases; exit 0 ;;
    -h | --help) usage; exit 0 ;;
    --*) echo "suite.sh: unknown option $1 (--help)" >&2; exit 2 ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || { usage; exit 2; }
case $RESULTS in /*) ;; *) RESULTS=$ROOT/$RESULTS ;; esac
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
CARD=${CARD:-no GPU}
# "NVIDIA H100 80GB HBM3" x 2 -> h100-80gb-hbm3x2
SLUG=$(echo "$CARD" | tr '[:upper:]' '[:lower:]' | sed -e 's/^nvidia //' -e 's/[^a-z0-9]\{1,\}/-/g' \
    -e 's/^-//' -e 's/-$//')x$NGPU

# the UCX with CUDA transports, if any: DUET_UCX_CUDA_LIB (its lib
# directory), else the staged one
if [ -z "${DUET_UCX_CUDA_LIB:-}" ] && [ -d "$ROOT/.devcarry/ucxcuda" ]; then
    export DUET_UCX_CUDA_LIB=$ROOT/.devcarry/ucxcuda
fi

# ---- binaries -------------------------------------------------------------
BINS="tools/duet tools/duet-client prefill/duet-prefill decode/duet-decode router/duet-router
bench/bench_gpu bench/bench_attention bench/bench_gpu_transfer"
BIN_FROM=
find_bins() {
    if [ -n "$BINDIR" ]; then
        BIN_FROM="--bin $BINDIR"
    elif [ -f "$BUILD/CMakeCache.txt" ]; then
        # one flat directory of links, as the phase scripts want it
        BINDIR=$BUILD/gpu-bin
        mkdir -p "$BINDIR"
        rm -f "$BINDIR"/*
        local b
        for b in $BINS; do
            [ -x "$BUILD/$b" ] && ln -s "$BUILD/$b" "$BINDIR/"
        done
        for b in "$BUILD"/tests/test_cuda_*; do
            [ -x "$b" ] && ln -s "$b" "$BINDIR/"
        done
        BIN_FROM="build tree $BUILD"
    elif [ -d "$ROOT/.devcarry" ]; then
        BIN_FROM="staged under .devcarry/ (tests/gpu/build_carry*.sh)"
        return 0
    else
        echo "suite.sh: no build tree at $BUILD and no --bin: build first (tests/gpu/suite.sh build," >&2
        echo "          or tests/gpu/README.md \"Build\")" >&2
        return 1
    fi
    BINDIR=$(cd "$BINDIR" && pwd) || return 1
    export BIN=$BINDIR DUET_BIN=$BINDIR GXFER_BIN=$BINDIR/bench_gpu_transfer
}

# ---- phases ----------------------------------------------------------------
have_opt() { # option: is it among this phase's options?
    local o
    for o in $PHASE_OPTS; do [ "$o" = "$1" ] && return 0; done
    return 1
}
opt_value() { # name: the value of --name=VALUE (the last one), or nothing
    local o v=
    for o in "${PHASE_ARGS[@]}"; do
        case $o in "--$1="*) v=${o#*=} ;; esac
    done
    echo "$v"
}
need_gpus() { # n: say so and succeed when there are fewer
    [ "$NGPU" -ge "$1" ] && return 0
    echo "skipped: needs $1 GPUs, this machine has $NGPU"
    return 1
}

phase_unit() {
    local p=(unit)
    have_opt --sanitize && p+=(sanitize)
    OUT='' tests/gpu/run_gpu.sh "${p[@]}"
}

phase_compare() {
    local tp=
    [ "$NGPU" -ge 2 ] && tp=2
    [ "$NGPU" -ge 4 ] && tp=2,4
    OUT='' COMPARE_TP=$tp tests/gpu/run_gpu.sh compare
}

phase_bench() {
    local p=(bench)
    have_opt --tp && p=(tpscale)
    have_opt --variants && p+=(attn gemvoff)
    have_opt --fp8 && p+=(fp8)
    if ! have_opt --tp && ! have_opt --no-hf; then
        if python3 -c "import torch, transformers" 2>/dev/null; then
            p+=(hf)
        else
            echo "# hf peer skipped: python3 has no torch + transformers"
        fi
    fi
    OUT='' tests/gpu/run_gpu.sh "${p[@]}"
}

phase_long() {
    FULL=0
    have_opt --full && FULL=1
    FULL=$FULL tests/gpu/long_context.sh unit compare
}

phase_decode() {
    local p=(unit kernel model)
    have_opt --sweep && p+=(sweep)
    SANITIZE=0
    have_opt --sanitize && SANITIZE=1
    python3 -c "import torch" 2>/dev/null || echo "# PyTorch peer skipped: python3 has no torch"
    SANITIZE=$SANITIZE tests/gpu/decode_attn.sh "${p[@]}"
}

phase_transfer() {
    need_gpus 2 || return 0
    local rc=0 any=0 modes
    if have_opt --staged; then
        any=1
        echo "=== the staged path (pinned host mirrors)"
        DUET_UCX_CUDA_LIB='' tests/gpu/run_gpu_transfer.sh --rounds 4 || rc=1
    fi
    if have_opt --checksum; then
        any=1
        tests/gpu/run_packed.sh checksum || rc=1
    fi
    if have_opt --timeline; then
        any=1
        local plans=1x2,2x1
        [ "$NGPU" -ge 4 ] && plans=4x2,2x4
        echo "=== timeline: ${PLANS:-$plans} at 1024 tokens (full log: $OUT/timeline.log)"
        BENCH_TIMELINE=1 DUET_LOG_LEVEL=trace BENCH_TIMEOUT=200 timeout 250 \
            tests/gpu/run_gpu_transfer.sh --mirror auto --plans "${PLANS:-$plans}" --tokens 1024 \
            --rounds 3 --variants spread > "$OUT/timeline.log" 2>&1 || rc=1
        grep -E "^spread|exit|corrupt" "$OUT/timeline.log"
        python3 tests/gpu/timeline.py "$OUT/timeline.log" || rc=1
    fi
    modes=$(opt_value modes)
    if [ $any = 0 ] || [ -n "$modes" ]; then
        BENCH_MODES=${modes:-${BENCH_MODES:-auto auto-noprog}} tests/gpu/run_packed.sh bench || rc=1
    fi
    return $rc
}

phase_disagg() {
    need_gpus 2 || return 0
    local path=auto
    have_opt --direct && path=direct
    have_opt --staged && path=staged
    local checksum=${DUET_TRANSFER_CHECKSUM:-false} cases=${DISAGG_CASES:-}
    have_opt --checksum && checksum=true
    have_opt --coloc && cases=coloc
    OUT='' DUET_KV_TRANSFER_PATH=$path DUET_TRANSFER_CHECKSUM=$checksum DISAGG_CASES=$cases \
        timeout "${DISAGG_TIMEOUT:-1800}" tests/gpu/disagg_gpu.sh
}

phase_ttft() {
    need_gpus 2 || return 0
    timeout "${TTFT_TIMEOUT:-1800}" tests/gpu/ttft_tax.sh
}

phase_serve() {
    need_gpus 2 || return 0
    timeout "${SERVE_TIMEOUT:-3600}" tests/gpu/serve_gpu.sh
}

phase_build() { # the documented build step (tests/gpu/README.md "Build")
    # shellcheck disable=SC2086 # DUET_CMAKE_ARGS: extra configure flags
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDUET_CUDA=ON \
        ${DUET_CMAKE_ARGS:-} &&
        cmake --build "$BUILD" -j "$(nproc 2>/dev/null || echo 2)"
}

# ---- the run ---------------------------------------------------------------
# split the command line into phases, each with the options after it
declare -a RUN=()
for a in "$@"; do
    case $a in
    --*)
        [ ${#RUN[@]} -gt 0 ] || { echo "suite.sh: $a before any phase" >&2; exit 2; }
        RUN[${#RUN[@]} - 1]="${RUN[${#RUN[@]} - 1]}"$'\t'"$a"
        ;;
    all) for p in $PHASES; do RUN+=("$p"); done ;;
    *)
        declare -F "phase_$a" > /dev/null || { echo "suite.sh: no phase '$a' (--list)" >&2; exit 2; }
        RUN+=("$a")
        ;;
    esac
done

mkdir -p "$RESULTS" || exit 1
failed=()
for entry in "${RUN[@]}"; do
    IFS=$'\t' read -r -a PHASE_ARGS <<< "$entry"
    phase=${PHASE_ARGS[0]}
    PHASE_ARGS=("${PHASE_ARGS[@]:1}")
    PHASE_OPTS=$(for o in "${PHASE_ARGS[@]}"; do echo "${o%%=*}"; done)
    if [ "$phase" = build ]; then
        phase_build || exit 1
        continue
    fi
    stem=$RESULTS/$(date -u +%F)-$phase-$SLUG
    n=1
    while [ -e "$stem.log" ]; do
        n=$((n + 1))
        stem=$RESULTS/$(date -u +%F)-$phase-$SLUG-$n
    done
    log=$stem.log
    export OUT=$stem
    mkdir -p "$OUT"
    t0=$(date +%s)
    {
        echo "# card: $CARD (x$NGPU)"
        nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null
        echo "# duet GPU suite, phase $phase${PHASE_ARGS[*]:+ ${PHASE_ARGS[*]}}; $(date -u +%FT%TZ) on $(hostname)"
        echo "# commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
            git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
        echo "# CPU: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p'), $(nproc) cores"
        echo "# UCX with CUDA transports: ${DUET_UCX_CUDA_LIB:-none given, the system UCX}"
        if find_bins; then
            echo "# binaries: $BIN_FROM"
            "phase_$phase"
        else
            false
        fi
        rc=$?
        echo "# phase $phase: $([ $rc = 0 ] && echo passed || echo "FAILED (exit $rc)") after $(($(date +%s) - t0)) s"
        exit $rc
    } 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    rmdir "$OUT" 2>/dev/null # nothing besides the log
    echo "log: ${log#"$ROOT"/}"
    [ "$rc" = 0 ] || failed+=("$phase")
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
