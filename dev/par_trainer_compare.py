"""par_trainer_compare.py: compares the stdout of our trainers (build/train_gpt2_cpu, build/train_gpt2cu)
with the reference's (scripts/train_gpt2.py through dev/par_ref_train.py), for dev/bench/par_trainer_parity.sh.

  pair OURS REF [--ours-log FILE] [--tol X] [--every N]
      per-step table of one run of each (same flags): lr, train loss, gradient norm, their differences;
      then the largest |loss difference|, the first step it exceeds --tol, and the val losses
  seeds --ours A B C --ref D E F [--last N] [--every N]
      the mean train loss over the seeds every N steps, per trainer; per run: the mean train loss over the last N steps and the final val loss; per trainer the mean,
      the sample standard deviation and the range over its seeds; the gap between the trainers' means
      against the seed spread (gap / sqrt(sd_ours^2/n + sd_ref^2/n), a two-sample t value)

Lines read: ours `step n/N train_loss x norm y lr z ...` (CPU), `step n/N | loss x | norm y | lr z | ...`
(GPU), the reference's `step n train_loss x lr z ...` and `step n norm y` (dev/par_ref_train.py); every
trainer's `step n val_loss x`.
"""
import argparse
import math
import re
import sys

STEP = re.compile(r"^step\s+(\d+)(?:/\d+)?\s*\|?\s*(?:train_loss|loss)\s+(\S+)")
NORM = re.compile(r"^step\s+(\d+)(?:/\d+)?\s.*?\b(?:grad_)?norm\s+(\S+)")
LR = re.compile(r"\blr\s+([0-9.eE+-]+)")
VAL = re.compile(r"^step\s+(\d+)\s+val_loss\s+(\S+)")


def parse(path, log=None):
    """({step: {loss, lr, norm}}, {step: val_loss}) from one trainer's stdout, then its --log file if given
    (its lr has 7 digits where stdout has 4; the GPU trainer's also holds grad_norm with 7)."""
    steps, vals = {}, {}
    lines = []
    for name in (path, log) if log else (path,):
        with open(name) as f:
            lines += f.readlines()
    for line in lines:
        m = VAL.match(line)
        if m:
            vals[int(m.group(1))] = float(m.group(2))
            continue
        m = STEP.match(line)
        if m:
            row = steps.setdefault(int(m.group(1)), {})
            row["loss"] = float(m.group(2))
            lr = LR.search(line)
            if lr:
                row["lr"] = float(lr.group(1))
        m = NORM.match(line)
        if m:
            steps.setdefault(int(m.group(1)), {})["norm"] = float(m.group(2).rstrip("|"))
    if not steps:
        sys.exit(f"{path}: no `step n ... loss x` lines (did the trainer fail? see its stderr)")
    return steps, vals


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def pair(args):
    ours, ours_val = parse(args.ours, args.ours_log)
    ref, ref_val = parse(args.ref)
    common = sorted(set(ours) & set(ref))
    print(f"{'step':>5} {'lr ours':>11} {'lr ref':>11} {'loss ours':>10} {'loss ref':>10} {'d loss':>10} "
          f"{'norm ours':>10} {'norm ref':>10} {'d norm':>10}")
    worst, first_over = (0.0, None), None
    for s in common:
        o, r = ours[s], ref[s]
        d = o["loss"] - r["loss"]
        dn = o["norm"] - r["norm"] if "norm" in o and "norm" in r else None
        if abs(d) > worst[0]:
            worst = (abs(d), s)
        if first_over is None and abs(d) > args.tol:
            first_over = s
        if s % args.every == 0 or s == common[0] or s == common[-1] or s == first_over:
            print(f"{s:>5} {fmt(o.get('lr'), '11.4e')} {fmt(r.get('lr'), '11.4e')} {o['loss']:10.6f} "
                  f"{r['loss']:10.6f} {d:10.2e} {fmt(o.get('norm'), '10.6f')} {fmt(r.get('norm'), '10.6f')} "
                  f"{fmt(dn, '10.2e')}")
    lr_worst = max((abs(ours[s]["lr"] - ref[s]["lr"]) / ref[s]["lr"] for s in common
                    if "lr" in ours[s] and "lr" in ref[s] and ref[s]["lr"] > 0), default=float("nan"))
    print(f"steps compared {len(common)}; max |d loss| {worst[0]:.3e} at step {worst[1]}; first |d loss| > "
          f"{args.tol:g}: {'none' if first_over is None else 'step %d' % first_over}; max relative lr "
          f"difference {lr_worst:.2e}")
    for s in sorted(set(ours_val) & set(ref_val)):
        print(f"val step {s}: ours {ours_val[s]:.6f} ref {ref_val[s]:.6f} diff {ours_val[s] - ref_val[s]:+.3e}")


