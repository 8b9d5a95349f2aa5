"""The dev/triton scripts without a GPU: their Triton kernels run in Triton's CPU interpreter
(LAB_INTERPRET=1: small awkward shapes, checks only, against the scripts' fp32 PyTorch references),
and compare.py builds the combined table from logs in the lab's format. The interpreter tests skip
where torch or triton is not installed (~35 s on 2 cores for the first five; attention_decode.py's checks add more)."""
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRITON_DIR = os.path.join(ROOT, "dev", "triton")
HAS_TRITON = all(importlib.util.find_spec(m) is not None for m in ("torch", "triton"))


def compare_module():
    spec = importlib.util.spec_from_file_location("compare", os.path.join(TRITON_DIR, "compare.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SCRIPTS = [script for script, _ in compare_module().PAIRS]
# The rows each script runs in the interpreter: its Triton kernels; attention_doc.py has none (its
# flex_attention row needs a GPU): its explicit-mask SDPA row.
INTERPRETER_ROWS = {"attention_doc": "sdpa"}


@pytest.mark.skipif(not HAS_TRITON, reason="torch and triton are not both installed")
@pytest.mark.parametrize("script", SCRIPTS)
def test_triton_kernels_in_the_interpreter(script):
    env = dict(os.environ, LAB_INTERPRET="1")
    rows = INTERPRETER_ROWS.get(script, "triton")
    r = subprocess.run([sys.executable, os.path.join(TRITON_DIR, script + ".py"), rows], env=env,
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "SKIPPED" not in out, out
    assert f"# {script}.py: 0 check(s) failed" in out, out
    assert out.count("  ok") >= 1, out  # at least one compared output


LAB_LOG = """# layernorm.cu on a GPU
# name | variant | ms | GB/s | TFLOP/s | % of H200 ceiling
layernorm_forward N=8 C=4 | 0 shipped | 0.0600 | 3200.0 | 6.40 | 80.0% of copy
layernorm_forward N=8 C=4 | 1 registers | 0.0500 | 3600.0 | 7.00 | 90.0% of copy
fused_classifier N=8 V=5 Vp=8 | 0 shipped | 4.0000 | 3000.0 | 1.00 | 75.0% of copy
attention_forward gpt2 B=1 | 0 shipped | 0.3000 | 10.0 | 350.00 | 49.3% of GEMM
# layernorm.cu: 0 check(s) failed
"""
PY_LOG = """# a script
# beside softmax_forward N=8 V=8 | fused_classifier N=8 V=5 Vp=8 | the classifier
# beside bias_gelu N=8 | - | no CUDA row
# name | variant | ms | GB/s | TFLOP/s | % of H200 ceiling
layernorm_forward N=8 C=4 | triton | 0.0700 | 2800.0 | 6.00 | 70.0% of copy
layernorm_forward N=8 C=4 | torch.compile | 0.0550 | 3640.0 | 6.00 | 91.0% of copy
layernorm_forward N=8 C=4 | torch eager | 0.1000 | 1000.0 | 6.00 | 25.0% of copy
softmax_forward N=8 V=8 | triton | 4.6000 | 2840.0 | 1.00 | 71.0% of copy
softmax_forward N=8 V=8 | torch.compile | 6.0000 | 1960.0 | 1.00 | 49.0% of copy
bias_gelu N=8 | triton | 0.2000 | 3900.0 | 1.00 | 97.5% of copy
attention_forward gpt2 B=1 | triton 128x64 w4 | 0.3600 | 9.0 | 290.00 | 40.8% of GEMM
attention_forward gpt2 B=1 | triton 128x128 w8 | 0.3500 | 9.0 | 300.00 | 42.3% of GEMM
attention_forward gpt2 B=1 | torch.compile | 2.0000 | 1.0 | 50.00 | 7.0% of GEMM
# a script: 0 check(s) failed
"""


def compare_table(tmp_path, capsys, lab_log, py_log):
    """compare.py's table of the two logs: {op: [its cells]} (the header row under "op") and the whole
    output."""
    (tmp_path / "lab.log").write_text(lab_log)
    (tmp_path / "py.log").write_text(py_log)
    compare_module().table([str(tmp_path / "py.log"), str(tmp_path / "lab.log")])
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0].strip(): [c.strip() for c in line.split(" | ")[1:]]
            for line in out.splitlines() if " | " in line and not line.startswith("#")}
    return rows, out


def test_compare_table(tmp_path, capsys):
    rows, out = compare_table(tmp_path, capsys, LAB_LOG, PY_LOG)
    # ours = variant 0 (not the faster variant 1); the best Triton configuration, named
    assert rows["layernorm_forward N=8 C=4"] == ["3200.0 (80%)", "2800.0 (70%)", "3640.0 (91%)", "GB/s"]
    assert rows["attention_forward gpt2 B=1"] == ["350.0 (49%)", "300.0 (42%) [128x128 w8]", "50.0 (7%)", "TFLOP/s"]
    # a CUDA row of another name (beside), and an op no CUDA lab times
    assert rows["softmax_forward N=8 V=8"] == ["3000.0 (75%)", "2840.0 (71%)", "1960.0 (49%)", "GB/s"]
    assert rows["bias_gelu N=8"] == ["-", "3900.0 (98%)", "-", "GB/s"]
    assert "CUDA row: fused_classifier N=8 V=5 Vp=8" in out
    assert "bias_gelu N=8: no torch.compile line" in out


def test_compare_table_sdpa_column(tmp_path, capsys):
    """With SDPA lines in the logs the table gains an SDPA column: the fastest SDPA row of an op, named
    when there are several (the plain "sdpa" row by its own name), "-" for an op without one."""
    rows, _ = compare_table(tmp_path, capsys, LAB_LOG, PY_LOG.replace("# a script: 0", (
        "attention_forward gpt2 B=1 | sdpa | 0.3000 | 10.0 | 320.00 | 45.1% of GEMM\n"
        "attention_forward gpt2 B=1 | sdpa cudnn | 0.3100 | 10.0 | 310.00 | 43.7% of GEMM\n"
        "# a script: 0")))
    assert rows["op"] == ["ours CUDA", "Triton", "torch.compile", "SDPA", "units"]
    assert rows["attention_forward gpt2 B=1"] == ["350.0 (49%)", "300.0 (42%) [128x128 w8]", "50.0 (7%)",
                                                  "320.0 (45%) [sdpa]", "TFLOP/s"]
    assert rows["layernorm_forward N=8 C=4"] == ["3200.0 (80%)", "2800.0 (70%)", "3640.0 (91%)", "-", "GB/s"]


DECODE_LAB_LOG = """# attention_decode.cu on a GPU
# name | variant | ms | GB/s | TFLOP/s | % of H200 ceiling
attention_decode gqa B=8 NH=32 NKV=8 HD=128 S=4096 W=0 len=4096 | 0 shipped | 0.1400 | 900.0 | 1.00 | 22.5% of copy
attention_decode gqa B=8 NH=32 NKV=8 HD=128 S=4096 W=0 len=4096 | 9 no early loads | 0.1300 | 950.0 | 1.00 | 23.8% of copy
attention_decode gqa B=64 NH=32 NKV=8 HD=128 S=4096 W=0 len=4096 | 0 shipped | 0.7000 | 1500.0 | 1.00 | 37.5% of copy
attention_decode gqa B=64 NH=32 NKV=8 HD=128 S=4096 W=0 len=4096 | 9 no early loads: tensor cores | 0.2500 | 4200.0 | 1.00 | 105.0% of copy
attention_decode gpt2 B=64 NH=12 NKV=12 HD=64 S=4096 W=0 len=128 | 0 shipped | 0.0200 | 1000.0 | 1.00 | 25.0% of copy
# attention_decode.cu: 0 check(s) failed
"""
DECODE_PY_LOG = """# attention_decode.py
# name | variant | ms | GB/s | TFLOP/s | % of H200 ceiling
attention_decode gqa B=8 NH=32 NKV=8 HD=128 S=4096 W=0 len=4096 | triton | 0.0600 | 2000.0 | 1.00 | 50.0% of copy
attention_decode gqa B=64 NH=32 NKV=8 HD=128 S=4096 W=0 len=4096 | triton | 0.2500 | 4100.0 | 1.00 | 102.5% of copy
attention_decode gpt2 B=64 NH=12 NKV=12 HD=64 S=4096 W=0 len=128 | triton | 0.0200 | 1300.0 | 1.00 | 32.5% of copy
# attention_decode.py: 0 check(s) failed
"""


def test_compare_table_decode_ships_variant_9_past_b8(tmp_path, capsys):
    """attention_decode's CUDA column is what generate runs at that batch: variant 0 (the fused step's
    call) at B <= 8, variant 9 (the B > 8 step's call, tensor cores where routed) above, named in the
    cell; variant 0 with a note when a log lacks variant 9 (run_h200.sh before it ran both)."""
    rows, out = compare_table(tmp_path, capsys, DECODE_LAB_LOG, DECODE_PY_LOG)
    assert rows["attention_decode gqa B=8 NH=32 NKV=8 HD=128 S=4096 W=0 len=4096"][0] == "900.0 (22%)"
    assert rows["attention_decode gqa B=64 NH=32 NKV=8 HD=128 S=4096 W=0 len=4096"][0] == "4200.0 (105%) [variant 9]"
    assert rows["attention_decode gpt2 B=64 NH=12 NKV=12 HD=64 S=4096 W=0 len=128"][0] == "1000.0 (25%)"
    assert "len=128: variant 9 (what ships at this shape) is not in these logs; the CUDA column is variant 0" in out


@pytest.mark.skipif(not HAS_TRITON, reason="torch and triton are not both installed")
def test_compare_per_row_tolerance(capsys):
    """lab_common's compare with per_row=True scales the absolute term by each row's rms (a zero row by
    the whole tensor's): attention_decode.py's mixed batches, whose sequences differ in scale."""
    import types
    import torch
    sys.path.insert(0, TRITON_DIR)
    import lab_common as lc
    me = types.SimpleNamespace(torch=torch)
    ref = torch.tensor([[1.0, -1.0, 1.0, -1.0], [0.01, -0.01, 0.01, -0.01], [0.0, 0.0, 0.0, 0.0]])
    tol = (0.0, 1e-2)  # the whole tensor's rms: 0.577, so 5.8e-3; the rows': 1e-2, 1e-4, 5.8e-3

    def check(row, col, err, per_row):
        got = ref.clone()
        got[row, col] += err
        return lc.Lab.compare(me, "out", got, ref, tol, per_row=per_row)

    assert check(1, 2, 5e-3, per_row=False) and not check(1, 2, 5e-3, per_row=True)  # the small row's error
    assert not check(0, 1, 8e-3, per_row=False) and check(0, 1, 8e-3, per_row=True)  # the large row's
    assert check(2, 0, 5e-3, per_row=True) and not check(2, 0, 7e-3, per_row=True)   # a zero row: the whole's
    assert "rms of its row" in capsys.readouterr().out
