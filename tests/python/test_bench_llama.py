"""scripts/bench_llama.py, the torchtitan-style Llama anchor: --check agrees with our reference
(scripts/train_gpt2.py --arch llama) for multi-head and grouped-query models with tied and untied
heads, and fails when the RoPE pairing, the key/value grouping, the SwiGLU order, the norm's eps or
RoPE's theta is wrong; a tiny CPU run ends in a well-formed BENCH line; a bad flag is one error line;
scripts/bench_train.sh runs the titan rows for BENCH_ARCH=llama and counts them as PyTorch rows.
Run: python3 -m pytest -q tests/python/test_bench_llama.py  (about 10 s)"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
torch = pytest.importorskip("torch")
import bench_llama  # noqa: E402

CASES = ("mha_tied", "mha_untied", "gqa_tied", "gqa_untied")
TINY = ["--device", "cpu", "--layers", "2", "--channels", "48", "--heads", "4", "--kv-heads", "2",
        "--mlp-hidden", "64", "--vocab", "300", "--max-seq", "32", "--batch", "2", "--seq", "16", "--steps", "4",
        "--compile", "0"]


def run_main(argv, capsys):
    """(exit status, stdout lines, stderr lines) of bench_llama.main(argv) in this process."""
    try:
        bench_llama.main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def check_verdicts(capsys):
    """(exit status, {(case, gqa path): "ok" | "MISMATCH"}) of --check."""
    code, out, err = run_main(["--check"], capsys)
    assert not err, err
    verdicts = {}
    for line in out:
        m = re.fullmatch(r"check (\w+) gqa=(sdpa|repeat): loss \S+ vs reference \S+ \(rel \S+\), "
                         r"logits max rel \S+: (ok|MISMATCH)", line)
        assert m, line
        verdicts[m[1], m[2]] = m[3]
    return code, verdicts


def test_check_matches_the_reference(capsys):
    code, verdicts = check_verdicts(capsys)
    assert code == 0 and set(verdicts.values()) == {"ok"}, verdicts
    assert {case for case, _ in verdicts} == set(CASES)
    assert ("gqa_tied", "repeat") in verdicts and ("gqa_untied", "sdpa") in verdicts


def rope_adjacent_pairs(x, cos, sin):  # pairs (x_2i, x_2i+1), Meta's complex form, not rotate_half
    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin = cos[:, None], sin[:, None]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2).type_as(x)


def attention_tiled_kv(q, k, v, gqa):  # query head h reads key/value head h % KV, not h // (NH/KV)
    group = q.size(1) // k.size(1)
    k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def swiglu_on_up(self, x):  # silu on the second half instead of the first
    gate, up = self.w13(x).chunk(2, dim=-1)
    return self.w2(gate * torch.nn.functional.silu(up))


@pytest.mark.parametrize("target,mutant,broken", [
    ("apply_rope", rope_adjacent_pairs, CASES),
    ("attention", attention_tiled_kv, ("gqa_tied", "gqa_untied")),
    ("FeedForward.forward", swiglu_on_up, CASES),
    ("NORM_EPS", 1e-6, CASES),
    ("ROPE_THETA", 500000.0, CASES),
], ids=["rope_pairing", "kv_grouping", "swiglu_order", "norm_eps", "rope_theta"])
def test_check_catches_mutant(capsys, monkeypatch, target, mutant, broken):
    owner, _, name = target.rpartition(".")
    monkeypatch.setattr(getattr(bench_llama, owner) if owner else bench_llama, name, mutant)
    code, verdicts = check_verdicts(capsys)
    assert code == 1, verdicts
    for (case, gqa), verdict in verdicts.items():
        assert verdict == ("MISMATCH" if case in broken else "ok"), (case, gqa, verdict)


@pytest.mark.parametrize("flags", [[], ["--tied", "0", "--gqa", "repeat"]], ids=["tied_sdpa", "untied_repeat"])
def test_cpu_run_prints_bench_line(capsys, flags):
    code, out, err = run_main(TINY + flags, capsys)
    assert code == 0 and not err, err
    steps = [line for line in out if line.startswith("step ")]
    assert len(steps) == 4 and steps[0].endswith("(warm-up)") and not steps[3].endswith("(warm-up)"), out
    assert re.fullmatch(r"BENCH name=titan_eager ms=[0-9]+\.[0-9]{2} tok_s=[0-9]+ peak_gib=nan", out[-1]), out[-1]


@pytest.mark.parametrize("flags,message", [
    (["--kv-heads", "5"], "--kv-heads 5 must divide --heads 12"),
    (["--channels", "36", "--heads", "4"], "RoPE needs an even head dim"),
    (["--steps", "3"], "--steps 3: needs more than 3 steps"),
    (["--device", "tpu"], "invalid choice: 'tpu'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_flag_is_one_error_line(capsys, flags, message):
    code, out, err = run_main(flags, capsys)
    assert code != 0 and not out, out
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_help_and_errors_without_torch(tmp_path):
    """As a script: --help needs no PyTorch, a run without it is one line, a bad flag exits non-zero."""
    fake = tmp_path / "no_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'torch' (hidden by the test)\")\n")
    env = dict(os.environ, PYTHONPATH=str(fake.parent))
    script = [sys.executable, "scripts/bench_llama.py"]
    p = subprocess.run(script + ["--help"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("usage: bench_llama.py") and "--gqa" in p.stdout, p.stderr
    p = subprocess.run(script + ["--check"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert p.returncode == 1 and p.stderr.strip() == ("error: scripts/bench_llama.py needs PyTorch (pip install "
                                                      "torch); only --help works without it"), p.stderr
    p = subprocess.run(script + ["--heads", "0"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert p.returncode == 1 and p.stderr == "error: --heads must be positive, got 0\n" and not p.stdout


@pytest.mark.parametrize("eager", ["0", "1"])
def test_bench_train_runs_titan_rows(tmp_path, eager):
    """BENCH_ARCH=llama with a stand-in python3 that prints a BENCH line per script (titan fastest):
    the titan rows run with the Llama shape flags and the fastest PyTorch row is titan_compile."""
    record = tmp_path / "calls"
    fake = tmp_path / "python3"
    fake.write_text(f"""#!/bin/bash
