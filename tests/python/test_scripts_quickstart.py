"""The README's two commands and scripts/quickstart.sh, without running the training (too slow for
`make test`; the quickstart is timed by hand, see README.md):
- the README's install line holds every package `make test` needs;
- nothing the user runs points outside the repo (a user's clone has no folders next to it);
- the quickstart builds only the trainer it runs, chosen by whether a GPU is present
  (`nvidia-smi -L`) and nvcc exists, and reads offline data only when LLMC_OFFLINE_DATA says so;
- the quickstart deletes nothing itself: `--help` prints its usage and stops, and the previous run's
  checkpoints and log are left to the trainer's --overwrite 1, so a misspelled flag (refused by the
  trainer before it touches a file) leaves them as they were;
- `plot_log.py --summary` reports a log's best and last val loss (the quickstart's last line).
Run: python3 -m pytest -q tests/python/test_scripts_quickstart.py  (~1 s)"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEEDED_BY_MAKE_TEST = {"numpy", "tiktoken", "tqdm", "pytest"}  # torch, transformers: optional (tests skip)


def test_readme_install_line_has_what_make_test_needs():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(pip install.*?)```", readme, re.S).group(1)  # the README's two commands
    install = next(line for line in block.splitlines() if line.startswith("pip install"))
    packages = set(install.split("&&")[0].split()[2:])
    assert NEEDED_BY_MAKE_TEST <= packages, f"missing from the README's install line: {NEEDED_BY_MAKE_TEST - packages}"
    assert "./scripts/quickstart.sh" in block and "make test" in block


def test_nothing_points_outside_the_repo():
    outside = "../" + "shared"  # spelled in two parts so this file does not match itself
    files = [ROOT / "README.md", *sorted((ROOT / "scripts").rglob("*")), *sorted((ROOT / "tests").rglob("*.*"))]
    hits = [str(f.relative_to(ROOT)) for f in files
            if f.is_file() and f.suffix in ("", ".md", ".py", ".sh") and outside in f.read_text(errors="replace")]
    assert not hits, f"{outside} is mentioned in {hits}"


def fake_tools(tmp_path, gpu):
    """A PATH on which nvidia-smi reports a GPU or not, nvcc exists, and python3 and make only record
    their arguments (make then fails, which stops the quickstart before any training)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {
        "nvidia-smi": f"echo 'GPU 0: NVIDIA H200'; exit {0 if gpu else 9}",
        "nvcc": "exit 0",
        "python3": f"echo \"python3 $* LLMC_OFFLINE_DATA=${{LLMC_OFFLINE_DATA:-}}\" >> '{tmp_path / 'calls'}'",
        "make": f"echo \"make $*\" >> '{tmp_path / 'calls'}'; exit 3",
    }
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    env.pop("LLMC_OFFLINE_DATA", None)
    env.pop("NVCC", None)
    return env


@pytest.mark.parametrize("gpu,nvcc,target", [(False, True, "build/train_gpt2_cpu"), (True, True, "build/train_gpt2cu"),
                                             (True, False, "build/train_gpt2_cpu")],
                         ids=["nvcc_without_gpu", "gpu_and_nvcc", "gpu_without_nvcc"])
