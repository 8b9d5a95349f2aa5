"""softmax.py: row softmax of the classifier's logits, in Triton and through torch.compile.
  python3 dev/triton/softmax.py [row ...] [--check-only] [--reps N] [--compile-mode M]
Shape: GPT-2 124M's logits, N = B*T = 65536 rows of Vp = 50304 bf16 (6.6 GB in, 6.6 GB out), the
shape of dev/cuda/fused_classifier.cu. That lab's kernel does more (softmax, cross-entropy and the
gradient, in place), but moves the same bytes: the logits read once, N*Vp values written once, so its
"% of copy" compares with these rows directly. The check compares 16 sampled rows (first and last
included) with torch.softmax in fp32; the written and guard checks cover every element.
Bytes: N*Vp in + N*Vp out. FLOPs: ~5 per element (max, subtract, exp counted as 1, sum, scale).
Variants:
  triton         two passes over each row in 4096-wide chunks (one program a row): an online max and
                 sum (one exp an element, the running sum rescaled when the max grows), then exp and
                 scale and store. A row is 100 KB, too long to hold in registers as the Triton
                 tutorial's one-block softmax does; the first pass asks L2 to keep the row
                 (evict_last), the second reads it back with evict_first: the shipped CUDA kernel's
                 two-pass design, in ~30 lines.
  torch.compile  torch.softmax(x, dim=-1) on the bf16 logits, compiled (Inductor's reduction kernel)
  torch eager    the same expression uncompiled: PyTorch's own CUDA softmax kernel
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_common as lc  # noqa: E402

ARGS = lc.parse_args(__file__, __doc__)
torch, triton, tl = lc.require(__file__)


@triton.jit
def softmax_rows_kernel(out_ptr, x_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * V
    o_row = out_ptr + row * V
    cols = tl.arange(0, BLOCK)
    # pass 1: running max m and sum l of exp(x - m); the first chunk starts them
    x = tl.load(x_row + cols, mask=cols < V, other=-float("inf"), eviction_policy="evict_last").to(tl.float32)
    m = tl.max(x, axis=0)
    l = tl.sum(tl.exp(x - m), axis=0)
    for start in range(BLOCK, V, BLOCK):
        c = start + cols
        x = tl.load(x_row + c, mask=c < V, other=-float("inf"), eviction_policy="evict_last").to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    inv = 1.0 / l
    # pass 2: the row again (from L2 when it stayed there), normalized
    for start in range(0, V, BLOCK):
        c = start + cols
        x = tl.load(x_row + c, mask=c < V, other=-float("inf"), eviction_policy="evict_first").to(tl.float32)
        tl.store(o_row + c, (tl.exp(x - m) * inv).to(out_ptr.dtype.element_ty), mask=c < V)


def softmax_triton(out, x):
    N, V = x.shape
    softmax_rows_kernel[(N,)](out, x, V, BLOCK=4096, num_warps=8)
    return out


def softmax_expr(x):
    return torch.softmax(x, dim=-1)


def run_shape(L, N, V, cuda_op=""):
    op = f"softmax_forward N={N} V={V}"
    if cuda_op:
        L.beside(op, cuda_op, "the CUDA row is the fused classifier (softmax, cross-entropy and gradient in place, "
                 "V 50257 of the padded 50304), the lab's closest op: the same bytes")
    x = L.rand((N, V), 61, -5.0, 5.0)  # the lab's logits range
    rows = lc.sample_rows(N, 16, 63)
    ref = torch.softmax(x[rows].float(), dim=-1)
    nbytes, flops = 2.0 * N * V * x.element_size(), 5.0 * N * V

    out = lc.Out((N, V), torch.bfloat16, "out")
    L.run(op, "triton", nbytes, flops, lc.MEMORY, out.poison, lambda: softmax_triton(out.t, x),
          lambda _: L.check_out(out, ref, rows=rows))
    del out
    torch.cuda.empty_cache()
    compiled = L.compile(softmax_expr)
    L.run(op, "torch.compile", nbytes, flops, lc.MEMORY, lambda: None, lambda: compiled(x),
          lambda y: L.check_fresh("out", y, ref, rows=rows))
    L.run(op, "torch eager", nbytes, flops, lc.MEMORY, lambda: None, lambda: softmax_expr(x),
          lambda y: L.check_fresh("out", y, ref, rows=rows))


def main():
    L = lc.Lab(__file__, ARGS)
    if ARGS.small:
        run_shape(L, 37, 5003)  # 2 chunks, the second partial
    else:
        run_shape(L, 65536, 50304, "fused_classifier N=65536 V=50257 Vp=50304")
    return L.finish()


if __name__ == "__main__":
    sys.exit(main())
