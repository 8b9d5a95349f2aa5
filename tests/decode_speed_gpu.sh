#!/usr/bin/env bash
# The decode step's speed on one GPU: the fused step (--fused 1, the default at B <= 8: 5 kernels a
# layer, PDL on all of them; llmc/gpt2_infer.cuh) against the one-op-a-kernel step (--fused 0).
# Builds nothing (the binaries come built), ~3 minutes on an H200. Needs build/generate,
# build/generate_fp32, build/generate_cpu and dev/cuda/build/gemv, built beforehand with
#   make build/generate build/generate_fp32 build/generate_cpu && make -C dev/cuda build/gemv
# Runs, each under a timeout:
#   1. the GEMV lab's fused ops (dev/cuda/gemv.cu --fused-only): each fused kernel checked against the
#      CPU ops it replaces and timed beside the unfused kernels (variant 1), GPT-2 and Llama, M = 1..8
#   2. tests/test_generate_gpu.sh SECTIONS=7: the fp32 build's tokens with --fused 1 = --fused 0 =
#      the CPU twin's; --check-full of both paths (bf16)
#   3. --bench 1 (64-token prompts, 256 new tokens, greedy) of d12 (GPT-2 124M) and the Llama 114M
#      shape at B = 1, 8, 64 with --fused 0 and 1 (B = 64 runs cuBLASLt either way; --fused 1 there
#      folds the cache append into attention_decode and makes its and the encoder's launches
#      programmatic dependents)
#   4. --profile 1 at B = 1, both models, both paths, and at B = 64 with --fused 1: the PROFILE lines
#      per kernel family
# Last: the lab's fused-vs-unfused table, the tok/s table and the PROFILE lines; logs in
# $DECODE_SPEED_DIR (default a fresh /tmp directory); exit 1 if any part failed.
cd "$(dirname "$0")/.." || exit 1
OUT=${DECODE_SPEED_DIR:-$(mktemp -d /tmp/decode_speed.XXXXXX)}
mkdir -p "$OUT"
LAB=${LAB_BUILD:-dev/cuda/build}
GEN=${GEN:-build/generate}
for b in $GEN build/generate_fp32 build/generate_cpu $LAB/gemv; do
    [ -x "$b" ] || { echo "error: $b is missing (build it first: see the top of $0)"; exit 1; }
done
LLAMA114="llama:L12,C768,H12,KV4,F2048"
parts=(); bad=0
part() {  # part NAME STATUS
    if [ "$2" -eq 0 ]; then parts+=("ok    $1"); else parts+=("FAIL  $1 (rc $2)"); bad=1; fi
}
t0=$SECONDS

echo "==== 1. GEMV lab, fused ops"
timeout 100 $LAB/gemv --fused-only --reps 10 > "$OUT/gemv.txt" 2>&1; st=$?
grep -E "FAIL|error" "$OUT/gemv.txt" | head -10
part "gemv lab --fused-only (checks + timing) [$((SECONDS - t0)) s]" $st

echo "==== 2. fused = unfused = CPU twin"
t1=$SECONDS
SECTIONS=7 GPU_TEST_DIR="$OUT/gen" timeout 100 tests/test_generate_gpu.sh > "$OUT/checks.txt" 2>&1; st=$?
grep -E "^FAIL" "$OUT/checks.txt" | head -20
part "test_generate_gpu.sh SECTIONS=7: $(grep -E '^[0-9]+ passed' "$OUT/checks.txt" | tail -1) [$((SECONDS - t1)) s]" $st

echo "==== 3. bench, 4. profile"
t1=$SECONDS
: > "$OUT/bench.txt"
for model in d12 $LLAMA114; do
    for B in 1 8 64; do
        for fused in 0 1; do
            extra=""; { [ $B = 1 ] || { [ $B = 64 ] && [ $fused = 1 ]; }; } && extra="--profile 1"
            timeout 40 $GEN --init $model --bench 1 --bench-prompt 64 --max-new 256 --temperature 0 --batch $B \
                --fused $fused $extra > "$OUT/run.out" 2> "$OUT/run.err"
            st=$?
            grep -q BENCH_GEN "$OUT/run.out" || st=1
            [ $st -ne 0 ] && { echo "  $model B=$B fused=$fused:"; tail -3 "$OUT/run.err"; }
            sed "s/^/model=$model fused_flag=$fused /" "$OUT/run.out" | grep -E "BENCH_GEN|PROFILE" >> "$OUT/bench.txt"
            part "bench $model B=$B --fused $fused" $st
        done
    done
done
echo "  [$((SECONDS - t1)) s]"

echo
echo "==== GEMV lab: fused kernel (variant 0) vs the unfused kernels it replaces (variant 1), ms"
awk -F' [|] ' '/^gemv-fused / && NF >= 6 {
    split($2, v, " "); key = $1
    if (v[1] == "0") { if (!(key in f)) order[++n] = key; f[key] = $3 }
    if (v[1] == "1") { u[key] = $3 }
} END {
    printf "%-60s %9s %9s %7s\n", "op", "fused_ms", "unfused", "speedup"
    for (i = 1; i <= n; i++) { k = order[i]
        printf "%-60s %9.4f %9.4f %6.2fx\n", k, f[k], u[k], (f[k] > 0 ? u[k] / f[k] : 0) }
}' "$OUT/gemv.txt"
echo
echo "==== decode tok/s (64-token prompts, 256 new tokens, greedy; graph, gemv, pdl on)"
awk '/BENCH_GEN/ {
    model = ""; B = ""; fl = ""; tok = ""; ms = ""; fused = ""
    for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] == "model") model = kv[2]; else if (kv[1] == "B") B = kv[2]
        else if (kv[1] == "fused_flag") fl = kv[2]; else if (kv[1] == "tok_s") tok = kv[2]
        else if (kv[1] == "ms_per_token") ms = kv[2]; else if (kv[1] == "fused_gemv") fused = kv[2]
    }
    key = model " " B; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    t[key, fl] = tok; m[key, fl] = ms; ran[key, fl] = fused
} END {
    printf "%-30s %4s %12s %12s %8s %14s %s\n", "model", "B", "tok/s f0", "tok/s f1", "speedup", "us/token f1", "(fused GEMV step ran)"
    for (i = 1; i <= n; i++) { k = order[i]; split(k, p, " ")
        printf "%-30s %4s %12s %12s %7.2fx %14.1f %s\n", p[1], p[2], t[k, 0], t[k, 1],
               (t[k, 0] > 0 ? t[k, 1] / t[k, 0] : 0), 1000 * m[k, 1], ran[k, 1] }
}' "$OUT/bench.txt"
echo
echo "==== PROFILE at B = 1 and 64 (plain launches, an event between kernels; fused_flag = --fused)"
grep PROFILE "$OUT/bench.txt" | sed 's/ PROFILE / /'
echo
echo "==== decode_speed_gpu summary ($((SECONDS - t0)) s, logs in $OUT)"
for p in "${parts[@]}"; do echo "$p"; done
[ $bad -eq 0 ]
