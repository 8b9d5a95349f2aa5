#!/usr/bin/env bash
# Runs every built kernel-lab binary, keeps each one's full output, and prints one table of the
# fixed-format lines (name | variant | ms | GB/s | TFLOP/s | % of H200 ceiling) last.
#   dev/cuda/run_all.sh [--check-only] [--reps N]      (arguments go to every binary)
#   LABS="layernorm rmsnorm" dev/cuda/run_all.sh        (only those labs, and the Python scripts that time them)
# Binaries come from dev/cuda/build/ (or $LAB_BUILD, e.g. dev/cuda/build/fp32); logs go to
# $LAB_LOGS (default <build>/logs). Exits 1 if any check failed, any binary failed, or a lab file
# has no binary. The lab list is the Makefile's (`make list`).
# Then the Python rows: dev/triton/<op>.py times the same ops written in Triton and as the kernels
# torch.compile generates (attention also through PyTorch's SDPA), in the same line format; each
# script's lines go in the table right after its lab's. They run when `python3 -c "import torch,
# triton"` works and PyTorch sees a GPU (only --check-only and --reps N are passed on); otherwise one
# line says why they were skipped. LAB_PYTHON=0 skips them, LAB_PYTHON=1 runs them in an fp32 build
# too (skipped there by default: they are bf16). A failed Python check fails the run like a lab's.
# After the table, dev/triton/compare.py's: one row an op, ours (the lab's variant 0) | Triton |
# torch.compile | (SDPA, where a script has sdpa rows) | units, from the same run's logs.
cd "$(dirname "$0")" || exit 1
build=${LAB_BUILD:-build}
logs=${LAB_LOGS:-$build/logs}
mkdir -p "$logs" || exit 1
if command -v make >/dev/null; then
    labs=$(make -s --no-print-directory list) || { echo "run_all: cannot read the lab list (make list)"; exit 1; }
else  # a machine that only runs the binaries: each lab file whose binary is here
    labs=$(for f in *.cu; do [ -x "$build/${f%.cu}" ] && [ "$f" != profile_gpt2.cu ] && echo "${f%.cu}"; done)
    echo "run_all: no make here; running the lab binaries found in $build:" $labs
fi
labs=$(echo $labs)
has() { [[ " $1 " == *" $2 "* ]]; }  # has "LIST" NAME: NAME is a word of LIST
if [ -n "${LABS:-}" ]; then  # LABS="layernorm rmsnorm": only these labs and the Python scripts that time them
    for lab in $LABS; do
        has "$labs" "$lab" || { echo "run_all: LABS names '$lab', which is not a lab here (the labs: $labs)"; exit 1; }
    done
    labs=$(echo $LABS)
fi
failed=()
for lab in $labs; do
    if [ ! -x "$build/$lab" ]; then
        echo "== $lab: NOT BUILT (run make -C dev/cuda)"
        failed+=("$lab(not built)")
        continue
    fi
    start=$(date +%s)
    "$build/$lab" "$@" >"$logs/$lab.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    if [ $rc -eq 0 ]; then
        echo "== $lab: ok (${secs}s, log $logs/$lab.log)"
    else
        echo "== $lab: FAILED with exit $rc (${secs}s); its failing lines:"
        grep -E "FAIL|error" "$logs/$lab.log" | head -20 | sed 's/^/   /'
        failed+=("$lab")
    fi
done

# The Python rows (dev/triton): script:lab[,lab] pairs (compare.py --pairs): the labs whose ops the
# script times; its lines follow the first one's.
py_dir=../triton
py_ran=()
py_args=()
while [ $# -gt 0 ]; do  # only the flags the scripts share with the binaries
    case $1 in
        --check-only) py_args+=("$1") ;;
        --reps) py_args+=("$1" "$2"); shift ;;
    esac
    shift
done
py_skip=""
if [ "${LAB_PYTHON:-auto}" = 0 ]; then
    py_skip="LAB_PYTHON=0"
elif [ "${LAB_PYTHON:-auto}" != 1 ] && [[ $build == *fp32* ]]; then
    py_skip="an fp32 build (the Python rows are bf16; LAB_PYTHON=1 runs them anyway)"
elif ! command -v python3 >/dev/null; then
    py_skip="no python3"
elif ! python3 -c "import torch, triton" >/dev/null 2>&1; then
    py_skip="python3 cannot import torch and triton"
elif ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    py_skip="PyTorch sees no GPU"
elif ! py_pairs=$(python3 "$py_dir/compare.py" --pairs); then
    py_skip="cannot read the script list ($py_dir/compare.py --pairs)"
fi
if [ -n "$py_skip" ]; then
    echo "== dev/triton (Triton and torch.compile rows): skipped: $py_skip"
else
    for pair in $py_pairs; do
        py=${pair%%:*}
        if [ -n "${LABS:-}" ]; then  # a script runs when one of the labs it goes with is picked
            picked=0
            for lab in $(echo "${pair#*:}" | tr , ' '); do has "$labs" "$lab" && picked=1; done
            [ $picked = 1 ] || continue
        fi
        start=$(date +%s)
        python3 "$py_dir/$py.py" "${py_args[@]}" >"$logs/py_$py.log" 2>&1
        rc=$?
        secs=$(($(date +%s) - start))
        py_ran+=("$pair")
        if [ $rc -eq 0 ]; then
            echo "== triton/$py.py: ok (${secs}s, log $logs/py_$py.log)"
            grep -E "^SKIPPED" "$logs/py_$py.log" | head -5 | sed 's/^/   /'
        else
            echo "== triton/$py.py: FAILED with exit $rc (${secs}s); its failing lines:"
            grep -E "FAIL|[Ee]rror" "$logs/py_$py.log" | head -20 | sed 's/^/   /'
            failed+=("triton/$py.py")
        fi
    done
fi

# The table: each binary (and script) prints its lines again after the "# name | variant" header at exit.
table_lines() {
    [ -f "$1" ] || return 0
    awk -F' [|] ' '/^# name [|] variant/ { on = 1; next }
                  on && NF == 6 { printf "%-58s | %-18s | %9s | %8s | %8s | %s\n", $1, $2, $3, $4, $5, $6 }' "$1"
}
echo
printf '%-58s | %-18s | %9s | %8s | %8s | %s\n' "name" "variant" "ms" "GB/s" "TFLOP/s" "% of H200 ceiling"
py_shown=" "
for lab in $labs; do
    table_lines "$logs/$lab.log"
    for pair in "${py_ran[@]}"; do
        first=${pair#*:}
        if [ "${first%%,*}" = "$lab" ]; then
            table_lines "$logs/py_${pair%%:*}.log"
            py_shown+="$pair "
        fi
    done
done
for pair in "${py_ran[@]}"; do  # scripts whose lab did not run here
    [[ $py_shown == *" $pair "* ]] || table_lines "$logs/py_${pair%%:*}.log"
done
if [ ${#py_ran[@]} -gt 0 ]; then  # the combined table: ours (variant 0) | Triton | torch.compile, one row an op
    echo
    py_logs=()
    for pair in "${py_ran[@]}"; do
        for lab in $(echo "${pair#*:}" | tr , ' '); do py_logs+=("$logs/$lab.log"); done
        py_logs+=("$logs/py_${pair%%:*}.log")
    done
    python3 "$py_dir/compare.py" "${py_logs[@]}"
fi
echo
if [ ${#failed[@]} -gt 0 ]; then
    echo "run_all: FAILED: ${failed[*]}"
    exit 1
fi
echo "run_all: every check passed"
