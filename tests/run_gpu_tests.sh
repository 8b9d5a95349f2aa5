#!/usr/bin/env bash
# The GPU tests (make test-gpu; needs a GPU, PyTorch, and data/ from
#   python3 scripts/data/tinyshakespeare.py). Each suite's output is shown and kept in $LOGS;
# the last line is "N passed, N failed" and the exit status is non-zero if any suite failed.
#   1. test_gpt2cu / test_gpt2cu_fp32: GPT-2 124M (d12, random init) vs the PyTorch reference state
#      (fp64), every op vs the CPU reference, bit-exact save -> load -> continue; then a d12 with
#      grouped-query attention (4 KV heads) and a sliding window (24) vs its own PyTorch reference,
#      and two Llama-style d12s (GQA tied; MHA untied with a window) vs theirs, and the GQA one again
#      with Llama 3.x's llama3 RoPE scaling (loaded by the reference with --load)
#   2. tiny shakespeare: d12 trains (the loss falls), checkpoints, and a resumed run reproduces the
#      uninterrupted run's log exactly (train loss, grad norm, lr, val loss) with --deterministic 1;
#      the default run (dQ by atomics) ends within 0.05 of its loss; a Llama-style d12 trains
#   3. a batch or a model that cannot fit fails with a one-line message naming the fix
#   4. compute-sanitizer memcheck on the small-model tests
#   5. HellaSwag: both GPU builds' acc_norm on tests/fixture/hellaswag.bin equals PyTorch's (fp64)
#   6. generate: tests/test_generate_gpu.sh (GPU = CPU twin, cached = full logits, graph = no graph,
#      bad inputs, memcheck, the BENCH_GEN lines); then tests/test_generate_gpu_hf.py in both builds:
#      teacher-forced logits at every step against transformers' generate for a random GPT-2 and three
#      random Llamas, one with llama3 RoPE scaling (fp32 build within 1e-4 of the largest logit, bf16
#      build within the larger of 5e-2 and twice transformers' own bf16 error on the model)
#   7. data parallel: tests/test_distributed_gpu.sh (build/train_gpt2cu_nccl at world size 1, --zero
#      0/1/2 = build/train_gpt2cu bit for bit with --deterministic 1, exact resume, step-time cost),
#      then tests/zero2_gpu_check.sh (ZeRO-2's shard-only gradients, with and without accumulation,
#      bit for bit; each stage's allocated memory)
#   8. FP8: QUICK=1 tests/fp8_parity_gpu.sh (build/test_fp8_gpu: each --fp8 linear layer vs the CPU
#      emulation of its casts; --fp8 1 refuses a bad shape; a d12's and a Llama-style 114M's loss
#      with --fp8 1 within 10% of bf16's after 20 steps on tiny Shakespeare)
# Env: GPU_TEST_DIR (scratch, default a new /tmp dir), LOGS (default $GPU_TEST_DIR),
#      MEMCHECK=0 to skip memcheck, MEMCHECK_TIMEOUT (seconds, default 900), SECTIONS (the digits of
#      the sections to run, default 12345678: SECTIONS=16 runs 1 and 6).
cd "$(dirname "$0")/.." || exit 1
WORK=${GPU_TEST_DIR:-$(mktemp -d /tmp/gpu_tests.XXXXXX)}
LOGS=${LOGS:-$WORK}
mkdir -p "$WORK" "$LOGS"
passed=0; failed=0; failed_names=()
sections=${SECTIONS:-12345678}
unset SECTIONS  # not passed on: test_generate_gpu.sh reads its own SECTIONS and would run only those
want() { [[ $sections == *$1* ]]; }  # SECTIONS=16: only sections 1 and 6
run() {  # run NAME LOGFILE CMD...
    local name=$1 log=$2; shift 2
    echo "=== $name: $*"
    if "$@" 2>&1 | tee "$LOGS/$log"; [ "${PIPESTATUS[0]}" -eq 0 ]; then
        passed=$((passed + 1)); echo "--- $name: PASS"
    else
        failed=$((failed + 1)); failed_names+=("$name"); echo "--- $name: FAIL"
    fi
}

# ---- 1. vs PyTorch and the CPU reference, both precisions
if want 1; then
REF_MODEL=$WORK/d12.bin REF_DEBUG=$WORK/d12_debug.bin
if [ ! -f "$REF_DEBUG" ]; then
    echo "=== writing the PyTorch reference state (d12, B=4, T=64, 10 steps, fp64 on the CPU)"
    python3 scripts/train_gpt2.py --model d12 --batch 4 --seq 64 --steps 10 \
        --write-model "$REF_MODEL" --write-debug "$REF_DEBUG" || { echo "error: reference state failed"; exit 1; }
