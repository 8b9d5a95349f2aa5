#!/usr/bin/env bash
# Checkpoints and run files under damage (docs/formats.md, "Checkpoint directory"), on the CPU
# trainer with a tiny model: leftovers of interrupted saves are removed, a damaged newest
# checkpoint is skipped for the newest good one (and named), a checkpoint mixing two runs' files
# is refused, another run's checkpoints are never replaced without --overwrite 1, a diverging run
# stops without a checkpoint and keeps the good ones, a killed run's redirected output keeps its
# step lines, the step lines show the elapsed time and an ETA, and a Muon run resumes bit for bit,
# under --optimizer muon only. Where a GPU is present, the GPU
# trainer's share of these (NaN weights, divergence, fallback and bit-exact resume, /dev/full) runs too.
# Prints one line per case; exits non-zero if any case misbehaves.
cd "$(dirname "$0")/../.." || exit 1
TRAIN=${TRAIN:-build/train_gpt2_cpu}  # overridable, to show a case failing on an older build
[ -x "$TRAIN" ] || { echo "test_checkpoints: $TRAIN is missing, run make first"; exit 1; }
export OMP_NUM_THREADS=1  # tiny models: one thread is faster, and steadier on a loaded machine
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
T=$tmp

python3 - "$tmp" <<'EOF' || { echo "test_checkpoints: could not create the test files"; exit 1; }
import sys
import numpy as np
sys.path.insert(0, "scripts")
import llmc_formats as fmt
d = sys.argv[1]
cfg = dict(max_seq_len=16, vocab_size=64, padded_vocab_size=64, num_layers=1, num_heads=2,
           num_kv_heads=2, channels=8, window=0)
rng = np.random.default_rng(0)
params = rng.normal(0, 0.02, fmt.num_params(cfg)).astype(np.float32)
fmt.write_model(f"{d}/good.bin", cfg, params)
fmt.split_params(cfg, params)["lnfw"][:] = 3e38  # finite, but the first step's logits overflow
fmt.write_model(f"{d}/diverges.bin", cfg, params)
fmt.write_shard(f"{d}/train.bin", rng.integers(0, 64, 4000), 64)
EOF

ok=0; bad=0
pass() { ok=$((ok + 1)); echo "ok   $1"; }
flunk() { bad=$((bad + 1)); echo "BAD  $1: $2"; }
# run OUT CMD...: runs the trainer with stdout and stderr in OUT.out / OUT.err; returns its status
run() {
    local out=$1; shift
    "$TRAIN" --train "$T/train.bin" --batch 2 --seq 8 --val-every 0 "$@" >"$out.out" 2>"$out.err"
}
# the payload of a file, for comparing checkpoints of two runs (all bytes: the files carry no run id)
same_files() { cmp -s "$1" "$2"; }
flip_byte() {  # flip_byte FILE OFFSET: damages a file without changing its length
    python3 -c "import sys; f=open(sys.argv[1],'r+b'); f.seek(int(sys.argv[2])); b=f.read(1); f.seek(-1,1); f.write(bytes([b[0]^1]))" "$1" "$2"
}

# the reference: 4 steps, a checkpoint after each
run "$T/ref" --init "$T/good.bin" --steps 4 --ckpt-every 1 --out-dir "$T/ref" --log "$T/ref.log" ||
    { echo "test_checkpoints: the reference run failed: $(head -n 1 "$T/ref.err")"; exit 1; }

# 1. leftovers of interrupted saves: a step_N.tmp directory (this build), and from earlier builds a
#    *.tmp file in a complete checkpoint and a step directory without DONE
name="leftovers of interrupted saves are removed"
cp -r "$T/ref" "$T/c1" && rm -rf "$T/c1/step_00000003" "$T/c1/step_00000004"
mkdir "$T/c1/step_00000003.tmp" && head -c 100 "$T/good.bin" >"$T/c1/step_00000003.tmp/model.bin.tmp"
mkdir "$T/c1/step_00000007" && head -c 100 "$T/good.bin" >"$T/c1/step_00000007/model.bin.tmp"
head -c 100 "$T/good.bin" >"$T/c1/step_00000002/state.bin.tmp"
# (a trailing slash names the same directory)
if ! run "$T/c1" --steps 4 --ckpt-every 1 --resume "$T/c1/"; then flunk "$name" "exit $?: $(head -n 1 "$T/c1.err")"
elif [ -n "$(find "$T/c1" -name '*.tmp')" ] || [ -e "$T/c1/step_00000007" ]; then
    flunk "$name" "left: $(cd "$T/c1" && find . -name '*.tmp' -o -name 'step_00000007' | tr '\n' ' ')"
