#!/usr/bin/env bash
# GPU generation (generate.cu) on small random models (GPT-2 and Llama-style) and the 124M / 114M
# shapes; needs a GPU, python3 with numpy, and build/generate, build/generate_fp32,
# build/generate_cpu (make build/generate build/generate_fp32 build/generate_cpu). Each check prints
# ok/FAIL; a table of the checks and the BENCH_GEN lines comes last; the exit status is
# non-zero if any check failed.
#   1. the fp32 build's greedy tokens equal the CPU twin's (MHA; GQA with a wrapping window ring;
#      a context end; a batch of different lengths; interactive), and so do its sampled tokens
#      (temperature, top-k, top-p: the same splitmix64 stream on both); the same for Llama-style
#      models (RMSNorm, RoPE, SwiGLU, no biases: MHA tied; GQA untied with a wrapping window ring;
#      a batch of 10, whose steps run cuBLAS instead of the GEMV kernels of M <= 8)
#   2. --check-full 1: each step's cached logits equal a full forward over the same tokens (the
#      training model for GPT-2, a whole-sequence prefill for Llama; bf16 and fp32 builds; small
#      models, d12 and the Llama 114M shape)
#   3. the CUDA graph and plain launches (--graph 0) give identical tokens
#   4. bad inputs fail with their one-line errors; --help names no kernel-choice or timing flag
#   5. compute-sanitizer memcheck of a small run, graph and no graph, GPT-2 and Llama, and a batch of 8
#      (MEMCHECK=0 skips it)
#   6. --bench 1: GPT-2 124M shapes (random d12), 64-token prompts, 256 new tokens, greedy, B=1 and
#      B=64, a 1008-token prefill, B=1 without the graph, B=8, and the Llama 114M shape (12 layers,
#      C 768, 12 heads / 4 KV heads, SwiGLU 2048, vocab 50304 padded, tied) at B=1, 8 and 64
#      (BENCH=0 skips them); with HF=1 also transformers' generate on the same shapes beside it
#      (scripts/bench_generate_hf.py; HF_CACHE="dynamic static" adds the compiled static cache, slow).
#      The step's alternative kernels and their phases are timed by dev/cuda/decode_step.cu.
#   7. the fused decode step (the policy's pick at B <= 8: norms in GEMV prologues, residual adds,
#      RoPE and the cache append in GEMV epilogues, PDL on every kernel) and the cuBLASLt step (B = 10,
#      the cache append in attention_decode) against the CPU twin: the fp32 build's tokens equal it
#      (GPT-2 MHA and GQA + window, Llama MHA at B = 8 and GQA + window with RoPE, sampling, a
#      context end with idle rows), --check-full on d12 and on the Llama 114M shape at B = 8 (bf16),
#      and --matmul-autotune 1 (it ran, no output mismatch) and 0 = the CPU twin at B = 10
# SECTIONS (default 1234567) picks the sections to run, e.g. SECTIONS=7 for the fused checks alone
# (dev/cuda/decode_step.cu times the step's alternatives).
cd "$(dirname "$0")/../.." || exit 1
on() { [[ "${SECTIONS:-1234567}" == *$1* ]]; }
WORK=${GPU_TEST_DIR:-$(mktemp -d /tmp/gen_gpu.XXXXXX)}
mkdir -p "$WORK"
GEN=${GEN:-build/generate} GEN32=${GEN32:-build/generate_fp32} CPU=${CPU:-build/generate_cpu}
for b in $GEN $GEN32 $CPU; do [ -x $b ] || { echo "error: $b is missing: make $GEN $GEN32 $CPU"; exit 1; }; done
passed=0; failed=0; rows=() t_last=$SECONDS
report() {  # report NAME STATUS(0 = ok): with the seconds since the last report
    local secs=$((SECONDS - t_last)); t_last=$SECONDS
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); rows+=("ok    ${secs}s  $1"); echo "ok: $1 (${secs} s)"
    else failed=$((failed + 1)); rows+=("FAIL  ${secs}s  $1"); echo "FAIL: $1 (${secs} s)"; fi
}