fi
run "bf16 build vs PyTorch and CPU ops" test_bf16.log build/test_gpt2cu --model "$REF_MODEL" --debug "$REF_DEBUG"
run "fp32 build vs PyTorch and CPU ops" test_fp32.log build/test_gpt2cu_fp32 --model "$REF_MODEL" --debug "$REF_DEBUG"
# the same for a d12 with grouped-query attention (12 heads / 4 KV heads) and a 24-token sliding window
GQA_MODEL=$WORK/d12_gqa_w24.bin GQA_DEBUG=$WORK/d12_gqa_w24_debug.bin
if [ ! -f "$GQA_DEBUG" ]; then
    echo "=== writing the PyTorch reference state (d12, 4 KV heads, window 24, B=4, T=64, 10 steps, fp64 on the CPU)"
    python3 scripts/train_gpt2.py --model d12 --kv-heads 4 --window 24 --batch 4 --seq 64 --steps 10 \
        --write-model "$GQA_MODEL" --write-debug "$GQA_DEBUG" || { echo "error: GQA reference state failed"; exit 1; }
fi
run "bf16 build vs PyTorch, GQA + window" test_bf16_gqa.log build/test_gpt2cu --model "$GQA_MODEL" --debug "$GQA_DEBUG"
run "fp32 build vs PyTorch, GQA + window" test_fp32_gqa.log build/test_gpt2cu_fp32 --model "$GQA_MODEL" --debug "$GQA_DEBUG"
# Llama-style d12s (RMSNorm, RoPE, SwiGLU 2048, no biases): 4 KV heads with the tied head, and
# multi-head attention with an untied head and a 24-token window
llama_ref() {  # llama_ref NAME FLAGS...: writes $WORK/NAME.bin and NAME_debug.bin once
    local name=$1; shift
    [ -f "$WORK/${name}_debug.bin" ] && return 0
    echo "=== writing the PyTorch reference state ($name: $*, B=4, T=64, 10 steps, fp64 on the CPU)"
    python3 scripts/train_gpt2.py --model d12 --arch llama "$@" --batch 4 --seq 64 --steps 10 \
        --write-model "$WORK/$name.bin" --write-debug "$WORK/${name}_debug.bin"
}
llama_ref llama_gqa --kv-heads 4 || { echo "error: Llama GQA reference state failed"; exit 1; }
llama_ref llama_untied_w24 --tied 0 --window 24 || { echo "error: Llama untied reference state failed"; exit 1; }
# llama_gqa's weights with Llama 3.x's llama3 RoPE scaling (factor 8, original context 16: T=64 passes
# it), through --load: the GPU trainer's rope tables against the reference's
if [ ! -f "$WORK/llama3_gqa_debug.bin" ]; then
    echo "=== writing the PyTorch reference state (llama_gqa with llama3 RoPE scaling)"
    python3 -c "import sys; sys.path.insert(0, 'scripts'); import llmc_formats as f
cfg, flat = f.read_model(sys.argv[1])
f.write_model(sys.argv[2], dict(cfg, rope_scaling=f.ROPE_SCALING_LLAMA3, rope_factor=8.0, rope_low_freq_factor=1.0,
              rope_high_freq_factor=4.0, rope_original_max_pos=16), flat)" "$WORK/llama_gqa.bin" "$WORK/llama3_base.bin" &&
    python3 scripts/train_gpt2.py --load "$WORK/llama3_base.bin" --batch 4 --seq 64 --steps 10 \
        --write-model "$WORK/llama3_gqa.bin" --write-debug "$WORK/llama3_gqa_debug.bin" ||
        { echo "error: Llama llama3-scaled reference state failed"; exit 1; }
fi
for name in llama_gqa llama_untied_w24 llama3_gqa; do
    run "bf16 build vs PyTorch, $name" "test_bf16_$name.log" build/test_gpt2cu --model "$WORK/$name.bin" --debug "$WORK/${name}_debug.bin"
    run "fp32 build vs PyTorch, $name" "test_fp32_$name.log" build/test_gpt2cu_fp32 --model "$WORK/$name.bin" --debug "$WORK/${name}_debug.bin"
done
fi

