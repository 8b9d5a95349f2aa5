#!/usr/bin/env bash
# The token shards of a corpus, for the benches that train on one (par_trainer_parity.sh, muon_sweep.sh):
#   dev/bench/corpus_shards.sh CORPUS OUT
# CORPUS: a folder of token shards (*val_*.bin = validation, *train_*.bin), or a .jsonl[.xz] of {"text": ...}
# documents, sharded once into OUT/data/fineweb by scripts/data/fineweb.py (--shard-size SHARD_SIZE, default
# 1000000; the first shard is validation; GPT-2 BPE ranks from RANKS, default gpt2.tiktoken beside CORPUS if
# there; a rerun reuses the shards; its output in OUT/fineweb.txt). Prints one line: the trainers' glob
# patterns of the train and the val shards, e.g. `OUT/data/fineweb/fineweb_train_*.bin OUT/data/fineweb/fineweb_val_*.bin`.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 2 ] || { echo "usage: dev/bench/corpus_shards.sh CORPUS OUT" >&2; exit 2; }
CORPUS=$1 OUT=$2
DATA=$CORPUS
if [ ! -d "$CORPUS" ]; then
    [ -f "$CORPUS" ] || { echo "CORPUS=$CORPUS: no such file or folder" >&2; exit 1; }
    DATA=$OUT/data/fineweb
    if ! compgen -G "$DATA/*train_*.bin" > /dev/null; then
        mkdir -p "$OUT"
        docs=$CORPUS ranks=${RANKS:-$(dirname "$CORPUS")/gpt2.tiktoken} ranks_flag=()
        [ -f "$ranks" ] && ranks_flag=(--ranks "$ranks")
        [ "${CORPUS%.xz}" = "$CORPUS" ] || { docs=$OUT/corpus.jsonl; xz -dc "$CORPUS" > "$docs"; }
        python3 scripts/data/fineweb.py --source "$docs" --out-dir "$OUT/data" --shard-size "${SHARD_SIZE:-1000000}" \
            "${ranks_flag[@]}" > "$OUT/fineweb.txt" 2>&1 || { tail -n 5 "$OUT/fineweb.txt" >&2; exit 1; }
    fi
fi
train=$(compgen -G "$DATA/*train_*.bin" | head -n 1 || true) val=$(compgen -G "$DATA/*val_*.bin" | head -n 1 || true)
if [ -z "$train" ] || [ -z "$val" ]; then
    echo "CORPUS=$CORPUS: no *train_*.bin and *val_*.bin shards in $DATA" >&2; exit 1
fi
echo "${train%train_*}train_*.bin ${val%val_*}val_*.bin"
