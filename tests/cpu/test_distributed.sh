#!/usr/bin/env bash
# Data-parallel training on the CPU with real processes (docs/distributed.md): the ZeRO stages of
# llmc/zero.h over MPI (build/train_gpt2_cpu_mpi under `mpirun -np 2`, oversubscribed) and over the
# tcp/file rendezvous of llmc/dist.h (build/train_gpt2_cpu, two processes started here).
#  - 2 ranks give the losses of 1 process with the same total batch (gradient accumulation 4 vs 2
#    micro-batches per rank), within 2e-5, at --zero 0, 1 and 2 (a tiny Llama-style model; a GPT-2 d1
#    at --zero 2); the tcp group at --zero 2 too (its star reduce_sum); --zero 2 also without
#    accumulation (1 micro-batch per rank against 2 in 1 process), each bucket reduced once a step,
#    and at 3 ranks (mpirun -np 3: pieces for three owners, uneven slices);
#  - 1 process at --zero 2 (every gradient through the bucket buffers and their reduction at world
#    size 1) is bit-identical to the plain run: the same log, the same final checkpoint bytes;
#  - a 2-rank run resumed at 2 ranks ends bit-identical to the uninterrupted one (the shards of the
#    optimizer state round-trip); resumed at 1 rank from the 2-rank checkpoint, and at 2 ranks from
#    a 1-rank one (resharding), it continues with the same losses;
#  - --optimizer muon at --zero 1 and 2 (each rank updating whole matrices) at 2 ranks, under mpirun
#    and tcp: bit-identical final weights to --zero 0 at 2 ranks (the same summed gradients, the same
#    Newton-Schulz on the same whole matrices), the losses of 1 process within 2e-5 and its final
#    weights within 1e-5 (1 process sums the micro-batches in another order); the same losses at 3
#    ranks; resumed at 2 ranks from step 5 it ends bit-identical, its checkpoint resumed at --zero 0
#    ends bit-identical (the momentum went from the owners into the state files' layout), and at 1
#    rank it continues with the same losses; ranks started with different --optimizer are refused;
#  - bad setups fail with a clear error within a deadline, never a hang: a world size that cannot
#    continue a checkpoint's data position, --world-size against mpirun's, ranks started with
#    different world sizes, an unreachable rendezvous, a rank left alone, a rank that dies (under
#    MPI and under tcp), the plain binary launched by mpirun.
# Without mpirun the MPI cases print SKIPPED; the tcp cases always run. About 40 s on 2 cores.
cd "$(dirname "$0")/../.." || exit 1
TRAIN=${TRAIN:-build/train_gpt2_cpu}
TRAIN_MPI=${TRAIN_MPI:-build/train_gpt2_cpu_mpi}
[ -x "$TRAIN" ] || { echo "test_distributed: $TRAIN is missing, run make first"; exit 1; }
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT

python3 - "$tmp" <<'PY' || { echo "test_distributed: could not create the token shards"; exit 1; }
import sys
import numpy as np
sys.path.insert(0, "scripts")
import llmc_formats as fmt
rng = np.random.default_rng(0)
cycle = rng.permutation(64)
toks = np.tile(cycle, 400)
noisy = rng.random(toks.size) < 0.2  # a noisy cycle: the loss falls but stays well above 0
toks[noisy] = rng.integers(0, 64, noisy.sum())
fmt.write_shard(f"{sys.argv[1]}/train.bin", toks, 64)
fmt.write_shard(f"{sys.argv[1]}/val.bin", np.tile(cycle, 50), 64)
PY

