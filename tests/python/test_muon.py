"""Muon against torch.optim.Muon itself:
- scripts/train_gpt2.py's newton_schulz is torch's _zeropower_via_newtonschulz without the cast to
  bf16: on a bf16 input the two are bitwise equal;
- torch.optim.Muon's step, with that iteration in float64, is the order of operations llmc/cpu/muon.h
  writes down (lerp momentum, Nesterov lerp, Newton-Schulz, decoupled decay with the unadjusted lr,
  the adjusted lr), to float64 rounding;
- the CPU step (tests/cpu/test_muon.cpp, llmc/cpu/muon.h, fp32) matches torch.optim.Muon on a fixture
  written here: float64 parameters with the iteration in float64, so the reference carries no error of
  its own at the fp32 tolerance (in bf16, as torch runs it, the update is only good to ~2e-2);
- the reference trainer's --optimizer muon (Muon on row-block views of each layer's slice of the stacked
  block matrices: Q, K, V apart, SwiGLU's gate and up apart; AdamW on the rest) is bitwise
  torch.optim.Muon on separate parameters, one per layer's matrix cut here from the forward's layout,
  plus torch.optim.AdamW, and trains from the command line.
The C++ test is build/test_muon_cpu when make built it after its sources changed, else compiled here
into the test's tmp dir. Run: python3 -m pytest -q tests/python/test_muon.py"""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.optim, "Muon"):
    pytest.skip("torch.optim.Muon needs PyTorch 2.9 or later", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import llmc_formats as fmt  # noqa: E402
import train_gpt2  # noqa: E402

SOURCE = ROOT / "tests/cpu/test_muon.cpp"
BUILT = ROOT / "build/test_muon_cpu"
MAGIC_MUON = fmt.fourcc("GPTO")
COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's default ns_coefficients
NS_CASES = [(8, 8, 5), (6, 16, 5), (24, 8, 5), (64, 192, 5), (37, 53, 5), (53, 37, 3), (9, 4, 0), (5, 7, 5)]  # the last: zeros
# rows, cols, adjust_lr_fn, nesterov, momentum, grad_scale (clip_grad_norm_'s factor, applied to each
# step's gradient before torch's step); every case: 3 steps, lr 0.02, weight decay 0.1
MUON_CASES = [(r, c, adjust, True, 0.95, 1.0) for r, c in ((8, 8), (6, 16), (24, 8), (64, 192), (37, 53))
              for adjust in ("original", "match_rms_adamw")] + \
             [(24, 8, "original", False, 0.95, 1.0), (6, 16, "match_rms_adamw", True, 0.3, 1.0),
              (37, 53, "original", True, 0.95, 0.37)]


def f32(x):
    """x rounded to fp32, as a Python float: the value the C++ side reads."""
    return float(np.float32(x))


def torch_muon_steps(w0, grads, lr, momentum, weight_decay, ns_steps, adjust, nesterov):
    """torch.optim.Muon on one float64 parameter, the iteration in float64; (w, buf) after each step."""
    p = torch.nn.Parameter(w0.clone())
    opt = torch.optim.Muon([p], lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                           ns_steps=ns_steps, adjust_lr_fn=adjust)
    out = []
    with train_gpt2.newton_schulz_in_param_dtype():
        for g in grads:
            p.grad = g.clone()
            opt.step()
            out.append((p.detach().clone(), opt.state[p]["momentum_buffer"].clone()))
    return out


def test_newton_schulz_is_torchs_without_the_bf16_cast():
    gen = torch.Generator().manual_seed(1)
    for rows, cols in ((8, 8), (6, 16), (24, 8)):
        g = torch.randn(rows, cols, dtype=torch.float64, generator=gen)
        torchs = torch.optim._muon._zeropower_via_newtonschulz(g, COEFFICIENTS, 5, 1e-7)
        ours = train_gpt2.newton_schulz(g.to(torch.bfloat16), COEFFICIENTS, 5, 1e-7)
        assert torchs.dtype == ours.dtype == torch.bfloat16
        assert torch.equal(torchs, ours), f"{rows}x{cols}"
    # and the substitution reaches torch.optim.Muon's step: float64 there, bf16 outside
    g = torch.randn(8, 12, dtype=torch.float64, generator=gen)
    with train_gpt2.newton_schulz_in_param_dtype():
        assert torch.optim._muon._zeropower_via_newtonschulz(g, COEFFICIENTS, 5, 1e-7).dtype == torch.float64
    assert torch.optim._muon._zeropower_via_newtonschulz(g, COEFFICIENTS, 5, 1e-7).dtype == torch.bfloat16


@pytest.mark.parametrize("adjust,nesterov,momentum", [("original", True, 0.95), ("match_rms_adamw", True, 0.95),
                                                      ("original", False, 0.9)])
@pytest.mark.parametrize("rows,cols", [(6, 16), (24, 8)])
def test_torch_muon_is_the_order_of_operations_in_muon_h(rows, cols, adjust, nesterov, momentum):
    gen = torch.Generator().manual_seed(2)
    w0 = 0.02 * torch.randn(rows, cols, dtype=torch.float64, generator=gen)
    grads = [torch.randn(rows, cols, dtype=torch.float64, generator=gen) for _ in range(3)]
    lr, wd = 0.02, 0.1
    got = torch_muon_steps(w0, grads, lr, momentum, wd, 5, adjust, nesterov)
    ratio = max(1, rows / cols) ** 0.5 if adjust == "original" else 0.2 * max(rows, cols) ** 0.5
    w, buf = w0.clone(), torch.zeros_like(w0)
    for g, (w_torch, buf_torch) in zip(grads, got):
        buf = momentum * buf + (1 - momentum) * g
        u = (1 - momentum) * g + momentum * buf if nesterov else buf
        w = w * (1 - lr * wd) - lr * ratio * train_gpt2.newton_schulz(u, COEFFICIENTS, 5, 1e-7)
        assert (buf - buf_torch).abs().max() < 1e-14
        assert (w - w_torch).abs().max() < 1e-14


def write_fixture(path):
    """The file test_muon_cpu reads (docs/formats.md's header convention, magic GPTO):
    h[2] newton_schulz cases, h[3] muon cases; then per newton_schulz case int64 rows, cols, ns_steps,
    float32 eps, G (rows, cols) and the float64 result as float32; per muon case int64 rows, cols,
    steps, ns_steps, adjust_lr (0 original, 1 match_rms_adamw), nesterov, float32 lr, momentum,
    weight_decay, eps, grad_scale, the initial w, then per step the gradient (before grad_scale), w and
    the momentum buffer after it."""
    gen = torch.Generator().manual_seed(46)

    def fp32_randn(rows, cols, scale=1.0):  # fp32 values, held in float64
        return (scale * torch.randn(rows, cols, dtype=torch.float64, generator=gen)).float().double()

    eps = f32(1e-7)
    chunks = [fmt.make_header(MAGIC_MUON, {2: len(NS_CASES), 3: len(MUON_CASES)})]
    for i, (rows, cols, steps) in enumerate(NS_CASES):
        g = fp32_randn(rows, cols) if i < len(NS_CASES) - 1 else torch.zeros(rows, cols, dtype=torch.float64)
        out = train_gpt2.newton_schulz(g, COEFFICIENTS, steps, eps)
        chunks += [np.array([rows, cols, steps], dtype="<i8"), np.array([eps], dtype="<f4"),
                   g.numpy().astype("<f4"), out.numpy().astype("<f4")]
    for rows, cols, adjust, nesterov, momentum, scale in MUON_CASES:
        lr, wd, momentum, scale, steps = f32(0.02), f32(0.1), f32(momentum), f32(scale), 3
        w0 = fp32_randn(rows, cols, 0.02)
        grads = [fp32_randn(rows, cols, 10.0 ** (t - 1)) for t in range(steps)]  # scales 0.1, 1, 10
        got = torch_muon_steps(w0, [g * scale for g in grads], lr, momentum, wd, 5, adjust, nesterov)
        chunks += [np.array([rows, cols, steps, 5, adjust == "match_rms_adamw", nesterov], dtype="<i8"),
                   np.array([lr, momentum, wd, eps, scale], dtype="<f4"), w0.numpy().astype("<f4")]
        for g, (w, buf) in zip(grads, got):
            chunks += [g.numpy().astype("<f4"), w.numpy().astype("<f4"), buf.numpy().astype("<f4")]
    with open(path, "wb") as f:
        for c in chunks:
            f.write(np.ascontiguousarray(c).tobytes())


def cpu_test_binary(tmp_path):
    sources = [SOURCE, ROOT / "tests/cpu/fixture_check.h", *ROOT.glob("llmc/*.h"), *ROOT.glob("llmc/cpu/*.h")]
    if BUILT.exists() and BUILT.stat().st_mtime >= max(s.stat().st_mtime for s in sources):
        return BUILT
    exe = tmp_path / "test_muon_cpu"
    p = subprocess.run([os.environ.get("CXX", "c++"), "-O2", "-march=native", "-std=c++17", "-fopenmp",
                        "-fno-math-errno", "-I", str(ROOT), str(SOURCE), "-o", str(exe), "-lm"],
                       capture_output=True, text=True)
    assert p.returncode == 0, f"compiling {SOURCE.name} failed:\n{p.stderr}"
    return exe


def test_cpu_muon_matches_torch(tmp_path):
    fixture = tmp_path / "muon.bin"
    write_fixture(fixture)
    p = subprocess.run([str(cpu_test_binary(tmp_path)), str(fixture)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")))
    print(p.stdout)
    assert p.returncode == 0 and "test_muon_cpu: PASSED" in p.stdout, p.stdout + p.stderr


def tiny_model(arch, tied):
    args = train_gpt2.parse_args(["--arch", arch, "--tied", str(tied), "--layers", "2", "--channels", "32",
                                  "--heads", "4", "--kv-heads", "2", "--write-model", "unused"])
    model = train_gpt2.GPT2(train_gpt2.shape_config(args)).double()
    model.init_weights(5)
    return model


def split_rows(model, name):
    """This test's own cut of one layer's (out, in) matrix into Muon's matrices, from the layout the forward
    computes with: qkvw = [Q (C rows); K (NKV HD); V (NKV HD)], SwiGLU's fcw = [gate (H); up (H)], the rest
    whole."""
    cfg = model.cfg
    rows = model.param(name).shape[1]
    if name == "qkvw":
        kv = cfg["num_kv_heads"] * cfg["channels"] // cfg["num_heads"]
        return [cfg["channels"], kv, kv]
    if name == "fcw" and cfg["mlp"] == fmt.MLP_SWIGLU:
        return [rows // 2, rows // 2]
    return [rows]


@pytest.mark.parametrize("ns_in_param_dtype", [False, True])
@pytest.mark.parametrize("arch,tied", [("gpt2", 1), ("llama", 0)])
def test_reference_muon_is_torch_muon_per_matrix_plus_adamw(arch, tied, ns_in_param_dtype):
    ours = tiny_model(arch, tied)
    opt = ours.optimizer(1e-3, 0.1, muon=dict(lr=0.02, momentum=0.95, weight_decay=0.05, ns_steps=5,
                                              adjust_lr_fn="match_rms_adamw", ns_in_param_dtype=ns_in_param_dtype))
    # torch's own: one Parameter per layer's Q, K, V, attention projection, fc (SwiGLU: gate, up) and fc
    # projection for Muon, the rest in AdamW's two groups
    params = {n: p.detach().clone() for n, p in ours.named_parameters()}
    L = ours.cfg["num_layers"]
    cuts = {n: split_rows(ours, n) for n in train_gpt2.MUON_MATRICES}
    assert cuts["qkvw"] == [32, 16, 16] and cuts["fcw"] == ([128, 128] if arch == "llama" else [128])
    matrices = {(n, l, k): torch.nn.Parameter(block.clone()) for n in train_gpt2.MUON_MATRICES for l in range(L)
                for k, block in enumerate(params[n][l].split(cuts[n]))}
    rest = {n: torch.nn.Parameter(p) for n, p in params.items() if n not in train_gpt2.MUON_MATRICES}
    muon = torch.optim.Muon(list(matrices.values()), lr=0.02, momentum=0.95, weight_decay=0.05, nesterov=True,
                            ns_steps=5, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW([{"params": [p for n, p in rest.items() if n in train_gpt2.DECAYED], "weight_decay": 0.1},
                               {"params": [p for n, p in rest.items() if n not in train_gpt2.DECAYED],
                                "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        for n, p in ours.named_parameters():
            p.grad = torch.randn(p.shape, dtype=torch.float64, generator=gen)
            if n in train_gpt2.MUON_MATRICES:
                for l in range(L):
                    for k, g in enumerate(p.grad[l].split(cuts[n])):
                        matrices[(n, l, k)].grad = g.clone()
            else:
                rest[n].grad = p.grad.clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in ours.parameters())  # the stacked matrices' too
        if ns_in_param_dtype:
            with train_gpt2.newton_schulz_in_param_dtype():
                muon.step()
        else:
            muon.step()
        adamw.step()
        for n, p in ours.named_parameters():
            if n in train_gpt2.MUON_MATRICES:
                expect = torch.stack([torch.cat([matrices[(n, l, k)].detach() for k in range(len(cuts[n]))])
                                      for l in range(L)])
            else:
                expect = rest[n].detach()
            assert torch.equal(p.detach(), expect), n
    # the cut matters: one step of Muon on a whole qkvw lands elsewhere
    whole = torch.nn.Parameter(params["qkvw"][0].clone())
    whole.grad = torch.randn(whole.shape, dtype=torch.float64, generator=gen)
    apart = [torch.nn.Parameter(b.clone()) for b in params["qkvw"][0].split(cuts["qkvw"])]
    for a, g in zip(apart, whole.grad.split(cuts["qkvw"])):
        a.grad = g.clone()
    for ps in ([whole], apart):
        torch.optim.Muon(ps, lr=0.02, weight_decay=0.05, adjust_lr_fn="match_rms_adamw").step()
    assert (torch.cat([a.detach() for a in apart]) - whole.detach()).abs().max() > 1e-3


def test_train_with_muon_from_the_command_line(tmp_path, capsys):
    rng = np.random.default_rng(0)
    fmt.write_shard(str(tmp_path / "shard_000.bin"), rng.integers(0, 250, 4000), 250)
    common = ["--train", str(tmp_path / "shard_*.bin"), "--steps", "3", "--batch", "2", "--seq", "16",
              "--schedule", "cosine", "--warmup", "1"]
    losses = {}
    for opt in (["--optimizer", "adamw"], ["--optimizer", "muon", "--muon-lr", "0.05", "--muon-wd", "0.1"]):
        train_gpt2.main(common + opt)
        out = capsys.readouterr().out
        losses[opt[1]] = [float(line.split()[3]) for line in out.splitlines() if "train_loss" in line]
        assert len(losses[opt[1]]) == 3 and all(np.isfinite(losses[opt[1]])), out
    assert losses["adamw"][0] == losses["muon"][0]  # the same model and batch before the first step
    assert losses["adamw"][1:] != losses["muon"][1:]
    for bad, message in ((["--optimizer", "muon", "--muon-ns-steps", "0"], "--muon-ns-steps must be in 1..99"),
                         (["--optimizer", "muon", "--muon-momentum", "1"], "--muon-momentum must be in [0, 1)"),
                         (["--optimizer", "muon", "--muon-lr", "0"], "--muon-lr must be positive"),
                         (["--muon-lr", "0.1"], "--muon-lr: only with --optimizer muon")):
        with pytest.raises(SystemExit):
            train_gpt2.parse_args(common + bad)
        assert message in capsys.readouterr().err, bad
