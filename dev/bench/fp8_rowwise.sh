#!/usr/bin/env bash
# --fp8-scaling rowwise on one H200 (issue 18), with the binaries given (nothing is built):
# build/train_gpt2cu, build/test_fp8_gpu, dev/cuda/build/fp8_cast, dev/cuda/build/matmul_fp8.
# Logs and the plot go to $OUT (default /tmp/out): the labs' in $OUT/fp8_rowwise, the rest in $OUT/fp8.
#  1. the labs, checks and times: dev/cuda fp8_cast variants 0 (per-tensor cast, for scale), 5
#     (fp8_cast_rowwise) and 6 (fp8_cast_transpose_colwise), bit for bit against llmc/cpu/fp8.h with
#     their scale_invs; matmul_fp8 variants 0 (per-tensor FP8), 1 (bf16), 6 (cuBLASLt outer-vector
#     scales: fwd, dinp, dweight at the GPT-2 124M shapes) and 7 (the rowwise casts) against the CPU
#     product of the FP8 operands. A cuBLASLt without outer-vector kernels fails here first.
#  2. tests/gpu/test_fp8_parity.sh (one copy of the data and training logic) with:
#     its 1 and 2 (build/test_fp8_gpu: every linear's forward and backward against the CPU emulation,
#     per-tensor current, rowwise with FP8 weight gradient, rowwise with bf16 weight gradient; the
#     B*T refusal), not its 3 (SHORT=0);
#     its 4, the 124M speed line, B=64 T=1024, 20 steps of random tokens, one run at a time alone on the
#     GPU: bf16, --fp8 1 (per-tensor current), --fp8 1 --fp8-scaling rowwise with --fp8-wgrad bf16
#     (the default) and fp8;
#     its 5, the 2000-step d12 loss parity on tiny Shakespeare, the runs at once (PARALLEL=1): bf16,
#     --fp8 1 (reported only; +0.09% after the graph fix), rowwise (bf16 weight gradient), rowwise with FP8 weight
#     gradient, rowwise with --fp8-bf16-layers 2, each rowwise run within 1% of bf16's final val;
#     the curves into $OUT/fp8/fp8_parity.png (scripts/plot_log.py, needs matplotlib).
# LABS: where the lab binaries are (default dev/cuda/build); TRAIN, TEST as tests/gpu/test_fp8_parity.sh.
# Budget: BUDGET seconds in all (default 400; about 5 minutes expected), each step under timeout; the
# labs at most 90 + 120 s, the rest what is left (at least 60 s).
# Last lines: the PASS/FAIL + figures table.
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/out}
BUDGET=${BUDGET:-400}
LABS=${LABS:-dev/cuda/build}
LOGS=$OUT/fp8_rowwise
mkdir -p "$LOGS"
rows=(); bad=0
row() { rows+=("$(printf '%-4s %-44s %s' "$1" "$2" "$3")"); [ "$1" = FAIL ] && bad=$((bad + 1)); echo "$1 $2 $3"; }
tmo() { local left=$((BUDGET - SECONDS)); [ $left -lt 1 ] && left=1; echo $(($1 < left ? $1 : left)); }

# ---- 1. the labs: each variant's table line ("op | variant what | ms | GB/s | TFLOP/s | %") as INFO
lab() {  # lab NAME TIMEOUT VARIANTS...
    local name=$1 t=$2; shift 2
    local bin=$LABS/$name
    if [ ! -x "$bin" ]; then row FAIL "lab $name" "$bin is missing (build it first)"; return; fi
    if timeout "$(tmo "$t")" "$bin" "$@" > "$LOGS/$name.log" 2>&1; then row PASS "lab $name variants $*" "every check passed"
    else row FAIL "lab $name variants $*" "rc $?: $(grep -m 1 'FAIL' "$LOGS/$name.log") (see $LOGS/$name.log)"; fi
    while IFS= read -r line; do row INFO "  $name" "$line"; done < <(sed -n '/^# name | variant/,$p' "$LOGS/$name.log" | grep -E ' \| (5|6|7) [^|]* \| [0-9.]+ \|')
}
lab fp8_cast 90 0 5 6
lab matmul_fp8 120 0 1 6 7

# ---- 2. test_fp8_gpu, bench and loss parity: tests/gpu/test_fp8_parity.sh's sections with the rowwise recipes
left=$((BUDGET - SECONDS)); [ $left -lt 60 ] && left=60
OUT=$OUT SHORT=0 PARALLEL=1 BUDGET=$left \
    BENCH_RECIPES="fp8=--fp8 1 --fp8-scaling current;fp8_rowwise=--fp8 1 --fp8-scaling rowwise;fp8_rowwise_fp8wgrad=--fp8 1 --fp8-scaling rowwise --fp8-wgrad fp8" \
    RECIPES="fp8=--fp8 1 --fp8-scaling current;fp8_rowwise=--fp8 1 --fp8-scaling rowwise;fp8_rowwise_fp8wgrad=--fp8 1 --fp8-scaling rowwise --fp8-wgrad fp8;fp8_rowwise_ends2=--fp8 1 --fp8-scaling rowwise --fp8-bf16-layers 2" \
    INFO_RECIPES="fp8" \
    tests/gpu/test_fp8_parity.sh > "$LOGS/test_fp8_parity.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then row PASS "tests/gpu/test_fp8_parity.sh (rowwise recipes)" "its table below"
else row FAIL "tests/gpu/test_fp8_parity.sh (rowwise recipes)" "rc $rc; its table below, log $LOGS/test_fp8_parity.log"; fi

echo "fp8_rowwise: ${SECONDS}s of BUDGET ${BUDGET}s"
printf '%s\n' "" "== fp8 rowwise summary (logs in $LOGS and $OUT/fp8)" "${rows[@]}"
sed -n '/^== fp8 summary/,$p' "$LOGS/test_fp8_parity.log"
[ $bad -eq 0 ] && echo "fp8_rowwise: PASS" || echo "fp8_rowwise: FAIL ($bad)"
[ $bad -eq 0 ]
