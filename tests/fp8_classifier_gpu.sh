#!/usr/bin/env bash
# The FP8 head's classifier (issue 18; --fp8 1 --fp8-head 1): fused_classifier_fp8's kernel,
# fused_classifier_fp8_block_per_row, checked and timed against the one it replaces (the lab's FP8
# variant 1, fused_classifier_rows_in_smem), then the trainer's step. Builds nothing; needs, built
# beforehand:
#   make -j1 build/train_gpt2cu build/test_fp8_gpu && make -C dev/cuda -j1 build/fused_classifier
#   OLD_BIN=path/to/an/older/train_gpt2cu   (optional: the trainer before this change, timed alternately;
#   e.g. built from commit 65c636c: git archive 65c636c | tar -x -C /tmp/old && make -C /tmp/old build/train_gpt2cu,
#   copied to build/train_gpt2cu_old: OLD_BIN=build/train_gpt2cu_old tests/fp8_classifier_gpu.sh)
# Parts, logs under $OUT/fp8_classifier (OUT default build):
#   1. dev/cuda/build/fused_classifier (every op: the bf16 classifier's variants, whose per-value code
#      this change touched, then --fp8's both formats at N=65536 V=50257 and N=651 V=1003): each
#      variant checked against the CPU reference before it is timed (a failed check skips its timing;
#      only a failure of variant 0, the shipped kernels, counts as a failed check of this script);
#      both ops also compare every gradient byte and every loss of the new kernels with variant 1's
#      (the code as it shipped before this change): "bytes vs rows in smem: equal" is bit-identity
#   2. build/test_fp8_gpu: the FP8 linears and the head (the classifier's FP8 dlogits byte for byte
#      against llmc/cpu/fp8.h of the bf16 classifier's dlogits, its losses bit for bit the bf16 one's)
#   3. the trainer, 124M, B=64 T=1024, random tokens, STEPS (16) steps, --fp8 1 --fp8-head 1: its
#      BENCH line (median ms/step after warm-up); with OLD_BIN, new old new old. Skipped when a check
#      of parts 1-2 failed (FORCE=1 times anyway)
# Last lines: a summary table. ~2 minutes on an H200 (estimated; not yet run).
cd "$(dirname "$0")/.." || exit 1
LOGS=${OUT:-build}/fp8_classifier
STEPS=${STEPS:-16}
LAB=${LAB:-dev/cuda/build/fused_classifier}
TRAIN=${TRAIN:-build/train_gpt2cu}
TEST=${TEST:-build/test_fp8_gpu}
mkdir -p "$LOGS" || exit 1
for b in "$LAB" "$TRAIN" "$TEST" ${OLD_BIN:+"$OLD_BIN"}; do
    [ -x "$b" ] || { echo "error: $b is missing (build it first: see the top of $0)"; exit 1; }
done
rows=(); bad=0; t0=$SECONDS
row() {  # row STATUS(0: pass, INFO: printed only, else fail) NAME DETAIL
    local tag=PASS
    if [ "$1" = INFO ]; then tag=INFO; elif [ "$1" != 0 ]; then tag=FAIL; bad=1; fi
    rows+=("$tag  $2${3:+ ($3)}"); echo "$tag $2 $3"
}

echo "==== 1. lab: dev/cuda/fused_classifier.cu (bf16 classifier, then the FP8 one in e4m3 and e5m2)"
t1=$SECONDS
timeout 150 "$LAB" > "$LOGS/lab.txt" 2>&1; st=$?
grep -E "^(  fused_classifier|FAIL|    (all losses|meta|fp8 bytes|untouched|guard|bytes vs)|    first bad)" \
    "$LOGS/lab.txt" | sed -e 's/^/  /' -e 's/: moves .*//'
