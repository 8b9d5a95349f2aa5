"""Tiny Shakespeare (1.1 MB of plays) as GPT-2 token shards, the first data set to train on.

    python3 scripts/data/tinyshakespeare.py [--source input.txt] [--out-dir data] [--tokenizer tokenizer.json]

Writes data/tinyshakespeare/tiny_shakespeare_{val,train}.bin and data/gpt2_tokenizer.bin; with
--tokenizer DIR/tokenizer.json (a Hugging Face tokenizer), data/tinyshakespeare_DIR/... and
data/DIR_tokenizer.bin (uint32 shards when the vocabulary exceeds 65,536 ids).
The text is split into sections at blank lines; each section (with the blank line that ended it)
is tokenized after the document token (<|endoftext|>, or the tokenizer's BOS: common.py), so with
GPT-2's BPE decoding the tokens without the separators gives back the text byte for byte. Split: the FIRST --val-tokens tokens (default 32,768) are the
validation set and the rest the training set, as in llm.c, so val losses compare with its
published numbers; the last 10% would be the more usual choice but breaks that comparison.
Offline: --source FILE, or LLMC_OFFLINE_DATA=folder holding tinyshakespeare.txt and gpt2.tiktoken.
"""
import argparse
from pathlib import Path

import numpy as np

from common import (DataError, add_common_args, add_tokenizer_args, check_out_dir, dataset_dir, fetch, offline_dir,
                    prepare_out_dir, run_main, tokenizer_from_args, write_shard, write_tokenizer_table)

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


def tokenize_sections(tok, text):
    """The document token before each blank-line-separated section; sections keep their separator."""
    sections = text.split("\n\n")
    tokens = []
    for i, s in enumerate(sections):
        tokens.append(tok.doc_token)
        tokens.extend(tok.encode(s if i == len(sections) - 1 else s + "\n\n"))
    return np.array(tokens, dtype=np.uint32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, "the text file (default: download, or $LLMC_OFFLINE_DATA/tinyshakespeare.txt)")
    add_tokenizer_args(ap)
    ap.add_argument("--val-tokens", type=int, default=32768, help="tokens at the start that form the val split")
    args = ap.parse_args()
    if args.val_tokens < 1:
        raise DataError(f"--val-tokens {args.val_tokens}: must be positive")
    tok = tokenizer_from_args(args)  # the ranks load at first use: a missing source is reported first
    out = dataset_dir(args.out_dir, "tinyshakespeare", tok)
    check_out_dir(out)  # before any work; created once the input has been checked
    if args.source is None and offline_dir() is None:
        prepare_out_dir(out)  # the download goes there
    src = fetch(URL, out / "tiny_shakespeare.txt", "tinyshakespeare.txt", args.source)
    try:
        text = src.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{src}: cannot read as UTF-8 text ({e})")
    if not text.strip():
        raise DataError(f"{src}: no text (the file is empty or only whitespace)")
    tokens = tokenize_sections(tok, text)
    if args.val_tokens < 1 or args.val_tokens >= tokens.size:
        raise DataError(f"--val-tokens {args.val_tokens}: must be in [1, {tokens.size}) "
                        f"({src} has {tokens.size} tokens)")
    prepare_out_dir(out)  # (only now: a bad flag or input leaves nothing behind)
    for split, part in (("val", tokens[:args.val_tokens]), ("train", tokens[args.val_tokens:])):
        path = out / f"tiny_shakespeare_{split}.bin"
        write_shard(path, part, tok.vocab_size)
        print(f"wrote {path} ({part.size:,} tokens)")
    write_tokenizer_table(tok, args.out_dir)


if __name__ == "__main__":
    run_main(main)