ok=0; bad=0; skipped=0
pass() { ok=$((ok + 1)); echo "ok   $1"; }
flunk() { bad=$((bad + 1)); echo "BAD  $1: $2"; }
skip() { skipped=$((skipped + 1)); echo "SKIPPED $1: $2"; }
have_mpi=1
if ! command -v mpirun >/dev/null; then have_mpi=0; why_skip="mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
elif [ ! -x "$TRAIN_MPI" ]; then have_mpi=0; why_skip="$TRAIN_MPI not built (make builds it when mpicxx exists)"; fi
MPIRUN=(mpirun --oversubscribe --allow-run-as-root --bind-to none)
# containers often forbid the cross-memory attach OpenMPI's shared-memory transport tries first
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
mpi2() { timeout 120 "${MPIRUN[@]}" -np 2 "$TRAIN_MPI" "$@"; }
port=$((20000 + RANDOM % 20000))
# two ranks of the plain binary over --dist-init tcp://127.0.0.1:PORT (a fresh port each); rank 1's
# output goes to $tmp/$1.r1, rank 0's to stdout
tcp2() {
    local name=$1; shift; port=$((port + 1))
    RANK=1 WORLD_SIZE=2 timeout 120 "$TRAIN" "$@" --dist-init "tcp://127.0.0.1:$port" >"$tmp/$name.r1" 2>&1 &
    pids+=($!)
    RANK=0 WORLD_SIZE=2 timeout 120 "$TRAIN" "$@" --dist-init "tcp://127.0.0.1:$port"
}

RUN=(--train "$tmp/train.bin" --val "$tmp/val.bin" --init llama:L2,C32,H4,KV2,V64,untied --max-seq 16 --batch 4
     --seq 16 --total-batch 256 --steps 10 --lr 1e-2 --warmup 2 --val-every 5 --val-steps 4 --ckpt-every 5)
# the largest |difference| of the train_loss and val_loss lines of two logs (which must list the same steps)
maxdiff() {
    python3 - "$1" "$2" <<'PY'
import sys
def read(p):
    return [(l.split()[1], l.split()[2], float(l.split()[3])) for l in open(p) if l.split()[2] in ("train_loss", "val_loss")]
a, b = read(sys.argv[1]), read(sys.argv[2])
if [x[:2] for x in a] != [x[:2] for x in b] or not a:
    print("steps differ"); sys.exit(1)
print("%.3g" % max(abs(x[2] - y[2]) for x, y in zip(a, b)))
PY
}
within() { awk -v d="$1" -v t="$2" 'BEGIN { exit !(d + 0 <= t + 0) }' 2>/dev/null; }
# runs a case that must fail: within $2 seconds, with an error line matching $3
must_fail() {  # must_fail NAME SECONDS PATTERN OUTFILE CMD...
    local name=$1 limit=$2 pattern=$3 out=$4; shift 4
    local t0=$SECONDS
    if "$@" >"$out" 2>&1; then flunk "$name" "it succeeded"; return; fi
    local took=$((SECONDS - t0))
    if [ $took -gt "$limit" ]; then flunk "$name" "took ${took} s (limit $limit)"
    elif ! grep -qE "$pattern" "$out"; then flunk "$name" "no error matching '$pattern': $(grep -m 1 error "$out")"
    else pass "$name ($(grep -m 1 -E "$pattern" "$out" | cut -c 1-150)...; ${took} s)"; fi
}
# `mpirun -np NP` of FLAGS --zero ZERO: the losses of 1 process of FLAGS within 2e-5
cases=0
same_losses_as_one() {  # same_losses_as_one NAME NP ZERO FLAGS...
    local name=$1 np=$2 zero=$3 at=$tmp/same$((++cases)) d; shift 3
    if [ $have_mpi = 0 ]; then skip "$name" "$why_skip"; return; fi
    if ! "$TRAIN" "$@" --log "$at.one.log" >"$at.one.out" 2>&1; then flunk "$name" "1 process: $(tail -n 1 "$at.one.out")"
    elif ! timeout 120 "${MPIRUN[@]}" -np "$np" "$TRAIN_MPI" "$@" --zero "$zero" --log "$at.log" >"$at.out" 2>&1; then
        flunk "$name" "$(grep -m 1 error "$at.out")"
    else
        d=$(maxdiff "$at.one.log" "$at.log")
        if within "$d" 2e-5; then pass "$name: max |loss difference| $d"; else flunk "$name" "max |loss difference| $d"; fi
    fi
}

