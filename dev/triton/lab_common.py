"""lab_common.py: the Python side of the kernel lab, shared by every dev/triton/<op>.py script.

The scripts time the ops of dev/cuda/ two more ways, written in Triton and as the kernels that
torch.compile generates from the plain PyTorch expression, and print their lines in the lab's one
format (dev/cuda/harness.cuh), so dev/cuda/run_all.sh puts them in its table beside our CUDA variants:
    name | variant | ms | GB/s | TFLOP/s | % of H200 ceiling
What this module does, as harness.cuh does for the CUDA labs:
  - inputs: fresh random values (torch's CUDA generator, fixed seeds, the lab's ranges) in bf16;
  - outputs a kernel writes into (Out): preallocated, poisoned with all bits set (NaN in bf16 and
    fp32) before the checked run, followed by a 4 KB guard of 0xA5 bytes; the check counts the
    elements still holding the poison and fails if the guard changed. Outputs that a function
    returns (torch.compile, eager, SDPA) are fresh tensors: checked for non-finite values instead;
  - comparison against a plain PyTorch fp32 reference computed from the same bf16 inputs, element
    passes when |got - ref| <= rel * |ref| + abs * rms(ref) (the lab's bf16 default 1.6e-2 / 1e-2;
    per_row=True: the rms of the element's row of ref, where rows differ in scale);
  - timing: 3 warm-ups, then 10..100 repeats (~0.5 s, or --reps N), each after a 256 MB write that
    evicts the 50 MB L2, CUDA events around the call only, the median. Before the repeats the GPU is
    held in a spin kernel (torch.cuda._sleep) while Python queues them, so the CPU-side cost of a
    Python launch (triton's launcher, Dynamo's guards) does not show as GPU idle time inside the
    events: the figure is the kernels' time, as the C++ harness measures it;
  - the ceilings of docs/h200.md: 4.0 TB/s device copy ("of copy", memory-bound ops) and the 710
    TFLOP/s cuBLAS bf16 GEMM ("of GEMM", attention), the same divisors as harness.cuh.
A failed check prints FAIL, skips the timing and makes the script exit 1. Without torch, triton or a
visible GPU a script prints one SKIPPED line and exits 0 (so run_all.sh passes on such a machine).

Command line of every script: `<op>.py [row ...] [--check-only] [--reps N] [--compile-mode M] [--small]`;
a row argument runs only the variants whose name contains it (`triton`, `compile`, `eager`, `sdpa`);
--small runs small awkward shapes instead (rows and widths that are multiples of no block size).
LAB_INTERPRET=1 runs the Triton kernels on the CPU in Triton's interpreter (TRITON_INTERPRET=1) with CPU
tensors, checks only, and implies --small: how the kernels were checked on a machine without a GPU
(`LAB_INTERPRET=1 python3 dev/triton/layernorm.py`; torch.compile then generates C++, not Triton).
"""
import argparse
import math
import os
import random
import sys
import time
import traceback

H200_COPY_GBPS = 4000.0      # device-to-device copy, bytes read + written (docs/h200.md)
H200_GEMM_TFLOPS = 710.0     # cuBLAS bf16 GEMM at 8192^3: the lab's "of GEMM" divisor
H200_BF16_PEAK_TFLOPS = 989.0  # datasheet dense bf16 (MFU); printed beside attention rows only
MEMORY, COMPUTE = "memory", "compute"

GUARD_BYTES = 4096
GUARD_BYTE = 0xA5
TOL_BF16 = (1.6e-2, 1e-2)    # lab::default_tol() of the bf16 build
TOL_STATS = (1e-4, 1e-4)     # fp32 statistics (mean, rstd) of identical inputs
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
INTERPRET = os.environ.get("LAB_INTERPRET", "") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
if INTERPRET:  # the interpreter stores bf16 by truncating (the GPU rounds to nearest even): statistics of a
    TOL_STATS = (5e-3, 5e-3)  # stored, truncated bf16 residual drift by ~2^-9
# --small's row count for the row-wise ops (the CUDA lab's --small shapes); the interpreter runs one program
# at a time in Python, so it takes fewer rows, still ending in a partial block of every row tiling
SMALL_ROWS = 67 if INTERPRET else 651

TABLE_HEADER = "# name | variant | ms | GB/s | TFLOP/s | % of H200 ceiling"
BESIDE_TAG = "# beside"  # finish()'s lines naming the CUDA row an op compares with (compare.py reads them)