# two random models in our format: MHA (2 heads of 64) and GQA (4 heads, 2 KV heads) with a 16-token
# window; weights large enough that the logits are well separated (greedy ties never decide)
python3 - "$WORK" <<'PY' || { echo "error: could not write the test models"; exit 1; }
import sys
import numpy as np
sys.path.insert(0, "scripts")
from llmc_formats import write_model, param_shapes, CONFIG_KEYS
work = sys.argv[1]
# Llama-style (RMSNorm, RoPE, SwiGLU, no biases): MHA with a tied head, GQA with an untied head and
# a 16-token window; norm weights 1 + noise
llama = dict(architecture=1, norm=1, norm_eps=1e-5, position=1, rope_theta=10000.0, mlp=1, biases=0)
for name, L, C, NH, NKV, W, knobs in [("mha", 2, 128, 2, 2, 0, {}), ("gqa", 3, 256, 4, 2, 16, {}),
                                      ("lmha", 2, 128, 2, 2, 0, dict(llama, mlp_hidden=384, tied_head=1)),
                                      ("lgqa", 3, 256, 4, 2, 16, dict(llama, mlp_hidden=704, tied_head=0))]:
    cfg = dict(max_seq_len=64, vocab_size=1000, padded_vocab_size=1024, num_layers=L, num_heads=NH,
               num_kv_heads=NKV, channels=C, window=W, **knobs)
    rng = np.random.default_rng(7)
    parts = []
    for i, shape in enumerate(param_shapes(cfg)):
        x = rng.normal(0.0, 0.1, size=int(np.prod(shape))).astype(np.float32)
        if knobs and i in (2, 8, 14):  # ln1w, ln2w, lnfw
            x += 1.0
        parts.append(x)
    write_model(f"{work}/{name}.bin", cfg, np.concatenate(parts))
PY
MHA=$WORK/mha.bin GQA=$WORK/gqa.bin LMHA=$WORK/lmha.bin LGQA=$WORK/lgqa.bin
LLAMA114="llama:L12,C768,H12,KV4,F2048"
P1="1,2,3,4,5" P2="900,17,4,250,31,8,77,12,600,5,44,3" P3="42"
P4="3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3,2,3,8,4,6,2,6,4,3,3,8,3,2,7" P5="11" P6="60,61" P7="999,0,998,1"
TEN="--prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 --prompt-ids $P4 --prompt-ids $P5 --prompt-ids $P6
     --prompt-ids $P7 --prompt-ids $P2 --prompt-ids $P4 --prompt-ids $P1 --batch 10"

# ---- 1. fp32 build vs the CPU twin
same() {  # same NAME CMD_ARGS...: stdout of the fp32 GPU build and the CPU twin are equal (and non-empty);
          # each reads stdin from $SAME_STDIN (default /dev/null)
    local name=$1 in=${SAME_STDIN:-/dev/null}; shift
    $GEN32 "$@" < "$in" > "$WORK/gpu.out" 2> "$WORK/gpu.err"; local a=$?
    $CPU "$@" < "$in" > "$WORK/cpu.out" 2> "$WORK/cpu.err"; local b=$?
    [ $a -eq 0 ] && [ $b -eq 0 ] && [ -s "$WORK/gpu.out" ] && cmp -s "$WORK/gpu.out" "$WORK/cpu.out"
    local st=$?
    [ $st -ne 0 ] && { echo "  gpu (rc $a):"; head -c 600 "$WORK/gpu.out"; tail -3 "$WORK/gpu.err";
                      echo "  cpu (rc $b):"; head -c 600 "$WORK/cpu.out"; tail -3 "$WORK/cpu.err"; }
    report "fp32 GPU = CPU twin: $name" $st
}
if on 1; then
same "greedy, MHA, one prompt streamed" --model $MHA --prompt-ids $P2 --temperature 0 --max-new 40 --eot -1
same "greedy, MHA, batch of 3 lengths" --model $MHA --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 \
    --temperature 0 --max-new 40 --eot -1
same "greedy, GQA + window 16 (ring wraps), batch of 3" --model $GQA --prompt-ids $P1 --prompt-ids $P2 \
    --prompt-ids $P3 --temperature 0 --max-new 45 --eot -1
same "greedy, context end (--max-seq 20), batch 2 of 3 prompts" --model $GQA --max-seq 20 --batch 2 \
    --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 --temperature 0 --max-new 100 --eot -1
same "greedy, end-of-text stop (--eot 7)" --model $MHA --prompt-ids $P1 --prompt-ids $P3 --temperature 0 \
    --max-new 60 --eot 7
same "sampled (temperature 0.9), batch of 3" --model $MHA --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 \
    --temperature 0.9 --max-new 40 --eot -1 --seed 5
same "sampled (top-k 20, top-p 0.9), GQA" --model $GQA --prompt-ids $P1 --prompt-ids $P2 --temperature 1.2 \
    --top-k 20 --top-p 0.9 --max-new 40 --eot -1 --seed 9
