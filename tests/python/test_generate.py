"""build/generate_cpu, the CPU generator with a KV cache (generate_cpu.cpp, llmc/cpu/model_infer.h):
- against Hugging Face transformers (skipped without torch + transformers): a random GPT2LMHeadModel
  (fp32) and random LlamaForCausalLMs (fp64; GQA with an untied head, multi-head with a tied one)
  converted to our format through scripts/train_gpt2.py's imports; teacher-forced on transformers'
  greedy tokens, the logits each token is drawn from match `generate(output_logits=True)` at every
  step, and the greedy tokens equal `generate(do_sample=False)`'s; for GPT-2 also a batch of
  prompts of different lengths; tokens sampled with temperature, top-k and top-p are in the sets
  transformers' warpers keep;
- its own behaviour on a tiny random model (numpy only): a text prompt through the BPE encoder
  equals its ids, a batch equals its prompts run alone, sampling is reproducible from a seed and
  top-k 1 / a tiny top-p are greedy, the end-of-text token and the context end stop a sequence,
  a checkpoint directory loads its newest model, the interactive mode reads stdin;
- bad input: each gives exit status 1 and one line `error: ...` naming the problem.
Needs build/generate_cpu (make). Run: python3 -m pytest -q tests/python/test_generate.py"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import llmc_formats as fmt  # noqa: E402

GEN = ROOT / "build" / "generate_cpu"
# a tiny model whose vocabulary holds the 256 bytes and an end-of-text token, so text prompts work
CFG = dict(max_seq_len=24, vocab_size=260, padded_vocab_size=384, num_layers=1, num_heads=2, num_kv_heads=2,
           channels=16, window=0)
EOT = 256


def run(*args, stdin=None):
    if not GEN.exists():
        pytest.fail(f"{GEN} is missing: run make first")
    # one thread: these models are tiny, and on a loaded machine two threads meeting at each op's
    # barrier made a decode step 1000x slower (210 ms instead of 0.2 ms)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # the text a random model prints is any bytes: surrogateescape keeps them comparable
    return subprocess.run([str(GEN), *map(str, args)], capture_output=True, input=stdin, env=env, encoding="utf-8",
                          errors="surrogateescape")


def ids_of(*args, **kw):
    """The ids that generate_cpu prints for one prompt (no tokenizer: ids separated by spaces)."""
    r = run(*args, **kw)
    assert r.returncode == 0, r.stderr
    return [int(x) for x in r.stdout.split()]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gen")
    rng = np.random.default_rng(0)
    params = rng.normal(0, 0.5, fmt.num_params(CFG)).astype(np.float32)
    fmt.split_params(CFG, params)["wte"][CFG["vocab_size"]:] = 0  # padded rows are zero
    fmt.write_model(d / "model.bin", CFG, params)
    fmt.write_tokenizer(d / "tok.bin", [bytes([b]) for b in range(256)] + [b"<|endoftext|>", b"ab", b"cd", b"ef"], EOT)
    return d


# ---------------------------------------------------------------- against transformers
def hf_and_ours(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import train_gpt2
    from test_hf_import import hf_model_with_random_everything
    L, C, NH, V, maxT = 2, 48, 3, 300, 40
    hf = hf_model_with_random_everything(L, C, NH, V, maxT, seed=11)
    hf.generation_config.eos_token_id = None  # run every step: our model has no end-of-text below 50256
    hf.generation_config.pad_token_id = 0
    ours = train_gpt2.from_hf(hf)
    path = tmp_path / "hf.bin"
    fmt.write_model(path, ours.cfg, ours.flat().numpy().astype(np.float32))
    return torch, hf, path, V


def hf_llama_and_ours(tmp_path, NKV, tied):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import train_gpt2
    from test_llama_reference import hf_llama
    L, C, NH, H, V, maxT = 2, 48, 6, 72, 300, 40
    hf = hf_llama(L, C, NH, NKV, H, V, maxT, theta=10000.0, eps=1e-5, tied=tied, seed=7)  # float64
    hf.generation_config.eos_token_id = None  # LlamaConfig's default end-of-text is id 2: run every step
    hf.generation_config.pad_token_id = 0
    ours = train_gpt2.from_hf(hf)
    path = tmp_path / "hf_llama.bin"
    fmt.write_model(path, ours.cfg, ours.flat().numpy().astype(np.float32))
    return torch, hf, path, V


def teacher_forced_error(ids_of, torch, hf, path, V, prompt, steps, dump):
    """transformers' greedy tokens after `prompt`, and max |ours - transformers| / max |transformers| of
    the logits each of them is drawn from, ours teacher-forced on those tokens (`ids_of` runs the
    generator under test: this file's CPU twin, or the GPU build in tests/gpu/test_generate_hf.py)."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=steps, output_logits=True,
                          return_dict_in_generate=True)
    hf_tokens = out.sequences[0, len(prompt):].tolist()
    hf_logits = torch.stack(out.logits)[:, 0].double().numpy()  # (steps, V): the row each new token came from
    assert len(hf_tokens) == steps
    forced = ids_of("--model", path, "--prompt-ids", ",".join(map(str, prompt)), "--force-ids",
                    ",".join(map(str, hf_tokens)), "--dump-logits", dump, "--max-new", steps)
    assert forced == hf_tokens
    ours = np.fromfile(dump, np.float32).reshape(-1, V)
    assert ours.shape == (steps, V)
    return hf_tokens, np.abs(ours - hf_logits).max() / np.abs(hf_logits).max()


