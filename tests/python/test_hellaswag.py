"""HellaSwag in the trainers (llmc/hellaswag.h): the CPU model's acc_norm and per-example scores
against an independent numpy GPT-2 forward pass (fp64) and, where PyTorch is installed, against
`scripts/train_gpt2.py --hellaswag` (fp64); the CPU trainer's logged accuracy against the same
reference; flag and file errors.

The fixture: tests/fixture/hellaswag.jsonl (12 made-up examples in HellaSwag's jsonl layout) read by
scripts/data/hellaswag.py and written as tests/fixture/hellaswag.bin (GPTE) with one token per
byte (ids < 128), so that the tiny committed model tests/fixture/model.bin (vocab 250, 32
positions) can score it. Regenerate it with `python3 tests/python/test_hellaswag.py --write-fixture`;
test_fixture_matches_jsonl fails when the two drift apart.

Needs build/train_gpt2_cpu (make); build/test_hellaswag_cpu is compiled here when missing or
older than its sources."""
import functools
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "scripts" / "data"))
import llmc_formats as fmt  # noqa: E402
import hellaswag  # noqa: E402

JSONL = ROOT / "tests/fixture/hellaswag.jsonl"
EVAL = ROOT / "tests/fixture/hellaswag.bin"
MODEL = ROOT / "tests/fixture/model.bin"
GQA_MODEL = ROOT / "tests/fixture/gqa_model.bin"  # grouped-query attention with a 6-token window
TRAINER = ROOT / "build/train_gpt2_cpu"
SCORES = ROOT / "build/test_hellaswag_cpu"
SCORES_SRC = ROOT / "tests/cpu/test_hellaswag.cpp"
# the header's vocab_size: the fixture models' (the trainers refuse an eval file of another tokenizer's)
BYTE_VOCAB = 250
# fp32 (C++) against fp64 (numpy, PyTorch): the scores are ~5.5 nats, accumulated over <= 33 tokens
TOL = dict(rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- the fixture
def byte_examples():
    """hellaswag.py's examples of the jsonl fixture, tokenized one token per UTF-8 byte."""
    return [(label, list(ctx.encode()), [list((" " + e).encode()) for e in ends])
            for label, ctx, ends in hellaswag.read_examples(JSONL)]


def write_fixture(path):
    hellaswag.write_eval(path, byte_examples(), BYTE_VOCAB)


def test_fixture_matches_jsonl(tmp_path):
    write_fixture(tmp_path / "hs.bin")
    assert (tmp_path / "hs.bin").read_bytes() == EVAL.read_bytes(), \
        "tests/fixture/hellaswag.bin is stale: python3 tests/python/test_hellaswag.py --write-fixture"
    examples, vocab = hellaswag.read_eval(EVAL)
    assert vocab == BYTE_VOCAB and examples == byte_examples() and len(examples) == 12


# ---------------------------------------------------------------- numpy reference (fp64)
def numpy_model(path):
    cfg, flat = fmt.read_model(str(path))
    flat = np.asarray(flat, dtype=np.float64)
    params, off = {}, 0
    for name, shape in zip(fmt.PARAM_NAMES, fmt.param_shapes(cfg)):
        n = int(np.prod(shape))
        params[name] = flat[off:off + n].reshape(shape)
        off += n
    return cfg, params


def layernorm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def numpy_logits(cfg, p, tokens):
    """GPT-2 of docs/design.md on one row of token ids: (T, V) logits, written from the design
    (pre-norm blocks, grouped-query causal attention with an optional window, tanh GELU, tied wte)."""
    T, C, NH, NKV = len(tokens), cfg["channels"], cfg["num_heads"], cfg["num_kv_heads"]
    HD, W = C // NH, cfg["window"]
    t = np.arange(T)
    allowed = (t[None, :] <= t[:, None]) & ((W == 0) | (t[None, :] > t[:, None] - W))  # (query, key)
    x = p["wte"][tokens] + p["wpe"][:T]
    for l in range(cfg["num_layers"]):
        qkv = layernorm(x, p["ln1w"][l], p["ln1b"][l]) @ p["qkvw"][l].T + p["qkvb"][l]
        q = qkv[:, :C].reshape(T, NH, HD)
        k = qkv[:, C:C + NKV * HD].reshape(T, NKV, HD)
        v = qkv[:, C + NKV * HD:].reshape(T, NKV, HD)
        heads = []
        for h in range(NH):
            kv = h // (NH // NKV)
            s = np.where(allowed, q[:, h] @ k[:, kv].T / math.sqrt(HD), -np.inf)
            a = np.exp(s - s.max(-1, keepdims=True))
            heads.append((a / a.sum(-1, keepdims=True)) @ v[:, kv])
        x = x + np.concatenate(heads, axis=1) @ p["attprojw"][l].T + p["attprojb"][l]
        f = layernorm(x, p["ln2w"][l], p["ln2b"][l]) @ p["fcw"][l].T + p["fcb"][l]
        g = 0.5 * f * (1 + np.tanh(math.sqrt(2 / math.pi) * (f + 0.044715 * f ** 3)))
        x = x + g @ p["fcprojw"][l].T + p["fcprojb"][l]
    return layernorm(x, p["lnfw"], p["lnfb"]) @ p["wte"][:cfg["vocab_size"]].T


def numpy_scores(model_path, examples):
    """(norm_losses (N, K), picks (N)): each completion's mean cross-entropy over its own tokens."""
    cfg, p = numpy_model(model_path)
    norms = []
    for label, ctx, ends in examples:
        row_norms = []
        for e in ends:
            row = ctx + e
            logits = numpy_logits(cfg, p, row[:-1])
            m = logits.max(-1)
            nll = m + np.log(np.exp(logits - m[:, None]).sum(-1)) - logits[np.arange(len(row) - 1), row[1:]]
            row_norms.append(nll[len(ctx) - 1:].mean())  # targets len(ctx).. are the completion's tokens
        norms.append(row_norms)
    norms = np.array(norms)
    return norms, norms.argmin(1)


# ---------------------------------------------------------------- the C++ side
def scores_binary():
    """build/test_hellaswag_cpu, compiled here if it is missing or older than what it includes."""
    sources = [SCORES_SRC, *ROOT.glob("llmc/*.h"), *ROOT.glob("llmc/cpu/*.h")]
    if SCORES.exists() and SCORES.stat().st_mtime >= max(s.stat().st_mtime for s in sources):
        return SCORES
    SCORES.parent.mkdir(exist_ok=True)
    cxx = os.environ.get("CXX", "c++")
    p = subprocess.run([cxx, "-O2", "-std=c++17", "-fopenmp", "-I", str(ROOT), str(SCORES_SRC), "-o", str(SCORES),
                        "-lm"], capture_output=True, text=True)
    assert p.returncode == 0, f"compiling {SCORES_SRC.name} failed:\n{p.stderr}"
    return SCORES


def parse_scores(text):
    """(norm_losses (N, K), labels, picks, (acc, correct, examples)) from the `example ...` lines and the
    `hellaswag acc_norm ...` line that test_hellaswag_cpu and train_gpt2.py --hellaswag print."""
    norms, labels, picks, summary = [], [], [], None
    for line in text.splitlines():
        w = line.split()
        if w[:1] == ["example"]:
            assert w[2] == "label" and w[4] == "pick" and w[6] == "norm_losses", line
            labels.append(int(w[3]))
            picks.append(int(w[5]))
            norms.append([float(x) for x in w[7:]])
        elif w[:2] == ["hellaswag", "acc_norm"]:
            summary = (float(w[2]), int(w[4]), int(w[6]))
    assert summary is not None, f"no 'hellaswag acc_norm' line in:\n{text}"
    return np.array(norms), labels, picks, summary


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, cwd=ROOT, **kw)


