#!/usr/bin/env bash
# Training throughput: our CUDA trainer against PyTorch on the same shape, one after the other on
# this GPU. GPT-2 (BENCH_ARCH=gpt2): our PyTorch reference model (scripts/train_gpt2.py) eager and
# under torch.compile, and GPT-2 as a speed-minded PyTorch user writes it (nanoGPT style:
# nn.Linear blocks, SDPA, fused AdamW; scripts/bench_nanogpt.py) under torch.compile. Llama-style
# (BENCH_ARCH=llama): the same reference rows, Hugging Face transformers' LlamaForCausalLM eager and
# compiled (scripts/bench_hf.py, random init from a local config), and Llama as a speed-minded
# PyTorch user writes it (torchtitan style: nn.Linear blocks, RMSNorm, RoPE, SwiGLU, SDPA with GQA,
# fused AdamW; scripts/bench_llama.py) under torch.compile. Every run trains on random tokens and
# prints a last line
#   BENCH name=<ours|ours_fp8|eager|compile|nanogpt_compile|nanogpt_eager|hf_eager|hf_compile|titan_compile|titan_eager> ms=<median ms/step> tok_s=<tokens/s> peak_gib=<peak GPU memory>
# and this script tabulates them; the column "ours is" is ours' tok/s over each PyTorch row's, and the
# last lines compare ours (and ours_fp8) with the fastest PyTorch row. Run on a GPU machine after
# `make` (or via `make bench`).
#
# Environment (defaults in brackets):
#   BENCH_ARCH [gpt2]   gpt2 | llama
#   BENCH_MODEL [d12]   GPT-2: a dN model shape (d12 = GPT-2 124M; N layers, 64N channels, N heads)
#   BENCH_LLAMA [L12,C768,H12,KV4,F2048,V50304]   Llama: layers, channels, heads, KV heads, SwiGLU
#                       hidden width, vocab (all six, in this order; the 114M shape of docs/perf.md)
#   BENCH_B [64]        micro-batch size
#   BENCH_T [1024]      sequence length
#   BENCH_STEPS [30]    steps per run; each side discards its own warm-up steps before the median
#   BENCH_BIN [build/train_gpt2cu]   our trainer (skipped with a note when missing)
#   BENCH_FP8 [0]       1: also our trainer with --fp8 1 (the row ours_fp8; docs/numerics.md)
#   BENCH_FP8_FLAGS []  more trainer flags for the ours_fp8 row, e.g. "--fp8-head 1"
#   BENCH_TORCHAO []    GPT-2: torchao float8 recipes for the nanoGPT-style model under torch.compile,
#                       e.g. "tensorwise rowwise" (rows nanogpt_compile_float8_<recipe>; needs torchao;
#                       compared with ours_fp8, not counted as the fastest bf16 PyTorch)
#   BENCH_REF [1]       0: skip our PyTorch reference model's rows (eager, compile), e.g. to time
#                       only ours against nanogpt_compile (GPT-2) or hf_* and titan_compile (Llama)
#   BENCH_EAGER [0]     1: also the nanoGPT-style model (GPT-2) or the torchtitan-style one (Llama)
#                       without torch.compile (nanogpt_eager, titan_eager)
#   BENCH_PYTHON [python3]
#   BENCH_DEVICE [cuda]              device of the PyTorch runs (cpu: a smoke test of this script)
#   BENCH_OUT [build/bench]          full output of each run goes to BENCH_OUT/<name>.log
# Exit status: 0 when every run that was attempted printed its BENCH line.
# Usage: scripts/bench_train.sh [--help]   (no other arguments: the settings are the variables above)
if [[ $# -gt 0 ]]; then
    if [[ $# -eq 1 && ( $1 == --help || $1 == -h ) ]]; then
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"  # this header
        exit 0
    fi
    echo "error: $1: unknown argument (bench_train.sh is configured by BENCH_* variables; see --help)" >&2
    exit 1
fi
cd "$(dirname "$0")/.." || exit 1
ARCH=${BENCH_ARCH:-gpt2}
MODEL=${BENCH_MODEL:-d12}
LLAMA=${BENCH_LLAMA:-L12,C768,H12,KV4,F2048,V50304}
B=${BENCH_B:-64}
T=${BENCH_T:-1024}
STEPS=${BENCH_STEPS:-30}
FP8=${BENCH_FP8:-0}
read -ra FP8_FLAGS <<< "${BENCH_FP8_FLAGS:-}"
REF=${BENCH_REF:-1}
EAGER=${BENCH_EAGER:-0}
TORCHAO=${BENCH_TORCHAO:-}
BIN=${BENCH_BIN:-build/train_gpt2cu}
PY=${BENCH_PYTHON:-python3}
DEV=${BENCH_DEVICE:-cuda}
OUT=${BENCH_OUT:-build/bench}
for v in B T STEPS; do
    if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then echo "error: BENCH_$v='${!v}' is not a positive integer" >&2; exit 1; fi
done
for v in FP8 REF EAGER; do
    if ! [[ ${!v} == 0 || ${!v} == 1 ]]; then echo "error: BENCH_$v='${!v}': expected 0 or 1" >&2; exit 1; fi
done
case $ARCH in
    gpt2)
        OURS_INIT=$MODEL
        REF_SHAPE=(--model "$MODEL")
        NAMES=(ours eager compile nanogpt_compile)
        [[ $EAGER == 1 ]] && NAMES+=(nanogpt_eager)
        for r in $TORCHAO; do
            case $r in tensorwise|rowwise|rowwise_with_gw_hp) NAMES+=("nanogpt_compile_float8_$r") ;;
                *) echo "error: BENCH_TORCHAO: '$r' is not tensorwise, rowwise or rowwise_with_gw_hp" >&2; exit 1 ;;
            esac
        done ;;
    llama)
        if ! [[ $LLAMA =~ ^L([0-9]+),C([0-9]+),H([0-9]+),KV([0-9]+),F([0-9]+),V([0-9]+)$ ]]; then
            echo "error: BENCH_LLAMA='$LLAMA' is not L<layers>,C<channels>,H<heads>,KV<kv heads>,F<hidden>,V<vocab>" >&2
            exit 1
        fi
        OURS_INIT=llama:$LLAMA
        REF_SHAPE=(--arch llama --layers "${BASH_REMATCH[1]}" --channels "${BASH_REMATCH[2]}" --heads "${BASH_REMATCH[3]}"
                   --kv-heads "${BASH_REMATCH[4]}" --mlp-hidden "${BASH_REMATCH[5]}" --vocab "${BASH_REMATCH[6]}"
                   --max-seq "$((T > 1024 ? T : 1024))")
        NAMES=(ours eager compile hf_eager hf_compile titan_compile)
        [[ $EAGER == 1 ]] && NAMES+=(titan_eager) ;;
    *) echo "error: BENCH_ARCH='$ARCH': expected gpt2 or llama" >&2; exit 1 ;;
