#!/usr/bin/env bash
# The main job on its embedded default: prepare tiny Shakespeare, build, train a small GPT-2 and
# print samples. Uses the GPU trainer when a GPU is present, else the CPU reference trainer.
# Offline machines: set LLMC_OFFLINE_DATA to a folder holding tinyshakespeare.txt and
# gpt2.tiktoken (the data step falls back to it when the download fails).
# Extra arguments are passed to the trainer (e.g. --steps 50).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${LLMC_OFFLINE_DATA:-}" ] && [ -d ../shared/data ]; then export LLMC_OFFLINE_DATA=$(cd ../shared/data && pwd); fi
python3 scripts/data/tinyshakespeare.py
make -j"$(nproc)" all
DATA=data/tinyshakespeare
COMMON=(--train "$DATA/tiny_shakespeare_train.bin" --val "$DATA/tiny_shakespeare_val.bin"
        --tokenizer data/gpt2_tokenizer.bin --out-dir out/quickstart --log out/quickstart/log.txt)
mkdir -p out/quickstart
if [ -x build/train_gpt2cu ] && nvidia-smi -L >/dev/null 2>&1; then
    # GPT-2 124M shape from scratch: ~1 minute on an H100/H200
    build/train_gpt2cu "${COMMON[@]}" --init d12 --batch 16 --seq 1024 --steps 400 --lr 6e-4 --warmup 40 \
        --val-every 100 --sample-every 200 --gen-tokens 128 "$@"
else
    # a 4-layer, 256-channel GPT-2 on the CPU: a few minutes on 2 cores
    build/train_gpt2_cpu "${COMMON[@]}" --init d4 --batch 8 --seq 64 --steps 200 --lr 1e-3 --warmup 20 \
        --val-every 50 --val-steps 5 --sample-every 100 --gen-tokens 64 "$@"
fi
echo "log: out/quickstart/log.txt   plot: python3 scripts/plot_log.py out/quickstart/log.txt"
