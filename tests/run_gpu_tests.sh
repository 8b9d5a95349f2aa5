#!/usr/bin/env bash
# The GPU tests (make test-gpu; needs a GPU, PyTorch, and data/ from
#   python3 scripts/data/tinyshakespeare.py). Each suite's output is shown and kept in $LOGS; the
# last lines are a table of each section's seconds and suites, then "N passed, N failed"; the exit
# status is non-zero if any suite failed. Sections (QUICK=1 runs the case named "quick" of each):
#   1. test_gpt2cu / test_gpt2cu_fp32: GPT-2 124M (d12, random init) vs the PyTorch reference state
#      (fp64, REF_STEPS AdamW steps), every op vs the CPU reference, bit-exact save -> load -> continue;
#      then a d12 with grouped-query attention (4 KV heads) and a sliding window (24) vs its own PyTorch
#      reference, and two Llama-style d12s (GQA tied; MHA untied with a window) vs theirs, and the GQA
#      one again with Llama 3.x's llama3 RoPE scaling (loaded by the reference with --load).
#      quick: the GPT-2 state only. The reference states are written (fp64, on the GPU: REF_DEVICE=cpu
#      for the CPU) in the background
#      while sections 2-8 hold the GPU, so section 1 runs last.
#   2. tiny shakespeare: d12 trains (the loss falls), checkpoints, and a resumed run reproduces the
#      uninterrupted run's log exactly (train loss, grad norm, lr, val loss) with --deterministic 1;
#      the default run (dQ by atomics) ends within 0.05 of its loss; a Llama-style d12 trains; in the
#      background, tests/gpu/test_loss_mask_gpu.sh (loss-masked shards: the fp32 and bf16 builds against
#      the CPU trainer, graph = eager, an all-ones mask = no mask, the FP8 head's refusal) and
#      tests/gpu/test_muon_gpu.sh (--optimizer muon: both builds against the CPU trainer, graph = eager,
#      exact resume, an AdamW checkpoint refused) and tests/gpu/test_doc_mask_gpu.sh (--doc-mask 1: both
#      builds against the CPU trainer, windows and position modes, graph = eager, one document a row =
#      no masking, --fp8 1 refused).
#      quick: the deterministic run and its resume
#   3. a batch or a model that cannot fit fails with a one-line message naming the fix
#   4. compute-sanitizer memcheck of build/test_gpt2cu --ops-only (every op on the small model), in the
#      background beside sections 2-8. quick: 2 training steps of a d2 under memcheck
#   5. HellaSwag: both GPU builds' acc_norm on tests/fixture/hellaswag.bin equals PyTorch's (fp64).
#      quick: the fp32 build
#   6. generate, in the background beside sections 2-8: tests/gpu/test_generate.sh in two jobs (GPU = CPU
#      twin, graph = no graph, bad inputs, the fused step; cached = full logits, memcheck; its timings are
#      dev/bench/ab_speed.sh's, BENCH=0 here), and tests/gpu/test_generate_hf.py in both builds: teacher-forced logits
#      at every step against transformers' generate for a random GPT-2 and three random Llamas, one
#      with llama3 RoPE scaling (fp32 build within 1e-4 of the largest logit, bf16 build within the
#      larger of 5e-2 and twice transformers' own bf16 error on the model).
#      quick: test_generate.sh's section 1 (GPU = CPU twin) and the fp32 build against transformers
#   7. data parallel: tests/gpu/test_distributed.sh (build/train_gpt2cu_nccl at world size 1, --zero
#      0/1/2 = build/train_gpt2cu bit for bit with --deterministic 1, exact resume; its step-time cost
#      is timed only when run alone, COST=0 here), then tests/gpu/test_zero2.sh (ZeRO-2's shard-only
#      gradients, with and without accumulation, an untied Llama, bit for bit; each stage's memory).
#      quick: --zero 2 with accumulation = the plain trainer
#   8. FP8: QUICK=1 tests/gpu/test_fp8_parity.sh (build/test_fp8_gpu: each --fp8 linear layer vs the CPU
#      emulation of its casts; --fp8 1 refuses a bad shape; delayed scaling resumes exactly; a d12's and
#      a Llama-style 114M's loss with --fp8 1 within 10% of bf16's after 20 steps on tiny Shakespeare).
#      quick: without the 20-step runs
#   9. the portable path, forced by LLMC_PORTABLE=1: the d12 state vs PyTorch, tiny shakespeare with an
#      exact resume, generate = CPU twin (its sections 1 and 7, started in the background with section 6's
#      jobs). quick: the d12 state
# Nothing here times anything against a target, so the background jobs may share the GPU.
# Env: QUICK=1 (one case a section), SECTIONS (the digits of the sections to run, default 123456789:
#      SECTIONS=16 runs 1 and 6), GPU_TEST_DIR (scratch, default a new /tmp dir; the reference states
#      written there are reused), LOGS (default $GPU_TEST_DIR), REF_STEPS (AdamW steps of the reference
#      states, default 5), MEMCHECK=0 to skip memcheck, MEMCHECK_TIMEOUT (seconds, default 900),
#      BG_THREADS (CPU threads of each background job, default a quarter of the cores).
cd "$(dirname "$0")/.." || exit 1
sections=${SECTIONS:-123456789} quick=${QUICK:-0} ref_steps=${REF_STEPS:-5}
unset SECTIONS QUICK  # not passed on: the scripts below read their own SECTIONS and QUICK
[[ $sections =~ ^[1-9]+$ ]] || { echo "run_gpu_tests: SECTIONS=$sections: expected digits 1-9, e.g. SECTIONS=16" >&2; exit 2; }
[[ $quick == [01] ]] || { echo "run_gpu_tests: QUICK=$quick: expected 0 or 1" >&2; exit 2; }
[[ $ref_steps =~ ^[1-9][0-9]*$ ]] || { echo "run_gpu_tests: REF_STEPS=$ref_steps: expected a positive integer" >&2; exit 2; }
[ "${DRY_RUN:-0}" = 1 ] && { echo "run_gpu_tests: sections $sections, QUICK=$quick, REF_STEPS=$ref_steps"; exit 0; }
WORK=${GPU_TEST_DIR:-$(mktemp -d /tmp/gpu_tests.XXXXXX)}
LOGS=${LOGS:-$WORK}
mkdir -p "$WORK" "$LOGS" || exit 1
passed=0; failed=0; failed_names=()
want() { [[ $sections == *$1* ]]; }  # SECTIONS=16: only sections 1 and 6
record() {  # record NAME STATUS [SECONDS]: the verdict line, with the suite's seconds when given
    local secs=${3:+ ($3 s)}
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); echo "--- $1: PASS$secs"
    else failed=$((failed + 1)); failed_names+=("$1"); echo "--- $1: FAIL$secs"; fi
}
run() {  # run NAME LOGFILE CMD...: in the foreground, its output shown and kept in $LOGS/LOGFILE
    local name=$1 log=$2 t0=$SECONDS; shift 2
    echo "=== [at $SECONDS s] $name: $*"
    "$@" 2>&1 | tee "$LOGS/$log"
    record "$name" "${PIPESTATUS[0]}" $((SECONDS - t0))
}
declare -A bg_pid bg_name
# The background jobs' CPU sides (the CPU twins, the CPU trainer, PyTorch on the CPU) share the cores with
# each other and the foreground: each gets BG_THREADS OpenMP/PyTorch threads (default a quarter of the
# cores, at least 2; a job's own OMP_NUM_THREADS wins), and idle OpenMP threads sleep instead of spinning.
BG_THREADS=${BG_THREADS:-$(n=$(nproc); echo $(( n / 4 > 2 ? n / 4 : 2 )))}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
start_bg() {  # start_bg NAME LOGFILE CMD...: in the background, its output only in $LOGS/LOGFILE
    local name=$1 log=$2; shift 2
    echo "=== $name: started in the background: $*"
    { local t0=$SECONDS; OMP_NUM_THREADS=${OMP_NUM_THREADS:-$BG_THREADS} "$@" > "$LOGS/$log" 2>&1; local rc=$?
      echo $((SECONDS - t0)) > "$LOGS/$log.secs"; exit $rc; } &
    bg_pid[$log]=$! bg_name[$log]=$name
}
finish_bg() {  # finish_bg LOGFILE: waits for that job, shows its output, counts it (nothing if not started)
    local log=$1 rc
    [ -n "${bg_pid[$log]:-}" ] || return 0
    wait "${bg_pid[$log]}"; rc=$?
    echo "=== [at $SECONDS s] ${bg_name[$log]} (ran in the background, $(cat "$LOGS/$log.secs" 2>/dev/null || echo '?') s):"
    cat "$LOGS/$log"
    record "${bg_name[$log]}" $rc "$(cat "$LOGS/$log.secs" 2>/dev/null)"
    unset "bg_pid[$log]"
}
trap 'for p in "${bg_pid[@]}"; do kill "$p" 2>/dev/null; done' EXIT  # an interrupted run leaves no job behind
# each section's wall seconds and suites for the last table
declare -A sec_secs sec_note sec_counts
sec_t0=0 sec_p0=0 sec_f0=0
begin() { sec_t0=$SECONDS sec_p0=$passed sec_f0=$failed; echo; echo "##### section $1"; }
end() {  # end N [NOTE]
    sec_secs[$1]=$((SECONDS - sec_t0)) sec_note[$1]=${2:-}
    sec_counts[$1]="$((passed - sec_p0)) passed, $((failed - sec_f0)) failed"
}

