#!/usr/bin/env python3
"""Plots train and validation loss (and HellaSwag accuracy, on a right-hand axis, where a log has it)
against step, tokens or training seconds from one or more trainer logs into a PNG.

A log is any text file; the lines that count look like
    step <n> train_loss <x> [lr <x>] [ms <x>] [tok_s <x>] ...
    step <n> val_loss <x>
    step <n> hellaswag_acc <x> correct <n> examples <n>
(`key value` pairs after the step number, in any order; other lines are ignored). Both trainers
and scripts/train_gpt2.py --train --log write this format.

Usage:
  python3 scripts/plot_log.py log/train.log                      # writes log/train.png
  python3 scripts/plot_log.py ours.log torch.log -o compare.png  # one colour per log
  python3 scripts/plot_log.py run.log --smooth 20 --logy --title "d12 on FineWeb"
  python3 scripts/plot_log.py adamw.log muon.log --x tokens      # x = step * tokens per step
  python3 scripts/plot_log.py adamw.log muon.log --x seconds     # x = the summed step ms of steps 1..n
  python3 scripts/plot_log.py --summary run.log                  # best and last val loss, no plot
Needs matplotlib (pip install matplotlib), except for --summary."""
import argparse
import os
import sys


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def parse_log(path):
    """{'train_loss': [(step, x)], 'val_loss': [...], 'hellaswag_acc': [...], 'ms': [...], 'tok_s': [...]} from
    the `step <n> key value ...` lines."""
    series = {"train_loss": [], "val_loss": [], "hellaswag_acc": [], "ms": [], "tok_s": []}
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError as e:
        die(f"{path}: cannot read ({e.strerror})")
    for line in lines:
        words = line.split()
        if len(words) < 4 or words[0] != "step":
            continue
        try:
            step = int(words[1])
        except ValueError:
            continue
        for key, value in zip(words[2::2], words[3::2]):
            if key in series:
                try:
                    series[key].append((step, float(value)))
                except ValueError:
                    die(f"{path}: '{value}' after {key} is not a number in line: {line.strip()}")
    if not series["train_loss"] and not series["val_loss"]:
        die(f"{path}: no 'step <n> train_loss <x>' or 'step <n> val_loss <x>' lines")
    return series


