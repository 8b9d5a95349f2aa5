"""Checks of the Hugging Face conversion without torch or transformers (scripts/hf_interop.py,
scripts/export_hf.py, scripts/import_hf.py); they run in `make test` on any machine with numpy:
- export then import gives back every parameter bit for bit (GPT-2 tied and untied, Llama MHA/GQA,
  tied and untied, a window (Mistral), q/k/v biases only (Qwen2), Llama 3.x's llama3 RoPE scaling
  (its four parameters come back exactly); fp32 and bf16; a single file and a sharded folder with
  model.safetensors.index.json); a Llama with all four biases and zero attproj/fc/fcproj ones (an old
  file's Qwen2) exports as Qwen2 and imports back with its q/k/v biases only;
- model files: a Qwen2 is a version-4 file (qkv_bias in slot 26, its debug state's slot 29), an old
  file's biases = 1 means all four, a qkv_bias other than 0 or 1 is refused naming the file and field;
- the exported tensors sit where transformers expects them, checked here against the layout of
  docs/design.md directly (q/k/v rows of qkvw, [gate | up] of fcw, GPT-2's transposed Conv1D), and
  the file reads with the `safetensors` package too (skipped without it);
- configs our model cannot compute exactly are refused, one error line naming the key or tensor
  (partial_rotary_factor other than 1 wherever config.json puts it, whatever the rope_type);
  a safetensors file cut short is called truncated (with both sizes), apart from offsets that
  disagree with a shape;
- export_hf.py verifies a checkpoint's DONE manifest (a damaged one is refused, naming the file) and
  takes a run's folder of checkpoints as generate's --model does (the newest that verifies).
The transformers round trips (logits of the exported model = ours) are in tests/python/test_hf_export.py.
Run: python3 -m pytest -q tests/python/test_hf_interop.py  (a few seconds)"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import hf_interop  # noqa: E402
import llmc_formats as fmt  # noqa: E402
import train_gpt2  # noqa: E402  (make_config only: no torch needed)

CONFIGS = {  # name: (make_config arguments, knobs)
    "gpt2_tied": (dict(L=2, C=48, NH=3, V=300, maxT=40), {}),
    "gpt2_untied": (dict(L=2, C=48, NH=3, V=300, maxT=40), dict(tied=0)),
    "llama_mha_tied": (dict(L=2, C=32, NH=4, V=200, maxT=32, arch="llama"), dict(mlp_hidden=48)),
    "llama_gqa_untied": (dict(L=2, C=48, NH=6, NKV=2, V=130, maxT=32, arch="llama"),
                         dict(mlp_hidden=40, tied=0, rope_theta=500000.0, norm_eps=1e-6)),
    "mistral_window": (dict(L=1, C=36, NH=6, NKV=3, W=5, V=100, maxT=32, arch="llama"), dict(mlp_hidden=40)),
    "qwen2": (dict(L=2, C=32, NH=4, NKV=2, V=100, maxT=32, arch="llama"), dict(qkv_bias=1, tied=0)),
    # head dim 16, theta 10000, original context 32: the pair frequencies fall in all three bands of the
    # llama3 scaling (kept, blended, divided by 8), so 13 tokens already see the scaled angles
    "llama3_scaled": (dict(L=2, C=64, NH=4, NKV=2, V=100, maxT=256, arch="llama",
                           rope_llama3=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                            original_max_position_embeddings=32)), dict(mlp_hidden=96)),
}
CLASSES = {"gpt2_tied": "GPT2LMHeadModel", "gpt2_untied": "GPT2LMHeadModel", "llama_mha_tied": "LlamaForCausalLM",
           "llama_gqa_untied": "LlamaForCausalLM", "mistral_window": "MistralForCausalLM",
           "qwen2": "Qwen2ForCausalLM", "llama3_scaled": "LlamaForCausalLM"}


def make_config(what, shape, knobs):
    """train_gpt2.make_config's config in full, its qkv_bias from knobs where they give one."""
    cfg = fmt.full_config(train_gpt2.make_config(what, **shape, **knobs))
    return dict(cfg, qkv_bias=knobs.get("qkv_bias", cfg["qkv_bias"]))


