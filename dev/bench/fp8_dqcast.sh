#!/usr/bin/env bash
# qkv's dY cast reading dQ straight from the attention backward's fp32 sums (issue 18: --fp8 1 with the
# fused casts; llmc/fp8_fused.cuh DQ_ACCUM, attention_backward's keep_dq, gpt2_backward), checked, then
# timed at GPT-2 124M. Builds nothing; needs, built beforehand (bf16, GPU_ARCH=90a):
#   make -j1 build/train_gpt2cu build/test_fp8_gpu && make -C dev/cuda -j1 build/fp8_cast
# OLD_BIN=<a build/train_gpt2cu from before this change> adds it to the timing (alternating, twice each).
# Parts, logs under $OUT/fp8_dqcast (OUT default build):
#   1. checks, at once (the GPU has room for all of them):
#      a. dev/cuda/build/fp8_cast --check-only: every cast of the lab byte for byte against
#         llmc/cpu/fp8.h, among them fp8_dq_cast (R=65536 C=2304, GPT-2 124M's qkv dY; R=192 C=576):
#         variant 0 the DQ_ACCUM cast (its dqkv's dQ columns poisoned), variant 1 the dQ store + the
#         NONE cast (the path it replaces); the dQ store's bf16 against the CPU's round(sum / 8), both
#         variants' FP8 bytes, amax and bias gradient bits
#      b. build/test_fp8_gpu: the FP8 linears and head as before, then test_dq_cast (attention_backward
#         with keep_dq leaves every dQ column unwritten and dK, dV bit for bit; DQ_ACCUM = dQ store +
#         NONE bit for bit, and byte for byte against the CPU's cast; HD 64 and 128, with and without
#         the bias, e5m2 and e4m3), keep_dq refused where it must be (no scratch, the split schedule),
#         and test_dq_model: a d2 backward as the trainer runs it (dqkv's dQ columns left poisoned in
#         every layer) against the same backward with the dQ store, gradients within tolerance
#      c. --fp8-fused 0 = 1 (dev/bench/fp8_same.sh: --deterministic 1, a Llama-style L6 bit for bit,
#         GPT-2 d6 losses within 1e-3). --deterministic 1 has no attention scratch, so dQ is stored as
#         before there: this shows the rest is unchanged
#      d. the fused dQ in training: the same d6 run without --deterministic (the attention backward with
#         its scratch: keep_dq and DQ_ACCUM in every layer from step 2 on), --fp8-fused 0 once and 1
#         twice, at once. dQ by fp32 atomics is not bit-reproducible run to run, so: every logged train
#         loss of both fused runs within 0.5% of the unfused run's, no NaN; the largest difference is
#         printed beside the two fused runs' own (the run-to-run noise)
#      e. (GRAPH=1) PAIRS=fp8 PARTS=2 dev/bench/graph.sh: --graph 0 = 1 bit for bit, the FP8
#         pairs (--deterministic 1, as c; adds ~2 minutes)
#   2. speed, alone on the GPU, skipped when a check failed (FORCE=1 times anyway):
#      a. dev/cuda/build/fp8_cast --op fp8_dq_cast --reps 50: the two variants checked again, then timed
#         (median of 50, L2 flushed): DQ_ACCUM against the dQ store + NONE cast
#      b. 124M, B=64 T=1024, random tokens, --fp8 1 --fp8-head 1, STEPS (16) steps: the trainer's BENCH
#         line (median ms/step after its warm-up); with OLD_BIN: new, old, new, old
# Last lines: PASS/FAIL of each check, the lab's fp8_dq_cast timings (fused against dQ store + cast),
# then ms/step of each 124M run. Estimated ~3 minutes on an H200 (part 1 ~90 s, bounded by the lab's
# CPU references; part 2 ~15 s + ~25 s a trainer run); not yet run.
cd "$(dirname "$0")/../.." || exit 1
LOGS=${OUT:-build}/fp8_dqcast
STEPS=${STEPS:-16}
TRAIN=${TRAIN:-build/train_gpt2cu}
TEST=${TEST:-build/test_fp8_gpu}
LAB=${LAB_BUILD:-dev/cuda/build}
COMPILE_MS=${COMPILE_MS:-121.59}  # nanoGPT-style torch.compile, 124M B=64 T=1024 (docs/perf.md, twenty-third run)
mkdir -p "$LOGS" || exit 1
need=("$TRAIN" "$TEST" "$LAB/fp8_cast")
[ -n "${OLD_BIN:-}" ] && need+=("$OLD_BIN")
for b in "${need[@]}"; do [ -x "$b" ] || { echo "error: $b is missing (build it first: see the top of $0)"; exit 1; }; done
rows=(); bad=0; t0=$SECONDS
row() {  # row STATUS(0: pass, INFO: printed only, else fail) NAME DETAIL
    local tag=PASS
    if [ "$1" = INFO ]; then tag=INFO; elif [ "$1" != 0 ]; then tag=FAIL; bad=1; fi
    rows+=("$tag  $2${3:+ ($3)}"); echo "$tag $2 $3"
}
result() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" > "$LOGS/$4.row"; }  # result STATUS NAME DETAIL PART

