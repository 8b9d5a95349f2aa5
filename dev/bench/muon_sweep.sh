#!/usr/bin/env bash
# Muon against AdamW over about one epoch: a small lr sweep of each optimizer, every run on the same tokens in
# the same order (one SEED) with the same schedule shape, then the question: does the best Muon run reach the
# best AdamW run's final val loss in at most 0.8x its tokens, and what is that in wall time (Muon's step costs more)?
#   dev/bench/muon_sweep.sh CORPUS [OUT]
# CORPUS: a folder of token shards (*val_*.bin = validation, *train_*.bin), or a .jsonl[.xz] of {"text": ...}
# documents, sharded into OUT/data by scripts/data/fineweb.py (--shard-size SHARD_SIZE, default 1000000; the
# first shard is validation; GPT-2 BPE ranks from RANKS, default gpt2.tiktoken beside CORPUS if there).
# Env: TRAINER (build/train_gpt2cu; build/train_gpt2_cpu for a smoke test), MODEL (d12), B (64), T (1024),
# STEPS (one epoch of B*T-token steps: the sum over the train shards of (tokens - 1) / (B*T), as --steps -1 counts),
# WARMUP (20), SCHEDULE (cosine), VAL_EVERY (20), VAL_STEPS (8), SEED (1337), ADAMW_LRS ("3e-4 6e-4 1.2e-3 2.4e-3"),
# MUON_LRS ("0.01 0.02 0.04 0.08": --muon-lr), MUON_ADAMW_LR (6e-4: --lr of a Muon run's embeddings, head, norms
# and biases), EXTRA_FLAGS (appended to every run's flags).
# Prints each run's result as it ends (a run that fails is reported and left out), then the table and verdict of
# dev/muon_sweep_summary.py, and plots the losses against tokens and against training seconds into
# OUT/val_tokens.png and OUT/val_seconds.png (scripts/plot_log.py, where matplotlib imports).
# Files in OUT (default a new /tmp/muon_sweep.XXXXXX): <optimizer>_lr<lr>.log (the --log), .txt (stdout and
# stderr), .cmd (the command line), summary.md. The GPU sweep, d12 on one GPU:
#   dev/bench/muon_sweep.sh data/fineweb10B   (a folder of shards, or a .jsonl[.xz] to shard first)
set -euo pipefail
cd "$(dirname "$0")/../.."
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }  # the comment above
case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    "") usage >&2; exit 2 ;;
esac
[ $# -le 2 ] || { echo "dev/bench/muon_sweep.sh CORPUS [OUT]: $# arguments given" >&2; exit 2; }
CORPUS=$1 OUT=${2:-$(mktemp -d /tmp/muon_sweep.XXXXXX)}
TRAINER=${TRAINER:-build/train_gpt2cu} MODEL=${MODEL:-d12} B=${B:-64} T=${T:-1024} WARMUP=${WARMUP:-20}
SCHEDULE=${SCHEDULE:-cosine} VAL_EVERY=${VAL_EVERY:-20} VAL_STEPS=${VAL_STEPS:-8} SEED=${SEED:-1337}
ADAMW_LRS=${ADAMW_LRS:-3e-4 6e-4 1.2e-3 2.4e-3} MUON_LRS=${MUON_LRS:-0.01 0.02 0.04 0.08}
MUON_ADAMW_LR=${MUON_ADAMW_LR:-6e-4} EXTRA_FLAGS=${EXTRA_FLAGS:-}
[ -x "$TRAINER" ] || { echo "TRAINER=$TRAINER: not an executable (make it first)" >&2; exit 1; }
mkdir -p "$OUT"

# the shards' glob patterns (dev/bench/corpus_shards.sh: CORPUS's own, or its documents sharded once into OUT)
patterns=$(dev/bench/corpus_shards.sh "$CORPUS" "$OUT")
read -r TRAIN VAL <<< "$patterns"
# one epoch, from the shard headers (slot 2: num_tokens; docs/formats.md)
STEPS=${STEPS:-$(PYTHONPATH=scripts python3 -c 'import glob, sys, llmc_formats as f
bt = int(sys.argv[1]) * int(sys.argv[2])
print(sum((int(f.read_header(p, f.MAGIC_SHARD)[0][2]) - 1) // bt for p in glob.glob(sys.argv[3])))' "$B" "$T" "$TRAIN")}
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || { echo "STEPS=$STEPS: expected a positive number of steps" >&2; exit 1; }
echo "data: train $TRAIN, val $VAL; $MODEL B=$B T=$T, $STEPS steps of B*T tokens; $SCHEDULE, warmup $WARMUP"
echo "adamw lrs: $ADAMW_LRS; muon lrs: $MUON_LRS (its adamw groups at lr $MUON_ADAMW_LR); logs in $OUT"
echo "trainer: $TRAINER $EXTRA_FLAGS"

logs=()
# sweep_run NAME FLAGS...: one training run; its result line, or a FAILED line that leaves it out of the summary
sweep_run() {
    local name=$1; shift
    # shellcheck disable=SC2206
    local cmd=("$TRAINER" --init "$MODEL" --batch "$B" --seq "$T" --steps "$STEPS" --warmup "$WARMUP"
               --schedule "$SCHEDULE" --val-every "$VAL_EVERY" --val-steps "$VAL_STEPS" --seed "$SEED"
               --train "$TRAIN" --val "$VAL" --log "$OUT/$name.log" "$@" $EXTRA_FLAGS)
    echo "${cmd[*]}" > "$OUT/$name.cmd"
    local t0=$SECONDS
    if ! "${cmd[@]}" > "$OUT/$name.txt" 2>&1; then
        echo "[$name] FAILED after $((SECONDS - t0)) s: $(tail -n 1 "$OUT/$name.txt")"
        return
    fi
    echo "[$name] $(python3 scripts/plot_log.py --summary "$OUT/$name.log"); $((SECONDS - t0)) s"
    logs+=("$OUT/$name.log")
}
for lr in $ADAMW_LRS; do sweep_run "adamw_lr$lr" --lr "$lr"; done
for lr in $MUON_LRS; do sweep_run "muon_lr$lr" --optimizer muon --muon-lr "$lr" --lr "$MUON_ADAMW_LR"; done

[ ${#logs[@]} -gt 0 ] || { echo "no run finished: see $OUT/*.txt" >&2; exit 1; }
echo "== summary (also in $OUT/summary.md)"
python3 dev/muon_sweep_summary.py "${logs[@]}" | tee "$OUT/summary.md"
if python3 -c "import matplotlib" 2>/dev/null; then
    for x in tokens seconds; do
        python3 scripts/plot_log.py "${logs[@]}" --x "$x" --smooth 20 -o "$OUT/val_$x.png" \
            --title "$MODEL: loss against $x"
    done
else
    echo "plots skipped: no matplotlib here (later: python3 scripts/plot_log.py $OUT/*.log --x tokens)"
fi
