#!/usr/bin/env python3
"""Converts a local Hugging Face model folder (config.json + model.safetensors, or shards listed in
model.safetensors.index.json) to our model file (GPTM), for --init of the trainers, generate and
scripts/train_gpt2.py --load. Needs numpy only: no torch, no transformers, no hub access.

    python3 scripts/import_hf.py path/to/TinyLlama-1.1B --out tinyllama.bin [--dtype bf16]
    python3 scripts/import_hf.py path/to/gpt2 --out gpt2_124M.bin

Supported: GPT2LMHeadModel, LlamaForCausalLM (also Llama 3.1 / 3.2 with their rope_type "llama3"
scaling), MistralForCausalLM (its sliding_window becomes our window), Qwen2ForCausalLM (our qkv_bias: q/k/v
biases and no others); scripts/hf_interop.py lists what each may hold. Anything else (rope scaling
other than llama3, partial_rotary_factor, head_dim != hidden_size / heads, activations other than
silu / tanh GELU, attention_bias or mlp_bias on Llama, per-layer sliding windows, a tensor the
mapping does not place) is refused with the config key or tensor named. Get the folder with e.g.
`huggingface-cli download TinyLlama/TinyLlama-1.1B-Chat-v1.0 --local-dir DIR` on a machine with
network. A model with RoPE scaling is written as a version-3 model file, a Qwen2 as version 4
(docs/formats.md): builds from before the knob refuse it rather than run without it.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_interop  # noqa: E402
import llmc_formats as fmt  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir", help="the Hugging Face model folder")
    ap.add_argument("--out", required=True, help="our model file to write")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="payload type (default fp32)")
    args = ap.parse_args(argv)
    try:
        cfg, flat = hf_interop.import_hf_dir(args.hf_dir)
        fmt.write_model(args.out, cfg, flat, fmt.DTYPE_BF16 if args.dtype == "bf16" else fmt.DTYPE_FP32)
    except (fmt.FormatError, hf_interop.HFError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        print(f"error: {e.filename or args.out}: {e.strerror or e}", file=sys.stderr)
        sys.exit(1)
    except MemoryError:
        print(f"error: {args.hf_dir}: its config.json implies more parameters than this machine's memory holds",
              file=sys.stderr)
        sys.exit(1)
    arch = "gpt2" if cfg["architecture"] == fmt.ARCH_GPT2 else "llama"
    print(f"wrote {args.out} ({arch}: {cfg['num_layers']} layers, {cfg['channels']} channels, {cfg['num_heads']} "
          f"heads / {cfg['num_kv_heads']} kv, vocab {cfg['vocab_size']}, {args.dtype}, {flat.size} parameters)")


if __name__ == "__main__":
    main()
