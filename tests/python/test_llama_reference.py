"""Checks of the Llama-style side of scripts/train_gpt2.py and of the version-2 model format:
- with the same weights, our PyTorch model gives the logits of transformers' LlamaForCausalLM, built
  from a local LlamaConfig with random weights (no hub): this pins RMSNorm, the RoPE convention
  (rotate_half, theta, positions), SwiGLU's [gate | up] order, GQA's head grouping and the tied or
  untied head. Skipped without transformers;
- model files: a plain GPT-2 is written as version 1 (the committed GPT-2 fixtures are such files,
  byte-identical to what earlier builds wrote), anything else as version 2, and both read back;
- the committed Llama fixtures are what `make fixture` writes (their settings are in FIXTURES).
- the knobs are independent: on combinations no fixture has, the C++ CPU model (build/test_gpt2_cpu,
  skipped if not built) matches a reference state written here.
Run: python3 -m pytest -q tests/python/test_llama_reference.py  (a few seconds)"""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import llmc_formats as fmt  # noqa: E402
import train_gpt2  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "fixture")


def hf_llama(L, C, NH, NKV, H, V, maxT, theta, eps, tied, seed, rope_scaling=None):
    """A LlamaForCausalLM with every tensor random (the init leaves the norms at 1, which would hide a
    norm weight mapped to the wrong place); rope_scaling: config.json's, e.g. Llama 3.x's llama3."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    hc = transformers.LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=H, num_hidden_layers=L,
                                  num_attention_heads=NH, num_key_value_heads=NKV, max_position_embeddings=maxT,
                                  rms_norm_eps=eps, rope_theta=theta, tie_word_embeddings=bool(tied),
                                  attention_bias=False, mlp_bias=False, hidden_act="silu",
                                  rope_scaling=dict(rope_scaling) if rope_scaling else None)
    hf = transformers.LlamaForCausalLM(hc).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_((1.0 if name.endswith("norm.weight") else 0.0) + 0.2 * torch.randn(p.shape))
    return hf.double()


@pytest.mark.parametrize("L,C,NH,NKV,H,V,theta,eps,tied", [
    (2, 32, 4, 4, 48, 100, 10000.0, 1e-5, 1),    # multi-head, tied head
    (2, 48, 6, 2, 72, 130, 500000.0, 1e-6, 0),   # grouped-query, untied head, Llama 3's theta and eps
], ids=["mha_tied", "gqa_untied"])
def test_our_llama_gives_transformers_logits(L, C, NH, NKV, H, V, theta, eps, tied):
    maxT, T = 32, 20
    hf = hf_llama(L, C, NH, NKV, H, V, maxT, theta, eps, tied, seed=5)
    ours = train_gpt2.from_hf(hf).double()
    cfg = ours.cfg
    assert (cfg["architecture"], cfg["norm"], cfg["position"], cfg["mlp"], cfg["biases"]) == \
        (fmt.ARCH_LLAMA, fmt.NORM_RMSNORM, fmt.POS_ROPE, fmt.MLP_SWIGLU, 0)
    assert (cfg["tied_head"], cfg["num_kv_heads"], cfg["mlp_hidden"], cfg["rope_theta"], cfg["norm_eps"]) == \
        (tied, NKV, H, theta, eps)
    idx = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(idx).logits
        got = ours(idx)[0][..., :V]
    # transformers computes the rotation angles from fp32 inverse frequencies; ours are float64, so
    # the two differ by ~1e-7 relative in the angle, far below a wrong convention (order 1)
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() < 1e-6 * scale
    assert torch.all(ours(idx)[0][..., V:] == 0)  # the padded head rows are zero


def test_model_file_versions(tmp_path):
    cfg, flat = fmt.read_model(os.path.join(FIXTURE, "model.bin"))
    assert fmt.read_header(os.path.join(FIXTURE, "model.bin"), fmt.MAGIC_MODEL)[0][1] == 1
    assert cfg == fmt.full_config(cfg) and fmt.model_version(cfg) == 1
    fmt.write_model(tmp_path / "gpt2.bin", cfg, flat)
    assert (tmp_path / "gpt2.bin").read_bytes() == open(os.path.join(FIXTURE, "model.bin"), "rb").read()
    llama = train_gpt2.make_config("test", 2, 32, 4, 100, 16, 2, 3, "llama", tied=0, rope_theta=123456.0,
                                   norm_eps=3e-6, mlp_hidden=40)
    assert fmt.model_version(llama) == 2
    params = np.random.default_rng(0).normal(size=fmt.num_params(llama)).astype(np.float32)
    fmt.write_model(tmp_path / "llama.bin", llama, params)
    h, _ = fmt.read_header(tmp_path / "llama.bin", fmt.MAGIC_MODEL)
    assert h[1] == 2 and h[12] == fmt.ARCH_LLAMA and h[18] == 40 and h[20] == 0
    cfg2, flat2 = fmt.read_model(tmp_path / "llama.bin")
    assert cfg2 == llama and np.array_equal(flat2, params)
    shapes = dict(zip(fmt.PARAM_NAMES, fmt.param_shapes(llama)))
    assert shapes["wpe"][0] == 0 and shapes["qkvb"][1] == 0 and shapes["ln1b"][1] == 0
    assert shapes["fcw"] == (2, 80, 32) and shapes["fcprojw"] == (2, 32, 40) and shapes["lm_head"] == (128, 32)
    # a GPT-2 with one knob changed (an untied head) needs version 2 too
    assert fmt.model_version(dict(cfg, tied_head=0)) == 2


@pytest.mark.parametrize("prefix", ["llama_", "llama_gqa_", "llama_window_"])
def test_llama_fixture_configs(prefix):
    settings = dict(train_gpt2.FIXTURES)[prefix]
    cfg, _ = fmt.read_model(os.path.join(FIXTURE, prefix + "model.bin"))
    d = fmt.read_debug_state(os.path.join(FIXTURE, prefix + "debug.bin"))
    assert d["config"] == cfg and cfg["architecture"] == fmt.ARCH_LLAMA
    assert (cfg["channels"], cfg["num_heads"], cfg["window"], cfg["mlp_hidden"]) == \
        (settings["channels"], settings["heads"], settings["window"], settings["mlp_hidden"])
    assert cfg["tied_head"] == settings.get("tied", 1)


@pytest.mark.parametrize("flags", [
    ["--arch", "llama", "--bias", "1", "--kv-heads", "2"],  # Qwen2-like: a Llama with biases
    ["--arch", "gpt2", "--norm", "rmsnorm", "--norm-eps", "1e-6", "--position", "rope", "--tied", "0",
     "--mlp-hidden", "40"],                                  # a GPT-2 with three Llama knobs
    ["--arch", "llama", "--norm", "layernorm", "--mlp", "gelu", "--window", "5"],  # Llama with GPT-2's norm and MLP
], ids=["llama_biases", "gpt2_rmsnorm_rope_untied", "llama_layernorm_gelu_window"])
def test_cpu_model_on_mixed_knobs(tmp_path, flags):
    """The knobs are independent: the C++ CPU model (build/test_gpt2_cpu) matches the reference for
    combinations no committed fixture has, with random biases and norm weights."""
    binary = os.path.join(ROOT, "build", "test_gpt2_cpu")
    if not os.path.exists(binary):
        pytest.skip("build/test_gpt2_cpu is not built (make)")
    model_path, debug_path = str(tmp_path / "m.bin"), str(tmp_path / "d.bin")
    args = train_gpt2.parse_args(["--layers", "2", "--channels", "24", "--heads", "4", "--vocab", "100",
                                  "--max-seq", "16", "--write-model", model_path, "--write-debug", debug_path,
                                  "--batch", "2", "--seq", "12", "--steps", "4", "--lr", "1e-2", *flags])
    model = train_gpt2.build_model(args)
    model.randomize_biases_and_norms(args.seed)
    train_gpt2.write_outputs(model, args)
    cfg, _ = fmt.read_model(model_path)
    assert fmt.model_version(cfg) == 2
    import subprocess
    p = subprocess.run([binary, model_path, debug_path], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stdout[-3000:]
    assert "FAIL" not in p.stdout
