"""What build/generate_cpu writes where (the GPU generator shares the code: llmc/generate_args.h,
llmc/checkpoint.h, llmc/tokenizer.h), on tiny models, numpy only:
- prompts that are not UTF-8 text (Latin-1, binary junk) are refused, naming the file or stdin and the
  byte offset; --interactive 1 reports such a line and skips it;
- stdout holds only the generated text: a damaged newest checkpoint's note goes to stderr, so the
  output of a run that falls back to an older checkpoint is the output of that checkpoint alone;
- the end-of-text token prints as a blank line, not as the text <|endoftext|>.
Needs build/generate_cpu (make). Run: python3 -m pytest -q tests/python/test_generate_output.py"""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_generate import CFG, EOT, check_error, fmt, run  # noqa: E402

QUIET = ["--temperature", 0, "--max-new", 4]


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("genout")
    params = np.random.default_rng(1).normal(0, 0.5, fmt.num_params(CFG)).astype(np.float32)
    fmt.split_params(CFG, params)["wte"][CFG["vocab_size"]:] = 0
    fmt.write_model(d / "model.bin", CFG, params)
    # a model that always predicts end-of-text: the final LayerNorm outputs its bias b whatever
    # the input (weight 0), and the tied head's only nonzero row is end-of-text's, b itself
    eot_params = np.zeros(fmt.num_params(CFG), np.float32)
    P = fmt.split_params(CFG, eot_params)
    P["lnfb"][:] = 1.0
    P["wte"][EOT] = 1.0
    fmt.write_model(d / "eot.bin", CFG, eot_params)
    fmt.write_tokenizer(d / "tok.bin", [bytes([b]) for b in range(256)] + [b"<|endoftext|>", b"ab", b"cd", b"ef"], EOT)
    (d / "latin1.txt").write_bytes("ABC\ncaf\u00e9 au lait\n".encode("latin-1"))
    (d / "junk.bin").write_bytes(bytes(range(128, 256)) * 2)
    return d


def test_prompt_file_not_utf8_is_refused_with_the_byte_offset(d):
    base = ["--model", d / "model.bin", "--tokenizer", d / "tok.bin", *QUIET]
    check_error(run(*base, "--prompt-file", d / "latin1.txt"),
                f"--prompt-file {d}/latin1.txt line 2: not UTF-8 text: byte 0xe9 at offset 7 of the file")
    check_error(run(*base, "--prompt-file", d / "junk.bin"),
                f"--prompt-file {d}/junk.bin line 1: not UTF-8 text: byte 0x80 at offset 0 of the file")
    (d / "utf8.txt").write_text("ABC\ncaf\u00e9 au lait\n", encoding="utf-8")  # the control: the same text in UTF-8
    r = run(*base, "--prompt-file", d / "utf8.txt")
    assert r.returncode == 0 and r.stdout.count("\n") == 2, r.stderr


def test_interactive_line_not_utf8_is_reported_and_skipped(d):
    base = ["--model", d / "model.bin", "--tokenizer", d / "tok.bin", *QUIET, "--interactive", 1]
    good = run(*base, stdin="AB\nBA\n")
    assert good.returncode == 0 and good.stdout.count("\n") == 2, good.stderr
    r = run(*base, stdin="AB\n\udcff\udcfeC\nBA\n")  # surrogateescape: the bytes ff fe
    assert r.returncode == 0 and r.stdout == good.stdout, r.stderr
    assert "error: stdin line 2: not UTF-8 text: byte 0xff at offset 3 of stdin (skipped)" in r.stderr, r.stderr


def test_damaged_checkpoint_note_goes_to_stderr(d, tmp_path):
    _, params = fmt.read_model(d / "model.bin")
    n = fmt.num_params(CFG)
    for step in (1, 2):
        fmt.write_checkpoint(str(tmp_path / "run"), step, CFG, params, np.zeros(n, np.float32), np.zeros(n, np.float32))
    newest = tmp_path / "run" / "step_00000002" / "model.bin"
    model = bytearray(newest.read_bytes())
    model[2000] ^= 1
    newest.write_bytes(model)
    want = run("--model", d / "model.bin", "--tokenizer", d / "tok.bin", *QUIET, "--prompt", "ab")
    r = run("--model", tmp_path / "run", "--tokenizer", d / "tok.bin", *QUIET, "--prompt", "ab")
    assert r.returncode == 0 and "step_00000002 is damaged" in r.stderr, r.stderr
    assert r.stdout == want.stdout, "stdout holds the generated text and nothing else"


def test_end_of_text_prints_as_a_blank_line(d):
    base = ["--model", d / "eot.bin", "--tokenizer", d / "tok.bin", "--temperature", 0, "--max-new", 3, "--eot", -1]
    r = run(*base, "--prompt", "ab")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "\n\n" * 3 + "\n", repr(r.stdout)
    # with ids (no --tokenizer) the token stays its id, for tokenize_prompt.py --decode
    r = run("--model", d / "eot.bin", "--temperature", 0, "--max-new", 3, "--eot", -1, "--prompt-ids", "1")
    assert r.returncode == 0 and r.stdout.split() == [str(EOT)] * 3, (r.stdout, r.stderr)
