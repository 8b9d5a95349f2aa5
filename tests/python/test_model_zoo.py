"""The model zoo (llmc/model_config.h MODEL_ZOO, the names --init accepts) against transformers: each
name's shape, RoPE settings and parameter count equal those of the published model's config, built
by transformers on the meta device (no weights, no network). Our count includes the vocabulary's
padding to a multiple of 128 (wte's extra rows), which the comparison adds to transformers' count.
Run: python3 -m pytest -q tests/python/test_model_zoo.py"""
import os
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LLAMA3_SCALING = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192)
# The published configs (config.json of each model on the Hugging Face hub), the fields that set the shape
PUBLISHED = {
    "gpt2": ("gpt2", dict(n_layer=12, n_embd=768, n_head=12)),
    "gpt2-medium": ("gpt2", dict(n_layer=24, n_embd=1024, n_head=16)),
    "gpt2-large": ("gpt2", dict(n_layer=36, n_embd=1280, n_head=20)),
    "gpt2-xl": ("gpt2", dict(n_layer=48, n_embd=1600, n_head=25)),
    "llama-114m": ("llama", dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, num_key_value_heads=4,
                                 intermediate_size=2048, vocab_size=50257, tie_word_embeddings=True,
                                 rope_theta=10000.0)),
    "llama3.2-1b": ("llama", dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
                                  intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
                                  rope_theta=500000.0, rope_scaling=dict(factor=32.0, **LLAMA3_SCALING))),
    "llama3.2-3b": ("llama", dict(num_hidden_layers=28, hidden_size=3072, num_attention_heads=24, num_key_value_heads=8,
                                  intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
                                  rope_theta=500000.0, rope_scaling=dict(factor=32.0, **LLAMA3_SCALING))),
    "llama3.1-8b": ("llama", dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                                  intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
                                  rope_theta=500000.0, rope_scaling=dict(factor=8.0, **LLAMA3_SCALING))),
}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    exe = str(tmp_path_factory.mktemp("zoo") / "model_zoo")
    subprocess.run(["g++", "-std=c++17", "-O1", "-I", ROOT, os.path.join(ROOT, "tests/cpu/model_zoo.cpp"), "-o", exe],
                   check=True)
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    return {line.split()[0]: line.split()[1:] for line in out.splitlines()}


def hf_model(family, fields):
    if family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=50257, n_positions=1024, **fields)
        cls = transformers.GPT2LMHeadModel
    else:
        cfg = transformers.LlamaConfig(rms_norm_eps=1e-5, **fields)
        cls = transformers.LlamaForCausalLM
    with torch.device("meta"):
        model = cls(cfg)
    return cfg, sum(p.numel() for p in model.parameters())  # tied weights are counted once


def test_every_name_is_published(zoo):
    assert sorted(zoo) == sorted(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shape_and_params(zoo, name):
    family, fields = PUBLISHED[name]
    arch, L, C, NH, NKV, F, V, tied, theta, eps, params, rf, rlow, rhigh, rorig = zoo[name]
    cfg, hf_params = hf_model(family, fields)
    assert arch == family
    if family == "gpt2":
        shape = (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head, 4 * cfg.n_embd, cfg.vocab_size, 1)
    else:
        shape = (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                 cfg.intermediate_size, cfg.vocab_size, int(cfg.tie_word_embeddings))
        assert float(theta) == fields["rope_theta"]
        assert float(eps) == cfg.rms_norm_eps
        scaling = fields.get("rope_scaling") or dict(factor=0, low_freq_factor=0, high_freq_factor=0,
                                                    original_max_position_embeddings=0)
        assert (float(rf), float(rlow), float(rhigh), int(rorig)) == (
            scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"],
            scaling["original_max_position_embeddings"])
    assert tuple(int(x) for x in (L, C, NH, NKV, F, V, tied)) == shape
    V, C = int(V), int(C)
    padding = ((V + 127) // 128 * 128 - V) * C * (1 if int(tied) else 2)
    assert int(params) == hf_params + padding
