#!/usr/bin/env bash
# The attention backward on one H200, with lab binaries built beforehand (nothing is built here):
#   make -C dev/cuda build/attention_forward build/attention_hopper build/attention_backward
# (LAB_BUILD names another folder of them; default dev/cuda/build).
#  1. the attention labs' --check-only at every shape: every variant against the CPU reference
#     (fresh random inputs, poisoned outputs, every element written, guard regions, tolerance and
#     nmse): attention_forward, attention_hopper, attention_backward on the full shapes and on
#     --small. The Hopper backward's split schedule (llmc/attention_hopper_backward.cuh,
#     BwdTileScheduler) runs in variant 0 at odd (B 3, NH 6/2, T 777, HD 128) and at the three
#     --small shapes; elsewhere variant 0 is the whole-item kernel.
#  2. the backward timed, --reps 10, one process, at the lab's shapes (the five of docs/perf.md's
#     table and odd-w): 16 (the Hopper kernel as shipped before: whole items, no skip), 17 (the Hopper
#     kernel with HD 128 skip_masked, not shipped) and 0 (shipped: also the split schedule
#     where the work items are fewer than the SMs).
# CHECKS=0 skips 1, TIME=0 skips 2 (the checks can share the GPU with other work; the timing cannot).
# Logs and the table under ${OUT:-/tmp/out}/attention_backward/. Every step runs under
# `timeout` within a 235 s budget; about 2-3 minutes expected. Exit 1 when anything failed.
cd "$(dirname "$0")/../.." || exit 1
BUILD=${LAB_BUILD:-dev/cuda/build}
LOGS=${OUT:-/tmp/out}/attention_backward
mkdir -p "$LOGS" || exit 1
BUDGET=235
start=$(date +%s)
results=()
bad=0
note() { results+=("$1"); echo "$1"; }

# step NAME MAX_SECONDS BINARY ARGS...: runs it under timeout (at most what is left of the budget)
step() {
    local name=$1 max=$2 bin=$BUILD/$3
    shift 3
    local left=$((BUDGET - ($(date +%s) - start)))
    if [ ! -x "$bin" ]; then note "FAIL $name: $bin is missing (build it: see the top of this script)"; bad=1; return; fi
    if [ "$left" -lt 5 ]; then note "FAIL $name: no time left in the ${BUDGET}s budget"; bad=1; return; fi
    [ "$max" -gt "$left" ] && max=$left
    local t0=$(date +%s)
    timeout "$max" "$bin" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$? secs=$(($(date +%s) - t0))
    local failed=$(grep -c "FAIL" "$LOGS/$name.log")
    if [ $rc -eq 0 ] && [ "$failed" -eq 0 ]; then note "PASS $name (${secs}s)"
    elif [ $rc -eq 124 ]; then note "FAIL $name: timed out after ${max}s (log $LOGS/$name.log)"; bad=1
    else
        note "FAIL $name: exit $rc, $failed FAIL lines (${secs}s, log $LOGS/$name.log)"
        grep "FAIL" "$LOGS/$name.log" | head -8 | sed 's/^/     /'
        bad=1
    fi
}

command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "attention_backward: no GPU"; exit 1; }
if [ "${CHECKS:-1}" = 1 ]; then
    step fwd_check 45 attention_forward --check-only
    step hopper_check 45 attention_hopper --check-only
    step bwd_check 90 attention_backward --check-only
    step bwd_check_small 20 attention_backward --check-only --small
fi
if [ "${TIME:-1}" != 1 ]; then
    echo "== attention backward GPU check (checks only): $([ $bad -eq 0 ] && echo PASS || echo FAIL) ($(($(date +%s) - start))s)"
    printf '%s\n' "${results[@]}"
    exit $bad
fi
step bwd_time 90 attention_backward 0 16 17 --reps 10

# The table: from the timing run's summary lines "attention_backward <shape> B=.. | <variant> <what> |
# ms | GB/s | TFLOP/s | % ...". cuDNN's backward figures are docs/perf.md's (commit 7e71c02, an
# earlier run, not this one).
table=$LOGS/table.txt
awk -F' [|] ' '
    $1 ~ /^attention_backward / && ($2 ~ /^0 / || $2 ~ /^16 / || $2 ~ /^17 /) {
        split($1, a, " "); shape = a[2]; split($2, v, " ");
        ms[shape, v[1]] = $3; tf[shape, v[1]] = $5;
        if (!(shape in seen)) { seen[shape] = 1; order[++n] = shape; dims[shape] = a[3] " " a[4] " " a[5] " " a[6] " " a[7] " " a[8] }
    }
    END {
        cudnn["gpt2"] = 244.7; cudnn["gqa"] = 229.6; cudnn["long"] = 468.9; cudnn["window"] = 191.2; cudnn["odd"] = 107.3; cudnn["odd-w"] = 27.2;
        printf "%-7s %-40s %9s %8s %9s %8s %9s %8s %8s %8s %9s %9s\n", "shape", "dims", "16 ms", "16 TF/s",
               "17 ms", "17 TF/s", "0 ms", "0 TF/s", "17/16", "0/16", "cuDNN*", "0/cuDNN*";
        for (i = 1; i <= n; i++) {
            s = order[i]; o = tf[s, "16"]; k = tf[s, "17"]; w = tf[s, "0"];
            rk = (o > 0 && k > 0) ? sprintf("%.2fx", k / o) : "-";
            r = (o > 0 && w > 0) ? sprintf("%.2fx", w / o) : "-";
            c = (s in cudnn) ? sprintf("%.1f", cudnn[s]) : "-";
            rc = (s in cudnn && w > 0) ? sprintf("%.2fx", w / cudnn[s]) : "-";
            printf "%-7s %-40s %9s %8s %9s %8s %9s %8s %8s %8s %9s %9s\n", s, dims[s], ms[s, "16"], o, ms[s, "17"], k,
                   ms[s, "0"], w, rk, r, c, rc;
        }
    }' "$LOGS/bwd_time.log" >"$table" 2>/dev/null
rows=$(($(wc -l <"$table") - 1))
[ "$rows" -ge 6 ] || { note "FAIL bwd_time table: $rows of 6 shapes timed (log $LOGS/bwd_time.log)"; bad=1; }

echo
echo "== attention backward GPU check: $([ $bad -eq 0 ] && echo PASS || echo FAIL) ($(($(date +%s) - start))s; logs $LOGS)"
printf '%s\n' "${results[@]}"
echo "-- backward TFLOP/s (2.5x the forward's FLOPs), median of 10, L2 flushed, one process: 16 = the Hopper kernel"
echo "   as shipped before, 17 = + skip_masked (HD 128), 0 = shipped (+ the split schedule where items < SMs);"
echo "   cuDNN* = docs/perf.md's figure from an earlier run (commit 7e71c02), not this one"
cat "$table"
exit $bad
