"""Checks of the C++ GPT-2 BPE encoder (llmc/bpe.h) that need more than the committed fixture:
- all of tiny Shakespeare encodes to exactly tiktoken's ids (build/test_bpe --encode, with the
  tokenizer file written from the same ranks tiktoken uses);
- so does 0.5 MB of seeded random text (words of many scripts, digits, punctuation, contractions,
  runs of every kind of whitespace, combining marks, emoji, any code point), with GPT-2's ranks
  and, always (no data needed), with a synthetic vocabulary whose merges build multi-byte
  characters and words;
- tests/fixture/bpe_cases.bin is what tests/fixture/make_bpe_fixture.py writes from GPT-2's real ranks,
  and llmc/unicode_tables.h what scripts/gen_unicode_tables.py writes (no stale or edited copy).
GPT-2's ranks and the text come from $LLMC_OFFLINE_DATA (gpt2.tiktoken, tinyshakespeare.txt) or
the network; without them, or without unicodedata2 16.0.0 for the tables, those tests skip and
say why. Needs build/test_bpe (make build/test_bpe). Run: python3 -m pytest -q tests/python/test_bpe.py"""
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "data"))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "fixture"))
import common  # noqa: E402  (also puts scripts/ on the path for llmc_formats)
import llmc_formats as fmt  # noqa: E402
import tiktoken  # noqa: E402
import gen_unicode_tables  # noqa: E402
import make_bpe_fixture  # noqa: E402
from tinyshakespeare import URL as SHAKESPEARE_URL  # noqa: E402

TEST_BPE = ROOT / "build" / "test_bpe"


@pytest.fixture(scope="module")
def enc():
    try:
        return common.get_encoding()
    except common.DataError as e:
        pytest.skip(f"GPT-2's ranks are not available ({e})")


def shakespeare_text():
    try:
        path = common.fetch(SHAKESPEARE_URL, ROOT / "data" / "tinyshakespeare" / "tiny_shakespeare.txt",
                            "tinyshakespeare.txt")
    except common.DataError as e:
        pytest.skip(f"tiny Shakespeare is not available ({e})")
    return path


