#!/usr/bin/env python3
"""Text <-> token ids with a Hugging Face tokenizer.json, for build/generate_cpu and build/generate,
whose text prompts go through GPT-2's BPE only: encode the prompts here, generate from the ids
(--prompt-ids / --prompt-ids-file, output as ids without --tokenizer), decode the ids here.

    python3 scripts/tokenize_prompt.py --tokenizer DIR/tokenizer.json "To be, or not to be"    # 1,1271,...
    python3 scripts/tokenize_prompt.py --tokenizer DIR/tokenizer.json --file prompts.txt > ids.txt
    build/generate_cpu --model llama.bin --prompt-ids-file ids.txt --eot 128001 > out.txt
    python3 scripts/tokenize_prompt.py --tokenizer DIR/tokenizer.json --decode < out.txt
    python3 scripts/tokenize_prompt.py --tokenizer DIR/tokenizer.json --chat DIR/tokenizer_config.json "kqaz"

Encoding puts the tokenizer's document token first (the token the data scripts write before every
document, chosen as they choose it: --doc-token, tokenizer_config.json's bos_token, ...; a model
trained on those shards, or a Llama with its BOS, expects it); --no-doc-token leaves it out. One
line of comma-separated ids per prompt (--file: per line of the file). Decoding reads lines of ids
separated by commas or spaces, each optionally after generate's `[i] ` batch prefix, and prints
each line's text (the prefix kept); with --prompt-ids the output holds the new tokens only.
--chat CONFIG renders each prompt as one user turn with that tokenizer_config.json's chat template and
its generation prompt (as transformers' apply_chat_template(add_generation_prompt=True) renders it; the
template's special tokens become their ids, as scripts/data/chat.py writes them), the document token
first unless the template starts with it. Needs the `tokenizers` package (and jinja2 for --chat).
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
from common import DataError, HFTokenizer, add_tokenizer_args, run_main  # noqa: E402  (the data scripts' tokenizer)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_tokenizer_args(ap, "the Hugging Face tokenizer.json to encode or decode with (required; needs "
                       "`pip install tokenizers`)",
                       "the token put first in each encoded prompt, as the data scripts put it before every "
                       "document")
    ap.add_argument("text", nargs="*", help="prompts to encode (one line of ids each)")
    ap.add_argument("--file", help="encode each line of this file (blank lines are skipped)")
    ap.add_argument("--no-doc-token", action="store_true", help="do not put the document token first")
    ap.add_argument("--decode", action="store_true", help="decode lines of ids from stdin instead")
    ap.add_argument("--chat", metavar="CONFIG", help="render each prompt as a user turn with this "
                    "tokenizer_config.json's chat template and its generation prompt before encoding")
    args = ap.parse_args()
    if not args.tokenizer:
        raise DataError("--tokenizer FILE (a tokenizer.json) is required")
    tok = HFTokenizer(args.tokenizer, args.doc_token)
    if args.decode:
        if args.text or args.file or args.chat:
            raise DataError("--decode reads ids from stdin; give no prompts, --file or --chat with it")
        for lineno, line in enumerate(sys.stdin, 1):
            m = re.match(r"\s*(\[\d+\]\s)?(.*)$", line.rstrip("\n"))
            words = [w for w in re.split(r"[,\s]+", m.group(2)) if w]
            bad = [w for w in words if not w.isdigit() or int(w) >= tok.vocab_size]
            if bad:
                raise DataError(f"stdin line {lineno}: {bad[0]!r} is not a token id of {args.tokenizer} "
                                f"(vocab_size {tok.vocab_size})")
            print((m.group(1) or "") + tok.tok.decode([int(w) for w in words], skip_special_tokens=False))
        return
    prompts = list(args.text)
    if args.file:
        try:
            with open(args.file, encoding="utf-8") as f:
                prompts += [line.rstrip("\n") for line in f if line.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"--file {args.file}: cannot read as UTF-8 text ({e})")
    if not prompts:
        raise DataError("no prompt: give the text as arguments or --file FILE (or --decode)")
    encode = tok.encode
    if args.chat:
        from chat import jinja_renderer, special_encoder  # the data script's template rendering
        render, special = jinja_renderer(args.chat), special_encoder(tok)
        encode = lambda p: special(render([{"role": "user", "content": p}], True))  # noqa: E731
    for p in prompts:
        ids = encode(p)
        if not args.no_doc_token and not (args.chat and ids[:1] == [tok.doc_token]):
            ids = [tok.doc_token] + ids
        print(",".join(map(str, ids)))


if __name__ == "__main__":
    run_main(main)