def parse_args(file, doc):
    """The lab's command line. Parsed before torch is imported, so --help works everywhere."""
    p = argparse.ArgumentParser(prog=os.path.basename(file), description=(doc or "").strip().splitlines()[0],
                                epilog="Shared flags and checks: dev/triton/lab_common.py.")
    p.add_argument("rows", nargs="*", help="run only the variants whose name contains one of these "
                   "(triton, compile, eager, sdpa); default all")
    p.add_argument("--check-only", action="store_true", help="check every variant, time none")
    p.add_argument("--reps", type=int, default=0, help="timed repeats (default: ~0.5 s worth, 10..100)")
    p.add_argument("--small", action="store_true", help="small awkward shapes instead of GPT-2's")
    p.add_argument("--compile-mode", default=os.environ.get("LAB_COMPILE_MODE", "default"), choices=COMPILE_MODES,
                   help="torch.compile's mode (default: $LAB_COMPILE_MODE or 'default'; the other one "
                   "autotunes and compiles for minutes)")
    args = p.parse_args()
    if args.reps < 0 or args.reps > 10000:
        p.error("--reps needs a count in 1..10000")
    if INTERPRET:
        args.small, args.check_only = True, True
    return args


def skip(file, reason):
    print(f"SKIPPED {os.path.basename(file)}: {reason}", flush=True)
    sys.exit(0)


def require(file):
    """(torch, triton, triton.language), or a SKIPPED line and exit 0 when any is missing."""
    if INTERPRET:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any failure to import means "no torch here"
        skip(file, f"no PyTorch ({type(e).__name__}: {e})")
    try:
        import triton
        import triton.language as tl
    except Exception as e:  # noqa: BLE001
        skip(file, f"no Triton ({type(e).__name__}: {e})")
    try:
        ok = INTERPRET or (torch.cuda.is_available() and torch.cuda.device_count() > 0)
    except Exception:  # noqa: BLE001
        ok = False
    if not ok:
        skip(file, "no CUDA GPU visible to PyTorch")
    return torch, triton, tl


