"""scripts/bench_generate_fast.py --check on tiny GPT-2 and Llama shapes (fp32, CPU, no compile): the
decoder's greedy tokens equal transformers' generate and its logits at every step equal the full
forward within 1e-4; a decoder with a wrong RoPE pairing or a dropped bias fails the check; --help and
flag errors work without torch. Run: python3 -m pytest -q tests/python/test_bench_generate_fast.py"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_generate_fast.py"
TINY = ["--layers", "2", "--channels", "64", "--heads", "4", "--hidden", "128", "--vocab", "300",
        "--prompt", "8", "--new", "12", "--check", "--compile", "0"]
SHAPES = {"gpt2": TINY, "llama": TINY + ["--kv-heads", "2"]}


@pytest.fixture(scope="module")
def fast():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(SCRIPT.parent))
    import bench_generate_fast
    return bench_generate_fast


@pytest.mark.parametrize("arch", sorted(SHAPES))
def test_check_passes(fast, arch, capsys):
    fast.main(["--arch", arch] + SHAPES[arch])
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"CHECK_FAST arch={arch}") and "tokens_equal=1" in line and line.endswith("PASS"), line


def test_check_fails_on_wrong_rope_pairing(fast, monkeypatch, capsys):
    import torch

    def interleaved(x, cos, sin):  # pairs (2i, 2i+1) instead of (i, i + HD/2)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)
        return x * cos[:, None] + rotated * sin[:, None]

    monkeypatch.setattr(fast, "rotate", interleaved)
    with pytest.raises(SystemExit) as e:
        fast.main(["--arch", "llama"] + SHAPES["llama"])
    assert e.value.code == 1 and capsys.readouterr().out.strip().endswith("FAIL")


def test_check_fails_without_a_bias(fast, monkeypatch, capsys):
    load = fast.Decoder.load_ours
    monkeypatch.setattr(fast.Decoder, "load_ours",
                        lambda self, params: load(self, dict(params, fcb=params["fcb"] * 0)))
    with pytest.raises(SystemExit) as e:
        fast.main(["--arch", "gpt2"] + SHAPES["gpt2"])
    assert e.value.code == 1 and capsys.readouterr().out.strip().endswith("FAIL")


def test_help_and_flag_errors_without_torch(tmp_path):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'torch' (hidden by the test)\")\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))

    def run(*flags):
        return subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, env=env,
                              timeout=60)

    p = run("--help")
    assert p.returncode == 0 and p.stdout.startswith("usage: bench_generate_fast.py") and "--check" in p.stdout
    for flags, msg in ((["--new", "1"], "--new 1: must be at least 2"), (["--batch", "0"], "batch sizes must be"),
                       (["--heads", "5"], "heads must divide channels"), (["--device", "cpu"], "needs PyTorch")):
        p = run(*flags)
        lines = p.stderr.strip().splitlines()
        assert p.returncode != 0 and "error: " in lines[-1] and msg in lines[-1], (flags, p.stderr)


def test_generate_vs_fast_table(tmp_path):
    """dev/bench/generate_vs_fast.sh's table from stub programs: ours B * 1000 tok/s, fast B * 400 except
    B = 2 (no line: shown as -, exit status 1), each row's ratio ours/fast."""
    gen, py = tmp_path / "generate", tmp_path / "python"
    gen.write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = --batch ] && b=$2; shift; done\n"
                   "echo \"BENCH_GEN B=$b prompt=64 new=256 prefill_ms=1 ms_per_token=1 tok_s=$((b * 1000)) graph=1\"\n")
    py.write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do case $1 in --arch) a=$2;; --batch) shift;"
                  " while [ $# -gt 0 ] && [ \"${1#--}\" = \"$1\" ]; do [ $1 != 2 ] && echo \"BENCH_FAST arch=$a B=$1"
                  " prompt=64 new=256 prefill_ms=1 ms_per_token=1 tok_s=$(($1 * 400)) compile=1\"; shift; done;"
                  " continue;; esac; shift; done\n")
    gen.chmod(0o755)
    py.chmod(0o755)
    env = dict(os.environ, GEN=str(gen), PYTHON=str(py), BATCHES="1 2 16", LOGS=str(tmp_path / "logs"))
    p = subprocess.run([str(ROOT / "dev" / "bench" / "generate_vs_fast.sh")], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 1, p.stderr  # B = 2's missing figure
    rows = [line.split() for line in p.stdout.splitlines()[1:] if not line.startswith("logs:")]
    assert rows == [["gpt2", "1", "1000", "400", "2.50"], ["gpt2", "2", "2000", "-", "-"],
                    ["gpt2", "16", "16000", "6400", "2.50"], ["llama", "1", "1000", "400", "2.50"],
                    ["llama", "2", "2000", "-", "-"], ["llama", "16", "16000", "6400", "2.50"]], p.stdout
