#!/usr/bin/env bash
# The persistent decode step (generate --persistent 1: a step's transformer blocks as one kernel with
# grid barriers and weights streamed into shared memory, llmc/decode_persistent.cuh; issue 15's B=1
# target: GPT-2 124M, bf16, 64-token prompts, 256 new greedy tokens, >= 5,000 tok/s) on one GPU,
# checked before it is timed:
#   1. tests/test_generate_gpu.sh SECTIONS=1237 with every generate call given --persistent 1 (the
#      GPT-2 test models run the persistent kernel, the Llama-style ones say why not and run the fused
#      step): fp32 GPU tokens = the CPU twin's (greedy, sampled, batches of different lengths, GQA with
#      a wrapping window ring, a context end with idle rows, teacher forcing, interactive), cached
#      logits = a full forward (bf16 and fp32, d12 at B=2), graph = no graph, the fused step's checks
#   2. the model line says "persistent decode step" for a GPT-2 model at B <= 8 (the kernel ran), and
#      the bf16 d12's greedy tokens with --persistent 0 and 1 (3 prompts, 48 tokens): the count of
#      equal tokens is printed (bf16 may part ways after a rounding tie; the fp32 checks above are exact)
#   3. compute-sanitizer memcheck and racecheck of a small persistent run (GQA + window ring, graph)
#   4. generate --bench 1 at d12: B = 1 and 8, --persistent 0 / 1 alternating, two rounds; --profile 1
#      of B = 1 persistent
# Builds nothing. Needs: make build/generate build/generate_fp32 build/generate_cpu
# Logs in $OUT (default build/decode_persistent); PARTS="1 4" (say) runs only those parts. Last: the
# BENCH lines, a tok/s table and PASS/FAIL per part; exit 1 if any part failed.
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-build/decode_persistent}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(pwd)
for b in build/generate build/generate_fp32 build/generate_cpu; do
    [ -x "$b" ] || { echo "error: $b is missing (make build/generate build/generate_fp32 build/generate_cpu)"; exit 1; }
done
parts=(); bad=0
part() {  # part NAME STATUS
    if [ "$2" -eq 0 ]; then parts+=("PASS  $1"); else parts+=("FAIL  $1 (rc $2)"); bad=1; fi
}
want() { [[ " ${PARTS:-1 2 3 4} " == *" $1 "* ]]; }
t0=$SECONDS
# wrappers: the test script's generate calls with --persistent 1 first (later flags of a call still win)
for w in generate generate_fp32; do
    printf '#!/bin/sh\nexec %s/build/%s --persistent 1 "$@"\n' "$ROOT" "$w" > "$OUT/$w"
    chmod +x "$OUT/$w"
done

if want 1; then
echo "==== 1. test_generate_gpu.sh SECTIONS=1237 with --persistent 1"
GEN=$OUT/generate GEN32=$OUT/generate_fp32 SECTIONS=1237 GPU_TEST_DIR="$OUT/t1" timeout 300 \
    tests/test_generate_gpu.sh > "$OUT/test_generate.txt" 2>&1
st=$?
grep -E "^FAIL|passed, .* failed" "$OUT/test_generate.txt" | head -20
part "test_generate_gpu.sh 1237, --persistent 1 [$((SECONDS - t0)) s]" $st
fi

if want 2; then
echo "==== 2. the kernel runs; bf16 d12 tokens, --persistent 0 vs 1"
t1=$SECONDS
st=0
args="--init d12 --max-seq 256 --prompt-ids 900,17,4,250,31 --prompt-ids 1,2,3 --prompt-ids 42,43,44,45,46,47,48 \
--temperature 0 --max-new 48 --eot -1"
for p in 0 1; do
    timeout 60 build/generate $args --persistent $p > "$OUT/tok$p.txt" 2> "$OUT/tok$p.err" || st=1
