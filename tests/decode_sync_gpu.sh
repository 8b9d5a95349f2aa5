#!/usr/bin/env bash
# The fused decode step's counter waits and folded argmax (issue 15: GPT-2 124M, bf16, 64-token
# prompts, 256 new greedy tokens: B=1 >= 5,000 tok/s, B=64 >= 100,000 tok/s) on one GPU, old beside new:
#   --step-sync 1   each kernel of a step at B <= 8 waits on a counter the kernel before it counts
#                   into (llmc/step_sync.h) instead of griddepcontrol.wait; 0: the wait; 2: counters
#                   and each kernel lets the next launch before its own wait (many grids resident)
#   --fold-argmax 1 the lm_head GEMV takes the greedy argmax (GemvFusion::argmax), a greedy step
#                   starts with advance_and_encode (no sampler kernel); 0: the sampler
# Default 1 1; 0 0 is the step before this work. B=64 runs cuBLASLt (neither applies): its figure
# must stay >= 100,000.
# Builds nothing (an estimate of ~4 minutes on an H200 for all of it; PARTS="1 2 3" and PARTS=4 split
# it in two calls). Needs, built beforehand:
#   make build/generate build/generate_fp32 build/generate_cpu
#   make -C dev/cuda build/gemv build/attention_decode
# Runs, each under a timeout (logs in $OUT, default build/decode_sync):
#   1. the GEMV lab's fused ops (dev/cuda/gemv.cu --fused-only): variants 0 (shipped), 3 (norm+lm_head
#      with the folded argmax: its argmax against the first largest of its stored logits, poisoned
#      first), 2, 1 checked against the CPU reference (fresh random inputs, poisoned outputs)
#   2. the decode attention lab (dev/cuda/attention_decode.cu) variants 0, 8, 9 (the split kernel now
#      takes the step counters) against the CPU reference
#   3. tests/test_generate_gpu.sh SECTIONS=1237 with the defaults (1 1): fp32 GPU tokens = CPU twin
#      for GPT-2 and Llama-style models (greedy, sampled, batches, idle rows, context end), cached =
#      full forward, graph = no graph, the fused step's checks; then SECTIONS=7 (the fused step's
#      checks: tokens = CPU twin for GPT-2 and Llama, --pdl 0, Llama --check-full) with --step-sync 2
#      and the bf16 d12's greedy tokens (3 prompts) bit-identical across --step-sync 0/1/2,
#      --fold-argmax 0/1, --gemv-rows 0/2, --graph 0/1
#   4. generate --bench 1 at B = 1, 8, 64 (--init d12) and the Llama 114M shape at B = 1, with
#      (--step-sync, --fold-argmax) = 0 0 (old), 1 1 (default), 2 1, and at d12 B = 1 also 1 0 and
#      0 1, and 1 1 / 2 1 with --gemv-rows 2; --profile 1 at d12 B = 1 for 0 0, 1 1 and 2 1
# PARTS="3 4" (say) runs only those parts.
# Last: the PROFILE lines, the tok/s table and PASS/FAIL per part; exit 1 if any part failed.
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-build/decode_sync}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ALL_PARTS="1 2 3 4"
. tests/decode_common.sh  # LAB, GEN, need, want, part, ran, summary
need "$GEN" build/generate_fp32 build/generate_cpu $LAB/gemv $LAB/attention_decode

if want 1; then
echo "==== 1. GEMV lab, fused ops (variant 3: the folded argmax)"
timeout 90 $LAB/gemv --fused-only --reps 5 > "$OUT/gemv.txt" 2>&1; st=$?
grep -E "FAIL|error" "$OUT/gemv.txt" | head -10
grep -q "folded greedy argmax" "$OUT/gemv.txt" || { echo "  variant 3 did not run"; st=1; }
part "gemv lab --fused-only: checks (0, 3 folded argmax, 2, 1) + timing [$((SECONDS - t0)) s]" $st
fi

if want 2; then
echo "==== 2. attention_decode lab"
t1=$SECONDS
timeout 60 $LAB/attention_decode 0 8 9 --reps 5 > "$OUT/attention_decode.txt" 2>&1; st=$?
grep -E "FAIL|error" "$OUT/attention_decode.txt" | head -10
part "attention_decode lab 0 8 9: checks + timing [$((SECONDS - t1)) s]" $st
fi