# resumes a copy (in $3) of $2's step-5 checkpoint with CMD --resume $3: its step-10 files ($4) must
# be bit-identical to $2's
resumed_same() {  # resumed_same NAME FROM TO "FILES" CMD...
    local name=$1 from=$2 to=$3 files=$4; shift 4
    mkdir -p "$to" && cp -r "$from/step_00000005" "$to/"
    if ! "$@" --resume "$to" >"$to.out" 2>&1; then flunk "$name" "$(grep -m 1 error "$to.out")"
    elif ! (cd "$from/step_00000010" && for f in $files; do cmp -s "$f" "$to/step_00000010/$f" || exit 1; done); then
        flunk "$name" "the step-10 files ($files) differ"
    else pass "$name"; fi
}

# ------------------------------------------------------------------- same losses as one process
"$TRAIN" "${RUN[@]}" --out-dir "$tmp/one" --log "$tmp/one.log" >"$tmp/one.out" 2>&1 ||
    { echo "test_distributed: the 1-process run failed: $(tail -n 1 "$tmp/one.out")"; exit 1; }
for z in 0 1 2; do
    name="mpirun -np 2 --zero $z: the losses of 1 process with the same total batch"
    if [ $have_mpi = 0 ]; then skip "$name" "$why_skip"; continue; fi
    if ! mpi2 "${RUN[@]}" --zero $z --out-dir "$tmp/z$z" --log "$tmp/z$z.log" >"$tmp/z$z.out" 2>&1; then
        flunk "$name" "exit $?: $(grep -m 1 error "$tmp/z$z.out")"; continue; fi
    d=$(maxdiff "$tmp/one.log" "$tmp/z$z.log")
    if within "$d" 2e-5; then pass "$name: max |loss difference| $d over 10 steps and 3 validations"
    else flunk "$name" "max |loss difference| $d"; fi
done

name="1 process --zero 2 (the bucket buffers at world size 1): bit-identical to the plain run"
if ! "$TRAIN" "${RUN[@]}" --zero 2 --out-dir "$tmp/one_z2" --log "$tmp/one_z2.log" >"$tmp/one_z2.out" 2>&1; then
    flunk "$name" "exit $?: $(grep -m 1 error "$tmp/one_z2.out")"
elif ! cmp -s <(grep -E 'train_loss|val_loss' "$tmp/one.log" | cut -d' ' -f1-4) \
              <(grep -E 'train_loss|val_loss' "$tmp/one_z2.log" | cut -d' ' -f1-4); then
    flunk "$name" "the losses differ"
elif ! cmp -s "$tmp/one/step_00000010/model.bin" "$tmp/one_z2/step_00000010/model.bin" ||
     ! cmp -s "$tmp/one/step_00000010/state.bin" "$tmp/one_z2/step_00000010/state.bin"; then
    flunk "$name" "the step-10 checkpoints differ"
else pass "$name ($(grep -m 1 '^gradients' "$tmp/one_z2.out"))"; fi

same_losses_as_one "mpirun -np 2 --zero 2 without accumulation (1 micro-batch a rank): the losses of 1 process" 2 2 \
    "${RUN[@]}" --total-batch 128 --ckpt-every 0
same_losses_as_one "mpirun -np 3 --zero 2 (three owners, uneven slices, 2 micro-batches a rank): the losses of 1 process" \
    3 2 "${RUN[@]}" --total-batch 384 --ckpt-every 0
same_losses_as_one "mpirun -np 2 --zero 2, a GPT-2 (d1: LayerNorm, biases, learned positions): the losses of 1 process" \
    2 2 --train "$tmp/train.bin" --data-vocab 64 --init d1 --max-seq 16 --batch 4 --seq 16 --total-batch 256 --steps 4 \
    --lr 1e-3 --warmup 1 --val-every 0 --ckpt-every 0

name="tcp rendezvous, 2 ranks, --zero 2: the losses of 1 process"
if ! tcp2 tcp "${RUN[@]}" --zero 2 --out-dir "$tmp/tcp" --log "$tmp/tcp.log" >"$tmp/tcp.out" 2>&1; then
    flunk "$name" "exit $?: $(grep -h -m 1 error "$tmp/tcp.out" "$tmp/tcp.r1")"
