"""Shared pieces of the data scripts: the GPT-2 tokenizer (online or from a local ranks file),
download with a local fallback, reading documents from local files, and the resumable sharded
writer used by tinystories.py and fineweb.py. File layouts are in docs/formats.md; the bytes are
written by scripts/llmc_formats.py so the C++ readers (llmc/formats.h) and these scripts agree.

Offline use: set LLMC_OFFLINE_DATA to a folder holding gpt2.tiktoken (and the raw data files the
scripts name); then no script touches the network. Or pass --ranks FILE / --source FILE.
"""
import itertools
import json
import multiprocessing
import os
import sys
import urllib.request
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import llmc_formats  # noqa: E402  (scripts/llmc_formats.py, the one writer of every file format)

OFFLINE_ENV = "LLMC_OFFLINE_DATA"
RANKS_FILE = "gpt2.tiktoken"
EOT = 50256          # <|endoftext|>
VOCAB_SIZE = 50257   # GPT-2's ids 0..50256; every shard declares it so readers can check ids
# GPT-2's pre-tokenizer: contractions, letters, numbers, other symbols (each with an optional
# leading space), then whitespace runs; BPE merges never cross these pieces.
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class DataError(Exception):
    """A bad flag, input file or state; main() prints it as one `error: ...` line and exits 1."""


def offline_dir():
    """The LLMC_OFFLINE_DATA folder, or None when unset."""
    d = os.environ.get(OFFLINE_ENV)
    if not d:
        return None
    if not os.path.isdir(d):
        raise DataError(f"{OFFLINE_ENV}={d}: not a directory")
    return Path(d)


def get_encoding(ranks_path=None):
    """tiktoken's GPT-2 encoding. From `ranks_path` (or $LLMC_OFFLINE_DATA/gpt2.tiktoken) when
    given, else tiktoken's own download/cache; if that fails, the error says how to go offline."""
    import tiktoken
    import tiktoken.load
    if ranks_path is None and offline_dir() is not None:
        ranks_path = offline_dir() / RANKS_FILE
    if ranks_path is None:
        try:
            return tiktoken.get_encoding("gpt2")
        except Exception as e:  # no network and nothing cached
            raise DataError(f"cannot load tiktoken's gpt2 encoding ({type(e).__name__}: {e}); "
                            f"pass --ranks FILE or set {OFFLINE_ENV} to a folder holding {RANKS_FILE}")
    ranks_path = Path(ranks_path)
    if not ranks_path.is_file():
        raise DataError(f"{ranks_path}: GPT-2 BPE ranks file not found")
    try:
        ranks = tiktoken.load.load_tiktoken_bpe(str(ranks_path))
    except Exception as e:
        raise DataError(f"{ranks_path}: not a tiktoken ranks file ({type(e).__name__}: {e})")
    if len(ranks) != EOT:
        raise DataError(f"{ranks_path}: {len(ranks)} ranks, GPT-2 has {EOT}")
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_SPLIT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=VOCAB_SIZE)


