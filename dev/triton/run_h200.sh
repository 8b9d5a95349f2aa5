#!/usr/bin/env bash
# The lab beside Triton and torch.compile on a GPU machine, in one call, the combined table last:
#   1. every dev/triton script --check-only, all at once (every variant checked, every Triton kernel
#      and torch.compile graph compiled into the on-disk caches: this pass is compile-bound, so it
#      runs in parallel);
#   2. variant 0 (the shipped kernel) of each script's CUDA labs (compare.py --pairs; attention_forward
#      and attention_backward at the gpt2 shape only, attention_decode at all its configurations: it
#      has no --shape; with its variant 9 too, what generate runs at B > 8), from the binaries in
#      $LAB_BUILD (default dev/cuda/build; this script builds nothing: make -C dev/cuda first),
#      checked and timed by the lab's harness;
#   3. the scripts one after another, checked again and timed (the compiles now come from the caches);
#   4. the scripts' lines in the lab's format, then compare.py's table, one row an op:
#      op | ours CUDA | Triton | torch.compile | SDPA | units (SDPA: attention.py's and
#      attention_decode.py's scaled_dot_product_attention rows).
# Each run has a time limit (LAB_PY_LIMIT seconds, default 200), so one that hangs in a compiler
# cannot eat the lease, and the whole call a budget (LAB_BUDGET seconds, default 400): a run gets at
# most what is left of it, a run with nothing left is not started (both count as failures), and the
# tables are printed either way. The scripts alone took 85 s on an H200 before step 2 and the
# attention backward were added (docs/perf.md); attention_decode.py (34 shapes, ~16 torch.compile
# graphs) and its lab raised the defaults from 150 and 225 s, by estimate (not yet measured).
#   dev/triton/run_h200.sh [--reps N]          (default: the lab's ~0.5 s of repeats a variant)
#   LAB_PY_SMALL=1 dev/triton/run_h200.sh      adds a --small --check-only pass (awkward shapes)
#   LAB_CUDA=0 dev/triton/run_h200.sh          skips step 2 (the CUDA column stays empty)
#   LAB_ONLY=attention_decode dev/triton/run_h200.sh   only the scripts named (comma-separated) and their labs
# Logs go to $LAB_LOGS (default $OUT/triton_logs where OUT is set, else build/triton_logs at the top,
# git-ignored). A relative LAB_BUILD is taken from dev/cuda, as run_all.sh takes it (build/fp32).
# torch.compile runs in its default mode ($LAB_COMPILE_MODE changes it) with
# TORCHINDUCTOR_COMPILE_THREADS=1 unless set (a handful of small graphs a script: compiling
# in-process beats starting a worker pool).
# Exits 1 if any check, script or lab failed, or a lab binary is missing (with LAB_CUDA=1).
cd "$(dirname "$0")" || exit 1
logs=${LAB_LOGS:-${OUT:-../../build}/triton_logs}
build=${LAB_BUILD:-build}
[[ $build == /* ]] || build=../cuda/$build
limit=${LAB_PY_LIMIT:-200}
budget=${LAB_BUDGET:-400}
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-1}
for arg in "$@"; do
    case $arg in
        --reps|[0-9]*) ;;
        *) echo "run_h200: unknown argument '$arg' (usage: run_h200.sh [--reps N])"; exit 1 ;;
    esac
done
mkdir -p "$logs" || exit 1
t0=$(date +%s)
limited() {  # command...: runs it under the per-run limit cut to what is left of the budget; 125: none left
    local left=$((budget - ($(date +%s) - t0)))
    [ "$left" -gt "$limit" ] && left=$limit
    [ "$left" -le 5 ] && return 125
    if command -v timeout >/dev/null; then timeout -k 10 "$left" "$@"; else "$@"; fi
}
why() {  # exit status, seconds: a failed run's first words
    case $1 in
        124) echo "TIMED OUT after ${2}s (LAB_PY_LIMIT ${limit}s, LAB_BUDGET ${budget}s)" ;;
        125) echo "NOT RUN: nothing left of LAB_BUDGET (${budget}s)" ;;
        *) echo "FAILED with exit $1 (${2}s)" ;;
    esac
}
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'GPU', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')" ||
    { echo "run_h200: python3 cannot import torch and triton"; exit 1; }
pairs=$(python3 compare.py --pairs) || { echo "run_h200: compare.py --pairs failed"; exit 1; }
if [ -n "${LAB_ONLY:-}" ]; then  # e.g. LAB_ONLY=attention_decode,softmax: those scripts and their labs
    kept=""
    for pair in $pairs; do [[ ",$LAB_ONLY," == *",${pair%%:*},"* ]] && kept="$kept $pair"; done
    [ -n "$kept" ] || { echo "run_h200: LAB_ONLY=$LAB_ONLY names no script of: $(echo "$pairs" | sed 's/:[^ ]*//g' | tr '\n' ' ')"; exit 1; }
    pairs=$kept
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
failed=()
report() {  # pass, script, exit status, seconds
    local pass=$1 py=$2 rc=$3 secs=$4 log="$logs/${1}_$2.log"
    if [ "$rc" -eq 0 ] && grep -qE "^SKIPPED $py.py:" "$log"; then  # no torch, triton or GPU: nothing measured
        echo "== $pass $py.py: $(grep -E "^SKIPPED $py.py:" "$log" | head -1)"
        failed+=("$pass/$py(skipped)")
    elif [ "$rc" -eq 0 ]; then
        echo "== $pass $py.py: ok (${secs}s, log $log)"
        grep -E "^SKIPPED|first call" "$log" | head -12 | sed 's/^/   /'
    else
        echo "== $pass $py.py: $(why "$rc" "$secs"), log $log"
        grep -E "FAIL|[Ee]rror|SKIPPED" "$log" | head -20 | sed 's/^/   /'
        failed+=("$pass/$py")
    fi
}
run() {  # pass, script, args...: runs one script, writes its log
    local pass=$1 py=$2
    shift 2
    limited python3 "$py.py" "$@" >"$logs/${pass}_$py.log" 2>&1
}
parallel_pass() {  # pass, args...: every script at once, reported in order
    local pass=$1 start pair i=0 pids=()
    shift
    start=$(date +%s)
    for pair in $pairs; do
        run "$pass" "${pair%%:*}" "$@" &
        pids+=($!)
    done
    for pair in $pairs; do
        wait "${pids[$i]}"
        report "$pass" "${pair%%:*}" $? $(($(date +%s) - start))
        i=$((i + 1))
    done
}
parallel_pass check --check-only
[ "${LAB_PY_SMALL:-0}" = 1 ] && parallel_pass small --check-only --small
echo "run_h200: checks done after $(($(date +%s) - t0))s"

compare_logs=()
if [ "${LAB_CUDA:-1}" != 0 ]; then
    for lab in $(for pair in $pairs; do echo "${pair#*:}" | tr , ' '; done); do
        log="$logs/cuda_$lab.log"
        shape=() variants=(0)
        case $lab in attention_forward | attention_backward) shape=(--shape gpt2) ;; esac  # attention.py's one shape
        # attention_decode at B > 8: generate's call is variant 9's (compare.py, shipped_variant)
        [ "$lab" = attention_decode ] && variants=(0 9)
        rm -f "$log"
        if [ ! -x "$build/$lab" ]; then
            echo "== cuda $lab: NOT BUILT ($build/$lab; make -C dev/cuda build/$lab)"
            failed+=("cuda/$lab(not built)")
            continue
        fi
        start=$(date +%s)
        limited "$build/$lab" "${variants[@]}" "${shape[@]}" "$@" >"$log" 2>&1
        rc=$?
        secs=$(($(date +%s) - start))
        compare_logs+=("$log")
        if [ $rc -eq 0 ]; then
            echo "== cuda $lab ${variants[*]}: ok (${secs}s, log $log)"
        else
            echo "== cuda $lab ${variants[*]}: $(why "$rc" "$secs"), log $log"
            grep -E "FAIL|error" "$log" | head -20 | sed 's/^/   /'
            failed+=("cuda/$lab")
        fi
    done
fi

for pair in $pairs; do
    py=${pair%%:*}
    start=$(date +%s)
    run timed "$py" "$@"
    report timed "$py" $? $(($(date +%s) - start))
    compare_logs+=("$logs/timed_$py.log")
done

echo
printf '%-58s | %-18s | %9s | %8s | %8s | %s\n' "name" "variant" "ms" "GB/s" "TFLOP/s" "% of H200 ceiling"
for pair in $pairs; do
    py=${pair%%:*}
    [ -f "$logs/timed_$py.log" ] || continue
    awk -F' [|] ' '/^# name [|] variant/ { on = 1; next }
                  on && NF == 6 { printf "%-58s | %-18s | %9s | %8s | %8s | %s\n", $1, $2, $3, $4, $5, $6 }' \
        "$logs/timed_$py.log"
done
echo
python3 compare.py "${compare_logs[@]}"
echo
echo "run_h200: $(($(date +%s) - t0))s in all"
if [ ${#failed[@]} -gt 0 ]; then
    echo "run_h200: FAILED: ${failed[*]}"
    exit 1
fi
echo "run_h200: every check passed"
