#!/usr/bin/env python3
"""Training throughput of GPT-2 written the way a speed-minded PyTorch user writes it (the style of
Karpathy's nanoGPT): one nn.Module per block with nn.Linear layers (attention c_attn/c_proj, MLP
c_fc/c_proj), nn.LayerNorm, GELU (tanh approximation, as GPT-2), F.scaled_dot_product_attention
with is_causal=True (flash attention on a GPU), the output head tied to the token embedding, the
vocab padded from 50257 to 50304, bf16 autocast, TF32 for the fp32 matmuls, cross-entropy on the
logits, clipping at 1.0, torch.optim.AdamW(fused=True) with our trainer's defaults (lr 6e-4,
betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the matrices and embeddings), and torch.compile on
the model (--compile 1, the default). It trains on one batch of random tokens; the first steps
(compilation included) are warm-up, the rest are timed with CUDA events, one step at a time. The
last line is
  BENCH name=<nanogpt_compile|nanogpt_eager>[_float8_<recipe>] ms=<median ms/step> tok_s=<tokens/s> peak_gib=<peak GPU memory>
as scripts/train_gpt2.py --bench prints it, so scripts/bench_train.sh tabulates them side by side.

Unlike scripts/train_gpt2.py (our reference model, parameters in our checkpoint layout), this model
is laid out as PyTorch users lay it out, so it shows what PyTorch reaches with the layout it likes.

--model takes the shapes of our trainer's --init (llmc/model_config.h): dN = N layers, 64N channels,
N heads (d12 = GPT-2 124M), or gpt2 | gpt2-medium | gpt2-large | gpt2-xl = the GPT-2 family's
12/768/12, 24/1024/16, 36/1280/20, 48/1600/25 (layers/channels/heads; 124M, 350M, 774M, 1.5B).

Examples:
  python3 scripts/bench_nanogpt.py --model d12 --batch 64 --seq 1024 --steps 30
  python3 scripts/bench_nanogpt.py --device cpu --model d2 --batch 2 --seq 64 --steps 4 --compile 0
  python3 scripts/bench_nanogpt.py --model d12 --float8 tensorwise     # torchao's float8 training (issue 18)
"""
import argparse
import math
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:  # --help and the flag checks work without PyTorch; main() then says it is needed
    torch = None

VOCAB = 50257         # GPT-2's tokenizer
PADDED_VOCAB = 50304  # a multiple of 128 (our trainer pads the same way), so the head's matmul tiles evenly
GPT2_FAMILY = {"gpt2": (12, 768, 12), "gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20),
               "gpt2-xl": (48, 1600, 25)}
# Our trainer's optimizer defaults (llmc/train_config.h, llmc/schedule.h).
LR, BETAS, EPS, WEIGHT_DECAY, GRAD_CLIP = 6e-4, (0.9, 0.95), 1e-8, 0.1, 1.0


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def model_shape(desc):
    """(layers, channels, heads) of a --model descriptor, or None when it is not one."""
    if desc in GPT2_FAMILY:
        return GPT2_FAMILY[desc]
    if len(desc) >= 2 and desc[0] == "d" and desc[1:].isdigit() and 0 < int(desc[1:]) <= 96:
        n = int(desc[1:])
        return n, 64 * n, n
    return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="d12", help="dN (N layers, 64N channels, N heads; d12 = 124M) or "
                                                  "gpt2|gpt2-medium|gpt2-large|gpt2-xl (default d12)")
    p.add_argument("--batch", type=int, default=64, help="B (default 64)")
    p.add_argument("--seq", type=int, default=1024, help="T (default 1024)")
    p.add_argument("--max-seq", type=int, default=1024, help="rows of the position embedding (default 1024)")
    p.add_argument("--steps", type=int, default=30, help="steps in all, the first max(3, steps/3) are warm-up "
                                                         "(default 30)")
    p.add_argument("--compile", type=int, choices=[0, 1], default=1, help="1: train through torch.compile "
                                                                          "(default 1)")
    p.add_argument("--float8", default="none", choices=["none", "tensorwise", "rowwise", "rowwise_with_gw_hp"],
                   help="torchao's float8 training (pip install torchao) on the blocks' nn.Linear layers, the "
                        "output head left in bf16 as our --fp8 leaves it: the recipe name of "
                        "torchao.float8.Float8LinearConfig.from_recipe_name (default none)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test (default cuda)")
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args(argv)
    args.shape = model_shape(args.model)
    if args.shape is None:
        p.error(f"--model {args.model}: not a model descriptor (expected dN with 1 <= N <= 96, such as d12, "
                f"or one of {', '.join(GPT2_FAMILY)})")
    for flag in ("batch", "seq", "max_seq", "steps"):
        if getattr(args, flag) <= 0:
            p.error(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.seq > args.max_seq:
        p.error(f"--seq {args.seq} exceeds --max-seq {args.max_seq}")
    if args.device not in ("cpu", "cuda"):
        p.error(f"--device {args.device}: expected cpu or cuda")
    args.warmup = max(3, args.steps // 3)
    if args.steps <= args.warmup:
        p.error(f"--steps {args.steps}: needs more than {args.warmup} steps (the first {args.warmup} are warm-up)")
    return args


# ---------------------------------------------------------------- the model
# (object only without torch: the file still loads, so --help works)
Module = nn.Module if torch is not None else object


class CausalSelfAttention(Module):
    def __init__(self, C, NH):
        super().__init__()
        self.n_head = NH
        self.c_attn = nn.Linear(C, 3 * C)  # q, k and v of every head in one matmul
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):  # x (B, T, C)
        B, T, C = x.shape
        # (B, T, 3C) -> three (B, NH, T, HD), the layout SDPA takes
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, NH, T, HD)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(Module):
    """Pre-norm transformer block: x + attn(ln(x)), then + mlp(ln(.))."""

    def __init__(self, C, NH):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, NH)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(Module):
    def __init__(self, L, C, NH, max_seq, vocab=PADDED_VOCAB):
        super().__init__()
        self.wte = nn.Embedding(vocab, C)
        self.wpe = nn.Embedding(max_seq, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one (Vp, C) tensor, gradients from both uses add up
        # GPT-2's init: N(0, 0.02), zero biases, the projections that write into the residual stream
        # scaled down by sqrt(2L) so the stream's variance does not grow with depth
        for name, p in self.named_parameters():
            if p.dim() == 1:
                if name.endswith(".bias"):
                    nn.init.zeros_(p)
                continue
            std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx, targets):  # idx, targets (B, T) token ids; returns the mean loss
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, Vp)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# ---------------------------------------------------------------- the timed loop
def fused_adamw(params):
    """torch's fused AdamW at our trainer's defaults: weight decay on the matrices and embeddings (every
    tensor of 2+ dims), none on norms and biases."""
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, fused=True)


