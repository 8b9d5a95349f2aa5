"""The loss mask of version-3 token shards (docs/formats.md): build/train_gpt2_cpu (fp32) against
scripts/train_gpt2.py (float64, labels = -100 at masked targets, cross_entropy's ignore_index) over 10
steps on a tiny GPT-2 (tied head) and a tiny Llama (GQA, SwiGLU, untied head):
- the shard holds one B x T window, so both trainers see the same batch at every step whatever their
  data order; its mask keeps about half of the targets, and all of one row but the last few;
- the per-step losses must agree to LOSS_RTOL relative and the final weights to WEIGHT_ATOL;
- the same tokens without the mask (a version-1 shard) give other losses (the mask is used), and a shard
  whose mask keeps nothing trains on nothing: loss 0 at every step and the weights unchanged by the
  gradient (AdamW's decay aside, so the CPU trainer's weights still match the reference's);
- with two micro-batches a step's loss is the mean of their masked means (the float64 forward's),
  PyTorch's loss / grad_accum, not the pooled sum over the pooled count (0.8% away here).
Measured (x86-64, 2 threads): losses within 2.1e-7 relative (the printed digits), weights within 9.2e-6
(GPT-2 5.1e-6); without the mask the losses move by 1e-2 (Llama) to 2e-2 (GPT-2) relative, and a CPU
trainer that ignores the mask fails the comparison at 2e-2.
Run: python3 -m pytest -q -s tests/python/test_loss_mask.py (-s prints the measured differences)"""
import os
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trajectory import (B, LOSS_RTOL, MODELS, STEPS, T, TRAINER, V, WEIGHT_ATOL, compare, cpu_trainer,  # noqa: E402
                        fmt, reference, step_losses, train_gpt2, write_model)


def window_and_mask():
    """One window of B*T+1 tokens and a mask over it: token i's value masks it as a target (token 0 is
    never a target); about half kept, row 0 kept except its last 3 targets."""
    rng = np.random.default_rng(6)
    tokens = rng.integers(0, V, B * T + 1)
    mask = (rng.random(B * T + 1) < 0.5).astype(np.uint8)
    mask[1:T - 2] = 1
    mask[T - 2:T + 1] = 0
    return tokens, mask


@pytest.fixture
def trainer():
    if not TRAINER.exists():
        pytest.skip(f"{TRAINER} is not built (make build/train_gpt2_cpu)")


@pytest.mark.parametrize("arch", list(MODELS))
def test_masked_training_matches_the_reference(tmp_path, capsys, trainer, arch):
    model = write_model(tmp_path, arch)
    tokens, mask = window_and_mask()
    masked, plain = tmp_path / "masked.bin", tmp_path / "plain.bin"
    fmt.write_shard(str(masked), tokens, V, mask=mask)
    fmt.write_shard(str(plain), tokens, V)
    ref = reference(model, masked, capsys)
    got = cpu_trainer(model, masked, tmp_path / "run")
    loss_rel, weight_abs = compare(ref, got)
    unmasked = cpu_trainer(model, plain, tmp_path / "plain_run")
    moved = max(abs(a - b) / a for a, b in zip(ref[0], unmasked[0]))
    with capsys.disabled():
        print(f"\n{arch}: masked losses {ref[0][0]:.4f} -> {ref[0][-1]:.4f}, max relative loss difference "
              f"{loss_rel:.2e} (tolerance {LOSS_RTOL:g}), max weight difference {weight_abs:.2e} (tolerance "
              f"{WEIGHT_ATOL:g}); without the mask the losses move by up to {moved:.2e} relative")
    assert loss_rel < LOSS_RTOL and weight_abs < WEIGHT_ATOL, (loss_rel, weight_abs, ref[0], got[0])
    assert moved > 100 * LOSS_RTOL, (ref[0], unmasked[0])


