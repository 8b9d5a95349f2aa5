"""Chat conversations as loss-masked token shards, for fine-tuning on the assistant's turns only.

    python3 scripts/data/chat.py --source chats.jsonl [--template plain|DIR/tokenizer_config.json]
        [--tokenizer DIR/tokenizer.json] [--out-dir data] [--name chat] [--val N] [--shard-size N]

Input: JSON lines, one conversation a line: {"messages": [{"role": "system"|"user"|"assistant",
"content": "..."}, ...]} with at least one assistant turn.
Rendering: --template plain (default, for GPT-2-style tokenizers) writes "System: ...\\n", "User: ...\\n"
and "Assistant: ...<|endoftext|>" (the generation prompt is "Assistant: "); a tokenizer_config.json's
`chat_template` is rendered with jinja2 as transformers' apply_chat_template renders it (a sandboxed
environment with trim_blocks and lstrip_blocks, loop controls, raise_exception and tojson;
add_generation_prompt=False; bos_token and eos_token from the config).
Loss mask (docs/formats.md, version-3 shards): 1 on the tokens of each assistant turn after its
generation prompt (its content, its end token and whatever the template writes after it before the
next message), 0 on everything else (system and user turns, the assistant's header, document tokens).
The spans come from rendering the conversation prefix by prefix: piece k is render(messages[:k+1])
minus render(messages[:k]) (each prefix's text must start the next one, else the template is refused),
an assistant piece split at render(messages[:k], add_generation_prompt=True); each piece is tokenized
on its own (special tokens written by the template become their ids), so the mask boundaries are
exact. The templates end a turn with a newline or a special token, where BPE merges no pieces anyway.
Packing: each conversation after the document token (GPT-2's <|endoftext|>, or the tokenizer's BOS:
common.py; not repeated when the template starts with it), whole conversations into shards of at most
--shard-size tokens (a longer conversation gets a shard of its own). The first --val conversations go
to <name>_val_000000.bin, the rest to <name>_train_000001.bin, ...; plus the decode table (as
tinyshakespeare.py). Both trainers train on masked shards (docs/training.md).
"""
import argparse
import json
from pathlib import Path

import numpy as np

from common import (DataError, add_common_args, add_tokenizer_args, dataset_dir, llmc_formats, prepare_out_dir,
                    run_main, tokenizer_from_args, write_tokenizer_table)

ROLES = ("system", "user", "assistant")
PLAIN_EOS = "<|endoftext|>"


def plain_render(messages, add_generation_prompt=False):
    """The built-in template: "User: ...\\n", "Assistant: ...<|endoftext|>", "System: ...\\n"."""
    out = []
    for m in messages:
        if m["role"] == "assistant":
            out.append(f"Assistant: {m['content']}{PLAIN_EOS}")
        else:
            out.append(f"{m['role'].capitalize()}: {m['content']}\n")
    if add_generation_prompt:
        out.append("Assistant: ")
    return "".join(out)


def _token_text(t):
    return t.get("content") if isinstance(t, dict) else t


def jinja_renderer(config_path):
    """render(messages, add_generation_prompt) from a tokenizer_config.json's chat_template, as
    transformers renders it."""
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise DataError(f"--template {config_path}: rendering a chat template needs `pip install jinja2`")
    try:
        config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"--template {config_path}: cannot read it as JSON ({e})")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str):
        raise DataError(f"--template {config_path}: no chat_template")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent,
                                                                                   ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    try:
        compiled = env.from_string(template)
    except jinja2.exceptions.TemplateError as e:
        raise DataError(f"--template {config_path}: the chat_template does not parse ({e})")
    tokens = {k: _token_text(config.get(k)) or "" for k in ("bos_token", "eos_token", "unk_token", "pad_token")}

    def render(messages, add_generation_prompt=False):
        try:
            return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **tokens)
        except jinja2.exceptions.TemplateError as e:
            raise ValueError(f"the chat template fails to render: {e}")
    return render


def special_encoder(tok):
    """encode(text) with the tokenizer's special tokens written in the text as their ids (the
    template's markers), unlike the data scripts' encode, which reads them as text."""
    if not hasattr(tok, "tok"):  # GPT-2's BPE (tiktoken)
        return lambda text: tok.enc.encode(text, allowed_special="all")
    import tokenizers
    plain = tokenizers.Tokenizer.from_str(tok.tok.to_str())
    plain.encode_special_tokens = False
    return lambda text: plain.encode(text, add_special_tokens=False).ids


