#!/usr/bin/env python3
"""Training throughput of a Llama-style model written the way a speed-minded PyTorch user writes it
(the style of torchtitan's llama3 model with gpt-fast's fused projections): one nn.Module per block,
nn.Linear layers without biases (attention wqkv/wo, feed-forward w13/w2), nn.RMSNorm (eps 1e-5),
RoPE (theta 10000; cos/sin precomputed once as a buffer, applied in fp32 and cast back), SwiGLU
w2(silu(gate) * up), F.scaled_dot_product_attention with is_causal=True (flash attention on a GPU),
grouped-query attention, the output head tied to the token embedding (--tied 0: a separate head),
cross-entropy on the logits inside the model, clipping at 1.0, torch.optim.AdamW(fused=True) with
our trainer's defaults, and torch.compile on the whole model, loss included (--compile 1, the
default). Precision: bf16 autocast over fp32 weights, which is what torchtitan runs on one GPU
(its pure-bf16 parameters come only with FSDP); TF32 for the fp32 matmuls. It trains on one batch
of random tokens; the first max(3, steps/3) steps (compilation included) are warm-up, the rest are
timed with CUDA events, one step at a time. The last line is
  BENCH name=<titan_compile|titan_eager> ms=<median ms/step> tok_s=<tokens/s> peak_gib=<peak GPU memory>
as scripts/train_gpt2.py --bench prints it, so scripts/bench_train.sh tabulates them side by side.

Fused projections: q, k and v come from one (NH+2KV)*HD x C matmul and SwiGLU's gate and up from one
2F x C matmul (gate rows first), the same row order as our checkpoint's qkvw and fcw, so fewer and
larger GEMMs run than with torchtitan's separate wq/wk/wv and w1/w3.

Grouped-query attention (query head h reads key/value head h // (heads/kv-heads)): --gqa sdpa passes
enable_gqa=True, so SDPA's flash kernel reads the KV heads without copying them (bf16 and fp16
only; in fp32 SDPA falls back to its unfused math path); --gqa repeat expands K and V with
repeat_interleave first, as torchtitan's repeat_kv does. Time both on the GPU to see which wins.

RoPE pairs channel i with channel i + HD/2 of each head (rotate_half, as transformers and our
reference scripts/train_gpt2.py), not adjacent channels (Meta's complex-number form).

--check compares this model with our reference scripts/train_gpt2.py --arch llama in float64 on the
CPU: tiny multi-head and grouped-query models, tied and untied heads, both --gqa paths, the
reference's weights copied in; the loss and the logits of one batch of random tokens must agree to
1e-5 relative. One line per case and GQA path, exit status 1 on any mismatch. The shape and bench
flags do not apply to it.

Examples:
  python3 scripts/bench_llama.py --batch 64 --seq 1024 --steps 30          # the 114M shape of docs/perf.md
  python3 scripts/bench_llama.py --device cpu --layers 2 --channels 64 --heads 4 --kv-heads 2 \\
      --mlp-hidden 96 --vocab 512 --batch 2 --seq 32 --steps 4 --compile 0
  python3 scripts/bench_llama.py --check
"""
import argparse
import contextlib
import math
import os
import sys

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:  # --help and the flag checks work without PyTorch; main() then says it is needed
    torch = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_nanogpt as nanogpt  # noqa: E402  (the optimizer and the timed loop every PyTorch anchor runs)

ROPE_THETA, NORM_EPS = 10000.0, 1e-5
# --check: (name, layers, channels, heads, kv heads, SwiGLU hidden width, vocab, tied) at the widths of
# scripts/train_gpt2.py's Llama fixtures (hidden widths that are not 8C/3, a vocab that is not padded)
CHECK_CASES = [("mha_tied", 2, 32, 4, 4, 48, 250, 1), ("mha_untied", 2, 32, 4, 4, 48, 250, 0),
               ("gqa_tied", 2, 36, 6, 2, 40, 250, 1), ("gqa_untied", 2, 36, 6, 2, 40, 250, 0)]
CHECK_MAX_SEQ, CHECK_B, CHECK_T, CHECK_RTOL = 32, 2, 16, 1e-5


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr, no usage block
        die(message)


# (flag, default, help) of the model's shape: the 114M shape of docs/perf.md
SHAPE_FLAGS = (("layers", 12, "transformer blocks"), ("channels", 768, "model width C"),
               ("heads", 12, "query heads"), ("kv-heads", 4, "key/value heads, dividing --heads"),
               ("mlp-hidden", 2048, "SwiGLU hidden width"), ("vocab", 50304, "vocabulary"),
               ("max-seq", 1024, "rows of the RoPE cos/sin buffer"))
RUN_FLAGS = (("batch", 64, "B"), ("seq", 1024, "T"),
             ("steps", 30, "steps in all; the first max(3, steps/3) are warm-up, the median is over the rest"))


