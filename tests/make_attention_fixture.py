"""Writes tests/fixture/attention.bin, the PyTorch reference that tests/test_attention_cpu.cpp
checks llmc/cpu/attention.h against.

Regenerate (needs torch, CPU is enough; deterministic, so the file only changes if this script does):
    python3 tests/make_attention_fixture.py [--out PATH]

Every expected number comes from float64 PyTorch below: an explicit causal (optionally
sliding-window) masked softmax written here, and autograd for the gradients. None of it comes
from the project's C++. qkv and dout are drawn in float64 and rounded to fp32 first, and the
reference is computed (in float64) from those fp32 values, so the C++ sees exactly the same inputs.

Cases: MHA (NKV == NH), GQA (NH/NKV = 3), MQA (NKV = 1), and a sliding window (W = 5 with GQA).
Layout, as in llmc/cpu/attention.h: qkv (B, T, (NH + 2*NKV) * HD) per position NH query heads,
then NKV key heads, then NKV value heads; query head h uses kv head h // (NH // NKV);
out (B, T, NH*HD); lse (B, NH, T) = log sum_{visible keys} exp(q.k / sqrt(HD)); dqkv like qkv.
Window W > 0: query t sees keys max(0, t-W+1) .. t; W = 0: keys 0 .. t.

File (docs/formats.md convention): 1024-byte header of 128 little-endian int64,
h[0] = fourcc("GPTA"), h[1] = 1 (version), h[2] = number of cases; then per case
int64 B, T, NH, NKV, HD, W followed by little-endian fp32 arrays qkv, dout, out, lse, dqkv.
"""
import argparse
import os
import sys

import numpy as np

try:
    import torch
except ImportError:  # --help works without PyTorch; main() then says it is needed
    torch = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import llmc_formats as fmt  # noqa: E402

MAGIC_ATTENTION = fmt.fourcc("GPTA")
OUT_PATH = os.path.join(ROOT, "tests", "fixture", "attention.bin")

# (name, B, T, NH, NKV, HD, W)
CASES = [
    ("mha", 2, 13, 4, 4, 8, 0),
    ("gqa", 2, 13, 6, 2, 8, 0),
    ("mqa", 1, 11, 4, 1, 16, 0),
    ("window", 2, 19, 4, 2, 8, 5),
]


def reference_attention(qkv, B, T, NH, NKV, HD, W):
    """qkv (B, T, (NH+2NKV)*HD) float64 -> out (B, T, NH*HD), lse (B, NH, T)."""
    x = qkv.view(B, T, NH + 2 * NKV, HD)
    q = x[:, :, :NH].permute(0, 2, 1, 3)                  # (B, NH, T, HD)
    k = x[:, :, NH:NH + NKV].permute(0, 2, 1, 3)          # (B, NKV, T, HD)
    v = x[:, :, NH + NKV:].permute(0, 2, 1, 3)            # (B, NKV, T, HD)
    kv_of_head = torch.arange(NH) // (NH // NKV)          # query head h -> kv head
    k = k[:, kv_of_head]                                  # (B, NH, T, HD)
    v = v[:, kv_of_head]
    scores = (q @ k.transpose(-1, -2)) / np.sqrt(HD)      # (B, NH, Tq, Tk)
    tq = torch.arange(T).view(T, 1)
    tk = torch.arange(T).view(1, T)
    visible = tk <= tq
    if W > 0:
        visible = visible & (tk >= tq - W + 1)
    scores = scores.masked_fill(~visible, float("-inf"))
    m = scores.max(dim=-1, keepdim=True).values           # every row sees at least itself
    e = torch.exp(scores - m)                             # exp(-inf) = 0 for hidden keys
    s = e.sum(dim=-1, keepdim=True)
    p = e / s
    lse = (m + torch.log(s)).squeeze(-1)                  # (B, NH, T)
    out = (p @ v).permute(0, 2, 1, 3).reshape(B, T, NH * HD)
    return out, lse


def cross_check(qkv, dout, out, lse, dqkv, B, T, NH, NKV, HD, W):
    """Sanity check of the explicit softmax above against torch's own SDPA and logsumexp."""
    qkv = qkv.clone().requires_grad_(True)
    x = qkv.view(B, T, NH + 2 * NKV, HD)
    q = x[:, :, :NH].transpose(1, 2)
    k = x[:, :, NH:NH + NKV].transpose(1, 2).repeat_interleave(NH // NKV, dim=1)
    v = x[:, :, NH + NKV:].transpose(1, 2).repeat_interleave(NH // NKV, dim=1)
    i = torch.arange(T)
    mask = (i[None, :] <= i[:, None]) & ((i[None, :] > i[:, None] - W) if W > 0 else True)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    o = o.transpose(1, 2).reshape(B, T, NH * HD)
    l = torch.logsumexp((q @ k.transpose(-1, -2) / np.sqrt(HD)).masked_fill(~mask, float("-inf")), dim=-1)
    (g,) = torch.autograd.grad(o, qkv, grad_outputs=dout)
    for a, b, what in ((out, o, "out"), (lse, l, "lse"), (dqkv, g, "dqkv")):
        err = (a - b.detach()).abs().max().item()
        assert err < 1e-12, f"explicit softmax and torch SDPA disagree on {what}: {err}"


def as_f32_exact(t):
    """Rounds to fp32 and back so the reference sees exactly what the file stores."""
    return t.to(torch.float32).to(torch.float64)


def make_case(gen, B, T, NH, NKV, HD, W):
    QKV = (NH + 2 * NKV) * HD
    qkv = as_f32_exact(torch.randn(B, T, QKV, dtype=torch.float64, generator=gen)).requires_grad_(True)
    dout = as_f32_exact(torch.randn(B, T, NH * HD, dtype=torch.float64, generator=gen))
    out, lse = reference_attention(qkv, B, T, NH, NKV, HD, W)
    (dqkv,) = torch.autograd.grad(out, qkv, grad_outputs=dout)
    cross_check(qkv.detach(), dout, out.detach(), lse.detach(), dqkv, B, T, NH, NKV, HD, W)
    f32 = lambda t: t.detach().numpy().astype("<f4").reshape(-1)  # noqa: E731
    return [np.array([B, T, NH, NKV, HD, W], dtype="<i8"), f32(qkv), f32(dout), f32(out), f32(lse), f32(dqkv)]


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=OUT_PATH, help="file to write (default: the committed tests/fixture/attention.bin)")
    args = ap.parse_args(argv)
    if torch is None:
        die("tests/make_attention_fixture.py needs PyTorch (pip install torch)")
    gen = torch.Generator().manual_seed(1234)
    chunks = [fmt.make_header(MAGIC_ATTENTION, {2: len(CASES)})]
    for name, B, T, NH, NKV, HD, W in CASES:
        chunks += make_case(gen, B, T, NH, NKV, HD, W)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        fmt.atomic_write(args.out, chunks)
    except OSError as e:
        die(f"--out {args.out}: cannot write ({e.strerror})")
    print(f"wrote {args.out}: {len(CASES)} cases, {os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main()
