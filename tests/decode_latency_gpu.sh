#!/usr/bin/env bash
# The decode step's latency work (issue 15's targets: GPT-2 124M, bf16, 64-token prompts, 256 new
# tokens, greedy: B=1 >= 5,000 tok/s, B=64 >= 100,000 tok/s) on one GPU, old kernels beside new:
# generate --latency-kernels 0 runs the kernels from before it (GEMV first weight round prefetched to
# L2 only, no split of K; attention_decode reading everything after its wait; the one-block greedy
# sampler), --latency-kernels 1 (the default) the new ones.
# Builds nothing (~4 minutes on an H200). Needs, built beforehand:
#   make build/generate build/generate_fp32 build/generate_cpu
#   make -C dev/cuda build/gemv build/attention_decode
# Runs, each under a timeout (logs in $OUT, default /tmp/out):
#   1. the GEMV lab (dev/cuda/gemv.cu): every variant checked against the CPU reference (fresh random
#      inputs, poisoned outputs) and timed: 0 shipped, 5 before the latency work, 6 preload only;
#      fused ops: 0 shipped, 2 before, 1 unfused kernels
#   2. the decode attention lab (dev/cuda/attention_decode.cu), variants 0 (shipped: early loads),
#      9 (no early loads: the B > 8 kernel), 8 (append folded in), and for the next choice at B = 64
#      2 (no split), 3 (2x splits), 6 (prefetch the next step), checked against the CPU reference
#      and timed
#   3. tests/test_generate_gpu.sh SECTIONS=7: fp32 build, fused = unfused = CPU twin tokens (greedy:
#      the many-block argmax; sampled: the one-block sampler), --latency-kernels 0 = CPU twin too,
#      and --check-full (bf16)
#   4. generate --bench 1 --init d12 at B = 1, 8, 64 with --latency-kernels 0 and 1 (and --profile 1
#      at B = 1 and 64 with 1: the per-kernel-family times), and at B = 1, 8 with --gemv-split-k 1
#      (the latency kernels without the split of K: the split quadruples fcproj's blocks, which may
#      crowd the next GEMV's early blocks out of the register file; docs/perf.md's sixteenth run
#      measured B=1 at 3,385 tok/s without the split against 3,869 with it)
# PARTS="3 4" (say) runs only those parts.
# Last: the labs' old-vs-new lines, the tok/s table, the PROFILE lines and PASS/FAIL per part; exit 1
# if any part failed.
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LAB=${LAB_BUILD:-dev/cuda/build}
GEN=${GEN:-build/generate}
for b in $GEN build/generate_fp32 build/generate_cpu $LAB/gemv $LAB/attention_decode; do
    [ -x "$b" ] || { echo "error: $b is missing (build it first: see the top of $0)"; exit 1; }
done
parts=(); bad=0
part() {  # part NAME STATUS
    if [ "$2" -eq 0 ]; then parts+=("PASS  $1"); else parts+=("FAIL  $1 (rc $2)"); bad=1; fi
}
t0=$SECONDS

want() { [[ " ${PARTS:-1 2 3 4} " == *" $1 "* ]]; }
if want 1; then
echo "==== 1. GEMV lab"
timeout 150 $LAB/gemv --reps 10 > "$OUT/gemv.txt" 2>&1; st=$?
grep -E "FAIL|error" "$OUT/gemv.txt" | head -10
part "gemv lab: checks of every variant + timing [$((SECONDS - t0)) s]" $st

fi
if want 2; then
echo "==== 2. attention_decode lab"
t1=$SECONDS
timeout 100 $LAB/attention_decode 0 9 8 2 3 6 --reps 10 > "$OUT/attention_decode.txt" 2>&1; st=$?
grep -E "FAIL|error" "$OUT/attention_decode.txt" | head -10
part "attention_decode lab 0 9 8 2 3 6: checks + timing [$((SECONDS - t1)) s]" $st

fi
if want 3; then
echo "==== 3. test_generate_gpu.sh SECTIONS=7"
t1=$SECONDS
SECTIONS=7 GPU_TEST_DIR="$OUT/gen" timeout 150 tests/test_generate_gpu.sh > "$OUT/checks.txt" 2>&1; st=$?
grep -E "^FAIL" "$OUT/checks.txt" | head -20
part "test_generate_gpu.sh SECTIONS=7: $(grep -E '^[0-9]+ passed' "$OUT/checks.txt" | tail -1) [$((SECONDS - t1)) s]" $st