def parse_args(argv=None):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default, what in SHAPE_FLAGS + RUN_FLAGS:
        p.add_argument(f"--{flag}", type=int, default=default, help=f"{what} (default {default})")
    p.add_argument("--tied", type=int, choices=[0, 1], default=1,
                   help="1: the output head is the token embedding, 0: a head of its own (default 1)")
    p.add_argument("--gqa", choices=["sdpa", "repeat"], default="sdpa",
                   help="grouped-query attention through SDPA's enable_gqa, or K/V expanded by "
                        "repeat_interleave (default sdpa)")
    p.add_argument("--compile", type=int, choices=[0, 1], default=1,
                   help="1: torch.compile the model, 0: eager (default 1)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke test (default cuda)")
    p.add_argument("--seed", type=int, default=1337, help="init and random tokens (default 1337)")
    p.add_argument("--check", action="store_true",
                   help="compare with scripts/train_gpt2.py's Llama in float64 on the CPU, then exit")
    args = p.parse_args(argv)
    for flag, _, _ in SHAPE_FLAGS + RUN_FLAGS:
        if getattr(args, flag.replace("-", "_")) <= 0:
            p.error(f"--{flag} must be positive, got {getattr(args, flag.replace('-', '_'))}")
    if args.channels % args.heads:
        p.error(f"--channels {args.channels} must be a multiple of --heads {args.heads}")
    if (args.channels // args.heads) % 2:
        p.error(f"--channels {args.channels} / --heads {args.heads}: RoPE needs an even head dim")
    if args.heads % args.kv_heads:
        p.error(f"--kv-heads {args.kv_heads} must divide --heads {args.heads}")
    if args.seq > args.max_seq:
        p.error(f"--seq {args.seq} exceeds --max-seq {args.max_seq}")
    args.warmup = max(3, args.steps // 3)
    if args.steps <= args.warmup and not args.check:
        p.error(f"--steps {args.steps}: needs more than {args.warmup} steps (the first {args.warmup} are warm-up)")
    return args


# ---------------------------------------------------------------- the model
# (object only without torch: the file still loads, so --help works)
Module = nn.Module if torch is not None else object


def rope_cache(max_seq, HD, theta):
    """cos, sin (max_seq, HD/2) of the angles t * theta^(-2i/HD), computed in float64, stored in the
    default dtype."""
    inv_freq = theta ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    angles = torch.arange(max_seq, dtype=torch.float64)[:, None] * inv_freq[None, :]
    dtype = torch.get_default_dtype()
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x (B, T, heads, HD) rotated by the angles cos, sin (T, HD/2): the pair (x_i, x_{i+HD/2}) turns
    by angle i, in the buffers' dtype (fp32 under autocast), cast back to x's."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, None], sin[:, None]  # (T, 1, HD/2), broadcast over the heads
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


def attention(q, k, v, gqa):
    """Causal attention of q (B, NH, T, HD) over k, v (B, KV, T, HD); query head h reads key/value
    head h // (NH/KV). gqa: "sdpa" (SDPA's enable_gqa) or "repeat" (K, V expanded first)."""
    if k.size(1) == q.size(1):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if gqa == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(Module):
    def __init__(self, C, NH, KV, gqa):
        super().__init__()
        self.n_head, self.n_kv, self.head_dim, self.gqa = NH, KV, C // NH, gqa
        self.wqkv = nn.Linear(C, (NH + 2 * KV) * self.head_dim, bias=False)  # rows: all Q heads, all K, all V
        self.wo = nn.Linear(C, C, bias=False)

    def forward(self, x, cos, sin):  # x (B, T, C), cos and sin (T, HD/2)
        B, T, C = x.shape
        HD, KVD = self.head_dim, self.n_kv * self.head_dim
        q, k, v = self.wqkv(x).split([C, KVD, KVD], dim=2)
        q = apply_rope(q.view(B, T, self.n_head, HD), cos, sin)  # (B, T, NH, HD)
        k = apply_rope(k.view(B, T, self.n_kv, HD), cos, sin)    # (B, T, KV, HD)
        v = v.view(B, T, self.n_kv, HD)
        y = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.gqa)  # (B, NH, T, HD)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))


class FeedForward(Module):
    def __init__(self, C, hidden):
        super().__init__()
        self.w13 = nn.Linear(C, 2 * hidden, bias=False)  # rows: gate, then up
        self.w2 = nn.Linear(hidden, C, bias=False)

    def forward(self, x):
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(Module):
    """Pre-norm block: x + attention(norm(x)), then + feed_forward(norm(.))."""

    def __init__(self, C, NH, KV, hidden, gqa):
        super().__init__()
        self.attention_norm = nn.RMSNorm(C, eps=NORM_EPS)
        self.attention = Attention(C, NH, KV, gqa)
        self.ffn_norm = nn.RMSNorm(C, eps=NORM_EPS)
        self.feed_forward = FeedForward(C, hidden)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(Module):
    def __init__(self, L, C, NH, KV, hidden, vocab, max_seq, tied=True, gqa="sdpa"):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, C)
        self.layers = nn.ModuleList(Block(C, NH, KV, hidden, gqa) for _ in range(L))
        self.norm = nn.RMSNorm(C, eps=NORM_EPS)
        self.output = nn.Linear(C, vocab, bias=False)
        if tied:  # one (V, C) tensor, gradients from both uses add up
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_cache(max_seq, C // NH, ROPE_THETA)
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_seq, HD/2)
        self.register_buffer("rope_sin", sin, persistent=False)
        # our trainer's init (docs/design.md): matrices and embeddings N(0, 0.02), the projections that
        # write into the residual stream N(0, 0.02/sqrt(2L)), RMSNorm weights 1 (nn.RMSNorm's own)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx, targets=None):  # idx, targets (B, T) token ids; the logits, or the mean loss
        T = idx.size(1)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.tok_embeddings(idx)  # (B, T, C)
        for block in self.layers:
            x = block(x, cos, sin)
        logits = self.output(self.norm(x))  # (B, T, V)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# ---------------------------------------------------------------- --check against the reference
