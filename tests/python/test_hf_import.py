"""Checks of scripts/train_gpt2.py, the PyTorch reference that the C++ tests trust:
- a transformers GPT-2 imported through our conversion gives transformers' logits, and the
  checkpoint it writes re-reads to transformers' tensors (transposed to our (out, in) layout);
  one whose lm_head is not tied to wte imports with an untied head; an unsupported config is refused;
- a debug state (GPTX) it writes agrees with an independent implementation written here from
  docs/design.md alone (explicit attention math, formula GELU, hand-written AdamW and clipping),
  both for a second tiny shape and for the committed tests/fixture.
Run: python3 -m pytest -q tests/python/test_hf_import.py  (about 10 s on 2 CPU cores)"""
import math
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference needs PyTorch; without it these tests skip

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import llmc_formats as fmt  # noqa: E402
import train_gpt2  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "fixture")
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}  # docs/design.md: embeddings and matrices
HF_TO_OURS = {  # transformers name under transformer.h.<l>. -> (ours, Conv1D weight stored (in, out))
    "ln_1.weight": ("ln1w", False), "ln_1.bias": ("ln1b", False),
    "attn.c_attn.weight": ("qkvw", True), "attn.c_attn.bias": ("qkvb", False),
    "attn.c_proj.weight": ("attprojw", True), "attn.c_proj.bias": ("attprojb", False),
    "ln_2.weight": ("ln2w", False), "ln_2.bias": ("ln2b", False),
    "mlp.c_fc.weight": ("fcw", True), "mlp.c_fc.bias": ("fcb", False),
    "mlp.c_proj.weight": ("fcprojw", True), "mlp.c_proj.bias": ("fcprojb", False),
}


# ---------------------------------------------------------------- transformers import
def hf_model_with_random_everything(L, C, NH, V, maxT, seed):
    """transformers' init leaves biases 0 and LayerNorms (1, 0), which would hide a bias or LayerNorm
    mapped to the wrong place; redraw every tensor so each one matters."""
    pytest.importorskip("transformers")
    cfg = train_gpt2.make_config("test", L, C, NH, V, maxT)
    hf = train_gpt2.hf_random_model(cfg, seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            base = 1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
    return hf


def test_hf_import_logits_match_transformers():
    L, C, NH, V, maxT = 2, 48, 3, 300, 40  # V not a multiple of 128: exercises the padded rows
    hf = hf_model_with_random_everything(L, C, NH, V, maxT, seed=5).double()
    ours = train_gpt2.from_hf(hf).double()
    assert ours.cfg["padded_vocab_size"] == 384
    idx = torch.randint(0, V, (3, 29), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(idx).logits
        logits, _ = ours(idx)
    assert logits.shape == (3, 29, 384)
    torch.testing.assert_close(logits[..., :V], expected, rtol=1e-10, atol=1e-10)
    assert torch.all(logits[..., V:] == 0), "padded wte rows must be zero"


def test_hf_import_untied_lm_head():
    """A GPT-2 whose lm_head is a separate matrix (tie_word_embeddings false) imports with an untied
    head (tied_head 0) and gives transformers' logits; the tied original imports tied."""
    L, C, NH, V, maxT = 2, 32, 2, 200, 24
    hf = hf_model_with_random_everything(L, C, NH, V, maxT, seed=3)
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(**dict(hf.config.to_dict(), tie_word_embeddings=False))
    untied = GPT2LMHeadModel(cfg).eval()
    untied.load_state_dict(hf.state_dict())
    with torch.no_grad():
        untied.lm_head.weight.copy_(0.1 * torch.randn(V, C, generator=torch.Generator().manual_seed(4)))
    assert not torch.equal(untied.lm_head.weight, untied.transformer.wte.weight)
    ours = train_gpt2.from_hf(untied, "--model untied").double()
    assert ours.cfg["tied_head"] == 0
    idx = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0][..., :V], untied.double()(idx).logits, rtol=1e-10, atol=1e-10)
    assert train_gpt2.from_hf(hf).cfg["tied_head"] == 1


