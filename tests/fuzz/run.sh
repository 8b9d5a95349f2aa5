#!/usr/bin/env bash
# The sanitizer and fuzz checks; CI (.ci/run) runs them after `make test`. Needs clang++ (with its
# libFuzzer runtime), g++ and python3 with numpy. Builds only into build/sanitize/ and build/fuzz/.
#   1. The CPU tests (test_gpt2_cpu, test_attention_cpu, test_llama_ops_cpu, test_dataloader, test_bpe,
#      test_generate_cpu, test_zero) built with -fsanitize=address,undefined into build/sanitize/ and run once, as
#      tests/run_tests.sh runs them;
#      then the CPU trainer, built the same way, trains a tiny model (GQA, window) for 6 steps with
#      validation, samples and checkpoints, and resumes for 3 more; and runs tests/cpu/test_distributed.sh's
#      tcp cases (2 ranks over sockets, resume, failures).
#   2. Every tests/fuzz/fuzz_NAME.cpp built as a libFuzzer target build/fuzz/fuzz_NAME
#      (clang++ -fsanitize=fuzzer,address,undefined -g -O1 -DLLMC_FAIL_THROWS: fail() throws).
#   3. Each target runs every input in tests/fuzz/regressions/NAME/ and its seeds once, then fuzzes
#      for FUZZ_SECONDS from the seeds in tests/fuzz/seeds/NAME/ (committed) and
#      build/fuzz/seeds/NAME/ (written by tests/fuzz/make_seeds.py), keeping what it learns in
#      build/fuzz/corpus/NAME/.
# Any finding (a sanitizer report, an uncaught exception, a FUZZ_CHECK, a hang over 10 s, a leak)
# fails the script; the input that caused it is left in build/fuzz/artifacts/NAME/. Fix the bug,
# then commit the input under tests/fuzz/regressions/NAME/ so every later run replays it.
#
# Adding a target (e.g. fuzz_hellaswag.cpp): write tests/fuzz/fuzz_NAME.cpp like the others
# (include fuzz_common.h, catch FailError and nothing else, FUZZ_CHECK what the code promises),
# and give it seeds: small valid files committed in tests/fuzz/seeds/NAME/, or written by a few
# lines in make_seeds.py into OUT/NAME/. This script finds it by its file name; nothing else to edit.
#
# Usage: tests/fuzz/run.sh [NAME...]     (default: every target; NAME = model, state, ...)
# Environment: FUZZ_SECONDS per target (default 10; CI uses 60; 0 = replay only),
#   FUZZ_JOBS targets fuzzed at once (default: the number of cores), SANITIZE=0 skips step 1,
#   FUZZ_MAX_LEN (default 8192 bytes), FUZZ_ARGS (more libFuzzer flags, e.g. -use_value_profile=1),
#   CLANGXX (default clang++), CXX (default g++).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
FUZZ_SECONDS=${FUZZ_SECONDS:-10}
FUZZ_JOBS=${FUZZ_JOBS:-$(nproc)}
FUZZ_MAX_LEN=${FUZZ_MAX_LEN:-8192}
CLANGXX=${CLANGXX:-clang++}
CXX=${CXX:-g++}
OUT=build/fuzz
SAN=build/sanitize
# halt_on_error: the first report ends the run with a non-zero status, UBSan's included
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
findings=()

