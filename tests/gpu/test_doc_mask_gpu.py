"""tests/gpu/test_doc_mask_gpu.sh's data (numpy and scripts/llmc_formats.py only); its comparisons are
tests/gpu/test_loss_mask_gpu.py's `compare`.
  shards DIR   DIR/packed.bin (train) and DIR/val.bin: packed documents of 1 to 32 tokens, each opened by
               the document token DOC (so rows start inside documents, and two document tokens meet);
               DIR/onedoc.bin and DIR/onedoc_val.bin: one document a row (DOC at each row's position 0,
               nowhere else)"""
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import llmc_formats as fmt  # noqa: E402

T = 256           # the script's --seq: several of the kernels' 64-row tiles a row
BT = 1 * T        # its --batch x --seq
VOCAB = 512       # its --data-vocab
DOC = VOCAB - 1   # its --doc-token; the other tokens lie below it


def packed_tokens(rng, windows):
    """windows * BT + 1 tokens: documents of 1 to 32 tokens, each starting with DOC."""
    n = windows * BT + 1
    tokens = rng.integers(0, DOC, n)
    i = int(rng.integers(0, 20))  # the first row starts inside a document
    while i < n:
        tokens[i] = DOC
        i += int(rng.integers(1, 33))
    return tokens


def one_doc_tokens(rng, windows):
    """windows * BT + 1 tokens, DOC exactly at the multiples of T (every row's first position)."""
    n = windows * BT + 1
    tokens = rng.integers(0, DOC, n)
    tokens[::T] = DOC
    return tokens


def shards(d):
    d = pathlib.Path(d)
    rng = np.random.default_rng(7)
    fmt.write_shard(str(d / "packed.bin"), packed_tokens(rng, 8), VOCAB)
    fmt.write_shard(str(d / "val.bin"), packed_tokens(rng, 3), VOCAB)
    fmt.write_shard(str(d / "onedoc.bin"), one_doc_tokens(rng, 8), VOCAB)
    fmt.write_shard(str(d / "onedoc_val.bin"), one_doc_tokens(rng, 3), VOCAB)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "shards":
        shards(sys.argv[2])
    else:
        sys.exit(__doc__)
