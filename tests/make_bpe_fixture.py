"""Writes tests/fixture/bpe_cases.bin: texts that trip BPE encoders, each with the ids tiktoken's
"gpt2" encoding gives and the pieces tiktoken's regex cuts it into (GPT-2's pre-tokenizer), which
tests/test_bpe.cpp checks llmc/bpe.h against. The pieces are checked on their own because a wrong
cut often gives the same ids (no merge crosses it) but would show on other text.

Regenerate (needs tiktoken and GPT-2's ranks; deterministic, so the file only changes with CASES):
    LLMC_OFFLINE_DATA=DIR python3 tests/make_bpe_fixture.py [--ranks FILE] [--out PATH]
The ranks come from --ranks, else $LLMC_OFFLINE_DATA/gpt2.tiktoken, else tiktoken's download
(scripts/data/common.py's get_encoding). Every expected id comes from tiktoken; none from our C++.

The fixture carries the part of the vocabulary its texts need, so the C++ test needs neither the
network nor data/gpt2_tokenizer.bin (371 KB): every token whose bytes occur somewhere in a case's
text, all 256 single bytes and <|endoftext|>. That is enough for any encoder of these texts to
give the same ids as with the whole vocabulary: every merge BPE can consider, and every piece,
is a substring of the text. (tests/test_bpe.py checks all of tiny Shakespeare with the whole
vocabulary.)

File (docs/formats.md convention): 1024-byte header of 128 little-endian int64, h[0] =
fourcc("GPTB"), h[1] = 1 (version), h[2] = vocab_size (ids are below it), h[3] = the end-of-text
id, h[4] = number of tokens stored, h[5] = number of cases. Then per token: int32 id, uint8
length (1..255), the bytes; then per case: int32 flags (bit 0: <|endoftext|> is allowed as the
special token, tiktoken's allowed_special; else encode_ordinary), int32 text length, the UTF-8
bytes, int32 number of ids, the int32 ids, int32 number of pieces, the int32 byte length of each
piece (of the whole text as ordinary text). All little-endian.
"""
import argparse
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "data"))
import common  # noqa: E402  (also puts scripts/ on the path for llmc_formats)
import llmc_formats as fmt  # noqa: E402
from gen_unicode_tables import tiktoken_piece_lengths  # noqa: E402

MAGIC_BPE_CASES = fmt.fourcc("GPTB")
OUT_PATH = os.path.join(ROOT, "tests", "fixture", "bpe_cases.bin")
ALLOW_EOT = 1

