"""dev/bench/par_trainer_parity.sh's parity experiment (PARITY=1: one init, llmc's data order) with
build/train_gpt2_cpu and the PyTorch reference in fp32 on the CPU, d2 on random-token shards:
- the two trainers agree step by step (no |d loss| over the table's 1e-4 threshold, the same lr);
- the table can fail: ours at another lr (OURS_FLAGS) shows the lr difference and a first step over it.
Run: python3 -m pytest -q tests/python/test_par_trainer_parity.py  (~15 s; needs torch)"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import llmc_formats  # noqa: E402

CPU_TRAINER = ROOT / "build" / "train_gpt2_cpu"
pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not CPU_TRAINER.exists(), reason="build/train_gpt2_cpu not built")


def run_parity(tmp_path, name, ours_flags=""):
    data = tmp_path / "data"
    if not data.exists():
        data.mkdir()
        rng = np.random.default_rng(0)
        for i, n in enumerate((600, 1400, 1400)):  # val, then two train shards of 5 windows of B*T+1 = 257
            split = "val" if i == 0 else "train"
            llmc_formats.write_shard(str(data / f"rnd_{split}_{i:06d}.bin"), rng.integers(0, 50257, n), 50257)
    env = dict(os.environ, PARITY="1", SPREAD="0", MODEL="d2", B="4", T="64", STEPS="5", VAL_EVERY="5",
               VAL_STEPS="1", OMP_NUM_THREADS="1", OURS_FLAGS=ours_flags)
    return subprocess.run([str(ROOT / "dev" / "bench" / "par_trainer_parity.sh"), str(data), str(tmp_path / name)],
                          capture_output=True, text=True, env=env, timeout=300)


def test_parity_agrees_and_can_fail(tmp_path):
    p = run_parity(tmp_path, "same")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "steps compared 5" in p.stdout and "first |d loss| > 0.0001: none" in p.stdout, p.stdout
    assert "max relative lr difference 0.00e+00" in p.stdout, p.stdout
    q = run_parity(tmp_path, "other_lr", "--lr 3e-3")
    assert q.returncode == 0, q.stdout + q.stderr
    assert "first |d loss| > 0.0001: none" not in q.stdout and "max relative lr difference 0.00e+00" not in q.stdout, q.stdout