@pytest.mark.parametrize("family", ["gpt2", "llama_gqa_untied", "llama_mha_tied"])
def test_teacher_forced_logits_and_greedy_tokens_match_transformers(tmp_path, family):
    if family == "gpt2":
        torch, hf, path, V = hf_and_ours(tmp_path)
    else:
        torch, hf, path, V = hf_llama_and_ours(tmp_path, NKV=2 if "gqa" in family else 6, tied="untied" not in family)
    prompt, steps = [5, 17, 250, 3, 99, 42, 7], 24
    hf_tokens, err = teacher_forced_error(ids_of, torch, hf, path, V, prompt, steps, tmp_path / "logits.f32")
    print(f"{family}: teacher-forced logits, {steps} steps: max |ours - transformers| / max |transformers| = {err:.2e}")
    assert err < 1e-5, err

    greedy = ids_of("--model", path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new", steps,
                    "--temperature", 0)
    assert greedy == hf_tokens


def test_batch_of_different_lengths_matches_transformers(tmp_path):
    torch, hf, path, V = hf_and_ours(tmp_path)
    prompts, steps = [[1], [250, 4, 8, 15, 16, 23, 42, 108, 4, 8, 15], [77, 3, 200]], 16
    expected = []
    with torch.no_grad():
        for p in prompts:
            expected.append(hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=steps)[0, len(p):].tolist())
    args = ["--model", path, "--max-new", steps, "--temperature", 0]
    for p in prompts:
        args += ["--prompt-ids", ",".join(map(str, p))]
    r = run(*args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["[1]", "[2]", "[3]"]
    assert [[int(x) for x in line.split()[1:]] for line in lines] == expected


# ---------------------------------------------------------------- behaviour
def test_sampled_tokens_are_in_transformers_top_k_top_p_sets(files):
    """Each token drawn at temperature 0.8 with top-k 20 and top-p 0.7 is one that transformers'
    warpers (temperature, then top-k, then top-p, generate's order) leave finite for its logits."""
    torch = pytest.importorskip("torch")
    tr = pytest.importorskip("transformers")
    m = ["--model", files / "model.bin", "--prompt-ids", "7,8,9", "--max-new", 21, "--eot", -1]
    sampling = ["--temperature", 0.8, "--top-k", 20, "--top-p", 0.7]
    drawn = []
    for seed in range(4):  # 4 x 21 draws
        toks = ids_of(*m, *sampling, "--seed", seed)
        dump = files / f"sampled_{seed}.f32"
        ids_of(*m, "--force-ids", ",".join(map(str, toks)), "--dump-logits", dump)
        rows = torch.from_numpy(np.fromfile(dump, np.float32).reshape(len(toks), -1)).double()
        drawn += list(zip(toks, rows))
    warpers = [tr.TemperatureLogitsWarper(0.8), tr.TopKLogitsWarper(20), tr.TopPLogitsWarper(0.7)]
    sizes = []
    for tok, row in drawn:
        scores = row[None]
        for w in warpers:
            scores = w(None, scores)
        allowed = torch.isfinite(scores[0]).nonzero().flatten().tolist()
        sizes.append(len(allowed))
        assert tok in allowed, (tok, allowed)
    assert min(sizes) >= 1 and max(sizes) > 1 and max(sizes) <= 20  # the filters did cut, and not to one


def test_text_prompt_is_its_bpe_ids(files):
    base = ["--model", files / "model.bin", "--tokenizer", files / "tok.bin", "--max-new", 12, "--temperature", 0,
            "--eot", -1]
    text = run(*base, "--prompt", "abcd x<|endoftext|>ef")
    # "ab" and "cd" merge (ids 257, 258), " x" has no token (32, 120), then end-of-text, "ef" (259)
    ids = run(*base, "--prompt-ids", f"257,258,32,120,{EOT},259")
    unmerged = run(*base, "--prompt-ids", "97,98,99,100,32,120,256,101,102")  # the same bytes
    assert text.returncode == ids.returncode == unmerged.returncode == 0, text.stderr + ids.stderr
    assert len(text.stdout) > 1 and text.stdout == ids.stdout != unmerged.stdout


def test_batch_equals_prompts_alone(files):
    m = ["--model", files / "model.bin", "--max-new", 10]
    prompts = ["3,1,4,1,5", "9", "2,6,5,3,5,8,9,7,9,3,2,3"]
    alone = [ids_of(*m, "--temperature", 0, "--prompt-ids", p) for p in prompts]
    for batch in (8, 2):
        args = [*m, "--temperature", 0, "--batch", batch]
        for p in prompts:
            args += ["--prompt-ids", p]
        r = run(*args)
        assert r.returncode == 0, r.stderr
        assert [[int(x) for x in line.split()[1:]] for line in r.stdout.splitlines()] == alone
    # sampled: the first prompt draws from the seed's own stream, alone or in a batch
    sampled = ids_of(*m, "--seed", 5, "--prompt-ids", prompts[0])
    r = run(*m, "--seed", 5, "--prompt-ids", prompts[0], "--prompt-ids", prompts[1])
    assert [int(x) for x in r.stdout.splitlines()[0].split()[1:]] == sampled


def test_sampling_seed_top_k_top_p(files):
    m = ["--model", files / "model.bin", "--prompt-ids", "7,8,9", "--max-new", 20, "--eot", -1]
    greedy = ids_of(*m, "--temperature", 0)
    a, b = ids_of(*m, "--seed", 1), ids_of(*m, "--seed", 1)
    c = ids_of(*m, "--seed", 2)
    assert a == b and a != c and a != greedy
    assert ids_of(*m, "--seed", 3, "--top-k", 1) == greedy
    assert ids_of(*m, "--seed", 3, "--top-p", 1e-6) == greedy
    # top-k 3: every token is one of the 3 most likely, checked on the dumped logits (teacher forcing)
    k3 = ids_of(*m, "--seed", 4, "--top-k", 3)
    assert k3 != greedy
    logits = files / "k3.f32"
    ids_of(*m, "--force-ids", ",".join(map(str, k3)), "--dump-logits", logits)
    rows = np.fromfile(logits, np.float32).reshape(len(k3), -1)
    assert all(tok in np.argsort(-row)[:3] for tok, row in zip(k3, rows))


def test_stops_at_eot_and_context_end(files):
    m = ["--model", files / "model.bin", "--temperature", 0]
    full = ids_of(*m, "--prompt-ids", "1,2", "--max-new", 20, "--eot", -1)
    assert len(full) == 20
    k = next(i for i in range(1, 20) if full[i] not in full[:i])
    assert ids_of(*m, "--prompt-ids", "1,2", "--max-new", 20, "--eot", full[k]) == full[:k]
    prompt20 = ",".join(["5"] * 20)
    # 24 positions: the new tokens take positions 20..24, the last one is printed, never fed
    assert len(ids_of(*m, "--prompt-ids", prompt20, "--max-new", 50, "--eot", -1)) == 5
    assert len(ids_of(*m, "--prompt-ids", prompt20, "--max-new", 50, "--eot", -1, "--max-seq", 22)) == 3


def test_checkpoint_dir_and_interactive(files, tmp_path):
    _, params = fmt.read_model(files / "model.bin")
    n = fmt.num_params(CFG)
    fmt.write_checkpoint(str(tmp_path / "run"), 3, CFG, np.array(params), np.zeros(n, np.float32),
                         np.zeros(n, np.float32))
    m = ["--temperature", 0, "--max-new", 6, "--eot", -1]
    ref = [ids_of("--model", files / "model.bin", *m, "--prompt-ids", p) for p in ("1,2,3", "40")]
    assert ids_of("--model", tmp_path / "run", *m, "--prompt-ids", "1,2,3") == ref[0]
    r = run("--model", tmp_path / "run", *m, "--interactive", 1, stdin="1,2,3\n\n40\n")
    assert r.returncode == 0, r.stderr
    assert [[int(x) for x in line.split()] for line in r.stdout.splitlines()] == ref
    assert "error: stdin line 2: empty prompt (skipped)" in r.stderr
    # every stdin line refused and no other prompt: nothing generated, a failure
    r = run("--model", tmp_path / "run", *m, "--interactive", 1, stdin="\n99999\n")
    assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stdout)
    assert "error: no stdin line was a usable prompt (2 skipped): nothing generated" in r.stderr, r.stderr
    # no stdin at all: nothing asked, nothing refused
    assert run("--model", tmp_path / "run", *m, "--interactive", 1, stdin="").returncode == 0


