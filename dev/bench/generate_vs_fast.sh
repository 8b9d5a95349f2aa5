#!/usr/bin/env bash
# Greedy decode speed on this GPU: ours (generate --bench 1, CUDA graph) against the strongest
# PyTorch decoder a user writes (scripts/bench_generate_fast.py: gpt-fast's recipe, compiled step
# with CUDA graphs), GPT-2 124M (d12) and the Llama 114M shape, 64-token prompts, 256 new tokens,
# one run after another. Builds nothing; needs build/generate (make build/generate) and python3
# with torch. Prints one row per (shape, B): both tok/s (B / decode seconds a token) and ours/fast;
# a run without its figure shows - and makes the exit status 1.
# Env: GEN [build/generate], PYTHON [python3], ARCHS ["gpt2 llama"], BATCHES ["1 2 4 8 16 64"],
#      PROMPT [64], NEW [256], LOGS [a new temp dir] (each run's full output).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
GEN=${GEN:-build/generate} PYTHON=${PYTHON:-python3} BATCHES=${BATCHES:-1 2 4 8 16 64}
PROMPT=${PROMPT:-64} NEW=${NEW:-256}
LOGS=${LOGS:-$(mktemp -d /tmp/generate_vs_fast.XXXXXX)}; mkdir -p "$LOGS" || exit 1
[ -x "$GEN" ] || { echo "error: $GEN is missing (make build/generate)" >&2; exit 1; }
declare -A INIT=([gpt2]=d12 [llama]=llama:L12,C768,H12,KV4,F2048,V50304)  # bench_generate_fast --arch -> our --init

tok_s() { sed -n 's/.* tok_s=\([^ ]*\).*/\1/p' | tail -n 1; }  # the last line's tok_s, empty if none
rows=(); bad=0
for arch in ${ARCHS:-gpt2 llama}; do
    init=${INIT[$arch]:-}
    [ -n "$init" ] || { echo "error: ARCHS: unknown shape '$arch' (gpt2, llama)" >&2; exit 1; }
    echo "==== $arch: ours" >&2
    declare -A ours=()
    for b in $BATCHES; do
        "$GEN" --init "$init" --bench 1 --bench-prompt "$PROMPT" --max-new "$NEW" --temperature 0 --batch "$b" \
            > "$LOGS/ours_${arch}_B$b.log" 2>&1
        ours[$b]=$(grep '^BENCH_GEN' "$LOGS/ours_${arch}_B$b.log" | tok_s)
    done
    echo "==== $arch: fast (compiles once per batch size)" >&2
    "$PYTHON" scripts/bench_generate_fast.py --arch "$arch" --batch $BATCHES --prompt "$PROMPT" --new "$NEW" \
        > "$LOGS/fast_$arch.log" 2>&1
    for b in $BATCHES; do
        fast=$(grep "^BENCH_FAST .* B=$b " "$LOGS/fast_$arch.log" | tok_s)
        ratio=$(awk -v o="${ours[$b]}" -v f="$fast" 'BEGIN { print (o > 0 && f > 0) ? sprintf("%.2f", o / f) : "-" }')
        [[ $ratio == - ]] && bad=1
        rows+=("$(printf '%-6s %4s %10s %10s %9s' "$arch" "$b" "${ours[$b]:--}" "${fast:--}" "$ratio")")
    done
    unset ours
done
printf '%-6s %4s %10s %10s %9s\n' shape B ours_tok_s fast_tok_s ours/fast
printf '%s\n' "${rows[@]}"
echo "logs: $LOGS"
exit $bad
