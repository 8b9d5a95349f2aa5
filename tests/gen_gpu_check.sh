#!/usr/bin/env bash
# One GPU run for generate (issue 15): builds nothing (the binaries come built), ~3-4 minutes on an
# H200. Needs build/generate, build/generate_fp32, build/generate_cpu, dev/cuda/build/gemv and
# dev/cuda/build/rope, built beforehand with
#   make build/generate build/generate_fp32 build/generate_cpu && make -C dev/cuda build/gemv build/rope
# Runs, each under a timeout:
#   1. the GEMV lab (dev/cuda/gemv.cu: checks vs the CPU matmul at M = 1, 2, 4, 8, times vs cuBLASLt;
#      and its gemv-fused ops, the decode step's fused kernels vs the unfused ones)
#   2. the RoPE lab (rope_forward_at: per-row positions, idle rows untouched; and the rest of rope.cu)
#   3. tests/test_generate_gpu_hf.py: teacher-forced logits vs transformers (skipped without torch)
#   4. tests/test_generate_gpu.sh: twin, full-forward, graph, GEMV, bad-input, memcheck checks and the
#      BENCH_GEN / PROFILE lines (MEMCHECK=0 skips memcheck, BENCH=0 the speed runs); not its section
#      7 (the fused-vs-unfused checks), which tests/decode_speed_gpu.sh runs
# Last: one table (ok/FAIL per part, the GEMV shipped-vs-cuBLASLt times, the bench lines). Logs go
# to $GEN_CHECK_DIR (default a fresh /tmp directory); exit 1 if any part failed.
cd "$(dirname "$0")/.." || exit 1
OUT=${GEN_CHECK_DIR:-$(mktemp -d /tmp/gen_check.XXXXXX)}
mkdir -p "$OUT"
LAB=${LAB_BUILD:-dev/cuda/build}
for b in build/generate build/generate_fp32 build/generate_cpu $LAB/gemv $LAB/rope; do
    [ -x "$b" ] || { echo "error: $b is missing (build it first: see the top of $0)"; exit 1; }
done
parts=(); bad=0
part() {  # part NAME STATUS
    if [ "$2" -eq 0 ]; then parts+=("ok    $1"); else parts+=("FAIL  $1 (rc $2)"); bad=1; fi
}
t0=$SECONDS

echo "==== 1. GEMV lab"
timeout 150 $LAB/gemv --reps 20 > "$OUT/gemv.txt" 2>&1; st=$?
grep -E "FAIL|error" "$OUT/gemv.txt" | head -10
part "gemv lab (checks + timing) [$((SECONDS - t0)) s]" $st

echo "==== 2. RoPE lab"
t1=$SECONDS
timeout 60 $LAB/rope --reps 20 > "$OUT/rope.txt" 2>&1; st=$?
grep -E "FAIL|error" "$OUT/rope.txt" | head -10
part "rope lab incl. rope_forward_at [$((SECONDS - t1)) s]" $st

echo "==== 3. transformers teacher-forced check"
t1=$SECONDS
if python3 -c "import pytest, torch, transformers" 2> /dev/null; then
    timeout 120 python3 -m pytest -q -s tests/test_generate_gpu_hf.py > "$OUT/hf.txt" 2>&1; st=$?
    grep -E "HF_CHECK|passed|failed|skipped" "$OUT/hf.txt" | tail -6
    part "generate_fp32 vs transformers (Llama GQA/MHA, GPT-2) [$((SECONDS - t1)) s]" $st
else
    parts+=("skip  generate_fp32 vs transformers: no pytest/torch/transformers here")
fi

echo "==== 4. tests/test_generate_gpu.sh"
t1=$SECONDS
SECTIONS=123456 GPU_TEST_DIR="$OUT/gen" timeout 230 tests/test_generate_gpu.sh > "$OUT/gen.txt" 2>&1; st=$?
grep -E "^FAIL" "$OUT/gen.txt" | head -20
part "test_generate_gpu.sh: $(grep -E '^[0-9]+ passed' "$OUT/gen.txt" | tail -1) [$((SECONDS - t1)) s]" $st

echo
echo "==== GEMV lab: shipped (variant 0) vs cuBLASLt (variant 4), ms and GB/s (weights from DRAM)"
awk -F' [|] ' '/^gemv / && NF >= 6 {
    split($2, v, " "); key = $1
    if (v[1] == "0") { if (!(key in s_ms)) order[++n] = key; s_ms[key] = $3; s_gb[key] = $4 }
    if (v[1] == "4") { c_ms[key] = $3 }
    if (v[1] >= 1 && v[1] <= 3 && (best[key] == "" || $3 + 0 < best[key] + 0)) { best[key] = $3; bestv[key] = v[1] }
} END {
    printf "%-58s %9s %8s %9s %7s %s\n", "shape", "ship_ms", "GB/s", "cublas_ms", "speedup", "best R (ms)"
    for (i = 1; i <= n; i++) { k = order[i]
        printf "%-58s %9.4f %8.0f %9.4f %6.2fx R%d (%s)\n", k, s_ms[k], s_gb[k], c_ms[k], c_ms[k] / s_ms[k],
               2 ^ (bestv[k] - 1), best[k] }
}' "$OUT/gemv.txt"
echo
echo "==== generate: BENCH_GEN and PROFILE lines"
grep -E "^(BENCH_GEN|PROFILE|BENCH_HF)" "$OUT/gen.txt"
echo
echo "==== gen_gpu_check summary ($((SECONDS - t0)) s, logs in $OUT)"
for p in "${parts[@]}"; do echo "$p"; done
[ $bad -eq 0 ]
