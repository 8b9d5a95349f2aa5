"""Shared pieces of the data scripts: the tokenizers (GPT-2's BPE, online or from a local ranks
file, or a local Hugging Face tokenizer.json through the `tokenizers` package), download with a
local fallback, reading documents from local files, and the resumable sharded writer used by
tinystories.py and fineweb.py. File layouts are in docs/formats.md; the bytes are
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


# ---------------------------------------------------------------- tokenizers
# Both kinds offer: name (for file names), vocab_size (every id is below it), doc_token (the id
# written before every document), encode(text) -> ids (special tokens written in the text are
# text), token_bytes() (each id's bytes, for the decode table) and spec (picklable: how a worker
# process loads the same tokenizer).
class Gpt2Tokenizer:
    name = "gpt2"
    vocab_size = VOCAB_SIZE
    doc_token = EOT

    def __init__(self, ranks_path=None):
        self.ranks_path, self._enc = ranks_path, None
        self.spec = ("gpt2", ranks_path)
        self.description = "gpt2"

    @property
    def enc(self):  # loaded at first use, so a script reports a missing input file before missing ranks
        if self._enc is None:
            self._enc = get_encoding(self.ranks_path)
        return self._enc

    def encode(self, text):
        return self.enc.encode_ordinary(text)  # a literal "<|endoftext|>" inside a document is text

    def token_bytes(self):
        return [self.enc.decode_single_token_bytes(i) for i in range(self.enc.n_vocab)]


# The document token of a tokenizer.json without --doc-token or a tokenizer_config.json naming one:
# the first of these that is a special token of the file (a BOS where there is one: Llama 3's, then
# SentencePiece's, Gemma's; else an end-of-text: GPT-2 style, SentencePiece, Llama 3's, Gemma's).
DOC_TOKEN_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


def _byte_level_decoder():
    """GPT-2's byte-level alphabet inverted: the printable character that stands for each byte -> the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _uses(node, kind):
    """Whether a tokenizer.json component (dict, possibly a Sequence of them) has a part of type `kind`."""
    if isinstance(node, dict):
        return node.get("type") == kind or any(_uses(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(_uses(v, kind) for v in node)
    return False


class HFTokenizer:
    """A local Hugging Face tokenizer.json (the `tokenizers` package; no network, no transformers)."""

    def __init__(self, path, doc_token=None):
        path = Path(path)
        if not path.is_file():
            raise DataError(f"--tokenizer {path}: no such file")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the workers are processes already
        try:
            import tokenizers
        except ImportError:
            raise DataError(f"--tokenizer {path}: reading tokenizer.json needs `pip install tokenizers`")
        try:
            self.tok = tokenizers.Tokenizer.from_file(str(path))
            self.json = json.loads(path.read_text(encoding="utf-8"))
        except Exception as e:  # the package's parse errors are plain Exceptions
            raise DataError(f"--tokenizer {path}: not a Hugging Face tokenizer.json ({str(e).splitlines()[0]})")
        self.tok.encode_special_tokens = True  # a special token written in a document is text, as for GPT-2
        vocab = self.tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1
        self.id_to_token = {i: t for t, i in vocab.items()}
        self.special = {a["content"]: a["id"] for a in self.json.get("added_tokens", []) if a.get("special")}
        self.doc_token = self._doc_token(path, doc_token, vocab)
        stem = path.parent.name if path.name == "tokenizer.json" and path.parent.name else path.stem
        self.name = "".join(c if c.isalnum() or c in "._-" else "_" for c in stem) or "tokenizer"
        self.spec = ("hf", str(path.resolve()), doc_token)
        self.description = f"tokenizer.json {path.resolve()} doc_token {self.doc_token}"

    def _doc_token(self, path, flag, vocab):
        """--doc-token; else tokenizer_config.json's bos_token, else its eos_token; else DOC_TOKEN_CANDIDATES."""
        if flag is not None:
            if flag not in vocab:
                raise DataError(f"--doc-token {flag!r}: not a token of {path}")
            return vocab[flag]
        config = path.parent / "tokenizer_config.json"
        if config.is_file():
            try:
                c = json.loads(config.read_text(encoding="utf-8"))
            except ValueError as e:
                raise DataError(f"{config}: not JSON ({e})")
            for key in ("bos_token", "eos_token"):
                t = c.get(key)
                t = t.get("content") if isinstance(t, dict) else t
                if t:
                    if t not in vocab:
                        raise DataError(f"{config}: {key} {t!r} is not a token of {path}; pass --doc-token")
                    return vocab[t]
        for t in DOC_TOKEN_CANDIDATES:
            if t in self.special:
                return self.special[t]
        raise DataError(f"--tokenizer {path}: no BOS or end-of-text token found (none of {list(DOC_TOKEN_CANDIDATES)} "
                        "is a special token, and no tokenizer_config.json names one); pass --doc-token TOKEN")

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def token_bytes(self):
        """Each id's bytes: byte-level vocabularies (GPT-2, Llama 3) through the inverse byte alphabet;
        SentencePiece-style ones with "\u2581" as a space and <0xHH> as byte HH; special tokens as their
        text. The decode table holds 1..255 bytes an entry: an id with no token is U+FFFD, a longer
        token is cut at 255 bytes (the table only prints samples)."""
        byte_level = _uses(self.json.get("decoder"), "ByteLevel") or _uses(self.json.get("pre_tokenizer"), "ByteLevel")
        chars = _byte_level_decoder()
        added = {a["id"] for a in self.json.get("added_tokens", [])}
        out = []
        for i in range(self.vocab_size):
            t = self.id_to_token.get(i)
            if t is None:
                b = "\ufffd".encode()
            elif i in added:
                b = t.encode()
            elif byte_level and all(c in chars for c in t):
                b = bytes(chars[c] for c in t)
            elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                b = bytes([int(t[3:5], 16)])
            else:
                b = t.replace("\u2581", " ").encode()
            out.append(b[:255] or "\ufffd".encode())
        return out


def load_tokenizer(spec):
    """The tokenizer of a spec (Gpt2Tokenizer.spec / HFTokenizer.spec)."""
    return Gpt2Tokenizer(spec[1]) if spec[0] == "gpt2" else HFTokenizer(spec[1], spec[2])


def add_tokenizer_args(parser, tokenizer_help=None, doc_token_help=None):
    """--tokenizer and --doc-token; the help texts default to the data scripts' (tokenize_prompt.py,
    which writes no shards, passes its own)."""
    parser.add_argument("--tokenizer", metavar="FILE", help=tokenizer_help or (
        "a Hugging Face tokenizer.json to tokenize with instead of GPT-2's BPE (needs `pip install tokenizers`); "
        "shards are uint32 when its vocabulary exceeds 65,536"))
    parser.add_argument("--doc-token", metavar="TOKEN", help=(doc_token_help or "with --tokenizer: the token written "
                        "before every document") + " (default: tokenizer_config.json's bos_token, else its eos_token, "
                        "else the first special token of " + ", ".join(DOC_TOKEN_CANDIDATES) + ")")


def tokenizer_from_args(args, load=False):
    """--tokenizer FILE (a tokenizer.json), else GPT-2's BPE from --ranks / $LLMC_OFFLINE_DATA / tiktoken
    (its ranks read at first use, or now with load=True: a missing ranks file fails before any write)."""
    if getattr(args, "tokenizer", None):
        if args.ranks:
            raise DataError("--ranks and --tokenizer: give one (--ranks is GPT-2's BPE, --tokenizer a tokenizer.json)")
        return HFTokenizer(args.tokenizer, args.doc_token)
    if getattr(args, "doc_token", None):
        raise DataError("--doc-token goes with --tokenizer (GPT-2's document token is <|endoftext|>)")
    tok = Gpt2Tokenizer(args.ranks)
    if load:
        tok.enc  # (the property reads them)
    return tok


def dataset_dir(out_dir, base, tok):
    """out_dir/base for GPT-2's tokens, out_dir/base_<tokenizer name> for another tokenizer's."""
    return Path(out_dir) / (base if tok.name == "gpt2" else f"{base}_{tok.name}")


def write_tokenizer_table(tok, out_dir):
    """The decode table the trainers and generate use to print text (docs/formats.md, GPTT), as
    out_dir/<name>_tokenizer.bin; its end-of-text slot is the document token."""
    path = Path(out_dir) / f"{tok.name}_tokenizer.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    table = tok.token_bytes()
    llmc_formats.write_tokenizer(str(path), table, tok.doc_token)
    print(f"wrote {path} ({len(table)} tokens, document token {tok.doc_token})")
    return path


def write_shard(path, tokens, vocab_size):
    """One token shard, atomically (path.tmp then rename): a crash never leaves a short file. uint16
    ids when vocab_size <= 65536, else uint32 (docs/formats.md)."""
    llmc_formats.write_shard(str(path), np.asarray(tokens), vocab_size)


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
    writing = False  # whether the failing call wrote the local file (then the disk, not the network, is at fault)
    try:
        print(f"downloading {url}")
        with urllib.request.urlopen(url, timeout=60) as r:
            total = int(r.headers.get("Content-Length") or 0) or None
            writing = True
            with open(tmp, "wb") as f, tqdm(total=total, unit="B", unit_scale=True, desc=dest.name) as bar:
                while True:
                    writing = False
                    chunk = r.read(1 << 20)
                    writing = True
                    if not chunk:
                        break
                    f.write(chunk)
                    bar.update(len(chunk))
            os.replace(tmp, dest)
        return dest
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if writing:
            raise DataError(f"{dest}: cannot write the download of {url} ({e.strerror or e})")
        raise DataError(f"download of {url} failed ({e}); pass --source FILE or set {OFFLINE_ENV} "
                        f"to a folder holding {offline_name}")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def add_common_args(parser, source_help):
    parser.add_argument("--source", help=source_help)
    parser.add_argument("--out-dir", default="data", help="output folder (default: data)")
    parser.add_argument("--ranks", help=f"GPT-2 BPE ranks file (default: ${OFFLINE_ENV}/{RANKS_FILE} "
                                        "when set, else tiktoken's download)")


def check_out_dir(out_dir):
    """Fails now if --out-dir could not be created or written, without creating anything (for a
    script that checks its input before it writes)."""
    p = Path(out_dir)
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise DataError(f"--out-dir {out_dir}: cannot create it ({p} is not a directory)")
    if not os.access(p, os.W_OK):
        raise DataError(f"--out-dir {out_dir}: not writable")


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
    except OSError as e:  # e.g. the disk filled up while writing a shard (atomic_write names the file)
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


def source_files(source):
    """The files of a source: the file itself, or every .txt/.jsonl/.json/.parquet file of a folder in
    sorted name order (so a resumed run sees the same sequence); a DataError if there are none."""
    source = Path(source)
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.suffix in (".txt", ".jsonl", ".json", ".parquet"))
        if not files:
            raise DataError(f"--source {source}: no .txt, .jsonl, .json or .parquet files in this folder")
        return files
    if source.is_file():
        return [source]
    raise DataError(f"--source {source}: no such file or directory")


def local_documents(source, text_field, files=None):
    """Yields the documents of a file or folder (source_files; `files` if already listed)."""
    for p in files if files is not None else source_files(source):
        yield from _documents_in_file(p, text_field)


# ---------------------------------------------------------------- parallel tokenization
_worker_tok = None


def _init_worker(spec):
    global _worker_tok
    _worker_tok = load_tokenizer(spec)


def _tokenize_document(text):
    # a literal "<|endoftext|>" (or other special token) inside a document is text, not a separator
    return np.array([_worker_tok.doc_token] + _worker_tok.encode(text), dtype=np.uint32)


# ---------------------------------------------------------------- resumable sharded writer
def shard_path(out_dir, name, index):
    split = "val" if index == 0 else "train"  # the first shard is the validation set
    return Path(out_dir) / f"{name}_{split}_{index:06d}.bin"


def _save_progress(path, progress):
    llmc_formats.atomic_write(str(path), [json.dumps(progress, indent=1).encode()])


def _load_progress(path, out_dir, name, shard_size, source_desc, tokenizer_desc):
    """Progress of an earlier run of the same job, after checking its finished shards are intact."""
    if not path.exists():
        return {"source": source_desc, "shard_size": shard_size, "tokenizer": tokenizer_desc, "shards_done": 0,
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
    if p.get("tokenizer", "gpt2") != tokenizer_desc:  # (files of earlier builds: GPT-2's, unnamed)
        raise DataError(f"{path}: an earlier run used the tokenizer {p.get('tokenizer', 'gpt2')!r}, this one "
                        f"{tokenizer_desc!r}; use another --out-dir or delete {out_dir}")
    for i in range(p["shards_done"]):
        sp = shard_path(out_dir, name, i)
        try:
            n = llmc_formats.read_shard(str(sp))[0].size
        except llmc_formats.FormatError as e:
            raise DataError(f"{path} says shard {i} is done, but: {e}; delete {out_dir} to start over")
        if n != shard_size and not (p["finished"] and i == p["shards_done"] - 1):
            raise DataError(f"{sp}: {n} tokens, expected {shard_size}; delete {out_dir} to start over")
    return p


def _remove_if_empty(folder):
    try:
        folder.rmdir()  # only an empty folder: nothing of anyone's is lost
    except OSError:
        pass


def write_sharded(documents, out_dir, name, shard_size, source_desc, tok, workers=None, max_shards=None):
    """Tokenizes documents with `tok` in worker processes and writes shards of exactly `shard_size`
    tokens (the last one may be shorter), each document prefixed by the document token. `documents(skip)`
    returns an iterator over the documents from index `skip` on, in a fixed order.

    Resumable: after each shard, `name_progress.json` records how many shards are done and where
    the next one starts (document index, token offset within that document's tokens). A rerun
    checks the finished shards, skips the documents they covered without tokenizing them, and
    produces the same bytes as an uninterrupted run. `max_shards` stops after that many shards."""
    check_shard_args(shard_size, workers, max_shards)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress_path = out_dir / f"{name}_progress.json"
    p = _load_progress(progress_path, out_dir, name, shard_size, source_desc, tok.description)
    if p["finished"]:
        print(f"{out_dir}: all {p['shards_done']} shards already written")
        return p
    k = p["shards_done"]
    if max_shards is not None and k >= max_shards:
        print(f"{out_dir}: {k} shards already written (--max-shards {max_shards})")
        return p
    if k:
        print(f"resuming after {k} finished shards at document {p['next_document']}")
    buf = np.empty(shard_size, dtype=np.uint32)
    fill = 0
    with multiprocessing.Pool(workers or os.cpu_count(), _init_worker, (tok.spec,)) as pool, \
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
                write_shard(shard_path(out_dir, name, k), buf, tok.vocab_size)
                k, fill = k + 1, 0
                nxt = (doc, off) if off < tokens.size else (doc + 1, 0)
                p.update(shards_done=k, next_document=nxt[0], next_offset=nxt[1])
                _save_progress(progress_path, p)
                if k == max_shards:
                    print(f"stopping after {k} shards (--max-shards); rerun to continue")
                    return p
    if k == 0 and not fill:
        _remove_if_empty(out_dir)
        raise DataError(f"{source_desc}: no documents, nothing to write")
    if k + bool(fill) == 1:  # the validation shard alone: the trainers would find no *_train_* shard
        total = k * shard_size + fill
        shard_path(out_dir, name, 0).unlink(missing_ok=True)  # (a full shard 0 of this job: gone, so a rerun
        progress_path.unlink(missing_ok=True)                  # with a smaller --shard-size starts clean)
        _remove_if_empty(out_dir)
        raise DataError(f"--shard-size {shard_size:,}: {source_desc} has only {total:,} tokens, one shard, which "
                        f"would be the validation set ({shard_path(out_dir, name, 0).name}) with no training shard; "
                        f"use a smaller --shard-size, e.g. {max(1, total // 10):,} (a tenth of the tokens: one "
                        "validation shard, the rest for training)")
    if fill:
        write_shard(shard_path(out_dir, name, k), buf[:fill], tok.vocab_size)
        k += 1
    p.update(shards_done=k, finished=True)
    _save_progress(progress_path, p)
    print(f"wrote {k} shards to {out_dir} (the first, {shard_path(out_dir, name, 0).name}, is the validation set)")
    return p


def check_shard_args(shard_size, workers=None, max_shards=None):
    """--shard-size, --workers and --max-shards must be positive: checked before anything is written."""
    for flag, v in (("--shard-size", shard_size), ("--workers", workers), ("--max-shards", max_shards)):
        if v is not None and v < 1:
            raise DataError(f"{flag} {v}: must be positive")


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
        files = source_files(source)  # a missing --source fails here, before anything is written
        source = Path(source).resolve()
        return (lambda skip: itertools.islice(local_documents(source, args.text_field, files), skip, None)), str(source)

    def hub_documents(skip):
        try:
            import datasets
        except ImportError:
            raise DataError("streaming from the Hugging Face hub needs `pip install datasets` (or pass --source)")
        ds = datasets.load_dataset(repo, name=config, split="train", streaming=True)
        return (ex[args.text_field] for ex in ds.skip(skip))
    return hub_documents, f"hf:{repo}/{config or ''}"
