#!/usr/bin/env bash
# Two builds of the same programs timed side by side on this GPU, runs alternating A, B, A, B, so
# that clock and thermal drift fall on both. For checking that a change keeps the speed: the GPT-2
# 124M and Llama 114M training steps in bf16 and FP8 (--fp8 1), and generate's decode tok/s at B = 1, 8
# and 64 for both shapes (64-token prompts, 256 new greedy tokens, CUDA graph).
# Usage: dev/bench/ab_speed.sh DIR_A DIR_B   (each holding train_gpt2cu and generate)
# Env: ROUNDS [2] (runs of each case per build), STEPS [30] (training steps a run; the trainer's
#      BENCH line is its median step after warm-up), LOGS [a new temp dir], QUICK=1 (only the GPT-2
#      cases: the bf16 step, generate at B = 1 and 8), ONLY (an extended regex: only the cases whose
#      printed name, e.g. "gen llama:... --batch 8", matches it).
# Prints one line per case: the median over rounds of each build, and B's speed over A's.
set -uo pipefail
if [[ $# -ne 2 || ! -d $1 || ! -d $2 ]]; then
    echo "usage: $0 DIR_A DIR_B (build folders with train_gpt2cu and generate)" >&2; exit 1
fi
A=$1 B=$2 ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-30}
LOGS=${LOGS:-$(mktemp -d /tmp/ab_speed.XXXXXX)}; mkdir -p "$LOGS"
LLAMA114=llama:L12,C768,H12,KV4,F2048,V50304
TRAIN_CASES=("d12" "d12 --fp8 1" "$LLAMA114" "$LLAMA114 --fp8 1")
GEN_CASES=("d12 --batch 1" "d12 --batch 8" "d12 --batch 64" "$LLAMA114 --batch 1" "$LLAMA114 --batch 8"
           "$LLAMA114 --batch 64")
if [[ ${QUICK:-0} == 1 ]]; then TRAIN_CASES=("d12"); GEN_CASES=("d12 --batch 1" "d12 --batch 8"); fi

# one_run SIDE KIND CASE -> prints the figure (ms a step, or tok/s), empty on failure
one_run() {
    local dir=$1 kind=$2 case=$3 log
    log="$LOGS/$(basename "$dir")_${kind}_$(tr -c 'a-zA-Z0-9' _ <<<"$case").log"
    set -- $case; local model=$1; shift
    if [[ $kind == train ]]; then
        "$dir/train_gpt2cu" --init "$model" --random-data 1 --val-every 0 --batch 64 --seq 1024 \
            --steps "$STEPS" "$@" >>"$log" 2>&1
        grep '^BENCH ' "$log" | tail -n 1 | sed -n 's/.* ms=\([^ ]*\).*/\1/p'
    else
        "$dir/generate" --init "$model" --bench 1 --bench-prompt 64 --max-new 256 --temperature 0 "$@" \
            >>"$log" 2>&1
        grep 'BENCH_GEN' "$log" | tail -n 1 | sed -n 's/.* tok_s=\([^ ]*\).*/\1/p'
    fi
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

status=0
printf '%-44s | %10s | %10s | %s\n' case "A" "B" "B speed / A"
for kind in train gen; do
    if [[ $kind == train ]]; then cases=("${TRAIN_CASES[@]}"); unit=ms; else cases=("${GEN_CASES[@]}"); unit=tok/s; fi
    for c in "${cases[@]}"; do
        [[ -n ${ONLY:-} ]] && ! grep -qE -- "$ONLY" <<<"$kind $c" && continue
        fa=(); fb=()
        for ((r = 0; r < ROUNDS; r++)); do
            x=$(one_run "$A" $kind "$c"); [[ -n $x ]] && fa+=("$x") || status=1
            x=$(one_run "$B" $kind "$c"); [[ -n $x ]] && fb+=("$x") || status=1
        done
        ma=$(printf '%s\n' "${fa[@]}" | median); mb=$(printf '%s\n' "${fb[@]}" | median)
        # speed: for ms a step lower is faster (A/B), for tok/s higher is faster (B/A)
        ratio=$(awk -v a="$ma" -v b="$mb" -v u="$unit" 'BEGIN { if (a == "" || b == "") print "failed";
            else printf "%.4f", (u == "ms" ? a / b : b / a) }')
        printf '%-44s | %10s | %10s | %s\n' "$kind $c ($unit)" "$ma" "$mb" "$ratio"
    done
done
echo "logs: $LOGS"
exit $status
