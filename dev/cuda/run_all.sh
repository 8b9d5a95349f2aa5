#!/usr/bin/env bash
# Runs every built kernel-lab binary, keeps each one's full output, and prints one table of the
# fixed-format lines (name | variant | ms | GB/s | TFLOP/s | % of H200 ceiling) last.
#   dev/cuda/run_all.sh [--check-only] [--reps N]      (arguments go to every binary)
# Binaries come from dev/cuda/build/ (or $LAB_BUILD, e.g. dev/cuda/build/fp32); logs go to
# $LAB_LOGS (default <build>/logs). Exits 1 if any check failed, any binary failed, or a lab file
# has no binary. The lab list is the Makefile's (`make list`).
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

# The table: each binary prints its lines again after the "# name | variant" header at exit.
echo
printf '%-58s | %-18s | %9s | %8s | %8s | %s\n' "name" "variant" "ms" "GB/s" "TFLOP/s" "% of H200 ceiling"
for lab in $labs; do
    [ -f "$logs/$lab.log" ] || continue
    awk -F' [|] ' '/^# name [|] variant/ { on = 1; next }
                  on && NF == 6 { printf "%-58s | %-18s | %9s | %8s | %8s | %s\n", $1, $2, $3, $4, $5, $6 }' \
        "$logs/$lab.log"
done
echo
if [ ${#failed[@]} -gt 0 ]; then
    echo "run_all: FAILED: ${failed[*]}"
    exit 1
fi
echo "run_all: every check passed"
