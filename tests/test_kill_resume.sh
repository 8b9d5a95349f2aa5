#!/usr/bin/env bash
# kill -9 at random, then --resume, over and over (the CPU trainer, a tiny model, 120 steps, a
# checkpoint every 2). After every kill: every step_N directory verifies (its DONE matches both files)
# and holds exactly the files of an uninterrupted run at that step, and no checkpoint seen before
# has gone (no lost and no mixed checkpoint). Every fifth restart resumes an older checkpoint with
# --overwrite 1, so kills also land while newer checkpoints are deleted and rewritten. At the end
# the run is let finish: no *.tmp is left and its directory equals the uninterrupted run's byte for
# byte (the CPU trainer is deterministic). KILLS (default 24) sets the number of kills.
cd "$(dirname "$0")/.." || exit 1
TRAIN=${TRAIN:-build/train_gpt2_cpu}  # overridable, to show the test failing on an older build
[ -x "$TRAIN" ] || { echo "test_kill_resume: $TRAIN is missing, run make first"; exit 1; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
KILLS=${KILLS:-24}
RANDOM=13  # a fixed seed: the same kill times each run
# on tmpfs where there is one: fsync costs nothing there, and a kill -9 (unlike a power cut) loses
# nothing that reached the page cache, so the test covers the same protocol in seconds, not minutes
tmp=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
trap 'rm -rf "$tmp"' EXIT
T=$tmp

python3 - "$tmp" <<'EOF' || { echo "test_kill_resume: could not create the test files"; exit 1; }
import sys
import numpy as np
sys.path.insert(0, "scripts")
import llmc_formats as fmt
d = sys.argv[1]
cfg = dict(max_seq_len=16, vocab_size=64, padded_vocab_size=64, num_layers=1, num_heads=2,
           num_kv_heads=2, channels=8, window=0)
rng = np.random.default_rng(0)
fmt.write_model(f"{d}/good.bin", cfg, rng.normal(0, 0.02, fmt.num_params(cfg)).astype(np.float32))
fmt.write_shard(f"{d}/train.bin", rng.integers(0, 64, 4000), 64)
EOF

# the invariants after a kill, checked against the uninterrupted run; SEEN lists the checkpoints
# that must still exist
cat >"$T/check.py" <<'EOF'
import filecmp, os, sys
sys.path.insert(0, "scripts")
import llmc_formats as fmt
ref, run, seen_file = sys.argv[1:4]
seen = set(open(seen_file).read().split())
now = sorted(n for n in os.listdir(run) if n.startswith("step_") and not n.endswith(".tmp"))
problems = [f"{n} is gone" for n in sorted(seen - set(now))]
for n in now:
    why = fmt.checkpoint_problem(os.path.join(run, n))
    if why:
        problems.append(f"{n}: {why}")
    elif any(not filecmp.cmp(os.path.join(run, n, f), os.path.join(ref, n, f), shallow=False)
             for f in fmt.CHECKPOINT_FILES):
        problems.append(f"{n} differs from the uninterrupted run's")
open(seen_file, "w").write("\n".join(now))
print("; ".join(problems))
EOF

STEPS=120
ARGS=(--train "$T/train.bin" --batch 2 --seq 8 --val-every 0 --steps $STEPS --ckpt-every 2)
start=$(date +%s.%N)
"$TRAIN" "${ARGS[@]}" --init "$T/good.bin" --out-dir "$T/ref" >"$T/ref.out" 2>&1 ||
    { echo "test_kill_resume: the uninterrupted run failed: $(tail -n 1 "$T/ref.out")"; exit 1; }
ref_ms=$(python3 -c "import sys, time; print(int((time.time() - float(sys.argv[1])) * 1000))" "$start")
echo "uninterrupted run: ${ref_ms} ms, $(ls "$T/ref" | wc -l) checkpoints"

RUN=$T/run
: >"$T/seen"
bad=0; kills=0; restarts=0
while [ $kills -lt "$KILLS" ]; do
    restarts=$((restarts + 1))
    complete=($(cd "$RUN" 2>/dev/null && ls -d step_* 2>/dev/null | grep -v '\.tmp$'))
    if [ ${#complete[@]} -eq 0 ]; then
        how=(--init "$T/good.bin" --out-dir "$RUN")
    elif [ ${#complete[@]} -ge 3 ] && { [ $((restarts % 5)) -eq 0 ] || [ "${complete[-1]}" = step_$(printf %08d $STEPS) ]; }; then
        # an older checkpoint, deleting the newer ones (also once the run is complete)
        older=${complete[$((RANDOM % (${#complete[@]} - 1)))]}
        how=(--resume "$RUN/$older" --overwrite 1)
        (cd "$RUN" && ls -d step_* | grep -v '\.tmp$' | awk -v o="$older" '$0 <= o') >"$T/seen"
    else
        how=(--resume "$RUN")
    fi
    "$TRAIN" "${ARGS[@]}" "${how[@]}" >"$T/out" 2>&1 &
    pid=$!
    # a kill within the first 1/6 of the uninterrupted run's time (start-up included)
    sleep "$(python3 -c "import sys; print(int(sys.argv[1]) * int(sys.argv[2]) / 32768 / 6000)" $RANDOM "$ref_ms")"
    if kill -9 $pid 2>/dev/null; then
        wait $pid 2>/dev/null
        kills=$((kills + 1))
    else
        wait $pid; rc=$?
        if [ $rc -ne 0 ]; then bad=$((bad + 1)); echo "BAD  restart $restarts (${how[*]}) failed: $(tail -n 1 "$T/out")"; break; fi
        echo "restart $restarts finished before its kill"
    fi
    problems=$(python3 "$T/check.py" "$T/ref" "$RUN" "$T/seen")
    if [ -n "$problems" ]; then bad=$((bad + 1)); echo "BAD  after kill $kills: $problems"; fi
done
echo "$kills kills over $restarts restarts, $(ls "$RUN" | wc -l) entries in the run directory"

# let it finish
if ! "$TRAIN" "${ARGS[@]}" --resume "$RUN" >"$T/out" 2>&1; then
    bad=$((bad + 1)); echo "BAD  the final resume failed: $(tail -n 1 "$T/out")"
fi
left=$(cd "$RUN" && find . -name '*.tmp')
if [ -n "$left" ]; then bad=$((bad + 1)); echo "BAD  leftovers: $left"; fi
if ! diff -r "$T/ref" "$RUN" >"$T/diff" 2>&1; then
    bad=$((bad + 1)); echo "BAD  the finished run differs from the uninterrupted one: $(head -n 3 "$T/diff")"
else echo "ok   the finished run equals the uninterrupted one, byte for byte ($(ls "$RUN" | wc -l) checkpoints)"; fi
echo "test_kill_resume: $kills kills, $bad problems"
[ $bad -eq 0 ]
