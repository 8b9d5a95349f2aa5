#!/usr/bin/env bash
# generate --fold-attproj 1 (the fused decode step at B <= 8 with the attention projection folded into
# the decode attention kernel and the norm+fc GEMV: 4 kernels a layer instead of 5; llmc/gpt2_infer.cuh,
# decode_layers_fused) on one GPU, checked and timed beside --fold-attproj 0.
# Builds nothing. Needs, built beforehand (or GEN / GEN32 / CPU / LAB_BUILD pointing at them):
#   make build/generate build/generate_fp32 build/generate_cpu
#   make -C dev/cuda build/attention_decode          (part 1 only)
# Parts (PARTS="2 3" runs only those; logs in $OUT, default build/decode_foldproj):
#   1. the decode attention lab's variants 13 (folded: attention+attproj, then norm+fc+gelu with the
#      parts summed in its prologue) and 14 (the same three ops unfolded) against the CPU ops in
#      sequence, poisoned outputs, fresh random inputs; their timing lines
#   2. correctness with --fold-attproj 1 (the fold runs only where the decode attention is the cluster
#      plan: a cache of more than 64 slots, so these models have a 256-position context; each run's
#      stderr must say "attproj folded"):
#      - fp32 build's tokens = the CPU twin's: GPT-2 MHA and Llama-style GQA (RoPE, SwiGLU, no
#        biases), greedy (batch of 3 lengths, batch of 8 with a context end), sampled, teacher
#        forcing, --step-sync 1 and 2, --graph 0; positions past 64 (2-4 splits) and under it (1)
#      - tests/test_generate_gpu.sh SECTIONS=2 with the flag appended (cached logits = full forward;
#        its d12 and Llama 114M runs fold, its 64-position models fall back to 5 kernels)
#      - bf16 d12 greedy tokens --fold-attproj 1 vs 0 (3 prompts; may differ only by the fp32 order of
#        the projection's sums: reported, not failed)
#   3. generate --bench 1 --init d12 (GPT-2 124M shapes, bf16), 64-token prompt, 256 new greedy tokens,
#      B = 1 and 8, --fold-attproj 0 and 1 alternating, ROUNDS rounds (default 3): us/token each, then
#      the medians
# Estimate: under 2 minutes on an H200 (not measured yet).
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-build/decode_foldproj}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ALL_PARTS="1 2 3"
. tests/decode_common.sh  # LAB, GEN, need, want, part, ran, summary
GEN32=${GEN32:-build/generate_fp32} CPU=${CPU:-build/generate_cpu}
ROUNDS=${ROUNDS:-3}

if want 1; then
echo "==== 1. attention_decode lab, variants 13 (folded) and 14 (unfolded)"
need $LAB/attention_decode
timeout 60 $LAB/attention_decode 13 14 --reps 20 > "$OUT/lab.txt" 2>&1; st=$?
grep -E "FAIL|error" "$OUT/lab.txt" | head -10
grep -q "attproj folded" "$OUT/lab.txt" || { echo "  variant 13 did not run"; st=1; }
awk '/^# name/ { t = 1 } t' "$OUT/lab.txt" | grep -E "^attention\+attproj" | grep -E " (13|14) " | head -40
part "attention_decode lab 13 14: checks + timing [$((SECONDS - t0)) s]" $st
fi

if want 2; then
echo "==== 2. correctness with --fold-attproj 1"
need "$GEN" "$GEN32" "$CPU"
t1=$SECONDS
python3 - "$OUT" <<'PY' || { echo "error: could not write the test models"; exit 1; }
import sys
import numpy as np
sys.path.insert(0, "scripts")
from llmc_formats import write_model, param_shapes
out = sys.argv[1]
llama = dict(architecture=1, norm=1, norm_eps=1e-5, position=1, rope_theta=10000.0, mlp=1, biases=0)
for name, L, C, NH, NKV, knobs in [("mha", 2, 128, 2, 2, {}),
                                   ("lgqa", 2, 256, 4, 2, dict(llama, mlp_hidden=704, tied_head=0))]:
    cfg = dict(max_seq_len=256, vocab_size=1000, padded_vocab_size=1024, num_layers=L, num_heads=NH,
               num_kv_heads=NKV, channels=C, window=0, **knobs)
    rng = np.random.default_rng(11)
    parts = []
    for i, shape in enumerate(param_shapes(cfg)):
        x = rng.normal(0.0, 0.1, size=int(np.prod(shape))).astype(np.float32)
        if knobs and i in (2, 8, 14):  # ln1w, ln2w, lnfw
            x += 1.0
        parts.append(x)
    write_model(f"{out}/{name}.bin", cfg, np.concatenate(parts))
