#!/usr/bin/env python3
"""Greedy decoding the way a speed-minded PyTorch user writes it (gpt-fast's recipe), beside
generate.cu's --bench: a hand-written model (one nn.Module per block, nn.Linear layers), a static
preallocated KV cache per layer (B, kv heads, cache length, head dim) written in place,
F.scaled_dot_product_attention over the whole cache with a causal mask row per position, bf16 on the
GPU, the head on the last position only, argmax on the device, and (--compile 1) torch.compile with
mode="reduce-overhead", fullgraph=True on the one-token step (CUDA graphs) and a separate
fullgraph compile of the prefill (dynamic=False). The host waits only once, after the last token.

Shapes (--arch): gpt2 = GPT-2 124M (12 layers, 768 channels, 12 heads, LayerNorm, learned positions,
tanh GELU, biases, tied head, vocab 50257 padded to 50304); llama = our llama:L12,C768,H12,KV4,F2048,
V50304 (RMSNorm eps 1e-5, RoPE theta 10000 with rotate_half pairing, SwiGLU hidden 2048, 4 key/value
heads, no biases, tied head). --layers .. --vocab override the shape (small models for tests).
Weights: random (N(0, 0.02)), or --model FILE (our model file, scripts/llmc_formats.py).

Timing as scripts/bench_generate_hf.py: random prompts of --prompt tokens, --new greedy tokens each;
per B two warm-up runs (compilation), then the median of --repeats timed runs of 1 and of --new tokens;
decode time per token is their difference over --new - 1, tok_s = B / that. One line each:
  BENCH_FAST arch=.. B=.. prompt=.. new=.. prefill_ms=.. ms_per_token=.. tok_s=.. compile=..

--check (fp32 on the CPU, needs transformers): the same weights in GPT2LMHeadModel / LlamaForCausalLM
(scripts/hf_interop.py's mapping); this decoder's greedy tokens equal transformers' generate, and its
logits at every step equal the full forward's within 1e-4. Prints CHECK_FAST; exit 1 on a mismatch.

Examples:
  python3 scripts/bench_generate_fast.py --arch gpt2 --batch 1 64
  python3 scripts/bench_generate_fast.py --arch llama --layers 2 --channels 64 --heads 4 --kv-heads 2 \\
      --hidden 128 --vocab 300 --check --compile 0
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llmc_formats as fmt  # noqa: E402  (the one Python copy of the file formats)

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:  # --help and the flag checks work without PyTorch; main() then says it is needed
    torch = None

# (layers, channels, heads, kv heads, mlp hidden, vocab) of --arch
ARCH_SHAPES = {"gpt2": (12, 768, 12, 12, 3072, 50257), "llama": (12, 768, 12, 4, 2048, 50304)}
CHECK_TOL = 1e-4


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="gpt2", choices=sorted(ARCH_SHAPES), help="model shape (default gpt2)")
    p.add_argument("--model", help="our model file (its config replaces --arch and the shape flags)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64], help="batch sizes (default 1 64)")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens per row (default 64)")
    p.add_argument("--new", type=int, default=256, help="new tokens per row (default 256)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (default 3)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cuda (bf16) or cpu (fp32)")
    p.add_argument("--compile", type=int, default=1, choices=[0, 1], help="1: torch.compile the step "
                   "(reduce-overhead) and the prefill (default 1)")
    p.add_argument("--check", action="store_true", help="check against transformers (fp32, CPU) and exit")
    p.add_argument("--seed", type=int, default=0)
    for flag in ("layers", "channels", "heads", "kv-heads", "hidden", "vocab"):
        p.add_argument(f"--{flag}", type=int, help=f"override the arch's {flag}")
    args = p.parse_args(argv)
    for flag in ("prompt", "repeats", "layers", "channels", "heads", "kv_heads", "hidden", "vocab"):
        v = getattr(args, flag)
        if v is not None and v <= 0:
            p.error(f"--{flag.replace('_', '-')} must be positive, got {v}")
    if min(args.batch) <= 0:
        p.error(f"--batch {min(args.batch)}: batch sizes must be positive")
    if args.new < 2:
        p.error(f"--new {args.new}: must be at least 2 (decode time is the 1- and N-token runs' difference)")
    return args


def config_of(args):
    """Our config dict (llmc_formats keys) of --arch and the shape flags."""
    L, C, NH, NKV, H, V = (getattr(args, k) or d for k, d in
                           zip(("layers", "channels", "heads", "kv_heads", "hidden", "vocab"), ARCH_SHAPES[args.arch]))
    if args.arch == "gpt2":
        NKV = args.kv_heads or NH  # GPT-2: one key/value head per query head
    if C % NH or NH % NKV or (args.arch == "llama" and (C // NH) % 2):
        die(f"--channels {C}, --heads {NH}, --kv-heads {NKV}: heads must divide channels, kv heads must divide "
            "heads (and RoPE needs an even head dim)")
    cfg = dict(max_seq_len=1024, vocab_size=V, padded_vocab_size=fmt.pad_vocab(V), num_layers=L, num_heads=NH,
               num_kv_heads=NKV, channels=C, window=0)
    if args.arch == "gpt2":
        return fmt.full_config(dict(cfg, mlp_hidden=H))
    return fmt.full_config(dict(cfg, architecture=fmt.ARCH_LLAMA, norm=fmt.NORM_RMSNORM, norm_eps=1e-5,
                                position=fmt.POS_ROPE, rope_theta=10000.0, mlp=fmt.MLP_SWIGLU, mlp_hidden=H,
                                qkv_bias=0, biases=0))


def random_params(cfg, seed, draw_all):
    """Our 17 tensors (name -> fp32 array): matrices and embeddings N(0, 0.02), padded vocab rows 0;
    norm weights 1 and biases 0, or with draw_all (--check, so a forgotten bias or norm weight shows)
    1 + N(0, 0.1) and N(0, 0.02)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in zip(fmt.PARAM_NAMES, fmt.param_shapes(cfg)):
        is_norm = name.startswith("ln") and name.endswith("w")
        if is_norm:
            x = 1 + 0.1 * rng.standard_normal(shape) if draw_all else np.ones(shape)
        elif name.endswith("b") and not draw_all:
            x = np.zeros(shape)
        else:
            x = 0.02 * rng.standard_normal(shape)
        if name in ("wte", "lm_head"):
            x[cfg["vocab_size"]:] = 0
        params[name] = x.astype(np.float32)
    return params


