"""build/generate_fp32, the GPU generator (generate.cu, llmc/model_infer.cuh) in its fp32 build,
against Hugging Face transformers: random LlamaForCausalLMs (fp64; GQA with an untied head, multi-head
with a tied one, and a GQA one with Llama 3.x's llama3 RoPE scaling whose original context, 16, the
52 positions pass) and a random GPT2LMHeadModel, all with heads of 64 (what the GPU attention runs),
converted to our format through scripts/train_gpt2.py's imports. Teacher-forced on transformers'
greedy tokens, the logits each token is drawn from match `generate(output_logits=True)` at every step
(the decode path: RoPE at each sequence's position, the cache, the decode attention, the GEMV
matmuls at M = 1), and the greedy tokens equal `generate(do_sample=False)`'s.
Skipped without a GPU (nvidia-smi), the binary, torch or transformers; make test on a machine
without a GPU skips it. On the GPU machine:
    python3 -m pytest -q -s tests/gpu/test_generate_hf.py
(GEN=path/to/binary overrides the binary, e.g. build/generate for the bf16 build with TOL=5e-2; a
bf16 build's bound is the larger of TOL and twice transformers' own error in bf16 on the same tokens,
measured in the test: on the random Llamas bf16 alone moves the logits by 7-16% of the largest.)"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "python"))
import llmc_formats as fmt  # noqa: E402
from test_generate import teacher_forced_error  # noqa: E402

GEN = Path(os.environ.get("GEN", ROOT / "build" / "generate_fp32"))
TOL = float(os.environ.get("TOL", "1e-4"))  # max |ours - transformers| / max |transformers|, fp32 matmuls


def have_gpu():
    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def ids_of(*args):
    r = subprocess.run([str(GEN), *map(str, args)], capture_output=True, encoding="utf-8", errors="surrogateescape")
    assert r.returncode == 0, r.stderr
    return [int(x) for x in r.stdout.split()]


@pytest.fixture(autouse=True)
def needs_gpu():
    if not GEN.exists():
        pytest.skip(f"{GEN} is missing (make build/generate_fp32)")
    if not have_gpu():
        pytest.skip("no GPU here")


def model_file(tmp_path, family):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import train_gpt2
    L, C, NH, V, maxT = 2, 128, 2, 300, 64  # heads of 64; V pads to 384
    if family == "gpt2":
        from test_hf_import import hf_model_with_random_everything
        hf = hf_model_with_random_everything(L, C, NH, V, maxT, seed=11).double()
        ours = train_gpt2.from_hf(hf)
    else:
        from test_llama_reference import hf_llama
        NKV, tied = (1, False) if "gqa" in family or "llama3" in family else (2, True)
        scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=16) if "llama3" in family else None
        hf = hf_llama(L, C, NH, NKV, 192, V, maxT, theta=10000.0, eps=1e-5, tied=tied, seed=7,
                      rope_scaling=scaling)  # float64
        ours = train_gpt2.from_hf(hf)
        if scaling:  # the import kept the scaling (else this family tests nothing new)
            assert ours.cfg["rope_scaling"] == fmt.ROPE_SCALING_LLAMA3 and ours.cfg["rope_factor"] == 8.0
    hf.generation_config.eos_token_id = None  # run every step
    hf.generation_config.pad_token_id = 0
    path = tmp_path / f"{family}.bin"
    fmt.write_model(path, ours.cfg, ours.flat().detach().numpy().astype(np.float32))
    return torch, hf, path, V


def transformers_bf16_error(torch, hf, prompt, tokens):
    """max |transformers in bf16 - transformers in float64| / max |float64| over the logits the tokens
    after the prompt are drawn from (one teacher-forced forward each, on the GPU): what bf16 itself costs
    this model. The random Llamas lose 7-16% to it on the CPU (GPT-2 0.8%), so a fixed bf16 tolerance
    would be a guess."""
    import copy
    seq = torch.tensor([prompt + tokens[:-1]])
    with torch.no_grad():
        want = hf(seq).logits[0, len(prompt) - 1:].double()
        low = copy.deepcopy(hf).to(torch.bfloat16).cuda()
        got = low(seq.cuda()).logits[0, len(prompt) - 1:].double().cpu()
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("family", ["llama_gqa_untied", "llama_mha_tied", "llama3_scaled_gqa", "gpt2"])
def test_gpu_teacher_forced_logits_and_greedy_tokens_match_transformers(tmp_path, family):
    torch, hf, path, V = model_file(tmp_path, family)
    prompt, steps = [5, 17, 250, 3, 99, 42, 7, 1, 2, 3, 200, 150], 40
    hf_tokens, err = teacher_forced_error(ids_of, torch, hf, path, V, prompt, steps, tmp_path / "logits.f32")
    tol, why = TOL, f"{TOL:.0e}"
    if not GEN.name.endswith("fp32"):  # bf16: at most twice what bf16 costs transformers on this model
        own = transformers_bf16_error(torch, hf, prompt, hf_tokens)
        tol, why = max(TOL, 2 * own), f"max({TOL:.0e}, 2 x transformers' own bf16 error {own:.2e})"
    print(f"\nHF_CHECK {GEN.name} {family}: teacher-forced logits, {steps} steps: "
          f"max |ours - transformers| / max |transformers| = {err:.2e} (tolerance {why})")
    assert err < tol, err
    greedy = ids_of("--model", path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new", steps,
                    "--temperature", 0, "--eot", -1)
    if not GEN.name.endswith("fp32"):
        return  # bf16: greedy near-ties may differ
    assert greedy == hf_tokens
