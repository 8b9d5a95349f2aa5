#!/usr/bin/env bash
# --fp8 speed at GPT-2 124M (issue 18), checked first. Builds nothing; needs, built beforehand:
#   make build/train_gpt2cu build/test_fp8_gpu && make -C dev/cuda build/fp8_cast build/layernorm
#   (PROFILE=1 also: make -C dev/cuda build/profile_gpt2)
# Parts, each under a timeout, logs under $OUT/fp8_speed (OUT default build):
#   1. dev/cuda/build/fp8_cast: every cast of llmc/fp8.cuh and the fused casts of llmc/fp8_fused.cuh
#      (LayerNorm, GELU forward, GELU backward + bias gradient, dY + bias gradient) byte for byte
#      against llmc/cpu/fp8.h, amax and bias bits; and their timings (the lab's lines, printed);
#      dev/cuda/build/layernorm --check-only (the bf16 LayerNorm now shares its row code with the FP8 one)
#   2. build/test_fp8_gpu: the FP8 linear layers against the CPU reference (current, delayed with
#      the fused casts, rowwise)
#   3. PAIRS=fp8 dev/bench/graph.sh PARTS=2: --graph 0 = --graph 1 bit for bit, every FP8 pair
#      (current, delayed fused and unfused, rowwise; GPT-2 and Llama)
#   4. fused = unfused: B=32 T=1024, 8 steps, --deterministic 1, --fp8 1 --fp8-scaling delayed with
#      --fp8-fused 0 and 1: a Llama-style L6 (no biases) with equal log lines and final model.bin (the
#      attention's FP8 epilogue and the fused dY casts against the separate casts); GPT-2 d6 with every
#      logged loss within 1e-3 (the separate casts' bias gradients come from bias_backward, whose row
#      chunks and order differ from the fused casts': the same sums in another fp32 order)
#   5. speed: 124M, B=64 T=1024, random tokens, STEPS (14) steps each, one after the other, alone on
#      the GPU: bf16, --fp8 1 current scaling, delayed with separate casts (--fp8-fused 0), delayed with
#      the fused casts: the trainer's BENCH line (median ms/step after its warm-up, peak memory)
#   6. (PROFILE=1) dev/cuda/build/profile_gpt2 of bf16, current and fused: the kernel families
# Last lines: PASS/FAIL of the checks, then ms/step, tok/s, peak GiB and the speedup over bf16 of each
# run (and over the nanoGPT-style torch.compile's 124.14 ms of docs/perf.md). ~3 minutes on an H200
# (estimated, not yet run: parts 1-4 run at once, ~2 minutes, then the timing alone); SKIP_CHECKS=1
# runs part 5 only, CHECKS_ONLY=1 parts 1-4 only.
cd "$(dirname "$0")/../.." || exit 1
LOGS=${OUT:-build}/fp8_speed
STEPS=${STEPS:-14}
TRAIN=${TRAIN:-build/train_gpt2cu}
LAB=${LAB_BUILD:-dev/cuda/build}
COMPILE_MS=124.14  # nanoGPT-style torch.compile, GPT-2 124M B=64 T=1024 (docs/perf.md, sixteenth run)
mkdir -p "$LOGS" || exit 1
need=("$TRAIN")
[ "${SKIP_CHECKS:-0}" = 1 ] || need+=(build/test_fp8_gpu "$LAB/fp8_cast" "$LAB/layernorm")
[ "${PROFILE:-0}" = 1 ] && need+=("$LAB/profile_gpt2")
for b in "${need[@]}"; do [ -x "$b" ] || { echo "error: $b is missing (build it first: see the top of $0)"; exit 1; }; done
rows=(); bad=0; t0=$SECONDS
row() {  # row STATUS(0 pass) NAME DETAIL
    if [ "$1" -eq 0 ]; then rows+=("PASS  $2${3:+ ($3)}"); else rows+=("FAIL  $2${3:+ ($3)}"); bad=1; fi
    echo "$([ "$1" -eq 0 ] && echo PASS || echo FAIL) $2 $3"
}

