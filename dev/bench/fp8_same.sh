#!/usr/bin/env bash
# --fp8-fused 0 against 1 (issue 18: the fused casts against the separate passes), B=32 T=1024, 8 steps,
# --deterministic 1, --fp8 1 --fp8-scaling delayed: a Llama-style L6 (no biases) must train bit for bit
# the same (log lines and final model.bin: the attention's FP8 epilogue, the fused dY and X casts
# against the separate ones); GPT-2 d6 with every logged loss within 1e-3 relative (the separate casts'
# bias gradients come from bias_backward, whose row chunks and order are not the fused casts' (llmc/
# fp8_fused.cuh): the same sums in another fp32 order). Used by dev/bench/fp8_speed.sh
# and dev/bench/fp8_dqcast.sh.
#   dev/bench/fp8_same.sh LOGDIR [TRAINER]    prints one line "STATUS<TAB>DETAIL", exits 0 on a pass
cd "$(dirname "$0")/../.." || exit 1
LOGS=${1:?usage: dev/bench/fp8_same.sh LOGDIR [TRAINER]}
TRAIN=${2:-build/train_gpt2cu}
mkdir -p "$LOGS" || exit 1
t1=$SECONDS st=0 why=""
for m in gpt2 llama; do
    init=d6; [ $m = llama ] && init=llama:L6,C384,H6,KV2,F1024,V50304
    for fused in 0 1; do
        rm -rf "${LOGS:?}/$m$fused"
        timeout 120 "$TRAIN" --init $init --random-data 1 --batch 32 --seq 1024 --steps 8 --seed 7 --lr 1e-3 --warmup 2 \
            --deterministic 1 --val-every 0 --fp8 1 --fp8-scaling delayed --fp8-fused $fused \
            --out-dir "$LOGS/$m$fused" --log "$LOGS/$m$fused.log" --overwrite 1 > "$LOGS/$m$fused.txt" 2>&1 ||
            { st=1; why="$why $m --fp8-fused $fused failed: $(tail -1 "$LOGS/$m$fused.txt")"; }
    done
done
if [ $st -eq 0 ]; then
    cols='$1 == "step" && $3 == "train_loss" { print $1, $2, $3, $4, $5, $6, $7, $8 }'  # not ms, tok_s
    a=$(awk "$cols" "$LOGS/llama0.log"); b=$(awk "$cols" "$LOGS/llama1.log")
    if [ -z "$a" ] || [ "$a" != "$b" ]; then
        st=1; why="llama log lines differ: $(diff <(echo "$a") <(echo "$b") | grep '^[<>]' | head -2 | tr '\n' ' ')"
    else
        ca=$(ls -d "$LOGS/llama0"/step_* | tail -1); cb=$(ls -d "$LOGS/llama1"/step_* | tail -1)
        if cmp -s "$ca/model.bin" "$cb/model.bin"; then why="llama bit for bit"
        else st=1; why="llama log lines equal, final model.bin differs"; fi
    fi
    worst=$(paste <(awk '$1 == "step" && $3 == "train_loss" { print $4 }' "$LOGS/gpt20.log") \
                  <(awk '$1 == "step" && $3 == "train_loss" { print $4 }' "$LOGS/gpt21.log") |
            awk '{ d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d; n++ } END { if (n < 8) print "none"; else printf "%.2e", w }')
    if [ "$worst" = none ] || awk -v w="$worst" 'BEGIN { exit !(w > 1e-3) }'; then
        st=1; why="$why; gpt2 losses: max rel difference $worst (want <= 1e-3 over 8 steps)"
    else why="$why; gpt2 max rel loss difference $worst"; fi
fi
printf '%s\t%s\n' "$st" "${why# }, $((SECONDS - t1)) s"
exit $st
