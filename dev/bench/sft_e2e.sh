#!/usr/bin/env bash
# The fine-tuning path end to end, larger than tests/python/test_sft_e2e.py (whose main() it runs): a
# character tokenizer with a Jinja chat template, N synthetic chats (4 letters -> their successors),
# scripts/data/chat.py's loss-masked shards and an unmasked copy, a fresh Llama fine-tuned on each by
# TRAINER, scripts/export_hf.py, then transformers' apply_chat_template + greedy generate on 200 held-out
# prompts. Prints both runs' train and val loss curves and the held-out accuracies.
# Usage: dev/bench/sft_e2e.sh [more flags of the test's main(): --seed N, --lr X, --work DIR, ...]
# Env: TRAINER [build/train_gpt2_cpu], N [20000] conversations, STEPS [3000], BATCH [16], SEQ [64],
#      MODEL [llama:L2,C64,H8,V41,theta30; for train_gpt2cu, whose heads are 64 or 128 wide:
#      llama:L2,C256,H4,V41,theta30], THREADS [the cores].
# Every trainer runs with --doc-mask 1 --doc-positions restart (the GPU trainer's bf16 and FP32 builds
# too; not with --fp8 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
TRAINER=${TRAINER:-build/train_gpt2_cpu}
DOC_MASK=1 MODEL_DEFAULT=llama:L2,C64,H8,V41,theta30
[[ $(basename "$TRAINER") == train_gpt2_cpu* ]] || MODEL_DEFAULT=llama:L2,C256,H4,V41,theta30
exec python3 tests/python/test_sft_e2e.py --trainer "$TRAINER" --doc-mask "$DOC_MASK" \
    --conversations "${N:-20000}" --steps "${STEPS:-3000}" --batch "${BATCH:-16}" --seq "${SEQ:-64}" \
    --model "${MODEL:-$MODEL_DEFAULT}" --threads "${THREADS:-$(nproc)}" "$@"
