"""`--help` on every script prints its usage and does nothing else, also on a machine without
PyTorch (hidden here by a `torch` package on PYTHONPATH that fails to import, so the checks are the
same whether or not torch is installed); a bad argument is one `error:` line and a non-zero exit.
Run: python3 -m pytest -q tests/python/test_scripts_help.py  (a few seconds)"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# (script that writes a committed op fixture, the fixture, the script's flags that make it quick)
FIXTURE_SCRIPTS = [
    ("make_attention_fixture.py", "attention.bin", []),
    ("make_llama_ops_fixture.py", "llama_ops.bin", ["--no-transformers"]),
]


@pytest.fixture
def no_torch(tmp_path):
    """Environment in which `import torch` fails as if PyTorch were not installed."""
    fake = tmp_path / "no_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'torch' (hidden by the test)\")\n")
    return dict(os.environ, PYTHONPATH=str(fake.parent))


@pytest.fixture
def tripwire(tmp_path):
    """(PATH with a python3 that only records that it ran, the record's path)."""
    bin_dir = tmp_path / "tripwire"
    bin_dir.mkdir()
    record = tmp_path / "python3_ran"
    exe = bin_dir / "python3"
    exe.write_text(f"#!/bin/sh\necho \"$@\" >> '{record}'\nexit 1\n")
    exe.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}", record


def run(cmd, env=None):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)


def assert_one_line_error(p, *parts):
    assert p.returncode != 0, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])


def test_train_gpt2_help_without_torch(no_torch):
    p = run([sys.executable, "scripts/train_gpt2.py", "--help"], no_torch)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: train_gpt2.py") and "--write-model" in p.stdout and not p.stderr
    # a real mode says what is missing, in one line
    p = run([sys.executable, "scripts/train_gpt2.py", "--model", "d2", "--write-model", "unused.bin"], no_torch)
    assert_one_line_error(p, "train_gpt2.py needs PyTorch", "pip install torch")
    assert not (ROOT / "unused.bin").exists()


def test_bench_hf_help_without_torch(no_torch):
    p = run([sys.executable, "scripts/bench_hf.py", "--help"], no_torch)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: bench_hf.py") and "--kv-heads" in p.stdout and not p.stderr
    p = run([sys.executable, "scripts/bench_hf.py", "--heads", "5"], no_torch)  # 768 channels
    assert p.returncode != 0 and "--channels 768 must be a multiple of --heads 5" in p.stderr
    p = run([sys.executable, "scripts/bench_hf.py", "--steps", "3", "--device", "cpu"], no_torch)
    assert_one_line_error(p, "bench_hf.py needs torch and transformers")


def test_bench_nanogpt_help_without_torch(no_torch):
    p = run([sys.executable, "scripts/bench_nanogpt.py", "--help"], no_torch)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: bench_nanogpt.py") and "--compile" in p.stdout and not p.stderr
    p = run([sys.executable, "scripts/bench_nanogpt.py", "--model", "d0"], no_torch)
    assert p.returncode != 0 and "--model d0: not a model descriptor" in p.stderr
    p = run([sys.executable, "scripts/bench_nanogpt.py", "--seq", "2048"], no_torch)
    assert p.returncode != 0 and "--seq 2048 exceeds --max-seq 1024" in p.stderr
    p = run([sys.executable, "scripts/bench_nanogpt.py", "--steps", "3"], no_torch)
    assert p.returncode != 0 and "--steps 3: needs more than 3 steps" in p.stderr
    p = run([sys.executable, "scripts/bench_nanogpt.py", "--device", "cpu", "--model", "d2", "--steps", "4"], no_torch)
    assert_one_line_error(p, "bench_nanogpt.py needs PyTorch", "pip install torch")


