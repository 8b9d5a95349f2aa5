"""Llama 3.x's RoPE scaling (rope_type "llama3": Llama 3.1 8B, Llama 3.2 1B/3B) end to end, against
Hugging Face transformers (skipped without torch + transformers), on a random tiny LlamaForCausalLM
(2 layers, hidden 64, 4 heads of 16, 2 key/value heads, vocab 100, 256 positions, theta 10000) whose
scaling (factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 32) puts
the head's frequency pairs in all three bands, so it changes the angles from the second position on:
- transformers' scaled inverse frequencies differ from the unscaled ones (else nothing here could fail);
- saved with save_pretrained and converted by scripts/import_hf.py, it is a version-3 model file with
  the scaling in its header; build/generate_cpu (llmc/cpu/model_infer.h), teacher-forced on
  transformers' greedy tokens over 100 positions (past the original 32), gives transformers' fp32
  logits to 1e-4 and the same greedy tokens; the same run without the scaling does not;
- our PyTorch reference (scripts/train_gpt2.py) on the imported weights gives transformers' logits
  (float64, 1e-6), and build/test_gpt2_cpu (the CPU trainer's forward, backward and AdamW steps)
  matches a reference state written from it; that state refuses a model file without the scaling;
- exported again with scripts/export_hf.py, transformers loads the folder with the same rope config
  and the same logits;
- bad input: an unsupported rope_type is refused by the import naming the key; a model file whose
  llama3 parameters are invalid, or of a newer version, is refused by the C++ reader in one line.
Needs build/generate_cpu and build/test_gpt2_cpu (make).
Run: python3 -m pytest -q tests/python/test_rope_llama3.py  (about 15 s on 2 CPU cores)"""
import json
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
sys.path.insert(0, str(ROOT / "tests" / "python"))
import llmc_formats as fmt  # noqa: E402
import train_gpt2  # noqa: E402
from test_generate import ids_of, teacher_forced_error  # noqa: E402

GEN, TEST_CPU = ROOT / "build" / "generate_cpu", ROOT / "build" / "test_gpt2_cpu"
SCALING = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=32)
THETA, V = 10000.0, 100


def run(*cmd):
    # one thread: tiny models, and a loaded machine makes the threads' barriers slow
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), errors="surrogateescape")


def need(binary):
    if not binary.exists():
        pytest.fail(f"{binary} is missing: run make first")