elif ! same_files "$T/c1/step_00000004/model.bin" "$T/ref/step_00000004/model.bin"; then
    flunk "$name" "the resumed run's step 4 differs from the reference"
else pass "$name"; fi

# 2. the newest checkpoint damaged (a flipped byte in state.bin; model.bin cut short): --resume
#    falls back to the newest good one, names the damaged one on stderr (stdout is the training
#    log), and the result is the reference's
name="a damaged newest checkpoint is skipped for the newest good one"
cp -r "$T/ref" "$T/c2"
flip_byte "$T/c2/step_00000004/state.bin" 5000
truncate -s -4 "$T/c2/step_00000003/model.bin"
if ! run "$T/c2" --steps 4 --ckpt-every 1 --resume "$T/c2"; then flunk "$name" "exit $?: $(head -n 1 "$T/c2.err")"
elif ! grep -q "step_00000004 is damaged" "$T/c2.err" || ! grep -q "step_00000003 is damaged" "$T/c2.err" ||
     ! grep -q "resuming from $T/c2/step_00000002 instead" "$T/c2.err" || grep -q "damaged" "$T/c2.out" ||
     ! grep -q "resumed from $T/c2/step_00000002 at step 2" "$T/c2.out"; then
    flunk "$name" "no fallback to step 2 reported on stderr: $(grep -m1 -e damaged -e resum "$T/c2.out" "$T/c2.err")"
elif ! same_files "$T/c2/step_00000004/state.bin" "$T/ref/step_00000004/state.bin"; then
    flunk "$name" "the rewritten step 4 differs from the reference"
else pass "$name"; fi

# 3. a checkpoint whose state.bin comes from another run (same step and data, another --lr): refused
name="a checkpoint mixing two runs' files is refused"
run "$T/other" --init "$T/good.bin" --steps 2 --lr 1e-2 --out-dir "$T/other" || flunk "$name" "the other run failed"
cp -r "$T/ref" "$T/c3" && cp "$T/other/step_00000002/state.bin" "$T/c3/step_00000002/state.bin"
run "$T/c3" --steps 4 --resume "$T/c3/step_00000002"; rc=$?
if [ $rc -ne 1 ] || ! grep -q "step_00000002: damaged checkpoint: state.bin" "$T/c3.err"; then
    flunk "$name" "exit $rc: $(head -n 1 "$T/c3.err")"
else pass "$name"; fi

# 4. a fresh run into --out-dir holding checkpoints: refused, the log untouched; --overwrite 1
#    deletes them (all, also those past this run's steps) and truncates the log
name="another run's checkpoints and log are kept unless --overwrite 1"
cp -r "$T/ref" "$T/c4" && cp "$T/ref.log" "$T/c4.log"
run "$T/c4" --init "$T/good.bin" --steps 2 --out-dir "$T/c4" --log "$T/c4.log"; rc=$?
if [ $rc -ne 1 ] || ! cmp -s "$T/c4.log" "$T/ref.log" || [ ! -e "$T/c4/step_00000004/DONE" ]; then
    flunk "$name" "exit $rc, log or checkpoints changed: $(head -n 1 "$T/c4.err")"
elif ! run "$T/c4" --init "$T/good.bin" --steps 2 --out-dir "$T/c4" --log "$T/c4.log" --overwrite 1; then
    flunk "$name" "--overwrite 1 failed: $(head -n 1 "$T/c4.err")"
elif [ -e "$T/c4/step_00000004" ] || [ "$(grep -c train_loss "$T/c4.log")" -ne 2 ]; then
    flunk "$name" "--overwrite 1 left step 4 or the old log lines"
else pass "$name"; fi

# 5. --resume from an older step with newer checkpoints in --out-dir: refused unless --overwrite 1
name="resuming an older step does not silently replace newer checkpoints"
cp -r "$T/ref" "$T/c5"
run "$T/c5" --steps 4 --ckpt-every 1 --resume "$T/c5/step_00000002"; rc=$?
if [ $rc -ne 1 ] || ! grep -q "newer than step 2" "$T/c5.err"; then flunk "$name" "exit $rc: $(head -n 1 "$T/c5.err")"
elif ! run "$T/c5" --steps 4 --ckpt-every 1 --resume "$T/c5/step_00000002" --overwrite 1 ||
     ! grep -q "deleted 2 checkpoints" "$T/c5.err" ||
     ! same_files "$T/c5/step_00000004/model.bin" "$T/ref/step_00000004/model.bin"; then
    flunk "$name" "--overwrite 1 did not delete steps 3-4 and retrain them: $(head -n 1 "$T/c5.err")"