# ---------------------------------------------------------------- the model
Module = nn.Module if torch is not None else object  # (object without torch: the file still loads)


class KVCache(Module):
    """(B, kv heads, cache length, head dim) keys and values, written in place at the step's positions."""

    def __init__(self, B, NKV, T, HD, dtype):
        super().__init__()
        self.register_buffer("k", torch.zeros(B, NKV, T, HD, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(B, NKV, T, HD, dtype=dtype), persistent=False)

    def update(self, pos, k, v):  # pos (T,), k and v (B, NKV, T, HD)
        self.k.index_copy_(2, pos, k)
        self.v.index_copy_(2, pos, v)
        return self.k, self.v


class RMSNorm(Module):
    """transformers' LlamaRMSNorm: normalized in fp32, back to the input's dtype, times the weight."""

    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def make_norm(cfg):
    if cfg["norm"] == fmt.NORM_RMSNORM:
        return RMSNorm(cfg["channels"], cfg["norm_eps"])
    return nn.LayerNorm(cfg["channels"], eps=1e-5)


def rotate(x, cos, sin):
    """RoPE with rotate_half pairing (dim i with i + HD/2): x (B, T, heads, HD), cos/sin (T, HD), in fp32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x.float() * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class Attention(Module):
    def __init__(self, cfg):
        super().__init__()
        C, self.NH, self.NKV = cfg["channels"], cfg["num_heads"], cfg["num_kv_heads"]
        self.HD = C // self.NH
        self.qkv = nn.Linear(C, (self.NH + 2 * self.NKV) * self.HD, bias=bool(cfg["qkv_bias"]))
        self.proj = nn.Linear(C, C, bias=bool(cfg["biases"]))
        self.cache = None

    def forward(self, x, pos, mask, rope):
        B, T, C = x.shape
        kv = self.NKV * self.HD
        q, k, v = self.qkv(x).split([C, kv, kv], dim=-1)
        q, k, v = q.view(B, T, self.NH, self.HD), k.view(B, T, self.NKV, self.HD), v.view(B, T, self.NKV, self.HD)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        k, v = self.cache.update(pos, k.transpose(1, 2), v.transpose(1, 2))  # (B, NKV, cache length, HD)
        if self.NKV != self.NH:  # query head h reads kv head h // (NH / NKV)
            k, v = k.repeat_interleave(self.NH // self.NKV, 1), v.repeat_interleave(self.NH // self.NKV, 1)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask)  # (B, NH, T, HD)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(Module):
    def __init__(self, cfg):
        super().__init__()
        C, H = cfg["channels"], cfg["mlp_hidden"]
        self.swiglu = cfg["mlp"] == fmt.MLP_SWIGLU
        self.fc = nn.Linear(C, 2 * H if self.swiglu else H, bias=bool(cfg["biases"]))  # SwiGLU rows [gate | up]
        self.proj = nn.Linear(H, C, bias=bool(cfg["biases"]))

    def forward(self, x):
        if self.swiglu:
            gate, up = self.fc(x).chunk(2, dim=-1)
            return self.proj(F.silu(gate) * up)
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = make_norm(cfg), Attention(cfg), make_norm(cfg), MLP(cfg)

    def forward(self, x, pos, mask, rope):
        x = x + self.attn(self.norm1(x), pos, mask, rope)
        return x + self.mlp(self.norm2(x))


class Decoder(Module):
    """forward(idx (B, T), pos (T,)) -> logits (B, Vp) of the last position; setup_cache first."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        C, Vp = cfg["channels"], cfg["padded_vocab_size"]
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(cfg["max_seq_len"], C) if cfg["position"] == fmt.POS_LEARNED else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg["num_layers"]))
        self.norm_f = make_norm(cfg)
        self.head = nn.Linear(C, Vp, bias=False)
        if cfg["tied_head"]:
            self.head.weight = self.wte.weight

    def setup_cache(self, B, T):
        """Caches of T positions for B rows, the (T, T) causal mask and RoPE's (T, HD) cos/sin tables."""
        cfg, p = self.cfg, self.wte.weight
        HD = cfg["channels"] // cfg["num_heads"]
        for blk in self.blocks:
            blk.attn.cache = KVCache(B, cfg["num_kv_heads"], T, HD, p.dtype).to(p.device)
        self.register_buffer("causal", torch.ones(T, T, dtype=torch.bool, device=p.device).tril(), persistent=False)
        if cfg["position"] == fmt.POS_ROPE:
            inv = cfg["rope_theta"] ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
            ang = torch.outer(torch.arange(T, dtype=torch.float64), inv).float()
            ang = torch.cat((ang, ang), dim=-1).to(p.device)
            self.register_buffer("cos", ang.cos(), persistent=False)
            self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, idx, pos):
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(pos)
        rope = (self.cos[pos], self.sin[pos]) if self.cfg["position"] == fmt.POS_ROPE else None
        mask = self.causal[pos][None, None]  # (1, 1, T, cache length)
        for blk in self.blocks:
            x = blk(x, pos, mask, rope)
        return self.head(self.norm_f(x[:, -1]))

    def load_ours(self, params):
        """Our 17 tensors (name -> array, llmc_formats layout) into the modules."""
        sd = {"wte.weight": params["wte"], "norm_f.weight": params["lnfw"]}
        if self.wpe is not None:
            sd["wpe.weight"] = params["wpe"]
        if params["lnfb"].size:
            sd["norm_f.bias"] = params["lnfb"]
        if not self.cfg["tied_head"]:
            sd["head.weight"] = params["lm_head"]
        per_layer = {"norm1.weight": "ln1w", "norm1.bias": "ln1b", "attn.qkv.weight": "qkvw", "attn.qkv.bias": "qkvb",
                     "attn.proj.weight": "attprojw", "attn.proj.bias": "attprojb", "norm2.weight": "ln2w",
                     "norm2.bias": "ln2b", "mlp.fc.weight": "fcw", "mlp.fc.bias": "fcb", "mlp.proj.weight": "fcprojw",
                     "mlp.proj.bias": "fcprojb"}
        for l in range(self.cfg["num_layers"]):
            sd.update({f"blocks.{l}.{k}": params[v][l] for k, v in per_layer.items() if params[v].size})
        want = self.state_dict()
        with torch.no_grad():
            for k, v in sd.items():
                want[k].copy_(torch.from_numpy(v).reshape(want[k].shape))
        missing = set(want) - set(sd) - ({"head.weight"} if self.cfg["tied_head"] else set())
        assert not missing, missing