echo "$@" >> '{record}'
name=eager; tok=100
case "$*" in *bench_llama.py*) name=titan; tok=900 ;; *bench_hf.py*) name=hf; tok=300 ;; esac
echo "BENCH name=$name ms=1.00 tok_s=$tok peak_gib=1.00"
""")
    fake.chmod(0o755)
    env = dict(os.environ, BENCH_ARCH="llama", BENCH_PYTHON=str(fake), BENCH_BIN=str(tmp_path / "absent"),
               BENCH_OUT=str(tmp_path / "bench"), BENCH_EAGER=eager, BENCH_STEPS="4")
    p = subprocess.run(["scripts/bench_train.sh"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {line.split("|")[0].strip(): line for line in p.stdout.splitlines() if "|" in line}
    assert {"eager", "compile", "hf_eager", "hf_compile", "titan_compile"} <= set(rows), p.stdout
    assert ("titan_eager" in rows) == (eager == "1"), p.stdout
    assert "fastest PyTorch: titan_compile (900 tok/s)" in p.stdout, p.stdout
    titan_calls = [line.split() for line in record.read_text().splitlines() if "bench_llama.py" in line]
    assert [c[c.index("--compile") + 1] for c in titan_calls] == ["1", "0"][:1 + (eager == "1")]
    for call in titan_calls:
        assert " ".join(call[1:]).startswith("--device cuda --layers 12 --channels 768 --heads 12 --kv-heads 4 "
                                             "--mlp-hidden 2048 --vocab 50304 --max-seq 1024 --batch 64 --seq 1024 "
                                             "--steps 4"), call
