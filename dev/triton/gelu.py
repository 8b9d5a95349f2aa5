"""gelu.py: GELU (tanh approximation) forward, alone and fused with the bias add, in Triton and
through torch.compile.
  python3 dev/triton/gelu.py [row ...] [--check-only] [--reps N] [--compile-mode M]
Shapes: the MLP activation of GPT-2 124M, N = B*T = 65536 rows of 4C = 3072, bf16:
  gelu_forward n=201326592        the op of dev/cuda/gelu.cu (same name, bytes and FLOPs: n in,
                                  n out, 20 FLOPs an element)
  bias_gelu_forward N=65536 C=3072  out = gelu(x + bias[c]), the bias add in fp32 (the trainer does
                                  this in the fc matmul's epilogue, so no CUDA lab times it alone);
                                  bytes n in + n out + C bias, 21 FLOPs an element
gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) = x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)),
the second form in the Triton kernels (one exp, no tanh: Triton has no portable tanh). Checked
against torch.nn.functional.gelu(approximate="tanh") in fp32 on every element.
Variants:
  triton         gelu: 1-D blocks of 2048 elements; bias_gelu: 2-D tiles (8 rows x 512 columns),
                 the bias slice loaded once a tile
  torch.compile  F.gelu(x, approximate="tanh") and F.gelu(x + bias, approximate="tanh"), compiled
                 (one fused pointwise kernel each)
  torch eager    the same expressions uncompiled (bias_gelu: two kernels, the sum rounded to bf16
                 between them)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_common as lc  # noqa: E402

ARGS = lc.parse_args(__file__, __doc__)
torch, triton, tl = lc.require(__file__)
F = torch.nn.functional


@triton.jit
def gelu_tanh_f32(x):
    # 0.5 x (1 + tanh(u)) == x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x / (1.0 + tl.exp(-2.0 * u))


@triton.jit
def gelu_kernel(out_ptr, x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, gelu_tanh_f32(x).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def bias_gelu_kernel(out_ptr, x_ptr, bias_ptr, N, C, ROWS: tl.constexpr, COLS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    col_ok = cols < C
    mask = (rows < N)[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * C + cols[None, :]
    bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) + bias[None, :]
    tl.store(out_ptr + offs, gelu_tanh_f32(x).to(out_ptr.dtype.element_ty), mask=mask)


def gelu_triton(out, x):
    n = x.numel()
    BLOCK = 2048
    gelu_kernel[(triton.cdiv(n, BLOCK),)](out, x, n, BLOCK=BLOCK, num_warps=4)


def bias_gelu_triton(out, x, bias):
    N, C = x.shape
    ROWS, COLS = 8, 512
    bias_gelu_kernel[(triton.cdiv(N, ROWS), triton.cdiv(C, COLS))](out, x, bias, N, C, ROWS=ROWS, COLS=COLS,
                                                                   num_warps=4)


def gelu_expr(x):
    return F.gelu(x, approximate="tanh")


def bias_gelu_expr(x, bias):
    return F.gelu(x + bias, approximate="tanh")


def run_shapes(L, N, C):
    n = N * C
    s = 2
    x = L.rand((N, C), 31, -4.0, 4.0)  # the lab's range
    bias = L.rand((C,), 32)

    # ---- gelu alone: the lab's op, flat
    op = f"gelu_forward n={n}"
    ref = F.gelu(x.float(), approximate="tanh")
    nbytes, flops = 2.0 * n * s, 20.0 * n
    out = lc.Out((N, C), torch.bfloat16, "out")
    L.run(op, "triton", nbytes, flops, lc.MEMORY, out.poison, lambda: gelu_triton(out.t, x),
          lambda _: L.check_out(out, ref))
    compiled = L.compile(gelu_expr)
    L.run(op, "torch.compile", nbytes, flops, lc.MEMORY, lambda: None, lambda: compiled(x),
          lambda y: L.check_fresh("out", y, ref))
    L.run(op, "torch eager", nbytes, flops, lc.MEMORY, lambda: None, lambda: gelu_expr(x),
          lambda y: L.check_fresh("out", y, ref))
    del ref

    # ---- bias + gelu
    op = f"bias_gelu_forward N={N} C={C}"
    L.beside(op, "", "no CUDA row: the trainer adds the bias and applies GELU in the fc matmul's epilogue")
    ref = F.gelu(x.float() + bias.float(), approximate="tanh")
    nbytes, flops = 2.0 * n * s + C * s, 21.0 * n
    L.run(op, "triton", nbytes, flops, lc.MEMORY, out.poison, lambda: bias_gelu_triton(out.t, x, bias),
          lambda _: L.check_out(out, ref))
    compiled_bias = L.compile(bias_gelu_expr)
    L.run(op, "torch.compile", nbytes, flops, lc.MEMORY, lambda: None, lambda: compiled_bias(x, bias),
          lambda y: L.check_fresh("out", y, ref))
    L.run(op, "torch eager", nbytes, flops, lc.MEMORY, lambda: None, lambda: bias_gelu_expr(x, bias),
          lambda y: L.check_fresh("out", y, ref))


def main():
    L = lc.Lab(__file__, ARGS)
    run_shapes(L, *((lc.SMALL_ROWS, 3104) if ARGS.small else (65536, 3072)))
    return L.finish()


if __name__ == "__main__":
    sys.exit(main())