@pytest.mark.parametrize("script,fixture,_", FIXTURE_SCRIPTS, ids=[s for s, _, _ in FIXTURE_SCRIPTS])
@pytest.mark.parametrize("hide_torch", [True, False], ids=["without_torch", "as_installed"])
def test_make_fixture_help_writes_nothing(no_torch, hide_torch, script, fixture, _):
    fixture = ROOT / "tests" / "fixture" / fixture
    before = (fixture.stat().st_mtime_ns, fixture.read_bytes())
    p = run([sys.executable, f"tests/fixture/{script}", "--help"], no_torch if hide_torch else None)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: {script}") and "--out" in p.stdout
    p = run([sys.executable, f"tests/fixture/{script}", "--bogus"], no_torch if hide_torch else None)
    assert p.returncode == 2 and "unrecognized arguments: --bogus" in p.stderr
    assert (fixture.stat().st_mtime_ns, fixture.read_bytes()) == before, "the committed fixture was rewritten"
    assert not fixture.with_name(fixture.name + ".tmp").exists()


@pytest.mark.parametrize("script,fixture,flags", FIXTURE_SCRIPTS, ids=[s for s, _, _ in FIXTURE_SCRIPTS])
def test_make_fixture_out_reproduces_committed_file(tmp_path, script, fixture, flags):
    pytest.importorskip("torch")
    out = tmp_path / fixture
    p = run([sys.executable, f"tests/fixture/{script}", "--out", out, *flags])
    assert p.returncode == 0, p.stderr
    assert out.read_bytes() == (ROOT / "tests" / "fixture" / fixture).read_bytes()


def test_bench_gpt2_help(tmp_path, tripwire):
    path, record = tripwire
    env = dict(os.environ, PATH=path, BENCH_PYTHON="python3", BENCH_BIN=str(tmp_path / "absent"),
               BENCH_OUT=str(tmp_path / "bench"))
    p = run(["scripts/bench_train.sh", "--help"], env)
    assert p.returncode == 0, p.stderr
    assert "BENCH_STEPS" in p.stdout and "Usage: scripts/bench_train.sh" in p.stdout
    assert not record.exists() and not (tmp_path / "bench").exists(), "--help ran the benchmark"
    p = run(["scripts/bench_train.sh", "--steps", "3"], env)
    assert_one_line_error(p, "--steps: unknown argument", "BENCH_")
    for var in ("BENCH_REF", "BENCH_EAGER", "BENCH_FP8"):
        p = run(["scripts/bench_train.sh"], dict(env, **{var: "2"}))
        assert_one_line_error(p, f"{var}='2': expected 0 or 1")
    assert not record.exists()


def test_get_cudnn_frontend_help_downloads_nothing(tripwire):
    path, record = tripwire
    env = dict(os.environ, PATH=path)
    p = run(["scripts/get_cudnn_frontend.sh", "--help"], env)
    assert p.returncode == 0, p.stderr
    assert "Usage: scripts/get_cudnn_frontend.sh" in p.stdout and "cudnn_frontend/include" in p.stdout
    assert not record.exists(), "--help started a download"
    p = run(["scripts/get_cudnn_frontend.sh", "--force"], env)
    assert_one_line_error(p, "--force: unknown argument")
    assert not record.exists()


def test_data_script_help_texts():
    """What --help says matches what the script does: tokenize_prompt.py requires --tokenizer and
    writes no shards (its --tokenizer text is its own, not the data scripts'); fineweb.py names the
    offline file --edu looks for as well as the plain one."""
    p = run([sys.executable, "scripts/tokenize_prompt.py", "--help"])
    assert p.returncode == 0, p.stderr
    options = p.stdout.split("options:")[1]
    tokenizer = " ".join(options.split("--tokenizer")[1].split("--doc-token")[0].split())
    assert "required" in tokenizer and "instead of GPT-2" not in tokenizer and "shard" not in options, options
    p = run([sys.executable, "scripts/tokenize_prompt.py", "hello"])
    assert_one_line_error(p, "--tokenizer FILE (a tokenizer.json) is required")
    p = run([sys.executable, "scripts/data/fineweb.py", "--help"])
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    assert "$LLMC_OFFLINE_DATA/fineweb[.txt|.jsonl|.json|.parquet]" in text
    assert "with --edu $LLMC_OFFLINE_DATA/edu_fineweb[.txt|.jsonl|.json|.parquet]" in text