# ---- started first, in the background: section 1's reference states (CPU) and section 4's memcheck
REF_FLAGS=(--batch 4 --seq 64 --steps "$ref_steps" --device "${REF_DEVICE:-cuda}")
ref_state() {  # ref_state NAME FLAGS...: writes $WORK/NAME.bin and NAME_debug.bin once
    local name=$1; shift
    [ -f "$WORK/${name}_debug.bin" ] && { echo "$name: reusing $WORK/${name}_debug.bin"; return 0; }
    echo "=== writing the PyTorch reference state ($name: $*, B=4, T=64, $ref_steps steps, fp64 on ${REF_DEVICE:-cuda})"
    OMP_NUM_THREADS=${REF_THREADS:-8} python3 scripts/train_gpt2.py "$@" "${REF_FLAGS[@]}" --write-model "$WORK/$name.bin" --write-debug "$WORK/${name}_debug.bin"
}
ref_states() {  # GPT-2 d12; with GQA (12 heads / 4 KV heads) and a 24-token window; Llama-style d12s
    ref_state d12 --model d12 || return 1
    [ "$quick" = 1 ] && return 0
    want 1 || return 0  # section 9 alone needs only the d12 state
    ref_state d12_gqa_w24 --model d12 --kv-heads 4 --window 24 || return 1
    # RMSNorm, RoPE, SwiGLU 2048, no biases: 4 KV heads with the tied head; MHA, untied head, 24-token window
    ref_state llama_gqa --model d12 --arch llama --kv-heads 4 || return 1
    ref_state llama_untied_w24 --model d12 --arch llama --tied 0 --window 24 || return 1
    # llama_gqa's weights with Llama 3.x's llama3 RoPE scaling (factor 8, original context 16: T=64
    # passes it), through --load: the GPU trainer's rope tables against the reference's
    [ -f "$WORK/llama3_gqa_debug.bin" ] && return 0
    python3 -c "import sys; sys.path.insert(0, 'scripts'); import llmc_formats as f
cfg, flat = f.read_model(sys.argv[1])
f.write_model(sys.argv[2], dict(cfg, rope_scaling=f.ROPE_SCALING_LLAMA3, rope_factor=8.0, rope_low_freq_factor=1.0,
              rope_high_freq_factor=4.0, rope_original_max_pos=16), flat)" "$WORK/llama_gqa.bin" "$WORK/llama3_base.bin" &&
        ref_state llama3_gqa --load "$WORK/llama3_base.bin"
}
{ want 1 || want 9; } && start_bg "PyTorch reference states (sections 1, 9)" references.log ref_states

