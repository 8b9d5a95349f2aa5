#!/usr/bin/env python3
"""Writes one of our model files (GPTM, fp32 or bf16; GPT-2 or Llama-style) as a Hugging Face model
folder that transformers loads with AutoModelForCausalLM.from_pretrained(DIR): config.json,
model.safetensors, generation_config.json. Needs numpy only (no torch, no transformers).

    python3 scripts/export_hf.py out/d12/step_00002000 --out-dir hf/d12     # or out/d12: its newest checkpoint
    python3 scripts/export_hf.py llama.bin --out-dir hf/llama --dtype bf16 --bos-id 128000 --eos-id 128001

The class follows the model's knobs (scripts/hf_interop.py has the table): GPT-2 -> GPT2LMHeadModel;
Llama -> LlamaForCausalLM, with an attention window -> MistralForCausalLM (sliding_window = the
window: both attend to positions t-W+1..t), with q/k/v biases (qkv_bias) -> Qwen2ForCausalLM. A Llama
with attproj/fc/fcproj biases (biases = 1; in a file of version 1 to 3, all four) exports only while
those are zero, without them: no Llama-family class has them. A model no transformers class
computes exactly (a GPT-2 with grouped-query attention or a window, a GELU model with RMSNorm, ...)
is refused with the knob named. The padded vocabulary rows are dropped (transformers has
vocab_size rows). The tokenizer is not part of our model file: copy the tokenizer files
(tokenizer.json, tokenizer_config.json, ...) into --out-dir yourself.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_interop  # noqa: E402
import llmc_formats as fmt  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="our model file (a checkpoint's model.bin is checked against its DONE first); "
                    "or a checkpoint directory step_NNNNNNNN (its DONE manifest verified); or a training run's "
                    "output folder of them (its newest checkpoint that verifies, as generate's --model)")
    ap.add_argument("--out-dir", required=True, help="the Hugging Face folder to write (created if missing)")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="tensor type in model.safetensors (default: the model file's, fp32 or bf16)")
    ap.add_argument("--bos-id", type=int, default=None, help="bos_token_id of the config (default: GPT-2's 50256 "
                    "for a 50257-token vocabulary, else none)")
    ap.add_argument("--eos-id", type=int, default=None, help="eos_token_id, the token generate() stops at "
                    "(default: as --bos-id)")
    args = ap.parse_args(argv)
    path = args.model
    try:
        if os.path.isdir(path):
            ck = fmt.find_checkpoint(path)
            if ck is None:  # a plain folder: its model.bin
                path = os.path.join(path, "model.bin")
                if not os.path.isfile(path):
                    raise fmt.FormatError(f"{args.model}: no model.bin and no complete checkpoint "
                                          "(step_NNNNNNNN/ with DONE) in it")
            else:
                if os.path.normpath(ck) != os.path.normpath(path):
                    print(f"using {ck}, the newest complete checkpoint in {args.model}")
                path = os.path.join(ck, "model.bin")
        else:
            fmt.check_checkpoint_model(path)  # a checkpoint's model.bin named directly: checked against its DONE
        h, _ = fmt.read_header(path, fmt.MAGIC_MODEL)
        cfg, flat = fmt.read_model(path)
        dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if int(h[2]) == fmt.DTYPE_BF16 else "float32")
        default = 50256 if cfg["vocab_size"] == 50257 else None  # GPT-2's <|endoftext|>
        bos = args.bos_id if args.bos_id is not None else default
        eos = args.eos_id if args.eos_id is not None else bos
        for flag, v in (("--bos-id", bos), ("--eos-id", eos)):
            if v is not None and not 0 <= v < cfg["vocab_size"]:
                raise hf_interop.HFError(f"{flag} {v}: not a token id of the model (vocab_size {cfg['vocab_size']})")
        hc, mt = hf_interop.export_hf_dir(args.out_dir, cfg, flat, dtype, bos, eos, what=path)
    except (fmt.FormatError, hf_interop.HFError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        print(f"error: {e.filename or args.out_dir}: {e.strerror or e}", file=sys.stderr)
        sys.exit(1)
    print(f"wrote {args.out_dir}: {hc['architectures'][0]} ({mt}), {dtype}, {flat.size} parameters in our layout")


if __name__ == "__main__":
    main()