# the lab's fp8_dq_cast timing lines (part 2a), once each (the lab prints them as it goes and again at the end)
dq_lines() { [ -f "$LOGS/fp8_dq_cast.txt" ] && grep -E '^fp8_dq_cast .* \| [01] ' "$LOGS/fp8_dq_cast.txt" | awk '!seen[$0]++'; }
part_lab() {
    local t1=$SECONDS st
    timeout 170 "$LAB/fp8_cast" --check-only > "$LOGS/fp8_cast.txt" 2>&1; st=$?
    result $st "fp8_cast lab --check-only (every cast, fp8_dq_cast among them, vs llmc/cpu/fp8.h)" \
        "$(grep -c ': moves ' "$LOGS/fp8_cast.txt") variants run, $(grep -c ' ok' "$LOGS/fp8_cast.txt") ok lines, $(grep -c '^FAIL' "$LOGS/fp8_cast.txt") FAIL, $((SECONDS - t1)) s" lab
}
part_test() {
    local t1=$SECONDS st
    timeout 170 "$TEST" > "$LOGS/test_fp8_gpu.txt" 2>&1; st=$?
    result $st "test_fp8_gpu (FP8 linears, head, DQ_ACCUM and keep_dq)" \
        "$(grep -c '^dq cast:' "$LOGS/test_fp8_gpu.txt") dq cast cases; $(tail -1 "$LOGS/test_fp8_gpu.txt"), $((SECONDS - t1)) s" test
}
# d6, B=32 T=1024, 8 steps, delayed scaling; $1 the run's name, the rest its flags
d6() {
    local name=$1; shift
    rm -rf "${LOGS:?}/$name"
    timeout 150 "$TRAIN" --init d6 --random-data 1 --batch 32 --seq 1024 --steps 8 --seed 7 --lr 1e-3 --warmup 2 \
        --val-every 0 --fp8 1 --fp8-scaling delayed "$@" --out-dir "$LOGS/$name" --log "$LOGS/$name.log" --overwrite 1 \
        > "$LOGS/$name.txt" 2>&1
}
losses() { awk '$1 == "step" && $3 == "train_loss" { print $2, $4 }' "$1"; }
part_same() {  # dev/bench/fp8_same.sh: --fp8-fused 0 = 1 (Llama-style bit for bit, GPT-2 within 1e-3)
    local st detail
    IFS=$'\t' read -r st detail < <(dev/bench/fp8_same.sh "$LOGS/same" "$TRAIN" | tail -1)
    result "${st:-1}" "fused casts = separate casts (dev/bench/fp8_same.sh: Llama-style L6 bit for bit, GPT-2 d6 losses within 1e-3)" "$detail" same
}
part_fused() {  # the DQ_ACCUM path in training (attention scratch): close to the unfused run
    local t1=$SECONDS st=0 why="" r d01 d11 d_noise
    local -A pid
    d6 nd0 --fp8-fused 0 & pid[nd0]=$!
    d6 nd1 --fp8-fused 1 & pid[nd1]=$!
    d6 nd1b --fp8-fused 1 & pid[nd1b]=$!
    for r in nd0 nd1 nd1b; do
        wait "${pid[$r]}" && [ "$(losses "$LOGS/$r.log" | wc -l)" -ge 8 ] ||
            { st=1; why="$why $r failed or logged under 8 losses: $(tail -1 "$LOGS/$r.txt");"; }
    done
    if [ $st -eq 0 ]; then
        # the largest relative difference of the logged train losses, step by step
        maxrel() { paste <(losses "$1") <(losses "$2") | awk '{ d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2);
            if ($2 != $2 || $4 != $4 || tolower($2) ~ /nan/ || tolower($4) ~ /nan/) r = 1; if (r > m) m = r } END { printf "%.2e", m }'; }
        d01=$(maxrel "$LOGS/nd0.log" "$LOGS/nd1.log"); d11=$(maxrel "$LOGS/nd0.log" "$LOGS/nd1b.log")
        d_noise=$(maxrel "$LOGS/nd1.log" "$LOGS/nd1b.log")
        st=$(awk -v a="$d01" -v b="$d11" 'BEGIN { print (a <= 5e-3 && b <= 5e-3) ? 0 : 1 }')
        why="max rel loss difference fused 1 vs 0: $d01, $d11; fused 1 vs fused 1 (noise): $d_noise; last $(losses "$LOGS/nd1.log" | tail -1)"
    fi
    result $st "DQ_ACCUM in training (no --deterministic): --fp8-fused 1 losses within 0.5% of 0" \
        "$why, $((SECONDS - t1)) s" fused
}
part_graph() {
    local t1=$SECONDS st
    OUT=$LOGS PAIRS=fp8 PARTS=2 timeout 200 dev/bench/graph.sh > "$LOGS/graph_fp8.txt" 2>&1; st=$?
    result $st "graph 0 = graph 1, the FP8 pairs" "$(grep -c '^PASS' "$LOGS/graph_fp8.txt") PASS, $((SECONDS - t1)) s" graph
}

