"""transformers' generate on a random GPT-2 (124M by default): the baseline beside generate.cu's
--bench (issue 15's targets). Random prompts of --prompt tokens, --new greedy tokens each
(min_new_tokens = max_new_tokens: end-of-text never stops a row), bf16 on the GPU, with the dynamic
cache and/or the static one (which transformers compiles). Per (B, cache): two warm-up runs, then
the median of --repeats timed runs of 1 and of --new tokens; decode time per token is their
difference over --new - 1. One line each:
  BENCH_HF B=.. prompt=.. new=.. cache=.. prefill_ms=.. ms_per_token=.. tok_s=..
Example:  python3 scripts/bench_generate_hf.py --batch 1 64 --cache dynamic static
"""
import argparse
import statistics
import sys
import time


def timed(model, ids, new, cache, device):
    import torch

    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, attention_mask=torch.ones_like(ids),
              pad_token_id=model.config.eos_token_id)
    if cache == "static":
        kw["cache_implementation"] = "static"
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, **kw)
    if device == "cuda":
        torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + new, out.shape
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64], help="batch sizes (default 1 64)")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens per row (default 64)")
    p.add_argument("--new", type=int, default=256, help="new tokens per row (default 256)")
    p.add_argument("--cache", nargs="+", default=["dynamic", "static"], choices=["dynamic", "static"])
    p.add_argument("--layers", type=int, default=12, help="GPT-2 layers (default 12: 124M)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (default 3)")
    p.add_argument("--device", default="cuda", help="cuda (bf16) or cpu (fp32) (default cuda)")
    args = p.parse_args()
    if args.new < 2:
        p.error("--new must be at least 2")
    try:
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        sys.exit(f"error: bench_generate_hf.py needs PyTorch and transformers (pip install torch transformers): {e}")
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.layers)).to(args.device, dtype).eval()
    for B in args.batch:
        ids = torch.randint(0, model.config.vocab_size, (B, args.prompt), device=args.device)
        for cache in args.cache:
            with torch.inference_mode():
                for _ in range(2):
                    timed(model, ids, args.new, cache, args.device)
                one = statistics.median(timed(model, ids, 1, cache, args.device) for _ in range(args.repeats))
                full = statistics.median(timed(model, ids, args.new, cache, args.device) for _ in range(args.repeats))
            per = (full - one) / (args.new - 1)
            print(f"BENCH_HF B={B} prompt={args.prompt} new={args.new} cache={cache} prefill_ms={one * 1e3:.3f} "
                  f"ms_per_token={per * 1e3:.4f} tok_s={B / per:.0f}", flush=True)


if __name__ == "__main__":
    main()
