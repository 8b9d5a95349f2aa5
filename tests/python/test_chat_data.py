"""scripts/data/chat.py: chat JSONL to loss-masked shards (docs/formats.md, version 3).
- the plain template: the shard's tokens are the test's own tokenization of "User: ...\\n" /
  "Assistant: " (masked) and the assistant's content + <|endoftext|> (trained), after the document token;
- a Jinja chat_template given inline in a tokenizer_config.json (it writes bos_token itself and ends
  assistant turns with eos_token and a newline): the tokens decode to jinja2's own rendering of the
  whole conversation, and the mask's runs of ones are exactly the assistant turns' content + eos + "\\n";
  with transformers installed, its apply_chat_template gives the same text;
- bad inputs (a conversation without an assistant turn, a template that raises) fail naming file:line.
GPT-2's BPE from a synthetic ranks file (the 256 bytes, then byte pairs), so no download is needed.
Run: python3 -m pytest -q tests/python/test_chat_data.py"""
import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import llmc_formats as fmt  # noqa: E402

tiktoken = pytest.importorskip("tiktoken")
import tiktoken.load  # noqa: E402
EOT = 50256
SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reverse: a b c"},
     {"role": "assistant", "content": "c b a"}, {"role": "user", "content": "And x y?"},
     {"role": "assistant", "content": "y x\nDone."}],
    [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": " hi there "}],
]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}"
            "{{ '### Assistant:\\n' + m['content'] + eos_token + '\\n' }}{% else %}"
            "{{ '### ' + m['role'] + ':\\n' + m['content'] + '\\n' }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}{{ '### Assistant:\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    order = list(b" etaoinshrdlucmfwypvbgkjqxz.,") + [b for b in range(256) if b not in b" etaoinshrdlucmfwypvbgkjqxz.,"]
    tokens = [bytes([b]) for b in range(256)]
    tokens += [bytes([a, b]) for a in order for b in order][:EOT - 256]
    path = tmp_path_factory.mktemp("ranks") / "gpt2.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens)))
    ranks = tiktoken.load.load_tiktoken_bpe(str(path))
    enc = tiktoken.Encoding(name="gpt2", pat_str=SPLIT, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=EOT + 1)
    return path, enc


def run_chat(tmp_path, ranks_path, *flags, convs=CONVERSATIONS):
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps({"messages": c}) + "\n" for c in convs))
    return subprocess.run([sys.executable, str(ROOT / "scripts/data/chat.py"), "--source", str(src), "--ranks",
                           str(ranks_path), "--out-dir", str(tmp_path / "data"), *flags],
                          capture_output=True, text=True, timeout=120)


def read_train(tmp_path):
    tokens, vocab, mask = fmt.read_shard(tmp_path / "data/chat/chat_train_000001.bin", with_mask=True)
    assert vocab == EOT + 1 and mask is not None
    return np.asarray(tokens).tolist(), np.asarray(mask).tolist()


def runs_of_ones(tokens, mask):
    runs, cur = [], []
    for t, m in zip(tokens + [None], mask + [0]):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    return runs


def test_plain_template_masks_exactly_the_assistant_turns(tmp_path, ranks):
    p = run_chat(tmp_path, ranks[0])
    assert p.returncode == 0, p.stderr
    assert "chat_train_000001.bin (3 conversations" in p.stdout
    enc = ranks[1]
    want_tokens, want_mask = [], []
    for conv in CONVERSATIONS:
        want_tokens.append(EOT)
        want_mask.append(0)
        for m in conv:
            if m["role"] == "assistant":
                head, body = enc.encode_ordinary("Assistant: "), enc.encode_ordinary(m["content"]) + [EOT]
                want_tokens += head + body
                want_mask += [0] * len(head) + [1] * len(body)
            else:
                piece = enc.encode_ordinary(f"{m['role'].capitalize()}: {m['content']}\n")
                want_tokens += piece
                want_mask += [0] * len(piece)
    tokens, mask = read_train(tmp_path)
    assert tokens == want_tokens
    assert mask == want_mask