same "teacher forcing (--force-ids)" --model $MHA --prompt-ids $P1 --force-ids 5,6,7,8,9,10 --temperature 0
printf '1 2 3\n\n99999\n7,8,9,10\n' > "$WORK/stdin.txt"
SAME_STDIN=$WORK/stdin.txt same "interactive from stdin (a bad line skipped)" --model $GQA --interactive 1 \
    --temperature 0.8 --max-new 20 --eot -1
same "llama greedy, MHA tied, one prompt streamed" --model $LMHA --prompt-ids $P2 --temperature 0 --max-new 40 --eot -1
same "llama greedy, MHA tied, batch of 3 lengths" --model $LMHA --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 \
    --temperature 0 --max-new 40 --eot -1
same "llama greedy, GQA untied + window 16 (ring wraps), batch of 3" --model $LGQA --prompt-ids $P1 --prompt-ids $P2 \
    --prompt-ids $P3 --temperature 0 --max-new 45 --eot -1
same "llama greedy, GQA + window, batch of 10 (cuBLAS at M > 8)" --model $LGQA $TEN --temperature 0 --max-new 30 --eot -1
same "llama greedy, context end (--max-seq 20), batch 2 of 3 prompts" --model $LGQA --max-seq 20 --batch 2 \
    --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 --temperature 0 --max-new 100 --eot -1
same "llama sampled (top-k 20, top-p 0.9), GQA, batch of 2" --model $LGQA --prompt-ids $P1 --prompt-ids $P4 \
    --temperature 1.2 --top-k 20 --top-p 0.9 --max-new 40 --eot -1 --seed 9
same "llama teacher forcing (--force-ids), GQA" --model $LGQA --prompt-ids $P2 --force-ids 5,6,7,8,9,10 --temperature 0

fi

# ---- 2. cached logits vs the full forward
if on 2; then
full() {  # full NAME BINARY ARGS...
    local name=$1 bin=$2; shift 2
    $bin "$@" --check-full 1 > "$WORK/full.out" 2> "$WORK/full.err"; local st=$?
    grep "check-full" "$WORK/full.err" | tail -3 | sed 's/^/  /'
    grep -q "check-full: .*: ok$" "$WORK/full.err" || st=1
    report "cached logits = full forward: $name" $st
}
full "bf16, MHA, batch of 3" $GEN --model $MHA --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 --temperature 0 \
    --max-new 30 --eot -1
full "bf16, GQA + window ring, batch of 2" $GEN --model $GQA --prompt-ids $P1 --prompt-ids $P2 --temperature 0.7 \
    --max-new 40 --eot -1
full "fp32, GQA + window ring" $GEN32 --model $GQA --prompt-ids $P2 --temperature 0 --max-new 40 --eot -1
full "bf16, d12 (GPT-2 124M shapes), batch of 2" $GEN --init d12 --max-seq 128 --prompt-ids $P2 --prompt-ids $P1 \
    --temperature 0 --max-new 24 --eot -1
full "bf16, d12, batch of 10 (cuBLAS at M > 8)" $GEN --init d12 --max-seq 96 $TEN --temperature 0 --max-new 12 --eot -1
# the tensor-core decode attention (attention_decode_mma.cuh, the policy's pick where the batch fills
# the GPU: sequences x KV heads >= the SM count, 132 on an H200), past 128 keys so its split-K merge
# runs: d12 at 16 sequences (2 splits), the 114M Llama (4 KV heads) at 34 (2 splits)
SIXTEEN="$TEN --prompt-ids $P3 --prompt-ids $P5 --prompt-ids $P6 --prompt-ids $P7 --prompt-ids $P2 --prompt-ids $P4 --batch 16"
THIRTYFOUR="$SIXTEEN $SIXTEEN --prompt-ids $P1 --prompt-ids $P6 --batch 34"
full "bf16, d12, batch of 16, tensor-core decode attention" $GEN --init d12 --max-seq 256 $SIXTEEN --temperature 0 \
    --max-new 150 --eot -1
full "bf16, llama 114M shape, batch of 34, tensor-core decode attention" $GEN --init $LLAMA114 --max-seq 256 $THIRTYFOUR \
    --temperature 0.7 --max-new 140 --eot -1
full "bf16, llama MHA tied, batch of 3" $GEN --model $LMHA --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 \
    --temperature 0 --max-new 30 --eot -1