def conversation_tokens(messages, render, encode, doc_token):
    """(tokens, mask) of one conversation after the document token (module docstring); raises
    ValueError on a template that does not extend its prefixes."""
    tokens, mask = [doc_token], [0]
    try:
        done = render([])
    except ValueError:  # a template that reads messages[0] renders no empty conversation
        done = ""
    for k, m in enumerate(messages):
        text = render(messages[:k + 1])
        if not text.startswith(done):
            raise ValueError(f"the template's text for messages[:{k + 1}] does not start with its text for "
                             f"messages[:{k}], so turns cannot be told apart")
        pieces = [(text[len(done):], 0)]
        if m["role"] == "assistant":
            prompt = render(messages[:k], add_generation_prompt=True)
            if not (prompt.startswith(done) and text.startswith(prompt)):
                raise ValueError(f"the template's generation prompt for message {k} is not where the assistant's "
                                 "turn starts")
            pieces = [(prompt[len(done):], 0), (text[len(prompt):], 1)]
        for piece, keep in pieces:
            ids = encode(piece) if piece else []
            if len(tokens) == 1 and ids and ids[0] == doc_token:  # the template writes the BOS itself
                ids = ids[1:]
            tokens += ids
            mask += [keep] * len(ids)
        done = text
    return tokens, mask


def read_conversations(path):
    """[(line number, messages)] of a chat JSONL file; bad lines fail naming the file and line."""
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read as UTF-8 text ({e})")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise DataError(f"{where}: not JSON ({e})")
        messages = obj.get("messages") if isinstance(obj, dict) else None
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: no \"messages\" list")
        for j, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise DataError(f"{where}: message {j} needs a role in {ROLES} and a string content")
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(f"{where}: the conversation has no assistant turn (nothing to train on)")
        out.append((i, messages))
    if not out:
        raise DataError(f"{path}: no conversations")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, "the chat JSONL file")
    add_tokenizer_args(ap)
    ap.add_argument("--template", default="plain", help="plain (the built-in template) or a tokenizer_config.json "
                    "whose chat_template renders the conversations (default: plain)")
    ap.add_argument("--name", default="chat", help="the data set's name: folder and file names (default: chat)")
    ap.add_argument("--val", type=int, default=0, metavar="N", help="the first N conversations form the val shard")
    ap.add_argument("--shard-size", type=int, default=10_000_000, metavar="N", help="tokens a shard holds at most")
    args = ap.parse_args()
    if args.source is None:
        raise DataError("--source: give the chat JSONL file")
    if args.val < 0 or args.shard_size < 1:
        raise DataError("--val must be >= 0 and --shard-size positive")
    conversations = read_conversations(args.source)
    if args.val >= len(conversations):
        raise DataError(f"--val {args.val}: {args.source} has only {len(conversations)} conversations")
    render = plain_render if args.template == "plain" else jinja_renderer(args.template)
    tok = tokenizer_from_args(args, load=True)
    encode = special_encoder(tok)
    rendered = []
    for line, messages in conversations:
        try:
            rendered.append(conversation_tokens(messages, render, encode, tok.doc_token))
        except ValueError as e:
            raise DataError(f"{args.source}:{line}: {e}")
    out = dataset_dir(args.out_dir, args.name, tok)
    prepare_out_dir(out)
    splits = [("val", rendered[:args.val])] if args.val else []
    shards, current = [], []
    for conv in rendered[args.val:]:
        if current and sum(len(t) for t, _ in current) + len(conv[0]) > args.shard_size:
            shards.append(current)
            current = []
        current.append(conv)
    splits += [("train", s) for s in shards + [current]]
    for index, (split, convs) in enumerate(splits, 0 if args.val else 1):
        tokens = np.concatenate([np.asarray(t, dtype=np.int64) for t, _ in convs])
        mask = np.concatenate([np.asarray(m, dtype=np.uint8) for _, m in convs])
        path = out / f"{args.name}_{split}_{index:06d}.bin"
        llmc_formats.write_shard(str(path), tokens, tok.vocab_size, mask=mask)
        print(f"wrote {path} ({len(convs):,} conversations, {tokens.size:,} tokens, {int(mask.sum()):,} trained)")
    write_tokenizer_table(tok, args.out_dir)


if __name__ == "__main__":
    run_main(main)
