"""Checks of the FP8 emulation of scripts/train_gpt2.py --fp8-emulate (scripts/fp8_emulate.py), on the CPU:
- the casts: a tensor whose amax maps to 448 keeps its max exactly, the values are torch's own float8
  cast of x * scale (nearest, ties to even) with scale = 448 / amax rounded once in fp32 (llmc/fp8.cuh's
  recipe), one scale per tensor / row / column / 128x128 block as the tile says, partial tiles included;
- the matmuls: scales applied after the sums (and per 128-long K chunk for blockwise) equal the matmul
  of the dequantized operands; each recipe's backward is the composition its table in fp8_emulate.py
  describes (dY e5m2, W and x re-cast along the other dim where the recipe says so);
- train mode: 3 steps of each recipe on a tiny model in fp32 give finite losses near the unquantized
  run's, the learning-rate schedule is llmc/schedule.h's, and misused flags are refused.
Skipped without torch. Run: python3 -m pytest -q tests/python/test_fp8_emulate.py  (a few seconds)"""
import math
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this torch has no float8 dtypes", allow_module_level=True)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import fp8_emulate as fe  # noqa: E402
import llmc_formats as fmt  # noqa: E402
import train_gpt2  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matmuls: on a busy 2-core machine torch's thread pool makes each one ~30 ms instead of ~0.1."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def reference_scale(amax, fmax):
    """llmc/cpu/fp8.h's fp8_scale_from_amax (margin 0), in numpy float32."""
    return np.minimum(np.float32(fmax) / np.float32(amax), np.float32(2.0 ** 64))


def test_recipe_names_agree():
    assert set(train_gpt2.FP8_RECIPES) == {"none"} | set(fe.TILES)


def test_tensorwise_max_maps_to_448_exactly():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 96, generator=g)
    x[3, 5] = -448.0 * 2.0 ** -5  # 14, the amax: a power of 2 times 448, so scale and scale_inv are exact
    q, s = fe.quantize(x, "e4m3", (None, None))[:2]
    assert s.shape == (1, 1) and s.item() == 2.0 ** -5
    assert q[3, 5].item() == -448.0 and q.abs().max().item() == 448.0
    assert fe.quantize(x, "e4m3", (None, None)).dequantize()[3, 5].item() == x[3, 5].item()
    # any amax: the largest element lands on 448 (x * scale rounds to at most 448 * (1 + 2^-23))
    y = torch.randn(50, 70, generator=g) * 3.7
    q, s = fe.quantize(y, "e4m3", (None, None))[:2]
    assert q.abs().max().item() == 448.0
    assert s.item() == np.float32(1.0) / reference_scale(y.abs().max().item(), 448.0)


@pytest.mark.parametrize("fmt,dtype,fmax", [("e4m3", E4M3, 448.0), ("e5m2", E5M2, 57344.0)])
def test_values_are_torchs_float8_cast(fmt, dtype, fmax):
    g = torch.Generator().manual_seed(2)
    # a wide range of magnitudes, so subnormals and values that round to 0 are in it
    x = torch.randn(128, 80, generator=g) * torch.exp(torch.randn(128, 80, generator=g) * 4)
    q, s = fe.quantize(x, fmt, (None, None))[:2]
    scale = reference_scale(x.abs().max().item(), fmax)
    assert s.item() == np.float32(1.0) / scale
    expect = (x * torch.tensor(scale)).to(dtype).float()  # torch's cast: nearest, ties to even
    assert torch.equal(q, expect)
    assert torch.equal(q, q.to(dtype).float())  # on the grid
    # ties to even: halfway between 1 and 1.125 (e4m3) goes to 1, between 1.125 and 1.25 to 1.25
    if fmt == "e4m3":
        t = torch.tensor([[448.0, 1.0625, 1.1875, -1.0625]])
        assert fe.quantize(t, fmt, (None, None))[0].tolist() == [[448.0, 1.0, 1.25, -1.0]]


