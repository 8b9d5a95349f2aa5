#!/usr/bin/env bash
# --bias-grad on one H200 (issue 17), with the binaries given (nothing is built): LAB (default
# dev/cuda/build/matmul), TRAIN (build/train_gpt2cu), TEST (build/test_gpt2cu), and LN_LAB
# (dev/cuda/build/layernorm) where it exists. Logs go to $OUT/bias_grad (OUT default /tmp/out).
#  1. the matmul lab: every variant checked against the CPU reference (fresh random inputs, poisoned
#     outputs) and timed at the GPT-2 124M shapes: the backward as shipped (column-sum kernels),
#     plain, --bias-grad dgelu (DGELU_BGRAD), --bias-grad epilogue (BGRADB), and the column sum
#     alone (shipped, 4 row lanes a column pack); its "bias" summary lines are copied into the table;
#     then the layernorm lab's backward variants 0 (shipped) and 5 (+ the dinp column sums that
#     --bias-grad fused uses for attproj's bias), checked and timed, when LN_LAB is built
#  2. bench: GPT-2 124M, B=64 T=1024, 20 steps of random tokens, kernel / dgelu / fused / epilogue one after
#     the other (nothing else on the GPU): the trainer's BENCH line (median ms after warm-up)
#  3. test_gpt2cu with --bias-grad kernel, fused, epilogue and dgelu (last: part of both): its CPU-op
#     checks (the per-op matmul_backward in that mode, fc's bias from the epilogue against the column
#     sums of the CPU's dGELU'd dinp; fused: layernorm_backward's dinp column sums), the
#     bit-identical resume (the epilogues' run-to-run determinism inside one process) and, when the
#     PyTorch reference state is there in time, every gradient against PyTorch. The state: REF_DIR
#     (default $OUT/bias_grad/ref; tests/run_gpu_tests.sh's GPU_TEST_DIR holds the same d12.bin and
#     d12_debug.bin), else written by scripts/train_gpt2.py (python3 + torch; d12 B=4 T=64, fp64 on the
#     CPU) in the background from the start, and left out if not done when the tests must start
#  4. determinism across processes: two runs of --bias-grad epilogue --deterministic 1 (d12, B=8
#     T=1024, 6 steps) print the same losses and norms
#  5. only with PROFILE=1 (and dev/cuda/build/profile_gpt2 built): the per-kernel profile of a 124M
#     step in each mode, its matmul and "bias / column sums" family lines (~3 x 20 s more)
# Every step runs under timeout, capped by what is left of BUDGET seconds (default 270). Estimated
# (not measured: written without a GPU) ~4 minutes on an H200: labs ~75 s, bench ~4 x 17 s, tests
# ~4 x 20 s, determinism ~25 s. Last lines: a table of PASS/FAIL and figures.
cd "$(dirname "$0")/.." || exit 1
LAB=${LAB:-dev/cuda/build/matmul}
TRAIN=${TRAIN:-build/train_gpt2cu}
TEST=${TEST:-build/test_gpt2cu}
OUT=${OUT:-/tmp/out}/bias_grad
REF_DIR=${REF_DIR:-$OUT/ref}
LN_LAB=${LN_LAB:-dev/cuda/build/layernorm}
BUDGET=${BUDGET:-270}
MODES=(kernel dgelu fused epilogue)
TEST_MODES=(kernel fused epilogue dgelu)  # dgelu last: part of both fused and epilogue
mkdir -p "$OUT" "$REF_DIR"
for bin in "$LAB" "$TRAIN" "$TEST"; do [ -x "$bin" ] || { echo "bias_grad_gpu: $bin is missing (build it first)"; exit 1; }; done
start=$SECONDS
rows=(); bad=0
row() { rows+=("$(printf '%-4s %-46s %s' "$1" "$2" "$3")"); [ "$1" = FAIL ] && bad=$((bad + 1)); echo "$1 $2 $3"; }
left() { echo $((BUDGET - (SECONDS - start))); }
# capped NAME LIMIT LOG CMD...: runs CMD under timeout min(LIMIT, what is left); 124 when out of time
capped() {
    local name=$1 limit=$2 log=$3; shift 3
    local l; l=$(left)
    [ "$l" -lt "$limit" ] && limit=$l
    if [ "$limit" -le 5 ]; then echo "=== $name: skipped, out of budget" | tee "$log"; return 124; fi
    echo "=== $name (timeout ${limit}s): $*"
    timeout "$limit" "$@" > "$log" 2>&1
}

