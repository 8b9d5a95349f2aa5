"""layernorm.py: LayerNorm forward and backward, in Triton and through torch.compile, at the shape
and with the byte counts of dev/cuda/layernorm.cu (its rows share these names).
  python3 dev/triton/layernorm.py [row ...] [--check-only] [--reps N] [--compile-mode M]
Shape: GPT-2 124M, N = B*T = 65536 rows, C = 768, bf16, eps 1e-5 (llmc/layernorm.cuh).
Forward: out = (x - mean) * rstd * weight + bias, writes out (bf16), mean and rstd (fp32).
  Bytes N*C in + N*C out + 8N statistics + 2C parameters; FLOPs 8 N*C.
Backward, accumulating as the lab's does: dinp += rstd * (g - mean_c(g) - n * mean_c(g * n)),
  dweight += sum_rows dout * n, dbias += sum_rows dout (n = (x - mean) * rstd, g = dout * weight),
  from the reference's fp32 mean and rstd. Bytes dout and x in, dinp read and written, 8N, 6C;
  FLOPs 15 N*C.
Variants:
  triton R r wW   forward: R rows a program, W warps, the rows in registers (1024-wide masked
                 block), one read (FWD_CONFIGS: each configuration is its own row);
                 backward: one program per chunk of rows (8 chunks per SM), R rows a step, writes
                 dinp and its chunk's fp32 column partials of dweight/dbias; a second small kernel
                 sums the partials in a fixed order (deterministic) and adds them into dweight and
                 dbias (the shipped CUDA design; the Triton tutorial's version uses a lock per group
                 instead). `tile`: the partials accumulate as (R, 1024) tiles, summed over rows once
                 after the loop, not every step (BWD_CONFIGS).
                 First H200 run (b0218d8, docs/perf.md; then 4 rows, 8 warps, no tile sums): forward
                 69% of copy, backward 22%; the other configurations are not measured yet
  torch.compile  forward: torch.ops.aten.native_layer_norm (what F.layer_norm calls; it returns
                 mean and rstd too), compiled; backward: the formula above written in PyTorch, compiled
  torch eager    the same expressions uncompiled (forward: PyTorch's own fused CUDA kernel)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_common as lc  # noqa: E402

ARGS = lc.parse_args(__file__, __doc__)
torch, triton, tl = lc.require(__file__)

EPS = 1e-5


@triton.jit
def layernorm_fwd_kernel(out_ptr, mean_ptr, rstd_ptr, x_ptr, w_ptr, b_ptr, N, C, eps,
                         ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_C)
    row_ok = rows < N
    col_ok = cols < C
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * C + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / C
    d = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / C + eps)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = d * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=row_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def layernorm_bwd_kernel(dinp_ptr, partial_ptr, dout_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, N, C, rows_per_chunk,
                         ROWS: tl.constexpr, BLOCK_C: tl.constexpr, TILE_SUMS: tl.constexpr):
    # TILE_SUMS: dweight/dbias partials kept as (ROWS, BLOCK_C) tiles, summed over rows once at the end
    # (elementwise adds in the loop); else summed over the ROWS rows every step (a cross-warp reduction
    # a step)
    chunk = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols < C
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    if TILE_SUMS:
        dw = tl.zeros([ROWS, BLOCK_C], dtype=tl.float32)
        db = tl.zeros([ROWS, BLOCK_C], dtype=tl.float32)
    else:
        dw = tl.zeros([BLOCK_C], dtype=tl.float32)
        db = tl.zeros([BLOCK_C], dtype=tl.float32)
    r0 = chunk * rows_per_chunk
    r1 = tl.minimum(r0 + rows_per_chunk, N)
    for start in range(r0, r1, ROWS):
        rows = start + tl.arange(0, ROWS)
        row_ok = rows < r1
        mask = row_ok[:, None] & col_ok[None, :]
        offs = rows.to(tl.int64)[:, None] * C + cols[None, :]
        dy = tl.load(dout_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
        s = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        n = (x - m[:, None]) * s[:, None]
        g = dy * w[None, :]  # zero wherever masked (dy is)
        mean_g = tl.sum(g, axis=1) / C
        mean_gn = tl.sum(g * n, axis=1) / C
        dx = s[:, None] * (g - mean_g[:, None] - n * mean_gn[:, None])
        di = tl.load(dinp_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(dinp_ptr + offs, (di + dx).to(dinp_ptr.dtype.element_ty), mask=mask)
        if TILE_SUMS:
            dw += dy * n
            db += dy
        else:
            dw += tl.sum(dy * n, axis=0)
            db += tl.sum(dy, axis=0)
    if TILE_SUMS:
        dw = tl.sum(dw, axis=0)
        db = tl.sum(db, axis=0)
    base = partial_ptr + chunk.to(tl.int64) * 2 * C
    tl.store(base + cols, dw, mask=col_ok)
    tl.store(base + C + cols, db, mask=col_ok)


@triton.jit
def column_partials_add_kernel(dw_ptr, db_ptr, partial_ptr, chunks, C, ROWS: tl.constexpr, COLS: tl.constexpr):
    # partials: (chunks, 2C), the dweight sums in columns [0, C), the dbias sums in [C, 2C)
    cols = tl.program_id(0) * COLS + tl.arange(0, COLS)
    col_ok = cols < 2 * C
    acc = tl.zeros([COLS], dtype=tl.float32)
    for start in range(0, chunks, ROWS):
        r = start + tl.arange(0, ROWS)
        mask = (r < chunks)[:, None] & col_ok[None, :]
        acc += tl.sum(tl.load(partial_ptr + r.to(tl.int64)[:, None] * 2 * C + cols[None, :], mask=mask, other=0.0),
                      axis=0)
    is_w = cols < C
    is_b = col_ok & (cols >= C)
    w_ptrs = dw_ptr + cols
    b_ptrs = db_ptr + (cols - C)
    old_w = tl.load(w_ptrs, mask=is_w, other=0.0).to(tl.float32)
    old_b = tl.load(b_ptrs, mask=is_b, other=0.0).to(tl.float32)
    tl.store(w_ptrs, (old_w + acc).to(dw_ptr.dtype.element_ty), mask=is_w)
    tl.store(b_ptrs, (old_b + acc).to(db_ptr.dtype.element_ty), mask=is_b)


def block_c(C):
    return max(triton.next_power_of_2(C), 16)


# The configurations each timed as its own row: (rows a program, warps) forward, (rows a step, warps,
# tile sums) backward; the first of each is the one the H200 run of b0218d8 measured (docs/perf.md)
FWD_CONFIGS = ((4, 8), (2, 4), (8, 8))
BWD_CONFIGS = ((4, 8, False), (4, 8, True), (2, 4, True))


def layernorm_fwd_triton(out, mean, rstd, x, w, b, rows=4, warps=8):
    N, C = x.shape
    layernorm_fwd_kernel[(triton.cdiv(N, rows),)](out, mean, rstd, x, w, b, N, C, EPS, ROWS=rows,
                                                  BLOCK_C=block_c(C), num_warps=warps)


def layernorm_bwd_triton(dinp, dweight, dbias, partials, dout, x, w, mean, rstd, chunks, rows=4, warps=8,
                         tile_sums=False):
    N, C = x.shape
    rows_per_chunk = triton.cdiv(N, chunks)
    layernorm_bwd_kernel[(chunks,)](dinp, partials, dout, x, w, mean, rstd, N, C, rows_per_chunk, ROWS=rows,
                                    BLOCK_C=block_c(C), TILE_SUMS=tile_sums, num_warps=warps)
    COLS = 32
    column_partials_add_kernel[(triton.cdiv(2 * C, COLS),)](dweight, dbias, partials, chunks, C, ROWS=64, COLS=COLS,
                                                           num_warps=4)


def layernorm_fwd_expr(x, w, b):
    out, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, EPS)
    return out, mean, rstd


def layernorm_bwd_expr(dinp, dweight, dbias, dout, x, w, mean, rstd):
    dy = dout.float()
    n = (x.float() - mean[:, None]) * rstd[:, None]
    g = dy * w.float()
    dx = rstd[:, None] * (g - g.mean(-1, keepdim=True) - n * (g * n).mean(-1, keepdim=True))
    return ((dinp.float() + dx).to(dinp.dtype), (dweight.float() + (dy * n).sum(0)).to(dweight.dtype),
            (dbias.float() + dy.sum(0)).to(dbias.dtype))


def run_shape(L, N, C):
    shape = f" N={N} C={C}"
    bf16 = torch.bfloat16
    s = 2  # sizeof(bf16)
    x = L.rand((N, C), 21, -2.0, 2.0)
    w = L.rand((C,), 23, 0.5, 1.5)
    b = L.rand((C,), 24)
    dout = L.rand((N, C), 25)
    dinp0 = L.rand((N, C), 26, -0.1, 0.1)
    dweight0, dbias0 = L.rand((C,), 27), L.rand((C,), 28)

    # ---- the fp32 reference from the same bf16 values
    xf = x.float()
    ref_mean = xf.mean(-1)
    ref_rstd = torch.rsqrt((xf - ref_mean[:, None]).square().mean(-1) + EPS)
    ref_out = (xf - ref_mean[:, None]) * ref_rstd[:, None] * w.float() + b.float()

    # ---- forward
    op = "layernorm_forward" + shape
    fwd_bytes, fwd_flops = 2.0 * N * C * s + 8.0 * N + 2.0 * C * s, 8.0 * N * C
    out, mean, rstd = lc.Out((N, C), bf16, "out"), lc.Out((N,), torch.float32, "mean"), lc.Out((N,), torch.float32, "rstd")

    def reset_fwd():
        out.poison()
        mean.poison()
        rstd.poison()

    def check_fwd_out(_):
        ok = L.check_out(out, ref_out)
        ok = L.check_out(mean, ref_mean, lc.TOL_STATS) and ok
        return L.check_out(rstd, ref_rstd, lc.TOL_STATS) and ok

    def check_fwd_fresh(res):
        o, m, r = res
        # PyTorch's statistics are fp32 on CUDA; its CPU kernel (the interpreter runs) returns the input's dtype
        tol = lc.TOL_STATS if m.dtype == torch.float32 else lc.TOL_BF16
        if m.dtype != torch.float32:
            print(f"    (mean and rstd came back as {m.dtype}: compared at the bf16 tolerance)")
        ok = L.check_fresh("out", o, ref_out)
        ok = L.check_fresh("mean", m.float().reshape(-1), ref_mean, tol) and ok
        return L.check_fresh("rstd", r.float().reshape(-1), ref_rstd, tol) and ok

    for rows, warps in FWD_CONFIGS:
        L.run(op, f"triton {rows}r w{warps}", fwd_bytes, fwd_flops, lc.MEMORY, reset_fwd,
              lambda cfg=(rows, warps): layernorm_fwd_triton(out.t, mean.t, rstd.t, x, w, b, *cfg), check_fwd_out)
    compiled_fwd = L.compile(layernorm_fwd_expr)
    L.run(op, "torch.compile", fwd_bytes, fwd_flops, lc.MEMORY, lambda: None, lambda: compiled_fwd(x, w, b),
          check_fwd_fresh)
    L.run(op, "torch eager", fwd_bytes, fwd_flops, lc.MEMORY, lambda: None, lambda: layernorm_fwd_expr(x, w, b),
          check_fwd_fresh)
    del out, mean, rstd

    # ---- backward (+=), from the reference's statistics
    dy = dout.float()
    n = (xf - ref_mean[:, None]) * ref_rstd[:, None]
    g = dy * w.float()
    ref_dinp = dinp0.float() + ref_rstd[:, None] * (g - g.mean(-1, keepdim=True) - n * (g * n).mean(-1, keepdim=True))
    ref_dweight = dweight0.float() + (dy * n).double().sum(0).float()
    ref_dbias = dbias0.float() + dy.double().sum(0).float()
    del dy, n, g

    op = "layernorm_backward" + shape
    bwd_bytes, bwd_flops = 4.0 * N * C * s + 8.0 * N + 6.0 * C * s, 15.0 * N * C
    dinp, dweight, dbias = torch.empty_like(dinp0), torch.empty_like(dweight0), torch.empty_like(dbias0)
    chunks = min(N, 8 * L.num_sms)
    partials = torch.empty((chunks, 2 * C), dtype=torch.float32, device=lc.DEVICE)

    def reset_bwd():
        dinp.copy_(dinp0)
        dweight.copy_(dweight0)
        dbias.copy_(dbias0)
        partials.fill_(float("nan"))  # every partial must be written before it is summed

    def check_bwd(res):
        di, dw, db = res
        ok = L.check_fresh("dinp", di, ref_dinp)
        ok = L.check_fresh("dweight", dw, ref_dweight) and ok
        return L.check_fresh("dbias", db, ref_dbias) and ok

    def bwd_triton(cfg):
        layernorm_bwd_triton(dinp, dweight, dbias, partials, dout, x, w, ref_mean, ref_rstd, chunks, *cfg)
        return dinp, dweight, dbias

    for rows, warps, tile_sums in BWD_CONFIGS:
        L.run(op, f"triton {rows}r w{warps}{' tile' if tile_sums else ''}", bwd_bytes, bwd_flops, lc.MEMORY,
              reset_bwd, lambda cfg=(rows, warps, tile_sums): bwd_triton(cfg), check_bwd)
    compiled_bwd = L.compile(layernorm_bwd_expr)
    L.run(op, "torch.compile", bwd_bytes, bwd_flops, lc.MEMORY, lambda: None,
          lambda: compiled_bwd(dinp0, dweight0, dbias0, dout, x, w, ref_mean, ref_rstd), check_bwd)
    L.run(op, "torch eager", bwd_bytes, bwd_flops, lc.MEMORY, lambda: None,
          lambda: layernorm_bwd_expr(dinp0, dweight0, dbias0, dout, x, w, ref_mean, ref_rstd), check_bwd)


def main():
    L = lc.Lab(__file__, ARGS)
    run_shape(L, *((lc.SMALL_ROWS, 776) if ARGS.small else (65536, 768)))
    return L.finish()


if __name__ == "__main__":
    sys.exit(main())