esac
[[ $FP8 == 1 ]] && NAMES=(ours ours_fp8 "${NAMES[@]:1}")
[[ $REF == 0 ]] && NAMES=($(printf '%s\n' "${NAMES[@]}" | grep -vx -e eager -e compile))
MAXSEQ=(); [[ $T -gt 1024 ]] && MAXSEQ=(--max-seq "$T")  # a fresh model's context grows to T (ours and nanoGPT's)
mkdir -p "$OUT" || exit 1

declare -A MS TOKS PEAK STATUS
failed=0
run() {  # run NAME CMD...: runs CMD, keeps its log, records the fields of its BENCH line
    local name=$1; shift
    local log="$OUT/$name.log"
    echo "=== $name: $*"
    "$@" >"$log" 2>&1
    local rc=$?
    local line
    line=$(grep '^BENCH ' "$log" | tail -n 1)
    if [[ $rc -ne 0 || -z $line ]]; then
        STATUS[$name]="failed (exit $rc, see $log)"
        failed=1
        tail -n 5 "$log" | sed 's/^/    /'
        return
    fi
    echo "    $line"
    STATUS[$name]=ok
    MS[$name]=$(sed -n 's/.* ms=\([^ ]*\).*/\1/p' <<<"$line")
    TOKS[$name]=$(sed -n 's/.* tok_s=\([^ ]*\).*/\1/p' <<<"$line")
    PEAK[$name]=$(sed -n 's/.* peak_gib=\([^ ]*\).*/\1/p' <<<"$line")
}