# the shipped kernels' checks gate part 3; a lab-only variant's failure is reported, not a reason to stop
finished=$(grep -c "check(s) failed" "$LOGS/lab.txt")
shipped=$(grep -c "^FAIL .* | 0 " "$LOGS/lab.txt")
others=$(grep "^FAIL .* | [1-9]" "$LOGS/lab.txt" | sed 's/^FAIL //' | tr '\n' ';')
if [ "$finished" -eq 0 ]; then row 1 "lab" "did not finish (rc $st): $(tail -1 "$LOGS/lab.txt")"
else row "$shipped" "lab: the shipped kernels (variant 0) checked" "$shipped failed; $((SECONDS - t1)) s"; fi
row INFO "lab: the other variants' checks" "${others:-all passed}"
ndiff=$(grep -c "bytes vs rows in smem, variant 0: DIFFER" "$LOGS/lab.txt")
nequal=$(grep -c "bytes vs rows in smem, variant 0: equal" "$LOGS/lab.txt")
others=$(grep -c "bytes vs rows in smem, variant [1-9]: equal" "$LOGS/lab.txt")
row INFO "shipped = old kernel bit for bit (every row's gradient bytes, every loss; bf16 and FP8 ops, 6 expected)" \
    "$nequal equal, $ndiff DIFFER; lab variants 2-4: $others equal"

echo "==== 2. build/test_fp8_gpu (FP8 linears and head vs the CPU)"
t1=$SECONDS
timeout 170 "$TEST" > "$LOGS/test_fp8_gpu.txt" 2>&1; st=$?
grep -E "FP8 classifier|^head:" "$LOGS/test_fp8_gpu.txt" | sed 's/^/    /'
grep -E "FAIL" "$LOGS/test_fp8_gpu.txt" | head -5 | sed 's/^/    /'
row $st "test_fp8_gpu" "$(grep -c '^head:' "$LOGS/test_fp8_gpu.txt") head cases, $(grep -c 'FP8 classifier: losses ok.*bytes ok' "$LOGS/test_fp8_gpu.txt") classifiers ok; $(tail -1 "$LOGS/test_fp8_gpu.txt"), $((SECONDS - t1)) s"

declare -A MS
bench() {  # bench KEY BINARY
    local line
    timeout 90 "$2" --init d12 --random-data 1 --val-every 0 --batch 64 --seq 1024 --steps "$STEPS" --fp8 1 --fp8-head 1 \
        > "$LOGS/bench_$1.txt" 2>&1
    line=$(grep '^BENCH ' "$LOGS/bench_$1.txt" | tail -1)
    if [ -z "$line" ]; then row 1 "bench $1" "no BENCH line: $(tail -1 "$LOGS/bench_$1.txt")"; return; fi
    echo "    $1: $line"
    MS[$1]=$(sed -n 's/.* ms=\([^ ]*\).*/\1/p' <<< "$line")
}
if [ $bad -ne 0 ] && [ "${FORCE:-0}" != 1 ]; then
    echo "==== 3. trainer: skipped (a check failed; FORCE=1 times anyway)"
else
    echo "==== 3. trainer: 124M, B=64 T=1024, --fp8 1 --fp8-head 1, $STEPS steps${OLD_BIN:+, new old new old}"
    if [ -n "$OLD_BIN" ]; then
        bench new1 "$TRAIN"; bench old1 "$OLD_BIN"; bench new2 "$TRAIN"; bench old2 "$OLD_BIN"
    else
        bench new1 "$TRAIN"
    fi
fi

echo
echo "==== summary ($((SECONDS - t0)) s; logs in $LOGS)"
for r in "${rows[@]}"; do echo "$r"; done
echo "lab (median ms; FP8 variant 1 = rows in smem, as shipped until this change):"
grep -E "^fused_classifier(_fp8)?.* \| [0-9]+ " "$LOGS/lab.txt" | awk -F'|' '{ printf "  %-44s |%-44s |%s ms |%s\n", $1, $2, $3, $6 }'
grep -E "^  fused_classifier_fp8 .*: shipped .* faster" "$LOGS/lab.txt"
if [ -n "${MS[new1]}" ]; then
    printf "trainer --fp8 1 --fp8-head 1 ms/step: new %s%s" "${MS[new1]}" "${MS[new2]:+, ${MS[new2]}}"
    if [ -n "$OLD_BIN" ]; then
        printf "; old %s%s" "${MS[old1]:-?}" "${MS[old2]:+, ${MS[old2]}}"
        awk -v a="${MS[new1]}" -v b="${MS[new2]}" -v c="${MS[old1]}" -v d="${MS[old2]}" 'BEGIN {
            n = b == "" ? a : (a + b) / 2; o = d == "" ? c : (c + d) / 2
            if (c != "") printf " (mean new %.2f, old %.2f: %+.2f ms)", n, o, n - o }'
    fi
    echo
fi
exit $bad
