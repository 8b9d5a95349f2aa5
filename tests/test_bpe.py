"""Checks of the C++ GPT-2 BPE encoder (llmc/bpe.h) that need more than the committed fixture:
- all of tiny Shakespeare encodes to exactly tiktoken's ids (build/test_bpe --encode, with the
  tokenizer file written from the same ranks tiktoken uses);
- tests/fixture/bpe_cases.bin is what tests/make_bpe_fixture.py writes from GPT-2's real ranks,
  and llmc/unicode_tables.h what scripts/gen_unicode_tables.py writes (no stale or edited copy).
GPT-2's ranks and the text come from $LLMC_OFFLINE_DATA (gpt2.tiktoken, tinyshakespeare.txt) or
the network; without them, or without unicodedata2 16.0.0 for the tables, those tests skip and
say why. Needs build/test_bpe (make build/test_bpe). Run: python3 -m pytest -q tests/test_bpe.py"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "data"))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import common  # noqa: E402
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


def test_tinyshakespeare_matches_tiktoken(tmp_path, enc):
    if not TEST_BPE.exists():
        pytest.skip(f"{TEST_BPE} is not built (make build/test_bpe)")
    text_path = shakespeare_text()
    text = text_path.read_text(encoding="utf-8")
    common.write_tokenizer_table(enc, tmp_path / "gpt2_tokenizer.bin")
    p = subprocess.run([TEST_BPE, "--encode", text_path, "--tokenizer", tmp_path / "gpt2_tokenizer.bin",
                        "--out", tmp_path / "ids.bin"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    print(p.stdout.strip())
    ours = np.fromfile(tmp_path / "ids.bin", dtype="<i4")
    ref = np.array(enc.encode_ordinary(text), dtype=np.int32)
    assert len(text) > 1_000_000 and ref.size > 300_000, "the whole of tiny Shakespeare"
    if ours.size != ref.size or not np.array_equal(ours, ref):
        n = min(ours.size, ref.size)
        first = int(np.argmax(ours[:n] != ref[:n])) if np.any(ours[:n] != ref[:n]) else n
        near = enc.decode(ref[max(0, first - 5):first + 5].tolist())
        pytest.fail(f"{ours.size} ids, tiktoken {ref.size}; first difference at id {first}: "
                    f"ours {ours[first:first + 5].tolist()}, tiktoken {ref[first:first + 5].tolist()} near {near!r}")


def test_fixture_is_current(enc):
    if enc.encode_ordinary("Hello world") != [15496, 995]:
        pytest.skip("not GPT-2's ranks")
    data, _, _ = make_bpe_fixture.fixture_bytes(enc)
    assert data == Path(make_bpe_fixture.OUT_PATH).read_bytes(), \
        "tests/fixture/bpe_cases.bin is stale: rerun python3 tests/make_bpe_fixture.py"


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