# ---- 1. the CPU tests under ASan + UBSan
if [ "${SANITIZE:-1}" != 0 ]; then
    mkdir -p "$SAN"
    san_flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
               -fopenmp -I.)
    declare -A san_src=([test_gpt2_cpu]=test_gpt2_cpu.cpp [test_attention_cpu]=tests/cpu/test_attention.cpp
                        [test_llama_ops_cpu]=tests/cpu/test_llama_ops.cpp [test_dataloader]=tests/cpu/test_dataloader.cpp
                        [test_bpe]=tests/cpu/test_bpe.cpp [test_generate_cpu]=tests/cpu/test_generate.cpp
                        [test_zero]=tests/cpu/test_zero.cpp)
    for t in test_gpt2_cpu test_attention_cpu test_llama_ops_cpu test_dataloader test_bpe test_generate_cpu test_zero; do
        echo "=== sanitize: build $SAN/$t"
        if ! nice "$CXX" "${san_flags[@]}" "${san_src[$t]}" -o "$SAN/$t" -lm; then
            findings+=("sanitize build $t"); continue
        fi
        echo "=== sanitize: run $SAN/$t"
        if "$SAN/$t" > "$SAN/$t.log" 2>&1; then
            echo "--- sanitize $t: clean ($(tail -n 1 "$SAN/$t.log"))"
        else
            tail -n 40 "$SAN/$t.log"
            echo "--- sanitize $t: FAIL (full output in $SAN/$t.log)"
            findings+=("sanitize $t")
        fi
    done
    echo "=== sanitize: build $SAN/train_gpt2_cpu"
    if nice "$CXX" "${san_flags[@]}" train_gpt2_cpu.cpp -o "$SAN/train_gpt2_cpu" -lm; then
        echo "=== sanitize: run $SAN/train_gpt2_cpu (6 steps, checkpoints, then --resume for 3 more)"
        run_dir=$(mktemp -d)
        python3 - "$run_dir" <<'EOF_PY'
import sys
import numpy as np
sys.path.insert(0, "scripts")
import llmc_formats as fmt
d = sys.argv[1]
cfg = dict(max_seq_len=16, vocab_size=64, padded_vocab_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
           channels=8, window=4)
rng = np.random.default_rng(0)
fmt.write_model(f"{d}/tiny.bin", cfg, rng.normal(0, 0.02, fmt.num_params(cfg)).astype(np.float32))
fmt.write_shard(f"{d}/train.bin", rng.integers(0, 64, 3000), 64)
fmt.write_shard(f"{d}/val.bin", rng.integers(0, 64, 500), 64)
fmt.write_tokenizer(f"{d}/tok.bin", [bytes([65 + i % 26]) for i in range(64)], 63)
EOF_PY
        common=(--train "$run_dir/train.bin" --val "$run_dir/val.bin" --tokenizer "$run_dir/tok.bin" --batch 2 --seq 8
                --total-batch 32 --ckpt-every 3 --val-every 3 --val-steps 2 --sample-every 3 --gen-tokens 8
                --log "$run_dir/out/log.txt")
        if "$SAN/train_gpt2_cpu" "${common[@]}" --init "$run_dir/tiny.bin" --steps 6 --out-dir "$run_dir/out" \
                > "$SAN/train_gpt2_cpu.log" 2>&1 &&
           "$SAN/train_gpt2_cpu" "${common[@]}" --steps 9 --resume "$run_dir/out" >> "$SAN/train_gpt2_cpu.log" 2>&1; then
            echo "--- sanitize train_gpt2_cpu: clean ($(grep -c '^step [0-9]*/' "$SAN/train_gpt2_cpu.log") steps)"
        else
            tail -n 40 "$SAN/train_gpt2_cpu.log"
            echo "--- sanitize train_gpt2_cpu: FAIL (full output in $SAN/train_gpt2_cpu.log)"
            findings+=("sanitize train_gpt2_cpu")
        fi
        rm -rf "$run_dir"
        # data parallel over the tcp rendezvous (the MPI cases skip: MPI's own allocations would be reported)
        echo "=== sanitize: tests/cpu/test_distributed.sh with $SAN/train_gpt2_cpu (tcp cases)"
        if TRAIN="$SAN/train_gpt2_cpu" TRAIN_MPI=/none tests/cpu/test_distributed.sh > "$SAN/test_distributed.log" 2>&1; then
            echo "--- sanitize test_distributed: clean ($(tail -n 1 "$SAN/test_distributed.log"))"
        else
            tail -n 40 "$SAN/test_distributed.log"
            echo "--- sanitize test_distributed: FAIL (full output in $SAN/test_distributed.log)"
            findings+=("sanitize test_distributed")
        fi
    else
        findings+=("sanitize build train_gpt2_cpu")
    fi
fi

