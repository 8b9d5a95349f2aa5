#!/usr/bin/env bash
# Runs every test that needs no GPU (called by `make test` after the build). Each suite's output is
# shown; the last line is "N passed, N failed" and the exit status is non-zero if any suite failed.
cd "$(dirname "$0")/.." || exit 1
passed=0; failed=0; failed_names=()
run() {  # run NAME CMD...: the verdict line gives the suite's seconds
    local name=$1 t0=$SECONDS; shift
    echo "=== $name: $*"
    if "$@"; then passed=$((passed + 1)); echo "--- $name: PASS ($((SECONDS - t0)) s)"
    else failed=$((failed + 1)); failed_names+=("$name"); echo "--- $name: FAIL ($((SECONDS - t0)) s)"; fi
}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# The data-parallel suite spends most of its time waiting (rendezvous timeouts, killed ranks), so it runs in
# the background from the start; its output is shown, and it is counted, after the other suites.
dist_name="data parallel on the CPU: 2 ranks (mpirun, tcp) = 1 process at ZeRO 0/1/2 (AdamW and Muon), resume across world sizes, bad setups fail"
dist_log=$(mktemp /tmp/run_tests_dist.XXXXXX)
trap 'rm -f "$dist_log"; [ -n "${dist_pid:-}" ] && kill "$dist_pid" 2>/dev/null' EXIT
echo "=== $dist_name: started in the background: tests/cpu/test_distributed.sh"
dist_start=$(date +%s)
tests/cpu/test_distributed.sh > "$dist_log" 2>&1 &
dist_pid=$!
run "cpu reference vs PyTorch, GPT-2 and Llama-style (test_gpt2_cpu)" build/test_gpt2_cpu
run "cpu attention (MHA, GQA, MQA, window) vs PyTorch" build/test_attention_cpu
run "cpu Llama ops (RMSNorm, fused residual+RMSNorm, RoPE, SwiGLU) vs PyTorch" build/test_llama_ops_cpu
run "cpu trainer trains a Llama-style model from --init and resumes it exactly" tests/cpu/test_train_llama.sh
run "cpu decode attention through the KV cache (ring buffer, mixed lengths) vs the full forward" build/test_attention_decode_cpu
run "cpu cached forward (prefill + decode through the KV cache) and the trainer's samples vs the full forward" build/test_generate_cpu
run "cpu FP8 rounding (E4M3/E5M2 bit patterns, saturation, ties to even, nearest by brute force)" build/test_fp8_cpu
run "dataloader" build/test_dataloader
run "GPT-2 BPE encoder vs tiktoken's ids (fixture)" build/test_bpe
run "bad inputs give clear errors" tests/cpu/test_bad_inputs.sh
run "checkpoints under damage (interrupted saves, corruption, overwrite, kill)" tests/cpu/test_checkpoints.sh
run "ZeRO shards: plans tile the buffer, sharded state reads back at any world size, data position moves, gradient buckets and ZeRO-2 reduction" build/test_zero
# pytest-xdist, where installed, runs the Python suites on every core (-n auto)
XDIST=(); python3 -c "import xdist" 2>/dev/null && XDIST=(-n "${JOBS:-auto}")
run "python: data scripts, formats, HF import, BPE encoder vs tiktoken, generate_cpu" python3 -m pytest -q "${XDIST[@]}" tests/python
finish_dist() {  # the background suite's output, then its verdict
    wait "$dist_pid"; local rc=$?; dist_pid=
    local own=$(( $(stat -c %Y "$dist_log") - dist_start ))  # its log's last write: the suite's own seconds
    echo "=== $dist_name (ran in the background, ~$own s):"; cat "$dist_log"; [ $rc -eq 0 ]
}
run "$dist_name" finish_dist
echo
[ $failed -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