graph_note=""; [ "${GRAPH:-0}" = 1 ] && graph_note=", graph pairs"
echo "==== 1. checks, at once: fp8_cast lab, test_fp8_gpu, fused 0 = 1 (deterministic), DQ_ACCUM in training$graph_note"
rm -f "$LOGS"/*.row
parts=(lab test same fused)
[ "${GRAPH:-0}" = 1 ] && parts+=(graph)
for p in "${parts[@]}"; do "part_$p" & done
wait
for p in "${parts[@]}"; do
    if [ -f "$LOGS/$p.row" ]; then IFS=$'\t' read -r st name detail < "$LOGS/$p.row"; row "$st" "$name" "$detail"
    else row 1 "part $p" "no result (killed?)"; fi
done
grep -E "^FAIL" "$LOGS/fp8_cast.txt" | head -5
grep -E "FAIL" "$LOGS/test_fp8_gpu.txt" | head -5
grep -A8 '^dq cast:' "$LOGS/test_fp8_gpu.txt" | grep -E "^dq cast|DQ_ACCUM|keep_dq" | head -12 | sed 's/^/    /'
grep -E "^keep_dq" "$LOGS/test_fp8_gpu.txt" | sed 's/^/    /'
grep -A6 '^dq model:' "$LOGS/test_fp8_gpu.txt" | sed 's/^/    /'
grep -E "fp8_dq_cast.*(differ|FAIL)" "$LOGS/fp8_cast.txt" | head -4 | sed 's/^/    /'

declare -A MS TOK PEAK
RUNS=()
if [ $bad -ne 0 ] && [ "${FORCE:-0}" != 1 ]; then
    echo "==== 2. speed: skipped (a check failed; FORCE=1 times anyway)"
else
    echo "==== 2a. fp8_dq_cast timed alone: DQ_ACCUM (0) against the dQ store + NONE cast (1)"
    timeout 90 "$LAB/fp8_cast" --op fp8_dq_cast --reps 50 > "$LOGS/fp8_dq_cast.txt" 2>&1
    st=$?; row $st "fp8_dq_cast timed (checked again first)" "$(grep -c '^FAIL' "$LOGS/fp8_dq_cast.txt") FAIL, $(dq_lines | wc -l) timings"
    echo "==== 2b. speed: 124M, B=64 T=1024, --fp8 1 --fp8-head 1, $STEPS steps, alone"
    if [ -n "${OLD_BIN:-}" ]; then RUNS=(new1 old1 new2 old2); else RUNS=(new1); fi
    for r in "${RUNS[@]}"; do
        bin=$TRAIN; [[ $r == old* ]] && bin=$OLD_BIN
        timeout 90 "$bin" --init d12 --random-data 1 --val-every 0 --batch 64 --seq 1024 --steps "$STEPS" --fp8 1 \
            --fp8-head 1 > "$LOGS/bench_$r.txt" 2>&1
        line=$(grep '^BENCH ' "$LOGS/bench_$r.txt" | tail -1)
        if [ -z "$line" ]; then row 1 "bench $r" "no BENCH line: $(tail -1 "$LOGS/bench_$r.txt")"; continue; fi
        echo "    $r ($bin): $line"
        MS[$r]=$(sed -n 's/.* ms=\([^ ]*\).*/\1/p' <<< "$line")
        TOK[$r]=$(sed -n 's/.* tok_s=\([^ ]*\).*/\1/p' <<< "$line")
        PEAK[$r]=$(sed -n 's/.* peak_gib=\([^ ]*\).*/\1/p' <<< "$line")
    done
