"""tests/gpu/test_loss_mask_gpu.sh's data and comparisons (numpy and scripts/llmc_formats.py only).
  shards DIR               DIR/masked.bin (train), DIR/val.bin, DIR/ones.bin and DIR/plain.bin (see shards)
  compare A.log B.log RTOL the largest relative difference of the train and val losses of two --log files
                           (same steps in both); exit status 1 above RTOL"""
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import llmc_formats as fmt  # noqa: E402

BT = 4 * 64       # the script's --batch x --seq
VOCAB = 512       # its --data-vocab
KEPT_IDS = 16     # a kept target is one of the first 16 ids, a masked one any id: the mask moves the loss


def masked_tokens(rng, windows, empty_window=None):
    """windows * BT + 1 tokens and their mask (token i's value masks it as a target): about half kept;
    window `empty_window`'s targets all masked (a micro-batch that counts nothing)."""
    n = windows * BT + 1
    mask = (rng.random(n) < 0.5).astype(np.uint8)
    if empty_window is not None:
        mask[empty_window * BT + 1:(empty_window + 1) * BT + 1] = 0
    tokens = np.where(mask == 1, rng.integers(0, KEPT_IDS, n), rng.integers(0, VOCAB, n))
    return tokens, mask


def shards(d):
    """masked.bin: 8 windows (4 steps of 2 micro-batches), window 5 all masked; val.bin: 3 masked
    windows; plain.bin and ones.bin: masked.bin's tokens without a mask and with an all-ones one."""
    d = pathlib.Path(d)
    rng = np.random.default_rng(11)
    tokens, mask = masked_tokens(rng, 8, empty_window=5)
    fmt.write_shard(str(d / "masked.bin"), tokens, VOCAB, mask=mask)
    fmt.write_shard(str(d / "plain.bin"), tokens, VOCAB)
    fmt.write_shard(str(d / "ones.bin"), tokens, VOCAB, mask=np.ones_like(mask))
    val_tokens, val_mask = masked_tokens(rng, 3)
    fmt.write_shard(str(d / "val.bin"), val_tokens, VOCAB, mask=val_mask)


def losses(log):
    """{('train' | 'val', step): loss} of a --log file (both trainers write the same keys)."""
    out = {}
    for line in pathlib.Path(log).read_text().splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "step" and f[2] in ("train_loss", "val_loss"):
            out[(f[2][:-5], int(f[1]))] = float(f[3])
    return out


def compare(a, b, rtol):
    la, lb = losses(a), losses(b)
    if not la or la.keys() != lb.keys():
        print(f"the logs hold different steps: {sorted(la)} vs {sorted(lb)}")
        return 1
    rel = {k: abs(la[k] - lb[k]) / max(abs(la[k]), 1e-30) for k in la}
    worst = max(rel, key=rel.get)
    print(f"{len(la)} losses, largest relative difference {rel[worst]:.2e} ({worst[0]} step {worst[1]}: "
          f"{la[worst]:.6f} vs {lb[worst]:.6f}; tolerance {rtol:g})")
    return 0 if rel[worst] <= rtol else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "shards":
        shards(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    else:
        sys.exit(__doc__)