echo "$ARCH $OURS_INIT, B=$B T=$T, $STEPS steps per run, random tokens"
if [[ -x $BIN ]]; then
    OURS=("$BIN" --init "$OURS_INIT" "${MAXSEQ[@]}" --random-data 1
          --val-every 0 --batch "$B" --seq "$T" --steps "$STEPS")
    run ours "${OURS[@]}"
    [[ $FP8 == 1 ]] && run ours_fp8 "${OURS[@]}" --fp8 1 "${FP8_FLAGS[@]}"
else
    STATUS[ours]="skipped: $BIN not found (build it with make)"
    STATUS[ours_fp8]=${STATUS[ours]}
    echo "=== ours: skipped, $BIN not found (build it with make)"
fi
if [[ $REF == 1 ]]; then
    run eager "$PY" scripts/train_gpt2.py --bench --device "$DEV" "${REF_SHAPE[@]}" --batch "$B" --seq "$T" --steps "$STEPS"
    run compile "$PY" scripts/train_gpt2.py --bench --device "$DEV" "${REF_SHAPE[@]}" --batch "$B" --seq "$T" --steps "$STEPS" \
        --compile
fi
if [[ $ARCH == gpt2 ]]; then
    NANO=("$PY" scripts/bench_nanogpt.py --device "$DEV" --model "$MODEL" "${MAXSEQ[@]}" --batch "$B" --seq "$T"
          --steps "$STEPS")
    run nanogpt_compile "${NANO[@]}" --compile 1
    [[ $EAGER == 1 ]] && run nanogpt_eager "${NANO[@]}" --compile 0
    for r in $TORCHAO; do run "nanogpt_compile_float8_$r" "${NANO[@]}" --compile 1 --float8 "$r"; done
fi
if [[ $ARCH == llama ]]; then
    RUN_FLAGS=(--device "$DEV" "${REF_SHAPE[@]:2}" --batch "$B" --seq "$T" --steps "$STEPS")  # the shape without --arch
    run hf_eager "$PY" scripts/bench_hf.py "${RUN_FLAGS[@]}"
    run hf_compile "$PY" scripts/bench_hf.py "${RUN_FLAGS[@]}" --compile
    run titan_compile "$PY" scripts/bench_llama.py "${RUN_FLAGS[@]}" --compile 1
    [[ $EAGER == 1 ]] && run titan_eager "$PY" scripts/bench_llama.py "${RUN_FLAGS[@]}" --compile 0
fi

ratio() {  # ratio A B: tok/s of A over tok/s of B, or "-" when either is missing
    if [[ ${STATUS[$1]} == ok && ${STATUS[$2]} == ok ]]; then
        awk -v a="${TOKS[$1]}" -v b="${TOKS[$2]}" 'BEGIN { printf "%.2fx", a / b }'
    else
        echo "-"
    fi
}
fastest=  # the PyTorch row with the most tok/s
for name in "${NAMES[@]}"; do
    [[ $name == ours* || $name == *_float8_* || ${STATUS[$name]} != ok ]] && continue
    if [[ -z $fastest ]] || awk -v a="${TOKS[$name]}" -v b="${TOKS[$fastest]}" 'BEGIN { exit !(a > b) }'; then
        fastest=$name
    fi
done
echo
printf "%-34s | %10s | %12s | %9s | %7s | %s\n" run "ms/step" "tok/s" "peak GiB" "ours is" status
printf -- "-----------------------------------+------------+--------------+-----------+---------+-------\n"
for name in "${NAMES[@]}"; do
    vs=-
    [[ $name != ours* ]] && vs=$(ratio ours "$name")
    printf "%-34s | %10s | %12s | %9s | %7s | %s\n" "$name" "${MS[$name]:--}" "${TOKS[$name]:--}" "${PEAK[$name]:--}" \
        "$vs" "${STATUS[$name]}"
done
echo
if [[ -n $fastest ]]; then
    echo "fastest PyTorch: $fastest (${TOKS[$fastest]} tok/s)"
    echo "ours / $fastest: $(ratio ours "$fastest")"
    [[ $FP8 == 1 ]] && echo "ours_fp8 / $fastest: $(ratio ours_fp8 "$fastest")"
    for r in $TORCHAO; do echo "ours_fp8 / nanogpt_compile_float8_$r: $(ratio ours_fp8 "nanogpt_compile_float8_$r")"; done
else
    echo "fastest PyTorch: - (no PyTorch run succeeded)"
fi
exit $failed