def random_model(name, seed=0):
    """(cfg, flat fp32 params): every value random, except the padded vocabulary rows (an import
    cannot carry them), which are zero."""
    cfg = make_config(name, *CONFIGS[name])
    flat = np.random.default_rng(seed).standard_normal(fmt.num_params(cfg)).astype(np.float32)
    P = fmt.split_params(cfg, flat)
    P["wte"][cfg["vocab_size"]:] = 0
    P["lm_head"][cfg["vocab_size"]:] = 0
    return cfg, flat


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_then_import_is_exact(tmp_path, name, dtype):
    cfg, flat = random_model(name)
    if dtype == "bfloat16":  # exactly representable values, so the round trip stays exact
        flat = fmt.bf16_bits_to_fp32(fmt.fp32_to_bf16_bits(flat))
    hc, mt = hf_interop.export_hf_dir(tmp_path / "hf", cfg, flat, dtype)
    assert hc["architectures"] == [CLASSES[name]]
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "generation_config.json", "model.safetensors"]
    cfg2, flat2 = hf_interop.import_hf_dir(tmp_path / "hf")
    assert cfg2 == fmt.full_config(cfg)
    assert np.array_equal(flat2, flat)
    st = os.path.getsize(tmp_path / "hf" / "model.safetensors")
    hidden = (fmt.num_params(cfg) - (cfg["padded_vocab_size"] - cfg["vocab_size"]) * cfg["channels"]
              * (2 - cfg["tied_head"]))
    assert hidden * (4 if dtype == "float32" else 2) < st < hidden * (4 if dtype == "float32" else 2) + 20000


def test_sharded_folder_imports_like_one_file(tmp_path):
    cfg, flat = random_model("llama_gqa_untied", seed=3)
    params = fmt.split_params(cfg, flat)
    tensors = hf_interop.hf_tensors_from_params(cfg, params)
    hc, _ = hf_interop.hf_config_from(cfg, params, "test")
    d = tmp_path / "sharded"
    d.mkdir()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, part in halves.items():
        hf_interop.write_safetensors(d / fname, {n: tensors[n] for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: f for f, part in halves.items() for n in part}}))
    (d / "config.json").write_text(json.dumps(hc))
    cfg2, flat2 = hf_interop.import_hf_dir(d)
    assert cfg2 == fmt.full_config(cfg) and np.array_equal(flat2, flat)


def test_llama_tensors_where_transformers_expects_them():
    cfg, flat = random_model("llama_gqa_untied", seed=1)
    P = fmt.split_params(cfg, flat)
    t = hf_interop.hf_tensors_from_params(cfg, P)
    C, HD, NKV, H, V = 48, 8, 2, 40, 130
    for l in range(2):
        pre = f"model.layers.{l}."
        q, k, v = (t[pre + f"self_attn.{n}_proj.weight"] for n in "qkv")
        assert q.shape == (C, C) and k.shape == v.shape == (NKV * HD, C)
        assert np.array_equal(q, P["qkvw"][l][:C]) and np.array_equal(k, P["qkvw"][l][C:C + NKV * HD])
        assert np.array_equal(v, P["qkvw"][l][C + NKV * HD:])
        assert np.array_equal(t[pre + "mlp.gate_proj.weight"], P["fcw"][l][:H])
        assert np.array_equal(t[pre + "mlp.up_proj.weight"], P["fcw"][l][H:])
        assert np.array_equal(t[pre + "mlp.down_proj.weight"], P["fcprojw"][l])
        assert np.array_equal(t[pre + "self_attn.o_proj.weight"], P["attprojw"][l])
        assert np.array_equal(t[pre + "input_layernorm.weight"], P["ln1w"][l])
        assert np.array_equal(t[pre + "post_attention_layernorm.weight"], P["ln2w"][l])
    assert t["model.embed_tokens.weight"].shape == (V, C) and t["lm_head.weight"].shape == (V, C)
    assert np.array_equal(t["lm_head.weight"], P["lm_head"][:V])
    assert np.array_equal(t["model.norm.weight"], P["lnfw"])
    assert len(t) == 3 + 2 * 9


def test_gpt2_tensors_where_transformers_expects_them():
    cfg, flat = random_model("gpt2_tied", seed=2)
    P = fmt.split_params(cfg, flat)
    t = hf_interop.hf_tensors_from_params(cfg, P)
    assert np.array_equal(t["transformer.h.1.attn.c_attn.weight"], P["qkvw"][1].T)  # Conv1D: (in, out)
    assert t["transformer.h.1.mlp.c_fc.weight"].shape == (48, 192)
    assert np.array_equal(t["transformer.h.0.mlp.c_proj.bias"], P["fcprojb"][0])
    assert np.array_equal(t["transformer.wpe.weight"], P["wpe"])
    assert t["transformer.wte.weight"].shape == (300, 48) and "lm_head.weight" not in t  # tied: not saved


