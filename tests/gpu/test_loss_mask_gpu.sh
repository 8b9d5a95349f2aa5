#!/usr/bin/env bash
# The GPU trainer on loss-masked shards (version 3, docs/formats.md) against the CPU trainer's
# semantics (each micro-batch's masked mean, averaged over the step; a micro-batch that counts nothing
# gives loss 0 and no gradient; validation: the mean of the batches' masked means). Data from
# test_loss_mask_gpu.py: a masked train shard of 8 windows, one of them all masked, and a masked val
# shard; a fresh GPT-2 (gpt2:L2,C128,H2) and Llama (llama:L2,C128,H2,KV1,V512,untied, GQA, untied
# head), 2 layers, head size 64, batch 4 x 64, 2 micro-batches a step, 4 steps, validation at 0, 2, 4.
#  1. build/train_gpt2cu_fp32 against build/train_gpt2_cpu, same init (the same seed through the same
#     model_init_params): every train and val loss within FP32_RTOL relative. Both run plain fp32 (the
#     GPU build has no TF32) and differ only in summation orders (cuBLAS, the attention kernels,
#     OpenMP): ~1e-6 a forward, grown by 4 AdamW steps to ~1e-5; a mask ignored, or pooled over the
#     step instead of averaged per micro-batch, moves the losses by over 1e-2 (the control below).
#  2. build/train_gpt2cu (bf16) against the CPU within BF16_RTOL (bf16 activations and parameters:
#     ~4e-3 a value, ~1e-3 on a mean loss).
#  3. --graph 0 equals --graph 1 bit for bit on the masked data (--deterministic 1, bf16).
#  4. an all-ones mask gives the log lines (train_loss, lr, grad_norm, val_loss) and the final
#     model.bin of the same tokens in an unmasked shard, bit for bit (bf16, --deterministic 1).
#  5. FP8 (GPT-2, bf16 build): --fp8-head 1 on a masked shard is refused with one line naming the flag
#     and the shard; --fp8 1 with the bf16 head trains on it, within FP8_RTOL of the bf16 run.
# About 1 minute on an H100 (the CPU's GPT-2 runs, 50257 columns, take most of it).
#   tests/gpu/test_loss_mask_gpu.sh    CPU, GPU, GPU32 name the binaries (default build/train_gpt2_cpu,
#                                      build/train_gpt2cu, build/train_gpt2cu_fp32); NOGPU=1 runs only
#                                      the data and the CPU trainer (a machine without a GPU)
cd "$(dirname "$0")/../.." || exit 1
CPU=${CPU:-build/train_gpt2_cpu}; GPU=${GPU:-build/train_gpt2cu}; GPU32=${GPU32:-build/train_gpt2cu_fp32}
NOGPU=${NOGPU:-0}
FP32_RTOL=1e-4; BF16_RTOL=1e-2; FP8_RTOL=5e-2; MASK_MOVES=1e-2
bins=("$CPU"); [ "$NOGPU" = 1 ] || bins+=("$GPU" "$GPU32")
for bin in "${bins[@]}"; do [ -x "$bin" ] || { echo "test_loss_mask_gpu: $bin is missing"; exit 1; }; done
[ "$NOGPU" = 1 ] || { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; } ||
    { echo "test_loss_mask_gpu: no GPU (NOGPU=1 runs the CPU side)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
helper=tests/gpu/test_loss_mask_gpu.py
python3 $helper shards "$tmp" || { echo "test_loss_mask_gpu: writing the shards failed"; exit 1; }
. tests/gpu/trainer_runs.sh  # pass, flunk, train, close, same
declare -A MODEL=([gpt2]="gpt2:L2,C128,H2" [llama]="llama:L2,C128,H2,KV1,V512,untied")
COMMON=(--batch 4 --seq 64 --total-batch 512 --steps 4 --lr 1e-3 --warmup 1 --val-every 2 --val-steps 3 --seed 1
        --data-vocab 512 --sample-every 0)

for arch in gpt2 llama; do
    train "cpu_$arch" "$CPU" $arch masked.bin val.bin || continue
    if [ $arch = llama ] && train cpu_llama_plain "$CPU" llama plain.bin val.bin; then
        # the control: the mask moves the losses far more than the tolerances (so the checks see it used)
        if python3 $helper compare "$tmp/cpu_llama.log" "$tmp/cpu_llama_plain.log" $MASK_MOVES >/dev/null; then
            flunk "control: the mask moves the CPU's losses" "by less than $MASK_MOVES"
        else pass "control: the mask moves the CPU's losses by over $MASK_MOVES"; fi
    fi
    [ "$NOGPU" = 1 ] && continue
    train "fp32_$arch" "$GPU32" $arch masked.bin val.bin && close "$arch fp32 GPU = CPU (masked)" "cpu_$arch" "fp32_$arch" $FP32_RTOL
    train "bf16_$arch" "$GPU" $arch masked.bin val.bin --deterministic 1 &&
        close "$arch bf16 GPU = CPU (masked)" "cpu_$arch" "bf16_$arch" $BF16_RTOL
    train "bf16_${arch}_eager" "$GPU" $arch masked.bin val.bin --deterministic 1 --graph 0 &&
        same "$arch --graph 0 = --graph 1 (masked)" "bf16_$arch" "bf16_${arch}_eager"
done
[ "$NOGPU" = 1 ] && { echo "$passed passed, $failed failed (NOGPU=1: the CPU side only)"; [ $failed = 0 ]; exit; }

train plain "$GPU" gpt2 plain.bin val.bin --deterministic 1 && train ones "$GPU" gpt2 ones.bin val.bin --deterministic 1 &&
    same "an all-ones mask = no mask" plain ones

if "$GPU" --init "${MODEL[gpt2]}" --train "$tmp/masked.bin" "${COMMON[@]}" --fp8 1 --fp8-head 1 >"$tmp/fp8_head.out" 2>&1; then
    flunk "--fp8-head 1 with a masked shard" "it trained"
elif line=$(grep -m 1 -F -- "--fp8-head 1: $tmp/masked.bin has a loss mask" "$tmp/fp8_head.out"); then
    pass "--fp8-head 1 with a masked shard is refused" "$line"
else flunk "--fp8-head 1 with a masked shard" "not the expected message: $(tail -n 1 "$tmp/fp8_head.out")"; fi
train fp8 "$GPU" gpt2 masked.bin val.bin --fp8 1 && close "--fp8 1 (bf16 head) = bf16 (masked)" bf16_gpt2 fp8 $FP8_RTOL

echo "$passed passed, $failed failed"
[ $failed = 0 ]