def test_hf_import_refuses_unsupported_config(capsys):
    """A transformers config our model cannot compute exactly is one error line naming the key."""
    hf = hf_model_with_random_everything(1, 32, 2, 100, 16, seed=3)
    hf.config.activation_function = "relu"
    with pytest.raises(SystemExit) as e:
        train_gpt2.from_hf(hf, "--model relu")
    assert e.value.code != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --model relu: activation_function = 'relu' is not supported") and "\n" not in err, err


def test_hf_random_checkpoint_rereads_to_transformers_tensors(tmp_path):
    pytest.importorskip("transformers")
    L, C, NH, V, maxT, seed = 2, 32, 2, 200, 24, 7
    shape = ["--layers", str(L), "--channels", str(C), "--heads", str(NH), "--vocab", str(V),
             "--max-seq", str(maxT), "--seed", str(seed)]
    fp32, bf16 = str(tmp_path / "m32.bin"), str(tmp_path / "m16.bin")
    train_gpt2.main(["--model", "hf-random", *shape, "--write-model", fp32])
    train_gpt2.main(["--model", "hf-random", *shape, "--write-model", bf16, "--dtype", "bf16"])
    hf = train_gpt2.hf_random_model(train_gpt2.make_config("test", L, C, NH, V, maxT), seed)
    sd = {k: v.detach() for k, v in hf.state_dict().items()}
    cfg, flat = fmt.read_model(fp32)
    assert cfg == fmt.full_config(dict(max_seq_len=maxT, vocab_size=V, padded_vocab_size=256, num_layers=L,
                                       num_heads=NH, num_kv_heads=NH, channels=C, window=0))
    got = {k: torch.from_numpy(np.array(v)) for k, v in fmt.split_params(cfg, flat).items()}
    assert torch.equal(got["wte"][:V], sd["transformer.wte.weight"])
    assert torch.all(got["wte"][V:] == 0)
    assert torch.equal(got["wpe"], sd["transformer.wpe.weight"])
    assert torch.equal(got["lnfw"], sd["transformer.ln_f.weight"])
    assert torch.equal(got["lnfb"], sd["transformer.ln_f.bias"])
    for l in range(L):
        for hf_name, (ours, transposed) in HF_TO_OURS.items():
            w = sd[f"transformer.h.{l}.{hf_name}"]
            assert torch.equal(got[ours][l], w.t() if transposed else w), f"{ours}[{l}]"
    # bf16 checkpoint: round-to-nearest-even of the same values (torch's conversion is RNE)
    _, flat16 = fmt.read_model(bf16)
    assert torch.equal(torch.from_numpy(np.array(flat16)), torch.from_numpy(np.array(flat)).bfloat16().float())


