#!/usr/bin/env bash
# The decode step's latency work (issue 15's targets: GPT-2 124M, bf16, 64-token prompts, 256 new
# tokens, greedy: B=1 >= 5,000 tok/s, B=64 >= 100,000 tok/s) on one GPU, old kernels beside new:
# generate --latency-kernels 0 runs the kernels from before it (GEMV first weight round prefetched to
# L2 only, no split of K; attention_decode reading everything after its wait; the one-block greedy
# sampler; the norms beside cuBLASLt as the trainer's warp-per-row kernel, plain launches),
# --latency-kernels 1 (the default) the new ones (and the norms a block per row as programmatic
# dependents); --matmul-autotune 0 takes cuBLASLt's first heuristic pick for the B > 8 step's
# matmuls, 1 (the default) the fastest of its list and split-K versions, timed once before the first
# prefill.
# Builds nothing (~5 minutes on an H200). Needs, built beforehand:
#   make build/generate build/generate_fp32 build/generate_cpu
#   make -C dev/cuda build/gemv build/attention_decode build/layernorm   (build/rmsnorm: optional)
# Runs, each under a timeout (logs in $OUT, default /tmp/out):
#   1. the GEMV lab (dev/cuda/gemv.cu): every variant checked against the CPU reference (fresh random
#      inputs, poisoned outputs) and timed: 0 shipped, 5 before the latency work, 6 preload only;
#      fused ops: 0 shipped, 2 before, 1 unfused kernels
#   2. the decode attention lab (dev/cuda/attention_decode.cu), variants 0 (shipped: early loads; at
#      B = 1 past 1024 keys of capacity the waves plan instead of the cluster), 10 (the waves plan),
#      12 (the shipped plan without the cluster), 9 (no early loads: the B > 8 kernel), 8 (append
#      folded in), checked against the CPU reference and timed
#   3. the norm labs (dev/cuda/layernorm.cu, and rmsnorm.cu if built): every variant checked against
#      the CPU reference; at M = 1, 8, 64 rows the small-M kernel (0, block per row) against the
#      large-M one (1)
#   4. tests/test_generate_gpu.sh SECTIONS=7: fp32 build, fused = unfused = CPU twin tokens (greedy:
#      the many-block argmax; sampled: the one-block sampler; batches of 10 through cuBLASLt with the
#      autotune and the block-per-row norms: the defaults), --latency-kernels 0 = CPU twin too, and
#      --check-full (bf16)
#   5. generate --bench 1 --init d12 at B = 1, 8, 64 with (--latency-kernels, --matmul-autotune) =
#      (0, 0) and (1, 1), and at B = 64 also (1, 0) and (0, 1); --profile 1 at B = 1 and 64 with (1, 1);
#      the autotune's choices (stderr) of the B = 64 run
# PARTS="4 5" (say) runs only those parts.
# Last: the labs' old-vs-new lines, the PROFILE lines, the autotune's choices, the tok/s table and
# PASS/FAIL per part; exit 1 if any part failed.
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
ALL_PARTS="1 2 3 4 5"
. tests/decode_common.sh  # LAB, GEN, need, want, part, ran, summary
need "$GEN" build/generate_fp32 build/generate_cpu $LAB/gemv $LAB/attention_decode $LAB/layernorm
: > "$OUT/norms.txt"

if want 1; then
echo "==== 1. GEMV lab"
timeout 150 $LAB/gemv --reps 10 > "$OUT/gemv.txt" 2>&1; st=$?
grep -E "FAIL|error" "$OUT/gemv.txt" | head -10
part "gemv lab: checks of every variant + timing [$((SECONDS - t0)) s]" $st

fi
if want 2; then
echo "==== 2. attention_decode lab"
t1=$SECONDS
timeout 100 $LAB/attention_decode 0 10 12 9 8 --reps 10 > "$OUT/attention_decode.txt" 2>&1; st=$?
grep -E "FAIL|error" "$OUT/attention_decode.txt" | head -10
part "attention_decode lab 0 10 12 9 8: checks + timing [$((SECONDS - t1)) s]" $st

fi
if want 3; then
echo "==== 3. norm labs"
for lab in layernorm rmsnorm; do
    if [ ! -x $LAB/$lab ]; then echo "  $LAB/$lab not built: skipped"; continue; fi
    t1=$SECONDS
    timeout 90 $LAB/$lab --reps 10 > "$OUT/$lab.txt" 2>&1; st=$?
    grep -E "FAIL|error" "$OUT/$lab.txt" | head -10
    grep -E " small M=" "$OUT/$lab.txt" >> "$OUT/norms.txt"
    part "$lab lab: checks of every variant (small M and large) + timing [$((SECONDS - t1)) s]" $st
done

fi
if want 4; then
echo "==== 4. test_generate_gpu.sh SECTIONS=7"
t1=$SECONDS
SECTIONS=7 GPU_TEST_DIR="$OUT/gen" timeout 150 tests/test_generate_gpu.sh > "$OUT/checks.txt" 2>&1; st=$?
grep -E "^FAIL" "$OUT/checks.txt" | head -20
part "test_generate_gpu.sh SECTIONS=7: $(grep -E '^[0-9]+ passed' "$OUT/checks.txt" | tail -1) [$((SECONDS - t1)) s]" $st

