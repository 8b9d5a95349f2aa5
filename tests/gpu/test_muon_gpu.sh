#!/usr/bin/env bash
# The GPU trainer's --optimizer muon (llmc/muon.cuh) against the CPU trainer's (llmc/cpu/muon.h, itself
# held to torch.optim.Muon by tests/python/test_muon_trainer.py). A fresh GPT-2 (gpt2:L2,C128,H2) and
# Llama (llama:L2,C128,H2,KV1,V512,untied: GQA, so Q, K, V are blocks of two shapes, SwiGLU's gate and
# up two blocks), head size 64, batch 4 x 64, 2 micro-batches a step, 6 steps, on a learnable shard
# (test_muon_gpu.py); GPT-2 with --muon-adjust-lr original and weight decay, Llama with match_rms_adamw
# and momentum 0.9.
#  1. build/train_gpt2cu_fp32 = build/train_gpt2_cpu (same seed, same model_init_params, same data order):
#     every train loss within FP32_RTOL relative and the final Muon matrices within FP32_WTOL. Both run
#     the Newton-Schulz iteration in plain fp32 (the GPU build has no TF32) and differ in summation
#     orders (cuBLAS, attention, OpenMP): ~1e-6 a forward; the iteration's polynomial (slope up to
#     a = 3.4445 a step on small singular values) may amplify an update's difference 10-100x, but the
#     update is lr-sized (~2e-3 a value a step): ~1e-5 expected on both.
#  2. build/train_gpt2cu (bf16, --deterministic 1) = the CPU: losses within BF16_RTOL (bf16 parameters
#     and activations, ~1e-3 on a mean loss as for AdamW), the Muon matrices' fp32 master weights within
#     BF16_WTOL. The iteration in bf16 (as torch runs it on a GPU) is the bound: on a gradient with a
#     decaying spectrum, torch's own bf16 Newton-Schulz differs from its fp32 one by ~15% of the
#     orthogonalised update's largest value (it lifts the small singular directions, where bf16's
#     rounding lives), so each ~2e-3 update moves by ~3e-4 and six steps by ~1e-3; measured on an H100:
#     1.4e-3 (GPT-2) and 1.75e-3 (Llama). BF16_WTOL = 5e-3 is 4x below the AdamW control's 2.2e-2; the
#     fp32 build (check 1) is the sharp check of the algorithm. Measured on the CPU for scale: momentum
#     0.9 instead of 0.95 moves the Muon matrices by 1.4e-3, AdamW instead of Muon by 2.2e-2.
#  3. control: the GPU's AdamW run ends more than MUON_MOVES from Muon's Muon matrices.
#  4. --graph 0 = --graph 1 bit for bit (bf16, --deterministic 1): log lines and the final model.bin.
#  5. --deterministic 1: a run resumed from its step-3 checkpoint reproduces steps 4-6 of the
#     uninterrupted run bit for bit (log lines, model.bin and state.bin: Muon's momentum is in m).
#  6. resuming an AdamW checkpoint with --optimizer muon is refused, naming both optimizers.
# About 1 minute on an H100 (the CPU's GPT-2 runs, 50257 columns, take most of it).
#   tests/gpu/test_muon_gpu.sh    CPU, GPU, GPU32 name the binaries (default build/train_gpt2_cpu,
#                                 build/train_gpt2cu, build/train_gpt2cu_fp32); NOGPU=1 runs the CPU side only
cd "$(dirname "$0")/../.." || exit 1
CPU=${CPU:-build/train_gpt2_cpu}; GPU=${GPU:-build/train_gpt2cu}; GPU32=${GPU32:-build/train_gpt2cu_fp32}
NOGPU=${NOGPU:-0}
FP32_RTOL=1e-4; FP32_WTOL=1e-4; BF16_RTOL=1e-2; BF16_WTOL=5e-3; MUON_MOVES=1e-2
die() { echo "test_muon_gpu: $*"; exit 1; }
need=("$CPU"); [ "$NOGPU" = 1 ] || need+=("$GPU" "$GPU32")
for bin in "${need[@]}"; do [ -x "$bin" ] || die "$bin is missing"; done
if [ "$NOGPU" != 1 ] && ! nvidia-smi -L >/dev/null 2>&1; then die "no GPU (NOGPU=1 runs the CPU side)"; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
helper=tests/gpu/test_muon_gpu.py
python3 $helper shard "$tmp/train.bin" || die "writing the shard failed"
# ok / bad WHAT [DETAIL]: one check's line, counted
passed=0; failed=0
ok() { passed=$((passed + 1)); printf 'ok   %s\n' "$1${2:+: $2}"; }
bad() { failed=$((failed + 1)); printf 'FAIL %s\n' "$1: $2"; }
declare -A MODEL=([gpt2]="gpt2:L2,C128,H2" [llama]="llama:L2,C128,H2,KV1,V512,untied")
declare -A MUON=([gpt2]="--optimizer muon --muon-lr 0.02 --muon-wd 0.1"
                 [llama]="--optimizer muon --muon-lr 0.01 --muon-adjust-lr match_rms_adamw --muon-momentum 0.9")
FLAGS=(--batch 4 --seq 64 --total-batch 512 --steps 6 --lr 1e-3 --warmup 1 --seed 1 --data-vocab 512 --val-every 0
       --sample-every 0 --train "$tmp/train.bin")

