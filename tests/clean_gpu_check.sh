#!/usr/bin/env bash
# The cleanup branch s8/clean on one H200, with prebuilt binaries (nothing is built here):
#   1. dev/cuda/build/fused_classifier: every variant checked against the CPU reference (--check-only:
#      0 the shipped block-per-row kernel again, 1 rows in shared memory, now lab-only; loss and
#      dlogits, and loss only; GPT-2's shape and an awkward one), then, if all passed, timed (the
#      harness checks each variant again before timing it): ms and % of the copy per variant.
#   2. build/test_fp8_gpu: the FP8 linears and the fused MLP against the CPU emulation (the MLP's
#      reference now casts the GPU's own bf16 GELU / dGELU; its GELU-derived scales bit for bit).
#   3. dev/cuda/build/fp8_cast --check-only: every cast and fused cast byte for byte against
#      llmc/cpu/fp8.h (its reference and checks now one function each; the transposed store one
#      device function shared by fp8_cast_transpose and the fused casts). 2 and 3 run at once.
#   4. build/test_gpt2cu against fp64 PyTorch on the Llama-style d12 with 4 KV heads (tied), as
#      tests/run_gpu_tests.sh section 1 runs it: the loss trajectory now with the deterministic
#      attention backward, its bits compared between two runs in the process, and its spread over 8
#      other stochastic-rounding seeds printed. The reference state is written once into REF_DIR
#      (python3 with torch, fp64 on the CPU, in the background while 1-3 run).
# Binaries: dev/cuda/build/fused_classifier, dev/cuda/build/fp8_cast, build/test_fp8_gpu,
# build/test_gpt2cu (make -j1 build/test_fp8_gpu build/test_gpt2cu;
# make -C dev/cuda -j1 build/fused_classifier build/fp8_cast).
# Env: OUT (logs under $OUT/clean, default build), REF_DIR (default build/gpu_ref), BUDGET (seconds
# for the whole script, default 220; each step runs under timeout within it).
# Last lines: the table (PASS / FAIL / INFO rows) and "clean_gpu_check: PASS" or "FAIL (n)".
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-build}/clean
REF_DIR=${REF_DIR:-build/gpu_ref}
BUDGET=${BUDGET:-220}
mkdir -p "$OUT" "$REF_DIR" || exit 1
rows=(); bad=0
row() { rows+=("$(printf '%-4s %-52s %s' "$1" "$2" "$3")"); [ "$1" = FAIL ] && bad=$((bad + 1)); echo "$1 $2 $3"; }
tmo() { local left=$((BUDGET - SECONDS)); [ $left -lt 5 ] && left=5; echo $(($1 < left ? $1 : left)); }
missing() { [ -x "$1" ] && return 1; row FAIL "$1" "missing (build it first: see the top of $0)"; }

# ---- the PyTorch reference state for 4, in the background
REF_MODEL=$REF_DIR/llama_gqa.bin REF_DEBUG=$REF_DIR/llama_gqa_debug.bin
ref_pid=
if [ ! -f "$REF_DEBUG" ]; then
    echo "=== writing the PyTorch reference state (Llama d12, 4 KV heads, B=4, T=64, 10 steps, fp64 on the CPU)"
    timeout "$(tmo 170)" python3 scripts/train_gpt2.py --model d12 --arch llama --kv-heads 4 --batch 4 --seq 64 \
        --steps 10 --write-model "$REF_MODEL" --write-debug "$REF_DEBUG" > "$OUT/reference.log" 2>&1 &
    ref_pid=$!
fi

