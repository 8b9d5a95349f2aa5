"""attention_doc.py: document-masked causal attention (AttnShape::doc_start, the trainer's --doc-mask 1)
through PyTorch, beside dev/cuda/attention_forward.cu's and attention_backward.cu's doc shapes.
  python3 dev/triton/attention_doc.py [row ...] [--check-only] [--reps N] [--compile-mode M] [--small]
Shapes and rows: dev/cuda/attention_common.cuh's DOC_SHAPES (--small: DOC_SMALL_SHAPES), the same names,
sizes and documents: GPT-2's (B 64, T 1024, NH 12, HD 64) and GQA HD 128 (B 16, T 4096, NH 16/4), each
as one document a row (doc1-, the full-causal twin), 8 equal documents (doc8-) and random lengths
(docr-); doc_starts below draws the lab's documents (doc_tokens there, the same splitmix64 draws).
Key j is visible to query t iff doc_start[t] <= j <= t (and t - j < W with a window).
Variants, forward (attention_forward <shape>) and forward + backward (attention_fwd+bwd <shape>):
  torch.compile  flex_attention (torch.nn.attention.flex_attention) with a BlockMask from
                 create_block_mask and a document-id mask_mod (causal, same document, the window),
                 compiled: the kernel torch.compile generates for the mask; GQA through enable_gqa
  sdpa mask      F.scaled_dot_product_attention with the explicit boolean mask (B, 1, T, T), K and V
                 repeated to NH heads (the copy is timed) so the memory-efficient backend takes it
FLOPs: 4 * HD per visible pair (each row's sum over its documents of len * (len + 1) / 2 without a
window), times 3.5 forward + backward, the lab's count; bytes as the lab's rows. Check: out of the
first sequences (the lab's ref_batches) against fp32 PyTorch math with the explicit mask (the lab's
attention tolerance and nmse bound), every element finite; forward + backward: dq, dk, dv of the
packed qkv's gradient from dout against fp32 autograd of the same expression.
LAB_INTERPRET=1 (no GPU): the small shapes on the CPU, checks only; flex_attention is SKIPPED there
(it compiles for the GPU), the explicit-mask SDPA is checked.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_common as lc  # noqa: E402

ARGS = lc.parse_args(__file__, __doc__)
torch, triton, tl = lc.require(__file__)
F = torch.nn.functional

NMSE_MAX = 1e-4 if lc.INTERPRET else 2e-5  # attention.py's: the CPU's bf16 rounding doubles the error
TOL_ATTENTION = (1.6e-2, 1e-1)
DOCS_RANDOM = -1
DOC_SEED = 2024
# (name, B, T, NH, NKV, HD, window, ref_batches, docs): attention_common.cuh's DOC_SHAPES, DOC_SMALL_SHAPES
DOC_SHAPES = (("doc1-gpt2", 64, 1024, 12, 12, 64, 0, 2, 1), ("doc8-gpt2", 64, 1024, 12, 12, 64, 0, 2, 8),
              ("docr-gpt2", 64, 1024, 12, 12, 64, 0, 2, DOCS_RANDOM),
              ("doc1-gqa128", 16, 4096, 16, 4, 128, 0, 1, 1), ("doc8-gqa128", 16, 4096, 16, 4, 128, 0, 1, 8),
              ("docr-gqa128", 16, 4096, 16, 4, 128, 0, 2, DOCS_RANDOM))
DOC_SMALL_SHAPES = (("doc-small", 4, 203, 3, 1, 128, 0, 4, DOCS_RANDOM),
                    ("doc-small-w", 3, 150, 2, 2, 64, 40, 3, DOCS_RANDOM))
M64 = (1 << 64) - 1


class Rng:
    """llmc/rand.h's splitmix64: next_u64 and below(n) = next_u64() % n."""

    def __init__(self, seed):
        self.state = seed & M64

    def below(self, n):
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return (z ^ (z >> 31)) % n