def encode_with_ours(tmp_path, enc, text_path):
    """build/test_bpe's ids for the file, with a tokenizer file written from enc's vocabulary."""
    if not TEST_BPE.exists():
        pytest.skip(f"{TEST_BPE} is not built (make build/test_bpe)")
    table = [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]
    fmt.write_tokenizer(tmp_path / "tokenizer.bin", table, enc.eot_token)
    p = subprocess.run([TEST_BPE, "--encode", text_path, "--tokenizer", tmp_path / "tokenizer.bin",
                        "--out", tmp_path / "ids.bin"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    print(p.stdout.strip())
    return np.fromfile(tmp_path / "ids.bin", dtype="<i4")


def assert_same_ids(enc, ours, ref):
    if ours.size != ref.size or not np.array_equal(ours, ref):
        n = min(ours.size, ref.size)
        first = int(np.argmax(ours[:n] != ref[:n])) if np.any(ours[:n] != ref[:n]) else n
        near = enc.decode(ref[max(0, first - 5):first + 5].tolist())
        pytest.fail(f"{ours.size} ids, tiktoken {ref.size}; first difference at id {first}: "
                    f"ours {ours[first:first + 5].tolist()}, tiktoken {ref[first:first + 5].tolist()} near {near!r}")


def test_tinyshakespeare_matches_tiktoken(tmp_path, enc):
    text_path = shakespeare_text()
    text = text_path.read_text(encoding="utf-8")
    ref = np.array(enc.encode_ordinary(text), dtype=np.int32)
    assert len(text) > 1_000_000 and ref.size > 300_000, "the whole of tiny Shakespeare"
    assert_same_ids(enc, encode_with_ours(tmp_path, enc, text_path), ref)


# Pieces of random text: (weight, generator of one piece from a random.Random)
WHITESPACE = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\x0b", "\x0c", "\u00a0", "\u3000", "\u2028", "\u0085",
              "\u2003", " \n", "\n ", "\t\t "]
SCRIPTS = [(0x61, 0x7A), (0x41, 0x5A), (0xC0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF),
           (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x10A0, 0x10FF), (0x3040, 0x30FF), (0x4E00, 0x4E80),
           (0xAC00, 0xAC80), (0x1D400, 0x1D4FF), (0x20000, 0x20080), (0x2EBF0, 0x2EC10)]
SYMBOLS = [(0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E), (0x2010, 0x205E), (0x2190, 0x21FF),
           (0x1F300, 0x1F64F), (0x300, 0x36F), (0xFE00, 0xFE0F), (0x200B, 0x200D), (0x0, 0x1F)]
NUMBERS = [(0x30, 0x39), (0x660, 0x669), (0xBC, 0xBE), (0x2160, 0x2188), (0xFF10, 0xFF19)]


def random_char(rng, blocks):
    lo, hi = rng.choice(blocks)
    return chr(rng.randint(lo, hi))


def random_code_point(rng):
    """Any code point but the surrogates (a str holding one cannot be encoded)."""
    while 0xD800 <= (c := rng.randint(0, 0x10FFFF)) <= 0xDFFF:
        pass
    return chr(c)


def random_text(seed, n_pieces):
    rng = random.Random(seed)
    kinds = [
        (30, lambda: "".join(random_char(rng, SCRIPTS[:2]) for _ in range(rng.randint(1, 9)))),
        (12, lambda: "".join(random_char(rng, SCRIPTS) for _ in range(rng.randint(1, 6)))),
        (20, lambda: rng.choice(WHITESPACE)),
        (8, lambda: "".join(random_char(rng, NUMBERS) for _ in range(rng.randint(1, 5)))),
        (8, lambda: "".join(random_char(rng, SYMBOLS) for _ in range(rng.randint(1, 4)))),
        (5, lambda: rng.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'x", "'", "\u2019s"])),
        (3, lambda: rng.choice("aeo!.=- ") * rng.randint(2, 40)),  # equal-rank pairs: leftmost first
        (2, lambda: random_code_point(rng)),
        (1, lambda: "<|endoftext|>"),  # ordinary text here
    ]
    weights = [w for w, _ in kinds]
    return "".join(rng.choices(kinds, weights)[0][1]() for _ in range(n_pieces))


def synthetic_encoding(text):
    """A vocabulary unlike GPT-2's, from this text: every byte, then the UTF-8 prefixes of its
    characters (so multi-byte characters merge), then the pairs of its most common characters and
    prefixes of its most common words, all ranked by frequency."""
    from collections import Counter
    ranks = {bytes([b]): b for b in range(256)}

    def add(b):
        if 1 <= len(b) <= 255 and b not in ranks:
            ranks[b] = len(ranks)
    for ch, _ in Counter(text).most_common():
        raw = ch.encode()
        for k in range(2, len(raw) + 1):
            add(raw[:k])
    chars = [c for c, _ in Counter(text).most_common(60)]
    for a in chars:
        for b in chars[:30]:
            add((a + b).encode())
    for word, _ in Counter(text.split()).most_common(2000):
        raw = word.encode()
        for k in range(3, len(raw) + 1):
            add(raw[:k])
    return tiktoken.Encoding("synthetic", pat_str=common.GPT2_SPLIT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": len(ranks)})


@pytest.mark.parametrize("vocab", ["gpt2", "synthetic"])
def test_random_text_matches_tiktoken(tmp_path, vocab):
    text = random_text(seed=15, n_pieces=120_000)
    if vocab == "gpt2":
        try:
            enc = common.get_encoding()
        except common.DataError as e:
            pytest.skip(f"GPT-2's ranks are not available ({e})")
    else:
        enc = synthetic_encoding(text)
    (tmp_path / "text.txt").write_bytes(text.encode())
    ref = np.array(enc.encode_ordinary(text), dtype=np.int32)
    assert len(text.encode()) > 400_000
    assert_same_ids(enc, encode_with_ours(tmp_path, enc, tmp_path / "text.txt"), ref)


def test_fixture_is_current(enc):
    if enc.encode_ordinary("Hello world") != [15496, 995]:
        pytest.skip("not GPT-2's ranks")
    data, _, _ = make_bpe_fixture.fixture_bytes(enc)
    assert data == Path(make_bpe_fixture.OUT_PATH).read_bytes(), \
        "tests/fixture/bpe_cases.bin is stale: rerun python3 tests/fixture/make_bpe_fixture.py"


def test_unicode_tables_are_current(tmp_path, capsys):
    try:
        import unicodedata2
    except ImportError:
        pytest.skip(f"needs unicodedata2 {gen_unicode_tables.UNICODE_VERSION} (pip install "
                    f"unicodedata2=={gen_unicode_tables.UNICODE_VERSION})")
    if unicodedata2.unidata_version != gen_unicode_tables.UNICODE_VERSION:
        pytest.skip(f"unicodedata2 has Unicode {unicodedata2.unidata_version}, the tables are "
                    f"{gen_unicode_tables.UNICODE_VERSION}")
    out = tmp_path / "unicode_tables.h"
    subprocess.run([sys.executable, ROOT / "scripts" / "gen_unicode_tables.py", "--out", out], check=True,
                   capture_output=True)
    assert out.read_bytes() == (ROOT / "llmc" / "unicode_tables.h").read_bytes(), \
        "llmc/unicode_tables.h differs from what scripts/gen_unicode_tables.py writes"