BAD = [  # (name, args after --model, expected text of the one error line)
    ("empty --prompt-ids", ["--prompt-ids", ""], '--prompt-ids "": empty prompt'),
    ("empty text prompt", ["--tokenizer", "{d}/tok.bin", "--prompt", ""], '--prompt "": empty prompt'),
    ("prompt longer than the context", ["--prompt-ids", ",".join(["1"] * 25)],
     "25 tokens, longer than the context of 24 positions"),
    ("prompt longer than --max-seq", ["--prompt-ids", "1,2,3,4", "--max-seq", 3],
     "4 tokens, longer than the context of 3 positions"),
    ("token id out of range", ["--prompt-ids", "1,260"], "token id 260 is out of range for the model's vocabulary of 260"),
    ("token id out of range in a file", ["--prompt-ids-file", "{d}/ids.txt"],
     "{d}/ids.txt line 2: token id 999 is out of range"),
    ("not a token id", ["--prompt-ids", "1,x"], "--prompt-ids \"1,x\": 'x' is not a token id"),
    ("negative token id", ["--prompt-ids", "1,-3"], "'-3' is not a token id"),
    ("temperature < 0", ["--prompt-ids", "1", "--temperature", -1], "--temperature: must be in [0, 100], got -1"),
    ("top-k < 0", ["--prompt-ids", "1", "--top-k", -1], "--top-k: must be in [0, 1000000], got -1"),
    ("--max-new 0", ["--prompt-ids", "1", "--max-new", 0], "--max-new: must be in [1, 1000000000], got 0"),
    ("top-p below a float", ["--prompt-ids", "1", "--top-p", "1e-400"],
     "--top-p: '1e-400' is out of range: nonzero, but below the smallest float"),
    ("two commas with no id between", ["--prompt-ids", "1,,2"],
     '--prompt-ids "1,,2": an empty token id between commas 1 and 2'),
    ("a leading comma", ["--prompt-ids", ",1"], '--prompt-ids ",1": an empty token id before the first comma'),
    ("a trailing comma", ["--prompt-ids", "1, 2,"], '--prompt-ids "1, 2,": an empty token id after the last comma'),
    ("an empty id in --force-ids", ["--prompt-ids", "1", "--force-ids", "3,,4"],
     "--force-ids: an empty token id between commas 1 and 2"),
    ("top-p 0", ["--prompt-ids", "1", "--top-p", 0], "--top-p: must be in (0, 1], got 0"),
    ("top-p > 1", ["--prompt-ids", "1", "--top-p", 1.5], "--top-p: must be in (0, 1], got 1.5"),
    ("top-p not a number", ["--prompt-ids", "1", "--top-p", "x"], "--top-p: 'x' is not a number"),
    ("text prompt without a tokenizer", ["--prompt", "hi"], "a text prompt needs --tokenizer"),
    ("no prompt", [], "no prompt: give --prompt"),
    ("blank prompt file", ["--prompt-ids-file", "{d}/blank.txt"], "no prompt in it"),
    ("missing prompt file", ["--prompt-file", "{d}/nope.txt"], "--prompt-file {d}/nope.txt: cannot open"),
    ("--max-seq beyond the model", ["--prompt-ids", "1", "--max-seq", 25], "--max-seq 25: longer than the 24 positions"),
    ("--eot beyond the vocabulary", ["--prompt-ids", "1", "--eot", 300], "--eot 300: out of range"),
    ("--force-ids with two prompts", ["--prompt-ids", "1", "--prompt-ids", "2", "--force-ids", "3"],
     "--force-ids: works with exactly one prompt"),
    ("missing tokenizer", ["--prompt-ids", "1", "--tokenizer", "{d}/nope.bin"], "{d}/nope.bin: cannot open"),
    ("a tokenizer smaller than the model's vocabulary", ["--prompt-ids", "1", "--tokenizer", "{d}/tok100.bin"],
     "--tokenizer {d}/tok100.bin: 100 tokens, the model's vocabulary has 260"),
]
BAD_MODEL = [  # (name, --model, expected)
    ("missing model", "{d}/nope.bin", "--model {d}/nope.bin: cannot open"),
    ("a tokenizer as the model", "{d}/tok.bin", "{d}/tok.bin: this is a tokenizer file, not a model checkpoint"),
    ("truncated model", "{d}/truncated.bin", "{d}/truncated.bin"),
    ("directory without a checkpoint", "{d}/emptydir", "without a complete checkpoint"),
    # a checkpoint whose model.bin no longer matches its DONE: refused however it is named, each
    # message naming --model (not --resume)
    ("a damaged checkpoint's model.bin", "{d}/ck/step_00000001/model.bin",
     "--model {d}/ck/step_00000001/model.bin: damaged checkpoint {d}/ck/step_00000001: model.bin does not match "
     "the checksum in DONE"),
    ("a damaged checkpoint", "{d}/ck/step_00000001",
     "--model {d}/ck/step_00000001: damaged checkpoint: model.bin does not match the checksum in DONE"),
    ("a directory of damaged checkpoints", "{d}/ck", "--model {d}/ck: all 1 checkpoints in it are damaged"),
]


