"""The CPU trainer's --optimizer muon against the PyTorch reference's, over 10 steps, for a tiny GPT-2
(tied head) and a tiny Llama (GQA, SwiGLU, untied head), each with one --muon-adjust-lr mode:
- the model is written by scripts/train_gpt2.py --write-model; the token shard holds one B x T window,
  so both trainers see the same batch at every step whatever their data order (the C++ loader shuffles);
- the reference is scripts/train_gpt2.py --train --optimizer muon (torch.optim.Muon on each layer's Q, K,
  V, attention projection, fc (SwiGLU: gate, up) and fc projection as separate matrices, +
  torch.optim.AdamW, tests/python/test_muon.py) run in float64, the Newton-Schulz in float64 too, so it
  carries no error of its own at the fp32 tolerance;
- build/train_gpt2_cpu --init M --optimizer muon (fp32) with the same batch, lr, schedule, warmup and clip
  must match its per-step losses to LOSS_RTOL relative and its final weights to WEIGHT_ATOL.
The reference's losses and weights are float64; the CPU trainer prints %.6f losses, about 1e-7 relative.
Measured (x86-64, 2 threads): the losses within 2.1e-7 relative (the printed digits), the weights within
5.6e-6 (the largest, the norms' weights, are about 1): the tolerances leave 18-50x room. Skipping the
Muon update of fcw alone moves them to 1e-2 and 7e-2; orthogonalising qkvw as one matrix in the CPU
trainer, to 8e-4 and 4e-2 (GPT-2) and 7e-4 and 3e-2 (Llama); SwiGLU's fcw as one, to 1e-4 and 1e-2 (Llama).
Run: python3 -m pytest -q -s tests/python/test_muon_trainer.py (-s prints the measured differences)"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.optim, "Muon"):
    pytest.skip("torch.optim.Muon needs PyTorch 2.9 or later", allow_module_level=True)

from trajectory import B, T, V, LOSS_RTOL, WEIGHT_ATOL, TRAINER, compare, cpu_trainer, fmt, reference, write_model  # noqa: E402

# (model, Muon flags): each family once, each lr adjustment once, a weight decay and another momentum
CASES = [("gpt2", ["--optimizer", "muon", "--muon-lr", "0.02", "--muon-adjust-lr", "original", "--muon-wd", "0.1"]),
         ("llama", ["--optimizer", "muon", "--muon-lr", "0.01", "--muon-adjust-lr", "match_rms_adamw", "--muon-momentum", "0.9"])]


def write_inputs(d, arch):
    model, shard = write_model(d, arch), d / "train.bin"
    fmt.write_shard(str(shard), np.random.default_rng(6).integers(0, V, B * T + 1), V)  # one window
    return model, shard


@pytest.mark.parametrize("arch,opt_flags", CASES, ids=[c[0] for c in CASES])
def test_cpu_trainer_muon_matches_the_reference(tmp_path, capsys, arch, opt_flags):
    if not TRAINER.exists():
        pytest.skip(f"{TRAINER} is not built (make build/train_gpt2_cpu)")
    model, shard = write_inputs(tmp_path, arch)
    ref = reference(model, shard, capsys, opt_flags)
    got = cpu_trainer(model, shard, tmp_path / "run", opt_flags)
    loss_rel, weight_abs = compare(ref, got)
    with capsys.disabled():
        print(f"\n{arch} {' '.join(opt_flags)}: losses {ref[0][0]:.4f} -> {ref[0][-1]:.4f}, max relative loss "
              f"difference {loss_rel:.2e} (tolerance {LOSS_RTOL:g}), max weight difference {weight_abs:.2e} "
              f"(tolerance {WEIGHT_ATOL:g}, largest weight {np.abs(ref[1]).max():.3f})")
    assert loss_rel < LOSS_RTOL and weight_abs < WEIGHT_ATOL, (loss_rel, weight_abs, ref[0], got[0])
    # Muon moved the trajectory: AdamW alone from the same model ends elsewhere
    adamw_losses, _ = reference(model, shard, capsys, ["--optimizer", "adamw"])
    assert max(abs(a - b) for a, b in zip(adamw_losses[1:], ref[0][1:])) > 100 * LOSS_RTOL
