"""compare.py: the combined table of the kernel lab and its Python twins, one row per op:
    op | ours CUDA | Triton | torch.compile | [SDPA |] units
read from the logs of one run (the lab binaries' and the dev/triton scripts' output; the order of the
files does not matter). Each cell is the figure of that row's fixed-format line (harness.cuh's
`name | variant | ms | GB/s | TFLOP/s | % of H200 ceiling`), in GB/s for memory-bound ops and
TFLOP/s for attention (the line's "of copy" / "of GEMM"), with its % of that ceiling:
  ours CUDA      variant 0 ("0 shipped": the kernel the trainer runs) of the CUDA row of the same op
                 name, or of the row the script names with Lab.beside (softmax: the fused classifier);
                 attention_decode at B > 8: variant 9, named in the cell (shipped_variant says why);
  Triton         the best of the script's `triton ...` rows (its configuration named when there are several);
  torch.compile  the script's `torch.compile` row;
  SDPA           the best of the script's `sdpa ...` rows (PyTorch's scaled_dot_product_attention:
                 attention.py, attention_decode.py), named when there are several; the column is
                 there only when the logs hold an sdpa line.
A cell is "-" when its line is missing (a failed check prints no line; a lab that did not run, or
an op no CUDA lab times, has none); the notes under the table say which.
    python3 dev/triton/compare.py LOG ...     the table (stdlib only: runs wherever the logs are)
    python3 dev/triton/compare.py --pairs     the scripts and the labs each one sits beside, script:lab[,lab]
"""
import os
import re
import sys

# dev/triton/<script>.py: the dev/cuda/<lab>.cu files whose ops it times (run_all.sh puts the script's
# lines after the first one's, run_h200.sh runs their variant 0 for the CUDA column)
PAIRS = (("softmax", ("fused_classifier",)), ("layernorm", ("layernorm",)), ("rmsnorm", ("rmsnorm",)),
         ("gelu", ("gelu",)), ("attention", ("attention_forward", "attention_backward")),
         ("attention_doc", ("attention_forward", "attention_backward")), ("attention_decode", ("attention_decode",)))
TABLE_HEADER = "# name | variant"
BESIDE_TAG = "# beside "  # lab_common.BESIDE_TAG's lines (not imported: lab_common needs torch)


def read_log(path, rows, besides):
    """Appends the log's table lines to rows as (op, variant, fields) and its beside lines to besides."""
    in_table = False
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith(BESIDE_TAG):
                parts = line[len(BESIDE_TAG):].split(" | ")
                if len(parts) == 3:
                    besides[parts[0]] = (parts[1] if parts[1] != "-" else "", parts[2])
            elif line.startswith(TABLE_HEADER):
                in_table = True
            elif in_table:
                parts = line.split(" | ")
                if len(parts) == 6:
                    rows.append((parts[0], parts[1], parts))


def shipped_variant(op):
    """The lab variant that times what the shipped program runs for op: "0", except attention_decode
    at B > 8. Its variant 0 is the call of generate's fused step, which runs at B <= 8 (GEMV_MAX_M,
    llmc/model_infer.cuh). At B > 8 the step calls attention_decode without the early loads, and that
    call takes the tensor-core kernels where decode_mma_route allows. Variant 9 times that call
    without the cache append the step folds in (variant 8 has it), since the Python rows time
    attention alone."""
    m = re.match(r"attention_decode \S+ B=(\d+) ", op)
    return "9" if m and int(m.group(1)) > 8 else "0"


def figure(parts):
    """(value, percent, units) of one table line."""
    compute = parts[5].endswith("of GEMM")
    value = float(parts[4] if compute else parts[3])
    pct = float(re.match(r"[0-9.]+", parts[5]).group(0))
    return value, pct, "TFLOP/s" if compute else "GB/s"


def cell(parts, label=""):
    value, pct, _ = figure(parts)
    return f"{value:.1f} ({pct:.0f}%)" + (f" [{label}]" if label else "")