else
    wait
    d=$(maxdiff "$tmp/one.log" "$tmp/tcp.log")
    shards=$(ls "$tmp/tcp/step_00000010" | tr '\n' ' ')
    if ! within "$d" 2e-5; then flunk "$name" "max |loss difference| $d"
    elif [ "$shards" != "DONE model.bin state_00000.bin state_00001.bin " ]; then flunk "$name" "checkpoint holds $shards"
    else pass "$name: max |loss difference| $d; the checkpoint holds $shards"; fi
fi

# ------------------------------------------------------------------- Muon: whole matrices per rank
# 1 micro-batch a rank at 2 ranks (total batch 128), so --zero 2's reductions sum what --zero 0's do
MU=("${RUN[@]}" --optimizer muon --total-batch 128)
"$TRAIN" "${MU[@]}" --out-dir "$tmp/mu_one" --log "$tmp/mu_one.log" >"$tmp/mu_one.out" 2>&1 ||
    { echo "test_distributed: the 1-process Muon run failed: $(tail -n 1 "$tmp/mu_one.out")"; exit 1; }
# the largest |difference| of two checkpoints' model.bin weights (same shape)
weightdiff() {
    python3 -c "import sys, numpy as np; a, b = (np.fromfile(p, np.float32)[256:] for p in sys.argv[1:]); print('%.3g' % abs(a - b).max())" "$1" "$2"
}
if [ $have_mpi = 1 ] && mpi2 "${MU[@]}" --zero 0 --out-dir "$tmp/mu0" >"$tmp/mu0.out" 2>&1; then
    for z in 1 2; do
        name="mpirun -np 2 --optimizer muon --zero $z: the weights of --zero 0 at 2 ranks, the losses of 1 process"
        if ! mpi2 "${MU[@]}" --zero $z --out-dir "$tmp/mu$z" --log "$tmp/mu$z.log" >"$tmp/mu$z.out" 2>&1; then
            flunk "$name" "exit $?: $(grep -m 1 error "$tmp/mu$z.out")"; continue; fi
        d=$(maxdiff "$tmp/mu_one.log" "$tmp/mu$z.log")
        w=$(weightdiff "$tmp/mu_one/step_00000010/model.bin" "$tmp/mu$z/step_00000010/model.bin")
        if ! cmp -s "$tmp/mu0/step_00000010/model.bin" "$tmp/mu$z/step_00000010/model.bin"; then
            flunk "$name" "the step-10 weights differ from --zero 0's"
        elif ! within "$d" 2e-5 || ! within "$w" 1e-5; then flunk "$name" "max |loss difference| $d, |weight difference| $w"
        else pass "$name: bit-identical; against 1 process max |loss difference| $d, |weight difference| $w ($(grep -m 1 '^muon:' "$tmp/mu$z.out"))"; fi
    done

    name="tcp rendezvous, 2 ranks, --optimizer muon --zero 2 (broadcasts from rank 1): the weights of --zero 0"
    if ! tcp2 mutcp "${MU[@]}" --zero 2 --out-dir "$tmp/mutcp" >"$tmp/mutcp.out" 2>&1; then
        flunk "$name" "exit $?: $(grep -h -m 1 error "$tmp/mutcp.out" "$tmp/mutcp.r1")"
    elif wait && cmp -s "$tmp/mu0/step_00000010/model.bin" "$tmp/mutcp/step_00000010/model.bin"; then pass "$name"
    else flunk "$name" "the step-10 weights differ"; fi

    same_losses_as_one "mpirun -np 3 --optimizer muon --zero 2 (three owners): the losses of 1 process" 3 2 \
        "${MU[@]}" --total-batch 192 --ckpt-every 0

    resumed_same "2 ranks muon --zero 2 resumed at 2 ranks from step 5: ends bit-identical to the uninterrupted run" \
        "$tmp/mu2" "$tmp/mur2" "model.bin state_00000.bin state_00001.bin" mpi2 "${MU[@]}" --zero 2
    resumed_same "... the same checkpoint resumed at 2 ranks --zero 0: ends bit-identical" \
        "$tmp/mu2" "$tmp/mur0" model.bin mpi2 "${MU[@]}" --zero 0

    name="... and at 1 rank --zero 1: continues with the same losses"
    mkdir -p "$tmp/mur1" && cp -r "$tmp/mu2/step_00000005" "$tmp/mur1/"
    if ! "$TRAIN" "${MU[@]}" --zero 1 --resume "$tmp/mur1" --log "$tmp/mur1.log" >"$tmp/mur1.out" 2>&1; then
        flunk "$name" "exit $?: $(grep -m 1 error "$tmp/mur1.out")"
    else
        d=$(maxdiff <(grep -E '^step ([6-9]|10) ' "$tmp/mu2.log") <(grep -E '^step ([6-9]|10) ' "$tmp/mur1.log"))
        if within "$d" 2e-5; then pass "$name: max |loss difference| $d over steps 6-10"
        else flunk "$name" "max |loss difference| $d"; fi
    fi