fi

echo
echo "==== summary ($((SECONDS - t0)) s; logs in $LOGS)"
for r in "${rows[@]}"; do echo "$r"; done
echo "fp8_dq_cast (lab; variant 0 DQ_ACCUM, 1 dQ store + NONE cast): name | variant | ms | GB/s | TFLOP/s | % of copy"
dq_lines | sed 's/^/    /'
v0=$(dq_lines | grep -E "R=65536 .* \| 0 " | head -1 | awk -F'|' '{ print $3 + 0 }')
v1=$(dq_lines | grep -E "R=65536 .* \| 1 " | head -1 | awk -F'|' '{ print $3 + 0 }')
[ -n "$v0" ] && [ -n "$v1" ] &&
    awk -v a="$v0" -v b="$v1" 'BEGIN { printf "    R=65536: %.4f ms against %.4f: %.4f ms less a layer, x12 = %.3f ms a step\n", a, b, b - a, 12 * (b - a) }'
printf "%-6s | %9s | %10s | %8s | %s\n" run ms/step tok/s "peak GiB" "vs compile ($COMPILE_MS ms; 1.5x: <= $(awk -v c="$COMPILE_MS" 'BEGIN { printf "%.2f", c / 1.5 }') ms)"
for r in "${RUNS[@]}"; do
    if [ -z "${MS[$r]}" ]; then printf "%-6s | %9s |\n" "$r" failed; continue; fi
    printf "%-6s | %9s | %10s | %8s | %s\n" "$r" "${MS[$r]}" "${TOK[$r]}" "${PEAK[$r]}" \
        "$(awk -v a="$COMPILE_MS" -v b="${MS[$r]}" 'BEGIN { printf "%.3fx", a / b }')"
done
if [ -n "${MS[new1]}" ] && [ -n "${MS[old1]}" ] && [ -n "${MS[new2]}" ] && [ -n "${MS[old2]}" ]; then
    awk -v n1="${MS[new1]}" -v n2="${MS[new2]}" -v o1="${MS[old1]}" -v o2="${MS[old2]}" \
        'BEGIN { n = (n1 + n2) / 2; o = (o1 + o2) / 2; printf "new %.2f ms, old %.2f ms (means of 2): %.2f ms less a step (expected ~0.6)\n", n, o, o - n }'
fi
exit $bad
