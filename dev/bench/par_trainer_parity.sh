#!/usr/bin/env bash
# Trainer parity: our trainer (build/train_gpt2_cpu, or the GPU one) against the PyTorch reference
# (scripts/train_gpt2.py, through dev/par_ref_train.py, which adds the gradient norm per step and llmc's
# data order) over a whole run with the same flags and seeds.
#   dev/bench/par_trainer_parity.sh CORPUS [OUT]
# CORPUS: a folder of token shards (*val_*.bin = validation, *train_*.bin), or a .jsonl[.xz] of {"text": ...}
# documents, sharded into OUT/data by scripts/data/fineweb.py (--shard-size SHARD_SIZE, default 1000000; the
# first shard is validation; GPT-2 BPE ranks from RANKS, default gpt2.tiktoken beside CORPUS if there).
# Two experiments, each table printed by dev/par_trainer_compare.py:
#   parity (PARITY=1)  seed = the first of SEEDS; both trainers start from the reference's init written to a
#                      file, and the reference reads the windows in llmc/dataloader.h's order (--order llmc):
#                      the same algorithm on the same numbers. Per-step lr, train loss, gradient norm and
#                      their differences; in fp32 on the CPU they agree to ~1e-5 when nothing differs.
#   spread (SPREAD=1)  for every seed in SEEDS, each trainer as a user runs it: its own init from --seed
#                      (ours: llmc/model_config.h's stream; the reference: torch's) and its own shuffle
#                      (ours: llmc/dataloader.h; the reference: --shuffle 1 = numpy permutations, or
#                      REF_ORDER=llmc for ours). The mean train loss over the last LAST steps and the final
#                      val loss per run, per trainer mean/sd/range, and the gap against the seed spread.
# Env: TRAINER (build/train_gpt2_cpu; build/train_gpt2cu on a GPU), REF (python3 dev/par_ref_train.py),
# MODEL (d2), B (4), T (128), STEPS (120), LR (6e-4), WARMUP (20), SCHEDULE (cosine), VAL_EVERY (20),
# VAL_STEPS (8), SEEDS ("1337 1338 1339"), LAST (20), OURS_FLAGS / REF_FLAGS (appended to each trainer's
# flags; on a GPU REF_FLAGS="--dtype bf16 --compile --device cuda"), PARALLEL (0; 1 = the two trainers of a
# pair at once, OMP_NUM_THREADS=THREADS (1) each: CPU runs on few cores), TOL (1e-4, the parity table's
# first-difference threshold). The issue's d12 comparison on one H100:
#   TRAINER=build/train_gpt2cu MODEL=d12 B=64 T=1024 STEPS=120 REF_FLAGS="--dtype bf16 --compile --device cuda" \
#       dev/bench/par_trainer_parity.sh /tmp/data/fineweb
# Logs: OUT (default a new /tmp/par_parity.XXXXXX)/{parity,seed<S>}_{ours,ref}.txt (stdout and stderr), _ours.log
# (our --log), .cmd (the command lines).
# Reading the tables: the train losses of runs with different data orders are losses on different batches, so
# only the val losses (the same first VAL_STEPS windows of the val shard for both) compare the models; the
# reference's CPU gradient norm is torch's fp32 reduction (clip_grad_norm_), ~1e-4 relative below the exact
# value for a GPT-2 wte gradient, where ours sums in double.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi
CORPUS=$1
OUT=${2:-$(mktemp -d /tmp/par_parity.XXXXXX)}
TRAINER=${TRAINER:-build/train_gpt2_cpu}
REF=${REF:-python3 dev/par_ref_train.py}
MODEL=${MODEL:-d2} B=${B:-4} T=${T:-128} STEPS=${STEPS:-120} LR=${LR:-6e-4} WARMUP=${WARMUP:-20}
SCHEDULE=${SCHEDULE:-cosine} VAL_EVERY=${VAL_EVERY:-20} VAL_STEPS=${VAL_STEPS:-8} SEEDS=${SEEDS:-1337 1338 1339}
LAST=${LAST:-20} PARITY=${PARITY:-1} SPREAD=${SPREAD:-1} PARALLEL=${PARALLEL:-0} THREADS=${THREADS:-1}
TOL=${TOL:-1e-4} REF_ORDER=${REF_ORDER:-ref}
OURS_FLAGS=${OURS_FLAGS:-} REF_FLAGS=${REF_FLAGS:-}
mkdir -p "$OUT"
[ -x "$TRAINER" ] || { echo "TRAINER=$TRAINER: not an executable (make it first)" >&2; exit 1; }

