#!/usr/bin/env bash
# The main job: prepare tiny Shakespeare, build, train a small GPT-2, print samples and the best
# validation loss. On a machine with a GPU (nvidia-smi -L lists one) and nvcc: the GPT-2 124M shape
# with build/train_gpt2cu; otherwise a 2-layer GPT-2 with the CPU reference trainer (only that
# binary is built). Without network, set LLMC_OFFLINE_DATA to a folder holding tinyshakespeare.txt
# and gpt2.tiktoken. Extra arguments go to the trainer (e.g. --steps 50). Each run replaces the
# previous one's checkpoints and log in out/quickstart: the trainer deletes them (--overwrite 1)
# only after it has checked every flag, so a misspelled flag deletes nothing.
#
# Usage: scripts/quickstart.sh [--help] [TRAINER FLAGS...]   (the flags: build/train_gpt2_cpu --help)
set -euo pipefail
for arg in "$@"; do
    if [ "$arg" = --help ] || [ "$arg" = -h ]; then
        sed -n '2,/^# Usage/p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
    fi
done
cd "$(dirname "$0")/.."
TRAINER=build/train_gpt2_cpu
if nvidia-smi -L >/dev/null 2>&1; then
    if command -v "${NVCC:-nvcc}" >/dev/null; then
        TRAINER=build/train_gpt2cu
    else
        echo "quickstart: a GPU is present but ${NVCC:-nvcc} is not on PATH, so the CPU trainer runs"
    fi
fi
python3 scripts/data/tinyshakespeare.py
make "$TRAINER"
DATA=data/tinyshakespeare
OUT=out/quickstart
COMMON=(--train "$DATA/tiny_shakespeare_train.bin" --val "$DATA/tiny_shakespeare_val.bin"
        --tokenizer data/gpt2_tokenizer.bin --out-dir "$OUT" --log "$OUT/log.txt" --overwrite 1)
if [ "$TRAINER" = build/train_gpt2cu ]; then
    # GPT-2 124M from scratch, ~20 s on an H200. The training split is 305K tokens, so 192 steps of
    # 16K tokens are 10 epochs. Measured on an H200 (each a full cosine schedule, val loss at the end):
    # 96 steps 5.90, 128 steps 5.72, 160 steps 5.53, 192 steps 5.43 (its best, 5.44 at step 176);
    # 400 steps memorize the text (5.33 at step 200, then up to 6.02). The 32K-token val split holds
    # one window of 16x1024+1 tokens, so one validation batch is all of it.
    "$TRAINER" "${COMMON[@]}" --init d12 --batch 16 --seq 1024 --steps 192 --lr 6e-4 --warmup 16 \
        --val-every 16 --val-steps 1 --sample-every 64 --gen-tokens 128 --temperature 0.8 "$@"
else
    # 2 layers, 128 channels: most of the work is the 50257-token output layer, so a narrow model
    # sees the most text per second. 120 steps of 1K tokens (~2 CPU-minutes) reach a val loss near
    # 6.0 (lr 4e-3 learned slower; d3 and d4 learn more per token but cost 1.6x and 2.3x as much).
    # Sampling at temperature 0.8 keeps such a small model to its likelier, more Shakespearean words.
    "$TRAINER" "${COMMON[@]}" --init d2 --batch 16 --seq 64 --steps 120 --lr 3e-3 --warmup 10 \
        --val-every 40 --val-steps 8 --sample-every 60 --gen-tokens 64 --temperature 0.8 "$@"
fi
python3 scripts/plot_log.py --summary "$OUT/log.txt"   # best val loss of the run, from the trainer's log
echo "log: $OUT/log.txt   plot: python3 scripts/plot_log.py $OUT/log.txt"
