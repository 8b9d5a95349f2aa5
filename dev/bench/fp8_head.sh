#!/usr/bin/env bash
# --fp8-head 1 (the output head's matmuls in FP8; issue 18, docs/numerics.md "The output head in FP8"):
# checked, then timed at GPT-2 124M. Builds nothing; needs, built beforehand:
#   make build/train_gpt2cu build/test_fp8_gpu
# Parts, logs under $OUT/fp8_head (OUT default build):
#   1. checks, at once (the GPU has room for all of them):
#      a. build/test_fp8_gpu: the FP8 linear layers and the head (forward, the classifier's FP8 dlogits
#         byte for byte against llmc/cpu/fp8.h, input and weight gradients) against the CPU reference
#      b. flags: --fp8-head 2 and --fp8-head 1 without --fp8 1 refused with their messages
#      c. --graph 0 = --graph 1 with --fp8 1 --fp8-head 1 (d6, B=16 T=1024 random tokens, 6 steps,
#         --deterministic 1): the logged losses and grad norms equal
#      d. loss on tiny Shakespeare (data/tinyshakespeare): d12, B=4 T=128, LOSS_STEPS (2000) steps,
#         lr 3e-4 cosine, warm-up 100, seed 1337, val every 100 steps on the whole val split (63
#         batches): bf16, --fp8 1 --fp8-head 1 (final val loss within 1% of bf16's), and --fp8 1
#         (head bf16, printed for reference), the three at once, each under LOSS_LIMIT (110) s
#   2. speed, alone on the GPU, one after the other: 124M, B=64 T=1024, random tokens, STEPS (14)
#      steps each: bf16, --fp8 1 --fp8-head 0, --fp8 1 --fp8-head 1: the trainer's BENCH line (median
#      ms/step after its warm-up, tok/s, peak memory). Skipped when a check of part 1 failed (FORCE=1
#      times anyway).
# Last lines: the checks, then ms/step, tok/s, peak GiB of each run, its speedup over bf16 and over
# the nanoGPT-style torch.compile (COMPILE_MS, default 121.34 ms: docs/perf.md, twenty-second run;
# issue 18 asks 1.5x at <= 28.48 GiB). For a same-call ratio against compile:
#   BENCH_FP8=1 BENCH_FP8_FLAGS="--fp8-head 1" BENCH_REF=0 BENCH_STEPS=16 scripts/bench_train.sh
#   3. (PROFILE=1; needs make -C dev/cuda build/profile_gpt2) profile_gpt2 --fp8 1 with --fp8-head 0
#      and 1: the kernel families of each step (~1 more minute)
# Estimated ~3 minutes on an H200 (part 1 ~100 s, bounded by the loss runs; part 2 ~60 s); run twice in
# the twenty-third run (docs/perf.md), its wall time not recorded.
cd "$(dirname "$0")/../.." || exit 1
LOGS=${OUT:-build}/fp8_head
STEPS=${STEPS:-14}
LOSS_STEPS=${LOSS_STEPS:-2000}
LOSS_LIMIT=${LOSS_LIMIT:-110}
TRAIN=${TRAIN:-build/train_gpt2cu}
TEST=${TEST:-build/test_fp8_gpu}
COMPILE_MS=${COMPILE_MS:-121.34}
DATA=${DATA:-data/tinyshakespeare}
mkdir -p "$LOGS" || exit 1
for b in "$TRAIN" "$TEST"; do [ -x "$b" ] || { echo "error: $b is missing (build it first: see the top of $0)"; exit 1; }; done
rows=(); bad=0; t0=$SECONDS
row() {  # row STATUS(0: pass, INFO: printed only, else fail) NAME DETAIL
    local tag=PASS
    if [ "$1" = INFO ]; then tag=INFO; elif [ "$1" != 0 ]; then tag=FAIL; bad=1; fi
    rows+=("$tag  $2${3:+ ($3)}"); echo "$tag $2 $3"
}
result() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" > "$LOGS/$4.row"; }  # result STATUS NAME DETAIL PART

