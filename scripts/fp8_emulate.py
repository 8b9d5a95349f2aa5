"""FP8 training emulated in PyTorch: scripts/train_gpt2.py --fp8-emulate RECIPE (issue 18; docs/numerics.md,
"the PyTorch emulation"). The expected numbers for the GPU trainer's --fp8 1 come from here, not from our
CUDA code: the same four linear layers of every block (qkv, attproj, fc, fcproj) run their three matmuls
on FP8 values, everything else is what the bf16 run computes.

A linear layer y = x W^T + b, x (N, Cin), W (OC, Cin), dY (N, OC), computes
  forward          y  = q(x) q(W)^T + b                   x, W in e4m3
  input gradient   dX = q(dY) q(W)                       dY in the gradient format (e5m2 by default)
  weight gradient  dW = q(dY)^T q(x)                     (rowwise_gw_bf16: dY^T x in bf16)
  bias gradient    db = column sums of dY (fp32 sums, as the trainer's bias_backward)
where q(t) = fp8(t * scale) * scale_inv. The scale is llmc/fp8.cuh's current scaling, one per tile of t:
  scale = fp8 max / amax   (fp32 IEEE division, capped at 2^64; amax = max |t| over the tile)
  fp8(v): nearest, ties to even (torch's cast; cvt.rn.satfinite's saturation is never reached: see quantize)
  scale_inv = 1 / scale    (IEEE division)
An all-zero tile (amax 0) quantizes to zeros whatever its scale, so the trainer's "keep the previous scale"
and this file's cap give the same values. The recipes differ only in the tiles (of the tensor as stored):

  recipe            x fwd    W fwd     dY for dX   W for dX   dY for dW  x for dW
  tensorwise        tensor   tensor    tensor      tensor     tensor     tensor      (ours, --fp8 1)
  rowwise           row      row       row         column     column     column      (torchao's rowwise)
  rowwise_gw_bf16   row      row       row         column     bf16       bf16        (torchao's rowwise_with_gw_hp)
  blockwise         1x128    128x128   1x128       128x128    128x1      128x1       (DeepSeek-V3)

"row" of x is a token, of W an output channel: each matmul's scales run along its non-reduced dims, so
they factor out of its sums; a 1x128 or 128x1 tile spans 128 elements of the reduced dim, so blockwise
sums each 128-long chunk of K on its own and adds the chunks scaled (DeepSeek-V3's promotion to fp32).
Differences from torchao: its rowwise recipes use e4m3 gradients and round scales to powers of 2, and
rowwise_with_gw_hp casts W for dX per tensor; here only the tiles change, the gradient format is
--fp8-emulate-grad for all recipes.

The matmuls multiply the FP8 values themselves (at most 4 significant bits, exact in fp32 and in TF32)
in fp32 and apply the scales to the fp32 result: the arithmetic of an FP8 tensor core with fp32
accumulation and the scales in the epilogue. Outputs (y, dX, dW, db) are rounded to the layer's compute
dtype (bf16 under --dtype bf16), as the trainer writes bf16.
"""
from typing import NamedTuple

import torch
import torch.nn.functional as F

# format name: (torch dtype, largest finite value)
FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}
BLOCK = 128  # DeepSeek-V3's tile edge
ALL = None   # a tile that spans the whole dimension
# Per recipe: the tiles (rows, cols) of x, W and dY as stored, (N, Cin), (OC, Cin), (N, OC), for each use;
# None in place of a pair: that matmul runs in the compute dtype, unquantized.
TILES = {
    "tensorwise": dict(x=(ALL, ALL), w=(ALL, ALL), dy_dx=(ALL, ALL), w_dx=(ALL, ALL), dy_dw=(ALL, ALL), x_dw=(ALL, ALL)),
    "rowwise": dict(x=(1, ALL), w=(1, ALL), dy_dx=(1, ALL), w_dx=(ALL, 1), dy_dw=(ALL, 1), x_dw=(ALL, 1)),
    "rowwise_gw_bf16": dict(x=(1, ALL), w=(1, ALL), dy_dx=(1, ALL), w_dx=(ALL, 1), dy_dw=None, x_dw=None),
    "blockwise": dict(x=(1, BLOCK), w=(BLOCK, BLOCK), dy_dx=(1, BLOCK), w_dx=(BLOCK, BLOCK),
                      dy_dw=(BLOCK, 1), x_dw=(BLOCK, 1)),
}