# ---- 1. fused_classifier: checks, then timing
lab=dev/cuda/build/fused_classifier
if ! missing $lab; then
    echo "=== 1. $lab --check-only, then timed"
    timeout "$(tmo 60)" $lab --check-only > "$OUT/fused_classifier_check.log" 2>&1; rc=$?
    if [ $rc -eq 0 ]; then
        row PASS "fused_classifier: every variant checked" "$(grep -c ' ok$' "$OUT/fused_classifier_check.log") comparisons ok"
        timeout "$(tmo 60)" $lab --reps 30 > "$OUT/fused_classifier_time.log" 2>&1; rc=$?
        if [ $rc -eq 0 ]; then row PASS "fused_classifier: checked again and timed" "$OUT/fused_classifier_time.log"
        else row FAIL "fused_classifier: timed run" "rc $rc: $(grep -m 1 FAIL "$OUT/fused_classifier_time.log")"; fi
        while IFS='|' read -r op variant ms gbps tflops pct; do
            row INFO "  ${op% }" "$(printf '%-26s %s ms  %s' "${variant# }" "${ms// /}" "${pct# }")"
        done < <(sed -n '/^# name | variant/,$p' "$OUT/fused_classifier_time.log" | grep -E '^fused_classifier')
    else
        row FAIL "fused_classifier: every variant checked" "rc $rc: $(grep -m 1 FAIL "$OUT/fused_classifier_check.log")"
    fi
fi

# ---- 2 and 3 at once: test_fp8_gpu, the fp8_cast lab's checks
echo "=== 2. build/test_fp8_gpu and 3. dev/cuda/build/fp8_cast --check-only, at once"
fp8_pid= cast_pid=
missing build/test_fp8_gpu || { timeout "$(tmo 150)" build/test_fp8_gpu > "$OUT/test_fp8_gpu.log" 2>&1 & fp8_pid=$!; }
missing dev/cuda/build/fp8_cast ||
    { timeout "$(tmo 150)" dev/cuda/build/fp8_cast --check-only > "$OUT/fp8_cast.log" 2>&1 & cast_pid=$!; }
if [ -n "$fp8_pid" ]; then
    wait $fp8_pid; rc=$?
    last=$(tail -n 1 "$OUT/test_fp8_gpu.log")
    if [ $rc -eq 0 ]; then row PASS "test_fp8_gpu" "$last"
    else row FAIL "test_fp8_gpu" "rc $rc: $last; first: $(grep -m 1 FAIL "$OUT/test_fp8_gpu.log")"; fi
    mlp_lines() { awk '/^mlp:/ { m = 1; next } /^[^ ]/ { m = 0 } m' "$OUT/test_fp8_gpu.log"; }
    row INFO "  fused-MLP checks (4 runs)" "$(mlp_lines | grep -c ' ok$') ok lines, $(mlp_lines | grep -c FAIL) FAIL lines"
fi
if [ -n "$cast_pid" ]; then
    wait $cast_pid; rc=$?
    if [ $rc -eq 0 ]; then row PASS "fp8_cast lab --check-only" "$(grep -c ' ok$' "$OUT/fp8_cast.log") ok lines"
    else row FAIL "fp8_cast lab --check-only" "rc $rc: $(grep -c '^FAIL' "$OUT/fp8_cast.log") FAIL; $(grep -m 1 '^FAIL' "$OUT/fp8_cast.log")"; fi
fi

# ---- 4. the Llama GQA trajectory against PyTorch
echo "=== 4. build/test_gpt2cu vs PyTorch, Llama d12 GQA 12/4"
if [ -n "$ref_pid" ]; then
    wait $ref_pid || row FAIL "PyTorch reference state" "rc $? ($OUT/reference.log)"
fi
if [ -f "$REF_DEBUG" ] && ! missing build/test_gpt2cu; then
    timeout "$(tmo 120)" build/test_gpt2cu --model "$REF_MODEL" --debug "$REF_DEBUG" > "$OUT/test_gpt2cu_llama_gqa.log" 2>&1
    rc=$?
    log=$OUT/test_gpt2cu_llama_gqa.log
    last=$(grep -E 'passed|failed' "$log" | tail -n 1)
    if [ $rc -eq 0 ]; then row PASS "test_gpt2cu, Llama GQA vs PyTorch" "$last"
    else row FAIL "test_gpt2cu, Llama GQA vs PyTorch" "rc $rc: $last; first: $(grep -m 1 '^FAIL' "$log")"; fi
    for what in "loss trajectory " "loss trajectory reproducible"; do
        line=$(grep -E "^(ok|FAIL) +$what" "$log" | head -n 1 | tr -s ' ')
        row INFO "  $what" "${line:-not printed}"
    done
    row INFO "  spread over seeds" "$(grep -m 1 'other rounding seeds' "$log" | sed 's/^ *//')"
fi

echo
echo "==== clean_gpu_check summary (${SECONDS} s of BUDGET ${BUDGET} s, logs in $OUT)"
for r in "${rows[@]}"; do echo "$r"; done
if [ $bad -eq 0 ]; then echo "clean_gpu_check: PASS"; else echo "clean_gpu_check: FAIL ($bad)"; fi
[ $bad -eq 0 ]
