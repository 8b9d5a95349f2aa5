"""scripts/plot_log.py's x axes: --x step leaves the points alone, --x tokens puts them at step * tokens per step
(tok_s * ms / 1000 from the log, or --tokens-per-step), --x seconds at the summed step ms of steps 1..n; a log
without the step times is one error line. The data functions are checked here without matplotlib; the PNG
only where matplotlib imports.
Run: python3 -m pytest -q tests/python/test_plot_log.py  (about a second)"""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import plot_log  # noqa: E402

# 64 tokens a step; steps of 100, 200, 300, 400 ms
LOG = """step 0 val_loss 5.5
step 1 train_loss 5.0 lr 1e-3 ms 100.000 tok_s 640.0
step 2 train_loss 4.0 lr 1e-3 ms 200.000 tok_s 320.0
step 2 val_loss 4.5
step 3 train_loss 3.0 lr 1e-3 ms 300.000 tok_s 213.3
step 4 train_loss 2.0 lr 1e-3 ms 400.000 tok_s 160.0
step 4 val_loss 2.5
step 4 hellaswag_acc 0.3 correct 3 examples 10
"""


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "run.log"
    path.write_text(LOG)
    return str(path)


def test_x_step_is_unchanged(log):
    series = plot_log.parse_log(log)
    assert plot_log.against(log, series, "step") == series
    assert series["val_loss"] == [(0, 5.5), (2, 4.5), (4, 2.5)]


def test_x_tokens_from_the_log_and_from_the_flag(log):
    series = plot_log.parse_log(log)
    assert plot_log.log_tokens_per_step(log, series) == 64
    tokens = plot_log.against(log, series, "tokens")
    assert tokens["val_loss"] == [(0, 5.5), (128, 4.5), (256, 2.5)]
    assert tokens["train_loss"] == [(64, 5.0), (128, 4.0), (192, 3.0), (256, 2.0)]
    assert tokens["hellaswag_acc"] == [(256, 0.3)]
    assert plot_log.against(log, series, "tokens", 1000)["val_loss"] == [(0, 5.5), (2000, 4.5), (4000, 2.5)]


def test_x_seconds_sums_the_step_times(log):
    seconds = plot_log.against(log, plot_log.parse_log(log), "seconds")
    assert seconds["val_loss"] == [(0, 5.5), (pytest.approx(0.3), 4.5), (pytest.approx(1.0), 2.5)]
    assert [x for x, _ in seconds["train_loss"]] == pytest.approx([0.1, 0.3, 0.6, 1.0])


def run(*args):
    return subprocess.run([sys.executable, "scripts/plot_log.py", *map(str, args)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def test_a_log_without_step_times_is_one_error_line(tmp_path):
    path = tmp_path / "ref.log"
    path.write_text("step 0 val_loss 5.5\nstep 1 train_loss 5.0 lr 1e-3\nstep 1 val_loss 5.0\n")
    series = plot_log.parse_log(str(path))
    for x, expect in (("tokens", "no train lines with ms and tok_s"), ("seconds", "step 1 has no train line with ms")):
        with pytest.raises(SystemExit):
            plot_log.against(str(path), series, x)
        p = run(path, "--x", x, "-o", tmp_path / "out.png")
        lines = p.stderr.strip().splitlines()  # the logs are read before matplotlib is imported
        assert p.returncode == 1 and len(lines) == 1 and str(path) in lines[0] and expect in lines[0], p.stderr
    p = run(path, "--x", "tokens", "--tokens-per-step", "0")
    assert p.returncode == 2 and "--tokens-per-step must be >= 1, got 0" in p.stderr
    assert plot_log.against(str(path), series, "tokens", 10)["val_loss"] == [(0, 5.5), (10, 5.0)]


@pytest.mark.parametrize("x", ["tokens", "seconds"])
def test_png_against_tokens_and_seconds(tmp_path, log, x):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"{x}.png"
    p = run(log, "--x", x, "-o", out)
    assert p.returncode == 0, p.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stdout.startswith(f"wrote {out}")