# run NAME BIN FLAGS...: a run with its log in $tmp/NAME.log, output in $tmp/NAME.out, checkpoints in $tmp/NAME/
run() {
    local name=$1 bin=$2; shift 2
    if OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} "$bin" "${FLAGS[@]}" --log "$tmp/$name.log" --out-dir "$tmp/$name" "$@" \
        >"$tmp/$name.out" 2>&1; then return 0; fi
    bad "$name" "exit status $?: $(grep -m 1 -iE 'error|fail' "$tmp/$name.out")"; return 1
}
# near WHAT A B RTOL ATOL: the train losses of runs A and B within RTOL relative, their final Muon matrices
# within ATOL
near() {
    local got w
    got=$(python3 tests/gpu/test_loss_mask_gpu.py compare "$tmp/$2.log" "$tmp/$3.log" "$4") ||
        { bad "$1" "$got"; return; }
    w=$(python3 $helper weights "$tmp/$2/step_00000006" "$tmp/$3/step_00000006" "$5") || { bad "$1" "$w"; return; }
    ok "$1" "$got; $w"
}
# identical WHAT A B FROM: the train lines of steps > FROM of runs A and B, and their step-6 files, bit for bit
lines_after() { awk -v from="$2" '$1 == "step" && $3 == "train_loss" && $2 > from { print $2, $4, $6, $8 }' "$1"; }
identical() {
    local a=$tmp/$2 b=$tmp/$3 f
    if [ -z "$(lines_after "$a.log" "$4")" ]; then bad "$1" "no step lines in $a.log"; return; fi
    if ! diff <(lines_after "$a.log" "$4") <(lines_after "$b.log" "$4") >"$b.diff"; then
        bad "$1" "the step lines differ: $(head -n 4 "$b.diff" | tr '\n' ' ')"; return
    fi
    for f in model.bin state.bin; do
        cmp -s "$a/step_00000006/$f" "$b/step_00000006/$f" || { bad "$1" "the final $f differ"; return; }
    done
    ok "$1" "bit for bit, last loss $(lines_after "$b.log" "$4" | tail -n 1 | cut -d' ' -f2)"
}

for arch in gpt2 llama; do
    read -r -a muon <<<"${MUON[$arch]}"
    run "cpu_$arch" "$CPU" --init "${MODEL[$arch]}" "${muon[@]}" || continue
    [ "$NOGPU" = 1 ] && { ok "$arch CPU trainer with Muon" "$(tail -n 1 "$tmp/cpu_$arch.log")"; continue; }
    run "fp32_$arch" "$GPU32" --init "${MODEL[$arch]}" "${muon[@]}" &&
        near "$arch fp32 GPU Muon = CPU Muon" "cpu_$arch" "fp32_$arch" $FP32_RTOL $FP32_WTOL
    run "bf16_$arch" "$GPU" --init "${MODEL[$arch]}" "${muon[@]}" --deterministic 1 --ckpt-every 3 &&
        near "$arch bf16 GPU Muon = CPU Muon" "cpu_$arch" "bf16_$arch" $BF16_RTOL $BF16_WTOL
    run "eager_$arch" "$GPU" --init "${MODEL[$arch]}" "${muon[@]}" --deterministic 1 --graph 0 &&
        identical "$arch Muon --graph 0 = --graph 1" "bf16_$arch" "eager_$arch" 0
    if [ -d "$tmp/bf16_$arch/step_00000003" ]; then  # the step-3 checkpoint alone, resumed
        mkdir -p "$tmp/from3_$arch" && cp -r "$tmp/bf16_$arch/step_00000003" "$tmp/from3_$arch/"
        run "resumed_$arch" "$GPU" --resume "$tmp/from3_$arch" "${muon[@]}" --deterministic 1 &&
            identical "$arch Muon resumed at step 3 = uninterrupted" "bf16_$arch" "resumed_$arch" 3
    fi
done
[ "$NOGPU" = 1 ] && { echo "$passed passed, $failed failed (NOGPU=1: the CPU side only)"; [ $failed = 0 ]; exit; }

if run adamw "$GPU" --init "${MODEL[gpt2]}" --deterministic 1; then
    if python3 $helper weights "$tmp/adamw/step_00000006" "$tmp/bf16_gpt2/step_00000006" $MUON_MOVES >/dev/null; then
        bad "control: Muon moves the GPU's Muon matrices" "by less than $MUON_MOVES from AdamW's"
    else ok "control: Muon moves the GPU's Muon matrices by over $MUON_MOVES from AdamW's"; fi
    read -r -a muon <<<"${MUON[gpt2]}"
    want="--optimizer muon: the checkpoint $tmp/adamw/step_00000006 holds adamw's optimizer state"
    if "$GPU" "${FLAGS[@]}" --steps 8 --resume "$tmp/adamw" "${muon[@]}" >"$tmp/refused.out" 2>&1; then
        bad "an AdamW checkpoint resumed with --optimizer muon" "it trained"
    elif line=$(grep -m 1 -F -- "$want" "$tmp/refused.out"); then
        ok "an AdamW checkpoint resumed with --optimizer muon is refused" "$line"
    else bad "an AdamW checkpoint resumed with --optimizer muon" "not the expected: $(tail -n 1 "$tmp/refused.out")"; fi
fi

echo "$passed passed, $failed failed"
[ $failed = 0 ]