def test_safetensors_package_reads_our_file(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    cfg, flat = random_model("llama_mha_tied")
    hf_interop.export_hf_dir(tmp_path, cfg, flat)
    got = st.load_file(str(tmp_path / "model.safetensors"))
    want = hf_interop.hf_tensors_from_params(cfg, fmt.split_params(cfg, flat))
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == np.float32 and np.array_equal(got[k], want[k]), k


def test_gpt2_hub_names_without_prefix(tmp_path):
    """The hub's gpt2 model.safetensors holds GPT2Model names (h.0..., wte.weight) and mask buffers."""
    cfg, flat = random_model("gpt2_tied", seed=4)
    P = fmt.split_params(cfg, flat)
    hc, _ = hf_interop.hf_config_from(cfg, P, "test")
    t = {k[len("transformer."):]: v for k, v in hf_interop.hf_tensors_from_params(cfg, P).items()}
    t["h.0.attn.bias"] = np.ones((1, 1, 40, 40), np.float32)
    hf_interop.write_safetensors(tmp_path / "model.safetensors", t)
    (tmp_path / "config.json").write_text(json.dumps(hc))
    assert np.array_equal(hf_interop.import_hf_dir(tmp_path)[1], flat)


# ---------------------------------------------------------------- refusals
def llama_hc(**changes):
    hc = dict(model_type="llama", vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5,
              rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=True)
    hc.update(changes)
    return hc


LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=16)


