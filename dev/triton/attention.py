"""attention.py: causal attention forward at GPT-2 124M's shape, in Triton (a flash-attention kernel
in the style of the Triton fused-attention tutorial), through torch.compile, and through PyTorch's
scaled_dot_product_attention (flash and cuDNN backends) as the reference rows.
  python3 dev/triton/attention.py [row ...] [--check-only] [--reps N] [--compile-mode M]
Shape: dev/cuda/attention_forward.cu's "gpt2" shape and row name: B 64, T 1024, NH = NKV = 12,
HD 64, bf16, causal. The input is the lab's packed qkv, (B, T, 3 * NH * HD): per position all
query heads, then the key heads, then the value heads (llmc/cpu/attention.h); the Triton kernel
reads it in place and writes the lab's outputs, out (B, T, NH * HD) bf16 and lse (B, NH, T) fp32
(natural log of the sum of exp of the scaled scores). The other rows get q, k, v as strided
(B, NH, T, HD) views of the same qkv and return out as (B, NH, T, HD); lse is not theirs to return.
FLOPs 2 * B * NH * T^2 * HD (the causal half, docs/h200.md); bytes qkv in, out and lse out; the
ceiling is the lab's 710 TFLOP/s cuBLAS GEMM ("of GEMM"), and the script's own log adds the % of the
989 bf16 peak. Check: out and lse of the first 2 sequences against fp32 PyTorch math, with the lab's
attention tolerance (1.6e-2 rel + 1e-1 rms element-wise, nmse <= 2e-5: attention_common.cuh says why),
every element of out written (Triton) or finite (the others).
Variants:
  triton 128x64 w4   one program per 128 queries of one head (the heaviest, last, query blocks
                     launched first), keys in tiles of 64: the tiles left of the diagonal unmasked,
                     the diagonal ones masked; online softmax in base 2; P rounded to bf16 for the
                     PV product (as FlashAttention and cuDNN do); 4 warps, 3 pipeline stages
  triton 128x128 w8  the same kernel with 128-key tiles and 8 warps
  torch.compile      softmax(mask(q k^T / sqrt(HD))) v in plain PyTorch (scores rounded to bf16 by the
                     matmul, fp32 softmax, P in bf16), compiled; checked with nmse <= 1e-4 (the
                     bf16 scores cost ~4x a flash kernel's error)
  torch eager        the same expression uncompiled: it writes the (B, NH, T, T) scores (3 GB in fp32)
  sdpa flash         F.scaled_dot_product_attention(is_causal=True) with the flash backend
  sdpa cudnn         the same with the cuDNN backend (SKIPPED where this PyTorch build lacks it)
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_common as lc  # noqa: E402

ARGS = lc.parse_args(__file__, __doc__)
torch, triton, tl = lc.require(__file__)
F = torch.nn.functional

NMSE_MAX = 1e-4 if lc.INTERPRET else 2e-5  # the interpreter truncates P and out to bf16: ~2x the error
# The plain PyTorch expression (torch.compile, eager) rounds the scores q k^T to bf16 (the matmul's
# output dtype) before its fp32 softmax, as nanoGPT's non-flash path does: ~4x the nmse of a
# flash kernel, whose scores stay fp32 (measured 1.8e-5 at the small shape on the CPU).
NMSE_MAX_BF16_SCORES = 1e-4
TOL_ATTENTION = (1.6e-2, 1e-1)
REF_BATCHES = 2


@triton.jit
def attention_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, lo, hi, stride_t, qk_scale,
                    MASKED: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    # keys [lo, hi) in tiles of BLOCK_N; m_i is the running max of the scores in log2 units.
    # UPCAST (Triton's CPU interpreter only, whose bf16 tl.dot returns garbage): the same products in fp32
    for start_n in range(lo, hi, BLOCK_N):
        k = tl.load(k_ptrs + start_n * stride_t)                  # (BLOCK_N, HD)
        if UPCAST:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
        else:
            s = tl.dot(q, tl.trans(k))                            # (BLOCK_M, BLOCK_N) fp32
        if MASKED:
            visible = offs_m[:, None] >= (start_n + offs_n)[None, :]
            s = s * qk_scale + tl.where(visible, 0.0, -1.0e6)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            s = s - m_new[:, None]
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            s = s * qk_scale - m_new[:, None]
        p = tl.math.exp2(s)
        alpha = tl.math.exp2(m_i - m_new)                         # rescales what came before
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs + start_n * stride_t)                  # (BLOCK_N, HD)
        acc = acc * alpha[:, None]
        if UPCAST:
            acc += tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32))
        else:
            acc += tl.dot(p.to(v.dtype), v)                      # P rounded to bf16, fp32 accumulation
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attention_fwd_kernel(out_ptr, lse_ptr, qkv_ptr, T, NH, qk_scale,
                         HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    # grid (T / BLOCK_M, B * NH); query block T/BLOCK_M - 1 (the most keys) first
    block_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // NH
    h = bh % NH
    stride_t = 3 * NH * HD                                        # qkv elements per position
    base = qkv_ptr + b.to(tl.int64) * T * stride_t + h * HD
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HD)
    q = tl.load(base + offs_m[:, None] * stride_t + offs_d[None, :])
    k_ptrs = base + NH * HD + offs_n[:, None] * stride_t + offs_d[None, :]
    v_ptrs = base + 2 * NH * HD + offs_n[:, None] * stride_t + offs_d[None, :]
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HD], dtype=tl.float32)
    diag = block_m * BLOCK_M
    # left of the diagonal block: every key visible to every query of the block
    acc, l_i, m_i = attention_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, 0, diag, stride_t,
                                    qk_scale, MASKED=False, BLOCK_N=BLOCK_N, UPCAST=UPCAST)
    # the diagonal block: key <= query
    acc, l_i, m_i = attention_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, diag, diag + BLOCK_M,
                                    stride_t, qk_scale, MASKED=True, BLOCK_N=BLOCK_N, UPCAST=UPCAST)
    out = acc / l_i[:, None]
    o_ptrs = out_ptr + (b.to(tl.int64) * T + offs_m)[:, None] * (NH * HD) + h * HD + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty))
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453          # log2 units -> natural log
    tl.store(lse_ptr + bh.to(tl.int64) * T + offs_m, lse)


def attention_triton(out, lse, qkv, B, T, NH, HD, block_m, block_n, warps, stages):
    if T % block_m or block_m % block_n:
        raise ValueError(f"T = {T} must be a multiple of BLOCK_M = {block_m}, itself a multiple of BLOCK_N = {block_n}")
    qk_scale = (1.0 / math.sqrt(HD)) * 1.4426950408889634  # scale and log2(e) in one multiply
    attention_fwd_kernel[(T // block_m, B * NH)](out, lse, qkv, T, NH, qk_scale, HD=HD, BLOCK_M=block_m,
                                                 BLOCK_N=block_n, UPCAST=lc.INTERPRET, num_warps=warps,
                                                 num_stages=stages)


def heads(qkv, B, T, NH, HD):
    """q, k, v as (B, NH, T, HD) strided views of the packed qkv."""
    x = qkv.view(B, T, 3, NH, HD)
    return x[:, :, 0].transpose(1, 2), x[:, :, 1].transpose(1, 2), x[:, :, 2].transpose(1, 2)


def attention_expr(q, k, v):
    T, HD = q.shape[-2], q.shape[-1]
    s = (q @ k.transpose(-2, -1)).float() * (1.0 / math.sqrt(HD))
    pos = torch.arange(T, device=q.device)
    s = s.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    p = torch.softmax(s, dim=-1).to(q.dtype)
    return p @ v


def sdpa_backend(name):
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    backend = getattr(SDPBackend, name, None)
    return None if backend is None else (lambda: sdpa_kernel(backend))


def run_shape(L, name, B, T, NH, HD):
    op = f"attention_forward {name} B={B} T={T} NH={NH} NKV={NH} HD={HD} W=0"
    C = NH * HD
    qkv = L.rand((B, T, 3 * C), 101, -2.0, 2.0)  # the lab's range: peaked enough to test the softmax
    q, k, v = heads(qkv, B, T, NH, HD)

    # fp32 reference on the first REF_BATCHES sequences
    qf, kf, vf = (t[:REF_BATCHES].float() for t in (q, k, v))
    s = (qf @ kf.transpose(-2, -1)) * (1.0 / math.sqrt(HD))
    pos = torch.arange(T, device=lc.DEVICE)
    s = s.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    ref_lse = torch.logsumexp(s, dim=-1)                                         # (RB, NH, T)
    ref_out = (torch.softmax(s, dim=-1) @ vf).transpose(1, 2).reshape(REF_BATCHES, T, C)  # (RB, T, C)
    del qf, kf, vf, s

    flops = 2.0 * B * NH * T * T * HD
    nbytes = (qkv.numel() + B * T * C) * 2.0 + B * NH * T * 4.0

    out, lse = lc.Out((B, T, C), torch.bfloat16, "out"), lc.Out((B, NH, T), torch.float32, "lse")

    def reset():
        out.poison()
        lse.poison()

    def check_triton(_):
        ok = L.check_out(out, ref_out, TOL_ATTENTION, rows=slice(0, REF_BATCHES), nmse_max=NMSE_MAX)
        return L.check_out(lse, ref_lse, lc.TOL_BF16, rows=slice(0, REF_BATCHES)) and ok

    def check_heads_out(y, nmse_max=NMSE_MAX):  # y: (B, NH, T, HD)
        if tuple(y.shape) != (B, NH, T, HD):
            print(f"    out        FAIL: shape {tuple(y.shape)}")
            return False
        lc.sync()
        ok = True
        bad = lc.nonfinite(y)
        if bad:
            print(f"    out        FAIL: {bad} of {y.numel()} elements are not finite")
            ok = False
        got = y[:REF_BATCHES].transpose(1, 2).reshape(REF_BATCHES, T, C)
        return L.compare("out", got, ref_out, TOL_ATTENTION, nmse_max) and ok

    def check_bf16_scores(y):
        return check_heads_out(y, NMSE_MAX_BF16_SCORES)

    for block_m, block_n, warps, stages in ((128, 64, 4, 3), (128, 128, 8, 3)):
        def launch(cfg=(block_m, block_n, warps, stages)):
            attention_triton(out.t, lse.t, qkv, B, T, NH, HD, *cfg)

        L.run(op, f"triton {block_m}x{block_n} w{warps}", nbytes, flops, lc.COMPUTE, reset, launch, check_triton)
    del out, lse
    torch.cuda.empty_cache()

    compiled = L.compile(attention_expr)
    L.run(op, "torch.compile", nbytes, flops, lc.COMPUTE, lambda: None, lambda: compiled(q, k, v),
          check_bf16_scores)
    L.run(op, "torch eager", nbytes, flops, lc.COMPUTE, lambda: None, lambda: attention_expr(q, k, v),
          check_bf16_scores)
    torch.cuda.empty_cache()
    for what, backend in (("sdpa flash", "FLASH_ATTENTION"), ("sdpa cudnn", "CUDNN_ATTENTION")):
        ctx = sdpa_backend(backend)
        if ctx is None:
            print(f"SKIPPED {op} | {what}: torch.nn.attention has no SDPBackend.{backend}")
            continue

        def sdpa(ctx=ctx):
            with ctx():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        L.run(op, what, nbytes, flops, lc.COMPUTE, lambda: None, sdpa, check_heads_out, optional=True)


def main():
    L = lc.Lab(__file__, ARGS)
    if ARGS.small:
        run_shape(L, "small", 2, 256, 3, 64)
    else:
        run_shape(L, "gpt2", 64, 1024, 12, 64)
    return L.finish()


if __name__ == "__main__":
    sys.exit(main())
