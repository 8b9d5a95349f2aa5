#!/usr/bin/env bash
# Delayed scaling's FP8 casts fused into their producers (the trainer's path) against the separate
# passes, through the lab's switch (dev/cuda/build/profile_gpt2 --fp8-fused 1 against 0; the trainer
# ships only the fused path): random tokens, B=32 T=1024, 8 steps, --deterministic 1, --fp8 1
# --fp8-scaling delayed. A Llama-style L6 (no biases) must train bit for bit the same (every step's
# loss and the final parameters: the attention's FP8 epilogue, the fused dY and X casts against the
# separate ones); GPT-2 d6 with every loss within 1e-3 relative (the separate casts' bias gradients
# come from bias_backward, whose row chunks and order are not the fused casts' (llmc/fp8_fused.cuh):
# the same sums in another fp32 order).
#   dev/bench/fp8_same.sh LOGDIR [PROFILER]    prints one line "STATUS<TAB>DETAIL", exits 0 on a pass
# PROFILER defaults to dev/cuda/build/profile_gpt2 (make -C dev/cuda builds it).
cd "$(dirname "$0")/../.." || exit 1
LOGS=${1:?usage: dev/bench/fp8_same.sh LOGDIR [PROFILER]}
PROFILE=${2:-dev/cuda/build/profile_gpt2}
mkdir -p "$LOGS" || exit 1
t1=$SECONDS st=0 why=""
for m in gpt2 llama; do
    init=d6; [ $m = llama ] && init=llama:L6,C384,H6,KV2,F1024,V50304
    for fused in 0 1; do
        rm -f "$LOGS/$m$fused.bin"
        # 2 warm-up steps, 1 more once CUPTI is on, then --steps 5: 8 steps
        timeout 120 "$PROFILE" --model $init --batch 32 --seq 1024 --steps 5 --deterministic 1 --fp8 1 \
            --fp8-scaling delayed --fp8-fused $fused --write-model "$LOGS/$m$fused.bin" > "$LOGS/$m$fused.txt" 2>&1 ||
            { st=1; why="$why $m --fp8-fused $fused failed: $(tail -1 "$LOGS/$m$fused.txt")"; }
    done
done
losses() { awk '$1 == "losses:" { for (i = 2; i <= NF; i++) print $i }' "$1"; }
if [ $st -eq 0 ]; then
    a=$(losses "$LOGS/llama0.txt"); b=$(losses "$LOGS/llama1.txt")
    if [ -z "$a" ] || [ "$a" != "$b" ]; then
        st=1; why="llama losses differ: $(diff <(echo "$a") <(echo "$b") | grep '^[<>]' | head -2 | tr '\n' ' ')"
    elif cmp -s "$LOGS/llama0.bin" "$LOGS/llama1.bin"; then why="llama bit for bit"
    else st=1; why="llama losses equal, final parameters differ"; fi
    worst=$(paste <(losses "$LOGS/gpt20.txt") <(losses "$LOGS/gpt21.txt") |
            awk '{ d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d; n++ } END { if (n < 8) print "none"; else printf "%.2e", w }')
    if [ "$worst" = none ] || awk -v w="$worst" 'BEGIN { exit !(w > 1e-3) }'; then
        st=1; why="$why; gpt2 losses: max rel difference $worst (want <= 1e-3 over 8 steps)"
    else why="$why; gpt2 max rel loss difference $worst"; fi
fi
printf '%s\t%s\n' "$st" "${why# }, $((SECONDS - t1)) s"
exit $st