def best_cell(variants, prefix):
    """The cell of the fastest of (variant, parts) rows, the variant named after `prefix` when there
    are several; "-" for none."""
    if not variants:
        return "-"
    best_variant, best = max(variants, key=lambda vp: figure(vp[1])[0])
    return cell(best, (best_variant[len(prefix):].strip() or best_variant) if len(variants) > 1 else "")


def table(paths):
    rows, besides = [], {}
    for p in paths:
        if os.path.isfile(p):
            read_log(p, rows, besides)
    numbered = {}  # (CUDA op name, variant number) -> its line (the first seen)
    python_ops = []  # ops of the scripts, in order of appearance
    by_op = {}
    for op, variant, parts in rows:
        m = re.match(r"(\d+) ", variant)
        if m:
            numbered.setdefault((op, m.group(1)), parts)
        elif variant.startswith("triton") or variant == "torch.compile" or variant.startswith("sdpa"):
            if op not in by_op:
                python_ops.append(op)
                by_op[op] = []
            by_op[op].append((variant, parts))
    for op in besides:  # an op whose every Python row failed still gets its row
        if op not in by_op:
            python_ops.append(op)
            by_op[op] = []
    if not python_ops:
        print("compare: no Triton, torch.compile or SDPA lines in", " ".join(paths))
        return
    with_sdpa = any(v.startswith("sdpa") for _, v, _ in rows)
    out, notes = [], []
    for op in python_ops:
        cuda_op, note = besides.get(op, (op, ""))
        want = shipped_variant(cuda_op)
        shipped = numbered.get((cuda_op, want))
        if shipped is None and want != "0" and (cuda_op, "0") in numbered:
            notes.append(f"{op}: variant {want} (what ships at this shape) is not in these logs; the CUDA "
                         "column is variant 0")
            shipped, want = numbered[(cuda_op, "0")], "0"
        triton = [(v, p) for v, p in by_op[op] if v.startswith("triton")]
        compiled = [p for v, p in by_op[op] if v == "torch.compile"]
        any_line = [p for _, p in by_op[op]] + ([shipped] if shipped else [])
        units = figure(any_line[0])[2] if any_line else "-"
        if shipped:
            ours = cell(shipped, f"variant {want}" if want != "0" else "")
        else:
            ours = "-"
            if cuda_op and not note:
                note = f"no variant-{want} line of {cuda_op} in these logs (its lab did not run, is not built, or failed)"
        tri = best_cell(triton, "triton")
        comp = cell(compiled[0]) if compiled else "-"
        sdpa = best_cell([(v, p) for v, p in by_op[op] if v.startswith("sdpa")], "sdpa")
        missing = [name for name, got in (("Triton", triton), ("torch.compile", compiled)) if not got]
        if missing:
            notes.append(f"{op}: no {' and no '.join(missing)} line (a failed check prints none)")
        if cuda_op and cuda_op != op:
            note = f"CUDA row: {cuda_op}" + (f"; {note}" if note else "")
        if note:
            notes.append(f"{op}: {note}")
        out.append((op, ours, tri, comp) + ((sdpa,) if with_sdpa else ()) + (units,))
    header = ("op", "ours CUDA", "Triton", "torch.compile") + (("SDPA",) if with_sdpa else ()) + ("units",)
    w = [max(len(r[i]) for r in out + [header]) for i in range(len(header))]
    fmt = " | ".join(f"%-{n}s" for n in w)
    print("# ours CUDA, Triton, torch.compile" + (" and SDPA" if with_sdpa else "") + " side by side (one run; "
          "figure, % of the H200 ceiling: 4.0 TB/s copy, 710 TFLOP/s GEMM)")
    print((fmt % header).rstrip())
    for r in out:
        print((fmt % r).rstrip())
    for n in notes:
        print("  " + n)


def main(argv):
    if argv[1:] == ["--pairs"]:
        print(" ".join(f"{script}:{','.join(labs)}" for script, labs in PAIRS))
        return 0
    if len(argv) < 2 or any(a.startswith("-") for a in argv[1:]):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    table(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