# ---- 0. the PyTorch reference state, on the CPU while the lab runs
REF_MODEL=$REF_DIR/d12.bin REF_DEBUG=$REF_DIR/d12_debug.bin
ref_pid=
if [ ! -f "$REF_DEBUG" ] && python3 -c "import torch" 2> /dev/null; then
    timeout 150 python3 scripts/train_gpt2.py --model d12 --batch 4 --seq 64 --steps 10 \
        --write-model "$REF_MODEL" --write-debug "$REF_DEBUG" > "$OUT/ref.log" 2>&1 &
    ref_pid=$!
fi

# ---- 1. the lab
capped "matmul lab" 120 "$OUT/lab.log" "$LAB"; rc=$?
failed_checks=$(awk '/check\(s\) failed/ { print $(NF-2) }' "$OUT/lab.log")
if [ $rc -eq 0 ]; then row PASS "lab: every matmul variant vs the CPU" "0 checks failed"
else row FAIL "lab: every matmul variant vs the CPU" "rc=$rc, ${failed_checks:-?} checks failed (lab.log)"; fi
while read -r line; do
    # bias LAYER | shipped | plain | dgelu | epilogue | colsum | colsum with 4 row lanes
    IFS='|' read -r name shipped plain dgelu epi col col8 <<< "${line#bias }"
    row "    " "lab ${name// /}" "bwd ms: kernel $shipped| plain $plain| dgelu $dgelu| epilogue $epi| colsum $col| lanes $col8"
done < <(grep '^bias ' "$OUT/lab.log")
awk '/^# name \| variant/ { t = 1 } t' "$OUT/lab.log" | grep -E '^bias_backward .* \| [01] ' | sed 's/^/     /'
if [ -x "$LN_LAB" ]; then
    capped "layernorm lab, backward 0 and 5" 40 "$OUT/ln_lab.log" "$LN_LAB" 0 5; rc=$?
    ln_failed=$(awk '/check\(s\) failed/ { print $(NF-2) }' "$OUT/ln_lab.log")
    if [ $rc -eq 0 ]; then row PASS "layernorm lab: variants 0 and 5 vs the CPU" "0 checks failed"
    else row FAIL "layernorm lab: variants 0 and 5 vs the CPU" "rc=$rc, ${ln_failed:-?} checks failed (ln_lab.log)"; fi
    while read -r line; do row "    " "ln ${line%% |*}" "${line#* | }"; done < <(awk '/^# name \| variant/ { t = 1 } t' "$OUT/ln_lab.log" | grep -E '^layernorm_backward .* \| [05] ')
fi

# ---- 2. bench, one mode after the other (GPU-bound; the reference state may still be written on the CPU)
[ -n "$ref_pid" ] && kill -0 "$ref_pid" 2> /dev/null && echo "(the PyTorch reference state is still being written on the CPU)"
declare -A ms
for m in "${MODES[@]}"; do
    capped "bench --bias-grad $m" 60 "$OUT/bench_$m.log" "$TRAIN" --init d12 --random-data 1 --val-every 0 \
        --batch 64 --seq 1024 --steps 20 --bias-grad "$m"; rc=$?
    line=$(grep '^BENCH' "$OUT/bench_$m.log" | tail -n 1)
    ms[$m]=$(sed -nE 's/.* ms=([0-9.]+).*/\1/p' <<< "$line")
    if [ $rc -eq 0 ] && [ -n "${ms[$m]}" ]; then row PASS "bench 124M B=64 T=1024 --bias-grad $m" "$line"
    else row FAIL "bench 124M B=64 T=1024 --bias-grad $m" "rc=$rc (bench_$m.log)"; fi
done
for m in dgelu fused epilogue; do
    if [ -n "${ms[kernel]}" ] && [ -n "${ms[$m]}" ]; then
        row "    " "bench $m vs kernel" "$(awk -v a="${ms[$m]}" -v b="${ms[kernel]}" 'BEGIN { printf "%+.2f ms/step (%.3fx)", a - b, b / a }')"
    fi