def test_quickstart_builds_only_its_trainer(tmp_path, gpu, nvcc, target):
    env = fake_tools(tmp_path, gpu)
    if not nvcc:
        env["NVCC"] = str(tmp_path / "no_nvcc_here")
    p = subprocess.run(["scripts/quickstart.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0  # the fake make stopped it
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ["python3 scripts/data/tinyshakespeare.py LLMC_OFFLINE_DATA=", f"make {target}"], calls


def quickstart_copy(tmp_path, trainer):
    """A repo holding only scripts/quickstart.sh, build/train_gpt2_cpu (`trainer`: a file to copy, or a
    shell script body) and a previous run in out/quickstart; the PATH of fake_tools without a GPU."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "build").mkdir()
    shutil.copy(ROOT / "scripts" / "quickstart.sh", repo / "scripts" / "quickstart.sh")
    if isinstance(trainer, Path):
        if not trainer.exists():
            pytest.fail(f"{trainer} is missing: run make first")
        shutil.copy(trainer, repo / "build" / "train_gpt2_cpu")
    else:
        (repo / "build" / "train_gpt2_cpu").write_text(f"#!/bin/sh\n{trainer}\n")
        (repo / "build" / "train_gpt2_cpu").chmod(0o755)
    previous = repo / "out" / "quickstart"
    (previous / "step_00000120").mkdir(parents=True)
    (previous / "step_00000120" / "DONE").write_text("ok\n")
    (previous / "log.txt").write_text("step 120 val_loss 6.0\n")
    env = fake_tools(tmp_path, gpu=False)
    (tmp_path / "bin" / "make").write_text(f"#!/bin/sh\necho \"make $*\" >> '{tmp_path / 'calls'}'\n")  # succeeds
    return repo, previous, env


def previous_run_kept(previous):
    return (previous / "step_00000120" / "DONE").exists() and (previous / "log.txt").read_text() == "step 120 val_loss 6.0\n"


def test_quickstart_help_prints_usage_and_touches_nothing(tmp_path):
    repo, previous, env = quickstart_copy(tmp_path, "exit 0")
    for flag in ("--help", "-h"):
        p = subprocess.run([repo / "scripts" / "quickstart.sh", "--steps", "5", flag], env=env, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0 and "Usage: scripts/quickstart.sh" in p.stdout, (p.stdout, p.stderr)
        assert not (tmp_path / "calls").exists(), "--help runs nothing"
        assert previous_run_kept(previous), "--help deleted the previous run"


def test_quickstart_misspelled_flag_deletes_nothing(tmp_path):
    repo, previous, env = quickstart_copy(tmp_path, ROOT / "build" / "train_gpt2_cpu")
    p = subprocess.run([repo / "scripts" / "quickstart.sh", "--stepz", "5"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "--stepz" in p.stderr, (p.stdout, p.stderr)
    assert previous_run_kept(previous), "a misspelled flag deleted the previous run"


def test_quickstart_leaves_the_replacing_to_the_trainer(tmp_path):
    repo, previous, env = quickstart_copy(tmp_path, f"echo \"trainer $*\" >> '{tmp_path / 'calls'}'")
    p = subprocess.run([repo / "scripts" / "quickstart.sh", "--steps", "5"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    trainer = [c for c in (tmp_path / "calls").read_text().splitlines() if c.startswith("trainer ")]
    assert len(trainer) == 1 and "--out-dir out/quickstart --log out/quickstart/log.txt --overwrite 1" in trainer[0] \
        and trainer[0].endswith("--steps 5"), trainer
    assert previous_run_kept(previous), "the quickstart deleted files itself"


def test_plot_log_summary(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("step 0 val_loss 10.8\nstep 1 train_loss 10.5 lr 1e-3 ms 5 tok_s 100\nstep 25 val_loss 6.5\n"
                   "step 50 val_loss 6.1\nstep 75 val_loss 6.25\nstep 75 hellaswag_acc 0.25\n")
    p = subprocess.run([sys.executable, "scripts/plot_log.py", "--summary", str(log)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "best val loss 6.1000 at step 50 (last: 6.2500 at step 75)\n"
    assert not (tmp_path / "log.png").exists()


def test_readme_trainer_commands_fit_tiny_shakespeare():
    """Every trainer command in the README that reads tiny Shakespeare's val split asks for a window
    (B*T+1 tokens) that fits in it: the trainer refuses a val split shorter than one window."""
    readme = (ROOT / "README.md").read_text()
    source = (ROOT / "scripts" / "data" / "tinyshakespeare.py").read_text()
    val_tokens = int(re.search(r'"--val-tokens", type=int, default=(\d+)', source).group(1))
    commands = [c for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
                for c in block.replace("\\\n", " ").splitlines() if "tiny_shakespeare" in c or "tinyshakespeare/*_val" in c]
    checked = 0
    for command in commands:
        if "--val" not in command.split():
            continue
        batch = int(re.search(r"--batch (\d+)", command).group(1))
        seq = int(re.search(r"--seq (\d+)", command).group(1))
        assert batch * seq + 1 <= val_tokens, f"B={batch} T={seq} needs {batch * seq + 1} val tokens: {command[:100]}"
        checked += 1
    assert checked >= 4, f"found {checked} README trainer commands on tiny Shakespeare"