# ---------------------------------------------------------------- decoding
class Generator:
    """Greedy decoding with the model's caches: prefill (B, T) -> first token, then one-token steps."""

    def __init__(self, model, compile_):
        self.model, V = model, model.cfg["vocab_size"]

        def prefill(idx, pos):
            return model(idx, pos)[:, :V].argmax(-1, keepdim=True)

        def step(idx, pos):
            return model(idx, pos)[:, :V].argmax(-1, keepdim=True)

        if compile_:
            torch._dynamo.config.cache_size_limit = 64  # one graph per batch size
            torch._inductor.config.coordinate_descent_tuning = True  # as gpt-fast sets it
            prefill = torch.compile(prefill, fullgraph=True, dynamic=False)
            step = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        self.prefill, self.step = prefill, step

    def __call__(self, prompt, new):
        """prompt (B, T) -> (B, new) greedy tokens; the host waits for none of them."""
        T, dev = prompt.shape[1], prompt.device
        tok = self.prefill(prompt, torch.arange(T, device=dev))
        out = [tok]
        pos = torch.tensor([T], device=dev)
        for _ in range(new - 1):
            tok = self.step(tok, pos).clone()  # the CUDA graph's output buffer is reused by the next replay
            pos += 1
            out.append(tok)
        return torch.cat(out, dim=1)