# ---------------------------------------------------------------- independent reference
def independent_forward(P, cfg, inputs, targets):
    """GPT-2 from docs/design.md with explicit math (no SDPA, no F.layer_norm, formula GELU); query
    head h reads key/value head h // (NH/NKV), and with a window W query t sees keys t-W+1..t."""
    C, NH, NKV, W, V = cfg["channels"], cfg["num_heads"], cfg["num_kv_heads"], cfg["window"], cfg["vocab_size"]
    B, T = inputs.shape
    HD = C // NH
    kv_head = torch.arange(NH) // (NH // NKV)  # index of the key/value head of each query head

    def layernorm(x, w, b):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * w + b

    def gelu_tanh(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    def heads(t):  # (B, T, n*HD) -> (B, n, T, HD)
        return t.reshape(B, T, -1, HD).permute(0, 2, 1, 3)

    pos = torch.arange(T)
    hidden = pos[None, :] > pos[:, None]  # [query t, key s]: future keys, and keys left of the window
    if W > 0:
        hidden |= pos[None, :] <= pos[:, None] - W
    x = P["wte"][inputs] + P["wpe"][:T]
    for l in range(cfg["num_layers"]):
        h = layernorm(x, P["ln1w"][l], P["ln1b"][l])
        qkv = h @ P["qkvw"][l].T + P["qkvb"][l]
        q, k, v = heads(qkv[..., :C]), heads(qkv[..., C:C + NKV * HD]), heads(qkv[..., C + NKV * HD:])
        k, v = k[:, kv_head], v[:, kv_head]
        att = (q @ k.transpose(-1, -2) / math.sqrt(HD)).masked_fill(hidden, -math.inf).softmax(-1)
        y = (att @ v).permute(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ P["attprojw"][l].T + P["attprojb"][l]
        h = layernorm(x, P["ln2w"][l], P["ln2b"][l])
        x = x + gelu_tanh(h @ P["fcw"][l].T + P["fcb"][l]) @ P["fcprojw"][l].T + P["fcprojb"][l]
    logits = (layernorm(x, P["lnfw"], P["lnfb"]) @ P["wte"].T)[..., :V]
    loss = (torch.logsumexp(logits, -1) - logits.gather(-1, targets[..., None])[..., 0]).mean()
    return logits, loss


def check_debug_state(model_path, debug_path, num_steps=None):
    """Recomputes a debug state from its model file with independent_forward + design.md's AdamW."""
    cfg, flat = fmt.read_model(model_path)
    d = fmt.read_debug_state(debug_path)
    assert d["config"] == cfg
    hp = d["hparams"]
    V = cfg["vocab_size"]
    assert np.all(fmt.split_params(cfg, flat)["wte"][V:] == 0), "padded wte rows must be zero"
    assert np.all(fmt.split_params(cfg, d["grads"])["wte"][V:] == 0), "padded wte rows get no gradient"
    P = {k: torch.tensor(np.array(v), dtype=torch.float64, requires_grad=True)
         for k, v in fmt.split_params(cfg, flat).items() if v.size}  # (a GPT-2 has no lm_head)
    inputs, targets = (torch.from_numpy(d[k].astype(np.int64)) for k in ("inputs", "targets"))
    assert inputs.shape == (d["B"], d["T"])
    assert torch.equal(inputs[:, 1:], targets[:, :-1]), "targets are the inputs shifted by one"
    logits, loss = independent_forward(P, cfg, inputs, targets)
    np.testing.assert_allclose(d["logits"], logits.detach().numpy(), rtol=1e-6, atol=1e-7)
    assert abs(d["loss"] - loss.item()) < 1e-6
    grads = torch.autograd.grad(loss, list(P.values()))
    got = fmt.split_params(cfg, d["grads"])
    for (name, ref), g in zip(P.items(), grads):
        scale = g.abs().max().item()
        np.testing.assert_allclose(got[name], g.numpy(), rtol=1e-6, atol=1e-6 * scale + 1e-12, err_msg=name)

    # AdamW with global-norm clipping, written from docs/design.md (not torch.optim)
    m = {k: torch.zeros_like(p) for k, p in P.items()}
    v = {k: torch.zeros_like(p) for k, p in P.items()}
    losses = []
    for t in range(1, len(d["losses"]) + 1):
        _, loss = independent_forward(P, cfg, inputs, targets)
        grads = dict(zip(P, torch.autograd.grad(loss, list(P.values()))))
        losses.append(loss.item())
        norm = torch.sqrt(sum((g ** 2).sum() for g in grads.values()))
        if hp["grad_clip"] > 0 and norm > hp["grad_clip"]:
            grads = {k: g * (hp["grad_clip"] / (norm + 1e-6)) for k, g in grads.items()}
        with torch.no_grad():
            for k, p in P.items():
                if k in DECAYED:
                    p -= hp["lr"] * hp["weight_decay"] * p
                m[k] = hp["beta1"] * m[k] + (1 - hp["beta1"]) * grads[k]
                v[k] = hp["beta2"] * v[k] + (1 - hp["beta2"]) * grads[k] ** 2
                mhat, vhat = m[k] / (1 - hp["beta1"] ** t), v[k] / (1 - hp["beta2"] ** t)
                p -= hp["lr"] * mhat / (torch.sqrt(vhat) + hp["eps"])
    np.testing.assert_allclose(d["losses"], losses, rtol=2e-6)
    if num_steps is not None:
        assert len(d["losses"]) == num_steps
    return d


def test_debug_state_matches_independent_autograd(tmp_path):
    # A second shape: 3 heads of 16, V=130 (Vp=256), T=7 < maxT, an odd batch. The weight decay is
    # exaggerated so that decaying a tensor outside the design's set changes the losses visibly.
    model, debug = str(tmp_path / "m.bin"), str(tmp_path / "d.bin")
    train_gpt2.main(["--layers", "3", "--channels", "48", "--heads", "3", "--vocab", "130", "--max-seq", "24",
                     "--seed", "11", "--batch", "3", "--seq", "7", "--steps", "5", "--lr", "3e-3",
                     "--weight-decay", "20", "--write-model", model, "--write-debug", debug])
    d = check_debug_state(model, debug, num_steps=5)
    assert d["hparams"]["lr"] == pytest.approx(3e-3) and d["hparams"]["weight_decay"] == 20
    assert d["losses"][-1] < d["losses"][0] - 0.01, "the steps should move the loss"

    # the init of docs/design.md
    cfg, flat = fmt.read_model(model)
    p = fmt.split_params(cfg, flat)
    for name in ("wte", "wpe", "qkvw", "fcw", "attprojw", "fcprojw"):
        std = 0.02 / math.sqrt(2 * 3) if name in ("attprojw", "fcprojw") else 0.02
        x = p[name][:cfg["vocab_size"]] if name == "wte" else p[name]
        assert abs(x.mean()) < 0.1 * std and abs(x.std() / std - 1) < 0.05, name
    for name in ("ln1w", "ln2w", "lnfw"):
        assert np.all(p[name] == 1), name
    for name in ("ln1b", "qkvb", "attprojb", "ln2b", "fcb", "fcprojb", "lnfb"):
        assert np.all(p[name] == 0), name


def test_gqa_window_debug_state_matches_independent_autograd(tmp_path):
    # grouped-query (2 query heads per key/value head, so a tiled instead of interleaved head map
    # shows) with a window of 3 < T = 9
    model, debug = str(tmp_path / "m.bin"), str(tmp_path / "d.bin")
    train_gpt2.main(["--layers", "2", "--channels", "32", "--heads", "4", "--kv-heads", "2", "--window", "3",
                     "--vocab", "130", "--max-seq", "24", "--seed", "12", "--batch", "2", "--seq", "9",
                     "--steps", "3", "--lr", "3e-3", "--write-model", model, "--write-debug", debug])
    cfg, _ = fmt.read_model(model)
    assert (cfg["num_heads"], cfg["num_kv_heads"], cfg["window"]) == (4, 2, 3)
    check_debug_state(model, debug, num_steps=3)


@pytest.mark.parametrize("prefix, want", [("", train_gpt2.FIXTURE), ("gqa_", train_gpt2.FIXTURE_GQA)])
def test_committed_fixture(prefix, want):
    model, debug = os.path.join(FIXTURE, prefix + "model.bin"), os.path.join(FIXTURE, prefix + "debug.bin")
    assert os.path.getsize(model) < 300_000 and os.path.getsize(debug) < 300_000
    cfg, _ = fmt.read_model(model)
    assert (cfg["num_layers"], cfg["channels"], cfg["num_heads"], cfg["vocab_size"], cfg["max_seq_len"]) == \
        (want["layers"], want["channels"], want["heads"], want["vocab"], want["max_seq"])
    assert (cfg["num_kv_heads"], cfg["window"]) == (want["kv_heads"] or want["heads"], want["window"])
    d = check_debug_state(model, debug, num_steps=want["steps"])
    assert (d["B"], d["T"]) == (want["batch"], want["seq"])
    assert d["losses"][-1] < d["losses"][0] - 1.0


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("argv, message", [
    (["--channels", "30", "--heads", "4"], "--channels 30 is not a multiple of --heads 4"),
    (["--model", "x12"], "--model x12: not a model descriptor"),
    (["--load", os.path.join(FIXTURE, "debug.bin")], "this is a debug state file, not a model checkpoint"),
    (["--seq", "33"], "--seq 33 exceeds the model's max_seq_len 32"),
    (["--heads", "4", "--kv-heads", "3"], "--kv-heads 3 must divide --heads 4"),
    (["--window", "-1"], "--window -1 must be >= 0"),
    (["--model", "hf-random", "--kv-heads", "2"], "transformers' GPT-2 is multi-head with full causal attention"),
    (["--load", os.path.join(FIXTURE, "model.bin"), "--window", "4"], "--kv-heads and --window shape only a new model"),
])
def test_bad_input_is_one_line_error(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        train_gpt2.main(argv + ["--write-model", str(tmp_path / "m.bin"), "--write-debug", str(tmp_path / "d.bin")])
    assert e.value.code != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err, err