# ---- 4. memcheck (--ops-only: the rest adds nothing but time). Some sandboxes (gVisor) refuse the
# sanitizer ("Device not supported"): then it prints SKIPPED and does not fail the suite.
memcheck() {
    local out rc cmd=(build/test_gpt2cu --ops-only)
    [ "$quick" = 1 ] && cmd=(build/train_gpt2cu --random-data 1 --init d2 --batch 2 --seq 64 --steps 2 --val-every 0 --sample-every 0)
    echo "compute-sanitizer memcheck: ${cmd[*]}"
    out=$(timeout "${MEMCHECK_TIMEOUT:-900}" compute-sanitizer --tool memcheck --error-exitcode 1 "${cmd[@]}" 2>&1); rc=$?
    echo "$out" | tail -n 25
    if [ $rc -ne 0 ] && echo "$out" | grep -q "Device not supported"; then echo "memcheck: SKIPPED (sanitizer unsupported here)"; return 0; fi
    return $rc
}
if ! want 4; then :
elif [ "${MEMCHECK:-1}" = 0 ]; then
    echo "=== MEMCHECK=0: memcheck skipped"; sec_note[4]="skipped (MEMCHECK=0)"
elif command -v compute-sanitizer >/dev/null; then
    start_bg "compute-sanitizer memcheck" memcheck.log memcheck
