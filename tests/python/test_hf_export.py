"""Round trips through transformers itself (skipped without torch and transformers):
- our random models exported with scripts/export_hf.py load with AutoModelForCausalLM.from_pretrained
  as the class the export names, and give the logits of scripts/train_gpt2.py's reference model on
  the same weights: GPT-2 tied and untied, Llama multi-head tied and grouped-query untied (theta
  500000, eps 1e-6), Llama with Llama 3.x's llama3 RoPE scaling (read back by transformers as such),
  Llama with a window (MistralForCausalLM's sliding_window), Llama with q/k/v biases only
  (Qwen2ForCausalLM), and a bf16 export;
- random LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM / GPT2LMHeadModel saved with
  save_pretrained to a temp folder import with scripts/import_hf.py's path (numpy, no torch) and our
  reference model on the imported weights gives transformers' logits (a Qwen2 with q/k/v biases only).
The Qwen2 round trip through the C++ trainer is tests/python/test_qwen2_roundtrip.py.
The tolerance of the Llama family is 1e-5: transformers computes the RoPE angles in fp32 (ours in
fp64; llmc/cpu/rope.h), everything else runs in float64.
Run: python3 -m pytest -q tests/python/test_hf_export.py  (about 10 s on 2 CPU cores)"""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import hf_interop  # noqa: E402
import llmc_formats as fmt  # noqa: E402
import train_gpt2  # noqa: E402
from test_hf_interop import CLASSES, CONFIGS, random_model  # noqa: E402  (the same configs, numpy-built)


def our_logits(cfg, flat, idx):
    model = train_gpt2.GPT2(cfg).double()
    model.load_flat(torch.from_numpy(np.asarray(flat, dtype=np.float64)))
    with torch.no_grad():
        return model(idx)[0][..., :cfg["vocab_size"]]


def tolerance(cfg):
    return 1e-10 if cfg["position"] == fmt.POS_LEARNED else 1e-5


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_exported_model_gives_our_logits(tmp_path, name):
    cfg, flat = random_model(name, seed=7)
    flat *= 0.2  # (weights of a trained model's size: logits of a few units)
    fmt.split_params(cfg, flat)["ln1w"][...] += 1.0
    hf_interop.export_hf_dir(tmp_path, cfg, flat)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager")
    assert type(hf).__name__ == CLASSES[name]
    if cfg["rope_scaling"] == fmt.ROPE_SCALING_LLAMA3:  # transformers reads our rope_scaling as llama3
        rp = hf.config.rope_parameters
        assert (rp["rope_type"], rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"],
                rp["original_max_position_embeddings"], rp["rope_theta"]) == \
            ("llama3", cfg["rope_factor"], cfg["rope_low_freq_factor"], cfg["rope_high_freq_factor"],
             cfg["rope_original_max_pos"], cfg["rope_theta"])
    hf = hf.double().eval()
    idx = torch.randint(0, cfg["vocab_size"], (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = hf(idx).logits
    tol = tolerance(cfg)
    torch.testing.assert_close(got, our_logits(cfg, flat, idx), rtol=tol, atol=tol)


def test_bf16_export_loads_as_bf16_values(tmp_path):
    cfg, flat = random_model("llama_gqa_untied", seed=8)
    flat *= 0.2
    hf_interop.export_hf_dir(tmp_path, cfg, flat, "bfloat16")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert hf.dtype == torch.bfloat16
    rounded = fmt.bf16_bits_to_fp32(fmt.fp32_to_bf16_bits(flat))
    idx = torch.randint(0, cfg["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = hf.double().eval()(idx).logits
    torch.testing.assert_close(got, our_logits(cfg, rounded, idx), rtol=1e-5, atol=1e-5)


def random_hf(kind, tied):
    """A transformers model of `kind` with every tensor random (the init would leave norms at 1 and
    biases at 0, hiding a norm or bias mapped to the wrong place)."""
    shape = dict(vocab_size=150, hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=6,
                 num_key_value_heads=2, max_position_embeddings=40, tie_word_embeddings=tied)
    if kind == "llama":
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape, rope_theta=500000.0, rms_norm_eps=1e-6))
    elif kind == "mistral":
        hf = transformers.MistralForCausalLM(transformers.MistralConfig(**shape, sliding_window=5))
    elif kind == "qwen2":
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shape))
    else:
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=150, n_embd=48, n_layer=2, n_head=3,
                                                                  n_positions=40, tie_word_embeddings=tied))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in hf.named_parameters():
            one = n.endswith(("norm.weight", "ln_1.weight", "ln_2.weight", "ln_f.weight"))
            p.copy_((1.0 if one else 0.0) + 0.1 * torch.randn(p.shape, generator=g))
    return hf.eval()


@pytest.mark.parametrize("kind, tied", [("llama", False), ("llama", True), ("mistral", False), ("qwen2", True),
                                        ("gpt2", True), ("gpt2", False)])
def test_saved_transformers_model_imports_with_its_logits(tmp_path, kind, tied):
    hf = random_hf(kind, tied)
    hf.save_pretrained(str(tmp_path))
    cfg, flat = hf_interop.import_hf_dir(tmp_path)  # numpy only, from the files
    assert cfg["tied_head"] == int(tied) and cfg["vocab_size"] == 150
    if kind == "mistral":
        assert cfg["window"] == 5
    assert (cfg["qkv_bias"], cfg["biases"]) == ((1, 0) if kind == "qwen2" else (0, 0) if kind != "gpt2" else (1, 1))
    idx = torch.randint(0, 150, (2, 17), generator=torch.Generator().manual_seed(2))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager").double().eval()
    with torch.no_grad():
        want = hf(idx).logits
    tol = tolerance(cfg)
    torch.testing.assert_close(our_logits(cfg, flat, idx), want, rtol=tol, atol=tol)