full "bf16, llama GQA untied + window ring, batch of 2" $GEN --model $LGQA --prompt-ids $P1 --prompt-ids $P2 \
    --temperature 0.7 --max-new 40 --eot -1
full "fp32, llama GQA untied + window ring, batch of 10" $GEN32 --model $LGQA $TEN --temperature 0 --max-new 40 --eot -1
full "bf16, llama 114M shape, batch of 2" $GEN --init $LLAMA114 --max-seq 128 --prompt-ids $P2 --prompt-ids $P1 \
    --temperature 0 --max-new 24 --eot -1

fi

# ---- 3. graph vs plain launches
if on 3; then
graph_same() {  # graph_same NAME ARGS...
    local name=$1; shift
    $GEN "$@" --graph 1 > "$WORK/g1.out" 2>/dev/null; local a=$?
    $GEN "$@" --graph 0 > "$WORK/g0.out" 2>/dev/null; local b=$?
    [ $a -eq 0 ] && [ $b -eq 0 ] && [ -s "$WORK/g1.out" ] && cmp -s "$WORK/g1.out" "$WORK/g0.out"
    report "graph = no graph: $name" $?
}
graph_same "greedy, batch of 3" --model $MHA --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 --temperature 0 \
    --max-new 40 --eot -1
graph_same "top-k 50 sampling, GQA, batch of 2" --model $GQA --prompt-ids $P1 --prompt-ids $P2 --temperature 1 \
    --top-k 50 --max-new 40 --eot -1
graph_same "d12, greedy, batch of 2" --init d12 --max-seq 128 --prompt-ids $P1 --prompt-ids $P2 --temperature 0 \
    --max-new 32 --eot -1
graph_same "llama GQA + window, top-k 50 sampling, batch of 3" --model $LGQA --prompt-ids $P1 --prompt-ids $P2 \
    --prompt-ids $P4 --temperature 1 --top-k 50 --max-new 40 --eot -1
fi

# ---- 4. bad inputs: non-zero exit and the expected words on stderr
if on 4; then
bad() {  # bad NAME EXPECTED_TEXT ARGS...
    local name=$1 want=$2; shift 2
    $GEN "$@" > /dev/null 2> "$WORK/bad.err" < /dev/null; local rc=$?
    local st=0
    { [ $rc -ne 0 ] && grep -q -- "$want" "$WORK/bad.err"; } || st=1
    [ $st -ne 0 ] && { echo "  rc $rc, stderr:"; head -3 "$WORK/bad.err"; }
    report "bad input: $name" $st
}
bad "empty prompt" "empty prompt" --model $MHA --prompt-ids ""
bad "prompt longer than the context" "longer than the context" --model $MHA --max-seq 8 --prompt-ids $P2
bad "unknown token id" "out of range" --model $MHA --prompt-ids 1,2,1000
bad "temperature < 0" "--temperature: must be in" --model $MHA --prompt-ids $P1 --temperature -1
bad "top-p 0" "--top-p: must be in (0, 1]" --model $MHA --prompt-ids $P1 --top-p 0
bad "top-k < 0" "--top-k: must be in" --model $MHA --prompt-ids $P1 --top-k -3
bad "missing model file" "cannot open" --model "$WORK/nope.bin" --prompt-ids $P1
bad "foreign file" "tests/fixture/bpe_cases.bin" --model tests/fixture/bpe_cases.bin --prompt-ids $P1
bad "head size the GPU cannot run" "head size" --model tests/fixture/model.bin --prompt-ids $P1
bad "--max-seq past the model's" "longer than the 64 positions" --model $MHA --max-seq 65 --prompt-ids $P1
bad "no prompt" "no prompt" --model $MHA
bad "--graph 2" "--graph: must be in" --model $MHA --prompt-ids $P1 --graph 2
bad "llama head size the GPU cannot run" "head size" --model tests/fixture/llama_model.bin --prompt-ids $P1
bad "llama channels not a multiple of 8" "must be a multiple of 8" --model tests/fixture/llama_gqa_model.bin --prompt-ids $P1
bad "llama prompt longer than the context" "longer than the context" --model $LGQA --max-seq 8 --prompt-ids $P2
bad "llama unknown token id" "out of range" --model $LMHA --prompt-ids 1,2,1000
bad "a kernel choice is not a flag (--fused)" "--fused" --model $MHA --prompt-ids $P1 --fused 0
# --help: the user's flags, no kernel-choice or timing switch (dev/cuda/decode_step.cu has those) and
# no measurement
$GEN --help > "$WORK/help.out" 2>&1
st=$?
removed="--(gemv|pdl|fused|latency-kernels|gemv-split-k|gemv-rows|step-sync|persistent|fold-argmax|decode-mma|profile)\b"
{ [ $st -eq 0 ] && grep -q -- "--bench-prompt" "$WORK/help.out" && ! grep -qE -- "$removed" "$WORK/help.out" &&
    ! grep -qE "[0-9] ?(us|ms)\b|H200" "$WORK/help.out"; } || st=1