@pytest.mark.parametrize("hc, message", [
    (llama_hc(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
     "rope_scaling rope_type 'llama3' needs 'low_freq_factor', which is missing"),
    (llama_hc(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}),
     "rope_parameters rope_type 'yarn' is not supported (only the default RoPE and llama3)"),
    (llama_hc(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_scaling rope_type 'dynamic' is not supported"),
    (llama_hc(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling rope_type 'linear' is not supported"),
    (llama_hc(rope_scaling=dict(LLAMA3, factor=0.5)), "rope_scaling factor = 0.5 must be in [1, 1e6]"),
    (llama_hc(rope_scaling=dict(LLAMA3, high_freq_factor=1.0)),
     "rope_scaling high_freq_factor = 1.0 must be greater than low_freq_factor 1"),
    (llama_hc(rope_scaling=dict(LLAMA3, original_max_position_embeddings=8.5)),
     "rope_scaling original_max_position_embeddings = 8.5 must be a whole number"),
    (llama_hc(rope_parameters=dict(LLAMA3, rope_theta=5e5, beta_fast=32)),
     "rope_parameters key 'beta_fast' is not part of the llama3 scaling"),
    (llama_hc(rope_parameters=dict(LLAMA3, rope_theta=5e5, partial_rotary_factor=0.5)),
     "rope_parameters partial_rotary_factor = 0.5 is not supported"),
    (llama_hc(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
     "rope_parameters partial_rotary_factor = 0.5 is not supported"),
    (llama_hc(model_type="qwen2", partial_rotary_factor=0.5), "config partial_rotary_factor = 0.5 is not supported"),
    (llama_hc(rope_scaling=LLAMA3, partial_rotary_factor=0.25), "config partial_rotary_factor = 0.25 is not supported"),
    (llama_hc(attention_bias=True), "attention_bias = true is not supported"),
    (llama_hc(mlp_bias=True), "mlp_bias = true is not supported"),
    (llama_hc(hidden_act="gelu"), "hidden_act = 'gelu' is not supported (only silu"),
    (llama_hc(head_dim=16), "head_dim = 16 != hidden_size / num_attention_heads = 8"),
    (llama_hc(num_key_value_heads=3), "the key/value heads the heads"),
    (llama_hc(model_type="qwen2", use_sliding_window=True), "use_sliding_window / layer_types"),
    (llama_hc(model_type="phi3"), "model_type 'phi3' is not supported (gpt2, llama, mistral, qwen2)"),
    ({"model_type": "llama", "vocab_size": 10}, "no 'hidden_size', a key this model_type needs"),
    (dict(model_type="gpt2", vocab_size=50, n_embd=32, n_head=2, n_layer=1, n_positions=16, activation_function="relu"),
     "activation_function = 'relu' is not supported"),
    (dict(model_type="gpt2", vocab_size=50, n_embd=32, n_head=2, n_layer=1, n_positions=16, layer_norm_epsilon=1e-6),
     "layer_norm_epsilon = 1e-06 is not supported"),
], ids=["llama3_missing_key", "rope_parameters_yarn", "dynamic", "linear_old_spelling", "llama3_factor",
        "llama3_high_low", "llama3_original", "llama3_extra_key", "llama3_partial", "default_partial",
        "top_level_partial", "llama3_top_level_partial", "attention_bias", "mlp_bias", "hidden_act", "head_dim",
        "kv_heads",
        "qwen2_sliding", "model_type", "missing_key", "gpt2_activation", "gpt2_eps"])
def test_import_refuses_config(hc, message):
    with pytest.raises(hf_interop.HFError) as e:
        hf_interop.config_from_hf(hc, "x/config.json")
    assert str(e.value).startswith("x/config.json: ") and message in str(e.value), str(e.value)


def test_partial_rotary_factor_one_is_plain_rope():
    plain = hf_interop.config_from_hf(llama_hc(), "x/config.json")
    for hc in (llama_hc(partial_rotary_factor=1.0),
               llama_hc(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1})):
        assert hf_interop.config_from_hf(hc, "x/config.json") == plain


@pytest.mark.parametrize("change, message", [
    (dict(drop="model.norm.weight"), "tensor model.norm.weight is missing"),
    (dict(add="model.layers.0.self_attn.q_proj.bias"), "tensors this mapping does not place, e.g. "
                                                      "model.layers.0.self_attn.q_proj.bias"),
    (dict(reshape="model.layers.0.mlp.up_proj.weight"), "tensor model.layers.0.mlp.up_proj.weight has shape (48, 16)"),
])
def test_import_refuses_tensors(tmp_path, change, message):
    cfg, flat = random_model("llama_mha_tied")
    P = fmt.split_params(cfg, flat)
    t = hf_interop.hf_tensors_from_params(cfg, P)
    t.pop(change.get("drop"), None)
    if "add" in change:
        t[change["add"]] = np.zeros(32, np.float32)
    if "reshape" in change:
        t[change["reshape"]] = t[change["reshape"]][:, :16]
    with pytest.raises(hf_interop.HFError) as e:
        hf_interop.params_from_hf_tensors(cfg, t, "dir")
    assert message in str(e.value), str(e.value)


@pytest.mark.parametrize("shape, knobs, message", [
    (dict(L=1, C=32, NH=4, NKV=2, V=50, maxT=16), {}, "num_kv_heads 2 != num_heads 4: transformers' GPT-2 has no "
                                                     "grouped-query attention"),
    (dict(L=1, C=32, NH=4, W=4, V=50, maxT=16), {}, "attention window 4: transformers' GPT-2 has no sliding window"),
    (dict(L=1, C=32, NH=4, V=50, maxT=16), dict(norm="rmsnorm"), "a GELU model with norm = 1 is neither GPT-2"),
    (dict(L=1, C=32, NH=4, V=50, maxT=16, arch="llama"), dict(position="learned"),
     "a SwiGLU model with position = 0 is not a Llama"),
    (dict(L=1, C=32, NH=4, V=50, maxT=16), dict(qkv_bias=0), "a GELU model with qkv_bias = 0 is neither GPT-2"),
    (dict(L=1, C=32, NH=4, V=50, maxT=16, arch="llama"), dict(bias=1), "biases = 1 with nonzero attprojb"),
    (dict(L=1, C=32, NH=4, V=50, maxT=16, arch="llama"), dict(bias=1, qkv_bias=0), "biases = 1 with nonzero attprojb"),
    (dict(L=1, C=32, NH=4, W=3, V=50, maxT=16, arch="llama"), dict(qkv_bias=1),
     "q/k/v biases (Qwen2) with an attention window"),
])
def test_export_refuses_what_transformers_cannot_compute(tmp_path, shape, knobs, message):
    cfg = make_config("test", shape, knobs)
    flat = np.random.default_rng(0).standard_normal(fmt.num_params(cfg)).astype(np.float32)
    with pytest.raises(hf_interop.HFError) as e:
        hf_interop.export_hf_dir(tmp_path / "out", cfg, flat, what="m.bin")
    assert str(e.value).startswith("m.bin: ") and message in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists(), "nothing is written for a refused model"


# ---------------------------------------------------------------- the scripts
def run(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_scripts_round_trip(tmp_path):
    cfg, flat = random_model("llama_gqa_untied", seed=5)
    flat = fmt.bf16_bits_to_fp32(fmt.fp32_to_bf16_bits(flat))
    fmt.write_model(tmp_path / "m.bin", cfg, flat, fmt.DTYPE_BF16)
    p = run("export_hf.py", tmp_path / "m.bin", "--out-dir", tmp_path / "hf", "--eos-id", 7)
    assert p.returncode == 0 and "LlamaForCausalLM (llama), bfloat16" in p.stdout, p.stderr
    hc = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hc["torch_dtype"] == "bfloat16" and hc["eos_token_id"] == 7 and hc["bos_token_id"] is None
    p = run("import_hf.py", tmp_path / "hf", "--out", tmp_path / "back.bin", "--dtype", "bf16")
    assert p.returncode == 0, p.stderr
    assert open(tmp_path / "back.bin", "rb").read() == open(tmp_path / "m.bin", "rb").read()


@pytest.mark.parametrize("script, args, message", [
    ("import_hf.py", ["{t}/nothing", "--out", "{t}/m.bin"], "{t}/nothing: not a directory"),
    ("import_hf.py", ["{t}", "--out", "{t}/m.bin"], "{t}: no config.json"),
    ("import_hf.py", ["{t}/torchbin", "--out", "{t}/m.bin"], "no model.safetensors or model.safetensors.index.json "
                                                              "(found pytorch_model.bin"),
    ("export_hf.py", ["{t}/torchbin/config.json", "--out-dir", "{t}/o"], "too short to hold the 1024-byte header"),
    ("export_hf.py", ["{t}/torchbin", "--out-dir", "{t}/o"], "{t}/torchbin: no model.bin and no complete checkpoint"),
    ("export_hf.py", ["{t}/gqa.bin", "--out-dir", "{t}/o"], "transformers' GPT-2 has no grouped-query attention"),
    ("export_hf.py", ["{t}/gqa.bin", "--out-dir", "{t}/o", "--eos-id", "50"], "--eos-id 50: not a token id"),
])
def test_scripts_errors_are_one_line(tmp_path, script, args, message):
    (tmp_path / "torchbin").mkdir()
    (tmp_path / "torchbin" / "config.json").write_text(json.dumps(llama_hc()))
    (tmp_path / "torchbin" / "pytorch_model.bin").write_bytes(b"\0" * 64)
    cfg = train_gpt2.make_config("test", 1, 32, 4, 50, 16, NKV=2)
    fmt.write_model(tmp_path / "gqa.bin", cfg, np.zeros(fmt.num_params(cfg), np.float32))
    p = run(script, *[a.format(t=tmp_path) for a in args])
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert message.format(t=tmp_path) in lines[0], lines[0]


def test_export_verifies_the_checkpoint(tmp_path):
    """A checkpoint directory is exported only if its DONE manifest verifies (as generate's --model and
    --resume); a training run's folder of checkpoints exports its newest one that verifies, saying
    which, and naming each newer damaged one it skips."""
    cfg = train_gpt2.make_config("test", 1, 32, 4, 50, 16)
    n = fmt.num_params(cfg)
    run_dir, flats = tmp_path / "run", {}
    for step in (4, 8):
        flats[step] = np.random.default_rng(step).standard_normal(n).astype(np.float32)
        fmt.split_params(cfg, flats[step])["wte"][cfg["vocab_size"]:] = 0  # (padded rows: not exported)
        fmt.write_checkpoint(run_dir, step, cfg, flats[step], np.zeros(n, np.float32), np.zeros(n, np.float32))
    (run_dir / "step_00000012.tmp").mkdir()  # an interrupted save: not a checkpoint
    p = run("export_hf.py", run_dir, "--out-dir", tmp_path / "hf")
    assert p.returncode == 0 and f"using {run_dir}/step_00000008, the newest complete checkpoint" in p.stdout, p.stderr
    assert np.array_equal(hf_interop.import_hf_dir(tmp_path / "hf")[1], flats[8])
    with open(run_dir / "step_00000008" / "model.bin", "r+b") as f:  # 4 bytes of the weights
        f.seek(2000)
        f.write(b"\1\2\3\4")
    p = run("export_hf.py", run_dir / "step_00000008", "--out-dir", tmp_path / "bad")
    assert p.returncode == 1 and p.stderr == (f"error: {run_dir}/step_00000008: damaged checkpoint: model.bin does not "
                                              "match the checksum in DONE\n"), p.stderr
    p = run("export_hf.py", run_dir / "step_00000008" / "model.bin", "--out-dir", tmp_path / "bad")
    assert p.returncode == 1 and p.stderr == (f"error: {run_dir}/step_00000008/model.bin: damaged checkpoint "
                                              f"{run_dir}/step_00000008: model.bin does not match the checksum in "
                                              "DONE\n"), p.stderr
    assert not (tmp_path / "bad").exists()
    p = run("export_hf.py", run_dir, "--out-dir", tmp_path / "older")
    assert p.returncode == 0, p.stderr
    assert f"checkpoint: {run_dir}/step_00000008 is damaged (model.bin does not match" in p.stdout
    assert f"using {run_dir}/step_00000004, the newest complete checkpoint" in p.stdout
    assert np.array_equal(hf_interop.import_hf_dir(tmp_path / "older")[1], flats[4])
    with open(run_dir / "step_00000004" / "state.bin", "ab") as f:  # the state counts too, as in the C++ tools,
        f.write(b"\0")                                               # except for a model.bin named directly
    p = run("export_hf.py", run_dir / "step_00000004" / "model.bin", "--out-dir", tmp_path / "model_only")
    assert p.returncode == 0, p.stderr
    p = run("export_hf.py", run_dir, "--out-dir", tmp_path / "none")
    assert p.returncode == 1 and p.stderr.endswith(f"error: {run_dir}: all 2 checkpoints in it are damaged "
                                                   "(see above)\n"), p.stderr
    assert "state.bin has " in p.stdout and not (tmp_path / "none").exists()
    (run_dir / "step_00000016").mkdir()  # a step directory without DONE (an interrupted save of earlier builds)
    fmt.write_model(run_dir / "step_00000016" / "model.bin", cfg, flats[4])
    p = run("export_hf.py", run_dir / "step_00000016", "--out-dir", tmp_path / "none")
    assert p.returncode == 1 and "step_00000016: no DONE (an interrupted save" in p.stderr, p.stderr


def test_truncated_or_inconsistent_safetensors(tmp_path):
    """A file cut short is called truncated, with its size and the size its header describes; offsets
    that disagree with the shape are a different message."""
    cfg, flat = random_model("gpt2_tied")
    hf_interop.export_hf_dir(tmp_path, cfg, flat)
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(hf_interop.HFError) as e:
        hf_interop.read_safetensors(path)
    assert str(e.value).startswith(f"{path}: truncated: {len(data) // 2} bytes, its header describes {len(data)} "
                                   "(tensor "), str(e.value)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [header[name]["shape"][0] + 1] + header[name]["shape"][1:]
    h = json.dumps(header).encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h + data[8 + n:])
    with pytest.raises(hf_interop.HFError) as e:
        hf_interop.read_safetensors(path)
    start, end = header[name]["data_offsets"]
    assert f"tensor {name}: data_offsets {start}..{end} hold {end - start} bytes, but shape {header[name]['shape']} " \
           "of F32 needs" in str(e.value) and ": truncated" not in str(e.value), str(e.value)


def test_import_accepts_llama3_in_both_spellings():
    """Llama 3.1 / 3.2's config.json (rope_theta beside rope_scaling) and transformers 5's save
    (rope_parameters holding theta too) give the same config: the four parameters, theta, version 3."""
    hub = llama_hc(rope_theta=500000.0, rope_scaling=dict(LLAMA3, original_max_position_embeddings=8))
    v5 = llama_hc(rope_parameters=dict(LLAMA3, original_max_position_embeddings=8, rope_theta=500000.0))
    v5.pop("rope_theta")
    a, b = (hf_interop.config_from_hf(hc, "x/config.json") for hc in (hub, v5))
    assert a == b
    assert (a["rope_theta"], a["rope_scaling"], a["rope_factor"], a["rope_low_freq_factor"], a["rope_high_freq_factor"],
            a["rope_original_max_pos"]) == (500000.0, fmt.ROPE_SCALING_LLAMA3, 8.0, 1.0, 4.0, 8)
    assert fmt.model_version(a) == 3 and fmt.model_version(dict(a, **fmt.no_rope_scaling())) == 2
    plain = hf_interop.config_from_hf(llama_hc(rope_scaling={"rope_type": "default"}), "x/config.json")
    assert plain["rope_scaling"] == fmt.ROPE_SCALING_NONE and plain["rope_factor"] == 0.0


def test_llama3_model_file_slots(tmp_path):
    """A model with RoPE scaling is a version-3 file with the scaling in slots 21..25 (float64 bit
    patterns for the factors), and reads back; its debug state carries them in slots 24..28."""
    cfg, flat = random_model("llama3_scaled")
    fmt.write_model(tmp_path / "m.bin", cfg, flat)
    h, _ = fmt.read_header(tmp_path / "m.bin", fmt.MAGIC_MODEL)
    assert h[1] == 3 and h[21] == fmt.ROPE_SCALING_LLAMA3 and h[25] == 32
    assert [float(np.int64(x).view(np.float64)) for x in h[22:25]] == [8.0, 1.0, 4.0]
    assert not h[26:].any()
    cfg2, flat2 = fmt.read_model(tmp_path / "m.bin")
    assert cfg2 == fmt.full_config(cfg) and np.array_equal(flat2, flat)
    B, T, V = 1, 4, cfg["vocab_size"]
    fmt.write_debug_state(tmp_path / "d.bin", cfg, np.zeros((B, T)), np.zeros((B, T)), np.zeros((B, T, V)), 0.0,
                          np.zeros(flat.size), [], dict(lr=0, beta1=0, beta2=0, eps=0, weight_decay=0, grad_clip=0))
    d = fmt.read_debug_state(tmp_path / "d.bin")
    hd, _ = fmt.read_header(tmp_path / "d.bin", fmt.MAGIC_DEBUG)
    assert hd[1] == 3 and list(hd[24:29]) == list(h[21:26]) and d["config"] == cfg2
    # without the scaling the same model is a version-2 file, slots 21.. zero
    fmt.write_model(tmp_path / "plain.bin", dict(cfg, **fmt.no_rope_scaling()), flat)
    h2, _ = fmt.read_header(tmp_path / "plain.bin", fmt.MAGIC_MODEL)
    assert h2[1] == 2 and not h2[21:].any()


def test_qwen2_model_file_slots(tmp_path):
    """A Qwen2 (q/k/v biases only) is a version-4 file, biases 0 in slot 19 and qkv_bias 1 in slot 26 (its
    debug state's slot 29), with or without RoPE scaling, and reads back; a version-2 file's biases = 1
    means all four projections; a qkv_bias other than 0 or 1 is refused, naming the file and the field."""
    cfg, flat = random_model("qwen2")
    shapes = dict(zip(fmt.PARAM_NAMES, fmt.param_shapes(cfg)))
    assert shapes["qkvb"] == (2, 64) and shapes["attprojb"] == shapes["fcprojb"] == (2, 0) and shapes["fcb"] == (2, 0)
    fmt.write_model(tmp_path / "m.bin", cfg, flat)
    h, _ = fmt.read_header(tmp_path / "m.bin", fmt.MAGIC_MODEL)
    assert h[1] == 4 and h[19] == 0 and h[26] == 1 and not h[21:26].any() and not h[27:].any()
    cfg2, flat2 = fmt.read_model(tmp_path / "m.bin")
    assert cfg2 == cfg and np.array_equal(flat2, flat)
    B, T, V = 1, 4, cfg["vocab_size"]
    fmt.write_debug_state(tmp_path / "d.bin", cfg, np.zeros((B, T)), np.zeros((B, T)), np.zeros((B, T, V)), 0.0,
                          np.zeros(flat.size), [], dict(lr=0, beta1=0, beta2=0, eps=0, weight_decay=0, grad_clip=0))
    hd, _ = fmt.read_header(tmp_path / "d.bin", fmt.MAGIC_DEBUG)
    assert hd[1] == 4 and hd[29] == 1 and fmt.read_debug_state(tmp_path / "d.bin")["config"] == cfg
    scaled = dict(random_model("llama3_scaled")[0], qkv_bias=1)
    fmt.write_model(tmp_path / "s.bin", scaled, np.ones(fmt.num_params(scaled), np.float32))
    assert fmt.read_header(tmp_path / "s.bin", fmt.MAGIC_MODEL)[0][1] == 4
    assert fmt.read_model(tmp_path / "s.bin")[0] == scaled
    bad = bytearray((tmp_path / "m.bin").read_bytes())
    bad[26 * 8] = 2
    (tmp_path / "bad.bin").write_bytes(bytes(bad))
    with pytest.raises(fmt.FormatError) as e:
        fmt.read_model(tmp_path / "bad.bin")
    assert str(e.value) == f"{tmp_path}/bad.bin: header field qkv_bias = 2 is out of range [0, 1]"
    old = make_config("old", CONFIGS["qwen2"][0], dict(bias=1))  # a Llama with biases: version 2, all four
    fmt.write_model(tmp_path / "old.bin", old, np.ones(fmt.num_params(old), np.float32))
    h, _ = fmt.read_header(tmp_path / "old.bin", fmt.MAGIC_MODEL)
    assert h[1] == 2 and h[19] == 1 and not h[21:].any()
    cfg3, _ = fmt.read_model(tmp_path / "old.bin")
    shapes = dict(zip(fmt.PARAM_NAMES, fmt.param_shapes(cfg3)))
    assert (cfg3["qkv_bias"], cfg3["biases"]) == (1, 1) and shapes["qkvb"] == (2, 64) and shapes["fcb"] == (2, 256)


def test_llama_with_all_four_biases_exports_as_qwen2(tmp_path):
    """An old file's Qwen2 (biases = 1: all four projections, attproj/fc/fcproj zero) exports as Qwen2
    without those three and imports back as a Qwen2 of q/k/v biases only, every tensor unchanged."""
    cfg = make_config("old", CONFIGS["qwen2"][0], dict(bias=1, tied=0))
    flat = np.random.default_rng(4).standard_normal(fmt.num_params(cfg)).astype(np.float32)
    P = fmt.split_params(cfg, flat)
    P["wte"][cfg["vocab_size"]:] = P["lm_head"][cfg["vocab_size"]:] = 0
    for b in hf_interop.LLAMA_ABSENT_BIASES:
        P[b][...] = 0
    hc, mt = hf_interop.export_hf_dir(tmp_path, cfg, flat)
    assert mt == "qwen2" and hc["architectures"] == ["Qwen2ForCausalLM"]
    names = hf_interop.read_safetensors(tmp_path / "model.safetensors")
    assert sorted({n.split(".", 3)[3] for n in names if n.endswith(".bias")}) == \
        ["self_attn.k_proj.bias", "self_attn.q_proj.bias", "self_attn.v_proj.bias"]
    cfg2, flat2 = hf_interop.import_hf_dir(tmp_path)
    assert cfg2 == dict(cfg, biases=0) and fmt.model_version(cfg2) == 4
    P2 = fmt.split_params(cfg2, flat2)
    for name in fmt.PARAM_NAMES:
        assert np.array_equal(P2[name], P[name]) or (name in hf_interop.LLAMA_ABSENT_BIASES and P2[name].size == 0)


def test_llama_3_2_1b_config_imports():
    """A config.json shaped as Llama-3.2-1B's on the hub (transformers 4.45 era) converts: tied head,
    head_dim 64, 8 key/value heads, theta 500000, the llama3 scaling of factor 32."""
    hc = dict(architectures=["LlamaForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=128000,
              eos_token_id=128001, head_dim=64, hidden_act="silu", hidden_size=2048, initializer_range=0.02,
              intermediate_size=8192, max_position_embeddings=131072, mlp_bias=False, model_type="llama",
              num_attention_heads=32, num_hidden_layers=16, num_key_value_heads=8, pretraining_tp=1,
              rms_norm_eps=1e-05, rope_scaling=dict(factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
                                                    original_max_position_embeddings=8192, rope_type="llama3"),
              rope_theta=500000.0, tie_word_embeddings=True, torch_dtype="bfloat16", use_cache=True, vocab_size=128256)
    cfg = hf_interop.config_from_hf(hc, "Llama-3.2-1B/config.json")
    assert (cfg["num_layers"], cfg["channels"], cfg["num_heads"], cfg["num_kv_heads"], cfg["mlp_hidden"],
            cfg["tied_head"], cfg["max_seq_len"], cfg["padded_vocab_size"]) == (16, 2048, 32, 8, 8192, 1, 131072, 128256)
    assert (cfg["rope_scaling"], cfg["rope_factor"], cfg["rope_original_max_pos"]) == (fmt.ROPE_SCALING_LLAMA3, 32.0, 8192)
    assert fmt.num_params(cfg) == 1235814400  # Llama 3.2 1B's 1.24B parameters