# The checks run at once (each in the background, its own log and result file; the GPU has room for
# all of them), so the whole script stays in budget; the timing runs after them, alone.
result() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" > "$LOGS/$4.row"; }  # result STATUS NAME DETAIL PART
part_lab() {
    local t1=$SECONDS st
    timeout 170 "$LAB/fp8_cast" --reps 20 > "$LOGS/fp8_cast.txt" 2>&1; st=$?
    result $st "fp8_cast lab (casts + fused casts vs llmc/cpu/fp8.h)" \
        "$(grep -c ' ok' "$LOGS/fp8_cast.txt") ok lines, $(grep -c '^FAIL' "$LOGS/fp8_cast.txt") FAIL, $((SECONDS - t1)) s" lab
    t1=$SECONDS
    timeout 60 "$LAB/layernorm" --check-only > "$LOGS/layernorm.txt" 2>&1; st=$?
    result $st "layernorm lab --check-only (bf16 LayerNorm vs CPU)" "$((SECONDS - t1)) s" layernorm
}
part_test() {
    local t1=$SECONDS st
    timeout 150 build/test_fp8_gpu > "$LOGS/test_fp8_gpu.txt" 2>&1; st=$?
    result $st "test_fp8_gpu (FP8 linears and the fused MLP vs CPU)" "$(tail -1 "$LOGS/test_fp8_gpu.txt"), $((SECONDS - t1)) s" test
}
part_graph() {
    local t1=$SECONDS st
    OUT=$LOGS PAIRS=fp8 PARTS=2 timeout 200 dev/bench/graph.sh > "$LOGS/graph_fp8.txt" 2>&1; st=$?
    result $st "graph 0 = graph 1, the FP8 pairs" "$(grep -c '^PASS' "$LOGS/graph_fp8.txt") PASS, $((SECONDS - t1)) s" graph
}
part_same() {  # dev/bench/fp8_same.sh: --fp8-fused 0 = 1 (Llama-style bit for bit, GPT-2 within 1e-3)
    local st detail
    IFS=$'\t' read -r st detail < <(dev/bench/fp8_same.sh "$LOGS/same" "$TRAIN" | tail -1)
    result "${st:-1}" "fused casts = separate casts (dev/bench/fp8_same.sh: Llama-style L6 bit for bit, GPT-2 d6 losses within 1e-3)" "$detail" same
}
if [ "${SKIP_CHECKS:-0}" != 1 ]; then
    echo "==== 1-4. checks, at once: fp8_cast + layernorm labs, test_fp8_gpu, graph pairs, fused = unfused"
    rm -f "$LOGS"/*.row
    part_lab & part_test & part_graph & part_same &
    wait
    for p in lab layernorm test graph same; do
        if [ -f "$LOGS/$p.row" ]; then IFS=$'\t' read -r st name detail < "$LOGS/$p.row"; row "$st" "$name" "$detail"
        else row 1 "part $p" "no result (killed?)"; fi
    done
    grep -E "^FAIL" "$LOGS/fp8_cast.txt" "$LOGS/layernorm.txt" | head -5
    grep -E "FAIL" "$LOGS/test_fp8_gpu.txt" | head -5
    grep -E "^(PASS|FAIL)" "$LOGS/graph_fp8.txt" | sed 's/^/    /'
    echo "  the fused casts in the lab (R=65536; variant 0 fused, 1 separate passes):"
    grep -E "^(fp8_gelu|fp8_cast_dbias|fp8_layernorm)" "$LOGS/fp8_cast.txt" | grep -E "R=65536" | sed 's/^/    /'
fi

if [ "${CHECKS_ONLY:-0}" = 1 ]; then
    echo "==== summary ($((SECONDS - t0)) s; logs in $LOGS; CHECKS_ONLY=1: no timing)"
    for r in "${rows[@]}"; do echo "$r"; done
    exit $bad
fi
echo "==== 5. speed: 124M, B=64 T=1024, $STEPS steps each"
declare -A MS TOK PEAK
RUNS=(bf16 fp8_current fp8_delayed fp8_fused)
declare -A FLAGS=([bf16]="" [fp8_current]="--fp8 1 --fp8-scaling current"
                  [fp8_delayed]="--fp8 1 --fp8-scaling delayed --fp8-fused 0" [fp8_fused]="--fp8 1 --fp8-scaling delayed --fp8-fused 1")
for r in "${RUNS[@]}"; do
    # shellcheck disable=SC2086
    timeout 60 "$TRAIN" --init d12 --random-data 1 --val-every 0 --batch 64 --seq 1024 --steps "$STEPS" ${FLAGS[$r]} \
        > "$LOGS/bench_$r.txt" 2>&1
    line=$(grep '^BENCH ' "$LOGS/bench_$r.txt" | tail -1)
    if [ -z "$line" ]; then row 1 "bench $r" "no BENCH line: $(tail -1 "$LOGS/bench_$r.txt")"; continue; fi
    echo "    $r: $line"
    MS[$r]=$(sed -n 's/.* ms=\([^ ]*\).*/\1/p' <<< "$line")
    TOK[$r]=$(sed -n 's/.* tok_s=\([^ ]*\).*/\1/p' <<< "$line")
    PEAK[$r]=$(sed -n 's/.* peak_gib=\([^ ]*\).*/\1/p' <<< "$line")
done

if [ "${PROFILE:-0}" = 1 ]; then
    echo "==== 6. profile_gpt2: kernel families"
    for p in "bf16:" "fp8_current:--fp8 1 --fp8-scaling current" "fp8_fused:--fp8 1 --fp8-scaling delayed --fp8-fused 1"; do
        name=${p%%:*}
        # shellcheck disable=SC2086
        timeout 90 "$LAB/profile_gpt2" --steps 2 ${p#*:} > "$LOGS/profile_$name.txt" 2>&1 || echo "    profile $name failed"
        echo "  -- $name"
        awk '/^family/ { on = 1 } on && NF == 0 { exit } on' "$LOGS/profile_$name.txt" | sed 's/^/    /'
    done
fi

echo
echo "==== summary ($((SECONDS - t0)) s; logs in $LOGS)"
for r in "${rows[@]}"; do echo "$r"; done
printf "%-12s | %9s | %10s | %8s | %8s | %s\n" run ms/step tok/s "peak GiB" "vs bf16" "vs compile (124.14 ms)"
for r in "${RUNS[@]}"; do
    if [ -z "${MS[$r]}" ]; then printf "%-12s | %9s |\n" "$r" failed; continue; fi
    printf "%-12s | %9s | %10s | %8s | %8s | %s\n" "$r" "${MS[$r]}" "${TOK[$r]}" "${PEAK[$r]}" \
        "$(awk -v a="${MS[bf16]}" -v b="${MS[$r]}" 'BEGIN { if (a == "") print "-"; else printf "%.3fx", a / b }')" \
        "$(awk -v a="$COMPILE_MS" -v b="${MS[$r]}" 'BEGIN { printf "%.3fx (1.5x: <= 82.76 ms)", a / b }')"
done
exit $bad
