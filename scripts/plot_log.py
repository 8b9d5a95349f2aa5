#!/usr/bin/env python3
"""Plots train and validation loss (and HellaSwag accuracy, on a right-hand axis, where a log has it)
against step from one or more trainer logs into a PNG.

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
  python3 scripts/plot_log.py --summary run.log                  # best and last val loss, no plot
Needs matplotlib (pip install matplotlib), except for --summary."""
import argparse
import os
import sys


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def parse_log(path):
    """{'train_loss': [(step, x)], 'val_loss': [...], 'hellaswag_acc': [...]} from the `step <n> key value ...` lines."""
    series = {"train_loss": [], "val_loss": [], "hellaswag_acc": []}
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
    p.add_argument("--summary", action="store_true", help="print each log's best and last val loss instead of plotting")
    args = p.parse_args(argv)
    if args.summary:
        for path in args.logs:
            print(val_summary(path, parse_log(path)))
        return
    if args.smooth < 1:
        p.error(f"--smooth must be >= 1, got {args.smooth}")
    out = args.out or os.path.splitext(args.logs[0])[0] + ".png"
    if not out.lower().endswith(".png"):
        p.error(f"--out {out}: expected a .png file name")
    runs = [(path, parse_log(path)) for path in args.logs]
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
            steps, xs = zip(*smooth(series["train_loss"], args.smooth))
            label = f"{name} train" + (f" (mean of {args.smooth})" if args.smooth > 1 else "")
            ax.plot(steps, xs, color=color, alpha=0.8, linewidth=1, label=label)
        if series["val_loss"]:
            steps, xs = zip(*series["val_loss"])
            ax.plot(steps, xs, color=color, marker="o", markersize=3, linestyle="--", label=f"{name} val")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if args.logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    handles = ax.get_legend_handles_labels()
    if any(s["hellaswag_acc"] for _, s in runs):
        acc_ax = ax.twinx()
        for i, (path, series) in enumerate(runs):
            if series["hellaswag_acc"]:
                steps, xs = zip(*series["hellaswag_acc"])
                acc_ax.plot(steps, xs, color=f"C{i}", marker="s", markersize=3, linestyle=":",
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