else
    echo "=== compute-sanitizer not found: memcheck skipped"; sec_note[4]="skipped (no compute-sanitizer)"
fi

# ---- 6. generation with the KV cache, started here in the background in four jobs (small models:
# the GPU has room beside sections 2-8), collected after section 8
gen_hf="generate vs transformers, teacher-forced logits"
gen_run() {  # gen_run NAME LOG SECTIONS: tests/gpu/test_generate.sh's sections, in their own directory
    start_bg "$1" "$2" env GPU_TEST_DIR="$WORK/${2%.log}" SECTIONS="$3" BENCH=0 tests/gpu/test_generate.sh
}
gen_logs=(generate_hf_fp32.log generate_hf_bf16.log generate.log generate_full.log)
if want 6; then
    t6=$SECONDS
    start_bg "$gen_hf (fp32 build)" generate_hf_fp32.log \
        env GEN=build/generate_fp32 TOL=1e-4 python3 -m pytest -q -s tests/gpu/test_generate_hf.py
    if [ "$quick" = 1 ]; then
        gen_run "generate: GPU = CPU twin" generate.log 1
    else
        start_bg "$gen_hf (bf16 build)" generate_hf_bf16.log \
            env GEN=build/generate TOL=5e-2 python3 -m pytest -q -s tests/gpu/test_generate_hf.py
        gen_run "generate: GPU = CPU twin, graph = no graph, bad inputs, fused step" generate.log 1347
        gen_run "generate: cached = full logits, memcheck" generate_full.log 25
    fi
fi
if want 9 && [ "$quick" != 1 ]; then  # section 9's generate, collected there
    start_bg "portable path: generate = CPU twin" generate_portable.log \
        env LLMC_PORTABLE=1 GPU_TEST_DIR="$WORK/generate_portable" SECTIONS=17 BENCH=0 MEMCHECK=0 tests/gpu/test_generate.sh
fi

# ---- 2 (started here, in the background: mostly the CPU trainer's runs): loss-masked shards
if want 2 && [ "$quick" != 1 ]; then
    start_bg "loss-masked shards: GPU trainer = CPU trainer, graph = eager, all-ones mask = no mask" loss_mask.log \
        tests/gpu/test_loss_mask_gpu.sh
    start_bg "Muon: GPU trainer = CPU trainer (fp32, bf16), graph = eager, exact resume" muon.log tests/gpu/test_muon_gpu.sh
    start_bg "document masking: GPU trainer = CPU trainer (fp32, bf16), graph = eager, one document a row = no mask" \
        doc_mask.log tests/gpu/test_doc_mask_gpu.sh
fi

