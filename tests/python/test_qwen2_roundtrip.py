"""A Qwen2 through our trainer and back, against transformers (skipped without torch + transformers).
A tiny random Qwen2ForCausalLM (its config here, no network; every tensor random, the q/k/v biases
too) saved with save_pretrained, then:
- scripts/import_hf.py: a version-4 model file with qkv_bias 1 and biases 0, exactly Qwen2's
  tensors (plus the zero padding rows of the embedding), no attproj/fc/fcproj biases;
- build/train_gpt2_cpu --init it, 10 AdamW steps on random tokens, a checkpoint at the end: every
  q/k/v bias moved, and the file still has no other biases;
- scripts/export_hf.py of the checkpoint: transformers loads it as Qwen2ForCausalLM with the trained
  tensors, biases on q/k/v only (no o_proj or MLP biases exist), and its logits (float64) are the
  CPU model's (build/generate_cpu teacher-forced on a fixed sequence, --dump-logits, fp32) to 1e-5
  of their largest magnitude.
Needs build/train_gpt2_cpu and build/generate_cpu (make).
Run: python3 -m pytest -q tests/python/test_qwen2_roundtrip.py  (a few seconds)"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import hf_interop  # noqa: E402
import llmc_formats as fmt  # noqa: E402

TRAIN, GEN = ROOT / "build" / "train_gpt2_cpu", ROOT / "build" / "generate_cpu"
V, L = 150, 2  # 150 tokens: the embedding is padded to 256 rows


def run(*cmd):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))  # tiny model: one thread is fastest
    assert p.returncode == 0, p.stderr
    return p


def test_qwen2_imports_trains_and_exports_as_qwen2(tmp_path):
    for binary in (TRAIN, GEN):
        if not binary.exists():
            pytest.fail(f"{binary} is missing: run make first")
    hc = transformers.Qwen2Config(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=L,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                  rms_norm_eps=1e-6, tie_word_embeddings=True)
    hf = transformers.Qwen2ForCausalLM(hc)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_((1.0 if name.endswith("norm.weight") else 0.0) + 0.1 * torch.randn(p.shape, generator=g))
    hf.save_pretrained(str(tmp_path / "hf"))
    n_hf = sum(p.numel() for p in hf.parameters())

    model = tmp_path / "qwen2.bin"
    run(sys.executable, ROOT / "scripts" / "import_hf.py", tmp_path / "hf", "--out", model)
    h, _ = fmt.read_header(model, fmt.MAGIC_MODEL)
    assert (h[1], h[19], h[26]) == (4, 0, 1)  # version 4: biases 0, qkv_bias 1
    cfg, before = fmt.read_model(model)
    assert fmt.num_params(cfg) == n_hf + (cfg["padded_vocab_size"] - V) * cfg["channels"]

    shard = tmp_path / "train.bin"
    fmt.write_shard(shard, np.random.default_rng(1).integers(0, V, 4000), V)
    run(TRAIN, "--init", model, "--train", shard, "--batch", 4, "--seq", 32, "--steps", 10, "--lr", 1e-3,
        "--val-every", 0, "--out-dir", tmp_path / "run")
    trained_cfg, after = fmt.read_model(tmp_path / "run" / "step_00000010" / "model.bin")
    assert trained_cfg == cfg
    P0, P1 = fmt.split_params(cfg, before), fmt.split_params(cfg, after)
    assert all(P[b].size == 0 for P in (P0, P1) for b in ("attprojb", "fcb", "fcprojb"))
    assert np.all(P1["qkvb"] != P0["qkvb"])  # every q/k/v bias trained

    run(sys.executable, ROOT / "scripts" / "export_hf.py", tmp_path / "run", "--out-dir", tmp_path / "out")
    out = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager",
                                                            dtype=torch.float64).eval()
    assert type(out).__name__ == "Qwen2ForCausalLM"
    sd = {k: v.numpy() for k, v in out.state_dict().items()}
    want = hf_interop.hf_tensors_from_params(cfg, P1)
    assert sorted(k for k in sd if k.endswith(".bias")) == sorted(
        f"model.layers.{l}.self_attn.{x}_proj.bias" for l in range(L) for x in "qkv")
    for k, v in want.items():
        assert np.array_equal(sd[k], v.astype(np.float64)), k

    prompt, forced = [3, 141, 27, 88], np.random.default_rng(2).integers(0, V, 40).tolist()
    dump = tmp_path / "logits.f32"
    run(GEN, "--model", tmp_path / "run", "--prompt-ids", ",".join(map(str, prompt)), "--force-ids",
        ",".join(map(str, forced)), "--dump-logits", dump, "--max-new", len(forced))
    ours = np.fromfile(dump, np.float32).reshape(-1, V)
    with torch.no_grad():
        theirs = out(torch.tensor([prompt + forced])).logits[0, len(prompt) - 1:-1].numpy()
    assert ours.shape == theirs.shape == (len(forced), V)
    err = np.abs(ours - theirs).max() / np.abs(theirs).max()
    assert err < 1e-5, err