fi
if want 4; then
echo "==== 4. bench"
t1=$SECONDS
: > "$OUT/bench.txt"
for run in "1 0" "1 1" "1 1 1" "8 0" "8 1" "8 1 1" "64 0" "64 1"; do  # B, --latency-kernels, --gemv-split-k
    set -- $run; B=$1; lat=$2; split=${3:-0}
    extra=""; [ $lat = 1 ] && [ $split = 0 ] && [ $B != 8 ] && extra="--profile 1"
    timeout 45 $GEN --init d12 --bench 1 --bench-prompt 64 --max-new 256 --temperature 0 --batch $B \
        --latency-kernels $lat --gemv-split-k $split $extra > "$OUT/run.out" 2> "$OUT/run.err"
    st=$?
    grep -q BENCH_GEN "$OUT/run.out" || st=1
    [ $st -ne 0 ] && { echo "  B=$B latency=$lat split=$split:"; tail -3 "$OUT/run.err"; }
    grep -E "BENCH_GEN|PROFILE" "$OUT/run.out" >> "$OUT/bench.txt"
    part "bench d12 B=$B --latency-kernels $lat --gemv-split-k $split" $st
done
echo "  [$((SECONDS - t1)) s]"

echo
fi
echo "==== GEMV lab, ms: shipped (0) vs before the latency work (5; fused ops: 2)"
awk -F' [|] ' '/^gemv/ && NF >= 6 {
    split($2, v, " "); key = $1; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    t[key, v[1]] = $3
} END {
    printf "%-62s %9s %9s %7s\n", "op", "new_ms", "old_ms", "speedup"
    for (i = 1; i <= n; i++) { k = order[i]; o = (k ~ /^gemv-fused/) ? t[k, 2] : t[k, 5]
        if (k ~ /M=1 / || k ~ /M=8 /)
            printf "%-62s %9.4f %9.4f %6.2fx\n", k, t[k, 0], o, (t[k, 0] > 0 ? o / t[k, 0] : 0) }
}' "$OUT/gemv.txt"
echo
echo "==== attention_decode lab, ms: 0 shipped (early loads), 9 no early loads, 2 no split, 3 2x splits, 6 prefetch"
awk -F' [|] ' '/^attention_decode / && NF >= 6 {
    split($2, v, " "); key = $1; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    t[key, v[1]] = $3
} END {
    printf "%-76s %8s %8s %8s %8s %8s\n", "op", "0", "9", "2", "3", "6"
    for (i = 1; i <= n; i++) { k = order[i]
        printf "%-76s %8.4f %8.4f %8.4f %8.4f %8.4f\n", k, t[k, 0], t[k, 9], t[k, 2], t[k, 3], t[k, 6] }
}' "$OUT/attention_decode.txt"
echo
echo "==== PROFILE (--latency-kernels 1; plain launches, an event between kernels)"
grep PROFILE "$OUT/bench.txt"
echo
echo "==== decode tok/s, d12, 64-token prompts, 256 new tokens, greedy (targets: B=1 5000, B=64 100000)"
awk '/BENCH_GEN/ {
    B = ""; lat = ""; sk = ""; tok = ""; ms = ""
    for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] == "B") B = kv[2]; else if (kv[1] == "latency") lat = kv[2]; else if (kv[1] == "split_k") sk = kv[2]
        else if (kv[1] == "tok_s") tok = kv[2]; else if (kv[1] == "ms_per_token") ms = kv[2]
    }
    key = lat == 0 ? "old" : sk == 1 ? "nosplit" : "new"
    if (!(B in seen)) { seen[B] = 1; order[++n] = B }
    t[B, key] = tok; m[B, key] = ms
} END {
    printf "%4s %10s %10s %8s %11s %11s %11s %20s\n", "B", "tok/s old", "tok/s new", "speedup", "us/tok old",
           "us/tok new", "target us", "new, no split: tok/s"
    for (i = 1; i <= n; i++) { b = order[i]
        printf "%4s %10s %10s %7.2fx %11.1f %11.1f %11s %20s\n", b, t[b, "old"], t[b, "new"],
               (t[b, "old"] > 0 ? t[b, "new"] / t[b, "old"] : 0), 1000 * m[b, "old"], 1000 * m[b, "new"],
               (b == 1 ? "200" : b == 64 ? "640" : "-"), t[b, "nosplit"] }
}' "$OUT/bench.txt"
echo
echo "==== decode_latency_gpu summary ($((SECONDS - t0)) s, logs in $OUT)"
for p in "${parts[@]}"; do echo "$p"; done
[ $bad -eq 0 ]
