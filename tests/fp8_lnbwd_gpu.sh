#!/usr/bin/env bash
# The LayerNorm backward writing the next linear's FP8 dY (issue 18, --fp8 1 with the fused casts:
# layernorm_backward_fp8_dy, llmc/fp8_fused.cuh; the kernel's FP8 variant in llmc/layernorm.cuh),
# checked first, then timed. Builds nothing; needs, built beforehand:
#   make build/train_gpt2cu build/test_fp8_gpu && make -C dev/cuda build/layernorm
#   OLD_BIN (optional): a train_gpt2cu of the commit before, timed alternately with TRAIN
# Parts, each under a timeout, logs under $OUT/fp8_lnbwd (OUT default build):
#   1. dev/cuda/build/layernorm: every LayerNorm op against the CPU reference, and the op
#      layernorm_backward_fp8_dy (N=65536 C=768 e5m2; N=16384 C=320 e4m3 and C=1024 e5m2): variant 0
#      (the fused kernel) and 1 (layernorm_backward + fp8_cast_transpose_fused NONE + bias) both bit
#      for bit against the unfused path (dinp, dweight, dbias, the linear's bias gradient), dY and
#      dY^T byte for byte against cpu::fp8_cast, the amax bits; their timings
#   2. build/test_fp8_gpu: the FP8 linears against the CPU reference
#   3. --fp8-fused 0 = 1 (tests/fp8_same_gpu.sh: B=32 T=1024, 8 steps, --deterministic 1; a Llama-style
#      L6 bit for bit; GPT-2 d6, where the norm backwards write attproj's and fcproj's dY in the fused
#      run, losses within 1e-3: the separate casts' bias gradients are summed in another order)
#   4. speed: 124M, B=64 T=1024, random tokens, --fp8 1 --fp8-head 1, STEPS (16) steps a run,
#      ROUNDS (2) runs of TRAIN (alternating with OLD_BIN where given), alone on the GPU: the BENCH
#      lines (median ms/step after the warm-up); with OLD_BIN also whether the two binaries' loss
#      lines agree (they should: the fused dY is bit-identical to the separate cast's)
# Last lines: PASS/FAIL of the checks, then the lab's fused/unfused times and ms/step. ~2.5 minutes
# on an H200 (estimated, not yet run: parts 1-3 at once, then the timing alone).
cd "$(dirname "$0")/.." || exit 1
LOGS=${OUT:-build}/fp8_lnbwd
STEPS=${STEPS:-16}
ROUNDS=${ROUNDS:-2}
TRAIN=${TRAIN:-build/train_gpt2cu}
LAB=${LAB_BUILD:-dev/cuda/build}
mkdir -p "$LOGS" || exit 1
need=("$TRAIN" build/test_fp8_gpu "$LAB/layernorm")
[ -n "${OLD_BIN:-}" ] && need+=("$OLD_BIN")
for b in "${need[@]}"; do [ -x "$b" ] || { echo "error: $b is missing (build it first: see the top of $0)"; exit 1; }; done
rows=(); bad=0; t0=$SECONDS
row() {  # row STATUS(0 pass) NAME DETAIL
    if [ "$1" -eq 0 ]; then rows+=("PASS  $2${3:+ ($3)}"); else rows+=("FAIL  $2${3:+ ($3)}"); bad=1; fi
    echo "$([ "$1" -eq 0 ] && echo PASS || echo FAIL) $2 $3"
}
result() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" > "$LOGS/$4.row"; }  # result STATUS NAME DETAIL PART
part_lab() {
    local t1=$SECONDS st
    timeout 150 "$LAB/layernorm" --reps 20 > "$LOGS/layernorm.txt" 2>&1; st=$?
    grep -q 'layernorm_backward_fp8_dy' "$LOGS/layernorm.txt" || st=1
    result $st "layernorm lab (LayerNorm vs CPU; FP8 dY variant bit for bit)" \
        "$(grep -c ' ok' "$LOGS/layernorm.txt") ok lines, $(grep -c 'FAIL' "$LOGS/layernorm.txt") FAIL, $((SECONDS - t1)) s" lab
}
part_test() {
    local t1=$SECONDS st
    timeout 150 build/test_fp8_gpu > "$LOGS/test_fp8_gpu.txt" 2>&1; st=$?
    result $st "test_fp8_gpu (FP8 linears vs CPU)" "$(tail -1 "$LOGS/test_fp8_gpu.txt"), $((SECONDS - t1)) s" test
}
part_same() {  # tests/fp8_same_gpu.sh: --fp8-fused 0 = 1 (Llama-style bit for bit, GPT-2 within 1e-3)
    local st detail
    IFS=$'\t' read -r st detail < <(tests/fp8_same_gpu.sh "$LOGS/same" "$TRAIN" | tail -1)
    result "${st:-1}" "fused casts = separate casts (tests/fp8_same_gpu.sh: Llama-style L6 bit for bit, GPT-2 d6 losses within 1e-3)" "$detail" same
}
echo "==== 1-3. checks, at once: layernorm lab, test_fp8_gpu, fused = unfused"
rm -f "$LOGS"/*.row
part_lab & part_test & part_same &
wait
for p in lab test same; do
    if [ -f "$LOGS/$p.row" ]; then IFS=$'\t' read -r st name detail < "$LOGS/$p.row"; row "$st" "$name" "$detail"
    else row 1 "part $p" "no result (killed?)"; fi
done
grep -E "FAIL" "$LOGS/layernorm.txt" | head -8
grep -E "FAIL" "$LOGS/test_fp8_gpu.txt" | head -5

echo "==== 4. speed: 124M, B=64 T=1024, --fp8 1 --fp8-head 1, $STEPS steps a run, $ROUNDS rounds"
bins=(new); [ -n "${OLD_BIN:-}" ] && bins+=(old)
declare -A ALL
for ((i = 1; i <= ROUNDS; i++)); do
    for which in "${bins[@]}"; do
        bin=$TRAIN; [ "$which" = old ] && bin=$OLD_BIN
        timeout 60 "$bin" --init d12 --random-data 1 --val-every 0 --batch 64 --seq 1024 --steps "$STEPS" --fp8 1 \
            --fp8-head 1 --log "$LOGS/bench_${which}_$i.log" > "$LOGS/bench_${which}_$i.txt" 2>&1
        line=$(grep '^BENCH ' "$LOGS/bench_${which}_$i.txt" | tail -1)
        if [ -z "$line" ]; then row 1 "bench $which round $i" "no BENCH line: $(tail -1 "$LOGS/bench_${which}_$i.txt")"; continue; fi
        ms=$(sed -n 's/.* ms=\([^ ]*\).*/\1/p' <<< "$line")
        echo "    $which round $i: $line"
        ALL[$which]="${ALL[$which]} $ms"
    done