def jinja_expected(conv):
    """jinja2's own rendering, as transformers sets up its environment."""
    jinja2 = pytest.importorskip("jinja2")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(TEMPLATE).render(messages=conv, add_generation_prompt=False, bos_token="<|endoftext|>",
                                            eos_token="<|endoftext|>")


def test_jinja_template_masks_exactly_the_assistant_turns(tmp_path, ranks):
    pytest.importorskip("jinja2")
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": TEMPLATE, "bos_token": "<|endoftext|>",
                                  "eos_token": {"content": "<|endoftext|>"}}))
    p = run_chat(tmp_path, ranks[0], "--template", str(config))
    assert p.returncode == 0, p.stderr
    enc = ranks[1]
    tokens, mask = read_train(tmp_path)
    # the document token is the template's bos_token, written once per conversation
    assert enc.decode(tokens) == "".join(jinja_expected(c) for c in CONVERSATIONS)
    assert tokens.count(EOT) == len(CONVERSATIONS) + sum(m["role"] == "assistant" for c in CONVERSATIONS for m in c)
    want = [m["content"] + "<|endoftext|>\n" for c in CONVERSATIONS for m in c if m["role"] == "assistant"]
    assert [enc.decode(r) for r in runs_of_ones(tokens, mask)] == want
    for c in CONVERSATIONS:  # each assistant turn is tokenized on its own: its content's own tokens
        for m in c:
            if m["role"] == "assistant":
                body = enc.encode_ordinary(m["content"]) + [EOT] + enc.encode_ordinary("\n")
                assert any(r == body for r in runs_of_ones(tokens, mask)), m


def test_jinja_rendering_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("jinja2")
    from transformers.utils.chat_template_utils import render_jinja_template
    for conv in CONVERSATIONS:
        text = render_jinja_template(conversations=[conv], chat_template=TEMPLATE, bos_token="<|endoftext|>",
                                     eos_token="<|endoftext|>")[0][0]
        assert text == jinja_expected(conv), transformers.__version__


def test_bad_conversations_fail_naming_the_line(tmp_path, ranks):
    bad = CONVERSATIONS[:1] + [[{"role": "user", "content": "no answer"}]]
    p = run_chat(tmp_path, ranks[0], convs=bad)
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    assert "chats.jsonl:2: the conversation has no assistant turn" in p.stderr, p.stderr
    pytest.importorskip("jinja2")
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "{% if messages|length > 2 %}{{ raise_exception('too long') }}"
                                                   "{% endif %}{{ messages[0]['content'] }}"}))
    p = run_chat(tmp_path, ranks[0], "--template", str(config))
    assert p.returncode == 1 and "chats.jsonl:2: the chat template fails to render: too long" in p.stderr, p.stderr


def test_tokenize_prompt_chat_matches_apply_chat_template(tmp_path):
    """scripts/tokenize_prompt.py --chat: the ids of transformers' apply_chat_template(add_generation_prompt=
    True) for a one-turn user prompt (its template writes the BOS, so no second document token)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_sft_e2e import write_tokenizer
    write_tokenizer(tmp_path)
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    prompts = ["kqaz", "ab 12"]
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "tokenize_prompt.py"), "--tokenizer",
                          str(tmp_path / "tokenizer.json"), "--chat", str(tmp_path / "tokenizer_config.json")]
                         + prompts, capture_output=True, text=True, check=True).stdout.split()
    for p, line in zip(prompts, out):
        want = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                       return_dict=True)["input_ids"]
        assert [int(i) for i in line.split(",")] == list(want), (p, line)
    plain = subprocess.run([sys.executable, str(ROOT / "scripts" / "tokenize_prompt.py"), "--tokenizer",
                            str(tmp_path / "tokenizer.json"), "kqaz"], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert plain != out[0]  # without --chat: the document token, then the text's own ids
