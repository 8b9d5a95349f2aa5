#!/usr/bin/env bash
# make test: the build, the GPU compile checks and the suites, each phase timed; every phase runs
# even when one before it failed, so one run shows every failure. The last lines are each phase's
# seconds and status. Env (from the Makefile): MAKE, JOBS, HAS_NVCC (empty: no nvcc).
cd "$(dirname "$0")/.." || exit 1
MAKE=${MAKE:-make} JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
names=(); secs=(); states=(); failed=0
phase() {  # phase NAME CMD...
    local name=$1 t0 t1 rc; shift
    echo "=== make test: phase $name"
    t0=$(date +%s.%N); "$@"; rc=$?; t1=$(date +%s.%N)
    names+=("$name"); secs+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')")
    if [ $rc -eq 0 ]; then states+=(ok); else states+=(FAILED); failed=1; fi
}
J=(-j"$JOBS"); [[ ${MAKEFLAGS:-} == *jobserver* ]] && J=()
phase build "$MAKE" --no-print-directory "${J[@]}" -k --output-sync=target test-build
if [ -n "${HAS_NVCC:-}" ]; then phase gpu "$MAKE" --no-print-directory "${J[@]}" -k --output-sync=target test-gpu-compile
else echo "=== make test: no nvcc, so no GPU code is compiled (build/train_gpt2cu's flag checks skip)"; fi
phase run ./tests/run_tests.sh
echo
total=0
for i in "${!names[@]}"; do
    printf 'make test: %-6s %5s s  %s\n' "${names[$i]}" "${secs[$i]}" "${states[$i]}"
    total=$((total + secs[i]))
done
printf 'make test: %-6s %5s s  %s\n' total "$total" "$([ $failed -eq 0 ] && echo ok || echo FAILED)"
exit $failed