done
same_loss=""
if [ -n "${OLD_BIN:-}" ] && [ -f "$LOGS/bench_new_1.log" ] && [ -f "$LOGS/bench_old_1.log" ]; then
    cols='$1 == "step" && $3 == "train_loss" { print $1, $2, $3, $4 }'
    if [ "$(awk "$cols" "$LOGS/bench_new_1.log")" = "$(awk "$cols" "$LOGS/bench_old_1.log")" ]; then
        same_loss="new and old loss lines identical"
    else
        same_loss="new and old loss lines DIFFER (expected identical): $(diff <(awk "$cols" "$LOGS/bench_old_1.log") \
            <(awk "$cols" "$LOGS/bench_new_1.log") | grep '^[<>]' | head -2 | tr '\n' ' ')"
    fi
fi

echo
echo "==== summary ($((SECONDS - t0)) s; logs in $LOGS)"
for r in "${rows[@]}"; do echo "$r"; done
echo "lab, layernorm_backward_fp8_dy (variant 0 fused, 1 layernorm_backward + fp8_cast_transpose_fused):"
awk '/^# name/ { on = 1 } on && /^layernorm_backward_fp8_dy/' "$LOGS/layernorm.txt" | sed 's/^/    /'
for which in "${bins[@]}"; do
    printf "%-4s ms/step (BENCH medians): %s  -> median %s\n" "$which" "${ALL[$which]}" \
        "$(tr ' ' '\n' <<< "${ALL[$which]}" | grep . | sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')"
done
[ -n "$same_loss" ] && echo "$same_loss"
exit $bad