# ---- 2. build the fuzz targets (only those whose sources changed), in parallel
if [ $# -gt 0 ]; then names=("$@")
else names=(); for f in tests/fuzz/fuzz_*.cpp; do n=${f#tests/fuzz/fuzz_}; names+=("${n%.cpp}"); done; fi
mkdir -p "$OUT"
fuzz_flags=(-std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DLLMC_FAIL_THROWS -I.)
build_target() {  # build_target NAME: prints nothing on success
    local src=tests/fuzz/fuzz_$1.cpp bin=$OUT/fuzz_$1
    [ -f "$src" ] || { echo "no such target: $src"; return 1; }
    if [ -x "$bin" ] && [ -z "$(find "$src" tests/fuzz/fuzz_common.h llmc -newer "$bin" \( -name '*.h' -o -name '*.cpp' \) 2>/dev/null)" ]; then
        return 0
    fi
    nice "$CLANGXX" "${fuzz_flags[@]}" "$src" -o "$bin.tmp" > "$OUT/fuzz_$1.build.log" 2>&1 && mv "$bin.tmp" "$bin" ||
        { cat "$OUT/fuzz_$1.build.log"; return 1; }
}
echo "=== fuzz: build ${names[*]}"
declare -A build_pid
for n in "${names[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_JOBS" ]; do wait -n; done
    build_target "$n" & build_pid[$n]=$!
done
built=()
for n in "${names[@]}"; do
    if wait "${build_pid[$n]}"; then built+=("$n"); else findings+=("build fuzz_$n"); fi
done

# ---- 3. replay regressions and seeds, then fuzz
python3 tests/fuzz/make_seeds.py "$OUT/seeds" || findings+=("make_seeds.py")
run_target() {  # run_target NAME: replays, fuzzes; the last line of its log is its summary
    local n=$1 bin=$OUT/fuzz_$1 log=$OUT/fuzz_$1.log
    local seed_dirs=() replay=()
    for d in "tests/fuzz/seeds/$n" "$OUT/seeds/$n"; do [ -d "$d" ] && seed_dirs+=("$d"); done
    mapfile -t replay < <(find "tests/fuzz/regressions/$n" "${seed_dirs[@]}" -type f 2>/dev/null | sort)
    mkdir -p "$OUT/corpus/$n" "$OUT/artifacts/$n"
    : > "$log"
    if [ ${#replay[@]} -gt 0 ] && ! "$bin" "${replay[@]}" >> "$log" 2>&1; then
        echo "fuzz_$n: FAIL replaying the regressions and seeds (see $log)" >> "$log"; return 1
    fi
    [ "$FUZZ_SECONDS" -gt 0 ] || { echo "fuzz_$n: replayed ${#replay[@]} inputs: ok" >> "$log"; return 0; }
    # shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags
    if ! nice "$bin" -max_total_time="$FUZZ_SECONDS" -timeout=10 -max_len="$FUZZ_MAX_LEN" -print_final_stats=1 \
            ${FUZZ_ARGS:-} -artifact_prefix="$OUT/artifacts/$n/" "$OUT/corpus/$n" "${seed_dirs[@]}" >> "$log" 2>&1; then
        echo "fuzz_$n: FINDING, input in $OUT/artifacts/$n/ (reproduce: $bin FILE)" >> "$log"; return 1
    fi
    local runs cov
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
    echo "fuzz_$n: replayed ${#replay[@]} inputs, fuzzed ${FUZZ_SECONDS} s: ${runs:-?} runs, ${cov:-cov: ?}, corpus $(ls "$OUT/corpus/$n" | wc -l) files: ok" >> "$log"
}
echo "=== fuzz: replay, then ${FUZZ_SECONDS} s per target, ${FUZZ_JOBS} at a time: ${built[*]}"
declare -A run_pid
for n in "${built[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_JOBS" ]; do wait -n; done
    run_target "$n" & run_pid[$n]=$!
done
for n in "${built[@]}"; do
    if wait "${run_pid[$n]}"; then tail -n 1 "$OUT/fuzz_$n.log"
    else tail -n 30 "$OUT/fuzz_$n.log"; findings+=("fuzz_$n"); fi
done

echo
if [ ${#findings[@]} -gt 0 ]; then echo "fuzz/sanitize: FAIL: ${findings[*]}"; exit 1; fi
echo "fuzz/sanitize: no findings"
