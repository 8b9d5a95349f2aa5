"""Checks of scripts/data/*.py, offline (no network), on short texts written here:
- the GPT-2 encoding built from the local ranks file gives GPT-2's published ids;
- each script's --source path writes shards whose tokens decode back to the input text, with an
  <|endoftext|> before every document, and headers/counts as docs/formats.md says;
- the sharded writers (tinystories, fineweb) resume after an interruption with the same bytes as
  an uninterrupted run, without rewriting finished shards or re-reading the documents they hold;
- hellaswag.py's eval file (GPTE) holds each example's label, context and endings;
- bad input (non-UTF-8 text, an empty source, an unusable --out-dir, ...) gives one `error:` line
  naming the file or flag, and exit status 1; a bad flag or a missing source writes nothing, not
  even --out-dir; a source that fills only the validation shard is refused (saying which
  --shard-size works); a write to a full disk (ENOSPC, simulated) names the file;
- --tokenizer tokenizer.json (a Hugging Face tokenizer built here with the `tokenizers` package:
  a small byte-level BPE, and a WordLevel with over 65,536 ids for uint32 shards): the shards hold
  that tokenizer's ids after its document token, decode back to the text, resume and refuse a run
  with another tokenizer; the document token is chosen as documented (skipped without `tokenizers`).
The GPT-2 ranks come from $LLMC_OFFLINE_DATA/gpt2.tiktoken (the folder the README's offline runs use).
Without them (a CI machine with no network) the tests use a synthetic ranks file of the same size
(every byte, then byte pairs), which exercises every code path; only the checks of GPT-2's published
ids skip. Run: python3 -m pytest -q tests/python/test_data_scripts.py (~10 s)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA_SCRIPTS = ROOT / "scripts" / "data"
sys.path.insert(0, str(DATA_SCRIPTS))
import common  # noqa: E402  (also puts scripts/ on the path for llmc_formats)
import hellaswag  # noqa: E402
import llmc_formats as fmt  # noqa: E402

EOT = 50256


def find_ranks():
    if os.environ.get("LLMC_SYNTHETIC_RANKS"):  # reproduce a CI machine without the real ranks
        return None
    d = os.environ.get(common.OFFLINE_ENV)
    if d and (Path(d) / common.RANKS_FILE).is_file():
        return Path(d) / common.RANKS_FILE
    return None


def synthetic_ranks():
    """A ranks file as large as GPT-2's (50256 entries): the 256 single bytes, then byte pairs,
    letters and spaces first so that merges happen on ordinary text."""
    import base64
    import tempfile
    common_bytes = b" etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLUCMFWYPVBGKJQXZ.,'"
    order = list(common_bytes) + [b for b in range(256) if b not in common_bytes]
    tokens = [bytes([b]) for b in range(256)]
    for a in order:
        for b in order:
            if len(tokens) == EOT:
                break
            tokens.append(bytes([a, b]))
    path = Path(tempfile.mkdtemp(prefix="llmc_ranks_")) / common.RANKS_FILE
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens)))
    return path


RANKS = find_ranks()
REAL_RANKS = RANKS is not None
if RANKS is None:
    RANKS = synthetic_ranks()
needs_real_ranks = pytest.mark.skipif(not REAL_RANKS, reason="GPT-2's real ranks (gpt2.tiktoken) not found: "
                                      "set LLMC_OFFLINE_DATA to check published ids")

# Documents with what trips tokenizers: contractions, digits, unicode, runs of spaces and blank
# lines, a literal <|endoftext|> (must stay text), a document longer than a shard.
DOCS = [
    "Once upon a time, there was a little dog named Max. He didn't like baths.",
    "Numbers: 3.14159, 2,718 and 42!  Two  spaces,   three.\n\nA new paragraph\twith a tab.",
    "Ünïcödé — “quotes”, emoji 🙂 and 日本語のテキスト.",
    "A literal <|endoftext|> inside a document is text, not a separator.",
    " ".join(f"word{i}" for i in range(60)),  # ~120 tokens: spans several 50-token shards
    "The end.",
] + [f"Story {i}: the cat sat on mat number {i * 7}. It was {'very ' * (i % 4)}happy." for i in range(30)]


@pytest.fixture(scope="module")
def enc():
    return common.get_encoding(RANKS)


def run_script(name, *args, env=None, check=True):
    """Runs scripts/data/<name>.py offline; returns the CompletedProcess."""
    e = dict(os.environ)
    e.pop(common.OFFLINE_ENV, None)
    e.update(env or {})
    p = subprocess.run([sys.executable, str(DATA_SCRIPTS / f"{name}.py"), *map(str, args)],
                       capture_output=True, text=True, env=e, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"{name}.py failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def assert_one_line_error(p, *parts):
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    errors = [line for line in p.stderr.splitlines() if "error" in line.lower()]  # progress bars may precede
    assert len(errors) == 1 and errors[0].startswith("error: ") and p.stderr.rstrip().endswith(errors[0]), p.stderr
    for part in parts:
        assert part in errors[0], (part, errors[0])


def split_documents(enc, tokens):
    """Decoded documents of a token stream that starts with <|endoftext|> before each one."""
    tokens = np.asarray(tokens).tolist()
    assert tokens[0] == EOT, "a shard set starts with <|endoftext|>"
    docs, cur = [], []
    for t in tokens[1:] + [EOT]:
        if t == EOT:
            docs.append(enc.decode(cur))
            cur = []
        else:
            cur.append(t)
    return docs


# ---------------------------------------------------------------- tokenizer
@needs_real_ranks
def test_offline_encoding_gives_gpt2_ids(enc):
    # ids from GPT-2's published encoder.json: "Hello"=15496, " world"=995, "'s"=338, "<|endoftext|>"=50256
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.encode_ordinary("it's") == [270, 338]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT]
    assert enc.n_vocab == 50257 and enc.eot_token == EOT
    for text in DOCS:
        assert enc.decode(enc.encode_ordinary(text)) == text


@needs_real_ranks
def test_offline_env_and_bad_ranks(tmp_path, monkeypatch):
    (tmp_path / common.RANKS_FILE).symlink_to(RANKS)
    monkeypatch.setenv(common.OFFLINE_ENV, str(tmp_path))
    assert common.get_encoding().encode_ordinary("Hello world") == [15496, 995]
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("not base64 at all\n")
    with pytest.raises(common.DataError, match="bad.tiktoken"):
        common.get_encoding(bad)
    with pytest.raises(common.DataError, match="missing.tiktoken: GPT-2 BPE ranks file not found"):
        common.get_encoding(tmp_path / "missing.tiktoken")
    monkeypatch.setenv(common.OFFLINE_ENV, str(tmp_path / "nope"))
    with pytest.raises(common.DataError, match="not a directory"):
        common.get_encoding()


# ---------------------------------------------------------------- tinyshakespeare
SHAKESPEARE = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
               "First Citizen:\nYou are all resolved rather to die than to famish?\n\n\nAll:\nResolved. resolved.\n")


def test_tinyshakespeare(tmp_path, enc):
    src = tmp_path / "input.txt"
    src.write_text(SHAKESPEARE)
    run_script("tinyshakespeare", "--source", src, "--out-dir", tmp_path / "data", "--ranks", RANKS, "--val-tokens", 9)
    val, vocab_val = fmt.read_shard(tmp_path / "data/tinyshakespeare/tiny_shakespeare_val.bin")
    train, vocab_train = fmt.read_shard(tmp_path / "data/tinyshakespeare/tiny_shakespeare_train.bin")
    assert vocab_val == vocab_train == 50257
    assert val.size == 9
    tokens = np.concatenate([val, train])
    sections = SHAKESPEARE.split("\n\n")
    assert int((tokens == EOT).sum()) == len(sections)
    # each section comes back with the blank line that ended it; together they are the text
    docs = split_documents(enc, tokens)
    assert docs == [s + "\n\n" for s in sections[:-1]] + [sections[-1]]
    assert "".join(docs) == SHAKESPEARE
    # the decode table the trainers print samples with gives the same bytes
    table, eot = fmt.read_tokenizer(tmp_path / "data/gpt2_tokenizer.bin")
    assert len(table) == 50257 and eot == EOT and (table[15496] == b"Hello" or not REAL_RANKS)
    assert b"".join(table[t] for t in tokens.tolist() if t != EOT).decode() == SHAKESPEARE


def test_tinyshakespeare_offline_env_and_errors(tmp_path):
    off = tmp_path / "offline"
    off.mkdir()
    (off / common.RANKS_FILE).symlink_to(RANKS)
    (off / "tinyshakespeare.txt").write_text(SHAKESPEARE)
    run_script("tinyshakespeare", "--out-dir", tmp_path / "data", "--val-tokens", 5, env={common.OFFLINE_ENV: off})
    assert fmt.read_shard(tmp_path / "data/tinyshakespeare/tiny_shakespeare_val.bin")[0].size == 5
    p = run_script("tinyshakespeare", "--source", off / "tinyshakespeare.txt", "--out-dir", tmp_path / "d2",
                   "--ranks", RANKS, check=False)  # the default 32768 val tokens: more than the text has
    assert_one_line_error(p, "--val-tokens 32768", "tinyshakespeare.txt has")
    p = run_script("tinyshakespeare", "--source", tmp_path / "absent.txt", "--out-dir", tmp_path / "d4", "--ranks", RANKS,
                   check=False)
    assert_one_line_error(p, "--source", "absent.txt", "no such file")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    p = run_script("tinyshakespeare", "--source", empty, "--out-dir", tmp_path / "d5", "--ranks", RANKS, check=False)
    assert_one_line_error(p, "empty.txt: no text")
    p = run_script("tinyshakespeare", "--out-dir", tmp_path / "d3", env={common.OFFLINE_ENV: tmp_path}, check=False)
    assert_one_line_error(p, "tinyshakespeare.txt: not found", common.OFFLINE_ENV)


# ---------------------------------------------------------------- sharded writers
def write_source(kind, path, docs):
    """The documents in one of the local formats the sharded scripts read."""
    if kind == "txt":  # TinyStoriesV2 style: documents separated by <|endoftext|> lines
        path.write_text("\n<|endoftext|>\n".join(docs) + "\n<|endoftext|>\n")
    elif kind == "jsonl":
        path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    elif kind == "json":  # TinyStories_all_data style, with --text-field story
        path.write_text(json.dumps([{"story": d} for d in docs]))
    return path


# (script, source format, extra flags, output folder under --out-dir)
SHARDED = [("tinystories", "txt", [], "tinystories"),
           ("tinystories", "json", ["--text-field", "story"], "tinystories"),
           ("fineweb", "jsonl", ["--edu"], "edu_fineweb")]


def shard_files(folder):
    """Shards in index order (by name, *_train_* would sort before *_val_000000)."""
    return sorted(Path(folder).glob("*.bin"), key=lambda p: p.stem[-6:])


@pytest.mark.parametrize("script,kind,flags,folder", SHARDED)
def test_sharded_roundtrip(tmp_path, enc, script, kind, flags, folder):
    docs = [d.strip("\n") for d in DOCS] if kind == "txt" else DOCS  # a .txt document has no edge newlines
    src = write_source(kind, tmp_path / f"docs.{kind}", docs)
    run_script(script, "--source", src, "--out-dir", tmp_path / "data", "--ranks", RANKS, "--shard-size", 50,
               "--workers", 2, *flags)
    name = folder
    files = shard_files(tmp_path / "data" / folder)
    assert [f.name for f in files] == [f"{name}_val_000000.bin"] + [f"{name}_train_{i:06d}.bin"
                                                                   for i in range(1, len(files))]
    shards = [fmt.read_shard(f) for f in files]
    assert all(v == 50257 for _, v in shards)
    sizes = [t.size for t, _ in shards]
    assert all(s == 50 for s in sizes[:-1]) and 1 <= sizes[-1] <= 50
    tokens = np.concatenate([t for t, _ in shards])
    assert tokens.size == sum(1 + len(enc.encode_ordinary(d)) for d in docs)
    assert split_documents(enc, tokens) == docs
    progress = json.loads((tmp_path / "data" / folder / f"{name}_progress.json").read_text())
    assert progress["finished"] and progress["shards_done"] == len(files)


def test_sharded_resume(tmp_path):
    """An interrupted run, resumed, writes the same bytes as one uninterrupted run."""
    src = write_source("jsonl", tmp_path / "docs.jsonl", DOCS)
    common_args = ["--ranks", RANKS, "--shard-size", 50, "--workers", 2]
    run_script("fineweb", "--source", src, "--out-dir", tmp_path / "ref", *common_args)
    ref = {f.name: f.read_bytes() for f in shard_files(tmp_path / "ref/fineweb")}
    assert len(ref) >= 6

    out = tmp_path / "run" / "fineweb"
    run_script("fineweb", "--source", src, "--out-dir", tmp_path / "run", *common_args, "--max-shards", 3)
    progress = json.loads((out / "fineweb_progress.json").read_text())
    assert progress["shards_done"] == 3 and not progress["finished"]
    assert [f.name for f in shard_files(out)] == list(ref)[:3]
    assert progress["next_document"] > 0 and progress["next_offset"] > 0  # stopped inside the long document
    # a kill while writing shard 3 leaves its temp file, or a stale shard from an older run
    (out / "fineweb_train_000003.bin.tmp").write_bytes(b"partial")
    (out / "fineweb_train_000003.bin").write_bytes(b"stale")
    before = {f.name: f.stat().st_mtime_ns for f in shard_files(out)[:3]}
    # documents the finished shards hold are skipped, not re-read into shards: change them in the
    # source and the resumed output must not notice
    lines = src.read_text().splitlines(keepends=True)
    for i in range(progress["next_document"]):
        lines[i] = json.dumps({"text": f"CHANGED {i}"}) + "\n"
    src.write_text("".join(lines))
    p = run_script("fineweb", "--source", src, "--out-dir", tmp_path / "run", *common_args)
    assert "resuming after 3 finished shards" in p.stdout
    assert {f.name: f.read_bytes() for f in shard_files(out)} == ref
    assert {f.name: f.stat().st_mtime_ns for f in shard_files(out)[:3]} == before
    assert not list(out.glob("*.tmp"))
    # a finished job is left alone; a different shard size is refused
    p = run_script("fineweb", "--source", src, "--out-dir", tmp_path / "run", *common_args)
    assert "already written" in p.stdout
    p = run_script("fineweb", "--source", src, "--out-dir", tmp_path / "run", "--ranks", RANKS, "--shard-size", 64,
                   check=False)
    assert_one_line_error(p, "fineweb_progress.json", "--shard-size 50", "this one 64")


def test_sharded_resume_refuses_damaged_output(tmp_path):
    """A finished shard that is missing or has the wrong length stops the resume with a message."""
    src = write_source("jsonl", tmp_path / "docs.jsonl", DOCS)
    args = ["--source", src, "--out-dir", tmp_path, "--ranks", RANKS, "--shard-size", 50, "--workers", 1]
    run_script("fineweb", *args, "--max-shards", 2)
    shard1 = tmp_path / "fineweb" / "fineweb_train_000001.bin"
    fmt.write_shard(shard1, np.zeros(49, np.uint16), 50257)
    p = run_script("fineweb", *args, check=False)
    assert_one_line_error(p, "fineweb_train_000001.bin: 49 tokens, expected 50")
    shard1.unlink()
    p = run_script("fineweb", *args, check=False)
    assert_one_line_error(p, "says shard 1 is done", "fineweb_train_000001.bin")
    (tmp_path / "fineweb" / "fineweb_progress.json").write_text("{not json")
    p = run_script("fineweb", *args, check=False)
    assert_one_line_error(p, "fineweb_progress.json: unreadable progress file")


def test_sharded_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text field"}) + "\n")
    p = run_script("fineweb", "--source", bad, "--out-dir", tmp_path, "--ranks", RANKS, "--workers", 1, check=False)
    assert_one_line_error(p, "bad.jsonl:2", "'text'")
    p = run_script("fineweb", "--source", bad, "--out-dir", tmp_path, "--ranks", RANKS, "--workers", 0, check=False)
    assert_one_line_error(p, "--workers 0: must be positive")
    # the same DataError path, in-process (faster than a script run each)
    bad.write_text(json.dumps({"text": "fine"}) + "\n{oops\n")
    with pytest.raises(common.DataError, match="bad.jsonl:2: not JSON"):
        list(common.local_documents(bad, "text"))
    odd = tmp_path / "docs.csv"
    odd.write_text("a,b\n")
    with pytest.raises(common.DataError, match="docs.csv: unsupported file type"):
        list(common.local_documents(odd, "text"))
    with pytest.raises(common.DataError, match="--shard-size 0: must be positive"):
        common.write_sharded(None, tmp_path, "x", 0, "desc", None)
    # offline without a local copy of the data set: says what to do instead of going online
    off = tmp_path / "offline"
    off.mkdir()
    (off / common.RANKS_FILE).symlink_to(RANKS)
    p = run_script("tinystories", "--out-dir", tmp_path, env={common.OFFLINE_ENV: off}, check=False)
    assert_one_line_error(p, common.OFFLINE_ENV, "tinystories", "--source")


# (script, source file name, bytes holding a Latin-1 e-acute (0xe9, not UTF-8), the error's location)
NOT_UTF8 = [("tinystories", "docs.txt", b"A story.\n<|endoftext|>\ncaf\xe9 au lait\n", "docs.txt:3"),
            ("fineweb", "docs.jsonl", b'{"text": "fine"}\n{"text": "caf\xe9"}\n', "docs.jsonl:2"),
            ("tinystories", "docs.json", b'[{"text": "caf\xe9"}]', "docs.json:1")]


@pytest.mark.parametrize("script,name,data,where", NOT_UTF8, ids=[c[1] for c in NOT_UTF8])
def test_sharded_not_utf8(tmp_path, script, name, data, where):
    src = tmp_path / name
    src.write_bytes(data)
    p = run_script(script, "--source", src, "--out-dir", tmp_path / "data", "--ranks", RANKS, "--workers", 1,
                   check=False)
    assert_one_line_error(p, where, "not UTF-8", "byte 0xe9")


@pytest.mark.parametrize("script,name", [("tinystories", "empty.txt"), ("fineweb", "empty.jsonl")])
def test_sharded_empty_source(tmp_path, script, name):
    src = tmp_path / name
    src.write_text("\n")
    p = run_script(script, "--source", src, "--out-dir", tmp_path / "data", "--ranks", RANKS, "--workers", 1,
                   check=False)
    assert_one_line_error(p, name, "no documents")
    assert not list((tmp_path / "data").rglob("*.bin.tmp")) and not list((tmp_path / "data").rglob("*_0*.bin"))


@pytest.mark.parametrize("script", ["tinystories", "fineweb"])
def test_sharded_source_in_one_shard_is_refused(tmp_path, script):
    """A source that fits in one --shard-size would give the validation shard alone (the trainers
    find no *_train_*.bin): refused, naming --shard-size and a value that works, with nothing left
    behind; rerun with that value, it writes a validation shard and training shards."""
    src = write_source("jsonl", tmp_path / "docs.jsonl", DOCS)
    args = ["--source", src, "--out-dir", tmp_path / "data", "--ranks", RANKS, "--workers", 1]
    folder = tmp_path / "data" / script
    p = run_script(script, *args, "--shard-size", 100_000, check=False)
    assert_one_line_error(p, "--shard-size 100,000", "no training shard", "use a smaller --shard-size, e.g.")
    assert not folder.exists(), "no shard, progress file or empty folder is left"
    tokens = int(p.stderr.split(" has only ")[1].split(" tokens")[0].replace(",", ""))
    suggested = int(p.stderr.split("e.g. ")[1].split(" ")[0].replace(",", ""))
    assert suggested == tokens // 10
    p = run_script(script, *args, "--shard-size", suggested)
    names = [f.name for f in shard_files(folder)]
    assert names[0] == f"{script}_val_000000.bin" and len(names) >= 10 and "_train_" in names[1]


def test_sharded_one_full_shard_is_refused_too(tmp_path, enc):
    """Exactly --shard-size tokens: one full shard, the validation set, and no training shard."""
    src = write_source("jsonl", tmp_path / "docs.jsonl", DOCS[:3])
    total = sum(1 + len(enc.encode_ordinary(d)) for d in DOCS[:3])
    p = run_script("fineweb", "--source", src, "--out-dir", tmp_path, "--ranks", RANKS, "--workers", 1,
                   "--shard-size", total, check=False)
    assert_one_line_error(p, f"has only {total:,} tokens", "no training shard")
    assert not (tmp_path / "fineweb").exists(), "the full shard 0 and its progress file are removed"


# (script, flags that are bad before any work): nothing may be written, not even --out-dir
BAD_FLAGS = [(script, flags, message) for script in ("tinystories", "fineweb") for flags, message in [
    (["--shard-size", 0], "--shard-size 0: must be positive"),
    (["--workers", 0], "--workers 0: must be positive"),
    (["--max-shards", 0], "--max-shards 0: must be positive"),
    (["--source", "{t}/absent.jsonl"], "--source {t}/absent.jsonl: no such file or directory"),
    (["--source", "{t}/empty_folder"], "no .txt, .jsonl, .json or .parquet files in this folder"),
    (["--ranks", "{t}/absent.tiktoken"], "absent.tiktoken: GPT-2 BPE ranks file not found"),
]] + [("tinyshakespeare", flags, message) for flags, message in [
    (["--val-tokens", 0], "--val-tokens 0: must be positive"),
    (["--val-tokens", 10**6], "--val-tokens 1000000: must be in [1, "),
    (["--source", "{t}/absent.txt"], "--source {t}/absent.txt: no such file or directory"),
]]


@pytest.mark.parametrize("script,flags,message", BAD_FLAGS,
                         ids=[f"{s}{''.join(map(str, f)).replace('{t}/', ' ')}" for s, f, _ in BAD_FLAGS])
def test_bad_flags_write_nothing(tmp_path, script, flags, message):
    (tmp_path / "empty_folder").mkdir()
    src = write_source("jsonl", tmp_path / "docs.jsonl", DOCS)
    if script == "tinyshakespeare":
        src = tmp_path / "input.txt"
        src.write_text(SHAKESPEARE)
    flags = [str(f).format(t=tmp_path) for f in flags]
    ranks = [] if "--ranks" in flags else ["--ranks", RANKS]
    source = [] if "--source" in flags else ["--source", src]
    p = run_script(script, *source, *ranks, "--out-dir", tmp_path / "out", *flags, check=False)
    assert_one_line_error(p, message.format(t=tmp_path))
    assert not (tmp_path / "out").exists(), "the flags are checked before anything is written"


def test_full_disk_names_the_file(tmp_path, monkeypatch, capsys):
    """A write that fails without a file name (ENOSPC from write or fsync) is reported with the file
    being written; the temp file is gone and an earlier version of the file is untouched."""
    import errno
    shard = tmp_path / "x_train_000001.bin"
    common.write_shard(shard, np.arange(5), 50257)
    before = shard.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(fmt.os, "fsync", full)
    for write in (lambda: common.write_shard(shard, np.arange(7), 50257),
                  lambda: common.write_tokenizer_table(common.Gpt2Tokenizer(RANKS), tmp_path)):
        with pytest.raises(SystemExit) as e:
            common.run_main(write)
        assert e.value.code == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: {shard}: cannot write it (No space left on device)",
                   f"error: {tmp_path / 'gpt2_tokenizer.bin'}: cannot write it (No space left on device)"]
    assert shard.read_bytes() == before and not list(tmp_path.glob("*.tmp"))


def test_download_errors_tell_disk_from_network(tmp_path, monkeypatch):
    """fetch(): a failed write of the downloaded file names that file; a failed download says how to
    run offline. (No network: urlopen is replaced by a fake response.)"""
    import errno
    import io
    import urllib.error

    class Response(io.BytesIO):
        headers = {"Content-Length": "3000000"}
    monkeypatch.delenv(common.OFFLINE_ENV, raising=False)
    monkeypatch.setattr(common.urllib.request, "urlopen", lambda url, timeout: Response(b"x" * 3_000_000))
    real_open = open

    class FullFile:
        def __init__(self, path, mode):
            self.f = real_open(path, mode)

        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()
    monkeypatch.setattr(common, "open", FullFile, raising=False)
    dest = tmp_path / "d" / "input.txt"
    with pytest.raises(common.DataError, match=f"{dest}: cannot write the download of http://x/y "
                                                r"\(No space left on device\)"):
        common.fetch("http://x/y", dest, "tinyshakespeare.txt")
    assert not dest.exists() and not list(dest.parent.iterdir())
    monkeypatch.setattr(common, "open", real_open, raising=False)
    assert common.fetch("http://x/y", dest, "tinyshakespeare.txt") == dest and dest.stat().st_size == 3_000_000

    def offline(url, timeout):
        raise urllib.error.URLError("no network")
    monkeypatch.setattr(common.urllib.request, "urlopen", offline)
    with pytest.raises(common.DataError, match="download of http://x/z failed .*pass --source FILE or set "
                                               + common.OFFLINE_ENV):
        common.fetch("http://x/z", tmp_path / "e" / "other.txt", "tinyshakespeare.txt")


@pytest.mark.parametrize("script", ["tinyshakespeare", "tinystories", "fineweb"])
def test_unusable_out_dir(tmp_path, script):
    """A folder that cannot be created (a file is in the way: tests run as root, where permission
    bits do not stop a write) is reported before any work."""
    src = tmp_path / "docs.txt"
    src.write_text(SHAKESPEARE)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    workers = [] if script == "tinyshakespeare" else ["--workers", 1]
    for out in (blocker, blocker / "sub"):
        p = run_script(script, "--source", src, "--out-dir", out, "--ranks", RANKS, *workers, check=False)
        assert_one_line_error(p, "--out-dir", "a_file", "cannot create")


# ---------------------------------------------------------------- hellaswag
HELLASWAG = [
    {"ind": 24, "activity_label": "Roof shingle removal", "label": 3,
     "ctx": "A man is sitting on a roof. he",
     "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                 "is holding a rubik's cube.", "starts pulling up roofing on a roof."]},
    {"ind": 92, "activity_label": "Clean and jerk", "label": 0,
     "ctx": "A lady walks to a barbell. She bends down and grabs the pole. the lady",
     "endings": ["swings and lands in her arms.", "pulls the barbell forward.",
                 "pulls a rope attached to the barbell.", "stands and lifts the weight over her head."]},
    {"ind": 106, "activity_label": "Canoeing", "label": 2,
     "ctx": "Two women in a child are shown in a canoe while a man pulls the canoe while standing in the water, "
            "with other individuals visible in the background. the child and a different man",
     "endings": ["are then shown paddling down a river in a boat while a woman talks.",
                 "are driving the canoe, they go down the river flowing side to side.",
                 "sit in a canoe while the man paddles.",
                 "walking go down the rapids, while the man in his helicopter almost falls and goes out of canoehood."]},
]


def test_hellaswag(tmp_path, enc):
    src = tmp_path / "hs.jsonl"
    src.write_text("".join(json.dumps(ex) + "\n" for ex in HELLASWAG))
    run_script("hellaswag", "--source", src, "--out-dir", tmp_path / "data", "--ranks", RANKS)
    path = tmp_path / "data/hellaswag/hellaswag_val.bin"
    h, _ = fmt.read_header(path, fmt.MAGIC_EVAL)
    examples, vocab = hellaswag.read_eval(path)
    assert vocab == 50257 and int(h[2]) == 3 and int(h[4]) == 4
    max_row = 0
    for (label, ctx, ends), ex in zip(examples, HELLASWAG):
        assert label == ex["label"]
        assert enc.decode(ctx) == ex["ctx"]
        assert [enc.decode(e) for e in ends] == [" " + e for e in ex["endings"]]
        max_row = max(max_row, len(ctx) + max(len(e) for e in ends))
    assert int(h[5]) == max_row
    # a 2-byte-short file and an unlabelled example are reported with the file name
    short = tmp_path / "short.bin"
    short.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(fmt.FormatError, match="short.bin"):
        hellaswag.read_eval(short)
    bad = dict(HELLASWAG[0], label=7)
    src.write_text(json.dumps(HELLASWAG[1]) + "\n" + json.dumps(bad) + "\n")
    p = run_script("hellaswag", "--source", src, "--out-dir", tmp_path / "d2", "--ranks", RANKS, check=False)
    assert_one_line_error(p, "hs.jsonl:2", "label")


def test_hellaswag_eval_file_reads_in_cpp(tmp_path, enc):
    """The C++ EvalLoader (llmc/dataloader.h) reads what hellaswag.py writes: build/test_dataloader
    --eval-rows FILE B T prints each row as the decoder would see it."""
    exe = ROOT / "build" / "test_dataloader"
    if not exe.exists():
        pytest.skip("build/test_dataloader not built (make build/test_dataloader)")
    src = tmp_path / "hs.jsonl"
    src.write_text("".join(json.dumps(ex) + "\n" for ex in HELLASWAG))
    run_script("hellaswag", "--source", src, "--out-dir", tmp_path, "--ranks", RANKS)
    p = subprocess.run([str(exe), "--eval-rows", str(tmp_path / "hellaswag/hellaswag_val.bin"), "8", "64" if REAL_RANKS else "256"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(rows) == 2 * 8  # 3 examples in 2 batches of 2: the last slot is empty
    for i, ex in enumerate(HELLASWAG + [None]):
        for k in range(4):
            r = rows[i * 4 + k]
            if ex is None:
                assert r["label"] == -1 and not any(r["mask"])
                continue
            assert r["label"] == ex["label"]
            scored = [t for t, m in zip(r["targets"], r["mask"]) if m]
            assert enc.decode(scored) == " " + ex["endings"][k]
            n = r["mask"].index(1) + 1  # the context ends where scoring starts
            assert enc.decode(r["inputs"][:n]) == ex["ctx"]


# ---------------------------------------------------------------- tokenizer.json (Hugging Face)
def bpe_tokenizer_json(folder, specials=("<|endoftext|>",)):
    """A byte-level BPE trained here on the test texts: folder/tokenizer.json."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=list(specials),
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([SHAKESPEARE] + DOCS, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json", tok


BIG_VOCAB = 70000  # over 65,536: uint32 shards


def wordlevel_tokenizer_json(folder):
    """A WordLevel tokenizer of BIG_VOCAB ids: dummy entries first, so every real word and the
    document token <s> have ids above 65,535."""
    tokenizers = pytest.importorskip("tokenizers")
    words = sorted({w for text in [SHAKESPEARE] + DOCS for w in text.split()})
    vocab = {f"<dummy{i}>": i for i in range(BIG_VOCAB - len(words) - 2)}
    vocab.update({w: len(vocab) + i for i, w in enumerate(["<unk>", "<s>"] + words)})
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>"])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json", tok


def test_tinyshakespeare_with_tokenizer_json(tmp_path):
    path, tok = bpe_tokenizer_json(tmp_path / "tinybpe")
    src = tmp_path / "input.txt"
    src.write_text(SHAKESPEARE)
    run_script("tinyshakespeare", "--source", src, "--out-dir", tmp_path / "data", "--tokenizer", path,
               "--val-tokens", 9)
    out = tmp_path / "data" / "tinyshakespeare_tinybpe"  # the tokenizer's folder names the data set
    val, vocab = fmt.read_shard(out / "tiny_shakespeare_val.bin")
    train, _ = fmt.read_shard(out / "tiny_shakespeare_train.bin")
    assert vocab == tok.get_vocab_size() and val.dtype == np.uint16 and val.size == 9
    assert np.fromfile(out / "tiny_shakespeare_val.bin", "<i8", 2)[1] == 1, "uint16 shards stay version 1"
    doc = tok.token_to_id("<|endoftext|>")  # no tokenizer_config.json: the end-of-text special token
    sections = SHAKESPEARE.split("\n\n")
    want = []
    for i, sec in enumerate(sections):
        want += [doc] + tok.encode(sec if i == len(sections) - 1 else sec + "\n\n").ids
    assert np.concatenate([val, train]).tolist() == want
    table, eot = fmt.read_tokenizer(tmp_path / "data" / "tinybpe_tokenizer.bin")
    assert eot == doc and len(table) == vocab
    assert b"".join(table[t] for t in want if t != doc).decode() == SHAKESPEARE  # byte-level: lossless


def test_large_vocab_tokenizer_writes_uint32_shards(tmp_path):
    path, tok = wordlevel_tokenizer_json(tmp_path / "bigwords")
    src = tmp_path / "input.txt"
    src.write_text(SHAKESPEARE)
    run_script("tinyshakespeare", "--source", src, "--out-dir", tmp_path / "data", "--tokenizer", path,
               "--val-tokens", 9)
    out = tmp_path / "data" / "tinyshakespeare_bigwords"
    val, vocab = fmt.read_shard(out / "tiny_shakespeare_val.bin")
    train, _ = fmt.read_shard(out / "tiny_shakespeare_train.bin")
    h = np.fromfile(out / "tiny_shakespeare_train.bin", "<i8", 5)
    assert vocab == BIG_VOCAB and (h[1], h[3], h[4]) == (2, 4, BIG_VOCAB) and train.dtype == np.uint32
    tokens = np.concatenate([val, train])
    doc = tok.token_to_id("<s>")
    assert doc > 65535 and tokens.min() > 65535, "every id needs more than 16 bits"
    assert tokens[0] == doc and int((tokens == doc).sum()) == len(SHAKESPEARE.split("\n\n"))
    assert [tok.id_to_token(t) for t in tokens.tolist() if t != doc] == SHAKESPEARE.split()
    table, eot = fmt.read_tokenizer(tmp_path / "data" / "bigwords_tokenizer.bin")
    assert eot == doc and len(table) == BIG_VOCAB and table[doc] == b"<s>"


def test_sharded_with_tokenizer_json_and_resume(tmp_path):
    path, tok = bpe_tokenizer_json(tmp_path / "tinybpe", specials=("<s>", "</s>"))
    (tmp_path / "tinybpe" / "tokenizer_config.json").write_text(json.dumps({"bos_token": {"content": "<s>"},
                                                                            "eos_token": "</s>"}))
    docs = DOCS + ["A document holding <s> and </s> as text."]
    src = write_source("jsonl", tmp_path / "docs.jsonl", docs)
    args = ["--source", src, "--tokenizer", path, "--shard-size", 40, "--workers", 2]
    run_script("fineweb", "--out-dir", tmp_path / "ref", *args)
    files = shard_files(tmp_path / "ref" / "fineweb_tinybpe")
    tokens = np.concatenate([fmt.read_shard(f)[0] for f in files]).tolist()
    bos = tok.token_to_id("<s>")  # tokenizer_config.json's bos_token
    want = [t for d in docs for t in [bos] + tok.encode(d, add_special_tokens=False).ids]
    tok.encode_special_tokens = True  # the script treats special tokens inside a document as text
    want_text = [t for d in docs for t in [bos] + tok.encode(d, add_special_tokens=False).ids]
    assert tokens == want_text and tokens.count(bos) == len(docs) and want != want_text
    assert (tmp_path / "ref" / "tinybpe_tokenizer.bin").is_file()
    # stopped after 2 shards, then resumed: the same bytes
    run_script("fineweb", "--out-dir", tmp_path / "run", *args, "--max-shards", 2)
    run_script("fineweb", "--out-dir", tmp_path / "run", *args)
    resumed = shard_files(tmp_path / "run" / "fineweb_tinybpe")
    assert [f.read_bytes() for f in resumed] == [f.read_bytes() for f in files]
    # the same folder with another document token is another tokenization: refused
    p = run_script("fineweb", "--out-dir", tmp_path / "run", *args, "--doc-token", "</s>", check=False)
    assert_one_line_error(p, "fineweb_progress.json: an earlier run used the tokenizer", "doc_token")


def test_tokenizer_json_errors(tmp_path):
    path, _ = bpe_tokenizer_json(tmp_path / "nospecial", specials=())
    src = tmp_path / "input.txt"
    src.write_text(SHAKESPEARE)
    base = ["--source", src, "--out-dir", tmp_path / "data", "--val-tokens", 5]
    p = run_script("tinyshakespeare", *base, "--tokenizer", path, check=False)
    assert_one_line_error(p, "--tokenizer", "no BOS or end-of-text token found", "--doc-token")
    p = run_script("tinyshakespeare", *base, "--tokenizer", path, "--doc-token", "<nope>", check=False)
    assert_one_line_error(p, "--doc-token '<nope>': not a token of")
    p = run_script("tinyshakespeare", *base, "--tokenizer", path, "--doc-token", "Ġthe")  # any token will do
    assert p.returncode == 0
    p = run_script("tinyshakespeare", *base, "--tokenizer", tmp_path / "absent.json", check=False)
    assert_one_line_error(p, "--tokenizer", "absent.json: no such file")
    (tmp_path / "bad.json").write_text("{}")
    p = run_script("tinyshakespeare", *base, "--tokenizer", tmp_path / "bad.json", check=False)
    assert_one_line_error(p, "--tokenizer", "bad.json: not a Hugging Face tokenizer.json")
    p = run_script("tinyshakespeare", *base, "--tokenizer", path, "--ranks", RANKS, check=False)
    assert_one_line_error(p, "--ranks and --tokenizer: give one")
    p = run_script("tinyshakespeare", *base, "--ranks", RANKS, "--doc-token", "x", check=False)
    assert_one_line_error(p, "--doc-token goes with --tokenizer")


def test_tokenize_prompt_round_trip(tmp_path):
    """scripts/tokenize_prompt.py: text -> ids (document token first) for generate's --prompt-ids, and
    generate's id lines (with their [i] batch prefix) -> text."""
    path, tok = bpe_tokenizer_json(tmp_path / "tinybpe")
    script = str(ROOT / "scripts" / "tokenize_prompt.py")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("To be, or not to be\n\nHello <|endoftext|> world\n")
    p = subprocess.run([sys.executable, script, "--tokenizer", str(path), "--file", str(prompts)],
                       capture_output=True, text=True, timeout=60, check=True)
    lines = p.stdout.splitlines()
    doc = tok.token_to_id("<|endoftext|>")
    assert lines[0] == ",".join(map(str, [doc] + tok.encode("To be, or not to be").ids)) and len(lines) == 2
    assert lines[1].count(str(doc)) >= 1 and lines[1].split(",")[1:].count(str(doc)) == 0, "special text is text"
    ids = " ".join(lines[0].split(",")[1:])
    p = subprocess.run([sys.executable, script, "--tokenizer", str(path), "--decode"], input=f"{ids}\n[3] {ids}\n",
                       capture_output=True, text=True, timeout=60, check=True)
    assert p.stdout == "To be, or not to be\n[3] To be, or not to be\n"
    p = subprocess.run([sys.executable, script, "--tokenizer", str(path), "--decode"], input="5,999999\n",
                       capture_output=True, text=True, timeout=60)
    assert_one_line_error(p, "stdin line 1: '999999' is not a token id")