def test_a_mask_that_keeps_nothing_trains_on_nothing(tmp_path, capsys, trainer):
    model = write_model(tmp_path, "llama")
    tokens, _ = window_and_mask()
    shard = tmp_path / "none.bin"
    fmt.write_shard(str(shard), tokens, V, mask=np.zeros_like(tokens))
    ref = reference(model, shard, capsys)
    got = cpu_trainer(model, shard, tmp_path / "run")
    assert ref[0] == [0.0] * STEPS and got[0] == [0.0] * STEPS, (ref[0], got[0])
    _, start = fmt.read_model(str(model))
    assert np.abs(got[1] - np.asarray(start, dtype=np.float64)).max() < 1e-2  # AdamW's decay alone
    assert compare(ref, got)[1] < WEIGHT_ATOL


def test_shard_with_a_mask_reads_back(tmp_path):
    tokens, mask = window_and_mask()
    for vocab in (V, 70000):  # uint16 and uint32 ids
        path = tmp_path / f"m{vocab}.bin"
        fmt.write_shard(str(path), tokens, vocab, mask=mask)
        got, got_vocab, got_mask = fmt.read_shard(str(path), with_mask=True)
        assert fmt.read_header(str(path), fmt.MAGIC_SHARD)[0][1] == 3 and got_vocab == vocab
        assert (got == tokens).all() and (got_mask == mask).all()
    plain = tmp_path / "plain.bin"
    fmt.write_shard(str(plain), tokens, V)
    assert fmt.read_header(str(plain), fmt.MAGIC_SHARD)[0][1] == 1
    assert fmt.read_shard(str(plain), with_mask=True)[2] is None


def test_gradient_accumulation_averages_the_micro_batch_means(tmp_path, trainer):
    """--total-batch of two micro-batches: the step's loss is the mean of the two windows' masked means
    (PyTorch's loss / grad_accum), not the two windows' loss sum over their total count. The windows
    keep 3 and 20 targets, so the two conventions differ by far more than the tolerance."""
    model = write_model(tmp_path, "gpt2")
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, V, 2 * B * T + 1)
    mask = np.zeros(2 * B * T + 1, np.uint8)
    mask[1:4] = 1                                     # window 0's targets are tokens 1..B*T
    mask[B * T + 1:B * T + 21] = 1                    # window 1's: tokens B*T+1..2*B*T
    shard = tmp_path / "two.bin"
    fmt.write_shard(str(shard), tokens, V, mask=mask)
    args = train_gpt2.parse_args(["--load", str(model), "--train", str(shard), "--batch", str(B), "--seq", str(T)])
    m = train_gpt2.build_model(args).double()
    sums, counts = [], []
    with torch.no_grad():
        for w in range(2):
            x = torch.from_numpy(tokens[w * B * T:(w + 1) * B * T].astype(np.int64)).view(B, T)
            y = torch.from_numpy(tokens[w * B * T + 1:(w + 1) * B * T + 1].astype(np.int64)).view(B, T)
            keep = torch.from_numpy(mask[w * B * T + 1:(w + 1) * B * T + 1].astype(bool)).view(B, T)
            logits = m(x)[0][..., :V]
            losses = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1), reduction="none")
            sums.append(float(losses[keep.reshape(-1)].sum()))
            counts.append(int(keep.sum()))
    per_micro = (sums[0] / counts[0] + sums[1] / counts[1]) / 2
    whole = (sums[0] + sums[1]) / (counts[0] + counts[1])
    p = subprocess.run([str(TRAINER), "--init", str(model), "--train", str(shard), "--val-every", "0", "--batch",
                        str(B), "--seq", str(T), "--total-batch", str(2 * B * T), "--steps", "1"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    (loss,) = step_losses(p.stdout)
    assert abs(per_micro - whole) > 100 * LOSS_RTOL * per_micro, (per_micro, whole)
    assert abs(loss - per_micro) < LOSS_RTOL * per_micro, (loss, per_micro, whole)
