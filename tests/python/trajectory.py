"""Shared by the tests that compare the CPU trainer's training with scripts/train_gpt2.py's in float64
(test_muon_trainer.py, test_loss_mask.py, test_doc_mask.py): a tiny model of either family, one batch
shape and schedule, both trainers run with the same flags (a flag given again overrides COMMON's in both),
their per-step losses and final parameters compared."""
import os
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import llmc_formats as fmt  # noqa: E402
import train_gpt2  # noqa: E402

TRAINER = ROOT / "build" / "train_gpt2_cpu"
B, T, STEPS, V = 2, 16, 10, 250
LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-4
# the same flags for both trainers (their names agree): lr schedule, warmup, clip, AdamW's lr
COMMON = ["--batch", str(B), "--seq", str(T), "--steps", str(STEPS), "--lr", "3e-3", "--schedule", "cosine",
          "--warmup", "2", "--grad-clip", "1.0"]
MODELS = {"gpt2": ["--arch", "gpt2", "--tied", "1"],
          "llama": ["--arch", "llama", "--tied", "0", "--kv-heads", "2"]}


def write_model(d, arch, flags=()):
    """A 2-layer, 32-channel model of the family `arch` (MODELS; flags: more shape flags) as d/model.bin."""
    model = d / "model.bin"
    train_gpt2.main(["--layers", "2", "--channels", "32", "--heads", "4", "--vocab", str(V), "--max-seq", "32",
                     "--seed", "5", *MODELS[arch], *flags, "--write-model", str(model)])
    return model


def step_losses(text):
    return [float(line.split()[3]) for line in text.splitlines() if " train_loss " in line]


def reference(model, shard, capsys, flags=()):
    """scripts/train_gpt2.py's training in float64: the per-step losses and the final parameters."""
    capsys.readouterr()
    args = train_gpt2.parse_args(["--load", str(model), "--train", str(shard), *COMMON, *flags])
    m = train_gpt2.build_model(args).double()
    train_gpt2.train(m, args)
    return step_losses(capsys.readouterr().out), m.flat().detach().numpy()


def cpu_trainer(model, shard, out_dir, flags=(), steps=STEPS):
    """build/train_gpt2_cpu: the per-step losses and the final parameters (its checkpoint after `steps`,
    which flags must give when it is not STEPS)."""
    p = subprocess.run([str(TRAINER), "--init", str(model), "--train", str(shard), "--val-every", "0",
                        "--out-dir", str(out_dir), *COMMON, *flags], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    _, params = fmt.read_model(str(out_dir / f"step_{steps:08d}" / "model.bin"))
    return step_losses(p.stdout), np.asarray(params, dtype=np.float64)


def compare(ref, got, steps=STEPS):
    """(largest relative loss difference, largest absolute weight difference)."""
    (ref_losses, ref_w), (losses, w) = ref, got
    assert len(ref_losses) == len(losses) == steps, (ref_losses, losses)
    loss_rel = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(ref_losses, losses))
    return loss_rel, float(np.abs(ref_w - w).max())