# the shards' glob patterns (dev/bench/corpus_shards.sh: CORPUS's own, or its documents sharded once into OUT)
patterns=$(dev/bench/corpus_shards.sh "$CORPUS" "$OUT")
read -r TRAIN VAL <<< "$patterns"
echo "data: train $TRAIN, val $VAL; $MODEL B=$B T=$T steps $STEPS lr $LR $SCHEDULE warmup $WARMUP; seeds $SEEDS"
echo "ours: $TRAINER $OURS_FLAGS; ref: $REF $REF_FLAGS; logs in $OUT"

SHARED=(--batch "$B" --seq "$T" --steps "$STEPS" --lr "$LR" --warmup "$WARMUP" --schedule "$SCHEDULE"
        --val-every "$VAL_EVERY" --train "$TRAIN" --val "$VAL")

# run_pair NAME SEED OURS_INIT... -- REF_MODEL...: both trainers, one after the other or at once
run_pair() {
    local name=$1 seed=$2; shift 2
    local ours_init=() ref_init=()
    while [ "$1" != "--" ]; do ours_init+=("$1"); shift; done
    shift
    ref_init=("$@")
    local ours_cmd=("$TRAINER" "${SHARED[@]}" --val-steps "$VAL_STEPS" --seed "$seed" "${ours_init[@]}"
                    --log "$OUT/${name}_ours.log" --overwrite 1)
    # shellcheck disable=SC2206
    local ref_cmd=($REF "${SHARED[@]}" --val-batches "$VAL_STEPS" --seed "$seed" --shuffle 1 "${ref_init[@]}")
    # shellcheck disable=SC2206
    ours_cmd+=($OURS_FLAGS)
    # shellcheck disable=SC2206
    ref_cmd+=($REF_FLAGS)
    echo "[$name] ${ours_cmd[*]}" > "$OUT/${name}_ours.cmd"
    echo "[$name] ${ref_cmd[*]}" > "$OUT/${name}_ref.cmd"
    local t0=$SECONDS
    if [ "$PARALLEL" = 1 ]; then
        OMP_NUM_THREADS=$THREADS "${ours_cmd[@]}" > "$OUT/${name}_ours.txt" 2>&1 & local p1=$!
        OMP_NUM_THREADS=$THREADS "${ref_cmd[@]}" > "$OUT/${name}_ref.txt" 2>&1 & local p2=$!
        wait $p1 || { tail -n 5 "$OUT/${name}_ours.txt" >&2; exit 1; }
        wait $p2 || { tail -n 5 "$OUT/${name}_ref.txt" >&2; exit 1; }
    else
        "${ours_cmd[@]}" > "$OUT/${name}_ours.txt" 2>&1 || { tail -n 5 "$OUT/${name}_ours.txt" >&2; exit 1; }
        "${ref_cmd[@]}" > "$OUT/${name}_ref.txt" 2>&1 || { tail -n 5 "$OUT/${name}_ref.txt" >&2; exit 1; }
    fi
    echo "[$name] done in $((SECONDS - t0)) s"
}

if [ "$PARITY" = 1 ]; then
    seed=${SEEDS%% *}
    python3 scripts/train_gpt2.py --model "$MODEL" --seed "$seed" --write-model "$OUT/init.bin" > /dev/null
    run_pair parity "$seed" --init "$OUT/init.bin" -- --load "$OUT/init.bin" --order llmc
    echo "== parity: same init ($OUT/init.bin, the reference's seed $seed), same data order (llmc's)"
    python3 dev/par_trainer_compare.py pair "$OUT/parity_ours.txt" "$OUT/parity_ref.txt" --ours-log "$OUT/parity_ours.log" \
        --tol "$TOL"
fi
if [ "$SPREAD" = 1 ]; then
    ours_logs=() ref_logs=()
    for seed in $SEEDS; do
        run_pair "seed$seed" "$seed" --init "$MODEL" -- --model "$MODEL" --order "$REF_ORDER"
        ours_logs+=("$OUT/seed${seed}_ours.txt")
        ref_logs+=("$OUT/seed${seed}_ref.txt")
    done
    echo "== spread: each trainer's own init and data order (reference order: $REF_ORDER), seeds $SEEDS"
    python3 dev/par_trainer_compare.py seeds --ours "${ours_logs[@]}" --ref "${ref_logs[@]}" --last "$LAST"
fi