def build(cfg, params, B, T_cache, device, dtype):
    model = Decoder(cfg)
    model.load_ours(params)
    model = model.to(device, dtype).eval()
    model.setup_cache(B, T_cache)
    return model


def cache_len(cfg, prompt, new):
    """Positions the cache holds: prompt + new rounded up to 8 (as gpt-fast), at most the context."""
    return min(cfg["max_seq_len"], (prompt + new + 7) // 8 * 8)


# ---------------------------------------------------------------- --check
def check(cfg, params, args):
    """fp32 on the CPU: tokens equal transformers' generate, logits at every step equal its full forward."""
    try:
        import transformers
    except ImportError as e:
        die(f"--check needs transformers (pip install transformers): {e}")
    import hf_interop

    hc, mt = hf_interop.hf_config_from(cfg, params, "--check")
    config_cls = transformers.GPT2Config if mt == "gpt2" else transformers.LlamaConfig
    model_cls = transformers.GPT2LMHeadModel if mt == "gpt2" else transformers.LlamaForCausalLM
    hf = model_cls(config_cls(**{k: v for k, v in hc.items() if k not in ("architectures", "model_type")}))
    tensors = {k: torch.from_numpy(v) for k, v in hf_interop.hf_tensors_from_params(cfg, params).items()}
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    hf.eval()
    B, T, N, V = 3, args.prompt, args.new, cfg["vocab_size"]
    gen = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(0, V, (B, T), generator=gen)
    model = build(cfg, params, B, cache_len(cfg, T, N), "cpu", torch.float32)
    with torch.no_grad():
        ours = Generator(model, args.compile)(prompt, N)
        theirs = hf.generate(prompt, max_new_tokens=N, min_new_tokens=N, do_sample=False,
                             attention_mask=torch.ones_like(prompt), pad_token_id=0)[:, T:]
        full = hf(torch.cat((prompt, ours), dim=1)).logits[:, T - 1:-1]  # (B, N, V): the logits each token came from
        steps = [model(prompt, torch.arange(T))]  # the eager model through the same cache path
        for i in range(N - 1):
            steps.append(model(ours[:, i:i + 1], torch.tensor([T + i])))
        mine = torch.stack(steps, dim=1)
    diff = (mine[..., :V] - full).abs().max().item()
    pad = mine[..., V:].abs().max().item() if mine.shape[-1] > V else 0.0
    same = torch.equal(ours, theirs)
    ok = same and diff <= CHECK_TOL and pad == 0.0
    print(f"CHECK_FAST arch={'gpt2' if mt == 'gpt2' else 'llama'} B={B} prompt={T} new={N} compile={args.compile} "
          f"tokens_equal={int(same)} max_logit_diff={diff:.3e} tol={CHECK_TOL:g} {'PASS' if ok else 'FAIL'}", flush=True)
    if not ok:
        sys.exit(1)


# ---------------------------------------------------------------- timing
def timed(gen, prompt, new, device):
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = gen(prompt, new)
    if device == "cuda":
        torch.cuda.synchronize()
    assert out.shape == (prompt.shape[0], new), out.shape
    return time.perf_counter() - t0


def main(argv=None):
    args = parse_args(argv)
    if args.model:
        try:
            cfg, flat = fmt.read_model(args.model)
        except (OSError, fmt.FormatError) as e:
            die(f"--model: {e}")  # the message names the file
        cfg, params = fmt.full_config(cfg), fmt.split_params(fmt.full_config(cfg), flat)
        if cfg["window"] or cfg["rope_scaling"] != fmt.ROPE_SCALING_NONE:
            die(f"--model {args.model}: attention windows and RoPE scaling are not in this decoder")
    else:
        cfg = config_of(args)
    if args.prompt + args.new > cfg["max_seq_len"]:
        die(f"--prompt {args.prompt} + --new {args.new} exceed the context of {cfg['max_seq_len']} positions")
    if torch is None:
        die("bench_generate_fast.py needs PyTorch (pip install torch)")
    if not args.model:
        params = random_params(cfg, args.seed, draw_all=args.check)
    torch.manual_seed(args.seed)
    if args.check:
        return check(cfg, params, args)
    if args.device == "cuda" and not torch.cuda.is_available():
        die("--device cuda: no CUDA device (use --device cpu)")
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    arch = "llama" if cfg["mlp"] == fmt.MLP_SWIGLU else "gpt2"
    for B in args.batch:
        model = build(cfg, params, B, cache_len(cfg, args.prompt, args.new), args.device, dtype)
        gen = Generator(model, args.compile)
        prompt = torch.randint(0, cfg["vocab_size"], (B, args.prompt), device=args.device)
        with torch.no_grad():
            for _ in range(2):
                timed(gen, prompt, args.new, args.device)
            one = statistics.median(timed(gen, prompt, 1, args.device) for _ in range(args.repeats))
            full = statistics.median(timed(gen, prompt, args.new, args.device) for _ in range(args.repeats))
        per = (full - one) / (args.new - 1)
        print(f"BENCH_FAST arch={arch} B={B} prompt={args.prompt} new={args.new} prefill_ms={one * 1e3:.3f} "
              f"ms_per_token={per * 1e3:.4f} tok_s={B / per:.0f} compile={args.compile}", flush=True)
        del model, gen


if __name__ == "__main__":
    main()