[ $st -ne 0 ] && grep -nE -- "$removed|[0-9] ?(us|ms)\b|H200" "$WORK/help.out" | head -5
report "--help lists no kernel-choice or timing flag and no measurement" $st

fi

# ---- 7. the fused step (B <= 8) and the cuBLASLt step (B = 10) vs the CPU twin
if on 7; then
fused_same() {  # fused_same NAME ARGS...: the fp32 build = the CPU twin (non-empty)
    local name=$1; shift
    $GEN32 "$@" > "$WORK/f1.out" 2> "$WORK/f1.err"; local a=$?
    $CPU "$@" > "$WORK/fc.out" 2> "$WORK/fc.err" < /dev/null; local c=$?
    [ $a -eq 0 ] && [ $c -eq 0 ] && [ -s "$WORK/f1.out" ] && cmp -s "$WORK/f1.out" "$WORK/fc.out"
    local st=$?
    [ $st -ne 0 ] && { echo "  gpu (rc $a):"; head -c 400 "$WORK/f1.out"; tail -3 "$WORK/f1.err";
                      echo "  cpu (rc $c):"; head -c 400 "$WORK/fc.out"; }
    report "decode step = CPU twin (fp32): $name" $st
}
fused_same "GPT-2 MHA, greedy, batch of 3" --model $MHA --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 \
    --temperature 0 --max-new 40 --eot -1
fused_same "GPT-2 GQA + window 16 (ring wraps), greedy, one prompt" --model $GQA --prompt-ids $P4 --temperature 0 \
    --max-new 45 --eot -1
fused_same "GPT-2 context end (--max-seq 20: idle rows), batch 2 of 3" --model $GQA --max-seq 20 --batch 2 \
    --prompt-ids $P1 --prompt-ids $P2 --prompt-ids $P3 --temperature 0 --max-new 100 --eot -1
fused_same "llama MHA tied, greedy, batch of 8 (M = 8)" --model $LMHA --prompt-ids $P1 --prompt-ids $P2 \
    --prompt-ids $P3 --prompt-ids $P4 --prompt-ids $P5 --prompt-ids $P6 --prompt-ids $P7 --prompt-ids $P1 \
    --temperature 0 --max-new 30 --eot -1
fused_same "llama GQA untied + window ring (RoPE in the QKV epilogue), batch of 3" --model $LGQA --prompt-ids $P1 \
    --prompt-ids $P2 --prompt-ids $P3 --temperature 0 --max-new 45 --eot -1
fused_same "llama sampled (top-k 20, top-p 0.9), GQA, batch of 2" --model $LGQA --prompt-ids $P1 --prompt-ids $P4 \
    --temperature 1.2 --top-k 20 --top-p 0.9 --max-new 40 --eot -1 --seed 9
fused_same "llama GQA + window, batch of 10 (cuBLAS; the append in attention_decode)" --model $LGQA $TEN \
    --temperature 0 --max-new 30 --eot -1
fused_same "GPT-2 GQA + window, batch of 10 (cuBLAS; the append in attention_decode)" --model $GQA $TEN \
    --temperature 0 --max-new 30 --eot -1
# the cuBLASLt path's autotune (the default): it ran (one line a tuned matmul on stderr), and its tokens
# are the CPU twin's, with and without it
for at in 1 0; do
    $GEN32 --model $GQA $TEN --temperature 0 --max-new 30 --eot -1 --matmul-autotune $at > "$WORK/a$at.out" \
        2> "$WORK/a$at.err" && $CPU --model $GQA $TEN --temperature 0 --max-new 30 --eot -1 > "$WORK/ac.out" \
        2>/dev/null < /dev/null && [ -s "$WORK/a$at.out" ] && cmp -s "$WORK/a$at.out" "$WORK/ac.out"
    st=$?
    if [ $at = 1 ]; then
        grep "matmul autotune" "$WORK/a1.err" | head -5 | sed 's/^/  /'
        { grep -q "matmul autotune" "$WORK/a1.err" && ! grep -q "warning" "$WORK/a1.err"; } || st=1
    fi
    report "--matmul-autotune $at = CPU twin (fp32): GPT-2 GQA + window, batch of 10 (cuBLASLt)" $st