def log_tokens_per_step(path, series):
    """Tokens per optimizer step from the train lines' tok_s * ms / 1000 (the trainers derive tok_s from the
    step's B*T or --total-batch and its ms), the median over the steps, rounded."""
    ms, tok_s = dict(series["ms"]), dict(series["tok_s"])
    products = sorted(tok_s[step] * ms[step] / 1000 for step in ms if step in tok_s)
    if not products:
        die(f"{path}: no train lines with ms and tok_s to take the tokens per step from (pass --tokens-per-step N)")
    return round(products[len(products) // 2])


def against(path, series, x, tokens_per_step=None):
    """The series with each point's step replaced by x: "step" (unchanged), "tokens" (step * tokens per step,
    from the log unless given) or "seconds" (the summed ms of steps 1..step: training time, evaluations
    excluded; step 0 is 0 s)."""
    if x == "step":
        return series
    if x == "tokens":
        per_step = tokens_per_step or log_tokens_per_step(path, series)
        at = {step: step * per_step for key in series for step, _ in series[key]}
    else:
        at, total = {0: 0.0}, 0.0
        for step, ms in sorted(series["ms"]):
            total += ms / 1000
            at[step] = total
        missing = sorted({step for key in series for step, _ in series[key]} - at.keys())
        if missing:
            die(f"{path}: step {missing[0]} has no train line with ms (--x seconds sums the step times)")
    return {key: [(at[step], v) for step, v in points] for key, points in series.items()}


def val_summary(path, series):
    """One line: the lowest val loss and its step, and the last one (a run should end near its best)."""
    val = series["val_loss"]
    if not val:
        return f"{path}: no val_loss lines"
    best_step, best = min(val, key=lambda p: p[1])
    last_step, last = val[-1]
    return f"best val loss {best:.4f} at step {best_step} (last: {last:.4f} at step {last_step})"


def smooth(points, window):
    """Trailing mean over `window` points (a noisy per-step train loss reads better averaged)."""
    if window <= 1:
        return points
    out, acc = [], 0.0
    for i, (step, x) in enumerate(points):
        acc += x
        if i >= window:
            acc -= points[i - window][1]
        out.append((step, acc / min(i + 1, window)))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+", metavar="LOG", help="trainer log file(s)")
    p.add_argument("-o", "--out", help="output PNG (default: the first LOG with .png)")
    p.add_argument("--title", default="", help="plot title")
    p.add_argument("--smooth", type=int, default=1, metavar="N", help="trailing mean of the train loss over N steps")
    p.add_argument("--logy", action="store_true", help="logarithmic loss axis")
    p.add_argument("--x", choices=("step", "tokens", "seconds"), default="step",
                   help="the x axis: step (default), tokens (step * tokens per step) or seconds (summed step ms)")
    p.add_argument("--tokens-per-step", type=int, metavar="N",
                   help="--x tokens: tokens per optimizer step (default: tok_s * ms / 1000 from each log)")
    p.add_argument("--summary", action="store_true", help="print each log's best and last val loss instead of plotting")
    args = p.parse_args(argv)
    if args.summary:
        for path in args.logs:
            print(val_summary(path, parse_log(path)))
        return
    if args.smooth < 1:
        p.error(f"--smooth must be >= 1, got {args.smooth}")
    if args.tokens_per_step is not None and args.tokens_per_step < 1:
        p.error(f"--tokens-per-step must be >= 1, got {args.tokens_per_step}")
    out = args.out or os.path.splitext(args.logs[0])[0] + ".png"
    if not out.lower().endswith(".png"):
        p.error(f"--out {out}: expected a .png file name")
    runs = [(path, against(path, parse_log(path), args.x, args.tokens_per_step)) for path in args.logs]
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        die("matplotlib is not installed (pip install matplotlib)")

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, (path, series) in enumerate(runs):
        color, name = f"C{i}", os.path.basename(path)
        if series["train_loss"]:
            xs, ys = zip(*smooth(series["train_loss"], args.smooth))
            label = f"{name} train" + (f" (mean of {args.smooth})" if args.smooth > 1 else "")
            ax.plot(xs, ys, color=color, alpha=0.8, linewidth=1, label=label)
        if series["val_loss"]:
            xs, ys = zip(*series["val_loss"])
            ax.plot(xs, ys, color=color, marker="o", markersize=3, linestyle="--", label=f"{name} val")
    ax.set_xlabel({"step": "step", "tokens": "tokens", "seconds": "training seconds (summed step ms)"}[args.x])
    ax.set_ylabel("loss")
    if args.logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    handles = ax.get_legend_handles_labels()
    if any(s["hellaswag_acc"] for _, s in runs):
        acc_ax = ax.twinx()
        for i, (path, series) in enumerate(runs):
            if series["hellaswag_acc"]:
                xs, ys = zip(*series["hellaswag_acc"])
                acc_ax.plot(xs, ys, color=f"C{i}", marker="s", markersize=3, linestyle=":",
                            label=f"{os.path.basename(path)} hellaswag")
        acc_ax.set_ylabel("HellaSwag accuracy (acc_norm)")
        more = acc_ax.get_legend_handles_labels()
        handles = (handles[0] + more[0], handles[1] + more[1])
    ax.legend(*handles)
    if args.title:
        ax.set_title(args.title)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=120)
    except OSError as e:
        die(f"{out}: cannot write ({e.strerror})")
    summary = ", ".join(f"{os.path.basename(pth)}: {len(s['train_loss'])} train / {len(s['val_loss'])} val"
                        + (f" / {len(s['hellaswag_acc'])} hellaswag" if s["hellaswag_acc"] else "") + " points"
                        for pth, s in runs)
    print(f"wrote {out} ({summary})")


if __name__ == "__main__":
    main()
