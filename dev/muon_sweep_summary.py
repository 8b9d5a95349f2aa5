#!/usr/bin/env python3
"""muon_sweep_summary.py: the table and the verdict of dev/bench/muon_sweep.sh, from its runs' trainer logs.

  python3 dev/muon_sweep_summary.py OUT/adamw_lr*.log OUT/muon_lr*.log [--tokens-per-step N] [--skip N] [--ratio X]

Each LOG is a trainer's --log (`step n train_loss x ... ms x tok_s x`, `step n val_loss x`) named
<optimizer>_lr<lr>.log, the optimizer adamw or muon. Per run: the final and the best val loss, the tokens
(steps * tokens per step: tok_s * ms / 1000 from the log, or --tokens-per-step), the median step ms and tok/s
after the first --skip steps, and the wall seconds (the summed step ms: training alone, evaluations excluded).
The best run of an optimizer has the lowest final val loss. The target is the best AdamW run's final val loss;
a run's "to target" columns are the tokens and seconds at which its val loss first reaches it (linear
interpolation between val points). The verdict: whether the best Muon run reaches the target in at most --ratio
(default 0.8) of the best AdamW run's tokens, and the same comparison in wall time, which carries Muon's
per-step overhead. A missing, empty or misnamed log is one error line on stderr and exit status 1.
"""
import argparse
import math
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from plot_log import against, die, log_tokens_per_step, parse_log  # noqa: E402

NAME = re.compile(r"^(adamw|muon)_lr([0-9.eE+-]+)\.log$")


def crossing(points, target):
    """The x at which the (x, loss) curve first reaches loss <= target, linear between points (after a nan
    point: the x of the point that reaches it); None if never."""
    for i, (x, loss) in enumerate(points):
        if loss <= target:
            if i == 0 or not math.isfinite(points[i - 1][1]):
                return x
            x0, loss0 = points[i - 1]  # loss0 > target >= loss
            return x0 + (loss0 - target) / (loss0 - loss) * (x - x0)
    return None


def load(path, tokens_per_step, skip):
    """One run's numbers: optimizer, lr, val curves against tokens and seconds, step ms and tok/s medians."""
    m = NAME.match(os.path.basename(path))
    if not m:
        die(f"{path}: expected a log named adamw_lr<lr>.log or muon_lr<lr>.log")
    series = parse_log(path)
    if not series["val_loss"]:
        die(f"{path}: no 'step <n> val_loss <x>' lines (the sweep needs --val-every and --val)")
    if not series["ms"]:
        die(f"{path}: no train lines with ms (the step times)")
    per_step = tokens_per_step or log_tokens_per_step(path, series)
    ms = [v for _, v in sorted(series["ms"])]
    tok_s = [v for _, v in sorted(series["tok_s"])] or [per_step / (v / 1000) for v in ms]
    skip = min(skip, len(ms) - 1)
    return {
        "opt": m.group(1), "lr": m.group(2),
        "val_tokens": against(path, series, "tokens", per_step)["val_loss"],
        "val_seconds": against(path, series, "seconds")["val_loss"],
        "final": series["val_loss"][-1][1],
        "best": min((v for _, v in series["val_loss"] if math.isfinite(v)), default=math.nan),
        "steps": max(step for step, _ in series["ms"]),
        "ms": statistics.median(ms[skip:]), "tok_s": statistics.median(tok_s[skip:]),
    }


def best_of(runs, opt):
    """The run of `opt` with the lowest finite final val loss (a diverged run's nan never wins)."""
    ok = [r for r in runs if r["opt"] == opt and math.isfinite(r["final"])]
    if not ok:
        die(f"no {opt} log with a finite final val loss among the logs given")
    return min(ok, key=lambda r: r["final"])


def tokens_text(n):
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:.0f}"


def seconds_text(s):
    return f"{s:.1f}" if s >= 10 else f"{s:.3f}"


def row(r, best):
    """One run's table cells."""
    reach = ["never", "never"]
    if r["to_tokens"] is not None:
        reach = [tokens_text(r["to_tokens"]), seconds_text(r["to_seconds"])]
    return [f"{r['opt']} lr {r['lr']}" + (" (best)" if best else ""), f"{r['final']:.4f}", f"{r['best']:.4f}",
            str(r["steps"]), tokens_text(r["val_tokens"][-1][0]), f"{r['ms']:.1f}", f"{r['tok_s']:.0f}",
            seconds_text(r["val_seconds"][-1][0])] + reach


def report(runs, ratio):
    adamw, muon = best_of(runs, "adamw"), best_of(runs, "muon")
    target = adamw["final"]
    for r in runs:
        r["to_tokens"] = crossing(r["val_tokens"], target)
        r["to_seconds"] = crossing(r["val_seconds"], target)
    head = ["run", "final val", "best val", "steps", "tokens", "step ms", "tok/s", "wall s",
            f"tokens to {target:.4f}", f"wall s to {target:.4f}"]
    for cells in [head, ["---"] * len(head)] + [row(r, r is adamw or r is muon) for r in runs]:
        print("| " + " | ".join(cells) + " |")
    a_tokens, a_seconds = adamw["val_tokens"][-1][0], adamw["val_seconds"][-1][0]
    print(f"\ntarget: adamw lr {adamw['lr']}'s final val loss {target:.4f}, at {tokens_text(a_tokens)} tokens "
          f"and {seconds_text(a_seconds)} s")
    print(f"throughput: muon lr {muon['lr']} {muon['tok_s']:.0f} tok/s = {muon['tok_s'] / adamw['tok_s']:.2f}x "
          f"adamw's {adamw['tok_s']:.0f} (median step {muon['ms']:.1f} ms against {adamw['ms']:.1f} ms)")
    if muon["to_tokens"] is None:
        print(f"verdict: NO: muon lr {muon['lr']} never reaches {target:.4f} (its best val loss: {muon['best']:.4f})")
        return
    token_ratio, wall_ratio = muon["to_tokens"] / a_tokens, muon["to_seconds"] / a_seconds
    print(f"muon lr {muon['lr']} reaches {target:.4f} at {tokens_text(muon['to_tokens'])} tokens = "
          f"{token_ratio:.3f}x adamw's, and at {seconds_text(muon['to_seconds'])} s = {wall_ratio:.3f}x its wall time")
    verdict, bound = ("YES", "<=") if token_ratio <= ratio else ("NO", ">")
    print(f"verdict: {verdict}: muon reaches adamw's final val loss in {token_ratio:.3f}x its tokens "
          f"({bound} {ratio}x) and {wall_ratio:.3f}x its wall time")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+", metavar="LOG", help="adamw_lr<lr>.log and muon_lr<lr>.log trainer logs")
    p.add_argument("--tokens-per-step", type=int, metavar="N",
                   help="tokens per optimizer step (default: from each log)")
    p.add_argument("--skip", type=int, default=10, metavar="N",
                   help="warm-up steps left out of the medians (default 10)")
    p.add_argument("--ratio", type=float, default=0.8, metavar="X",
                   help="the verdict's bound on muon's tokens over adamw's (default 0.8)")
    args = p.parse_args(argv)
    if args.tokens_per_step is not None and args.tokens_per_step < 1:
        die(f"--tokens-per-step {args.tokens_per_step}: must be >= 1")
    if args.skip < 0:
        die(f"--skip {args.skip}: must be >= 0")
    if not 0 < args.ratio:
        die(f"--ratio {args.ratio}: must be > 0")
    report([load(path, args.tokens_per_step, args.skip) for path in args.logs], args.ratio)


if __name__ == "__main__":
    main()
