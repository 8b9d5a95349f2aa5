"""kill -9 at random, then --resume, over and over: the CPU trainer on a small model (144K
parameters, so most of the run's time is spent saving and kills land mid-save), 120 steps, a
checkpoint every 2, one thread. After every kill, every step_N directory verifies (its DONE matches both
files) and holds exactly the files of an uninterrupted run at that step, and no checkpoint seen
before has gone: no lost and no mixed checkpoint. Every fifth restart (and every restart once the
run is complete) resumes an older checkpoint with --overwrite 1, so kills also land while newer
checkpoints are deleted and rewritten. At the end the run is let finish: no *.tmp is left, its
directory equals the uninterrupted run's byte for byte (the CPU trainer is deterministic) and its
--log holds each step once with the same losses.

    python3 tests/python/test_kill_resume.py [--kills N] [--train BINARY]     (pytest runs it too)
"""
import argparse
import filecmp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import llmc_formats as fmt  # noqa: E402

STEPS = 120
TRAINER = os.path.join(ROOT, "build", "train_gpt2_cpu")


def make_inputs(d):
    cfg = dict(max_seq_len=16, vocab_size=4096, padded_vocab_size=4096, num_layers=1, num_heads=2,
               num_kv_heads=2, channels=32, window=0)
    rng = np.random.default_rng(0)
    fmt.write_model(f"{d}/good.bin", cfg, rng.normal(0, 0.02, fmt.num_params(cfg)).astype(np.float32))
    fmt.write_shard(f"{d}/train.bin", rng.integers(0, 64, 4000), 4096)  # the model's vocabulary


def checkpoints(run):
    """Names of the complete-looking step directories, oldest first."""
    if not os.path.isdir(run):
        return []
    return sorted(n for n in os.listdir(run) if n.startswith("step_") and not n.endswith(".tmp"))


def problems_after_kill(ref, run, seen):
    """What is wrong with `run` against the uninterrupted `ref`; `seen` must all still be there."""
    now = checkpoints(run)
    out = [f"{n} is gone" for n in sorted(set(seen) - set(now))]
    for n in now:
        why = fmt.checkpoint_problem(os.path.join(run, n))
        if why:
            out.append(f"{n}: {why}")
        elif not all(filecmp.cmp(os.path.join(run, n, f), os.path.join(ref, n, f), shallow=False)
                     for f in fmt.CHECKPOINT_FILES):
            out.append(f"{n} differs from the uninterrupted run's")
    return out


def log_columns(path):
    """step, train_loss and lr of each log line (the times differ from run to run)."""
    return [line.split()[:6] for line in open(path)]


def kill_resume_loop(trainer, kills, work, say=print):
    make_inputs(work)
    # one thread: the model is too small for two, and OpenMP's spinning barriers make a run's time
    # swing tenfold on a loaded machine, which would spoil the kill timing
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = [trainer, "--train", f"{work}/train.bin", "--batch", "2", "--seq", "8", "--val-every", "0",
            "--steps", str(STEPS), "--ckpt-every", "2"]
    ref, run, log = f"{work}/ref", f"{work}/run", f"{work}/run.log"
    start = time.time()
    done = subprocess.run(args + ["--init", f"{work}/good.bin", "--out-dir", ref, "--log", f"{work}/ref.log"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"the uninterrupted run failed: {done.stderr}"
    ref_seconds = time.time() - start
    say(f"uninterrupted run: {ref_seconds:.2f} s, {len(checkpoints(ref))} checkpoints")

    rng = random.Random(13)  # the same kill times each run
    bad, killed, restarts, seen, mid_save = [], 0, 0, [], 0
    final = f"step_{STEPS:08d}"
    while killed < kills and not bad:
        restarts += 1
        have = checkpoints(run)
        if not have:  # nothing to resume: start afresh (the killed fresh run's log is replaced)
            how = ["--init", f"{work}/good.bin", "--out-dir", run, "--overwrite", "1"]
        elif len(have) >= 3 and (restarts % 5 == 0 or have[-1] == final):
            older = have[rng.randrange(len(have) // 2)]  # an older one; the newer ones are deleted
            how = ["--resume", f"{run}/{older}", "--overwrite", "1"]
            seen = [n for n in seen if n <= older]
        else:
            how = ["--resume", run]
        p = subprocess.Popen(args + how + ["--log", log], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0, ref_seconds / 6))  # start-up included
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
            killed += 1
            mid_save += any(n.endswith(".tmp") for n in os.listdir(run)) if os.path.isdir(run) else 0
        elif p.returncode != 0:
            bad.append(f"restart {restarts} ({' '.join(how)}) failed: {p.stderr.read().strip()}")
            break
        p.stderr.close()
        bad += [f"after kill {killed}: {x}" for x in problems_after_kill(ref, run, seen)]
        seen = checkpoints(run)
    say(f"{killed} kills over {restarts} restarts, {mid_save} of them mid-save (a step_N.tmp left)")

    done = subprocess.run(args + ["--resume", run, "--log", log], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        bad.append(f"the final resume failed: {done.stderr.strip()}")
    left = [os.path.join(d, n) for d, dirs, files in os.walk(run) for n in dirs + files if n.endswith(".tmp")]
    if left:
        bad.append(f"leftovers: {left}")
    cmp = filecmp.dircmp(ref, run)
    differ = cmp.left_only + cmp.right_only + [f"{n}/{f}" for n, sub in cmp.subdirs.items()
                                                for f in sub.left_only + sub.right_only + sub.diff_files]
    # dircmp compares shallowly (size and mtime); the contents are compared here
    differ += [f"{n}/{f}" for n in checkpoints(ref) if os.path.isdir(f"{run}/{n}")
               for f in (*fmt.CHECKPOINT_FILES, "DONE")
               if not filecmp.cmp(f"{ref}/{n}/{f}", f"{run}/{n}/{f}", shallow=False)]
    if differ:
        bad.append(f"the finished run differs from the uninterrupted one: {sorted(set(differ))[:5]}")
    if log_columns(log) != log_columns(f"{work}/ref.log"):
        bad.append("the log differs from the uninterrupted run's (each step once, same losses)")
    return killed, bad


@pytest.mark.skipif(not os.access(TRAINER, os.X_OK), reason="build/train_gpt2_cpu is not built")
def test_kill_resume():
    # on tmpfs where there is one: fsync costs nothing there, and a kill -9 (unlike a power cut)
    # loses nothing that reached the page cache, so the same protocol is tested in seconds
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None) as work:
        killed, bad = kill_resume_loop(TRAINER, 24, work)
    assert killed >= 20 and not bad, bad


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=24)
    ap.add_argument("--train", default=TRAINER, help="the trainer binary (default build/train_gpt2_cpu)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    try:
        killed, bad = kill_resume_loop(os.path.abspath(a.train), a.kills, work)
    finally:
        shutil.rmtree(work)
    for b in bad:
        print("BAD ", b)
    print(f"test_kill_resume: {killed} kills, {len(bad)} problems")
    sys.exit(1 if bad else 0)