else pass "$name"; fi

# 6. a run that diverges (NaN loss in its first step after the resume) stops with an error and
#    writes no checkpoint; the good one stays
name="a diverging run stops and keeps the last good checkpoint"
cp -r "$T/ref" "$T/c6" && rm -rf "$T/c6/step_00000002" "$T/c6/step_00000003" "$T/c6/step_00000004"
cp "$T/diverges.bin" "$T/c6/step_00000001/model.bin"  # as if step 1 had left the weights about to blow up
python3 -c "import sys; sys.path.insert(0, 'scripts'); import llmc_formats as f; d=sys.argv[1]; open(d + '/DONE', 'w').write(f.checkpoint_manifest(d, 1))" "$T/c6/step_00000001"
cp -r "$T/c6/step_00000001" "$T/c6_before"
run "$T/c6" --steps 4 --ckpt-every 1 --resume "$T/c6"; rc=$?
if [ $rc -ne 1 ] || ! grep -q "step 2: the loss is" "$T/c6.err"; then flunk "$name" "exit $rc: $(head -n 1 "$T/c6.err")"
elif [ "$(ls "$T/c6")" != "step_00000001" ] || ! diff -r "$T/c6/step_00000001" "$T/c6_before" >/dev/null; then
    flunk "$name" "the checkpoint directory changed: $(ls "$T/c6" | tr '\n' ' ')"
else pass "$name"; fi

# 7. a killed run's redirected stdout holds every line it printed: killed as soon as its first
#    step line shows, the output ends at a line's end and holds a few step lines. Block-buffered
#    output showed nothing until 4 KB (some 35 step lines) had piled up, and ended mid-line.
name="a killed run keeps its printed step lines"
"$TRAIN" --train "$T/train.bin" --data-vocab 64 --batch 4 --seq 64 --val-every 0 --init d1 --steps 100000 >"$T/c7.out" 2>&1 &
pid=$!
for _ in $(seq 1200); do grep -q "^step 1/" "$T/c7.out" && break; sleep 0.05; done
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
lines=$(grep -c "^step " "$T/c7.out")
if ! grep -q "^step 1/" "$T/c7.out" || [ "$lines" -gt 20 ] || [ -n "$(tail -c 1 "$T/c7.out")" ]; then
    flunk "$name" "$(wc -c <"$T/c7.out") bytes, $lines step lines, last byte '$(tail -c 1 "$T/c7.out")'"
else pass "$name"; fi

# 8. --resume drops the log lines past the checkpoint's step (the interrupted run's), so the log
#    holds each step once and ends like the uninterrupted run's
name="a resumed run's log has each step once"
VAL=(--val "$T/train.bin" --val-every 2 --val-steps 1)
run "$T/c8ref" --init "$T/good.bin" --steps 4 --ckpt-every 2 --out-dir "$T/c8" --log "$T/c8ref.log" "${VAL[@]}"
cp "$T/c8ref.log" "$T/c8.log" && rm -rf "$T/c8/step_00000004"
if ! run "$T/c8" --steps 4 --ckpt-every 2 --resume "$T/c8" --log "$T/c8.log" "${VAL[@]}"; then
    flunk "$name" "exit $?: $(head -n 1 "$T/c8.err")"
elif ! grep -q "dropped 4 lines" "$T/c8.err" ||  # train steps 3, 4; val at 2 (evaluated again) and 4
     ! diff <(cut -d' ' -f1-4 "$T/c8ref.log") <(cut -d' ' -f1-4 "$T/c8.log") >/dev/null; then
    flunk "$name" "$(grep dropped "$T/c8.err"); the log: $(cut -d' ' -f1-3 "$T/c8.log" | tr '\n' ',')"
else pass "$name"; fi

# 9. a checkpoint of an earlier build (DONE is "ok", no manifest) still resumes, to the same result
name="a checkpoint of an earlier build still resumes"
cp -r "$T/ref" "$T/c9" && rm -rf "$T/c9/step_00000003" "$T/c9/step_00000004" && echo ok >"$T/c9/step_00000002/DONE"
if ! run "$T/c9" --steps 4 --ckpt-every 1 --resume "$T/c9"; then flunk "$name" "exit $?: $(head -n 1 "$T/c9.err")"
elif ! same_files "$T/c9/step_00000004/state.bin" "$T/ref/step_00000004/state.bin"; then
    flunk "$name" "its step 4 differs from the reference's"