done
full7() {  # full7 NAME ARGS...: --check-full 1 of the bf16 build
    local name=$1; shift
    $GEN "$@" --check-full 1 > "$WORK/full.out" 2> "$WORK/full.err"; local st=$?
    grep "check-full" "$WORK/full.err" | tail -2 | sed 's/^/  /'
    grep -q "check-full: .*: ok$" "$WORK/full.err" || st=1
    report "cached logits = full forward: $name" $st
}
full7 "bf16, llama 114M shape, fused step, batch of 8" --init $LLAMA114 --max-seq 128 --prompt-ids $P1 --prompt-ids $P2 \
    --prompt-ids $P3 --prompt-ids $P4 --prompt-ids $P5 --prompt-ids $P6 --prompt-ids $P7 --prompt-ids $P2 \
    --temperature 0 --max-new 16 --eot -1
fi

# ---- 5. memcheck
if on 5 && [ "${MEMCHECK:-1}" != 0 ] && command -v compute-sanitizer > /dev/null; then
    # the last: a batch of 8, greedy (bf16: the fused GEMVs on the tensor cores, lm_head's folded argmax)
    B8="--prompt-ids $P3 --prompt-ids $P4 --prompt-ids $P5 --prompt-ids $P6 --prompt-ids $P7 --prompt-ids $P1 --temperature 0"
    for run in "$GQA 1" "$GQA 0" "$LGQA 1" "$GQA 1 b8"; do
        set -- $run; mc_model=$1 gr=$2 more="--temperature 0.8 --top-k 10 --top-p 0.9" what=sampling
        [ "${3:-}" = b8 ] && more=$B8 what="batch of 8, greedy"
        timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $GEN --model $mc_model --prompt-ids $P1 \
            --prompt-ids $P2 $more --max-new 12 --eot -1 --graph $gr > "$WORK/memcheck.out" 2>&1
        st=$?
        grep -E "ERROR SUMMARY" "$WORK/memcheck.out" | sed 's/^/  /'
        if [ $st -ne 0 ] && grep -q "Device not supported" "$WORK/memcheck.out"; then
            echo "  memcheck: SKIPPED (sanitizer unsupported here)"; st=0
        fi
        [ $st -ne 0 ] && tail -20 "$WORK/memcheck.out"
        report "memcheck clean, $(basename $mc_model .bin) (GQA + window), $what, graph $gr" $st
    done
fi

# ---- 6. speed
bench_lines=()
if on 6 && [ "${BENCH:-1}" != 0 ]; then
    # the last flags win: the third line times a 1008-token prefill (a 1024-token context)
    for run in "d12 --batch 1" "d12 --batch 64" "d12 --batch 1 --bench-prompt 1008 --max-new 16" \
               "d12 --batch 1 --graph 0" "d12 --batch 8" "$LLAMA114 --batch 1" "$LLAMA114 --batch 8" \
               "$LLAMA114 --batch 64"; do
        set -- $run; model=$1; shift; args="$*"
        $GEN --init $model --bench 1 --bench-prompt 64 --max-new 256 --temperature 0 $args \
            > "$WORK/bench.out" 2> "$WORK/bench.err"
        st=$?
        grep -q BENCH_GEN "$WORK/bench.out" || st=1
        [ $st -ne 0 ] && tail -3 "$WORK/bench.err"
        while read -r line; do bench_lines+=("$line"); done < <(grep BENCH_GEN "$WORK/bench.out")
        report "bench $model $args" $st
    done
fi
if on 6 && [ "${HF:-0}" = 1 ]; then
    python3 scripts/bench_generate_hf.py --batch 1 64 --prompt 64 --new 256 --cache ${HF_CACHE:-dynamic} \
        > "$WORK/hf.out" 2> "$WORK/hf.err"
    st=$?
    [ $st -ne 0 ] && tail -3 "$WORK/hf.err"
    while read -r line; do bench_lines+=("$line"); done < <(grep BENCH_HF "$WORK/hf.out")
    report "transformers baseline (${HF_CACHE:-dynamic})" $st
fi

echo
echo "==== test_generate summary"
for r in "${rows[@]}"; do echo "$r"; done
for l in "${bench_lines[@]}"; do echo "$l"; done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