done
grep -q "persistent decode step" "$OUT/tok1.err" || { echo "  --persistent 1 did not run the kernel:"; \
    grep -E "model|persistent" "$OUT/tok1.err" | head -3; st=1; }
grep -q "fused decode step" "$OUT/tok0.err" || st=1
python3 - "$OUT/tok0.txt" "$OUT/tok1.txt" <<'PY' || st=1
import sys
a, b = (open(f, encoding="utf-8", errors="replace").read() for f in sys.argv[1:3])
same = sum(x == y for x, y in zip(a, b))
print(f"  bf16 d12 output, --persistent 0 vs 1: {same} of {max(len(a), len(b))} characters equal"
      + (" (identical)" if a == b else ""))
sys.exit(0 if len(a) > 0 and len(b) > 0 else 1)
PY
part "persistent kernel ran; bf16 d12 tokens compared [$((SECONDS - t1)) s]" $st
fi

if want 3 && command -v compute-sanitizer > /dev/null; then
echo "==== 3. compute-sanitizer (memcheck, racecheck) of a small persistent run"
t1=$SECONDS
python3 - "$OUT" <<'PY'
import sys
import numpy as np
sys.path.insert(0, "scripts")
from llmc_formats import write_model, param_shapes
cfg = dict(max_seq_len=64, vocab_size=1000, padded_vocab_size=1024, num_layers=2, num_heads=4, num_kv_heads=2,
           channels=256, window=16)
rng = np.random.default_rng(7)
write_model(f"{sys.argv[1]}/gqa.bin", cfg,
            np.concatenate([rng.normal(0, 0.1, int(np.prod(s))).astype(np.float32) for s in param_shapes(cfg)]))
PY
st=0
for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 build/generate --persistent 1 --model "$OUT/gqa.bin" \
        --prompt-ids 1,2,3,4,5 --prompt-ids 9,8 --temperature 0 --max-new 24 --eot -1 > "$OUT/$tool.txt" 2>&1 || st=1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|persistent" "$OUT/$tool.txt" | head -3 | sed "s/^/  $tool: /"
done
part "compute-sanitizer memcheck + racecheck, persistent GQA + window [$((SECONDS - t1)) s]" $st
fi

bench=()
if want 4; then
echo "==== 4. bench, d12, --persistent 0 / 1"
t1=$SECONDS
st=0
for round in 1 2; do
    for run in "1 0" "1 1" "8 0" "8 1"; do
        set -- $run
        timeout 60 build/generate --init d12 --bench 1 --bench-prompt 64 --max-new 256 --temperature 0 --batch $1 \
            --persistent $2 > "$OUT/bench.out" 2> "$OUT/bench.err" || { st=1; tail -3 "$OUT/bench.err"; }
        line=$(grep BENCH_GEN "$OUT/bench.out")
        [ -n "$line" ] || st=1
        bench+=("round $round B=$1 persistent=$2: $line")
    done
done
timeout 60 build/generate --init d12 --bench 1 --bench-prompt 64 --max-new 256 --temperature 0 --batch 1 \
    --persistent 1 --profile 1 > "$OUT/profile.out" 2> "$OUT/profile.err" || st=1
part "bench d12 B=1, 8 x persistent 0/1 x 2 rounds, profile [$((SECONDS - t1)) s]" $st
fi

echo
echo "==== decode_persistent_gpu summary ($((SECONDS - t0)) s)"
grep PROFILE "$OUT/profile.out" 2>/dev/null | head -12
for l in "${bench[@]}"; do echo "$l" | sed -E 's/ (prefill_ms|ms_per_token|tok_s)=/ \1=/g' | \
    awk '{ out = $1 " " $2 " " $3 " " $4; for (i = 5; i <= NF; i++) if ($i ~ /^(ms_per_token|tok_s|persistent)=/) out = out " " $i; print out }'; done
for p in "${parts[@]}"; do echo "$p"; done
exit $bad