@functools.lru_cache(maxsize=None)
def numpy_reference(model_path):
    examples = byte_examples()
    norms, picks = numpy_scores(model_path, examples)
    labels = [label for label, _, _ in examples]
    # the fixture must be able to tell a right answer from a wrong one at fp32 precision
    gaps = np.sort(norms, axis=1)[:, 1] - np.sort(norms, axis=1)[:, 0]
    assert gaps.min() > 1e-4, f"fixture too close to a tie: smallest margin {gaps.min():.2e}"
    correct = int(sum(int(p) == label for p, label in zip(picks, labels)))
    return dict(norms=norms, picks=[int(p) for p in picks], labels=labels, correct=correct, n=len(examples))


@pytest.fixture(scope="module")
def reference():
    return numpy_reference(MODEL)


# one example per pass, two, and a batch that is not a multiple of 4; and a GQA + window model
@pytest.mark.parametrize("model,B", [(MODEL, 4), (MODEL, 8), (MODEL, 10), (GQA_MODEL, 8)])
def test_cpu_scores_match_numpy(model, B):
    reference = numpy_reference(model)
    p = run([scores_binary(), model, EVAL, B])
    assert p.returncode == 0, p.stderr
    norms, labels, picks, (acc, correct, n) = parse_scores(p.stdout)
    assert labels == reference["labels"] and n == reference["n"]
    np.testing.assert_allclose(norms, reference["norms"], **TOL)
    assert picks == reference["picks"]
    assert correct == reference["correct"] and abs(acc - correct / n) < 1e-6


def test_cpu_scores_match_pytorch(reference):
    torch_python = os.environ.get("TORCH_PYTHON", sys.executable)
    if run([torch_python, "-c", "import torch"]).returncode != 0:
        pytest.skip("PyTorch is not installed (the numpy reference still ran); TORCH_PYTHON=python-with-torch")
    ref = run([torch_python, "scripts/train_gpt2.py", "--load", MODEL, "--hellaswag", EVAL])
    assert ref.returncode == 0, ref.stderr
    t_norms, t_labels, t_picks, t_summary = parse_scores(ref.stdout)
    ours = run([scores_binary(), MODEL, EVAL, 8])
    assert ours.returncode == 0, ours.stderr
    norms, labels, picks, summary = parse_scores(ours.stdout)
    np.testing.assert_allclose(norms, t_norms, **TOL)
    assert (labels, picks, summary[1:]) == (t_labels, t_picks, t_summary[1:])
    np.testing.assert_allclose(t_norms, reference["norms"], rtol=1e-9, atol=1e-9)  # the two fp64 references agree


