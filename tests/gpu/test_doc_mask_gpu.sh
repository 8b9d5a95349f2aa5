#!/usr/bin/env bash
# The GPU trainer's document masking (--doc-mask 1, --doc-positions continue | restart; docs/training.md,
# "Document masking") against the CPU trainer's. Data from test_doc_mask_gpu.py: packed documents of 1
# to 32 tokens opened by the document token 511 (rows start inside documents; two document tokens
# meet), and a shard with one document a row. A fresh GPT-2 (gpt2:L2,C128,H2: learned positions) and
# Llama (llama:L2,C128,H2,KV1,V512,untied: RoPE, GQA), head size 64, batch 1 x 256 (rows of several
# 64-row kernel tiles: key tiles skipped below a query tile's documents, query ranges cut at the end of
# a key tile's documents), 2 micro-batches a step, 4 steps, validation at 0, 2, 4; each in four
# settings: window 0 and 32, positions continue and restart.
#  1. build/train_gpt2cu_fp32 (the simple attention kernels) against build/train_gpt2_cpu, same init:
#     every train and val loss within FP32_RTOL relative (summation orders only, as
#     tests/gpu/test_loss_mask_gpu.sh).
#  2. build/train_gpt2cu --deterministic 1 (bf16: the DOC forward the policy picks, on sm_90 the wgmma one;
#     the mma.sync backward pair) within BF16_RTOL.
#  3. --graph 0 equals --graph 1 bit for bit (doc_start is computed inside the captured step).
#  4. one document a row: --doc-mask 1 (both position modes) gives the log lines and the final
#     model.bin of --doc-mask 0 bit for bit (FP32 build; bf16 too, but within BF16_RTOL on Hopper,
#     where the masked forward is the wgmma kernel's DOC instantiation beside the unmasked one).
#  5. --doc-mask 1 with --fp8 1 is refused with one line.
#  6. bf16 without --deterministic (the fast backward) against the CPU at T 256 and 250 (HD 64) and at HD 128.
# The control (CPU): document masking moves the losses by over DOC_MOVES (5x FP32_RTOL), so the fp32
# comparison sees it used (measured: GPT-2 9e-4 to 3e-3, Llama 3e-3 to 5e-3; under BF16_RTOL, so the
# bf16 comparison alone would not). With RoPE, restart moves only the rounding (relative positions).
#   tests/gpu/test_doc_mask_gpu.sh     CPU, GPU, GPU32 name the binaries (default build/train_gpt2_cpu,
#                                      build/train_gpt2cu, build/train_gpt2cu_fp32); NOGPU=1 runs only
#                                      the data and the CPU trainer (a machine without a GPU)
cd "$(dirname "$0")/../.." || exit 1
CPU=${CPU:-build/train_gpt2_cpu}; GPU=${GPU:-build/train_gpt2cu}; GPU32=${GPU32:-build/train_gpt2cu_fp32}
NOGPU=${NOGPU:-0}
FP32_RTOL=1e-4; BF16_RTOL=1e-2; DOC_MOVES=5e-4
bins=("$CPU"); [ "$NOGPU" = 1 ] || bins+=("$GPU" "$GPU32")
for bin in "${bins[@]}"; do [ -x "$bin" ] || { echo "test_doc_mask_gpu: $bin is missing"; exit 1; }; done
[ "$NOGPU" = 1 ] || { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; } ||
    { echo "test_doc_mask_gpu: no GPU (NOGPU=1 runs the CPU side)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 tests/gpu/test_doc_mask_gpu.py shards "$tmp" || { echo "test_doc_mask_gpu: writing the shards failed"; exit 1; }
compare=tests/gpu/test_loss_mask_gpu.py  # its `compare`: the largest relative loss difference of two logs
. tests/gpu/trainer_runs.sh  # pass, flunk, train, close, same
declare -A MODEL=([gpt2]="gpt2:L2,C128,H2" [llama]="llama:L2,C128,H2,KV1,V512,untied")
COMMON=(--batch 1 --seq 256 --total-batch 512 --steps 4 --lr 1e-3 --warmup 1 --val-every 2 --val-steps 3 --seed 1
        --data-vocab 512 --sample-every 0)
DOC=(--doc-mask 1 --doc-token 511)

for arch in gpt2 llama; do
    for window in 0 32; do
        # the control: document masking moves the CPU's losses (else the comparisons below would not see it)
        if train "cpu_${arch}_w${window}_plain" "$CPU" $arch packed.bin val.bin --window $window; then
            plain="cpu_${arch}_w${window}_plain"
        else plain=; fi
        for positions in continue restart; do
            run="${arch}_w${window}_$positions"
            flags=(--window $window "${DOC[@]}" --doc-positions $positions)
            train "cpu_$run" "$CPU" $arch packed.bin val.bin "${flags[@]}" || continue
            if [ -n "$plain" ]; then
                if got=$(python3 $compare compare "$tmp/$plain.log" "$tmp/cpu_$run.log" $DOC_MOVES); then
                    flunk "control: $run moves the CPU's losses" "by less than $DOC_MOVES: $got"
                else pass "control: $run moves the CPU's losses" "$got"; fi
            fi
            [ "$NOGPU" = 1 ] && continue
            train "fp32_$run" "$GPU32" $arch packed.bin val.bin "${flags[@]}" &&
                close "$run fp32 GPU = CPU" "cpu_$run" "fp32_$run" $FP32_RTOL
            train "bf16_$run" "$GPU" $arch packed.bin val.bin "${flags[@]}" --deterministic 1 &&
                close "$run bf16 GPU = CPU" "cpu_$run" "bf16_$run" $BF16_RTOL
            train "bf16_${run}_eager" "$GPU" $arch packed.bin val.bin "${flags[@]}" --deterministic 1 --graph 0 &&
                same "$run --graph 0 = --graph 1" "bf16_$run" "bf16_${run}_eager"
        done
    done
done
[ "$NOGPU" = 1 ] && { echo "$passed passed, $failed failed (NOGPU=1: the CPU side only)"; [ $failed = 0 ]; exit; }

# The fast backward (bf16 without --deterministic: dQ by reductions) against the CPU: on sm_90a the wgmma
# DOC kernel where attention_hopper_backward_takes (HD 64, T a multiple of 4), the mma.sync pair for the
# other shapes (T 250; HD 128), elsewhere the mma.sync pair throughout.
MODEL[llama128]="llama:L2,C256,H2,KV1,V512,untied"
for case in "llama 256" "llama 250" "llama128 256"; do
    read -r arch T <<<"$case"
    run="fast_${arch}_T$T"
    flags=("${DOC[@]}" --doc-positions restart --seq "$T" --total-batch $((2 * T)))
    train "cpu_$run" "$CPU" "$arch" packed.bin val.bin "${flags[@]}" &&
        train "bf16_$run" "$GPU" "$arch" packed.bin val.bin "${flags[@]}" &&
        close "$run bf16 GPU, dQ by reductions = CPU" "cpu_$run" "bf16_$run" $BF16_RTOL
done

# One document a row. FP32 build: the simple kernels' DOC instantiation does the unmasked one's arithmetic,
# bit for bit. bf16 build: the same on a GPU without the Hopper kernels; on sm_90 (an sm_90a build) the
# forwards are the wgmma kernel's DOC and plain instantiations, so there within BF16_RTOL.
hopper=0
[ "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1)" = 9.0 ] && hopper=1
for arch in gpt2 llama; do
    for build in fp32 bf16; do
        bin=$GPU; [ $build = fp32 ] && bin=$GPU32
        plain="onedoc_${arch}_${build}_plain"
        train $plain "$bin" $arch onedoc.bin onedoc_val.bin --deterministic 1 || continue
        for positions in continue restart; do
            run="onedoc_${arch}_${build}_$positions"
            train $run "$bin" $arch onedoc.bin onedoc_val.bin --deterministic 1 "${DOC[@]}" --doc-positions $positions ||
                continue
            what="$arch $build one document a row, --doc-mask 1 ($positions) = --doc-mask 0"
            if [ $build = bf16 ] && [ $hopper = 1 ]; then close "$what (Hopper: within BF16_RTOL)" $plain $run $BF16_RTOL
            else same "$what" $plain $run; fi
        done
    done
done

if "$GPU" --init "${MODEL[gpt2]}" --train "$tmp/packed.bin" "${COMMON[@]}" "${DOC[@]}" --fp8 1 >"$tmp/fp8.out" 2>&1; then
    flunk "--doc-mask 1 with --fp8 1" "it trained"
elif line=$(grep -m 1 -F -- "--doc-mask 1: not with --fp8 1" "$tmp/fp8.out"); then
    pass "--doc-mask 1 with --fp8 1 is refused" "$line"
else flunk "--doc-mask 1 with --fp8 1" "not the expected message: $(tail -n 1 "$tmp/fp8.out")"; fi

echo "$passed passed, $failed failed"
[ $failed = 0 ]