def time_training(step_model, opt, params, x, y, args, name):
    """The timed loop every PyTorch anchor runs (scripts/bench_llama.py too): args.steps AdamW steps of
    step_model(x, y) -> mean loss under bf16 autocast, clipping params' norm at GRAD_CLIP; CUDA events around
    each step on a GPU, the wall clock on the CPU. Prints a `step n train_loss x ms x` line a step and last
    the BENCH line: the median over the steps after args.warmup, tokens a second, peak GPU memory."""
    cuda = x.is_cuda
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for step in range(args.steps):
        if cuda:
            start.record()
        else:
            t0 = time.perf_counter()
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            times.append((time.perf_counter() - t0) * 1e3)
        tag = " (warm-up)" if step < args.warmup else ""
        print(f"step {step + 1} train_loss {loss.item():.6f} ms {times[-1]:.1f}{tag}", flush=True)
    ms = statistics.median(times[args.warmup:])
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else float("nan")
    B, T = x.shape
    print(f"BENCH name={name} ms={ms:.2f} tok_s={B * T / ms * 1e3:.0f} peak_gib={peak:.2f}")


def main(argv=None):
    args = parse_args(argv)
    if torch is None:
        die("scripts/bench_nanogpt.py needs PyTorch (pip install torch); only --help works without it")
    dev, B, T = args.device, args.batch, args.seq
    cuda = dev == "cuda"
    if cuda and not torch.cuda.is_available():
        die("--device cuda: no GPU is visible to PyTorch")
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls outside autocast (none in the step's hot path)
    torch.backends.cudnn.allow_tf32 = True
    L, C, NH = args.shape
    model = GPT(L, C, NH, args.max_seq).to(dev)
    params = list(model.parameters())  # the tied weight once
    opt = fused_adamw(params)
    if args.float8 != "none":  # swaps the modules in place; the optimizer's parameters stay the same tensors
        try:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        except ImportError as e:
            die(f"--float8 {args.float8}: needs torchao (pip install torchao): {e}")
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(args.float8),
                                   module_filter_fn=lambda mod, fqn: fqn != "lm_head")
    step_model = torch.compile(model) if args.compile else model
    g = torch.Generator(device=dev).manual_seed(args.seed)
    x = torch.randint(0, VOCAB, (B, T), device=dev, generator=g)
    y = torch.randint(0, VOCAB, (B, T), device=dev, generator=g)
    n_params = sum(p.numel() for p in params)
    print(f"nanoGPT-style GPT-2 {args.model}: L={L} C={C} NH={NH} Vp={PADDED_VOCAB}, {n_params / 1e6:.1f}M "
          f"parameters, B={B} T={T}, {'torch.compile' if args.compile else 'eager'}, {dev}"
          f"{'' if args.float8 == 'none' else ', torchao float8 ' + args.float8}", flush=True)

    name = ("nanogpt_compile" if args.compile else "nanogpt_eager") + ("" if args.float8 == "none" else
                                                                       "_float8_" + args.float8)
    time_training(step_model, opt, params, x, y, args, name)


if __name__ == "__main__":
    main()