def doc_starts(B, T, docs):
    """doc_start (B, T) int32 of the lab's documents (attention_common.cuh's doc_tokens, then
    llmc/cpu/attention.h's doc_starts): the last document start <= t of the row, else 0."""
    ds = torch.zeros((B, T), dtype=torch.int32)
    for b in range(B):
        starts = []
        if docs > 0:
            starts = [d * T // docs for d in range(docs)]
        elif b % 4 != 1:
            rng = Rng(DOC_SEED + b)
            maxlen = max(1, T >> rng.below(8))
            p = 0
            while p < T:
                if p > 0 or rng.below(2):
                    starts.append(p)
                p += 1 + rng.below(maxlen)
        for i, p in enumerate(starts):
            ds[b, p:starts[i + 1] if i + 1 < len(starts) else T] = p
    return ds


def visible(ds, window):
    """The (B, T, T) boolean mask: query t sees key j iff ds[t] <= j <= t (and t - j < window)."""
    T = ds.shape[1]
    t, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    m = (j <= t) & (j >= ds[:, :, None].long())
    return m & (t - j < window) if window > 0 else m


def run_shape(L, name, B, T, NH, NKV, HD, W, RB, docs, seed):
    row = f"{name} B={B} T={T} NH={NH} NKV={NKV} HD={HD} W={W}"
    C, G = NH * HD, NH // NKV
    ds = doc_starts(B, T, docs)
    keys = torch.arange(T)[None, :] - ds.long() + 1                                 # visible keys a query
    pairs = float((keys.clamp(max=W) if W > 0 else keys).sum())
    fwd_flops = 4.0 * HD * NH * pairs
    n_qkv, n_out, n_lse = B * T * (NH + 2 * NKV) * HD, B * T * C, B * NH * T
    mask = visible(ds, W).to(lc.DEVICE)                                             # (B, T, T)
    ds_dev = ds.to(lc.DEVICE)

    qkv = L.rand((B, T, (NH + 2 * NKV) * HD), seed, -2.0, 2.0)  # the lab's range
    dout = L.rand((B, NH, T, HD), seed + 1)

    def heads(x):  # q (B, NH, T, HD), k and v (B, NKV, T, HD): strided views of the packed qkv
        q = x[..., :C].unflatten(-1, (NH, HD)).transpose(1, 2)
        k = x[..., C:C + NKV * HD].unflatten(-1, (NKV, HD)).transpose(1, 2)
        v = x[..., C + NKV * HD:].unflatten(-1, (NKV, HD)).transpose(1, 2)
        return q, k, v

    # fp32 reference on the first RB sequences: out, and the gradient of qkv from dout by autograd
    x = qkv[:RB].float().requires_grad_(True)
    q, k, v = heads(x)
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HD))
    ref_out = torch.softmax(s.masked_fill(~mask[:RB, None], float("-inf")), -1) @ v  # (RB, NH, T, HD)
    ref_out.backward(dout[:RB].float())
    ref_out, ref_grad = ref_out.detach(), x.grad
    del x, q, k, v, s

    def parts(g):  # dq, dk, dv of a (RB, T, row) gradient
        return g[..., :C], g[..., C:C + NKV * HD], g[..., C + NKV * HD:]

    def check_out(y):
        if y is None or tuple(y.shape) != (B, NH, T, HD):
            print(f"    out        FAIL: shape {None if y is None else tuple(y.shape)}")
            return False
        return L.check_fresh("out", y, ref_out, TOL_ATTENTION, rows=slice(0, RB), nmse_max=NMSE_MAX)

    def check_grad(g):  # g: the (B, T, row) gradient of qkv
        ok = True
        for what, got, ref in zip(("dq", "dk", "dv"), parts(g), parts(ref_grad)):
            ok = L.check_fresh(what, got, ref, TOL_ATTENTION, rows=slice(0, RB), nmse_max=NMSE_MAX) and ok
        return ok

    leaf = qkv.detach().requires_grad_(True)

    def fwd_bwd(attend):
        def launch():
            return torch.autograd.grad(attend(*heads(leaf)), leaf, dout)[0]
        return launch

    sdpa_mask = mask[:, None]                                                       # (B, 1, T, T)

    def sdpa(q, k, v):  # K and V repeated to NH heads: enable_gqa with a mask falls back to the math backend
        k, v = (t.repeat_interleave(G, 1) if G > 1 else t for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask)

    rows = [("sdpa mask", sdpa)]
    if lc.INTERPRET:
        if L.wants("torch.compile"):
            print(f"SKIPPED {row} | torch.compile (flex_attention): not run on the CPU (LAB_INTERPRET=1); "
                  "the GPU run checks and times it")
    else:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def document_causal(b, h, q_idx, kv_idx):
            ok = (kv_idx <= q_idx) & (ds_dev[b, q_idx] <= kv_idx)
            return ok & (q_idx - kv_idx < W) if W > 0 else ok

        block_mask = create_block_mask(document_causal, B, None, T, T, device=lc.DEVICE)
        flex = L.compile(flex_attention)

        def flex_doc(q, k, v):
            return flex(q, k, v, block_mask=block_mask, enable_gqa=True)

        rows.insert(0, ("torch.compile", flex_doc))
    fwd_bytes = (n_qkv + n_out) * 2.0 + n_lse * 4.0
    both_bytes = (2 * n_qkv + 2 * n_out) * 2.0 + n_lse * 4.0
    for what, attend in rows:
        q, k, v = heads(qkv)
        L.run(f"attention_forward {row}", what, fwd_bytes, fwd_flops, lc.COMPUTE, lambda: None,
              lambda attend=attend, q=q, k=k, v=v: attend(q, k, v), check_out)
        L.run(f"attention_fwd+bwd {row}", what, both_bytes, 3.5 * fwd_flops, lc.COMPUTE, lambda: None,
              fwd_bwd(attend), check_grad)
    if not lc.INTERPRET:
        torch.cuda.empty_cache()


def main():
    L = lc.Lab(__file__, ARGS)
    for i, shape in enumerate(DOC_SMALL_SHAPES if ARGS.small else DOC_SHAPES):
        run_shape(L, *shape, seed=201 + 2 * i)
    return L.finish()


if __name__ == "__main__":
    sys.exit(main())