part_test() {
    local t1=$SECONDS st
    timeout 150 "$TEST" > "$LOGS/test_fp8_gpu.txt" 2>&1; st=$?
    result $st "test_fp8_gpu (FP8 linears + head vs CPU)" \
        "$(grep -c '^head:' "$LOGS/test_fp8_gpu.txt") head cases; $(tail -1 "$LOGS/test_fp8_gpu.txt"), $((SECONDS - t1)) s" test
}
part_flags() {
    local st=0 why="" m
    m=$("$TRAIN" --init d2 --random-data 1 --steps 1 --fp8 1 --fp8-head 2 2>&1 | tail -1)
    grep -q -- "--fp8-head" <<< "$m" || { st=1; why="--fp8-head 2: $m"; }
    m=$("$TRAIN" --init d2 --random-data 1 --steps 1 --fp8-head 1 2>&1 | tail -1)
    grep -q "only with --fp8 1" <<< "$m" || { st=1; why="$why --fp8-head 1 alone: $m"; }
    result $st "--fp8-head bad values refused" "${why:-last: $m}" flags
}
part_graph() {
    local t1=$SECONDS st=0 why="" g a b cols
    for g in 0 1; do
        timeout 120 "$TRAIN" --init d6 --random-data 1 --batch 16 --seq 1024 --steps 6 --seed 7 --lr 1e-3 --warmup 2 \
            --deterministic 1 --val-every 0 --fp8 1 --fp8-head 1 --graph $g \
            --log "$LOGS/graph$g.log" --overwrite 1 > "$LOGS/graph$g.txt" 2>&1 ||
            { st=1; why="--graph $g failed: $(tail -1 "$LOGS/graph$g.txt")"; }
    done
    if [ $st -eq 0 ]; then
        cols='$1 == "step" && $3 == "train_loss" { print $1, $2, $3, $4, $5, $6, $7, $8 }'
        a=$(awk "$cols" "$LOGS/graph0.log"); b=$(awk "$cols" "$LOGS/graph1.log")
        if [ -z "$a" ] || [ "$a" != "$b" ]; then st=1; why="log lines differ: $(diff <(echo "$a") <(echo "$b") | grep '^[<>]' | head -2 | tr '\n' ' ')"
        elif grep -qi nan <<< "$a"; then st=1; why="NaN in the losses: $(tail -1 <<< "$a")"; fi
    fi
    result $st "--fp8-head 1: graph 0 = graph 1 (d6 B=16 T=1024, 6 steps)" "${why:-last: $(tail -1 <<< "$b")}, $((SECONDS - t1)) s" graph
}
last_val() { awk -v s="$LOSS_STEPS" '$1 == "step" && $2 == s && $3 == "val_loss" { v = $4 } END { print v }' "$1"; }
any_val() { awk '$1 == "step" && $3 == "val_loss" { v = $2 " " $4 } END { print v }' "$1"; }
LOSS_RUNS=(bf16 fp8_head fp8)
declare -A LOSS_FLAGS=([bf16]="" [fp8_head]="--fp8 1 --fp8-head 1" [fp8]="--fp8 1")
part_loss() {
    local r t1=$SECONDS
    if ! ls "$DATA"/*_train.bin > /dev/null 2>&1; then
        result 1 "loss on tiny Shakespeare" "no $DATA/*_train.bin" loss; return
    fi
    for r in "${LOSS_RUNS[@]}"; do
        # shellcheck disable=SC2086
        timeout "$LOSS_LIMIT" "$TRAIN" --train "$DATA/*_train.bin" --val "$DATA/*_val.bin" --init d12 --seed 1337 \
            --batch 4 --seq 128 --steps "$LOSS_STEPS" --lr 3e-4 --warmup 100 --val-every 100 --val-steps 63 \
            ${LOSS_FLAGS[$r]} --log "$LOGS/loss_$r.log" --overwrite 1 > "$LOGS/loss_$r.txt" 2>&1 &
    done
    wait
    local b h f st d
    b=$(last_val "$LOGS/loss_bf16.log"); h=$(last_val "$LOGS/loss_fp8_head.log"); f=$(last_val "$LOGS/loss_fp8.log")
    d=$(awk -v a="$h" -v b="$b" 'BEGIN { if (a == "" || b == "" || b == 0) print "nan"; else printf "%.4f", (a - b) / b }')
    st=$(awk -v d="$d" 'BEGIN { print (d != "nan" && d <= 0.01 && d >= -0.01) ? 0 : 1 }')
    result "$st" "loss: --fp8 1 --fp8-head 1 final val within 1% of bf16 ($LOSS_STEPS steps)" \
        "bf16 ${b:-none (last: $(any_val "$LOGS/loss_bf16.log"))}, fp8 head ${h:-none (last: $(any_val "$LOGS/loss_fp8_head.log"))}: rel $d; $((SECONDS - t1)) s" loss
    d=$(awk -v a="$f" -v b="$b" 'BEGIN { if (a == "" || b == "" || b == 0) print "nan"; else printf "%.4f", (a - b) / b }')
    result INFO "loss: --fp8 1 (head bf16) for reference" "fp8 ${f:-none (last: $(any_val "$LOGS/loss_fp8.log"))}: rel $d" loss_ref
}

echo "==== 1. checks, at once: test_fp8_gpu, flags, graph 0 = 1, loss on tiny Shakespeare ($LOSS_STEPS steps)"
rm -f "$LOGS"/*.row
part_test & part_flags & part_graph & part_loss &
wait
for p in test flags graph loss loss_ref; do
    if [ -f "$LOGS/$p.row" ]; then IFS=$'\t' read -r st name detail < "$LOGS/$p.row"; row "$st" "$name" "$detail"
    else row 1 "part $p" "no result (killed?)"; fi
done
grep -E "FAIL" "$LOGS/test_fp8_gpu.txt" | head -5
grep -A12 '^head:' "$LOGS/test_fp8_gpu.txt" | grep -E "head|nmse|scale|bytes" | head -40 | sed 's/^/    /'

declare -A MS TOK PEAK
RUNS=(bf16 fp8_head0 fp8_head1)
declare -A FLAGS=([bf16]="" [fp8_head0]="--fp8 1 --fp8-head 0" [fp8_head1]="--fp8 1 --fp8-head 1")
if [ $bad -ne 0 ] && [ "${FORCE:-0}" != 1 ]; then
    echo "==== 2. speed: skipped (a check failed; FORCE=1 times anyway)"
else
    echo "==== 2. speed: 124M, B=64 T=1024, $STEPS steps each, alone"
    for r in "${RUNS[@]}"; do
        # shellcheck disable=SC2086
        timeout 60 "$TRAIN" --init d12 --random-data 1 --val-every 0 --batch 64 --seq 1024 --steps "$STEPS" ${FLAGS[$r]} \
            > "$LOGS/bench_$r.txt" 2>&1
        line=$(grep '^BENCH ' "$LOGS/bench_$r.txt" | tail -1)
        if [ -z "$line" ]; then row 1 "bench $r" "no BENCH line: $(tail -1 "$LOGS/bench_$r.txt")"; continue; fi
        echo "    $r: $line"
        grep -E "^memory: fp8" "$LOGS/bench_$r.txt" | sed 's/^/      /'
        MS[$r]=$(sed -n 's/.* ms=\([^ ]*\).*/\1/p' <<< "$line")
        TOK[$r]=$(sed -n 's/.* tok_s=\([^ ]*\).*/\1/p' <<< "$line")
        PEAK[$r]=$(sed -n 's/.* peak_gib=\([^ ]*\).*/\1/p' <<< "$line")
    done
fi

if [ "${PROFILE:-0}" = 1 ]; then  # needs make -C dev/cuda build/profile_gpt2
    echo "==== 3. profile_gpt2 --fp8 1, --fp8-head 0 and 1: kernel families"
    for h in 0 1; do
        timeout 90 dev/cuda/build/profile_gpt2 --steps 2 --fp8 1 --fp8-head $h > "$LOGS/profile_head$h.txt" 2>&1 ||
            echo "    profile --fp8-head $h failed: $(tail -1 "$LOGS/profile_head$h.txt")"
        echo "  -- --fp8-head $h: $(grep -m 1 'ms/step' "$LOGS/profile_head$h.txt")"
        awk '/^family/ { on = 1 } on && NF == 0 { exit } on' "$LOGS/profile_head$h.txt" | sed 's/^/    /'
    done
fi

echo
echo "==== summary ($((SECONDS - t0)) s; logs in $LOGS)"
for r in "${rows[@]}"; do echo "$r"; done
target=$(awk -v c="$COMPILE_MS" 'BEGIN { printf "%.2f", c / 1.5 }')
printf "%-10s | %9s | %10s | %8s | %8s | %s\n" run ms/step tok/s "peak GiB" "vs bf16" "vs compile ($COMPILE_MS ms; 1.5x: <= $target ms, <= 28.48 GiB)"
for r in "${RUNS[@]}"; do
    if [ -z "${MS[$r]}" ]; then printf "%-10s | %9s |\n" "$r" "not run"; continue; fi
    printf "%-10s | %9s | %10s | %8s | %8s | %s\n" "$r" "${MS[$r]}" "${TOK[$r]}" "${PEAK[$r]}" \
        "$(awk -v a="${MS[bf16]}" -v b="${MS[$r]}" 'BEGIN { if (a == "") print "-"; else printf "%.3fx", a / b }')" \
        "$(awk -v a="$COMPILE_MS" -v b="${MS[$r]}" 'BEGIN { printf "%.3fx", a / b }')"
done
if [ -n "${MS[fp8_head1]}" ]; then
    awk -v c="$COMPILE_MS" -v m="${MS[fp8_head1]}" -v p="${PEAK[fp8_head1]}" 'BEGIN {
        printf "issue 18 (>= 1.5x compile at <= 28.48 GiB): --fp8 1 --fp8-head 1 at %.3fx, %s GiB: %s\n", c / m, p,
               (c / m >= 1.5 && p <= 28.48) ? "met" : "missed" }'
fi
exit $bad
