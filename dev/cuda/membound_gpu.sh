#!/usr/bin/env bash
# The memory-bound misses of issue 17 on one H200, with prebuilt binaries (nothing is built here):
# the bias gradient's column sum (llmc/matmul.cuh, bias_backward) and the fused classifier
# (llmc/fused_classifier.cuh), each against the kernel it replaces, then the trainer.
#   1. the bf16 labs dev/cuda/build/{fused_classifier,matmul}: every variant against the CPU
#      reference (fresh random inputs, poisoned outputs, guard regions), and timed only where every
#      check passed (the harness checks each variant before timing it); the bias gradient checks
#      every column against a double sum and runs twice from the same start (the same bits); the
#      classifier every row's loss besides the sampled rows. The lines of bias_backward (0 shipped,
#      1 the two kernels shipped before, 2-4 other tilings) and fused_classifier (0 shipped, one
#      block per row; 1 rows in shared memory; loss and dlogits, and loss only): ms and % of the copy.
#   2. the FP32 build's labs dev/cuda/build/fp32/{fused_classifier,matmul} --check-only.
#   3. build/test_gpt2cu and build/test_gpt2cu_fp32 against the PyTorch reference state (d12, as
#      tests/run_gpu_tests.sh section 1 writes it; kept in REF_DIR, written once when missing: needs
#      python3 with torch, ~1 minute on the CPU).
#   4. the 124M step: build/train_gpt2cu --init d12 --random-data 1, B=64 T=1024, STEPS steps (as
#      scripts/bench_train.sh runs it): its BENCH line (median ms after warm-up); with OLD_TRAIN=<a
#      trainer built from the parent commit> that one too, right after, for the step's gain.
# Binaries: dev/cuda/build/matmul, dev/cuda/build/fused_classifier, dev/cuda/build/fp32/matmul,
# dev/cuda/build/fp32/fused_classifier, build/test_gpt2cu, build/test_gpt2cu_fp32, build/train_gpt2cu.
# Env: OUT (logs, default build/membound), REF_DIR (default build/gpu_ref), STEPS (16), OLD_TRAIN,
# BUDGET (seconds for the whole script, default 230; each step runs under timeout within it).
# Last lines: the summary table (PASS / FAIL / INFO) and "membound: PASS" or "membound: FAIL (n)".
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-build}/membound
REF_DIR=${REF_DIR:-build/gpu_ref}
STEPS=${STEPS:-16}
BUDGET=${BUDGET:-230}
mkdir -p "$OUT" "$REF_DIR" || exit 1
rows=(); bad=0
row() { rows+=("$(printf '%-4s %-40s %s' "$1" "$2" "$3")"); [ "$1" = FAIL ] && bad=$((bad + 1)); echo "$1 $2 $3"; }
tmo() { local left=$((BUDGET - SECONDS)); [ $left -lt 5 ] && left=5; echo $(($1 < left ? $1 : left)); }

# ---- 1. bf16: every variant checked, then timed (Lab::run checks each variant and times it only
# if every check passed); the table lines of bias_backward and fused_classifier
time_lab() {  # time_lab NAME TIMEOUT PATTERN
    local bin=dev/cuda/build/$1
    if [ ! -x "$bin" ]; then row FAIL "$bin" "missing (build it first)"; return; fi
    if timeout "$(tmo "$2")" "$bin" --reps 30 > "$OUT/time_$1.log" 2>&1; then
        row PASS "$bin (checked, timed)" "$(grep -c ' ok$' "$OUT/time_$1.log") comparisons ok"
    else
        row FAIL "$bin (checked, timed)" "rc $?: $(grep -m 1 'FAIL' "$OUT/time_$1.log") ($OUT/time_$1.log)"
    fi
    while IFS='|' read -r op variant ms gbps tflops pct; do
        row INFO "  ${op% }" "$(printf '%-32s %s ms  %s' "${variant# }" "${ms// /}" "${pct# }")"
    done < <(sed -n '/^# name | variant/,$p' "$OUT/time_$1.log" | grep -E "^$3")
}
time_lab fused_classifier 60 'fused_classifier'
time_lab matmul 120 'bias_backward'

# ---- 2. the FP32 build, checks only
check_lab() {  # check_lab NAME TIMEOUT
    local bin=dev/cuda/build/fp32/$1
    if [ ! -x "$bin" ]; then row FAIL "$bin --check-only" "missing (build it first)"; return; fi
    if timeout "$(tmo "$2")" "$bin" --check-only > "$OUT/check_fp32_$1.log" 2>&1; then
        row PASS "$bin --check-only" "$(grep -c ' ok$' "$OUT/check_fp32_$1.log") comparisons ok"
    else
        row FAIL "$bin --check-only" "rc $?: $(grep -m 1 'FAIL' "$OUT/check_fp32_$1.log") ($OUT/check_fp32_$1.log)"
    fi
}
check_lab fused_classifier 60
check_lab matmul 90

# ---- 3. the trainer against PyTorch, as tests/run_gpu_tests.sh section 1
REF_MODEL=$REF_DIR/d12.bin REF_DEBUG=$REF_DIR/d12_debug.bin
if [ ! -f "$REF_DEBUG" ]; then
    echo "=== writing the PyTorch reference state (d12, B=4, T=64, 10 steps, fp64 on the CPU)"
    timeout "$(tmo 150)" python3 scripts/train_gpt2.py --model d12 --batch 4 --seq 64 --steps 10 \
        --write-model "$REF_MODEL" --write-debug "$REF_DEBUG" > "$OUT/reference.log" 2>&1 ||
        row FAIL "PyTorch reference state" "rc $? ($OUT/reference.log)"
fi
for t in test_gpt2cu test_gpt2cu_fp32; do
    [ -f "$REF_DEBUG" ] || break
    if [ ! -x "build/$t" ]; then row FAIL "build/$t" "missing (build it first)"; continue; fi
    timeout "$(tmo 90)" "build/$t" --model "$REF_MODEL" --debug "$REF_DEBUG" > "$OUT/$t.log" 2>&1
    rc=$?
    last=$(grep -E 'passed|failed' "$OUT/$t.log" | tail -n 1)
    if [ $rc -eq 0 ]; then row PASS "build/$t vs PyTorch" "$last"; else row FAIL "build/$t vs PyTorch" "rc $rc: $last ($OUT/$t.log)"; fi
done

# ---- 4. the 124M step
bench() {  # bench NAME BIN
    local name=$1 bin=$2
    if [ ! -x "$bin" ]; then row FAIL "124M step ($name)" "$bin missing"; return; fi
    timeout "$(tmo 90)" "$bin" --init d12 --random-data 1 --val-every 0 --batch 64 --seq 1024 --steps "$STEPS" \
        > "$OUT/bench_$name.log" 2>&1
    local rc=$? line; line=$(grep '^BENCH' "$OUT/bench_$name.log" | tail -n 1)
    if [ $rc -eq 0 ] && [ -n "$line" ]; then row INFO "124M step, B=64 T=1024 ($name)" "${line#BENCH }"
    else row FAIL "124M step ($name)" "rc $rc ($OUT/bench_$name.log)"; fi
}
bench new build/train_gpt2cu
[ -n "$OLD_TRAIN" ] && bench old "$OLD_TRAIN"

echo "membound_gpu: ${SECONDS}s of BUDGET ${BUDGET}s"
printf '%s\n' "" "== membound summary (logs in $OUT)" "${rows[@]}"
[ $bad -eq 0 ] && echo "membound: PASS" || echo "membound: FAIL ($bad)"
[ $bad -eq 0 ]
