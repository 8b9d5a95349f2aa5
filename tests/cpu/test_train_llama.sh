#!/usr/bin/env bash
# The CPU trainer trains a Llama-style model from scratch (--init llama:...): on a token stream where
# each token determines the next (a fixed cycle through a 64-token vocabulary), a fresh tiny model
# starts at the uniform loss ln 64 = 4.16 and must get below 1.0 in 40 steps (it reaches ~0.35; a
# model that cannot use its context, e.g. broken attention, stays near 4.16). Then a run resumed
# from its step-20 checkpoint must end bit-identical to the uninterrupted one (model.bin and
# state.bin: the optimizer state of a Llama layout round-trips through the checkpoint).
# Prints one line per case; exits non-zero if any case fails. About a second.
cd "$(dirname "$0")/../.." || exit 1
TRAIN=${TRAIN:-build/train_gpt2_cpu}
[ -x "$TRAIN" ] || { echo "test_train_llama: $TRAIN is missing, run make first"; exit 1; }
export OMP_NUM_THREADS=1  # tiny model: one thread is faster, and steadier on a loaded machine
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 - "$tmp" <<'PY' || { echo "test_train_llama: could not create the token shard"; exit 1; }
import sys
import numpy as np
sys.path.insert(0, "scripts")
import llmc_formats as fmt
cycle = np.random.default_rng(0).permutation(64)
fmt.write_shard(f"{sys.argv[1]}/cycle.bin", np.tile(cycle, 200), 64)
PY

ok=0; bad=0
pass() { ok=$((ok + 1)); echo "ok   $1"; }
flunk() { bad=$((bad + 1)); echo "BAD  $1: $2"; }
RUN=(--train "$tmp/cycle.bin" --init llama:L2,C32,H4,KV2,V64 --max-seq 16 --batch 4 --seq 16 --steps 40 --lr 1e-2
     --warmup 5 --val-every 0 --ckpt-every 20)
loss_at() { awk -v s="$1" '$1 == "step" && $2 == s && $3 == "train_loss" { print $4 }' "$2"; }

name="a fresh Llama model learns the cycle (loss 4.16 -> below 1.0 in 40 steps)"
if ! "$TRAIN" "${RUN[@]}" --out-dir "$tmp/a" --log "$tmp/a.log" >"$tmp/a.out" 2>&1; then
    flunk "$name" "exit $?: $(tail -n 1 "$tmp/a.out")"
else
    first=$(loss_at 1 "$tmp/a.log"); last=$(loss_at 40 "$tmp/a.log")
    if awk -v f="$first" -v l="$last" 'BEGIN { exit !(f > 3.9 && f < 4.4 && l < 1.0) }'; then
        pass "$name: step 1 $first, step 40 $last"
    else flunk "$name" "step 1 $first, step 40 $last"; fi
fi

name="resumed from step 20, it ends bit-identical to the uninterrupted run"
mkdir -p "$tmp/b" && cp -r "$tmp/a/step_00000020" "$tmp/b/"
if ! "$TRAIN" "${RUN[@]}" --resume "$tmp/b" >"$tmp/b.out" 2>&1; then flunk "$name" "exit $?: $(tail -n 1 "$tmp/b.out")"
elif ! cmp -s "$tmp/a/step_00000040/model.bin" "$tmp/b/step_00000040/model.bin" ||
     ! cmp -s "$tmp/a/step_00000040/state.bin" "$tmp/b/step_00000040/state.bin"; then
    flunk "$name" "the step-40 checkpoints differ"
else pass "$name"; fi

echo "test_train_llama: $ok ok, $bad failed"
[ $bad -eq 0 ]