PY
MHA=$OUT/mha.bin LGQA=$OUT/lgqa.bin
P1="1,2,3,4,5" P2="900,17,4,250,31,8,77,12,600,5,44,3" P3="42" P4="3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3,2,3,8,4"
EIGHT="--prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 --prompt-ids $P4 --prompt-ids $P2 --prompt-ids $P3
       --prompt-ids $P1 --prompt-ids $P4 --batch 8"
st2=0
same() {  # same NAME GPU_FLAGS -- ARGS...: fp32 GPU (with GPU_FLAGS and --fold-attproj 1) = CPU twin
    local name=$1 gflags=$2; shift 3
    timeout 60 $GEN32 "$@" --fold-attproj 1 $gflags > "$OUT/gpu.out" 2> "$OUT/gpu.err"; local a=$?
    timeout 60 $CPU "$@" > "$OUT/cpu.out" 2> "$OUT/cpu.err"; local b=$?
    local st=0
    [ $a -eq 0 ] && [ $b -eq 0 ] && [ -s "$OUT/gpu.out" ] && cmp -s "$OUT/gpu.out" "$OUT/cpu.out" || st=1
    grep -q "attproj folded" "$OUT/gpu.err" || { echo "  the fold did not run:"; grep -i "fold\|model" "$OUT/gpu.err"; st=1; }
    [ $st -ne 0 ] && { echo "  gpu (rc $a):"; head -c 400 "$OUT/gpu.out"; tail -3 "$OUT/gpu.err";
                      echo "  cpu (rc $b):"; head -c 400 "$OUT/cpu.out"; tail -3 "$OUT/cpu.err"; }
    part "fp32 --fold-attproj 1 = CPU twin: $name" $st
}
same "MHA greedy, batch of 3 lengths" "" -- --model $MHA --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 \
    --temperature 0 --max-new 200 --eot -1
same "MHA greedy, batch of 8, context end (--max-seq 100)" "" -- --model $MHA --max-seq 100 $EIGHT \
    --temperature 0 --max-new 200 --eot -1
same "MHA sampled (top-k 20, top-p 0.9), batch of 2" "" -- --model $MHA --prompt-ids $P1 --prompt-ids $P4 \
    --temperature 1.2 --top-k 20 --top-p 0.9 --max-new 150 --eot -1 --seed 9
same "MHA teacher forcing" "" -- --model $MHA --prompt-ids $P2 --force-ids 5,6,7,8,9,10,11,12 --temperature 0
same "MHA greedy, --step-sync 1" "--step-sync 1" -- --model $MHA --prompt-ids $P1 --prompt-ids $P2 \
    --temperature 0 --max-new 150 --eot -1
same "MHA greedy, --step-sync 2" "--step-sync 2" -- --model $MHA --prompt-ids $P1 --prompt-ids $P2 \
    --temperature 0 --max-new 150 --eot -1
same "MHA greedy, --graph 0" "--graph 0" -- --model $MHA --prompt-ids $P4 --temperature 0 --max-new 120 --eot -1
same "llama GQA greedy, batch of 3 lengths" "" -- --model $LGQA --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 \
    --temperature 0 --max-new 200 --eot -1
same "llama GQA greedy, batch of 8, --step-sync 2" "--step-sync 2" -- --model $LGQA $EIGHT --temperature 0 \
    --max-new 120 --eot -1
same "llama GQA sampled, batch of 2" "" -- --model $LGQA --prompt-ids $P2 --prompt-ids $P4 --temperature 1.0 \
    --top-k 50 --max-new 150 --eot -1 --seed 3
# cached logits = full forward (bf16 and fp32) on these models
full() {  # full NAME BINARY ARGS...
    local name=$1 bin=$2; shift 2
    timeout 60 $bin "$@" --fold-attproj 1 --check-full 1 > "$OUT/full.out" 2> "$OUT/full.err"; local st=$?
    grep "check-full" "$OUT/full.err" | tail -2 | sed 's/^/  /'
    grep -q "check-full: .*: ok$" "$OUT/full.err" || st=1
    grep -q "attproj folded" "$OUT/full.err" || { echo "  the fold did not run"; st=1; }
    part "--fold-attproj 1 cached logits = full forward: $name" $st
}
full "bf16 MHA, batch of 3" $GEN --model $MHA --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 --temperature 0 \
    --max-new 120 --eot -1
full "fp32 llama GQA, batch of 2" $GEN32 --model $LGQA --prompt-ids $P1 --prompt-ids $P4 --temperature 0 \
    --max-new 120 --eot -1
