#!/usr/bin/env bash
# The NCCL data-parallel path of the GPU trainer at world size 1 (docs/distributed.md), on one GPU:
# build/train_gpt2cu_nccl takes every code path of a multi-GPU run (the NCCL communicator, the
# communication stream, the gradient buckets released by events during the backward, the ZeRO
# slices of AdamW, stage 2's shard-only gradients and bucket buffers, and the all-gather before the
# next forward) and must give the plain trainer's run bit for bit with --deterministic 1
# (tests/gpu/test_zero2.sh checks stage 2 further):
#  - --zero 0, 1 and 2: every step's train_loss, lr and grad_norm log line, and the final
#    checkpoint's model.bin and state.bin, byte-identical to build/train_gpt2cu's;
#  - --zero 1 resumed from its step-6 checkpoint: ends byte-identical to the uninterrupted run;
#  - cost: the median step time (the BENCH line) of the NCCL build at --zero 0, 1 and 2 against the
#    plain one with --graph 0 (the data-parallel step is not captured as a CUDA graph, so the eager
#    step is its like), without --deterministic, runs interleaved, best of 2; the target is <= 1%.
#    The plain trainer's default (--graph 1) is timed beside them and printed, not checked.
# Random tokens (--random-data 1), no files needed. Prints a table; about 2 minutes on an H200.
#   tests/gpu/test_distributed.sh            (makes the two trainers first; PLAIN_GIVEN=1 skips that)
# MODEL, B, STEPS, BENCH_B, BENCH_STEPS override the shapes; PLAIN, NCCL the binaries; COST=0 skips the
# step-time cost (make test-gpu does: its other work may share the GPU, and a timing needs it alone).
cd "$(dirname "$0")/../.." || exit 1
PLAIN=${PLAIN:-build/train_gpt2cu}
NCCL=${NCCL:-build/train_gpt2cu_nccl}
MODEL=${MODEL:-d12}; B=${B:-8}; STEPS=${STEPS:-12}; BENCH_B=${BENCH_B:-32}; BENCH_STEPS=${BENCH_STEPS:-40}
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "test_distributed: no GPU"; exit 1; }
if [ -z "${PLAIN_GIVEN:-}" ]; then  # up to date with the sources (quick when they are)
    make build/train_gpt2cu build/train_gpt2cu_nccl >/dev/null || { echo "test_distributed: make failed"; exit 1; }
fi
for bin in "$PLAIN" "$NCCL"; do [ -x "$bin" ] || { echo "test_distributed: $bin is missing"; exit 1; }; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok=0; bad=0
pass() { ok=$((ok + 1)); echo "ok   $1"; }
flunk() { bad=$((bad + 1)); echo "BAD  $1: $2"; }
RUN=(--random-data 1 --init "$MODEL" --batch "$B" --seq 1024 --total-batch $((2 * B * 1024)) --steps "$STEPS"
     --lr 6e-4 --warmup 2 --val-every 0 --deterministic 1 --ckpt-every 6)
steplines() { awk '$1 == "step" && $3 == "train_loss" { print $2, $4, $6, $8 }' "$1"; }  # step loss lr grad_norm

if ! "$PLAIN" "${RUN[@]}" --out-dir "$tmp/plain" --log "$tmp/plain.log" >"$tmp/plain.out" 2>&1; then
    echo "test_distributed: the plain run failed: $(tail -n 3 "$tmp/plain.out")"; exit 1
fi
final=$(printf 'step_%08d' "$STEPS")
declare -A result
for z in 0 1 2; do
    name="NCCL world size 1, --zero $z = the plain trainer, bit for bit ($STEPS steps of $MODEL, 2 micro-batches)"
    if ! "$NCCL" "${RUN[@]}" --zero $z --out-dir "$tmp/z$z" --log "$tmp/z$z.log" >"$tmp/z$z.out" 2>&1; then
        flunk "$name" "exit $?: $(grep -m 1 -i error "$tmp/z$z.out")"; result[$z]="failed"; continue; fi
    grep -m 1 "^data parallel" "$tmp/z$z.out"
    if ! diff <(steplines "$tmp/plain.log") <(steplines "$tmp/z$z.log") >"$tmp/z$z.diff"; then
        flunk "$name" "the step lines differ: $(head -n 4 "$tmp/z$z.diff" | tr '\n' ' ')"; result[$z]="differs"
    elif ! cmp -s "$tmp/plain/$final/model.bin" "$tmp/z$z/$final/model.bin" ||
         ! cmp -s "$tmp/plain/$final/state.bin" "$tmp/z$z/$final/state.bin"; then
        flunk "$name" "the final checkpoints differ"; result[$z]="ckpt differs"
    else
        pass "$name: last loss $(steplines "$tmp/z$z.log" | tail -n 1 | cut -d' ' -f2)"; result[$z]="identical"
    fi