def write_tokenizer_table(enc, path):
    """The decode table the trainers use to print samples (docs/formats.md, GPTT)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    table = [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]
    llmc_formats.write_tokenizer(str(path), table, EOT)
    print(f"wrote {path} ({len(table)} tokens)")


def write_shard(path, tokens):
    """One token shard, atomically (path.tmp then rename): a crash never leaves a short file."""
    llmc_formats.write_shard(str(path), np.asarray(tokens, dtype=np.uint16), VOCAB_SIZE)


def fetch(url, dest, offline_name, source=None):
    """Local path of a raw data file: --source if given; else the offline copy
    $LLMC_OFFLINE_DATA/offline_name when that is set (said on stdout; nothing is downloaded);
    else `dest`, downloaded first if absent (through dest.tmp, so a cut download is never taken
    for the file). A failed download raises with the two ways to run offline."""
    if source is not None:
        if not Path(source).exists():
            raise DataError(f"--source {source}: no such file or directory")
        return Path(source)
    off = offline_dir()
    if off is not None:
        p = off / offline_name
        if not p.exists():
            raise DataError(f"{p}: not found ({OFFLINE_ENV} is set, so nothing is downloaded)")
        print(f"using the offline copy {p} (from {OFFLINE_ENV})")
        return p
    dest = Path(dest)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    try:
        print(f"downloading {url}")
        with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:
            total = int(r.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name) as bar:
                while chunk := r.read(1 << 20):
                    f.write(chunk)
                    bar.update(len(chunk))
        os.replace(tmp, dest)
        return dest
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DataError(f"download of {url} failed ({e}); pass --source FILE or set {OFFLINE_ENV} "
                        f"to a folder holding {offline_name}")


def add_common_args(parser, source_help):
    parser.add_argument("--source", help=source_help)
    parser.add_argument("--out-dir", default="data", help="output folder (default: data)")
    parser.add_argument("--ranks", help=f"GPT-2 BPE ranks file (default: ${OFFLINE_ENV}/{RANKS_FILE} "
                                        "when set, else tiktoken's download)")


def prepare_out_dir(out_dir):
    """Creates --out-dir (and its parents) before any work, so an unusable one fails at once."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"--out-dir {out_dir}: cannot create it ({e.strerror})")
    if not os.access(out_dir, os.W_OK):
        raise DataError(f"--out-dir {out_dir}: not writable")
    return out_dir


def run_main(main):
    """Calls main(); a DataError, or a file that cannot be read or written, becomes one
    `error: ...` line and exit status 1."""
    try:
        main()
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:  # e.g. the disk filled up while writing a shard
        print(f"error: {e.filename or 'I/O'}: {e.strerror or e}", file=sys.stderr)
        sys.exit(1)


# ---------------------------------------------------------------- local documents
def _documents_in_file(path, text_field):
    """The documents of one local file; undecodable or unreadable input is a DataError."""
    try:
        yield from _parse_documents(path, text_field)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None