else pass "$name"; fi

# 10. the step lines show the elapsed time and an ETA
name="step lines show elapsed and ETA"
if grep -Eq "^step 4/4 .* elapsed [0-9]+h[0-9]{2}m[0-9]{2}s ETA 0h00m00s$" "$T/ref.out"; then pass "$name"
else flunk "$name" "got: $(grep -m1 '^step 4/4' "$T/ref.out")"; fi

# 11. a run killed while it wrote its first checkpoint leaves its log and a step_N.tmp: a new run
#     there is refused with the advice --overwrite 1 (not --resume: no checkpoint to resume), which works
name="after a kill in the first checkpoint the error suggests --overwrite 1"
mkdir -p "$T/c11/step_00000002.tmp" && head -c 100 "$T/good.bin" >"$T/c11/step_00000002.tmp/model.bin.tmp"
grep "^step 1 " "$T/ref.log" >"$T/c11.log"
run "$T/c11" --init "$T/good.bin" --steps 2 --ckpt-every 2 --out-dir "$T/c11" --log "$T/c11.log"; rc=$?
if [ $rc -ne 1 ] || ! grep -q -- "--overwrite 1 replaces the log" "$T/c11.err" || grep -q -- "--resume" "$T/c11.err"; then
    flunk "$name" "exit $rc: $(head -n 1 "$T/c11.err")"
elif ! run "$T/c11" --init "$T/good.bin" --steps 2 --ckpt-every 2 --out-dir "$T/c11" --log "$T/c11.log" --overwrite 1 ||
     [ ! -e "$T/c11/step_00000002/DONE" ]; then
    flunk "$name" "--overwrite 1 did not start the run again: $(head -n 1 "$T/c11.err")"
else pass "$name"; fi

# 12. --optimizer muon: a resumed run repeats the uninterrupted one bit for bit (Muon's momentum is
#     state.bin's m), and a checkpoint resumes only under the optimizer that wrote it (--init takes
#     its weights alone, with a fresh optimizer)
name="a Muon run resumes bit for bit"
MUON=(--optimizer muon --muon-lr 0.01 --muon-wd 0.1 --muon-adjust-lr match_rms_adamw)
if ! run "$T/m" --init "$T/good.bin" --steps 4 --ckpt-every 1 --out-dir "$T/m" "${MUON[@]}"; then
    flunk "$name" "the run failed: $(head -n 1 "$T/m.err")"
else
    cp -r "$T/m" "$T/m2" && rm -rf "$T/m2/step_00000003" "$T/m2/step_00000004"
    if ! run "$T/m2" --steps 4 --ckpt-every 1 --resume "$T/m2" "${MUON[@]}"; then
        flunk "$name" "the resume failed: $(head -n 1 "$T/m2.err")"
    elif ! diff -r "$T/m/step_00000004" "$T/m2/step_00000004" >/dev/null; then
        flunk "$name" "the resumed run's step 4 differs from the uninterrupted run's"
    elif same_files "$T/m/step_00000004/model.bin" "$T/ref/step_00000004/model.bin"; then
        flunk "$name" "its step 4 is the AdamW run's"
    else pass "$name"; fi
fi
name="a checkpoint resumes only under its own optimizer"
cp -r "$T/m/step_00000002" "$T/m3" && cp -r "$T/ref/step_00000002" "$T/m4"
run "$T/m3" --steps 4 --resume "$T/m3"; rc3=$?
run "$T/m4" --steps 4 --resume "$T/m4" "${MUON[@]}"; rc4=$?
if [ $rc3 -ne 1 ] || ! grep -q -- "--optimizer adamw: the checkpoint $T/m3 holds muon's optimizer state" "$T/m3.err"; then
    flunk "$name" "a Muon checkpoint under adamw: exit $rc3: $(head -n 1 "$T/m3.err")"
elif [ $rc4 -ne 1 ] || ! grep -q -- "--optimizer muon: the checkpoint $T/m4 holds adamw's optimizer state" "$T/m4.err"; then
    flunk "$name" "an AdamW checkpoint under muon: exit $rc4: $(head -n 1 "$T/m4.err")"
elif ! run "$T/m5" --init "$T/m4" --steps 2 --out-dir "$T/m5" "${MUON[@]}"; then
    flunk "$name" "--init of an AdamW checkpoint with --optimizer muon failed: $(head -n 1 "$T/m5.err")"
else pass "$name"; fi