done

name="NCCL --zero 1 resumed from its step-6 checkpoint ends byte-identical"
mkdir -p "$tmp/r1" && cp -r "$tmp/z1/step_00000006" "$tmp/r1/" 2>/dev/null
if ! "$NCCL" "${RUN[@]}" --zero 1 --resume "$tmp/r1" >"$tmp/r1.out" 2>&1; then
    flunk "$name" "exit $?: $(grep -m 1 -i error "$tmp/r1.out")"; resume="failed"
elif ! cmp -s "$tmp/z1/$final/model.bin" "$tmp/r1/$final/model.bin" ||
     ! cmp -s "$tmp/z1/$final/state.bin" "$tmp/r1/$final/state.bin"; then
    flunk "$name" "the final checkpoints differ"; resume="differs"
else pass "$name"; resume="identical"; fi

if [ "${COST:-1}" = 0 ]; then
    echo "--zero 0/1/2 = plain: ${result[0]:-} / ${result[1]:-} / ${result[2]:-}; --zero 1 resumed: $resume; step-time cost not timed (COST=0)"
else
    # cost: BENCH medians, plain and NCCL interleaved twice, default (fast) attention backward
    BENCH=(--random-data 1 --init "$MODEL" --batch "$BENCH_B" --seq 1024 --steps "$BENCH_STEPS" --val-every 0)
    bench_ms() { "$@" "${BENCH[@]}" 2>&1 | awk '/^BENCH/ { for (i = 1; i <= NF; i++) if ($i ~ /^ms=/) print substr($i, 4) }'; }
    declare -A ms
    for round in 1 2; do
        for v in plain graph z0 z1 z2; do
            case $v in plain) cmd=("$PLAIN" --graph 0) ;; graph) cmd=("$PLAIN") ;; *) cmd=("$NCCL" --zero "${v#z}") ;; esac
            m=$(bench_ms "${cmd[@]}")
            ms[$v]="${ms[$v]} $m"
        done
    done
    best() { echo "$1" | tr ' ' '\n' | grep . | sort -g | head -n 1; }
    pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") print "n/a"; else printf "%+.2f%%", 100 * (a - b) / b }'; }
    echo
    echo "| run | $MODEL, B=$B x 1024, 2 micro-batches, --deterministic 1 | median step ms at B=$BENCH_B (best of 2) | vs plain |"
    echo "|---|---|---|---|"
    p=$(best "${ms[plain]}")
    echo "| build/train_gpt2cu --graph 0 | reference | $p | |"
    g=$(best "${ms[graph]}")
    echo "| build/train_gpt2cu (--graph 1, its default; not checked) | | $g | $(pct "$g" "$p") |"
    for z in 0 1 2; do
        m=$(best "${ms[z$z]}")
        echo "| train_gpt2cu_nccl --zero $z | ${result[$z]} | $m | $(pct "$m" "$p") |"
    done
    echo "| --zero 1 resumed at step 6 | $resume | | |"
    for z in 0 1 2; do
        m=$(best "${ms[z$z]}")
        if [ -z "$m" ] || [ -z "$p" ]; then flunk "NCCL --zero $z step time" "no BENCH line"
        elif awk -v a="$m" -v b="$p" 'BEGIN { exit !(a <= b * 1.01) }'; then pass "NCCL --zero $z step time $m ms <= 1% over the plain --graph 0 $p ms"
        else flunk "NCCL --zero $z step time" "$m ms is more than 1% over the plain --graph 0 $p ms"; fi
    done
fi
echo "test_distributed: $ok ok, $bad failed"
[ $bad -eq 0 ]