def _not_utf8(path):
    """A DataError naming the line and column of the first byte of `path` that is not UTF-8."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):  # a newline byte never occurs inside a UTF-8 sequence
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                byte, column = raw[e.start], e.start + 1
                return DataError(f"{path}:{lineno}: not UTF-8 text (byte 0x{byte:02x} at column {column})")
    return DataError(f"{path}: not UTF-8 text")


def _parse_documents(path, text_field):
    suffix = path.suffix
    if suffix == ".txt":  # documents separated by lines holding only <|endoftext|> (TinyStoriesV2 style)
        doc = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip() == "<|endoftext|>":
                    yield "".join(doc).strip("\n")
                    doc = []
                else:
                    doc.append(line)
        if "".join(doc).strip():
            yield "".join(doc).strip("\n")
    elif suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        obj = json.loads(line)
                    except ValueError as e:
                        raise DataError(f"{path}:{lineno}: not JSON ({e})")
                    yield _field(obj, text_field, f"{path}:{lineno}")
    elif suffix == ".json":  # a list of objects, as in TinyStories_all_data/*.json
        with open(path, encoding="utf-8") as f:
            text = f.read()  # outside the try: a UnicodeDecodeError is a ValueError too
        try:
            objs = json.loads(text)
        except ValueError as e:
            raise DataError(f"{path}: not JSON ({e})")
        if not isinstance(objs, list):
            raise DataError(f"{path}: expected a JSON list of objects")
        for i, obj in enumerate(objs):
            yield _field(obj, text_field, f"{path}[{i}]")
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"{path}: reading .parquet needs pyarrow (pip install pyarrow)")
        pf = pq.ParquetFile(path)
        if text_field not in pf.schema_arrow.names:
            raise DataError(f"{path}: no column {text_field!r} (columns: {pf.schema_arrow.names})")
        for batch in pf.iter_batches(columns=[text_field]):
            yield from batch.column(0).to_pylist()
    else:
        raise DataError(f"{path}: unsupported file type {suffix!r} (use .txt, .jsonl, .json or .parquet)")


def _field(obj, text_field, where):
    if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
        raise DataError(f"{where}: expected an object with a string field {text_field!r}")
    return obj[text_field]


def local_documents(source, text_field):
    """Yields the documents of a file, or of every .txt/.jsonl/.json/.parquet file of a folder in
    sorted name order (so a resumed run sees the same sequence)."""
    source = Path(source)
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.suffix in (".txt", ".jsonl", ".json", ".parquet"))
        if not files:
            raise DataError(f"--source {source}: no .txt, .jsonl, .json or .parquet files in this folder")
    elif source.is_file():
        files = [source]
    else:
        raise DataError(f"--source {source}: no such file or directory")
    for p in files:
        yield from _documents_in_file(p, text_field)


# ---------------------------------------------------------------- parallel tokenization
_worker_enc = None


def _init_worker(ranks_path):
    global _worker_enc
    _worker_enc = get_encoding(ranks_path)


def _tokenize_document(text):
    # encode_ordinary: a literal "<|endoftext|>" inside a document is text, not a separator
    return np.array([EOT] + _worker_enc.encode_ordinary(text), dtype=np.uint16)


# ---------------------------------------------------------------- resumable sharded writer
def shard_path(out_dir, name, index):
    split = "val" if index == 0 else "train"  # the first shard is the validation set
    return Path(out_dir) / f"{name}_{split}_{index:06d}.bin"


def _save_progress(path, progress):
    llmc_formats.atomic_write(str(path), [json.dumps(progress, indent=1).encode()])


def _load_progress(path, out_dir, name, shard_size, source_desc):
    """Progress of an earlier run of the same job, after checking its finished shards are intact."""
    if not path.exists():
        return {"source": source_desc, "shard_size": shard_size, "shards_done": 0,
                "next_document": 0, "next_offset": 0, "finished": False}
    keys = {"source", "shard_size", "shards_done", "next_document", "next_offset", "finished"}
    try:
        p = json.loads(path.read_text())
    except ValueError as e:
        raise DataError(f"{path}: unreadable progress file ({e}); delete it to start over")
    if not isinstance(p, dict) or not keys <= p.keys():
        raise DataError(f"{path}: progress file lacks some of {sorted(keys)}; delete it to start over")
    if p["shard_size"] != shard_size or p["source"] != source_desc:
        raise DataError(f"{path}: an earlier run used --shard-size {p['shard_size']} and source {p['source']!r}, "
                        f"this one {shard_size} and {source_desc!r}; use another --out-dir or delete {out_dir}")
    for i in range(p["shards_done"]):
        sp = shard_path(out_dir, name, i)
        try:
            n = llmc_formats.read_shard(str(sp))[0].size
        except llmc_formats.FormatError as e:
            raise DataError(f"{path} says shard {i} is done, but: {e}; delete {out_dir} to start over")
        if n != shard_size and not (p["finished"] and i == p["shards_done"] - 1):
            raise DataError(f"{sp}: {n} tokens, expected {shard_size}; delete {out_dir} to start over")
    return p


def write_sharded(documents, out_dir, name, shard_size, source_desc, ranks_path=None, workers=None,
                  max_shards=None):
    """Tokenizes documents in worker processes and writes shards of exactly `shard_size` tokens
    (the last one may be shorter), each document prefixed by <|endoftext|>. `documents(skip)`
    returns an iterator over the documents from index `skip` on, in a fixed order.

    Resumable: after each shard, `name_progress.json` records how many shards are done and where
    the next one starts (document index, token offset within that document's tokens). A rerun
    checks the finished shards, skips the documents they covered without tokenizing them, and
    produces the same bytes as an uninterrupted run. `max_shards` stops after that many shards."""
    for flag, v in (("--shard-size", shard_size), ("--workers", workers), ("--max-shards", max_shards)):
        if v is not None and v < 1:
            raise DataError(f"{flag} {v}: must be positive")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress_path = out_dir / f"{name}_progress.json"
    p = _load_progress(progress_path, out_dir, name, shard_size, source_desc)
    if p["finished"]:
        print(f"{out_dir}: all {p['shards_done']} shards already written")
        return p
    k = p["shards_done"]
    if max_shards is not None and k >= max_shards:
        print(f"{out_dir}: {k} shards already written (--max-shards {max_shards})")
        return p
    if k:
        print(f"resuming after {k} finished shards at document {p['next_document']}")
    buf = np.empty(shard_size, dtype=np.uint16)
    fill = 0
    with multiprocessing.Pool(workers or os.cpu_count(), _init_worker, (ranks_path,)) as pool, \
            tqdm(unit="tok", unit_scale=True, desc=name, initial=k * shard_size) as bar:
        docs = pool.imap(_tokenize_document, documents(p["next_document"]), chunksize=16)
        for doc, tokens in zip(itertools.count(p["next_document"]), docs):
            off = p["next_offset"] if doc == p["next_document"] else 0
            while off < tokens.size:
                n = min(shard_size - fill, tokens.size - off)
                buf[fill:fill + n] = tokens[off:off + n]
                fill, off = fill + n, off + n
                bar.update(n)
                if fill < shard_size:
                    continue
                write_shard(shard_path(out_dir, name, k), buf)
                k, fill = k + 1, 0
                nxt = (doc, off) if off < tokens.size else (doc + 1, 0)
                p.update(shards_done=k, next_document=nxt[0], next_offset=nxt[1])
                _save_progress(progress_path, p)
                if k == max_shards:
                    print(f"stopping after {k} shards (--max-shards); rerun to continue")
                    return p
    if fill:
        write_shard(shard_path(out_dir, name, k), buf[:fill])
        k += 1
    if k == 0:
        raise DataError(f"{source_desc}: no documents, nothing to write")
    p.update(shards_done=k, finished=True)
    _save_progress(progress_path, p)
    print(f"wrote {k} shards to {out_dir} (the first, {shard_path(out_dir, name, 0).name}, is the validation set)")
    return p


def add_shard_args(parser, default_shard_size):
    parser.add_argument("--shard-size", type=int, default=default_shard_size,
                        help=f"tokens per shard (default {default_shard_size:,})")
    parser.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: all cores)")
    parser.add_argument("--max-shards", type=int, default=None, help="stop after this many shards (rerun to continue)")
    parser.add_argument("--text-field", default="text", help="field holding the text in .jsonl/.json/.parquet")


def documents_from(args, repo, config, offline_name):
    """(documents(skip), description) for write_sharded: --source, else $LLMC_OFFLINE_DATA/
    offline_name[.txt|.jsonl|.json|.parquet] (file or folder), else the Hugging Face hub, streamed
    (the `datasets` library is imported only then)."""
    source = args.source
    if source is None and offline_dir() is not None:
        names = [offline_name + s for s in ("", ".txt", ".jsonl", ".json", ".parquet")]
        found = [offline_dir() / n for n in names if (offline_dir() / n).exists()]
        if not found:
            raise DataError(f"{OFFLINE_ENV} is set but holds none of {names}; pass --source")
        source = found[0]
    if source is not None:
        source = Path(source).resolve()
        return (lambda skip: itertools.islice(local_documents(source, args.text_field), skip, None)), str(source)

    def hub_documents(skip):
        try:
            import datasets
        except ImportError:
            raise DataError("streaming from the Hugging Face hub needs `pip install datasets` (or pass --source)")
        ds = datasets.load_dataset(repo, name=config, split="train", streaming=True)
        return (ex[args.text_field] for ex in ds.skip(skip))
    return hub_documents, f"hf:{repo}/{config or ''}"