# 13. the GPU trainer, where there is a GPU (same library code; a d1 model, --deterministic 1 so a
#     resumed run repeats bit for bit)
GPU=build/train_gpt2cu
if [ -x "$GPU" ] && nvidia-smi -L >/dev/null 2>&1; then
    python3 - "$tmp" <<'EOF2' || { echo "test_checkpoints: could not create the GPU test files"; exit 1; }
import sys
import numpy as np
sys.path.insert(0, "scripts")
import llmc_formats as fmt
d = sys.argv[1]
cfg = dict(max_seq_len=1024, vocab_size=50257, padded_vocab_size=50304, num_layers=1, num_heads=1,
           num_kv_heads=1, channels=64, window=0)  # d1
params = np.random.default_rng(1).normal(0, 0.02, fmt.num_params(cfg)).astype(np.float32)
fmt.split_params(cfg, params)["ln1w"][:] = 1.0
fmt.split_params(cfg, params)["ln2w"][:] = 1.0
fmt.split_params(cfg, params)["lnfw"][:] = 1.0
fmt.write_model(f"{d}/d1.bin", cfg, params)
fmt.split_params(cfg, params)["wte"][5, 3] = np.nan
fmt.write_model(f"{d}/d1_nan.bin", cfg, params)
fmt.split_params(cfg, params)["wte"][5, 3] = 0.01
fmt.split_params(cfg, params)["lnfw"][:] = 3e38  # finite (also in bf16), but the first step overflows
fmt.write_model(f"{d}/d1_diverges.bin", cfg, params)
EOF2
    gpu_run() {  # gpu_run OUT ARGS...
        local out=$1; shift
        "$GPU" --train "$T/train.bin" --data-vocab 64 --batch 4 --seq 64 --val-every 0 --deterministic 1 "$@" >"$out.out" 2>"$out.err"
    }
    name="GPU trainer: a model with a NaN weight is refused"
    gpu_run "$T/g1" --init "$T/d1_nan.bin" --steps 1; rc=$?
    if [ $rc -eq 1 ] && grep -q "d1_nan.bin: 1 of .* parameter values are not finite.*(wte)" "$T/g1.err"; then pass "$name"
    else flunk "$name" "exit $rc: $(head -n 1 "$T/g1.err")"; fi
    name="GPU trainer: a diverging run stops without a checkpoint"
    gpu_run "$T/g2" --init "$T/d1_diverges.bin" --steps 3 --ckpt-every 1 --out-dir "$T/g2"; rc=$?
    if [ $rc -eq 1 ] && grep -q "step 1: the .* is" "$T/g2.err" && [ -z "$(ls "$T/g2")" ]; then pass "$name"
    else flunk "$name" "exit $rc, checkpoints: $(ls "$T/g2" | tr '\n' ' '): $(head -n 1 "$T/g2.err")"; fi
    name="GPU trainer: a damaged newest checkpoint is skipped, the resumed run repeats bit for bit"
    if ! gpu_run "$T/g3" --init "$T/d1.bin" --steps 4 --ckpt-every 1 --out-dir "$T/g3" --log "$T/g3.log"; then
        flunk "$name" "the run failed: $(head -n 1 "$T/g3.err")"
    else
        cp -r "$T/g3/step_00000004" "$T/g3_step4"
        flip_byte "$T/g3/step_00000004/model.bin" 2000
        if ! gpu_run "$T/g3r" --steps 4 --ckpt-every 1 --resume "$T/g3" --log "$T/g3.log"; then
            flunk "$name" "the resume failed: $(head -n 1 "$T/g3r.err")"
        elif ! grep -q "step_00000004 is damaged" "$T/g3r.err" || ! diff -r "$T/g3/step_00000004" "$T/g3_step4" >/dev/null ||
             [ "$(grep -c train_loss "$T/g3.log")" -ne 4 ]; then
            flunk "$name" "no fallback, a different step 4, or a log without each step once"
        else pass "$name"; fi
    fi
    name="GPU trainer: --log on a full disk fails"
    gpu_run "$T/g4" --init d1 --steps 1 --log /dev/full; rc=$?
    if [ $rc -eq 1 ] && grep -q -- "--log /dev/full: write failed" "$T/g4.err"; then pass "$name"
    else flunk "$name" "exit $rc: $(head -n 1 "$T/g4.err")"; fi
else
    echo "skip GPU trainer cases (no $GPU or no GPU)"
fi

echo "test_checkpoints: $ok ok, $bad misbehaved"
[ $bad -eq 0 ]