def test_bf16_input_is_cast_as_its_fp32_values():
    """The trainer's operands are bf16: the amax, the product with the fp32 scale and the cast see exactly
    the bf16 values (no rounding of x * scale to bf16 on the way)."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(96, 64, generator=g) * 5).to(torch.bfloat16)
    for tile in ((None, None), (1, None), (1, 32)):
        a, b = fe.quantize(x, "e5m2", tile), fe.quantize(x.float(), "e5m2", tile)
        assert torch.equal(a.q, b.q) and torch.equal(a.scale_inv, b.scale_inv) and a.q.dtype == torch.float32


def test_rowwise_scales_are_per_row():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 64, generator=g) * torch.logspace(-3, 3, 40)[:, None]
    x[7] = 0.0  # an all-zero row stays zero
    q, s = fe.quantize(x, "e4m3", (1, None))[:2]
    assert s.shape == (40, 1)
    for r in range(40):
        if r == 7:
            assert not q[r].any()
            continue
        scale = reference_scale(x[r].abs().max().item(), 448.0)
        assert s[r, 0].item() == np.float32(1.0) / scale
        assert torch.equal(q[r], (x[r] * torch.tensor(scale)).to(E4M3).float())
        assert q[r].abs().max().item() == 448.0
    # per column: the transpose's rows
    qc, sc = fe.quantize(x, "e4m3", (None, 1))[:2]
    qt, st = fe.quantize(x.t(), "e4m3", (1, None))[:2]
    assert sc.shape == (1, 64) and torch.equal(qc, qt.t()) and torch.equal(sc, st.t())


def test_blockwise_tiles_with_partial_edges():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(200, 300, generator=g) * torch.logspace(-2, 2, 300)  # 2 x 3 tiles of 128x128, partial
    q, s = fe.quantize(x, "e4m3", (128, 128))[:2]
    assert s.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            tile = x[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)]
            scale = reference_scale(tile.abs().max().item(), 448.0)
            assert s[i, j].item() == np.float32(1.0) / scale
            assert torch.equal(q[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)],
                               (tile * torch.tensor(scale)).to(E4M3).float())
    q1, s1 = fe.quantize(x, "e4m3", (1, 128))[:2]  # 1x128: per row and 128-column chunk
    assert s1.shape == (200, 3) and q1[:, 256:].abs().amax(dim=1).eq(448.0).all()


@pytest.mark.parametrize("ta,tb", [((None, None), (None, None)), ((1, None), (1, None)), ((1, 128), (128, 128))],
                         ids=["tensorwise", "rowwise", "blockwise"])
def test_scaled_matmul_is_the_matmul_of_dequantized_operands(ta, tb):
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(70, 300, generator=g), torch.randn(50, 300, generator=g) * 0.02
    qa, qb = fe.quantize(a, "e4m3", ta), fe.quantize(b, "e4m3", tb)
    got = fe.scaled_matmul(qa, qb).double()
    want = qa.dequantize().double() @ qb.dequantize().double().t()
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


@pytest.mark.parametrize("recipe", sorted(fe.TILES))
def test_linear_forward_and_backward_follow_the_recipe(recipe):
    g = torch.Generator().manual_seed(6)
    N, K, O = 160, 200, 136  # not multiples of 128
    x, w, b = torch.randn(N, K, generator=g), torch.randn(O, K, generator=g) * 0.05, torch.randn(O, generator=g)
    dy = torch.randn(N, O, generator=g) * 1e-3
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    y = fe.Fp8Emulation(recipe, dtype=torch.float32).linear(xr, wr, br)
    y.backward(dy)
    t = fe.TILES[recipe]

    def dq(v, f, tile):
        return fe.quantize(v, f, tile).dequantize().double()

    def close(got, want, rtol=1e-5):
        assert (got.double() - want).abs().max().item() <= rtol * want.abs().max().item()

    close(y, dq(x, "e4m3", t["x"]) @ dq(w, "e4m3", t["w"]).t() + b.double())
    close(xr.grad, dq(dy, "e5m2", t["dy_dx"]) @ dq(w, "e4m3", t["w_dx"]))
    if t["dy_dw"] is None:
        close(wr.grad, dy.double().t() @ x.double())
    else:
        close(wr.grad, dq(dy, "e5m2", t["dy_dw"]).t() @ dq(x, "e4m3", t["x_dw"]))
    close(br.grad, dy.double().sum(0))
    # and FP8 is near the exact product (the forward's e4m3 error is a few percent at most)
    exact = x.double() @ w.double().t() + b.double()
    assert (y.double() - exact).norm() / exact.norm() < 0.05


def train_losses(capsys, tmp_path, *flags):
    """3 steps of a 2-layer model (C = 64) on random tokens in fp32; the printed train and val losses."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 3000), ("val", 600)):
        fmt.write_shard(str(tmp_path / f"t_{split}.bin"), rng.integers(0, 250, n), 250)
    train_gpt2.main(["--layers", "2", "--channels", "64", "--heads", "4", "--train", str(tmp_path / "t_train.bin"),
                     "--val", str(tmp_path / "t_val.bin"), "--val-every", "3", "--val-batches", "2", "--steps", "3",
                     "--batch", "2", "--seq", "32", "--lr", "1e-3", "--schedule", "cosine", "--warmup", "1", *flags])
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    return [float(ln[3]) for ln in lines if ln[2] == "train_loss"], [float(ln[3]) for ln in lines if ln[2] == "val_loss"]