if want 3; then
echo "==== 3. test_generate_gpu.sh, defaults and --step-sync 2"
# the same binaries with knobs appended (the test passes its own flags first)
wrap() {  # wrap DIR FLAGS...: DIR/generate and DIR/generate_fp32 run build/'s with FLAGS appended
    local w=$1; shift; mkdir -p "$w"
    for b in generate generate_fp32; do
        printf '#!/usr/bin/env bash\nexec %s "$@" %s\n' "$PWD/build/$b" "$*" > "$w/$b"
        chmod +x "$w/$b"
    done
}
for run in "1237 1 1 180" "7 2 1 100"; do
    set -- $run; sections=$1; ss=$2; fa=$3; limit=$4
    t1=$SECONDS
    wrap "$OUT/wrap_$ss$fa" --step-sync $ss --fold-argmax $fa
    SECTIONS=$sections GEN="$OUT/wrap_$ss$fa/generate" GEN32="$OUT/wrap_$ss$fa/generate_fp32" \
        GPU_TEST_DIR="$OUT/gen_$ss$fa" timeout $limit tests/test_generate_gpu.sh > "$OUT/checks_$ss$fa.txt" 2>&1
    st=$?
    grep -E "^FAIL" "$OUT/checks_$ss$fa.txt" | head -10
    part "test_generate_gpu.sh SECTIONS=$sections, --step-sync $ss --fold-argmax $fa: $(grep -E '^[0-9]+ passed' "$OUT/checks_$ss$fa.txt" | tail -1) [$((SECONDS - t1)) s]" $st
done
# the knobs change where kernels wait and who takes the argmax, never a sum: the bf16 tokens of a
# random d12 (3 prompts of different lengths: M = 3, where --gemv-rows 2 is not the shipped 1) are
# bit-identical for every combination, graph and no graph
t1=$SECONDS
P3="--prompt-ids 1,2,3,4,5 --prompt-ids 900,17,4,250,31,8,77,12,600,5,44,3 --prompt-ids 42"
st=0
for knobs in "0 0 0 1" "1 1 0 1" "2 1 0 1" "1 0 0 1" "0 1 0 1" "1 1 2 1" "2 1 2 1" "2 1 0 0" "1 1 0 0"; do
    set -- $knobs
    timeout 60 $GEN --init d12 --max-seq 128 $P3 --temperature 0 --max-new 40 --eot -1 --step-sync $1 \
        --fold-argmax $2 --gemv-rows $3 --graph $4 > "$OUT/tok_$1$2$3$4.out" 2> "$OUT/tok.err" || { st=1; tail -2 "$OUT/tok.err"; }
    [ -s "$OUT/tok_$1$2$3$4.out" ] && cmp -s "$OUT/tok_0001.out" "$OUT/tok_$1$2$3$4.out" ||
        { st=1; echo "  tokens of --step-sync $1 --fold-argmax $2 --gemv-rows $3 --graph $4 differ from 0 0 0 1"; }
done
part "bf16 d12 tokens identical for every --step-sync / --fold-argmax / --gemv-rows / --graph tried [$((SECONDS - t1)) s]" $st
fi