class Fp8Tensor(NamedTuple):
    """A quantized (R, C) tensor: q (R, C) fp32 holds the FP8 values fp8(t * scale), not yet multiplied back;
    scale_inv (ceil(R / tr), ceil(C / tc)) one per tile; tile (tr, tc) in elements (a last tile may be partial)."""
    q: torch.Tensor
    scale_inv: torch.Tensor
    tile: tuple

    def t(self):
        return Fp8Tensor(self.q.t(), self.scale_inv.t(), self.tile[::-1])

    def dequantize(self):
        """The values a matmul reads: q * scale_inv."""
        return self.q * spread(self.scale_inv, self.q.shape, self.tile)


def spread(scale_inv, shape, tile):
    """Per-tile scale_inv over a (R, C) tensor of tiles `tile`: (R, C), or (1, C) / (R, 1) / (1, 1) where one
    tile spans a dim."""
    s = scale_inv
    for dim, (n, t) in enumerate(zip(shape, tile)):
        if s.shape[dim] not in (1, n):
            s = s.repeat_interleave(t, dim=dim).narrow(dim, 0, n)
    return s


def quantize(t, fmt, tile):
    """t (R, C) -> Fp8Tensor with one scale per tile (tr, tc) of `tile` (ALL: the whole dimension)."""
    dtype, fmax = FORMATS[fmt]
    R, C = t.shape
    tr, tc = tile[0] or R, tile[1] or C
    pr, pc = -R % tr, -C % tc
    tp = F.pad(t, (0, pc, 0, pr)) if pr or pc else t  # zeros raise no amax
    tiles = tp.view(tp.shape[0] // tr, tr, tp.shape[1] // tc, tc)
    # max |t| per tile in one kernel (exact: the max of bf16 values is one of them, and fp32 holds it)
    amax = torch.linalg.vector_norm(tiles, float("inf"), dim=(1, 3), keepdim=True, dtype=torch.float32)
    # fmax / max(amax, fmax * 2^-64) is fmax / amax capped at 2^64; torch.div(number, tensor) divides
    # (fmax / tensor would multiply by a rounded reciprocal)
    scale = torch.div(fmax, amax.clamp(min=fmax * 2.0 ** -64))
    # t * scale in fp32 (bf16 t promotes exactly); no clamp needed for the saturation: the amax lands on
    # at most fmax * (1 + 2^-23), which rounds to fmax, and nothing in the tile is larger
    q = (tiles * scale).to(dtype).float().view(tp.shape)
    if pr or pc:
        q = q[:R, :C].contiguous()
    return Fp8Tensor(q, torch.div(1.0, scale).view(tiles.shape[0], tiles.shape[2]), (tr, tc))


def scaled_matmul(a, b):
    """a b^T in fp32 for Fp8Tensors a (M, K) and b (N, K) whose tiles split K alike: with one K tile the
    scales factor out of the sums; with several each K chunk's partial product is scaled on its own, then
    the chunks add."""
    (M, K), N = a.q.shape, b.q.shape[0]
    if a.tile[1] != b.tile[1]:
        raise ValueError(f"scaled_matmul: K tiles of {a.tile[1]} and {b.tile[1]} elements")
    g, chunks = a.tile[1], a.scale_inv.shape[1]
    row_a = spread(a.scale_inv, (M, chunks), (a.tile[0], 1))  # (M or 1, chunks)
    row_b = spread(b.scale_inv, (N, chunks), (b.tile[0], 1))
    if chunks == 1:
        return (a.q @ b.q.t()) * row_a * row_b.t()
    qa, qb = a.q, b.q
    if chunks * g != K:
        qa, qb = F.pad(qa, (0, chunks * g - K)), F.pad(qb, (0, chunks * g - K))
    parts = torch.bmm(qa.view(M, chunks, g).transpose(0, 1), qb.view(N, chunks, g).permute(1, 2, 0))  # (chunks, M, N)
    return (parts * row_a.t()[:, :, None] * row_b.t()[:, None, :]).sum(0)


class _Fp8Linear(torch.autograd.Function):
    """x (N, Cin), w (OC, Cin), b (OC) or None, all in the compute dtype; the module docstring's matmuls."""

    @staticmethod
    def forward(ctx, x, w, b, recipe, grad_fmt):
        tiles = TILES[recipe]
        qx, qw = quantize(x, "e4m3", tiles["x"]), quantize(w, "e4m3", tiles["w"])
        y = scaled_matmul(qx, qw)
        if b is not None:
            y = y + b.float()
        ctx.save_for_backward(x, w, qx.q, qx.scale_inv, qw.q, qw.scale_inv)
        ctx.tiles = qx.tile, qw.tile
        ctx.recipe, ctx.grad_fmt, ctx.has_bias = recipe, grad_fmt, b is not None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, w, qx, sx, qw, sw = ctx.saved_tensors
        qx, qw = Fp8Tensor(qx, sx, ctx.tiles[0]), Fp8Tensor(qw, sw, ctx.tiles[1])
        tiles, gf, dt = TILES[ctx.recipe], ctx.grad_fmt, x.dtype
        with torch.autocast(dy.device.type, enabled=False):
            dy = dy.to(dt)
            # W for dX in dX's form W^T (Cin, OC): the forward's copy, transposed, where the tiles agree
            wt = qw.t() if tiles["w_dx"] == tiles["w"] else quantize(w.t(), "e4m3", tiles["w_dx"][::-1])
            dx = scaled_matmul(quantize(dy, gf, tiles["dy_dx"]), wt).to(dt)
            if tiles["dy_dw"] is None:
                dw = dy.t() @ x
            else:
                xt = qx.t() if tiles["x_dw"] == tiles["x"] else quantize(x.t(), "e4m3", tiles["x_dw"][::-1])
                dw = scaled_matmul(quantize(dy.t(), gf, tiles["dy_dw"][::-1]), xt).to(dt)
            db = dy.sum(0, dtype=torch.float32).to(dt) if ctx.has_bias else None
        return dx, dw, db, None, None


class Fp8Emulation:
    """The FP8 settings of a model (Model.fp8): recipe, gradient format, the blocks kept in the compute
    dtype at each end (--fp8-emulate-bf16-layers, as the trainer's --fp8-bf16-layers), and the compute
    dtype (torch.bfloat16 under --dtype bf16)."""

    def __init__(self, recipe, grad_fmt="e5m2", bf16_layers=0, dtype=torch.bfloat16):
        if recipe not in TILES:
            raise ValueError(f"fp8 recipe {recipe!r}: expected one of {', '.join(TILES)}")
        if grad_fmt not in FORMATS:
            raise ValueError(f"fp8 gradient format {grad_fmt!r}: expected one of {', '.join(FORMATS)}")
        self.recipe, self.grad_fmt, self.bf16_layers, self.dtype = recipe, grad_fmt, bf16_layers, dtype

    def covers(self, layer, num_layers):
        """Whether block `layer` runs its linear layers in FP8."""
        return self.bf16_layers <= layer < num_layers - self.bf16_layers

    def linear(self, x, w, b=None):
        """F.linear(x, w, b) with x (..., Cin) through the FP8 matmuls; autocast is off inside (the
        operands are cast to the compute dtype here, as autocast would)."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(self.dtype)
        with torch.autocast(x.device.type, enabled=False):
            y = _Fp8Linear.apply(x2, w.to(self.dtype), None if b is None else b.to(self.dtype),
                                 self.recipe, self.grad_fmt)
        return y.view(*shape[:-1], w.shape[0])