done

# ---- 3. test_gpt2cu, each mode; the reference state gets what is left beyond the tests' and step 4's share
if [ -n "$ref_pid" ]; then
    while kill -0 "$ref_pid" 2> /dev/null && [ "$(left)" -gt 100 ]; do sleep 2; done
    if kill -0 "$ref_pid" 2> /dev/null; then
        kill "$ref_pid"; wait "$ref_pid"; rm -f "$REF_MODEL" "$REF_DEBUG"
        echo "(the PyTorch reference state was not ready in time: tests run without it)"
    elif ! wait "$ref_pid"; then
        rm -f "$REF_MODEL" "$REF_DEBUG"; echo "(the PyTorch reference state failed: ref.log; tests run without it)"
    fi
fi
ref_args=()
[ -f "$REF_DEBUG" ] && ref_args=(--model "$REF_MODEL" --debug "$REF_DEBUG")
for m in "${TEST_MODES[@]}"; do
    capped "test_gpt2cu --bias-grad $m" 45 "$OUT/test_$m.log" "$TEST" "${ref_args[@]}" --bias-grad "$m"; rc=$?
    summary=$(tail -n 1 "$OUT/test_$m.log")
    what="test_gpt2cu --bias-grad $m${ref_args[*]:+ (+ vs PyTorch)}"
    if [ $rc -eq 0 ]; then row PASS "$what" "$summary"; else row FAIL "$what" "rc=$rc: $summary (test_$m.log)"; fi
    if [ ${#ref_args[@]} -gt 0 ]; then  # the bias gradients' errors against PyTorch, for the record
        errs=$(awk '$2 == "grad" && $3 ~ /^(qkvb|attprojb|fcb|fcprojb)$/ { printf "%s %s  ", $3, $(NF-2) }' "$OUT/test_$m.log")
        row "    " "  $m: bias grads vs PyTorch, l2 rel err" "$errs"
    fi
done

# ---- 4. determinism across processes, --bias-grad epilogue
det=(--init d12 --random-data 1 --val-every 0 --batch 8 --seq 1024 --steps 6 --deterministic 1 --bias-grad epilogue)
capped "determinism run 1" 40 "$OUT/det1.log" "$TRAIN" "${det[@]}"; rc1=$?
capped "determinism run 2" 40 "$OUT/det2.log" "$TRAIN" "${det[@]}"; rc2=$?
losses() { grep -E '^step ' "$1" | sed -E 's/\| [0-9.]+ ms.*//'; }  # loss, norm, lr; not the times
if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then row FAIL "epilogue: two runs, same losses and norms" "rc=$rc1/$rc2 (det1.log, det2.log)"
elif [ -z "$(losses "$OUT/det1.log")" ]; then row FAIL "epilogue: two runs, same losses and norms" "no step lines (det1.log)"
elif diff <(losses "$OUT/det1.log") <(losses "$OUT/det2.log") > "$OUT/det.diff"; then
    row PASS "epilogue: two runs, same losses and norms" "$(losses "$OUT/det1.log" | wc -l) steps identical"
else row FAIL "epilogue: two runs, same losses and norms" "they differ (det.diff)"; fi

# ---- 5. optional: the per-kernel profile in each mode
PROF=${PROF_BIN:-dev/cuda/build/profile_gpt2}
if [ "${PROFILE:-0}" = 1 ] && [ -x "$PROF" ]; then
    for m in "${MODES[@]}"; do
        capped "profile --bias-grad $m" 60 "$OUT/profile_$m.log" "$PROF" --batch 64 --seq 1024 --steps 2 --bias-grad "$m"
        fams=$(awk '/^matmul|^bias \/ column sums/ { sub(/ +[0-9.]+ +/, " "); print }' "$OUT/profile_$m.log" | \
               awk '{ printf "%s  ", $0 }')
        row "    " "profile --bias-grad $m (ms/step)" "${fams:-no family lines (profile_$m.log)}"
    done
fi

echo
echo "== bias_grad_gpu: $((SECONDS - start)) s, logs in $OUT"
for r in "${rows[@]}"; do echo "$r"; done
echo "$bad failed"
[ $bad -eq 0 ]