@pytest.fixture(scope="module")
def bad_files(files):
    (files / "ids.txt").write_text("1,2\n3 999\n")
    (files / "blank.txt").write_text("\n  \n")
    (files / "truncated.bin").write_bytes((files / "model.bin").read_bytes()[:-4])
    (files / "emptydir").mkdir(exist_ok=True)
    fmt.write_tokenizer(files / "tok100.bin", [bytes([b]) for b in range(100)], 99)  # another, smaller tokenizer
    # a checkpoint (model.bin, a stand-in state.bin, DONE) whose model.bin was damaged after DONE
    ck = files / "ck" / "step_00000001"
    ck.mkdir(parents=True, exist_ok=True)
    model = bytearray((files / "model.bin").read_bytes())
    (ck / "model.bin").write_bytes(model)
    (ck / "state.bin").write_bytes(b"state" * 4)
    (ck / "DONE").write_text(fmt.checkpoint_manifest(ck, 1))
    model[2000] ^= 1  # a flipped bit in a weight: the file still reads as a model
    (ck / "model.bin").write_bytes(model)
    return files


def check_error(r, want):
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ") and want in lines[0], \
        f"exit {r.returncode}, stderr {r.stderr!r}, wanted one 'error: ...{want}...'"


@pytest.mark.parametrize("name,args,want", BAD, ids=[b[0] for b in BAD])
def test_bad_input(bad_files, name, args, want):
    d = str(bad_files)
    check_error(run("--model", bad_files / "model.bin", *[str(a).format(d=d) for a in args]), want.format(d=d))


@pytest.mark.parametrize("name,model,want", BAD_MODEL, ids=[b[0] for b in BAD_MODEL])
def test_bad_model(bad_files, name, model, want):
    d = str(bad_files)
    check_error(run("--model", model.format(d=d), "--prompt-ids", "1"), want.format(d=d))


def test_checkpoint_model_bin_verifies(tmp_path, files):
    """The control of the damaged cases: a checkpoint's model.bin that matches its DONE loads."""
    ck = tmp_path / "step_00000001"
    ck.mkdir()
    (ck / "model.bin").write_bytes((files / "model.bin").read_bytes())
    (ck / "state.bin").write_bytes(b"state" * 4)
    (ck / "DONE").write_text(fmt.checkpoint_manifest(ck, 1))
    m = ["--prompt-ids", "1,2", "--max-new", 3, "--temperature", 0]
    assert ids_of("--model", ck / "model.bin", *m) == ids_of("--model", files / "model.bin", *m)