fi
if want 5; then
echo "==== 5. bench"
t1=$SECONDS
: > "$OUT/bench.txt"
: > "$OUT/autotune.txt"
# B, --latency-kernels, --matmul-autotune
for run in "1 0 0" "1 1 1" "8 0 0" "8 1 1" "64 0 0" "64 1 0" "64 0 1" "64 1 1"; do
    set -- $run; B=$1; lat=$2; at=$3
    extra=""; [ $lat = 1 ] && [ $at = 1 ] && [ $B != 8 ] && extra="--profile 1"
    timeout 60 $GEN --init d12 --bench 1 --bench-prompt 64 --max-new 256 --temperature 0 --batch $B \
        --latency-kernels $lat --matmul-autotune $at $extra > "$OUT/run.out" 2> "$OUT/run.err"
    st=$?
    grep -q BENCH_GEN "$OUT/run.out" || st=1
    [ $st -ne 0 ] && { echo "  B=$B latency=$lat autotune=$at:"; tail -3 "$OUT/run.err"; }
    grep -E "BENCH_GEN|PROFILE" "$OUT/run.out" >> "$OUT/bench.txt"
    [ "$run" = "64 1 1" ] && grep -E "matmul autotune|warning" "$OUT/run.err" >> "$OUT/autotune.txt"
    part "bench d12 B=$B --latency-kernels $lat --matmul-autotune $at" $st
done
echo "  [$((SECONDS - t1)) s]"

echo
fi
echo "==== GEMV lab, ms: shipped (0) vs before the latency work (5; fused ops: 2)"
ran "$OUT/gemv.txt" && awk -F' [|] ' '/^gemv/ && NF >= 6 {
    split($2, v, " "); key = $1; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    t[key, v[1]] = $3
} END {
    printf "%-62s %9s %9s %7s\n", "op", "new_ms", "old_ms", "speedup"
    for (i = 1; i <= n; i++) { k = order[i]; o = (k ~ /^gemv-fused/) ? t[k, 2] : t[k, 5]
        if (k ~ /M=1 / || k ~ /M=8 /)
            printf "%-62s %9.4f %9.4f %6.2fx\n", k, t[k, 0], o, (t[k, 0] > 0 ? o / t[k, 0] : 0) }
}' "$OUT/gemv.txt"
echo
echo "==== attention_decode lab, ms: 0 shipped (B 1 past 1024 keys of capacity: the waves plan), 10 waves plan (before), 12 no cluster, 9 no early loads"
ran "$OUT/attention_decode.txt" && awk -F' [|] ' '/^attention_decode / && NF >= 6 {
    split($2, v, " "); key = $1; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    t[key, v[1]] = $3
} END {
    printf "%-76s %8s %8s %8s %8s\n", "op", "0", "10", "12", "9"
    for (i = 1; i <= n; i++) { k = order[i]
        printf "%-76s %8.4f %8.4f %8.4f %8.4f\n", k, t[k, 0], t[k, 10], t[k, 12], t[k, 9] }
}' "$OUT/attention_decode.txt"
echo
echo "==== norm labs at a decode step's rows, ms: 0 block per row (new), 1 warp per row (before)"
ran "$OUT/norms.txt" && awk -F' [|] ' 'NF >= 6 {
    split($2, v, " "); key = $1; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    t[key, v[1]] = $3
} END {
    printf "%-62s %9s %9s %8s\n", "op", "new_ms", "old_ms", "speedup"
    for (i = 1; i <= n; i++) { k = order[i]
        printf "%-62s %9.4f %9.4f %7.2fx\n", k, t[k, 0], t[k, 1], (t[k, 0] > 0 ? t[k, 1] / t[k, 0] : 0) }
}' "$OUT/norms.txt"
echo
echo "==== PROFILE (--latency-kernels 1 --matmul-autotune 1; plain launches, an event between kernels)"
ran "$OUT/bench.txt" && grep PROFILE "$OUT/bench.txt"
echo
echo "==== the autotune's choices at B = 64 (stderr of generate)"
ran "$OUT/autotune.txt" && cat "$OUT/autotune.txt"
echo
echo "==== decode tok/s, d12, 64-token prompts, 256 new tokens, greedy (targets: B=1 5000, B=64 100000)"
echo "     old = --latency-kernels 0 --matmul-autotune 0, new = 1 1; lat only = 1 0, tune only = 0 1"
ran "$OUT/bench.txt" && awk '/BENCH_GEN/ {
    B = ""; lat = ""; at = ""; tok = ""; ms = ""
    for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] == "B") B = kv[2]; else if (kv[1] == "latency") lat = kv[2]; else if (kv[1] == "autotune") at = kv[2]
        else if (kv[1] == "tok_s") tok = kv[2]; else if (kv[1] == "ms_per_token") ms = kv[2]
    }
    key = lat "" at
    if (!(B in seen)) { seen[B] = 1; order[++n] = B }
    t[B, key] = tok; m[B, key] = ms
} END {
    printf "%4s %10s %10s %8s %11s %11s %10s %10s %10s\n", "B", "tok/s old", "tok/s new", "speedup", "us/tok old",
           "us/tok new", "target us", "lat only", "tune only"
    for (i = 1; i <= n; i++) { b = order[i]
        printf "%4s %10s %10s %7.2fx %11.1f %11.1f %10s %10s %10s\n", b, t[b, "00"], t[b, "11"],
               (t[b, "00"] > 0 ? t[b, "11"] / t[b, "00"] : 0), 1000 * m[b, "00"], 1000 * m[b, "11"],
               (b == 1 ? "200" : b == 64 ? "640" : "-"), (t[b, "10"] == "" ? "-" : t[b, "10"]),
               (t[b, "01"] == "" ? "-" : t[b, "01"]) }
}' "$OUT/bench.txt"
echo
summary decode_latency_gpu