elif [ $have_mpi = 1 ]; then flunk "mpirun -np 2 --optimizer muon --zero 0" "exit: $(grep -m 1 error "$tmp/mu0.out")"
else skip "--optimizer muon at 2 and 3 ranks" "$why_skip"; fi
port=$((port + 1))
RANK=1 WORLD_SIZE=2 timeout 60 "$TRAIN" "${MU[@]}" --ckpt-every 0 --zero 1 --optimizer adamw \
    --dist-init "tcp://127.0.0.1:$port" >"$tmp/mubad.r1" 2>&1 &
pids+=($!)
must_fail "ranks started with different --optimizer (tcp)" 30 "the ranks disagree on --optimizer" "$tmp/mubad.out" \
    env RANK=0 WORLD_SIZE=2 timeout 60 "$TRAIN" "${MU[@]}" --ckpt-every 0 --zero 1 --dist-init "tcp://127.0.0.1:$port"
wait

# ------------------------------------------------------------------------------------- resume
if [ $have_mpi = 1 ]; then
    resumed_same "2 ranks --zero 2 resumed at 2 ranks from step 5: ends bit-identical to the uninterrupted run" \
        "$tmp/z2" "$tmp/r2" "model.bin state_00000.bin state_00001.bin" mpi2 "${RUN[@]}" --zero 2

    name="1 rank resumed from the 2-rank --zero 1 checkpoint of step 5: continues with the same losses"
    mkdir -p "$tmp/r1" && cp -r "$tmp/z1/step_00000005" "$tmp/r1/"
    if ! "$TRAIN" "${RUN[@]}" --resume "$tmp/r1" --log "$tmp/r1.log" >"$tmp/r1.out" 2>&1; then
        flunk "$name" "exit $?: $(grep -m 1 error "$tmp/r1.out")"
    else
        grep -E '^step ([6-9]|10) ' "$tmp/z1.log" | grep -v '^step 5 ' >"$tmp/z1.tail"
        grep -E '^step ([6-9]|10) ' "$tmp/r1.log" >"$tmp/r1.tail"
        d=$(maxdiff "$tmp/z1.tail" "$tmp/r1.tail")
        if within "$d" 2e-5; then pass "$name: max |loss difference| $d over steps 6-10"
        else flunk "$name" "max |loss difference| $d"; fi
    fi

    name="2 ranks --zero 2 resumed from the 1-process checkpoint of step 5 (resharded): the same losses"
    mkdir -p "$tmp/r3" && cp -r "$tmp/one/step_00000005" "$tmp/r3/"
    if ! mpi2 "${RUN[@]}" --zero 2 --resume "$tmp/r3" --log "$tmp/r3.log" >"$tmp/r3.out" 2>&1; then
        flunk "$name" "exit $?: $(grep -m 1 error "$tmp/r3.out")"
    else
        grep -E '^step ([6-9]|10) ' "$tmp/one.log" >"$tmp/one.tail"
        grep -E '^step ([6-9]|10) ' "$tmp/r3.log" >"$tmp/r3.tail"
        d=$(maxdiff "$tmp/one.tail" "$tmp/r3.tail")
        if within "$d" 2e-5; then pass "$name: max |loss difference| $d"
        else flunk "$name" "max |loss difference| $d"; fi
    fi
else
    skip "resume at 2 ranks, at 1 rank from 2, at 2 from 1" "$why_skip"
fi