def summary(path, last):
    steps, vals = parse(path)
    n = max(steps)
    tail = [steps[s]["loss"] for s in range(n - last + 1, n + 1) if s in steps]
    return sum(tail) / len(tail), (vals[max(vals)] if vals else float("nan")), n


def stats(xs):
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
    return m, sd, min(xs), max(xs)


def seeds(args):
    runs = {"ours": [parse(p)[0] for p in args.ours], "ref": [parse(p)[0] for p in args.ref]}
    common = sorted(set.intersection(*(set(r) for rs in runs.values() for r in rs)))
    print(f"{'step':>5} {'ours mean':>10} {'ref mean':>10} {'gap':>8} {'ours sd':>8} {'ref sd':>8}   (train loss over seeds)")
    for s in common:
        if s % args.every and s != common[-1]:
            continue
        (mo, so, *_), (mr, sr, *_) = (stats([r[s]["loss"] for r in runs[w]]) for w in ("ours", "ref"))
        print(f"{s:>5} {mo:10.4f} {mr:10.4f} {mo - mr:+8.4f} {so:8.4f} {sr:8.4f}")
    table = {}
    print(f"{'run':<40} {'steps':>5} {'mean train (last %d)' % args.last:>22} {'final val':>10}")
    for who, paths in (("ours", args.ours), ("ref", args.ref)):
        table[who] = [summary(p, args.last) for p in paths]
        for p, (tr, va, n) in zip(paths, table[who]):
            print(f"{who + ' ' + p[-35:]:<40} {n:>5} {tr:22.4f} {va:10.4f}")
    for k, name in ((0, "mean train loss, last %d steps" % args.last), (1, "final val loss")):
        print(name + ":")
        ms = {}
        for who in ("ours", "ref"):
            xs = [t[k] for t in table[who]]
            m, sd, lo, hi = stats(xs)
            ms[who] = (m, sd, len(xs))
            print(f"  {who:<4} mean {m:.4f} sd {sd:.4f} range [{lo:.4f}, {hi:.4f}] over {len(xs)} seeds")
        (mo, so, no), (mr, sr, nr) = ms["ours"], ms["ref"]
        se = math.sqrt(so * so / no + sr * sr / nr) if no > 1 and nr > 1 else float("nan")
        print(f"  gap ours - ref {mo - mr:+.4f}; seed sd (pooled) {math.sqrt((so * so + sr * sr) / 2):.4f}; "
              f"t = gap / standard error = {(mo - mr) / se if se > 0 else float('nan'):+.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("pair")
    a.add_argument("ours")
    a.add_argument("ref")
    a.add_argument("--ours-log", help="our trainer's --log file (more digits of lr, and grad_norm on the GPU)")
    a.add_argument("--tol", type=float, default=1e-4)
    a.add_argument("--every", type=int, default=10)
    b = sub.add_parser("seeds")
    b.add_argument("--ours", nargs="+", required=True)
    b.add_argument("--ref", nargs="+", required=True)
    b.add_argument("--last", type=int, default=20)
    b.add_argument("--every", type=int, default=10)
    args = p.parse_args()
    pair(args) if args.mode == "pair" else seeds(args)


if __name__ == "__main__":
    main()