# ---- 2. tiny shakespeare: training, checkpoints, exact resume through the command line
ts_train() {
    build/train_gpt2cu --train "data/tinyshakespeare/*_train.bin" --val "data/tinyshakespeare/*_val.bin" \
        --tokenizer data/gpt2_tokenizer.bin --init d12 --batch 8 --seq 256 --total-batch 4096 --steps 40 \
        --lr 6e-4 --warmup 5 --val-every 20 --val-steps 4 --sample-every 40 --gen-tokens 32 "$@"
}
shakespeare() {
    rm -rf "$WORK/ts" && mkdir -p "$WORK/ts" || return 1
    # exact resume needs the bit-reproducible attention backward; the default (dQ by atomics) runs last
    ts_train --deterministic 1 --out-dir "$WORK/ts/full" --ckpt-every 20 --log "$WORK/ts/full.log" || return 1
    ts_train --deterministic 1 --resume "$WORK/ts/full/step_00000020" --out-dir "$WORK/ts/resumed" \
        --log "$WORK/ts/resumed.log" || return 1
    # step, train_loss, lr, grad_norm (or step, val_loss) of steps after the checkpoint; timings differ
    local cols='$1 == "step" && $2 > 20 { print $1, $2, $3, $4, $5, $6, $7, $8 }'
    awk "$cols" "$WORK/ts/full.log" > "$WORK/ts/full.cmp"
    awk "$cols" "$WORK/ts/resumed.log" > "$WORK/ts/resumed.cmp"
    [ -s "$WORK/ts/full.cmp" ] || { echo "error: no log lines after step 20"; return 1; }
    if ! diff "$WORK/ts/full.cmp" "$WORK/ts/resumed.cmp"; then echo "error: the resumed run differs"; return 1; fi
    echo "resumed run reproduces steps 21..40 exactly ($(wc -l < "$WORK/ts/full.cmp") log lines)"
    local first last
    first=$(awk '$3 == "train_loss" { print $4; exit }' "$WORK/ts/full.log")
    last=$(awk '$3 == "train_loss" { v = $4 } END { print v }' "$WORK/ts/full.log")
    echo "train loss: first $first, last $last"
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 2.0) }' || { echo "error: the loss did not fall by 2"; return 1; }
    ts_train --out-dir "$WORK/ts/fast" --log "$WORK/ts/fast.log" || return 1
    local fast
    fast=$(awk '$3 == "train_loss" { v = $4 } END { print v }' "$WORK/ts/fast.log")
    echo "default (dQ atomics) run: last train loss $fast"
    awk -v a="$last" -v b="$fast" 'BEGIN { d = a - b; exit !(d < 0.05 && d > -0.05) }' ||
        { echo "error: the default run's last loss is not within 0.05 of the deterministic run's"; return 1; }
}
# a Llama-style model of the same size (114M-shape: 4 KV heads, SwiGLU 2048) trains too
llama_shakespeare() {
    rm -rf "$WORK/ts_llama" && mkdir -p "$WORK/ts_llama" || return 1
    ts_train --init llama:L12,C768,H12,KV4 --log "$WORK/ts_llama/run.log" || return 1
    local first last
    first=$(awk '$3 == "train_loss" { print $4; exit }' "$WORK/ts_llama/run.log")
    last=$(awk '$3 == "train_loss" { v = $4 } END { print v }' "$WORK/ts_llama/run.log")
    echo "llama train loss: first $first, last $last"
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 2.0) }' || { echo "error: the loss did not fall by 2"; return 1; }
}
if ! want 2; then :
elif ls data/tinyshakespeare/*_train.bin >/dev/null 2>&1; then
    run "tiny shakespeare: train, checkpoint, exact resume" shakespeare.log shakespeare
    run "tiny shakespeare: a Llama-style model trains" shakespeare_llama.log llama_shakespeare
else
    echo "=== data/tinyshakespeare missing (python3 scripts/data/tinyshakespeare.py): skipped"
    failed=$((failed + 1)); failed_names+=("tiny shakespeare (no data)")
fi

# ---- 3. memory estimate: refuse early, one line, suggest the fix
too_big() {
    local out rc
    out=$(build/train_gpt2cu --random-data 1 --init d12 --batch 2048 --seq 1024 --steps 1 2>&1); rc=$?
    echo "$out" | tail -n 1
    [ $rc -eq 1 ] && echo "$out" | grep -q "^error: model needs .* GiB of GPU memory.*lower --batch or pass --recompute 1" || return 1
    out=$(build/train_gpt2cu --random-data 1 --init d96 --batch 1 --seq 64 --steps 1 2>&1); rc=$?
    echo "$out" | tail -n 1
    [ $rc -eq 1 ] && echo "$out" | grep -q "^error: model needs .* GiB for parameters.*choose a smaller model"
}
want 3 && run "too large a batch / model fails with a clear message" too_big.log too_big

# ---- 4. memcheck of every op on the small model (--ops-only: the rest adds nothing but time). Some sandboxes (gVisor)
# refuse the sanitizer ("Device not supported"): then it prints SKIPPED and does not fail the suite.
memcheck() {
    local out rc
    out=$(timeout "${MEMCHECK_TIMEOUT:-900}" compute-sanitizer --tool memcheck --error-exitcode 1 build/test_gpt2cu --ops-only 2>&1); rc=$?
    echo "$out" | tail -n 25
    if [ $rc -ne 0 ] && echo "$out" | grep -q "Device not supported"; then echo "memcheck: SKIPPED (sanitizer unsupported here)"; return 0; fi
    return $rc
}
if ! want 4; then :
elif [ "${MEMCHECK:-1}" = 0 ]; then
    echo "=== MEMCHECK=0: memcheck skipped"
elif command -v compute-sanitizer >/dev/null; then
    run "compute-sanitizer memcheck" memcheck.log memcheck
else
    echo "=== compute-sanitizer not found: memcheck skipped"
fi

# ---- 5. HellaSwag (llmc/hellaswag.h): the accuracy the GPU trainer logs at step 0 (the model file
# as written) against scripts/train_gpt2.py --hellaswag on the same file. The model: 2 layers of
# 2 heads of 64 (the GPU attention's head size), vocab 250 for the fixture's byte tokens. fp32 must
# agree exactly; bf16 may differ only on examples whose two best scores PyTorch puts < 0.02 apart.
hellaswag_gpu() {
    local model=$WORK/hs_model.bin eval=tests/fixture/hellaswag.bin ref=$WORK/hs_ref.txt bin want close got
    python3 scripts/train_gpt2.py --layers 2 --channels 128 --heads 2 --vocab 250 --max-seq 64 \
        --write-model "$model" || return 1
    python3 scripts/train_gpt2.py --load "$model" --hellaswag "$eval" > "$ref" || return 1
    want=$(awk '$1 == "hellaswag" { print $5 }' "$ref")
    close=$(awk '$1 == "example" { a = $8 + 0; b = 1e30
                                   for (i = 9; i <= NF; i++) { x = $i + 0; if (x < a) { b = a; a = x } else if (x < b) b = x }
                                   if (b - a < 0.02) c++ } END { print c + 0 }' "$ref")
    echo "PyTorch: $(tail -n 1 "$ref") ($close examples within 0.02 of a tie)"
    for bin in build/train_gpt2cu_fp32 build/train_gpt2cu; do
        got=$("$bin" --random-data 1 --init "$model" --batch 8 --seq 32 --steps 1 --hellaswag "$eval" \
                   --hellaswag-every 1 |
              awk '$1 == "step" && $2 == 0 && $3 == "hellaswag_acc" { print $6 }')
        echo "$bin: step 0 correct ${got:-none} of 12"
        [ -n "$got" ] || return 1
        if [ "$bin" = build/train_gpt2cu_fp32 ]; then [ "$got" -eq "$want" ] || return 1
        else [ $((got > want ? got - want : want - got)) -le "$close" ] || return 1; fi
    done
}
want 5 && run "HellaSwag accuracy vs PyTorch" hellaswag.log hellaswag_gpu

# ---- 6. generation with the KV cache (its own script, also run on its own)
if want 6; then
run "generate: GPU vs CPU twin, cached vs full logits, graph, bad inputs, memcheck, bench" generate.log \
    env GPU_TEST_DIR="$WORK/generate" tests/test_generate_gpu.sh
run "generate (fp32 build) vs transformers, teacher-forced logits" generate_hf_fp32.log \
    env GEN=build/generate_fp32 TOL=1e-4 python3 -m pytest -q -s tests/test_generate_gpu_hf.py
run "generate (bf16 build) vs transformers, teacher-forced logits" generate_hf_bf16.log \
    env GEN=build/generate TOL=5e-2 python3 -m pytest -q -s tests/test_generate_gpu_hf.py
fi

# ---- 7. data parallel: the NCCL path at world size 1 = the plain trainer, bit for bit (its own script)
if want 7; then
run "data parallel: NCCL world size 1 at --zero 0/1/2 = plain trainer bit for bit, exact resume, step-time cost" \
    distributed.log tests/test_distributed_gpu.sh
run "ZeRO-2 shard-only gradients: --zero 0/1/2 with and without accumulation = plain trainer bit for bit, memory" \
    zero2.log tests/zero2_gpu_check.sh
fi

# ---- 8. FP8 (its own script; without QUICK=1 it adds the 2000-step parity runs and the bench)
if want 8; then
run "fp8: linear layers vs the CPU reference, shape refusal, 20-step loss vs bf16" fp8.log \
    env QUICK=1 OUT="$WORK" tests/fp8_parity_gpu.sh
fi
echo
[ $failed -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
