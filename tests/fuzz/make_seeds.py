"""Writes the fuzz targets' binary seeds, valid files made by the project's own writers
(scripts/llmc_formats.py, scripts/data/hellaswag.py), into OUT/<target>/ (tests/fuzz/run.sh calls
it with OUT = build/fuzz/seeds). Generated at run time so they follow the formats as they change;
the text seeds (descriptor, flags) are committed under tests/fuzz/seeds/.

    python3 tests/fuzz/make_seeds.py OUT
"""
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "scripts" / "data"))
import llmc_formats as fmt  # noqa: E402
from hellaswag import write_eval  # noqa: E402

# Kept small: a seed must fit the fuzzers' -max_len (tests/fuzz/run.sh), and small inputs run fast.
TINY = dict(max_seq_len=4, vocab_size=8, padded_vocab_size=8, num_layers=1, num_heads=2, num_kv_heads=1,
            channels=4, window=0)
TINY_WINDOW = dict(TINY, num_kv_heads=2, window=2)
# a Llama-style model: a version-2 header (RMSNorm, RoPE, SwiGLU of hidden 6, no biases, untied head)
TINY_LLAMA = dict(TINY, architecture=fmt.ARCH_LLAMA, norm=fmt.NORM_RMSNORM, norm_eps=1e-6, position=fmt.POS_ROPE,
                  rope_theta=10000.0, mlp=fmt.MLP_SWIGLU, mlp_hidden=6, biases=0, tied_head=0)
# fuzz_state's fixed data loader (tests/fuzz/fuzz_state.cpp): B 2, T 4, seed 1337, shuffled,
# one shard of 101 tokens = 12 windows; a saved position of epoch 3, batch 5
LOADER_SLOTS = [1, 3, 5, 1337, 1, 2, 4, 1, 1, 12]


def main(out):
    out = Path(out)
    rng = np.random.default_rng(0)

    def folder(name):
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    d = folder("model")
    for name, cfg in (("tiny", TINY), ("tiny_window", TINY_WINDOW), ("tiny_llama", TINY_LLAMA)):
        params = rng.normal(0, 0.02, fmt.num_params(cfg)).astype(np.float32)
        fmt.write_model(d / f"{name}_fp32.bin", cfg, params)
        fmt.write_model(d / f"{name}_bf16.bin", cfg, params, dtype=fmt.DTYPE_BF16)

    d = folder("state")
    n = fmt.num_params(TINY)
    loader = LOADER_SLOTS + [0] * (16 - len(LOADER_SLOTS))
    for has_master in (0, 1):
        m, v = rng.normal(0, 1, n), rng.uniform(0, 1, n)
        master = rng.normal(0, 0.02, n) if has_master else None
        fmt.write_state(d / f"master{has_master}.bin", 7, m, v, master, rng_state=12345, sr_seed=99, loader=loader)

    d = folder("shard")
    fmt.write_shard(d / "v256.bin", rng.integers(0, 256, 101), 256)
    fmt.write_shard(d / "gpt2.bin", rng.integers(0, 50257, 40), 50257)
    fmt.write_shard(d / "wide.bin", np.arange(40) * 1700 + 3, 70000)  # version 2, uint32 ids
    fmt.write_shard(d / "masked.bin", rng.integers(0, 256, 41), 256, mask=rng.integers(0, 2, 41))  # version 3

    d = folder("tokenizer")
    tokens = [bytes([97 + i]) * (1 + i % 5) for i in range(15)] + [b"<|endoftext|>"]
    fmt.write_tokenizer(d / "eot.bin", tokens, len(tokens) - 1)
    fmt.write_tokenizer(d / "no_eot.bin", [b"\n", b"\x1b[2J", b"\xe2\x82", b"\xac", b"ab"], -1)

    d = folder("eval_loader")
    def example(k):
        label = int(rng.integers(0, k))
        ctx = list(rng.integers(0, 50257, int(rng.integers(1, 6))))
        return label, ctx, [list(rng.integers(0, 50257, int(rng.integers(1, 4)))) for _ in range(k)]
    write_eval(d / "hellaswag4.bin", [example(4) for _ in range(3)], 50257)
    write_eval(d / "choices2.bin", [example(2) for _ in range(5)], 50257)

    d = folder("debug_state")
    B, T, V = 1, 4, TINY["vocab_size"]
    fmt.write_debug_state(d / "tiny.bin", TINY, rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T)),
                          rng.normal(0, 1, (B, T, V)), 2.0, rng.normal(0, 1, n), [2.0, 1.9],
                          dict(lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0))

    # fuzz_checkpoint_manifest's fixed checkpoint: step 3, model.bin 100 x 'm', state.bin 13 x 's'
    d = folder("checkpoint_manifest")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "model.bin").write_bytes(b"m" * 100)
        (Path(tmp) / "state.bin").write_bytes(b"s" * 13)
        (d / "manifest").write_text(fmt.checkpoint_manifest(tmp, 3))
    (d / "legacy").write_text("ok\n")


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if len(sys.argv) == 2 else 2)
    main(sys.argv[1])
