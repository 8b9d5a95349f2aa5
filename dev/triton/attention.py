"""attention.py: causal attention forward and backward at GPT-2 124M's shape, in Triton (flash-attention
kernels in the style of the Triton fused-attention tutorial), through torch.compile, and (forward)
through PyTorch's scaled_dot_product_attention (flash and cuDNN backends) as the reference rows.
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
                     matmul, fp32 softmax, P in bf16), compiled; checked with nmse <= 1e-4 and an
                     element-wise absolute term 2.2x as wide (the bf16 scores cost ~4x a flash
                     kernel's squared error)
  torch eager        the same expression uncompiled: it writes the (B, NH, T, T) scores (3 GB in fp32)
  sdpa flash         F.scaled_dot_product_attention(is_causal=True) with the flash backend
  sdpa cudnn         the same with the cuDNN backend (SKIPPED where this PyTorch build lacks it)
Backward: dev/cuda/attention_backward.cu's "gpt2" row (attention_backward ...): from fresh qkv and
dout, with out and lse from the Triton forward (as the lab takes them from the shipped forward),
writes dqkv (B, T, 3 * NH * HD) packed like qkv. FLOPs 2.5x the forward's; bytes qkv and dout and
out in, lse in, dqkv out (the lab's). Check: dq, dk and dv of the first 2 sequences, each against its
own scale, against fp32 PyTorch math from the same out and lse (the lab's tolerance and nmse bound),
every element of dqkv written.
  triton 64x64 w4    delta = rowsum(dout * out), then two kernels without atomics (deterministic):
                     one program per 64 keys of a head sums dK and dV over the query tiles that see
                     them (the diagonal tiles masked), 64 queries a step; one program per 64 queries
                     sums dQ over its keys; P recomputed from lse, P and dS rounded to bf16 for their
                     products; 4 warps, 3 stages
  triton 128x64 w8   128 keys (dK/dV) and 128 queries (dQ) a program, 64 a step, 8 warps, 2 stages
  torch.compile      the backward formulas in plain PyTorch from out and lse (bf16 products, fp32
                     softmax terms, P and dS in bf16), compiled; nmse <= 1e-4 as the forward's
  torch eager        the same uncompiled
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_common as lc  # noqa: E402

ARGS = lc.parse_args(__file__, __doc__)
torch, triton, tl = lc.require(__file__)
F = torch.nn.functional
from lab_triton import mma  # noqa: E402

NMSE_MAX = 1e-4 if lc.INTERPRET else 2e-5  # the interpreter truncates P and out to bf16: ~2x the error
# The plain PyTorch expression (torch.compile, eager) rounds the scores q k^T to bf16 (the matmul's
# output dtype) before its fp32 softmax, as nanoGPT's non-flash path does: ~4x the nmse of a
# flash kernel, whose scores stay fp32 (measured 1.8e-5 at the small shape on the CPU).
NMSE_MAX_BF16_SCORES = 1e-4
TOL_ATTENTION = (1.6e-2, 1e-1)
# The same expression's element-wise bound: its absolute term scaled as the error's rms is, by
# sqrt(1e-4 / 2e-5) ~ 2.2x the flash kernels' (on an H100 its backward's dv had nmse 3.2e-5, ~6x the
# Triton kernels', and 4 of its ~1.6M checked elements past 1e-1 rms: errors ~0.0101 at rms ~0.1).
TOL_ATTENTION_BF16_SCORES = (TOL_ATTENTION[0], TOL_ATTENTION[1] * math.sqrt(NMSE_MAX_BF16_SCORES / NMSE_MAX))
REF_BATCHES = 2
# Triton configurations, each its own row: forward (queries a program, keys a step, warps, stages);
# backward (keys a dK/dV program = queries a dQ program, queries = keys a step, warps, stages)
FWD_CONFIGS = ((128, 64, 4, 3), (128, 128, 8, 3))
BWD_CONFIGS = ((64, 64, 4, 3), (128, 64, 8, 2))


@triton.jit
def attention_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, lo, hi, stride_t, qk_scale,
                    MASKED: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    # keys [lo, hi) in tiles of BLOCK_N; m_i is the running max of the scores in log2 units
    for start_n in range(lo, hi, BLOCK_N):
        k = tl.load(k_ptrs + start_n * stride_t)                  # (BLOCK_N, HD)
        s = mma(q, tl.trans(k), UPCAST)                           # (BLOCK_M, BLOCK_N) fp32
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
        acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, UPCAST)  # P rounded to bf16, fp32 accumulation
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def head_of_program(T, NH, HD: tl.constexpr):
    # grid axis 1 is B * NH: this program's (sequence b, head h), the qkv row stride (elements per
    # position) and the offset of the head's first qkv element of sequence b
    bh = tl.program_id(1)
    b = bh // NH
    h = bh % NH
    stride_t = 3 * NH * HD
    return bh, b, h, stride_t, b.to(tl.int64) * T * stride_t + h * HD


@triton.jit
def attention_fwd_kernel(out_ptr, lse_ptr, qkv_ptr, T, NH, qk_scale,
                         HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    # grid (T / BLOCK_M, B * NH); query block T/BLOCK_M - 1 (the most keys) first
    block_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh, b, h, stride_t, head = head_of_program(T, NH, HD)
    base = qkv_ptr + head
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


# ---------------------------------------------------------------- backward
# dV = P^T dO, dP = dO V^T, dS = P * (dP - delta) with delta = rowsum(dO * O), dQ = scale dS K,
# dK = scale dS^T Q; P recomputed from the forward's lse (no running max: exp2 of the scaled score
# minus lse in log2 units). Two passes, neither with atomics (deterministic): one program per key
# tile sums dK and dV over the query tiles that see it; one per query tile sums dQ over its keys.
# P and dS enter their products rounded to bf16, as in the forward (and FlashAttention, cuDNN).


@triton.jit
def attention_bwd_delta_kernel(delta_ptr, out_ptr, dout_ptr, T, NH, HD: tl.constexpr, BLOCK_M: tl.constexpr):
    # delta (B, NH, T) fp32 = rowsum(dO * O); grid (T / BLOCK_M, B * NH)
    bh = tl.program_id(1)
    b = bh // NH
    h = bh % NH
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs = (b.to(tl.int64) * T + offs_m)[:, None] * (NH * HD) + h * HD + tl.arange(0, HD)[None, :]
    o = tl.load(out_ptr + offs).to(tl.float32)
    do = tl.load(dout_ptr + offs).to(tl.float32)
    tl.store(delta_ptr + bh.to(tl.int64) * T + offs_m, tl.sum(o * do, axis=1))


@triton.jit
def attention_bwd_dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, offs_n, lo, hi, stride_t,
                             stride_o, qk_scale, MASKED: tl.constexpr, BLOCK_M: tl.constexpr, HD: tl.constexpr,
                             UPCAST: tl.constexpr):
    # query tiles [lo, hi) against one key tile; lse_ptr and delta_ptr point at this head's row
    offs_m = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        q = tl.load(q_ptrs + start_m * stride_t)                                # (BLOCK_M, HD)
        do = tl.load(do_ptrs + start_m * stride_o)                              # (BLOCK_M, HD)
        lse2 = tl.load(lse_ptr + start_m + offs_m) * 1.4426950408889634         # log2 units
        delta = tl.load(delta_ptr + start_m + offs_m)
        p = tl.math.exp2(mma(q, tl.trans(k), UPCAST) * qk_scale - lse2[:, None])  # (BLOCK_M, BLOCK_N)
        if MASKED:
            p = tl.where((start_m + offs_m)[:, None] >= offs_n[None, :], p, 0.0)
        dv += mma(tl.trans(p.to(do.dtype)), do, UPCAST)                        # (BLOCK_N, HD)
        dp = mma(do, tl.trans(v), UPCAST)                                      # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])
        dk += mma(tl.trans(ds.to(q.dtype)), q, UPCAST)                         # (BLOCK_N, HD)
    return dk, dv


@triton.jit
def attention_bwd_dkdv_kernel(dqkv_ptr, qkv_ptr, dout_ptr, lse_ptr, delta_ptr, T, NH, qk_scale, sm_scale,
                              HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    # grid (T / BLOCK_N, B * NH): key tile BLOCK_N of one head; the first key tiles (seen by the most
    # queries) first
    start_n = tl.program_id(0) * BLOCK_N
    bh, b, h, stride_t, base = head_of_program(T, NH, HD)
    stride_o = NH * HD
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HD)
    kv_offs = base + offs_n[:, None] * stride_t + offs_d[None, :]
    k = tl.load(qkv_ptr + NH * HD + kv_offs)
    v = tl.load(qkv_ptr + 2 * NH * HD + kv_offs)
    q_ptrs = qkv_ptr + base + tl.arange(0, BLOCK_M)[:, None] * stride_t + offs_d[None, :]
    do_ptrs = dout_ptr + b.to(tl.int64) * T * stride_o + h * HD + tl.arange(0, BLOCK_M)[:, None] * stride_o + \
        offs_d[None, :]
    lse_row = lse_ptr + bh.to(tl.int64) * T
    delta_row = delta_ptr + bh.to(tl.int64) * T
    dk = tl.zeros([BLOCK_N, HD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HD], dtype=tl.float32)
    # the diagonal query tiles (query >= key), then every later one (all keys of the tile visible)
    dk, dv = attention_bwd_dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, lse_row, delta_row, offs_n, start_n,
                                      start_n + BLOCK_N, stride_t, stride_o, qk_scale, MASKED=True, BLOCK_M=BLOCK_M,
                                      HD=HD, UPCAST=UPCAST)
    dk, dv = attention_bwd_dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, lse_row, delta_row, offs_n, start_n + BLOCK_N,
                                      T, stride_t, stride_o, qk_scale, MASKED=False, BLOCK_M=BLOCK_M, HD=HD,
                                      UPCAST=UPCAST)
    tl.store(dqkv_ptr + NH * HD + kv_offs, (dk * sm_scale).to(dqkv_ptr.dtype.element_ty))
    tl.store(dqkv_ptr + 2 * NH * HD + kv_offs, dv.to(dqkv_ptr.dtype.element_ty))


@triton.jit
def attention_bwd_dq_tiles(dq, q, do, lse2, delta, k_ptrs, v_ptrs, offs_m, lo, hi, stride_t, qk_scale,
                           MASKED: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        k = tl.load(k_ptrs + start_n * stride_t)                                # (BLOCK_N, HD)
        v = tl.load(v_ptrs + start_n * stride_t)
        p = tl.math.exp2(mma(q, tl.trans(k), UPCAST) * qk_scale - lse2[:, None])  # (BLOCK_M, BLOCK_N)
        if MASKED:
            p = tl.where(offs_m[:, None] >= (start_n + offs_n)[None, :], p, 0.0)
        dp = mma(do, tl.trans(v), UPCAST)
        ds = p * (dp - delta[:, None])
        dq += mma(ds.to(k.dtype), k, UPCAST)                                   # (BLOCK_M, HD)
    return dq


@triton.jit
def attention_bwd_dq_kernel(dqkv_ptr, qkv_ptr, dout_ptr, lse_ptr, delta_ptr, T, NH, qk_scale, sm_scale,
                            HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    # grid (T / BLOCK_M, B * NH): query tile BLOCK_M of one head; the last (most keys) first
    block_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh, b, h, stride_t, base = head_of_program(T, NH, HD)
    stride_o = NH * HD
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HD)
    q_offs = base + offs_m[:, None] * stride_t + offs_d[None, :]
    q = tl.load(qkv_ptr + q_offs)
    do = tl.load(dout_ptr + (b.to(tl.int64) * T + offs_m)[:, None] * stride_o + h * HD + offs_d[None, :])
    lse2 = tl.load(lse_ptr + bh.to(tl.int64) * T + offs_m) * 1.4426950408889634
    delta = tl.load(delta_ptr + bh.to(tl.int64) * T + offs_m)
    k_ptrs = qkv_ptr + base + NH * HD + tl.arange(0, BLOCK_N)[:, None] * stride_t + offs_d[None, :]
    v_ptrs = k_ptrs + NH * HD
    dq = tl.zeros([BLOCK_M, HD], dtype=tl.float32)
    diag = block_m * BLOCK_M
    dq = attention_bwd_dq_tiles(dq, q, do, lse2, delta, k_ptrs, v_ptrs, offs_m, 0, diag, stride_t, qk_scale,
                                MASKED=False, BLOCK_N=BLOCK_N, UPCAST=UPCAST)
    dq = attention_bwd_dq_tiles(dq, q, do, lse2, delta, k_ptrs, v_ptrs, offs_m, diag, diag + BLOCK_M, stride_t,
                                qk_scale, MASKED=True, BLOCK_N=BLOCK_N, UPCAST=UPCAST)
    tl.store(dqkv_ptr + q_offs, (dq * sm_scale).to(dqkv_ptr.dtype.element_ty))


def attention_bwd_triton(dqkv, delta, dout, qkv, out, lse, B, T, NH, HD, kv_tile, q_tile, warps, stages):
    """dqkv (B, T, 3C) written with `=`. dK/dV pass: kv_tile keys a program, q_tile queries a step; dQ
    pass: kv_tile queries a program, q_tile keys a step (so one pair of tiles divides T for both)."""
    if T % kv_tile or kv_tile % q_tile:
        raise ValueError(f"T = {T} must be a multiple of {kv_tile}, itself a multiple of {q_tile}")
    sm_scale = 1.0 / math.sqrt(HD)
    qk_scale = sm_scale * 1.4426950408889634
    attention_bwd_delta_kernel[(T // q_tile, B * NH)](delta, out, dout, T, NH, HD=HD, BLOCK_M=q_tile)
    attention_bwd_dkdv_kernel[(T // kv_tile, B * NH)](dqkv, qkv, dout, lse, delta, T, NH, qk_scale, sm_scale, HD=HD,
                                                      BLOCK_M=q_tile, BLOCK_N=kv_tile, UPCAST=lc.INTERPRET,
                                                      num_warps=warps, num_stages=stages)
    attention_bwd_dq_kernel[(T // kv_tile, B * NH)](dqkv, qkv, dout, lse, delta, T, NH, qk_scale, sm_scale, HD=HD,
                                                    BLOCK_M=kv_tile, BLOCK_N=q_tile, UPCAST=lc.INTERPRET,
                                                    num_warps=warps, num_stages=stages)


def attention_bwd_expr(q, k, v, out, dout, lse):
    """The backward in plain PyTorch from the forward's out and lse: (B, NH, T, HD) views, lse (B, NH, T).
    bf16 products, fp32 softmax terms, P and dS rounded to bf16 for their products."""
    T, HD = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(HD)
    pos = torch.arange(T, device=q.device)
    s = (q @ k.transpose(-2, -1)).float() * scale
    p = torch.exp(s - lse[..., None]).masked_fill(pos[None, :] > pos[:, None], 0.0)
    delta = (dout.float() * out.float()).sum(-1, keepdim=True)
    dv = p.to(q.dtype).transpose(-2, -1) @ dout
    ds = (p * ((dout @ v.transpose(-2, -1)).float() - delta)).to(q.dtype)
    dq = ((ds @ k).float() * scale).to(q.dtype)
    dk = ((ds.transpose(-2, -1) @ q).float() * scale).to(q.dtype)
    return dq, dk, dv


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

    def check_heads_out(y, nmse_max=NMSE_MAX, tol=TOL_ATTENTION):  # y: (B, NH, T, HD)
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
        return L.compare("out", got, ref_out, tol, nmse_max) and ok

    def check_bf16_scores(y):
        return check_heads_out(y, NMSE_MAX_BF16_SCORES, TOL_ATTENTION_BF16_SCORES)

    for block_m, block_n, warps, stages in FWD_CONFIGS:
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


def split_dqkv(dqkv, T, NH, HD):
    """dq, dk, dv of the first REF_BATCHES sequences of a packed (B, T, 3C) gradient, each (RB, T, C)."""
    x = dqkv[:REF_BATCHES].reshape(REF_BATCHES, T, 3, NH * HD)
    return x[:, :, 0], x[:, :, 1], x[:, :, 2]


def run_backward(L, name, B, T, NH, HD):
    op = f"attention_backward {name} B={B} T={T} NH={NH} NKV={NH} HD={HD} W=0"
    C, RB = NH * HD, REF_BATCHES
    qkv = L.rand((B, T, 3 * C), 111, -2.0, 2.0)
    dout = L.rand((B, T, C), 112)
    q, k, v = heads(qkv, B, T, NH, HD)
    # O and lse from the Triton forward (checked above), as the CUDA lab takes them from the shipped one
    out, lse = torch.empty((B, T, C), dtype=torch.bfloat16, device=lc.DEVICE), \
        torch.empty((B, NH, T), dtype=torch.float32, device=lc.DEVICE)
    attention_triton(out, lse, qkv, B, T, NH, HD, *FWD_CONFIGS[0])
    lc.sync()

    # fp32 reference on the first RB sequences, from the very O and lse the kernels read
    def per_head(t):  # (RB, T, C) -> (RB, NH, T, HD) fp32
        return t[:RB].float().reshape(RB, T, NH, HD).transpose(1, 2)

    qf, kf, vf = (t[:RB].float() for t in (q, k, v))
    of, dof = per_head(out), per_head(dout)
    scale = 1.0 / math.sqrt(HD)
    pos = torch.arange(T, device=lc.DEVICE)
    p = torch.exp((qf @ kf.transpose(-2, -1)) * scale - lse[:RB, :, :, None])
    p = p.masked_fill(pos[None, :] > pos[:, None], 0.0)
    ds = p * (dof @ vf.transpose(-2, -1) - (dof * of).sum(-1, keepdim=True))
    refs = [(g.transpose(1, 2).reshape(RB, T, C)) for g in (ds @ kf * scale, ds.transpose(-2, -1) @ qf * scale,
                                                               p.transpose(-2, -1) @ dof)]
    del qf, kf, vf, of, dof, p, ds

    flops = 2.5 * 2.0 * B * NH * T * T * HD   # the forward's times 2.5 (attention_backward.cu's convention)
    nbytes = (2 * qkv.numel() + 2 * dout.numel()) * 2.0 + lse.numel() * 4.0

    def compare_parts(parts, nmse_max, tol=TOL_ATTENTION):
        ok = True
        for what, got, ref in zip(("dq", "dk", "dv"), parts, refs):
            ok = L.compare(what, got, ref, tol, nmse_max) and ok
        return ok

    dqkv = lc.Out((B, T, 3 * C), torch.bfloat16, "dqkv")
    delta = torch.empty((B, NH, T), dtype=torch.float32, device=lc.DEVICE)

    def check_triton(_):
        # every element written and the guard (the values of the whole checked there too, against one
        # scale), then dq, dk and dv each against its own scale
        ok = L.check_out(dqkv, torch.stack(refs, 2).reshape(RB, T, 3 * C), TOL_ATTENTION, rows=slice(0, RB))
        return compare_parts(split_dqkv(dqkv.t, T, NH, HD), NMSE_MAX) and ok

    for kv_tile, q_tile, warps, stages in BWD_CONFIGS:
        def launch(cfg=(kv_tile, q_tile, warps, stages)):
            attention_bwd_triton(dqkv.t, delta, dout, qkv, out, lse, B, T, NH, HD, *cfg)

        L.run(op, f"triton {kv_tile}x{q_tile} w{warps}", nbytes, flops, lc.COMPUTE, dqkv.poison, launch,
              check_triton)
    del dqkv, delta
    torch.cuda.empty_cache()

    o_heads, do_heads = (t.view(B, T, NH, HD).transpose(1, 2) for t in (out, dout))

    def check_expr(grads):  # (B, NH, T, HD) each; bf16 scores as in the forward's expression
        ok = True
        for what, g in zip(("dq", "dk", "dv"), grads):
            bad = lc.nonfinite(g)
            if bad:
                print(f"    {what:<10} FAIL: {bad} of {g.numel()} elements are not finite")
                ok = False
        parts = [g[:RB].transpose(1, 2).reshape(RB, T, C) for g in grads]
        return compare_parts(parts, NMSE_MAX_BF16_SCORES, TOL_ATTENTION_BF16_SCORES) and ok

    compiled = L.compile(attention_bwd_expr)
    L.run(op, "torch.compile", nbytes, flops, lc.COMPUTE, lambda: None,
          lambda: compiled(q, k, v, o_heads, do_heads, lse), check_expr)
    L.run(op, "torch eager", nbytes, flops, lc.COMPUTE, lambda: None,
          lambda: attention_bwd_expr(q, k, v, o_heads, do_heads, lse), check_expr)


def main():
    L = lc.Lab(__file__, ARGS)
    shape = ("small", 2, 256, 3, 64) if ARGS.small else ("gpt2", 64, 1024, 12, 64)
    run_shape(L, *shape)
    run_backward(L, *shape)
    return L.finish()


if __name__ == "__main__":
    sys.exit(main())