# ---- 2. tiny shakespeare: training, checkpoints, exact resume through the command line
ts_train() {
    build/train_gpt2cu --train "data/tinyshakespeare/*_train.bin" --val "data/tinyshakespeare/*_val.bin" \
        --tokenizer data/gpt2_tokenizer.bin --init d12 --batch 8 --seq 256 --total-batch 4096 --steps 40 \
        --lr 6e-4 --warmup 5 --val-every 20 --val-steps 4 --sample-every 40 --gen-tokens 32 "$@"
}
last_loss() { awk '$3 == "train_loss" { v = $4 } END { print v }' "$1"; }
loss_fell() {  # loss_fell LOG: the last train loss is 2 below the first
    local first last
    first=$(awk '$3 == "train_loss" { print $4; exit }' "$1"); last=$(last_loss "$1")
    echo "train loss: first $first, last $last"
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 2.0) }' || { echo "error: the loss did not fall by 2"; return 1; }
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
    loss_fell "$WORK/ts/full.log" || return 1
    [ "$quick" = 1 ] && return 0
    ts_train --out-dir "$WORK/ts/fast" --log "$WORK/ts/fast.log" || return 1
    local last fast
    last=$(last_loss "$WORK/ts/full.log") fast=$(last_loss "$WORK/ts/fast.log")
    echo "default (dQ atomics) run: last train loss $fast"
    awk -v a="$last" -v b="$fast" 'BEGIN { d = a - b; exit !(d < 0.05 && d > -0.05) }' ||
        { echo "error: the default run's last loss is not within 0.05 of the deterministic run's"; return 1; }
}
# a Llama-style model of the same size (114M-shape: 4 KV heads, SwiGLU 2048) trains too
llama_shakespeare() {
    rm -rf "$WORK/ts_llama" && mkdir -p "$WORK/ts_llama" || return 1
    ts_train --init llama:L12,C768,H12,KV4 --log "$WORK/ts_llama/run.log" || return 1
    loss_fell "$WORK/ts_llama/run.log"
}
if want 2; then
    begin 2
    if ls data/tinyshakespeare/*_train.bin >/dev/null 2>&1; then
        run "tiny shakespeare: train, checkpoint, exact resume" shakespeare.log shakespeare
        [ "$quick" = 1 ] || run "tiny shakespeare: a Llama-style model trains" shakespeare_llama.log llama_shakespeare
    else
        echo "=== data/tinyshakespeare missing (python3 scripts/data/tinyshakespeare.py): skipped"
        record "tiny shakespeare (no data)" 1
    fi
    finish_bg loss_mask.log
    finish_bg muon.log
    finish_bg doc_mask.log
    end 2
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
if want 3; then begin 3; run "too large a batch / model fails with a clear message" too_big.log too_big; end 3; fi

# ---- 5. HellaSwag (llmc/hellaswag.h): the accuracy the GPU trainer logs at step 0 (the model file
# as written) against scripts/train_gpt2.py --hellaswag on the same file. The model: 2 layers of
# 2 heads of 64 (the GPU attention's head size), vocab 250 for the fixture's byte tokens. fp32 must
# agree exactly; bf16 may differ only on examples whose two best scores PyTorch puts < 0.02 apart.
hellaswag_gpu() {
    local model=$WORK/hs_model.bin eval=tests/fixture/hellaswag.bin ref=$WORK/hs_ref.txt bin want close got
    local bins=(build/train_gpt2cu_fp32 build/train_gpt2cu)
    [ "$quick" = 1 ] && bins=(build/train_gpt2cu_fp32)
    python3 scripts/train_gpt2.py --layers 2 --channels 128 --heads 2 --vocab 250 --max-seq 64 \
        --write-model "$model" || return 1
    python3 scripts/train_gpt2.py --load "$model" --hellaswag "$eval" > "$ref" || return 1
    want=$(awk '$1 == "hellaswag" { print $5 }' "$ref")
    close=$(awk '$1 == "example" { a = $8 + 0; b = 1e30
                                   for (i = 9; i <= NF; i++) { x = $i + 0; if (x < a) { b = a; a = x } else if (x < b) b = x }
                                   if (b - a < 0.02) c++ } END { print c + 0 }' "$ref")
    echo "PyTorch: $(tail -n 1 "$ref") ($close examples within 0.02 of a tie)"
    for bin in "${bins[@]}"; do
        got=$("$bin" --random-data 1 --init "$model" --batch 8 --seq 32 --steps 1 --hellaswag "$eval" \
                   --hellaswag-every 1 |
              awk '$1 == "step" && $2 == 0 && $3 == "hellaswag_acc" { print $6 }')
        echo "$bin: step 0 correct ${got:-none} of 12"
        [ -n "$got" ] || return 1
        if [ "$bin" = build/train_gpt2cu_fp32 ]; then [ "$got" -eq "$want" ] || return 1
        else [ $((got > want ? got - want : want - got)) -le "$close" ] || return 1; fi
    done
}
if want 5; then begin 5; run "HellaSwag accuracy vs PyTorch" hellaswag.log hellaswag_gpu; end 5; fi

# ---- 7. data parallel: the NCCL path at world size 1 = the plain trainer, bit for bit (its own scripts)
if want 7; then
    begin 7
    if [ "$quick" = 1 ]; then
        run "ZeRO-2 shard-only gradients with accumulation = plain trainer bit for bit" zero2.log \
            env STAGES=2 MICROS=3 LLAMA= tests/gpu/test_zero2.sh
    else
        run "data parallel: NCCL world size 1 at --zero 0/1/2 = plain trainer bit for bit, exact resume" \
            distributed.log env PLAIN_GIVEN=1 COST=0 tests/gpu/test_distributed.sh
        run "ZeRO-2 shard-only gradients: --zero 0/1/2 with and without accumulation = plain trainer bit for bit, memory" \
            zero2.log tests/gpu/test_zero2.sh
    fi
    end 7
fi

# ---- 8. FP8 (its own script; without QUICK=1 it adds the 2000-step parity runs and the bench)
if want 8; then
    begin 8
    if [ "$quick" = 1 ]; then
        run "fp8: linear layers vs the CPU reference, shape refusal, delayed-scaling resume" fp8.log \
            env QUICK=1 SHORT=0 OUT="$WORK" tests/gpu/test_fp8_parity.sh
    else
        run "fp8: linear layers vs the CPU reference, shape refusal, delayed-scaling resume, 20-step loss vs bf16" fp8.log \
            env QUICK=1 OUT="$WORK" tests/gpu/test_fp8_parity.sh
    fi
    end 8
fi

# ---- 6 (collected): the slowest of its background jobs is its time
if want 6; then
    t_wait=$SECONDS p6=$passed f6=$failed
    for log in "${gen_logs[@]}"; do finish_bg "$log"; done
    secs6=0
    for log in "${gen_logs[@]}"; do
        [ -f "$LOGS/$log.secs" ] && [ "$(cat "$LOGS/$log.secs")" -gt $secs6 ] && secs6=$(cat "$LOGS/$log.secs")
    done
    sec_secs[6]=$secs6 sec_note[6]="in the background from $t6 s; waited $((SECONDS - t_wait)) s for it"
    sec_counts[6]="$((passed - p6)) passed, $((failed - f6)) failed"
fi
# ---- 4 (collected), then 1: the reference states written in the background, the GPU builds against them
if want 4; then
    t4=$SECONDS p4=$passed f4=$failed
    finish_bg memcheck.log
    [ -n "${sec_note[4]:-}" ] || sec_note[4]="in the background; waited $((SECONDS - t4)) s for it"
    [ -f "$LOGS/memcheck.log.secs" ] && sec_secs[4]=$(cat "$LOGS/memcheck.log.secs")
    sec_counts[4]="$((passed - p4)) passed, $((failed - f4)) failed"
fi
if want 1; then
    begin 1
    t_wait=$SECONDS
    finish_bg references.log
    waited=$((SECONDS - t_wait))
    names=(d12); [ "$quick" = 1 ] || names=(d12 d12_gqa_w24 llama_gqa llama_untied_w24 llama3_gqa)
    for name in "${names[@]}"; do
        if [ ! -f "$WORK/${name}_debug.bin" ]; then record "vs PyTorch, $name (no reference state)" 1; continue; fi
        run "bf16 build vs PyTorch and CPU ops, $name" "test_bf16_$name.log" \
            build/test_gpt2cu --model "$WORK/$name.bin" --debug "$WORK/${name}_debug.bin"
        run "fp32 build vs PyTorch and CPU ops, $name" "test_fp32_$name.log" \
            build/test_gpt2cu_fp32 --model "$WORK/$name.bin" --debug "$WORK/${name}_debug.bin"
    done
    end 1 "the reference states: $(cat "$LOGS/references.log.secs" 2>/dev/null || echo '?') s in the background, waited $waited s"
fi

# ---- 9. the portable path (what an A100 or RTX GPU runs: mma.sync attention, no clusters, no PDL, no bulk
# copies), forced on this GPU by LLMC_PORTABLE=1 (llmc/cuda_common.cuh): the d12 state against PyTorch,
# training with an exact resume, generate = its CPU twin. quick: the d12 state only
if want 9; then
    begin 9
    finish_bg references.log  # (nothing when section 1 collected it)
    if [ -f "$WORK/d12_debug.bin" ]; then
        run "portable path: bf16 build vs PyTorch and CPU ops, d12" test_portable_d12.log \
            env LLMC_PORTABLE=1 build/test_gpt2cu --model "$WORK/d12.bin" --debug "$WORK/d12_debug.bin"
    else
        record "portable path vs PyTorch (no reference state)" 1
    fi
    if [ "$quick" != 1 ]; then
        if ls data/tinyshakespeare/*_train.bin >/dev/null 2>&1; then
            run "portable path: tiny shakespeare, exact resume" shakespeare_portable.log \
                env LLMC_PORTABLE=1 bash -c "$(declare -f ts_train last_loss loss_fell shakespeare); WORK=$WORK/portable quick=1 shakespeare"
        fi
        finish_bg generate_portable.log
    fi
    end 9
fi

echo
echo "section  seconds  suites                  (QUICK=$quick, logs in $LOGS)"
for n in 1 2 3 4 5 6 7 8 9; do
    want $n || continue
    printf '%7s  %7s  %-22s  %s\n' "$n" "${sec_secs[$n]:--}" "${sec_counts[$n]:-0 passed, 0 failed}" "${sec_note[$n]:-}"
done
printf '%7s  %7s\n' total "$SECONDS"
[ $failed -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
