#!/usr/bin/env python3
"""Training throughput of a Hugging Face `transformers` model, as a user of that library would train
it: LlamaForCausalLM (or GPT2LMHeadModel) from a local config (random init, no hub), SDPA
attention, bf16 autocast, fused AdamW, clipping at 1.0, optionally under torch.compile, on one batch
of random tokens. The median is over the steps after a warm-up that also absorbs compilation.
The last line is
  BENCH name=<hf_eager|hf_compile> ms=<median ms/step> tok_s=<tokens/s> peak_gib=<peak GPU memory>
as scripts/train_gpt2.py --bench prints it, so scripts/bench_train.sh tabulates both.

Example (the Llama-style 114M shape of docs/perf.md):
  python3 scripts/bench_hf.py --arch llama --layers 12 --channels 768 --heads 12 --kv-heads 4 \\
      --mlp-hidden 2048 --vocab 50304 --batch 64 --seq 1024 --steps 30 --compile
"""
import argparse
import statistics
import sys
import time


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=["llama", "gpt2"], default="llama")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--channels", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=0, help="Llama: key/value heads (0 = as many as heads)")
    p.add_argument("--mlp-hidden", type=int, default=0, help="Llama: SwiGLU hidden width (0 = 8C/3 rounded up to 64)")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("--tied", type=int, choices=[0, 1], default=1, help="1 = the output head is the embedding")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--norm-eps", type=float, default=1e-5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--compile", action="store_true", help="train through torch.compile")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test")
    args = p.parse_args(argv)
    for flag in ("layers", "channels", "heads", "vocab", "max_seq", "batch", "seq", "steps"):
        if getattr(args, flag) <= 0:
            p.error(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.kv_heads < 0 or args.mlp_hidden < 0:
        p.error("--kv-heads and --mlp-hidden must be >= 0")
    if args.channels % args.heads:
        p.error(f"--channels {args.channels} must be a multiple of --heads {args.heads}")
    if args.kv_heads and args.heads % args.kv_heads:
        p.error(f"--kv-heads {args.kv_heads} must divide --heads {args.heads}")
    if args.seq > args.max_seq:
        p.error(f"--seq {args.seq} exceeds --max-seq {args.max_seq}")
    if args.device not in ("cpu", "cuda"):
        p.error(f"--device {args.device}: expected cpu or cuda")
    return args


def hf_model(args):
    import transformers
    C = args.channels
    if args.arch == "llama":
        H = args.mlp_hidden or (8 * C // 3 + 63) // 64 * 64
        cfg = transformers.LlamaConfig(
            vocab_size=args.vocab, hidden_size=C, intermediate_size=H, num_hidden_layers=args.layers,
            num_attention_heads=args.heads, num_key_value_heads=args.kv_heads or args.heads,
            max_position_embeddings=args.max_seq, rms_norm_eps=args.norm_eps, rope_theta=args.rope_theta,
            tie_word_embeddings=bool(args.tied), attention_bias=False, mlp_bias=False, hidden_act="silu")
        cfg._attn_implementation = "sdpa"
        return transformers.LlamaForCausalLM(cfg)
    if args.kv_heads not in (0, args.heads) or args.mlp_hidden or not args.tied:
        die("--arch gpt2: transformers' GPT-2 is multi-head with a 4C MLP and a tied head")
    cfg = transformers.GPT2Config(vocab_size=args.vocab, n_positions=args.max_seq, n_embd=C, n_layer=args.layers,
                                  n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cfg._attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(cfg)


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
        import transformers  # noqa: F401
    except ImportError as e:
        die(f"bench_hf.py needs torch and transformers ({e})")
    dev, B, T, V = args.device, args.batch, args.seq, args.vocab
    if dev == "cuda" and not torch.cuda.is_available():
        die("--device cuda: no GPU is visible to PyTorch")
    warmup = max(3, args.steps // 3)
    if args.steps <= warmup:
        die(f"--steps {args.steps}: the bench needs more than {warmup} steps (the first {warmup} are warm-up)")
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = hf_model(args).to(dev).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev == "cuda")
    step_model = torch.compile(model) if args.compile else model
    g = torch.Generator(device=dev).manual_seed(args.seed)
    x = torch.randint(0, V, (B, T), device=dev, generator=g)
    y = torch.randint(0, V, (B, T), device=dev, generator=g)
    amp = torch.autocast(device_type=dev, dtype=torch.bfloat16)

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.steps):
        sync()
        t0 = time.perf_counter()
        with amp:
            logits = step_model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        print(f"step {step + 1} train_loss {loss.item():.6f} ms {times[-1]:.1f}", flush=True)
    ms = statistics.median(times[warmup:])
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if dev == "cuda" else float("nan")
    name = "hf_compile" if args.compile else "hf_eager"
    print(f"BENCH name={name} ms={ms:.2f} tok_s={B * T / ms * 1e3:.0f} peak_gib={peak:.2f}")


if __name__ == "__main__":
    main()
