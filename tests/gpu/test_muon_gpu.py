"""tests/gpu/test_muon_gpu.sh's data and weight comparison (numpy and scripts/llmc_formats.py only; the
losses are compared by tests/gpu/test_loss_mask_gpu.py compare).
  shard PATH               12 windows of 4 x 64 tokens (6 steps of 2 micro-batches), vocab 512: a noisy
                           bigram chain (next = 5 prev + 1 + noise in [0, 4) mod 512), learnable in a few
                           steps, so an optimizer's choices show in the losses
  weights A B ATOL         the largest absolute difference of the Muon matrices (qkvw, attprojw, fcw,
                           fcprojw) of checkpoints A and B (directories), each the fp32 master weights of
                           its state.bin where it holds them (the bf16 build), else its model.bin; exit
                           status 1 above ATOL. Muon moves each of their values by ~lr / sqrt(cols) a step
                           (~2e-3 here), so a wrong orthogonalisation, scale or transpose shows at once"""
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import llmc_formats as fmt  # noqa: E402

WINDOWS, BT, VOCAB = 12, 4 * 64, 512
MUON_TENSORS = ["qkvw", "attprojw", "fcw", "fcprojw"]


def shard(path):
    rng = np.random.default_rng(23)
    noise = rng.integers(0, 4, WINDOWS * BT + 1)
    tokens = np.empty_like(noise)
    tokens[0] = 7
    for i in range(1, len(tokens)):
        tokens[i] = (5 * tokens[i - 1] + 1 + noise[i]) % VOCAB
    fmt.write_shard(path, tokens, VOCAB)


def master_weights(d):
    d = pathlib.Path(d)
    cfg, params = fmt.read_model(str(d / "model.bin"))
    h, _ = fmt.read_header(str(d / "state.bin"), fmt.MAGIC_STATE)
    n, has_master = int(h[3]), int(h[5])
    if has_master:  # after m and v
        params = np.fromfile(d / "state.bin", dtype="<f4", count=n, offset=fmt.HEADER_BYTES + 2 * 4 * n)
    return fmt.split_params(cfg, params.astype(np.float64))


def weights(a_dir, b_dir, atol):
    a, b = master_weights(a_dir), master_weights(b_dir)
    diff = max(float(np.abs(a[k] - b[k]).max()) for k in MUON_TENSORS)
    print(f"max Muon-matrix difference {diff:.2e} (tolerance {atol}; largest value "
          f"{max(float(np.abs(a[k]).max()) for k in MUON_TENSORS):.3f})")
    return 0 if diff <= float(atol) else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "shard":
        shard(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "weights":
        sys.exit(weights(*sys.argv[2:]))
    else:
        sys.exit(__doc__)