if want 4; then
echo "==== 4. bench"
t1=$SECONDS
: > "$OUT/bench.txt"
LLAMA114="llama:L12,C768,H12,KV4,F2048"
# model, B, --step-sync, --fold-argmax, --gemv-rows
for run in "d12 1 0 0 0" "d12 1 1 1 0" "d12 1 2 1 0" "d12 1 1 0 0" "d12 1 0 1 0" "d12 1 1 1 2" "d12 1 2 1 2" \
           "d12 8 0 0 0" "d12 8 1 1 0" "d12 8 2 1 0" "d12 64 0 0 0" "d12 64 1 1 0" \
           "$LLAMA114 1 0 0 0" "$LLAMA114 1 1 1 0" "$LLAMA114 1 2 1 0"; do
    set -- $run; model=$1; B=$2; ss=$3; fa=$4; rows=$5
    extra=""; [ $model = d12 ] && [ $B = 1 ] && [ $rows = 0 ] && [ "$ss$fa" != 10 ] && [ "$ss$fa" != 01 ] &&
        extra="--profile 1"
    timeout 60 $GEN --init $model --bench 1 --bench-prompt 64 --max-new 256 --temperature 0 --batch $B \
        --step-sync $ss --fold-argmax $fa --gemv-rows $rows $extra > "$OUT/run.out" 2> "$OUT/run.err"
    st=$?
    grep -q BENCH_GEN "$OUT/run.out" || st=1
    [ $st -ne 0 ] && { echo "  $model B=$B step_sync=$ss fold=$fa rows=$rows:"; tail -3 "$OUT/run.err"; }
    grep -E "BENCH_GEN|PROFILE" "$OUT/run.out" | sed "s/^/model=${model%%:*} /" >> "$OUT/bench.txt"
    part "bench ${model%%:*} B=$B --step-sync $ss --fold-argmax $fa --gemv-rows $rows" $st
done
echo "  [$((SECONDS - t1)) s]"
fi

echo
echo "==== GEMV lab: norm+lm_head, ms: 0 shipped, 3 with the folded argmax"
ran "$OUT/gemv.txt" && grep -E "norm\+lm_head" "$OUT/gemv.txt" | grep -E "\| (0|3) " | grep -v "moves" | head -16
echo
echo "==== PROFILE d12 B=1 (plain launches, an event between kernels): 0 0 (old), 1 1, 2 1"
ran "$OUT/bench.txt" && grep PROFILE "$OUT/bench.txt"
echo
echo "==== decode tok/s, 64-token prompts, 256 new tokens, greedy (targets d12: B=1 5000 = 200 us, B=64 100000)"
ran "$OUT/bench.txt" && awk '/BENCH_GEN/ {
    model = ""; B = ""; ss = ""; fa = ""; tok = ""; ms = ""; rows = 0
    for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] == "model") model = kv[2]; else if (kv[1] == "B") B = kv[2]
        else if (kv[1] == "step_sync") ss = kv[2]; else if (kv[1] == "fold_argmax") fa = kv[2]
        else if (kv[1] == "tok_s") tok = kv[2]; else if (kv[1] == "ms_per_token") ms = kv[2]
        else if (kv[1] == "rows") rows = kv[2]
    }
    if (rows != 0) next
    k = model " B=" B
    if (!(k in seen)) { seen[k] = 1; order[++n] = k }
    t[k, ss fa] = tok; m[k, ss fa] = ms
} END {
    printf "%-12s %9s %9s %9s %8s %8s %9s %9s %9s %9s %9s\n", "run", "tok/s 00", "tok/s 11", "tok/s 21",
           "11/00", "21/00", "us/tok 00", "us/tok 11", "us/tok 21", "1 0", "0 1"
    for (i = 1; i <= n; i++) { k = order[i]
        printf "%-12s %9s %9s %9s %7.3fx %7.3fx %9.1f %9.1f %9.1f %9s %9s\n", k, t[k, "00"], t[k, "11"],
               (t[k, "21"] == "" ? "-" : t[k, "21"]), (t[k, "00"] > 0 ? t[k, "11"] / t[k, "00"] : 0),
               (t[k, "00"] > 0 ? t[k, "21"] / t[k, "00"] : 0), 1000 * m[k, "00"], 1000 * m[k, "11"],
               1000 * m[k, "21"], (t[k, "10"] == "" ? "-" : t[k, "10"]),
               (t[k, "01"] == "" ? "-" : t[k, "01"]) }
}' "$OUT/bench.txt"
echo
echo "==== every bench run: --gemv-rows 2 halves the fused GEMVs' warps (more of the next kernel resident early)"
ran "$OUT/bench.txt" && awk '/BENCH_GEN/ {
    r = ""
    for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] ~ /^(model|B|step_sync|fold_argmax|rows|ms_per_token|tok_s)$/) r = r sprintf("%s=%s ", kv[1], kv[2])
    }
    print "  " r
}' "$OUT/bench.txt"
echo
summary decode_sync_gpu