full "bf16 d12, batch of 2" $GEN --init d12 --max-seq 256 --prompt-ids $P2 --prompt-ids $P1 --temperature 0 \
    --max-new 100 --eot -1
# the generate test's section 2 with the flag appended to every GPU run
w=$OUT/wrap
mkdir -p "$w"
for b in "$GEN" "$GEN32"; do
    printf '#!/usr/bin/env bash\nexec %s "$@" --fold-attproj 1\n' "$(cd "$(dirname "$b")" && pwd)/$(basename "$b")" \
        > "$w/$(basename "$b")"
    chmod +x "$w/$(basename "$b")"
done
SECTIONS=2 GEN="$w/$(basename "$GEN")" GEN32="$w/$(basename "$GEN32")" CPU="$CPU" GPU_TEST_DIR="$OUT/gen" \
    timeout 100 tests/test_generate_gpu.sh > "$OUT/checks.txt" 2>&1
st=$?
grep -E "^FAIL" "$OUT/checks.txt" | head -10
part "test_generate_gpu.sh SECTIONS=2 with --fold-attproj 1: $(grep -E '^[0-9]+ passed' "$OUT/checks.txt" | tail -1)" $st
# bf16 d12 tokens, fold 1 vs 0 (informational: the projection's fp32 sums run in another order)
PP="--prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3"
timeout 60 $GEN --init d12 --max-seq 256 $PP --temperature 0 --max-new 100 --eot -1 --fold-attproj 0 > "$OUT/d12_0.out" 2>/dev/null
timeout 60 $GEN --init d12 --max-seq 256 $PP --temperature 0 --max-new 100 --eot -1 --fold-attproj 1 > "$OUT/d12_1.out" 2>/dev/null
if cmp -s "$OUT/d12_0.out" "$OUT/d12_1.out"; then echo "  bf16 d12 greedy tokens: --fold-attproj 1 = 0 (3 prompts, 100 tokens)"
else echo "  bf16 d12 greedy tokens: --fold-attproj 1 differs from 0 (rounding order; first difference:" \
     "$(cmp "$OUT/d12_0.out" "$OUT/d12_1.out" | head -1))"; fi
echo "  [$((SECONDS - t1)) s]"
fi

if want 3; then
echo "==== 3. bench: d12, 64-token prompt, 256 new greedy tokens, --fold-attproj 0 / 1 alternating"
need "$GEN"
t1=$SECONDS
: > "$OUT/bench.txt"
for r in $(seq 1 $ROUNDS); do
    for B in 1 8; do
        for f in 0 1; do
            timeout 60 $GEN --init d12 --bench 1 --bench-prompt 64 --max-new 256 --temperature 0 --batch $B \
                --fold-attproj $f > "$OUT/run.out" 2> "$OUT/run.err"
            st=$?
            grep -q "BENCH_GEN.*fold_attproj=$f" "$OUT/run.out" || st=1
            [ $st -ne 0 ] && { echo "  B=$B fold=$f:"; tail -3 "$OUT/run.err"; part "bench B=$B --fold-attproj $f round $r" $st; }
            grep BENCH_GEN "$OUT/run.out" | sed "s/^/round=$r flag=$f /" >> "$OUT/bench.txt"
        done
    done
done
awk '/BENCH_GEN/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    us = 1000 * v["ms_per_token"]; printf "  round %s B=%s --fold-attproj %s (ran fold_attproj=%s): %.1f us/token\n",
    v["round"], v["B"], v["flag"], v["fold_attproj"], us
    k = v["B"] " " v["flag"]; n[k]++; x[k, n[k]] = us }
    END { for (B = 1; B <= 8; B += 7) { line = sprintf("  median B=%d:", B); med[0] = 0; med[1] = 0
        for (f = 0; f <= 1; f++) { k = B " " f; m = n[k]; if (!m) continue
            for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (x[k, j] < x[k, i]) { t = x[k, i]; x[k, i] = x[k, j]; x[k, j] = t }
            med[f] = (m % 2) ? x[k, (m + 1) / 2] : (x[k, m / 2] + x[k, m / 2 + 1]) / 2
            line = line sprintf(" fold %d %.1f us/token", f, med[f]) }
        if (med[0] > 0) line = line sprintf("  (fold 1 / fold 0: %.3f)", med[1] / med[0]); print line } }' "$OUT/bench.txt"
part "bench B=1, 8 x --fold-attproj 0, 1 x $ROUNDS rounds [$((SECONDS - t1)) s]" 0
fi

summary decode_foldproj_gpu