class Out:
    """A preallocated output that a kernel writes with `=`, with the harness's poison and guard."""

    def __init__(self, shape, dtype, name):
        import torch
        self.torch, self.name = torch, name
        self.n = math.prod(shape)
        esz = torch.empty(0, dtype=dtype).element_size()
        self.int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[esz]
        self.buf = torch.empty(self.n + GUARD_BYTES // esz, dtype=dtype, device=DEVICE)
        self.t = self.buf[:self.n].view(shape)
        self.guard_value = int.from_bytes(bytes([GUARD_BYTE]) * esz, "little", signed=esz > 1)
        self.buf[self.n:].view(self.int_dtype).fill_(self.guard_value)

    def poison(self):
        self.t.view(self.int_dtype).fill_(-1 if self.int_dtype != self.torch.uint8 else 0xFF)

    def unwritten(self):
        """Elements whose bytes are all 0xFF (the poison), counted in chunks."""
        flat = self.buf[:self.n].view(self.int_dtype)
        poison = -1 if self.int_dtype != self.torch.uint8 else 0xFF
        return sum(int((flat[i:i + (1 << 28)] == poison).sum()) for i in range(0, self.n, 1 << 28))

    def guard_intact(self):
        return bool((self.buf[self.n:].view(self.int_dtype) == self.guard_value).all())


def sync():
    import torch
    if not INTERPRET:
        torch.cuda.synchronize()


def nonfinite(t):
    flat = t.reshape(-1)
    return sum(int((~flat[i:i + (1 << 28)].isfinite()).sum()) for i in range(0, flat.numel(), 1 << 28))


def sample_rows(n, k, seed):
    """k distinct sorted row indices in [0, n), first and last included (lab::sample_rows' role)."""
    rows = {0, n - 1}
    rng = random.Random(seed)
    while len(rows) < min(k, n):
        rows.add(rng.randrange(n))
    return sorted(rows)


class Lab:
    def __init__(self, file, args):
        import torch
        import triton
        self.torch, self.file, self.args = torch, os.path.basename(file), args
        self.failures, self.lines, self.besides = 0, [], []
        torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 references are fp32
        torch.backends.cudnn.allow_tf32 = False
        self.gen = torch.Generator(device=DEVICE)
        if INTERPRET:
            name, self.num_sms, l2 = "the CPU (Triton interpreter, checks only)", 4, 0
            self.flush = None
        else:
            props = torch.cuda.get_device_properties(0)
            name, self.num_sms = props.name, props.multi_processor_count
            l2 = int(getattr(props, "L2_cache_size", 0) or (50 << 20))
            self.flush = torch.empty(max(256 << 20, 2 * l2), dtype=torch.uint8, device=DEVICE)
        print(f"# {self.file} on {name} ({self.num_sms} SMs, {l2 >> 20} MB L2), bf16, "
              f"torch {torch.__version__}, triton {triton.__version__}, torch.compile mode '{args.compile_mode}'"
              f"{', small shapes' if args.small else ''}", flush=True)

    def beside(self, op, cuda_op, note=""):
        """Names the CUDA lab row that `op`'s rows compare with in the combined table (compare.py):
        its op name (variant 0, the shipped kernel, is taken), or "" where no CUDA lab times the op;
        `note` says how the two differ. An op that is not named here compares with the CUDA row of
        its own name."""
        self.besides.append((op, cuda_op, note))

    # ---------------------------------------------------------------- inputs
    def rand(self, shape, seed, lo=-1.0, hi=1.0, dtype=None):
        torch = self.torch
        self.gen.manual_seed(seed)
        x = torch.rand(shape, generator=self.gen, device=DEVICE, dtype=torch.float32)
        return (x.mul_(hi - lo).add_(lo)).to(dtype or torch.bfloat16)

    def compile(self, fn):
        mode = None if self.args.compile_mode == "default" else self.args.compile_mode
        return self.torch.compile(fn, mode=mode, dynamic=False)

    # ---------------------------------------------------------------- checks
    def compare(self, what, got, ref, tol=TOL_BF16, nmse_max=None, per_row=False):
        """got (any dtype) against the fp32 reference `ref`, same number of elements; one line.
        per_row: the rms in the absolute term is each row's of ref (its first dimension; a row of
        zeros takes the whole tensor's), for rows whose scales differ by orders of magnitude."""
        torch = self.torch
        rel, abs_ = tol
        g, r = got.reshape(-1), ref.reshape(-1)
        if g.numel() != r.numel():
            print(f"    {what:<10} FAIL: comparing {g.numel()} values with {r.numel()}")
            return False
        chunk = 1 << 26
        sq_ref = sum(float(r[i:i + chunk].double().square().sum()) for i in range(0, r.numel(), chunk))
        rms_all = math.sqrt(sq_ref / max(r.numel(), 1))
        abs_tol = abs_ * rms_all
        if per_row:
            rows = ref.reshape(ref.shape[0], -1).float()
            rms = rows.square().mean(1, keepdim=True).sqrt()
            abs_tol = (abs_ * torch.where(rms > 0, rms, rms_all)).expand_as(rows).reshape(-1)
        max_abs = max_rel = sq_err = 0.0
        bad = nan = 0
        first_bad = None
        for i in range(0, r.numel(), chunk):
            gc, rc = g[i:i + chunk].float(), r[i:i + chunk].float()
            at = abs_tol[i:i + chunk] if per_row else abs_tol
            fin = gc.isfinite() & rc.isfinite()
            d = torch.where(fin, (gc - rc).abs(), torch.zeros_like(gc))
            ra = rc.abs()
            badm = fin & (d > rel * ra + at)
            nanm = ~fin
            nb, nn = int(badm.sum()), int(nanm.sum())
            if (nb or nn) and first_bad is None:
                first_bad = i + int((badm | nanm).nonzero()[0, 0])
            bad, nan = bad + nb, nan + nn
            sq_err += float(d.double().square().sum())
            max_abs = max(max_abs, float(d.max()))
            relm = torch.where(fin & (ra > at), d / ra.clamp_min(1e-30), torch.zeros_like(d))
            max_rel = max(max_rel, float(relm.max()))
        nmse = sq_err / sq_ref if sq_ref > 0 else sq_err
        ok = bad == 0 and nan == 0
        line = (f"    {what:<10} max_abs {max_abs:.2e}  max_rel {max_rel:.2e}  nmse {nmse:.2e}  "
                f"(tol {rel:.0e} rel + {abs_:.0e} rms{' of its row' if per_row else ''})")
        if ok:
            print(line + "  ok")
        else:
            print(line + f"  FAIL: {bad} out of tolerance, {nan} non-finite; first at {first_bad}: "
                  f"got {float(g[first_bad]):g} want {float(r[first_bad]):g}")
        if nmse_max is not None and not (nmse <= nmse_max):
            print(f"    {what:<10} FAIL: nmse {nmse:.2e} over {nmse_max:.0e}")
            ok = False
        return ok

    def check_out(self, out, ref, tol=TOL_BF16, rows=None, nmse_max=None, per_row=False):
        """An Out: every element written, guard intact, then the values (only `rows` of a 2-D view
        when given; the written and guard checks stay whole)."""
        sync()
        ok = True
        unwritten = out.unwritten()
        if unwritten:
            print(f"    {out.name:<10} FAIL: {unwritten} of {out.n} elements never written")
            ok = False
        if not out.guard_intact():
            print(f"    {out.name:<10} FAIL: the kernel wrote into the guard region after the output")
            ok = False
        got = out.t if rows is None else out.t[rows]
        return self.compare(out.name, got, ref, tol, nmse_max, per_row) and ok

    def check_fresh(self, name, t, ref, tol=TOL_BF16, rows=None, nmse_max=None, per_row=False):
        """A tensor a function returned: no non-finite element anywhere, then the values."""
        sync()
        ok = True
        bad = nonfinite(t)
        if bad:
            print(f"    {name:<10} FAIL: {bad} of {t.numel()} elements are not finite")
            ok = False
        got = t if rows is None else t[rows]
        return self.compare(name, got, ref, tol, nmse_max, per_row) and ok

    # ---------------------------------------------------------------- the driver
    def wants(self, what):
        return not self.args.rows or any(r in what for r in self.args.rows)

    def run(self, op, what, nbytes, flops, bound, reset, launch, check, optional=False):
        """One variant at one shape: reset, launch once (compiles), check, time, report. `launch`
        returns what it produced (for check(result)); `optional`: an exception in the first launch
        is reported as SKIPPED (a backend this PyTorch build lacks), not as a failure."""
        if not self.wants(what):
            return
        torch = self.torch
        print(f"  {op} | {what}: moves {nbytes / 1e6:.1f} MB, {flops / 1e9:.3f} GFLOP", flush=True)
        try:
            reset()
            t0 = time.time()
            result = launch()
            sync()
            first_s = time.time() - t0
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            if optional:
                print(f"SKIPPED {op} | {what}: {msg[:300]}", flush=True)
                return
            traceback.print_exc(file=sys.stdout)
            print(f"    FAIL: the first call raised {msg[:300]}")
            print(f"FAIL {op} | {what}", flush=True)
            self.failures += 1
            return
        if first_s > 1.0:
            print(f"    first call (compile) {first_s:.1f} s")
        try:
            ok = check(result)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(file=sys.stdout)
            print(f"    FAIL: the check raised {type(e).__name__}: {e}")
            ok = False
        del result
        if not ok:
            print(f"FAIL {op} | {what}", flush=True)
            self.failures += 1
            return
        if self.args.check_only:
            return
        ms = self.time_median_ms(launch)
        gbps, tflops = nbytes / (ms * 1e-3) / 1e9, flops / (ms * 1e-3) / 1e12
        if bound == MEMORY:
            pct, of = 100.0 * gbps / H200_COPY_GBPS, "of copy"
        else:
            pct, of = 100.0 * tflops / H200_GEMM_TFLOPS, "of GEMM"
        self.lines.append(f"{op} | {what} | {ms:.4f} | {gbps:.1f} | {tflops:.2f} | {pct:.1f}% {of}")
        extra = f"  ({100.0 * tflops / H200_BF16_PEAK_TFLOPS:.1f}% of the 989 bf16 peak)" if bound == COMPUTE else ""
        print(self.lines[-1] + extra, flush=True)

    def time_median_ms(self, launch):
        torch = self.torch
        for _ in range(3):
            launch()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        launch()
        e1.record()
        e1.synchronize()
        first = e0.elapsed_time(e1)
        reps = self.args.reps or min(100, max(10, int(500.0 / max(first, 1e-3))))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        torch.cuda.synchronize()
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(100_000_000)  # ~50 ms of GPU spin while Python queues the repeats
        for r in range(reps):
            self.flush.fill_(r & 0xFF)
            starts[r].record()
            launch()
            ends[r].record()
        torch.cuda.synchronize()
        ms = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
        return ms[reps // 2]

    def finish(self):
        print()
        for op, cuda_op, note in self.besides:
            print(f"{BESIDE_TAG} {op} | {cuda_op or '-'} | {note}")
        print(TABLE_HEADER)
        for line in self.lines:
            print(line)
        print(f"# {self.file}: {self.failures} check(s) failed", flush=True)
        return 1 if self.failures else 0