CASES = [
    # plain text and the space that leads a word
    "Hello world", "hello  world", "  hello", "hello  ", "trailing spaces   ", " leading", "x",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n",
    # whitespace runs: the lookahead \s+(?!\S) keeps the last one for the next word
    "\n", "\n\n", "\n\n\n", "a\n\nb", "a\n\n\n\nb", "line1\nline2\r\nline3\r\n", "   \n  \n\t \n",
    "\thello\t\tworld\t", "a \t\n b", "tab\tseparated\tvalues", "  \n", " \n ", "end with newline\n",
    "x\u00a0y \u00a0z", "ideographic\u3000space", "a\u2028b\u2029c", "next\u0085line", "\u2003\u2003em",
    " " * 17, "\n" * 9, "\t \t \t", "  word  word  ",
    # contractions (ASCII apostrophe, lower case only)
    "I'm you're we've they'll he'd it's don't", "IT'S DON'T WE'LL", "'s's'", "''s", "rock 'n' roll",
    "'tis 'twas", "the dog's bone", "it\u2019s curly", "'ll'll've're'd'm't", "o'clock", " 's", "!'s",
    # numbers
    "123 4567 89012345", "3.14159", "1,000,000", "x2y", "12abc abc12", "\u0663\u0664\u0665 \u0669",
    "\u00bd \u2153 \u00b2\u00b3", "\u216b \u2160\u2161", " 2024-12-03", "0123456789" * 8, "$9.99", "#1",
    # punctuation and symbols
    "Hello!!! ... ??? --- ***", " !!!", "a!b?c", "(parens) [brackets] {braces}", "e-mail@example.com",
    "https://example.com/path?q=1&r=2", "#include <stdio.h>", "x = y + z * 2;", "<<<>>>", " -- ",
    "\"quoted\" and 'single'", "~`^|\\", "!" * 70,
    # letters of many scripts; a letter before '!' shows where the letter run ends
    "\u00dcn\u00efc\u00f6d\u00e9 fa\u00e7ade na\u00efve",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u03ba\u03b5\u03af\u03bc\u03b5\u03bd\u03bf",
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442", "\u05e2\u05d1\u05e8\u05d9\u05ea",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0646\u0635",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092a\u093e\u0920",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u4e2d\u6587\u6587\u672c",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u0e44\u0e17\u0e22", "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8",
    "\u13e3\u13b3\u13a9", "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522",
    "\U00020000\U00020001 \U0002ebf0!", "\U00011f04\U00011f05!", "a\U0001ccf0!", "x\u0663y", "\u00aa\u00b5\u00ba!",
    "abc\u03b1\u03b2\u03b3\u0430\u0431\u0432", "\u65e5\u672c\u8a9eabc123",
    # combining marks are not letters: they cut a word
    "e\u0301", "cafe\u0301 latte", "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036bo",
    "\u0928\u092e\u0938\u094d\u0924\u0947",
    # emoji and other symbols
    "\U0001f600 \U0001f603 \U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f1fa\U0001f1f8", "I \u2764\ufe0f NY", "\u2603\u2604\u2605", " \U0001f600word",
    # controls, private use, replacement character, the last code point
    "\x00\x01\x7f", "\x1b[31mred\x1b[0m", "\ue000\uf8ff", "\ufffd", "\uffff\U0010ffff",
    # long pieces and repeated pairs (equal ranks: the leftmost merges first)
    "antidisestablishmentarianism", "supercalifragilisticexpialidocious", "a" * 300, "ab" * 200,
    " aaaa", "aaaaaaa", "ababab", "=" * 33, "...." * 10, "-" * 40,
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
    # end of text: a special token only when allowed
    "", "hello<|endoftext|>world", "<|endoftext|><|endoftext|>", "<|endoftext", "a <|endoftext|> b",
]
ALLOWED_SPECIAL_CASES = ["hello<|endoftext|>world", "<|endoftext|><|endoftext|>", "<|endoftext", "a <|endoftext|> b",
                         "<|endoftext|>", " <|endoftext|>\n", "text\n<|endoftext|>\nmore"]


def expected_ids(enc, text, flags):
    if flags & ALLOW_EOT:
        return enc.encode(text, allowed_special={"<|endoftext|>"}, disallowed_special=())
    return enc.encode_ordinary(text)


def needed_tokens(enc, texts):
    """{id: bytes} of every token that is a substring of one of the texts, every single byte and eot."""
    ranks = {enc.decode_single_token_bytes(i): i for i in range(enc.n_vocab)}
    longest = max(len(b) for b in ranks)
    out = {i: b for b, i in ranks.items() if len(b) == 1}
    out[common.EOT] = enc.decode_single_token_bytes(common.EOT)
    for text in texts:
        data = text.encode()
        for i in range(len(data)):
            for j in range(i + 2, min(len(data), i + longest) + 1):
                if data[i:j] in ranks:
                    out[ranks[data[i:j]]] = data[i:j]
    return out


def fixture_bytes(enc):
    cases = [(0, t) for t in CASES] + [(ALLOW_EOT, t) for t in ALLOWED_SPECIAL_CASES]
    tokens = needed_tokens(enc, [t for _, t in cases])
    body = bytearray()
    for i in sorted(tokens):
        body += struct.pack("<iB", i, len(tokens[i])) + tokens[i]
    for (flags, text), pieces in zip(cases, tiktoken_piece_lengths([t for _, t in cases])):
        data, ids = text.encode(), expected_ids(enc, text, flags)
        body += struct.pack("<ii", flags, len(data)) + data + struct.pack(f"<i{len(ids)}i", len(ids), *ids)
        body += struct.pack(f"<i{len(pieces)}i", len(pieces), *pieces)
    header = fmt.make_header(MAGIC_BPE_CASES, {2: enc.n_vocab, 3: common.EOT, 4: len(tokens), 5: len(cases)}).tobytes()
    return header + bytes(body), len(tokens), len(cases)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", help=f"GPT-2 ranks file (default ${common.OFFLINE_ENV}/{common.RANKS_FILE})")
    parser.add_argument("--out", default=OUT_PATH, help=f"output (default {OUT_PATH})")
    args = parser.parse_args()
    data, n_tokens, n_cases = fixture_bytes(common.get_encoding(args.ranks))
    fmt.atomic_write(args.out, [data])
    print(f"wrote {args.out}: {n_cases} cases, {n_tokens} tokens of the vocabulary, {len(data)} bytes")


if __name__ == "__main__":
    common.run_main(main)