# --------------------------------------------------------------------------------- bad setups
RUN+=(--ckpt-every 0)  # no --out-dir below
# a 1-process run with one micro-batch a step: its step-5 checkpoint is at window 5, which 2 ranks cannot share
"$TRAIN" "${RUN[@]}" --total-batch 64 --steps 5 --out-dir "$tmp/odd" >/dev/null 2>&1
mkdir -p "$tmp/odd2" && cp -r "$tmp/odd/step_00000005" "$tmp/odd2/"
must_fail "resume at a world size that cannot continue the checkpoint's data position (tcp, 2 ranks)" 30 \
    "not a multiple of this run's world size 2" "$tmp/bad1.out" tcp2 bad1 "${RUN[@]}" --total-batch 128 --resume "$tmp/odd2"
wait
if [ $have_mpi = 1 ]; then
    must_fail "--world-size 3 under mpirun -np 2" 30 "world-size 3: mpirun started 2 ranks" "$tmp/bad2.out" \
        mpi2 "${RUN[@]}" --world-size 3
    # rank 1 is killed (SIGKILL) after 2 s of a long run; mpirun must end the job
    must_fail "a rank killed mid-run under mpirun" 30 "exited on signal 9|Killed|killed" "$tmp/bad3.out" \
        timeout 120 "${MPIRUN[@]}" -np 2 sh -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec timeout -s KILL 2 "$@"; else exec "$@"; fi' \
        sh "$TRAIN_MPI" "${RUN[@]}" --steps 1000000 --val-every 0
    must_fail "the plain binary started by mpirun -np 2" 30 "one of 2 tasks .* no way to meet the others" "$tmp/bad4.out" \
        timeout 120 "${MPIRUN[@]}" -np 2 "$TRAIN" "${RUN[@]}"
else
    skip "bad setups under mpirun" "$why_skip"
fi
port=$((port + 1))
RANK=1 WORLD_SIZE=3 timeout 60 "$TRAIN" "${RUN[@]}" --dist-init "tcp://127.0.0.1:$port" >"$tmp/bad5.r1" 2>&1 &
pids+=($!)
must_fail "ranks started with different world sizes (tcp)" 30 "rank 1 was started with world size 3, rank 0 with 2" \
    "$tmp/bad5.out" env RANK=0 WORLD_SIZE=2 timeout 60 "$TRAIN" "${RUN[@]}" --dist-init "tcp://127.0.0.1:$port"
wait
if grep -q "rank 0 refused the rendezvous: rank 1 was started with world size 3" "$tmp/bad5.r1"; then
    pass "... and rank 1 says why rank 0 refused it"
else flunk "the refused rank 1" "$(tail -n 1 "$tmp/bad5.r1")"; fi
port=$((port + 1))
must_fail "an unreachable rendezvous (--dist-timeout 3)" 15 "could not reach rank 0 within 3 s" "$tmp/bad6.out" \
    env RANK=1 WORLD_SIZE=2 timeout 60 "$TRAIN" "${RUN[@]}" --dist-init "tcp://127.0.0.1:$port" --dist-timeout 3
must_fail "rank 0 left alone (file: rendezvous, --dist-timeout 3)" 15 "0 of the 2 other ranks joined within 3 s" \
    "$tmp/bad7.out" env RANK=0 WORLD_SIZE=3 timeout 60 "$TRAIN" "${RUN[@]}" --dist-init "file:$tmp" --dist-timeout 3
port=$((port + 1))
RANK=1 WORLD_SIZE=2 sh -c 'timeout -s KILL 2 "$@"; true' sh "$TRAIN" "${RUN[@]}" --steps 1000000 --val-every 0 \
    --dist-init "tcp://127.0.0.1:$port" >/dev/null 2>&1 &
pids+=($!)
must_fail "a rank killed mid-run (tcp)" 30 "lost the connection to rank 1 .* it exited or died" "$tmp/bad8.out" \
    env RANK=0 WORLD_SIZE=2 timeout 60 "$TRAIN" "${RUN[@]}" --steps 1000000 --val-every 0 \
    --dist-init "tcp://127.0.0.1:$port"
wait

echo "test_distributed: $ok ok, $bad failed, $skipped skipped"
[ $bad -eq 0 ]
