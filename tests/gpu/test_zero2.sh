#!/usr/bin/env bash
# ZeRO-2 keeping only its gradient shard (docs/distributed.md), on one GPU, with the binaries given:
# nothing is built (PLAIN and NCCL name them; default build/train_gpt2cu and build/train_gpt2cu_nccl).
# At world size 1 the NCCL trainer takes every path of stage 2 (the shard-sized gradients, the
# bucket buffers the backward writes, their fill from the shard after a step's first micro-batch,
# the per-micro-batch ncclReduce into the shard, the events that recycle the pool) and must give the
# plain trainer's bits with --deterministic 1:
#  - GPT-2 (MODEL, default d12) at B x 1024 tokens, --zero 0, 1 and 2, with gradient accumulation
#    (3 micro-batches: stage 2 reduces each one into its shard) and without (1): every step's loss,
#    lr and grad_norm identical to build/train_gpt2cu's, and with accumulation the final
#    checkpoint's model.bin and state.bin byte-identical;
#  - a Llama-style model with an untied head (RMSNorm, RoPE, SwiGLU, no biases: lm_head instead of
#    wte in the bucket outside the layers), --zero 2 with accumulation, the same checks;
#  - each stage's GPU memory as the trainer prints it: gpt2_build's "memory:" line (parameters,
#    the gradients it keeps, optimizer state), the data-parallel "gradients:" line (stage 2: shard +
#    bucket buffers), and peak_gib of the BENCH line (all the trainer cudaMalloc'ed). At world size
#    1 the shard is the whole buffer, so stage 2 shows its buffers' cost, not its saving.
# Random tokens (--random-data 1), no files needed. About 2 minutes on an H200.
#   tests/gpu/test_zero2.sh    MODEL, LLAMA (empty: no Llama run), B, STEPS, STAGES (default "0 1 2"), MICROS (micro-batches
#                              a step, default "3 1") override; PLAIN, NCCL the binaries
cd "$(dirname "$0")/../.." || exit 1
PLAIN=${PLAIN:-build/train_gpt2cu}
NCCL=${NCCL:-build/train_gpt2cu_nccl}
MODEL=${MODEL:-d12}; LLAMA=${LLAMA-llama:L4,C256,H4,KV2,untied}; B=${B:-8}; STEPS=${STEPS:-6}
STAGES=${STAGES:-0 1 2}; MICROS=${MICROS:-3 1}
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "test_zero2: no GPU"; exit 1; }
for bin in "$PLAIN" "$NCCL"; do [ -x "$bin" ] || { echo "test_zero2: $bin is missing"; exit 1; }; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok=0; bad=0
pass() { ok=$((ok + 1)); echo "ok   $1"; }
flunk() { bad=$((bad + 1)); echo "BAD  $1: $2"; }
steplines() { awk '$1 == "step" && $3 == "train_loss" { print $2, $4, $6, $8 }' "$1"; }  # step loss lr grad_norm
final=$(printf 'step_%08d' "$STEPS")

# same NAME REF CKPT: run NAME against run REF (their logs; with CKPT=1 their final checkpoints too)
same() {
    local name=$1 ref=$2 ckpt=$3 what="$1 = $2"
    if ! diff <(steplines "$tmp/$ref.log") <(steplines "$tmp/$name.log") >"$tmp/$name.diff"; then
        flunk "$what" "the step lines differ: $(head -n 4 "$tmp/$name.diff" | tr '\n' ' ')"
    elif [ -z "$(steplines "$tmp/$name.log")" ]; then flunk "$what" "no step lines"
    elif [ "$ckpt" = 1 ] && { ! cmp -s "$tmp/$ref/$final/model.bin" "$tmp/$name/$final/model.bin" ||
                              ! cmp -s "$tmp/$ref/$final/state.bin" "$tmp/$name/$final/state.bin"; }; then
        flunk "$what" "the final checkpoints differ"
    else
        pass "$what, bit for bit ($STEPS steps$([ "$ckpt" = 1 ] && echo ', final model.bin and state.bin'); last loss $(steplines "$tmp/$name.log" | tail -n 1 | cut -d' ' -f2))"
    fi
}
# run NAME CKPT BIN ARGS...: the run's output in $tmp/NAME.out, its log $tmp/NAME.log, with CKPT=1
# its final checkpoint under $tmp/NAME/
run() {
    local name=$1 ckpt=$2 bin=$3; shift 3
    local out=(); [ "$ckpt" = 1 ] && out=(--out-dir "$tmp/$name")
    if ! "$bin" "$@" "${out[@]}" --log "$tmp/$name.log" >"$tmp/$name.out" 2>&1; then
        flunk "$name" "exit status $?: $(grep -m 1 -i error "$tmp/$name.out")"; return 1
    fi
}

for micro in $MICROS; do
    ckpt=$([ $micro = 3 ] && echo 1 || echo 0)
    RUN=(--random-data 1 --init "$MODEL" --batch "$B" --seq 1024 --total-batch $((micro * B * 1024)) --steps "$STEPS"
         --lr 6e-4 --warmup 2 --val-every 0 --ckpt-every 0 --deterministic 1)
    run "plain_m$micro" $ckpt "$PLAIN" "${RUN[@]}" || continue
    for z in $STAGES; do
        run "zero${z}_m$micro" $ckpt "$NCCL" "${RUN[@]}" --zero $z && same "zero${z}_m$micro" "plain_m$micro" $ckpt
        rm -rf "$tmp/zero${z}_m$micro"
    done
    rm -rf "$tmp/plain_m$micro"
done
LL=(--random-data 1 --init "$LLAMA" --batch "$B" --seq 1024 --total-batch $((3 * B * 1024)) --steps "$STEPS" --lr 6e-4
    --warmup 2 --val-every 0 --ckpt-every 0 --deterministic 1)
[ -n "$LLAMA" ] && run llama_plain 1 "$PLAIN" "${LL[@]}" && run llama_zero2 1 "$NCCL" "${LL[@]}" --zero 2 && same llama_zero2 llama_plain 1

echo
echo "GPU memory the trainer allocates, $MODEL at B=$B x 1024, world size 1 (runs of 3 micro-batches):"
for name in plain_m3 zero0_m3 zero1_m3 zero2_m3; do
    [ -f "$tmp/$name.out" ] || continue
    peak=$(awk '/^BENCH/ { for (i = 1; i <= NF; i++) if ($i ~ /^peak_gib=/) print substr($i, 10) }' "$tmp/$name.out")
    echo "  $name: peak_gib=$peak | $(grep -m 1 '^memory:' "$tmp/$name.out") | $(grep -m 1 '^gradients:' "$tmp/$name.out")"
done
echo "test_zero2: $ok ok, $bad failed"
[ $bad -eq 0 ]
