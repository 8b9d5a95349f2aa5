"""dev/bench/muon_sweep.sh and dev/muon_sweep_summary.py: Muon against AdamW over one epoch.
- the summary on synthetic logs whose val losses lie on straight lines between val points, so the tokens and
  seconds at which a run reaches the best AdamW run's final val loss are known exactly: a Muon run that
  reaches it within the bound (YES), past the bound (NO), never (NO, said so), a diverged run (nan) that
  never wins; a missing, empty, misnamed or val-less log and bad flags are one error line;
- the sweep end to end with build/train_gpt2_cpu on a tiny model: from a folder of shards (one epoch counted
  from the shard headers) and from a .jsonl.xz corpus sharded by scripts/data/fineweb.py (a synthetic GPT-2
  ranks file beside it), one lr each: a table of two rows and a verdict line.
Run: python3 -m pytest -q tests/python/test_muon_sweep.py  (a few seconds)"""
import base64
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import llmc_formats  # noqa: E402

SUMMARY = ROOT / "dev" / "muon_sweep_summary.py"
SWEEP = ROOT / "dev" / "bench" / "muon_sweep.sh"
CPU_TRAINER = ROOT / "build" / "train_gpt2_cpu"


def write_log(path, vals, ms=100.0, steps=10, tokens_per_step=1000):
    """A trainer --log: steps 1..steps of `ms` each at tokens_per_step tokens, and the val losses {step: loss}."""
    lines = [f"step {s} val_loss {vals[s]}" for s in vals if s == 0]
    for s in range(1, steps + 1):
        lines.append(f"step {s} train_loss 4.0 lr 1e-3 ms {ms:.3f} tok_s {tokens_per_step / (ms / 1000):.1f}")
        if s in vals:
            lines.append(f"step {s} val_loss {vals[s]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def summarize(*args):
    return subprocess.run([sys.executable, str(SUMMARY), *map(str, args)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def table_rows(stdout):
    return [line for line in stdout.splitlines() if line.startswith("| adamw") or line.startswith("| muon")]


def test_summary_interpolates_the_crossing(tmp_path):
    # best AdamW: 3.0 at step 10 = 10000 tokens, 1.0 s. Muon lr 0.02: 3.5 at step 5, 2.5 at step 10, so 3.0 at
    # step 7.5 = 7500 tokens (0.75x); its steps take 110 ms, so 0.825 s (0.825x)
    logs = [write_log(tmp_path / "adamw_lr6e-4.log", {0: 5.0, 5: 4.0, 10: 3.0}),
            write_log(tmp_path / "adamw_lr3e-4.log", {0: 5.0, 5: 4.5, 10: 3.5}),
            write_log(tmp_path / "muon_lr0.02.log", {0: 5.0, 5: 3.5, 10: 2.5}, ms=110.0),
            write_log(tmp_path / "muon_lr0.04.log", {0: 5.0, 5: 4.0, 10: 3.2}, ms=110.0),
            write_log(tmp_path / "muon_lr0.08.log", {0: 5.0, 5: "nan", 10: "nan"}, ms=110.0)]
    p = summarize(*logs, "--skip", 2)
    assert p.returncode == 0, p.stderr
    rows = table_rows(p.stdout)
    assert len(rows) == 5, p.stdout
    assert rows[0] == "| adamw lr 6e-4 (best) | 3.0000 | 3.0000 | 10 | 10000 | 100.0 | 10000 | 1.000 | 10000 | 1.000 |"
    assert rows[1].startswith("| adamw lr 3e-4 | 3.5000 |") and rows[1].endswith("| never | never |")
    assert rows[2] == "| muon lr 0.02 (best) | 2.5000 | 2.5000 | 10 | 10000 | 110.0 | 9091 | 1.100 | 7500 | 0.825 |"
    assert rows[3].endswith("| never | never |") and rows[4].startswith("| muon lr 0.08 | nan |"), p.stdout
    assert "target: adamw lr 6e-4's final val loss 3.0000, at 10000 tokens and 1.000 s" in p.stdout
    assert "throughput: muon lr 0.02 9091 tok/s = 0.91x adamw's 10000" in p.stdout
    assert p.stdout.rstrip().endswith("verdict: YES: muon reaches adamw's final val loss in 0.750x its tokens "
                                      "(<= 0.8x) and 0.825x its wall time"), p.stdout


def test_summary_past_the_bound_and_never(tmp_path):
    adamw = write_log(tmp_path / "adamw_lr6e-4.log", {0: 5.0, 5: 4.0, 10: 3.0})
    # 4.5 at step 5, 2.625 at step 10: 3.0 at step 9 = 0.9x
    late = write_log(tmp_path / "muon_lr0.02.log", {0: 5.0, 5: 4.5, 10: 2.625})
    p = summarize(adamw, late)
    assert p.returncode == 0, p.stderr
    assert "muon lr 0.02 reaches 3.0000 at 9000 tokens = 0.900x adamw's, and at 0.900 s = 0.900x" in p.stdout
    assert "verdict: NO: muon reaches adamw's final val loss in 0.900x its tokens (> 0.8x)" in p.stdout
    p = summarize(adamw, late, "--ratio", 0.95)
    assert "verdict: YES" in p.stdout and "(<= 0.95x)" in p.stdout
    never = write_log(tmp_path / "muon_lr0.04.log", {0: 5.0, 5: 4.0, 10: 3.2})
    p = summarize(adamw, never)
    assert p.returncode == 0, p.stderr
    assert len(table_rows(p.stdout)) == 2
    assert p.stdout.rstrip().endswith("verdict: NO: muon lr 0.04 never reaches 3.0000 (its best val loss: 3.2000)")


def test_summary_tokens_per_step_flag_and_first_point(tmp_path):
    # a run already at the target at step 0 reaches it at 0 tokens; --tokens-per-step overrides the log's
    adamw = write_log(tmp_path / "adamw_lr6e-4.log", {0: 5.0, 10: 3.0})
    muon = write_log(tmp_path / "muon_lr0.02.log", {0: 2.0, 10: 1.0})
    p = summarize(adamw, muon, "--tokens-per-step", 64)
    assert p.returncode == 0, p.stderr
    assert "at 640 tokens and 1.000 s" in p.stdout and "reaches 3.0000 at 0 tokens = 0.000x" in p.stdout


@pytest.mark.parametrize("case,expect", [
    ("missing", "cannot read"),
    ("empty", "no 'step <n> train_loss <x>' or 'step <n> val_loss <x>' lines"),
    ("misnamed", "expected a log named adamw_lr<lr>.log or muon_lr<lr>.log"),
    ("no_val", "no 'step <n> val_loss <x>' lines"),
    ("no_muon", "no muon log with a finite final val loss"),
])
def test_summary_bad_logs_are_one_error_line(tmp_path, case, expect):
    adamw = write_log(tmp_path / "adamw_lr6e-4.log", {0: 5.0, 10: 3.0})
    bad = tmp_path / ("run.log" if case == "misnamed" else "muon_lr0.02.log")
    if case == "empty":
        bad.write_text("")
    elif case in ("misnamed", "no_val"):
        write_log(bad, {} if case == "no_val" else {10: 3.0})
    logs = [adamw] if case == "no_muon" else [adamw, bad]
    p = summarize(*logs)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and p.stdout == "" and len(lines) == 1, (p.returncode, p.stdout, p.stderr)
    assert lines[0].startswith("error: ") and expect in lines[0], lines[0]
    if case != "no_muon":
        assert str(bad) in lines[0]


@pytest.mark.parametrize("flag,value,expect", [
    ("--tokens-per-step", "0", "--tokens-per-step 0: must be >= 1"),
    ("--skip", "-1", "--skip -1: must be >= 0"),
    ("--ratio", "0", "--ratio 0.0: must be > 0"),
])
def test_summary_bad_flags(tmp_path, flag, value, expect):
    p = summarize(write_log(tmp_path / "adamw_lr6e-4.log", {0: 5.0, 10: 3.0}), flag, value)
    assert p.returncode == 1 and p.stderr.strip() == f"error: {expect}", p.stderr


def sweep(corpus, out, **env):
    """dev/bench/muon_sweep.sh on the CPU trainer, one lr each, --val-every 4."""
    env = {**os.environ, "TRAINER": str(CPU_TRAINER), "B": "2", "T": "32", "WARMUP": "2", "VAL_EVERY": "4",
           "VAL_STEPS": "2", "ADAMW_LRS": "1e-2", "MUON_LRS": "0.05", "MUON_ADAMW_LR": "1e-2", "OMP_NUM_THREADS": "1",
           **env}
    return subprocess.run([str(SWEEP), str(corpus), str(out)], capture_output=True, text=True, env=env, timeout=120,
                          cwd=ROOT)


def assert_two_runs_and_a_verdict(p, out):
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(table_rows(p.stdout)) == 2, p.stdout
    assert [line for line in p.stdout.splitlines() if line.startswith("verdict: ")], p.stdout
    assert (out / "adamw_lr1e-2.log").is_file() and (out / "muon_lr0.05.log").is_file()
    assert "--optimizer muon --muon-lr 0.05 --lr 1e-2" in (out / "muon_lr0.05.cmd").read_text()
    assert (out / "summary.md").read_text() in p.stdout


@pytest.mark.skipif(not CPU_TRAINER.exists(), reason="build/train_gpt2_cpu not built (make build/train_gpt2_cpu)")
def test_sweep_on_shards_runs_one_epoch(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    cycle = lambda n: np.arange(n) % 16  # noqa: E731 (a pattern the tiny model learns within the epoch)
    llmc_formats.write_shard(str(data / "tiny_val_000000.bin"), cycle(1000), 256)
    llmc_formats.write_shard(str(data / "tiny_train_000001.bin"), cycle(641), 256)  # 10 windows of B*T+1 = 65
    llmc_formats.write_shard(str(data / "tiny_train_000002.bin"), cycle(200), 256)  # 3
    out = tmp_path / "out"
    p = sweep(data, out, MODEL="llama:L2,C32,H2,V256")
    assert_two_runs_and_a_verdict(p, out)
    assert "13 steps of B*T tokens" in p.stdout
    assert "step 13 val_loss" in (out / "muon_lr0.05.log").read_text()


@pytest.mark.skipif(not CPU_TRAINER.exists(), reason="build/train_gpt2_cpu not built (make build/train_gpt2_cpu)")
def test_sweep_shards_a_jsonl_xz_corpus(tmp_path):
    pytest.importorskip("tiktoken")
    # GPT-2's 50256 ranks in form, not in content: the 256 bytes, then byte pairs
    pairs = [bytes([a, b]) for a in range(256) for b in range(256)]
    ranks = [bytes([b]) for b in range(256)] + pairs[:50256 - 256]
    (tmp_path / "gpt2.tiktoken").write_text("".join(f"{base64.b64encode(t).decode()} {i}\n"
                                                    for i, t in enumerate(ranks)))
    docs = [{"text": f"document {i}: the cat sat on the mat. " * 8} for i in range(40)]
    corpus = tmp_path / "corpus.jsonl.xz"
    corpus.write_bytes(lzma.compress("".join(json.dumps(d) + "\n" for d in docs).encode()))
    out = tmp_path / "out"
    p = sweep(corpus, out, MODEL="gpt2:L1,C32,H2", SHARD_SIZE="2000", STEPS="6")
    assert_two_runs_and_a_verdict(p, out)
    shards = out / "data" / "fineweb"
    assert (shards / "fineweb_val_000000.bin").is_file() and (shards / "fineweb_train_000002.bin").is_file()


def test_sweep_bad_corpus_and_steps(tmp_path):
    p = sweep(tmp_path / "absent", tmp_path / "out", TRAINER="/bin/true")
    assert p.returncode == 1 and p.stderr.strip() == f"CORPUS={tmp_path / 'absent'}: no such file or folder"
    p = sweep(tmp_path, tmp_path / "out", TRAINER="/bin/true")
    assert p.returncode == 1 and "no *train_*.bin and *val_*.bin shards" in p.stderr
    p = sweep(tmp_path, tmp_path / "out", TRAINER=str(tmp_path / "absent"))
    assert p.returncode == 1 and "not an executable" in p.stderr
    p = subprocess.run([str(SWEEP)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "dev/bench/muon_sweep.sh CORPUS [OUT]" in p.stderr and not p.stdout
    p = subprocess.run([str(SWEEP), "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0 and "MUON_LRS" in p.stdout and not p.stderr
    p = subprocess.run([str(SWEEP), "a", "b", "c"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and p.stderr == "dev/bench/muon_sweep.sh CORPUS [OUT]: 3 arguments given\n"