# ---------------------------------------------------------------- the CPU trainer
def token_shard(tmp_path, vocab=250, n=4096):
    path = tmp_path / "train_000001.bin"
    fmt.write_shard(str(path), np.random.default_rng(0).integers(0, vocab, n).astype(np.uint16), vocab)
    return path


def trainer(tmp_path, *flags):
    if not TRAINER.exists():
        pytest.fail(f"{TRAINER} is missing: make build/train_gpt2_cpu")
    return run([TRAINER, "--train", token_shard(tmp_path), "--init", MODEL, "--batch", 8, "--seq", 32, *flags])


def hellaswag_lines(text):
    """{step: (acc, correct, examples)} of the `step <n> hellaswag_acc <x> correct <n> examples <n>` lines."""
    out = {}
    for line in text.splitlines():
        w = line.split()
        if len(w) >= 8 and w[0] == "step" and w[2] == "hellaswag_acc":
            assert w[4] == "correct" and w[6] == "examples", line
            out[int(w[1])] = (float(w[3]), int(w[5]), int(w[7]))
    return out


def test_trainer_logs_hellaswag(tmp_path, reference):
    log = tmp_path / "train.log"
    p = trainer(tmp_path, "--steps", 3, "--lr", 1e-2, "--hellaswag", EVAL, "--hellaswag-every", 2, "--log", log)
    assert p.returncode == 0, p.stderr
    printed, logged = hellaswag_lines(p.stdout), hellaswag_lines(log.read_text())
    assert printed == logged and sorted(logged) == [0, 2, 3]  # every 2 steps and at the end
    acc, correct, n = logged[0]  # step 0: the model file itself, before any update
    assert (correct, n) == (reference["correct"], reference["n"]) and abs(acc - correct / n) < 1e-6
    # plot_log.py reads the new lines (it may lack matplotlib here: only its parser is used)
    import plot_log
    assert plot_log.parse_log(str(log))["hellaswag_acc"] == [(s, logged[s][0]) for s in (0, 2, 3)]


def test_trainer_default_scores_at_the_end_only(tmp_path):
    p = trainer(tmp_path, "--steps", 2, "--hellaswag", EVAL)
    assert p.returncode == 0, p.stderr
    assert sorted(hellaswag_lines(p.stdout)) == [2]


def one_line_error(p, *words):
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_trainer_hellaswag_errors(tmp_path):
    one_line_error(trainer(tmp_path, "--steps", 1, "--hellaswag-every", 5), "--hellaswag-every", "--hellaswag")
    one_line_error(run([TRAINER, "--train", token_shard(tmp_path), "--init", MODEL, "--batch", 3, "--seq", 32,
                        "--steps", 1, "--hellaswag", EVAL]), "--batch 3", "hellaswag.bin")
    one_line_error(run([TRAINER, "--train", token_shard(tmp_path), "--init", MODEL, "--batch", 8, "--seq", 16,
                        "--steps", 1, "--hellaswag", EVAL]), "--seq", "hellaswag.bin")
    one_line_error(trainer(tmp_path, "--steps", 1, "--hellaswag", tmp_path / "missing.bin"), "missing.bin")
    short = tmp_path / "short.bin"
    short.write_bytes(EVAL.read_bytes()[:-2])
    one_line_error(trainer(tmp_path, "--steps", 1, "--hellaswag", short), "short.bin", "truncated")
    # a file of another tokenizer: a larger vocabulary than the model's (an id it cannot embed), or a
    # smaller one (ids that fit but mean other tokens), unless --data-vocab names that vocabulary
    big = tmp_path / "big.bin"
    label, ctx, ends = byte_examples()[0]
    hellaswag.write_eval(big, [(label, ctx, [ends[0], ends[1], ends[2], ends[3][:-1] + [251]])], 300)
    one_line_error(trainer(tmp_path, "--steps", 1, "--hellaswag", big), "big.bin", "vocab_size 300",
                   "larger than the model's vocab_size 250")
    small = tmp_path / "small.bin"
    hellaswag.write_eval(small, byte_examples(), 128)
    one_line_error(trainer(tmp_path, "--steps", 1, "--hellaswag", small), "small.bin", "vocab_size 128",
                   "the model's vocab_size is 250", "--data-vocab 128")
    p = run([TRAINER, "--train", token_shard(tmp_path, vocab=128), "--init", MODEL, "--batch", 8, "--seq", 32,
             "--steps", 1, "--hellaswag", small, "--data-vocab", 128])
    assert p.returncode == 0 and hellaswag_lines(p.stdout), p.stderr


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-fixture"]:
        sys.exit(__doc__)
    write_fixture(EVAL)
    print(f"wrote {EVAL.relative_to(ROOT)}")