def test_three_steps_of_each_recipe(capsys, tmp_path):
    base_train, base_val = train_losses(capsys, tmp_path)
    assert len(base_train) == 3 and len(base_val) == 2
    runs = [["--fp8-emulate", r] for r in sorted(fe.TILES)]
    runs[0] += ["--fp8-emulate-grad", "e4m3", "--shuffle", "1"]  # blockwise, and the other flags' paths
    for flags in runs:
        tr, va = train_losses(capsys, tmp_path, *flags)
        assert len(tr) == 3 and len(va) == 2 and all(math.isfinite(v) for v in tr + va), (flags, tr, va)
        # the first step's loss is the forward at the same init: FP8 moves it by much less than 1%
        assert abs(tr[0] - base_train[0]) < 0.01 * base_train[0], (flags, tr[0], base_train[0])
        assert tr[1:] != base_train[1:], flags  # and the FP8 gradients change the steps after it
    # both blocks of the 2 kept in the compute dtype: the unquantized run, exactly
    assert train_losses(capsys, tmp_path, "--fp8-emulate", "tensorwise", "--fp8-emulate-bf16-layers", "1") == \
        (base_train, base_val)


def test_fp8_layers_are_the_middle_blocks():
    e = fe.Fp8Emulation("tensorwise", bf16_layers=2)
    assert [e.covers(l, 12) for l in range(12)] == [False] * 2 + [True] * 8 + [False] * 2


def test_lr_schedule_is_llmc_schedule_h():
    args = train_gpt2.parse_args(["--train", "x", "--steps", "2000", "--lr", "3e-4", "--schedule", "cosine",
                                  "--warmup", "100"])
    assert train_gpt2.lr_at_step(args, 0) == pytest.approx(3e-6)
    assert train_gpt2.lr_at_step(args, 99) == pytest.approx(3e-4)
    assert train_gpt2.lr_at_step(args, 100) == pytest.approx(3e-4)
    assert train_gpt2.lr_at_step(args, 1050) == pytest.approx(1.5e-4)
    assert train_gpt2.lr_at_step(args, 1999) == pytest.approx(3e-4 * 0.5 * (1 + math.cos(math.pi * 1899 / 1900)))
    args = train_gpt2.parse_args(["--train", "x", "--steps", "10"])
    assert all(train_gpt2.lr_at_step(args, s) == args.lr for s in range(10))  # the default: constant


@pytest.mark.parametrize("argv,msg", [
    (["--model", "d2", "--write-model", "m.bin", "--fp8-emulate", "tensorwise"], "--fp8-emulate: only in train mode"),
    (["--train", "x", "--fp8-emulate-grad", "e4m3"], "--fp8-emulate-grad: only with --fp8-emulate"),
    (["--train", "x", "--fp8-emulate", "rowwise", "--fp8-emulate-bf16-layers", "-1"], "must be >= 0"),
    (["--train", "x", "--fp8-emulate", "perchannel"], "invalid choice"),
    (["--train", "x", "--final-lr-frac", "2"], "--final-lr-frac must be in [0, 1]"),
])
def test_bad_flags_are_refused(capsys, argv, msg):
    with pytest.raises(SystemExit):
        train_gpt2.parse_args(argv)
    assert msg in capsys.readouterr().err