@contextlib.contextmanager
def default_dtype(dtype):
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def copy_reference_weights(model, ref):
    """Our checkpoint layout (stacked per-layer tensors, wte/lm_head padded to Vp rows) into the
    modules; qkvw's and fcw's row orders are wqkv's and w13's."""
    V = model.tok_embeddings.weight.size(0)
    with torch.no_grad():
        model.tok_embeddings.weight.copy_(ref.wte[:V])
        if ref.param("lm_head") is not None:
            model.output.weight.copy_(ref.lm_head[:V])
        model.norm.weight.copy_(ref.lnfw)
        for l, block in enumerate(model.layers):
            for dst, src in ((block.attention_norm.weight, ref.ln1w), (block.attention.wqkv.weight, ref.qkvw),
                             (block.attention.wo.weight, ref.attprojw), (block.ffn_norm.weight, ref.ln2w),
                             (block.feed_forward.w13.weight, ref.fcw), (block.feed_forward.w2.weight, ref.fcprojw)):
                dst.copy_(src[l])


def check():
    """Runs CHECK_CASES; prints one line per case and path; returns True when all agree."""
    import train_gpt2
    ok = True
    for name, L, C, NH, KV, hidden, V, tied in CHECK_CASES:
        cfg = train_gpt2.make_config(f"--check {name}", L, C, NH, V, CHECK_MAX_SEQ, KV, 0, "llama",
                                     mlp_hidden=hidden, tied=tied)
        ref = train_gpt2.GPT2(cfg).double()
        ref.init_weights(seed=1)
        ref.randomize_biases_and_norms(seed=1)  # norm weights not 1, so a norm that drops its weight fails
        g = torch.Generator().manual_seed(2)
        x = torch.randint(0, V, (CHECK_B, CHECK_T), generator=g)
        y = torch.randint(0, V, (CHECK_B, CHECK_T), generator=g)
        with torch.no_grad():
            ref_logits, ref_loss = ref(x, y)
        ref_logits = ref_logits[..., :V]
        for gqa in (["sdpa", "repeat"] if KV != NH else ["sdpa"]):
            with default_dtype(torch.float64):
                model = Llama(L, C, NH, KV, hidden, V, CHECK_MAX_SEQ, bool(tied), gqa)
            copy_reference_weights(model, ref)
            with torch.no_grad():
                logits, loss = model(x), model(x, y)
            loss_err = abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())
            logits_err = ((logits - ref_logits).abs().max() / ref_logits.abs().max()).item()
            good = loss_err <= CHECK_RTOL and logits_err <= CHECK_RTOL
            ok &= good
            print(f"check {name} gqa={gqa}: loss {loss.item():.9f} vs reference {ref_loss.item():.9f} (rel "
                  f"{loss_err:.1e}), logits max rel {logits_err:.1e}: {'ok' if good else 'MISMATCH'}", flush=True)
    return ok


def main(argv=None):
    args = parse_args(argv)
    if torch is None:
        die("scripts/bench_llama.py needs PyTorch (pip install torch); only --help works without it")
    if args.check:
        sys.exit(0 if check() else 1)
    dev, B, T, V = args.device, args.batch, args.seq, args.vocab
    cuda = dev == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            die("--device cuda: no GPU is visible to PyTorch")
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls outside autocast (none in the hot path)
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)
    model = Llama(args.layers, args.channels, args.heads, args.kv_heads, args.mlp_hidden, V, args.max_seq,
                  bool(args.tied), args.gqa).to(dev)
    params = list(model.parameters())  # the tied weight once
    opt = nanogpt.fused_adamw(params)
    step_model = torch.compile(model) if args.compile else model
    g = torch.Generator(device=dev).manual_seed(args.seed)
    x, y = (torch.randint(0, V, (B, T), device=dev, generator=g) for _ in range(2))
    print(f"torchtitan-style Llama: L={args.layers} C={args.channels} NH={args.heads} KV={args.kv_heads} "
          f"F={args.mlp_hidden} V={V} {'tied' if args.tied else 'untied'}, "
          f"{sum(p.numel() for p in params) / 1e6:.1f}M parameters, B={B} T={T}, GQA via {args.gqa}, "
          f"{'torch.compile' if args.compile else 'eager'}, {dev}", flush=True)

    nanogpt.time_training(step_model, opt, params, x, y, args, f"titan_{'compile' if args.compile else 'eager'}")


if __name__ == "__main__":
    main()
