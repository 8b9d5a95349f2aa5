"""HellaSwag (sentence completion, 4 choices) as an eval file the trainers score during training.

    python3 scripts/data/hellaswag.py [--split val] [--source hellaswag_val.jsonl] [--out-dir data]
    build/train_gpt2cu ... --hellaswag data/hellaswag/hellaswag_val.bin --hellaswag-every 250

Writes data/hellaswag/hellaswag_val.bin in the GPTE format of docs/formats.md. For each example the
context ("ctx") is tokenized on its own and each ending as " " + ending (GPT-2 sees the space
that joins them as part of the ending's first token); the model's choice is the ending whose
tokens get the lowest mean cross-entropy after the context ("acc_norm"; llmc/hellaswag.h in the
trainers, `scripts/train_gpt2.py --hellaswag FILE` in PyTorch). Random guessing scores 25%;
GPT-2 124M about 29%. The trainers need --seq of at least the longest example less one token
(printed below).
Offline: --source FILE, or LLMC_OFFLINE_DATA=folder holding hellaswag_<split>.jsonl and gpt2.tiktoken.
"""
import argparse
import json
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common import VOCAB_SIZE, DataError, add_common_args, fetch, get_encoding, run_main
import llmc_formats  # noqa: E402  (common put scripts/ on the path)

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_{split}.jsonl"
NUM_CHOICES = 4


def read_examples(path):
    """(label, context, endings) of every line of a HellaSwag jsonl file."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                ex = json.loads(line)
                label, ctx, endings = int(ex["label"]), ex["ctx"], ex["endings"]
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(f"{path}:{lineno}: not a labelled HellaSwag example ({type(e).__name__}: {e})")
            if len(endings) != NUM_CHOICES or not 0 <= label < NUM_CHOICES or not ctx or not all(endings):
                raise DataError(f"{path}:{lineno}: need a non-empty ctx, {NUM_CHOICES} non-empty endings "
                                f"and a label in 0..{NUM_CHOICES - 1}")
            out.append((label, ctx, endings))
    if not out:
        raise DataError(f"{path}: no examples")
    return out


def tokenize_example(enc, ctx, endings):
    return enc.encode_ordinary(ctx), [enc.encode_ordinary(" " + e) for e in endings]


def write_eval(path, examples, vocab_size):
    """examples: (label, context tokens, [tokens of each choice]), the same number of choices in
    each. Layout in docs/formats.md."""
    payload, max_row, choices = [], 0, len(examples[0][2])
    for label, ctx, ends in examples:
        if len(ends) != choices or not 0 <= label < choices:
            raise DataError(f"{path}: every example needs {choices} choices and a label below that")
        payload += [label, len(ctx)] + [len(e) for e in ends] + list(ctx)
        for e in ends:
            payload += e
        max_row = max(max_row, len(ctx) + max(len(e) for e in ends))
    if max_row > 65535:
        raise DataError(f"{path}: an example of {max_row} tokens does not fit the uint16 lengths")
    payload = np.array(payload, dtype="<u2")
    header = llmc_formats.make_header(llmc_formats.MAGIC_EVAL, {2: len(examples), 3: vocab_size, 4: choices,
                                                                  5: max_row, 6: payload.size})
    llmc_formats.atomic_write(str(path), [header, payload])


def read_eval(path):
    """Validating reader (the C++ one is EvalLoader in llmc/dataloader.h, which llmc/hellaswag.h uses); returns
    (examples as in write_eval, vocab_size). Raises llmc_formats.FormatError naming the file."""
    h, size = llmc_formats.read_header(path, llmc_formats.MAGIC_EVAL)
    n, vocab, choices, max_row, length = (int(x) for x in h[2:7])
    if n < 1 or not 1 <= vocab <= 65536 or not 2 <= choices <= 64 or not 2 <= max_row <= 65535 or length < 1:
        raise llmc_formats.FormatError(f"{path}: header sizes out of range (examples {n}, vocab {vocab}, "
                                       f"choices {choices}, max row {max_row}, payload {length})")
    llmc_formats.check_length(path, size, 2 * length)
    a = np.fromfile(path, dtype="<u2", offset=llmc_formats.HEADER_BYTES).astype(np.int64)
    examples, pos, fields = [], 0, 2 + choices  # label, context length, one length per choice
    for i in range(n):
        if pos + fields > length:
            raise llmc_formats.FormatError(f"{path}: payload ends inside example {i} of {n}")
        label, nctx, lens = a[pos], a[pos + 1], a[pos + 2:pos + fields]
        end = pos + fields + nctx + lens.sum()
        if label >= choices or nctx < 1 or lens.min() < 1 or nctx + lens.max() > max_row or end > length:
            raise llmc_formats.FormatError(f"{path}: example {i} has a bad label or lengths")
        toks = a[pos + fields:end]
        if toks.max() >= vocab:
            raise llmc_formats.FormatError(f"{path}: example {i} has token id {toks.max()} >= vocab_size {vocab}")
        cuts = np.cumsum([nctx] + list(lens))
        examples.append((int(label), toks[:nctx].tolist(), [toks[cuts[j]:cuts[j + 1]].tolist()
                                                            for j in range(choices)]))
        pos = end
    if pos != length:
        raise llmc_formats.FormatError(f"{path}: {length - pos} values after the last example")
    return examples, vocab


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, "a HellaSwag jsonl file (default: download, or $LLMC_OFFLINE_DATA/hellaswag_<split>.jsonl)")
    ap.add_argument("--split", default="val", choices=["val", "train"], help="which split (the test split has no labels)")
    args = ap.parse_args()
    out = Path(args.out_dir) / "hellaswag"
    name = f"hellaswag_{args.split}"
    src = fetch(URL.format(split=args.split), out / f"{name}.jsonl", f"{name}.jsonl", args.source)
    raw = read_examples(src)
    enc = get_encoding(args.ranks)
    examples = [(label, *tokenize_example(enc, ctx, endings)) for label, ctx, endings in tqdm(raw, desc=name)]
    out.mkdir(parents=True, exist_ok=True)
    write_eval(out / f"{name}.bin", examples, VOCAB_SIZE)
    longest = max(len(ctx) + max(len(e) for e in ends) for _, ctx, ends in examples)
    print(f"wrote {out / (name + '.bin')} ({len(examples)} examples, the longest {longest} tokens: "
          f"the trainers' --seq must be at least {longest - 1})")


if __name__ == "__main__":
    run_main(main)