def hf_config(**changes):
    kw = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=THETA,
              rope_scaling=dict(SCALING), tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
              hidden_act="silu", bos_token_id=None, eos_token_id=None, pad_token_id=0)
    kw.update(changes)
    return transformers.LlamaConfig(**kw)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random LlamaForCausalLM with llama3 scaling, every tensor random (the init would leave the norms
    at 1), saved to a folder; fp32."""
    d = tmp_path_factory.mktemp("llama3")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_config()).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_((1.0 if name.endswith("norm.weight") else 0.0) + 0.15 * torch.randn(p.shape, generator=g))
    hf.save_pretrained(str(d / "hf"))
    return d


def load_hf(path, dtype=torch.float32):
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager", dtype=dtype)
    hf.generation_config.eos_token_id = None  # run every step
    hf.generation_config.pad_token_id = 0
    return hf.eval()


@pytest.fixture(scope="module")
def imported(hf_dir):
    """scripts/import_hf.py on the folder: (model path, its config)."""
    out = hf_dir / "llama3.bin"
    p = run(sys.executable, ROOT / "scripts" / "import_hf.py", hf_dir / "hf", "--out", out)
    assert p.returncode == 0, p.stderr
    cfg, _ = fmt.read_model(out)
    return out, cfg


def test_scaling_changes_transformers_frequencies(hf_dir):
    hf = load_hf(hf_dir / "hf")
    assert hf.config.rope_parameters["rope_type"] == "llama3"
    scaled = hf.model.rotary_emb.inv_freq.double()
    plain = THETA ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    ratio = scaled / plain
    # pair 0 kept (wavelength 6.3 < 32/4), pair 1 blended (19.9), pairs 2.. divided by 8 (> 32/1)
    assert abs(ratio[0] - 1) < 1e-6 and 1 / 8 + 0.01 < ratio[1] < 0.99 and torch.allclose(ratio[2:], ratio.new_tensor(1 / 8))


def test_import_writes_version_3_with_the_scaling(imported):
    path, cfg = imported
    h, _ = fmt.read_header(path, fmt.MAGIC_MODEL)
    assert h[1] == 3 and h[21] == fmt.ROPE_SCALING_LLAMA3 and h[25] == 32
    assert (cfg["rope_factor"], cfg["rope_low_freq_factor"], cfg["rope_high_freq_factor"], cfg["rope_theta"]) == \
        (8.0, 1.0, 4.0, THETA)
    assert (cfg["num_kv_heads"], cfg["tied_head"], cfg["max_seq_len"]) == (2, 0, 256)


def test_generate_cpu_matches_transformers_fp32(hf_dir, imported, tmp_path):
    need(GEN)
    path, cfg = imported
    hf = load_hf(hf_dir / "hf")
    prompt, steps = [5, 17, 93, 3, 42, 7, 61, 11], 92  # 100 positions: past the original 32
    tokens, err = teacher_forced_error(ids_of, torch, hf, path, V, prompt, steps, tmp_path / "logits.f32")
    print(f"llama3 scaling, fp32: teacher-forced logits over {len(prompt) + steps} positions: "
          f"max |ours - transformers| / max |transformers| = {err:.2e}")
    assert err < 1e-4, err
    assert ids_of("--model", path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new", steps,
                  "--temperature", 0) == tokens

    # the same weights without the scaling: far off, so the comparison above sees the scaling
    plain = tmp_path / "plain.bin"
    _, flat = fmt.read_model(path)
    fmt.write_model(plain, dict(cfg, **fmt.no_rope_scaling()), flat)
    hf_tokens = torch.tensor([prompt + tokens])
    dump = tmp_path / "plain.f32"
    p = run(GEN, "--model", plain, "--prompt-ids", ",".join(map(str, prompt)), "--force-ids",
            ",".join(map(str, tokens)), "--dump-logits", dump, "--max-new", steps)
    assert p.returncode == 0, p.stderr
    with torch.no_grad():
        want = hf(hf_tokens).logits[0, len(prompt) - 1:-1].double().numpy()
    off = np.abs(np.fromfile(dump, np.float32).reshape(-1, V) - want).max() / np.abs(want).max()
    assert off > 100 * max(err, 1e-6), (off, err)


def test_reference_and_cpu_trainer(hf_dir, imported, tmp_path):
    """Our PyTorch reference on the imported weights = transformers (float64); the CPU trainer's
    forward, backward and AdamW steps = a reference state of it (build/test_gpt2_cpu)."""
    path, cfg = imported
    hf = load_hf(hf_dir / "hf", torch.float64)
    _, flat = fmt.read_model(path)
    model = train_gpt2.GPT2(cfg).double()
    model.load_flat(torch.from_numpy(flat.astype(np.float64)))
    idx = torch.randint(0, V, (2, 120), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = hf(idx).logits
        got = model(idx)[0][..., :V]
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-6, err  # transformers' angles are fp32, ours float64

    need(TEST_CPU)
    m, d = tmp_path / "m.bin", tmp_path / "d.bin"
    args = train_gpt2.parse_args(["--load", str(path), "--write-model", str(m), "--write-debug", str(d), "--batch", "2",
                                  "--seq", "96", "--steps", "3", "--lr", "1e-3"])
    train_gpt2.write_outputs(train_gpt2.build_model(args), args)
    p = run(TEST_CPU, m, d)
    assert p.returncode == 0 and "FAIL" not in p.stdout, p.stdout[-3000:] + p.stderr
    assert "llama3 scaling (factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 32)" \
        in p.stdout, p.stdout[:2000]
    # the state belongs to the scaled model: the same weights without the scaling are another model
    plain = tmp_path / "plain.bin"
    _, flat = fmt.read_model(m)
    fmt.write_model(plain, dict(cfg, **fmt.no_rope_scaling()), flat)
    p = run(TEST_CPU, plain, d)
    assert p.returncode != 0 and "written for a different model (model header slot 21 is 1" in p.stdout + p.stderr, \
        p.stdout[-2000:] + p.stderr


def test_export_round_trip_through_transformers(hf_dir, imported, tmp_path):
    path, cfg = imported
    p = run(sys.executable, ROOT / "scripts" / "export_hf.py", path, "--out-dir", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    hc = json.loads((tmp_path / "out" / "config.json").read_text())
    assert hc["rope_scaling"] == SCALING and hc["rope_theta"] == THETA
    a, b = load_hf(hf_dir / "hf", torch.float64), load_hf(tmp_path / "out", torch.float64)
    assert b.config.rope_parameters == a.config.rope_parameters
    assert torch.equal(a.model.rotary_emb.inv_freq, b.model.rotary_emb.inv_freq)
    idx = torch.randint(0, V, (1, 80), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(b(idx).logits, a(idx).logits, rtol=0, atol=0)
    p = run(sys.executable, ROOT / "scripts" / "import_hf.py", tmp_path / "out", "--out", tmp_path / "back.bin")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "back.bin").read_bytes() == path.read_bytes()


@pytest.mark.parametrize("rope, message", [
    (dict(rope_type="dynamic", factor=2.0), "rope_scaling rope_type 'dynamic' is not supported"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32), "rope_scaling rope_type 'yarn'"),
    (dict(rope_type="linear", factor=2.0), "rope_scaling rope_type 'linear'"),
    ({k: v for k, v in SCALING.items() if k != "high_freq_factor"},
     "rope_scaling rope_type 'llama3' needs 'high_freq_factor', which is missing"),
], ids=["dynamic", "yarn", "linear", "llama3_missing_key"])
def test_import_refuses_other_scaling(hf_dir, tmp_path, rope, message):
    d = tmp_path / "hf"
    d.mkdir()
    hc = json.loads((hf_dir / "hf" / "config.json").read_text())
    hc.pop("rope_parameters", None)
    hc.update(rope_theta=THETA, rope_scaling=rope)
    (d / "config.json").write_text(json.dumps(hc))
    (d / "model.safetensors").symlink_to(hf_dir / "hf" / "model.safetensors")
    p = run(sys.executable, ROOT / "scripts" / "import_hf.py", d, "--out", tmp_path / "m.bin")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and f"{d}/config.json: {message}" in lines[0], p.stderr
    assert not (tmp_path / "m.bin").exists()


def patched(path, out, slots):
    """A copy of a model file with header slots changed."""
    b = bytearray(Path(path).read_bytes())
    h = np.frombuffer(b, dtype="<i8", count=fmt.HEADER_INTS).copy()
    for i, v in slots.items():
        h[i] = v
    b[:fmt.HEADER_BYTES] = h.tobytes()
    Path(out).write_bytes(bytes(b))
    return out


def f64(x):
    return int(np.float64(x).view(np.int64))


@pytest.mark.parametrize("slots, message", [
    ({22: f64(0.5)}, "llama3 RoPE scaling factor 0.5 must be in [1, 1e6]"),
    ({24: f64(1.0)}, "llama3 RoPE scaling high_freq_factor 1 must be greater than low_freq_factor 1"),
    ({23: f64(float("nan"))}, "llama3 RoPE scaling low_freq_factor nan must be in (0, 1e6]"),
    ({25: 0}, "llama3 RoPE scaling original_max_position_embeddings 0 out of range"),
    ({21: 2}, "header field rope_scaling = 2 is out of range [0, 1]"),
    ({21: 0}, "RoPE scaling parameters without a scaling type (factor 8"),
    ({1: 5}, "unsupported version 5 of a model checkpoint (this build reads versions 1 to 4)"),
], ids=["factor", "high_low", "nan", "original", "type", "params_without_type", "version"])
def test_cpu_reader_refuses_bad_scaling(imported, tmp_path, slots, message):
    need(GEN)
    path, _ = imported
    bad = patched(path, tmp_path / "bad.bin", slots)
    p = run(GEN, "--model", bad, "--prompt-ids", "1,2", "--max-new", 1)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ") and str(bad) in lines[0], p.stderr
    assert message in lines[0], lines[0]


def test_version_2_file_ignores_slots_21_on(imported, tmp_path):
    """Slots 21..25 mean nothing in a version-2 file (older writers left them 0; a reader of version 2
    never looked): the model runs unscaled, as it did."""
    need(GEN)
    path, cfg = imported
    _, flat = fmt.read_model(path)
    plain = tmp_path / "plain.bin"
    fmt.write_model(plain, dict(cfg, **fmt.no_rope_scaling()), flat)
    as_v2 = patched(path, tmp_path / "v2.bin", {1: 2})  # the scaled file's slots, version 2
    outs = [run(GEN, "--model", m, "--prompt-ids", "4,5,6", "--max-new", 40, "--temperature", 0) for m in (plain, as_v2)]
    assert outs[0].returncode == 0 and outs[0].stdout == outs[1].stdout, outs[1].stderr
