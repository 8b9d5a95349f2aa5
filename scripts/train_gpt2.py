#!/usr/bin/env python3
"""The PyTorch reference model of this project, GPT-2 or Llama-style (--arch): the numbers our C++/CUDA
trainers are tested against.

The model holds its parameter tensors exactly in our checkpoint layout (docs/design.md): one
tensor per name, per-layer tensors stacked along a leading L axis, matrices stored (out, in),
wte padded to Vp rows. So writing a checkpoint is a concatenation, and gradients come out in the
layout the C++ tests compare against, with no renaming step that could hide a transposition.

Modes (pick one; the model comes from --model / the shape flags / --load):
  reference state  --write-model PATH [--write-debug PATH --batch B --seq T --steps N]
                   fp64 forward/backward and N AdamW steps on one batch (docs/formats.md, GPTX)
  fixture          --fixture DIR: the tiny committed test fixtures, GPT-2 MHA and GQA+window, Llama MHA tied,
                   GQA untied and GQA+window (make fixture)
  train            --train "shards/*.bin" [--val "..."] --steps N: prints `step n train_loss x ...`;
                   --schedule/--warmup/--shuffle as the C++ trainers, --fp8-emulate RECIPE: the blocks'
                   linear layers in emulated FP8 (tensorwise = the GPU trainer's --fp8 1; dev/bench/fp8_emulate.sh);
                   --optimizer muon: torch.optim.Muon on the blocks' matrices, AdamW on the rest;
                   --doc-mask 1 [--doc-positions restart]: documents packed in a row attend only within
                   themselves (an explicit block-diagonal causal SDPA mask; position ids restart per document)
  bench            --bench --device cuda [--compile]: GPT-2 training throughput of PyTorch,
                   last line `BENCH name=<eager|compile> ms=<median> tok_s=<..> peak_gib=<..>`
  hellaswag        --hellaswag FILE: multiple-choice accuracy (acc_norm, as llmc/hellaswag.h scores
                   it) on an eval file of scripts/data/hellaswag.py, fp64; one line per example

Examples:
  python3 scripts/train_gpt2.py --model d12 --write-model out/d12.bin
  python3 scripts/train_gpt2.py --model gpt2 --write-model out/gpt2_124M.bin      # needs transformers
  python3 scripts/train_gpt2.py --layers 2 --channels 32 --heads 4 --vocab 250 --max-seq 32 \\
      --write-model m.bin --write-debug d.bin --batch 4 --seq 16 --steps 10 --lr 1e-3
  python3 scripts/train_gpt2.py --model d4 --kv-heads 2 --window 256 --write-model out/d4_gqa.bin
  python3 scripts/train_gpt2.py --arch llama --layers 12 --channels 768 --heads 12 --kv-heads 4 --mlp-hidden 2048 \
      --vocab 50257 --max-seq 1024 --write-model out/llama_114M.bin
  python3 scripts/train_gpt2.py --load m.bin --train "data/tinyshakespeare/*_train.bin" --steps 50
  python3 scripts/train_gpt2.py --bench --device cuda --batch 64 --seq 1024 --steps 30 --compile
  python3 scripts/train_gpt2.py --model d12 --train "data/tinyshakespeare/*_train.bin" --device cuda --dtype bf16 \
      --steps 2000 --lr 3e-4 --schedule cosine --warmup 100 --shuffle 1 --fp8-emulate rowwise
"""
import argparse
import contextlib
import glob
import math
import os
import statistics
import sys
import time

import numpy as np

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:  # --help and the flag checks work without PyTorch; main() then says it is needed
    torch = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llmc_formats as fmt  # noqa: E402  (the one Python copy of the file formats)
import hf_interop  # noqa: E402  (the one copy of the transformers <-> ours tensor mapping)
if torch is not None:
    import fp8_emulate  # noqa: E402  (--fp8-emulate: the FP8 linear layers in fake quantization)
FP8_RECIPES = ("none", "tensorwise", "rowwise", "rowwise_gw_bf16", "blockwise")  # none + fp8_emulate.TILES's keys

# Weight decay applies to the embeddings and the weight matrices (gpt2_param_decays in C++).
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw", "lm_head"}
# --optimizer muon: the blocks' hidden matrices that Muon updates, each layer's slice cut into
# muon_row_blocks' matrices (qkvw Q, K, V; SwiGLU's fcw gate, up); AdamW updates the rest (embeddings,
# lm_head, norms, biases).
MUON_MATRICES = ("qkvw", "attprojw", "fcw", "fcprojw")
MUON_ADJUST_LR = ("original", "match_rms_adamw")  # torch.optim.Muon's adjust_lr_fn names
DTYPES = {"fp32": fmt.DTYPE_FP32, "bf16": fmt.DTYPE_BF16}
# Settings of the committed test fixtures (tests/fixture, `make fixture`): multi-head full causal, and
# grouped-query attention (3 query heads per key/value head) with a window shorter than the sequence.
FIXTURE = dict(layers=2, channels=32, heads=4, kv_heads=0, window=0, vocab=250, max_seq=32, seed=1337,
               batch=4, seq=16, steps=10, lr=1e-2, grad_clip=1.0)
FIXTURE_GQA = dict(FIXTURE, channels=36, heads=6, kv_heads=2, window=6)
# Llama-style: multi-head with a tied head; grouped-query with an untied head; grouped-query with a
# window, another theta and eps. MLP widths that are not 4C, so a hard-coded 4C cannot pass.
FIXTURE_LLAMA = dict(FIXTURE, arch="llama", mlp_hidden=48)
FIXTURE_LLAMA_GQA = dict(FIXTURE_LLAMA, channels=36, heads=6, kv_heads=2, mlp_hidden=40, tied=0)
FIXTURE_LLAMA_WINDOW = dict(FIXTURE_LLAMA, channels=36, heads=6, kv_heads=3, window=5, mlp_hidden=40,
                            rope_theta=500000.0, norm_eps=1e-6)
FIXTURES = (("", FIXTURE), ("gqa_", FIXTURE_GQA), ("llama_", FIXTURE_LLAMA), ("llama_gqa_", FIXTURE_LLAMA_GQA),
            ("llama_window_", FIXTURE_LLAMA_WINDOW))
# The knobs of each architecture (llmc/model_config.h); a flag left unset takes its --arch default.
ARCH_DEFAULTS = {
    "gpt2": dict(norm="layernorm", norm_eps=1e-5, position="learned", mlp="gelu", bias=1, tied=1),
    "llama": dict(norm="rmsnorm", norm_eps=1e-5, position="rope", mlp="swiglu", bias=0, tied=1),
}  # with RoPE, theta defaults to 10000
KNOBS = ("norm", "norm_eps", "position", "rope_theta", "mlp", "mlp_hidden", "bias", "qkv_bias", "tied")


def die(msg):
    """Bad input: one line naming the flag or file, then exit 1 (no traceback)."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def make_config(what, L, C, NH, V, maxT, NKV=0, W=0, arch="gpt2", rope_llama3=None, **knobs):
    """NKV = 0: as many key/value heads as query heads; W = 0: full causal attention. arch and the
    knobs (KNOBS; None or absent = the arch's default, qkv_bias's: bias) give the family fields of the config.
    rope_llama3: None, or Llama 3.x's RoPE scaling as config.json's rope_scaling holds it (factor,
    low_freq_factor, high_freq_factor, original_max_position_embeddings)."""
    for name, v in (("--layers", L), ("--channels", C), ("--heads", NH), ("--vocab", V), ("--max-seq", maxT)):
        if v <= 0:
            die(f"{what}: {name} must be positive, got {v}")
    if C % NH != 0:
        die(f"{what}: --channels {C} is not a multiple of --heads {NH}")
    if NKV < 0 or (NKV > 0 and NH % NKV != 0):
        die(f"{what}: --kv-heads {NKV} must divide --heads {NH}")
    if W < 0:
        die(f"{what}: --window {W} must be >= 0 (0 = full causal)")
    if V > 1 << 20:
        die(f"{what}: --vocab {V} too large (at most 2^20 = 1048576, as llmc/model_config.h)")
    k = dict(ARCH_DEFAULTS[arch], rope_theta=10000.0)
    k.update({name: v for name, v in knobs.items() if v is not None})
    H = k.get("mlp_hidden") or (4 * C if k["mlp"] == "gelu" else (8 * C // 3 + 63) // 64 * 64)
    if H <= 0:
        die(f"{what}: --mlp-hidden {H} must be positive")
    if k["norm"] == "layernorm" and k["norm_eps"] != 1e-5:
        die(f"{what}: --norm-eps {k['norm_eps']}: LayerNorm supports only 1e-5")
    if k["norm"] == "rmsnorm" and not 0 < k["norm_eps"] < 1:
        die(f"{what}: --norm-eps {k['norm_eps']} must be in (0, 1)")
    if k["position"] == "rope" and (not k["rope_theta"] > 1 or (C // NH) % 2):
        die(f"{what}: RoPE needs --rope-theta > 1 (got {k['rope_theta']}) and an even head dim (got {C // NH})")
    scaling = fmt.no_rope_scaling()
    if rope_llama3 is not None:
        if k["position"] != "rope":
            die(f"{what}: llama3 RoPE scaling needs RoPE positions")
        try:
            _, scaling = hf_interop.rope_from_hf({"rope_scaling": dict(rope_llama3, rope_type="llama3")}, what)
        except hf_interop.HFError as e:
            die(str(e))
    return dict(max_seq_len=maxT, vocab_size=V, padded_vocab_size=fmt.pad_vocab(V), num_layers=L,
                num_heads=NH, num_kv_heads=NKV or NH, channels=C, window=W,
                architecture=fmt.ARCH_LLAMA if arch == "llama" else fmt.ARCH_GPT2,
                norm=fmt.NORM_RMSNORM if k["norm"] == "rmsnorm" else fmt.NORM_LAYERNORM,
                norm_eps=float(k["norm_eps"]),
                position=fmt.POS_ROPE if k["position"] == "rope" else fmt.POS_LEARNED,
                rope_theta=float(k["rope_theta"]) if k["position"] == "rope" else 0.0,
                mlp=fmt.MLP_SWIGLU if k["mlp"] == "swiglu" else fmt.MLP_GELU, mlp_hidden=H,
                qkv_bias=int(k.get("qkv_bias", k["bias"])), biases=int(k["bias"]), tied_head=int(k["tied"]),
                **scaling)


def config_from_descriptor(desc, NKV=0, W=0, arch="gpt2", **knobs):
    """dN: N layers, 64N channels, N heads (d12 = GPT-2 124M), as in model_config.h; arch and knobs as
    in make_config."""
    if len(desc) < 2 or desc[0] != "d" or not desc[1:].isdigit() or not 0 < int(desc[1:]) <= 96:
        die(f"--model {desc}: not a model descriptor (expected dN such as d12, gpt2*, or hf-random)")
    n = int(desc[1:])
    return make_config(f"--model {desc}", n, 64 * n, n, 50257, 1024, NKV, W, arch, **knobs)


# (object only without torch: the file still loads, so --help works)
class GPT2(nn.Module if torch is not None else object):
    """GPT-2 or a Llama-style model (the config's knobs) with parameters in our checkpoint layout;
    forward returns (logits (B,T,Vp), loss). A tensor the config lacks (count 0) is not registered,
    so parameters() runs in checkpoint order over the ones present."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = fmt.full_config(cfg)
        self.fp8 = None  # an fp8_emulate.Fp8Emulation: the blocks' linear layers in emulated FP8 (--fp8-emulate)
        self.docs = None  # (document token, restart positions): packed documents (--doc-mask), or one sequence a row
        for name, shape in zip(fmt.PARAM_NAMES, fmt.param_shapes(self.cfg)):
            if math.prod(shape):
                self.register_parameter(name, nn.Parameter(torch.zeros(shape)))

    def param(self, name):
        """The tensor, or None where the config lacks it (a bias of a bias-free model)."""
        return self._parameters.get(name)

    def init_weights(self, seed):
        """docs/design.md: matrices and embeddings N(0, 0.02); the two residual projections
        N(0, 0.02/sqrt(2L)) so the residual stream's variance does not grow with depth;
        biases 0, LayerNorm weights 1; padded wte rows 0 (they never see a gradient)."""
        g = torch.Generator().manual_seed(seed)
        proj_std = 0.02 / math.sqrt(2 * self.cfg["num_layers"])
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name in ("attprojw", "fcprojw"):
                    p.normal_(0.0, proj_std, generator=g)
                elif name in DECAYED:
                    p.normal_(0.0, 0.02, generator=g)
                elif name.endswith("w"):  # LayerNorm weights
                    p.fill_(1.0)
                else:
                    p.zero_()
            self.wte[self.cfg["vocab_size"]:].zero_()
            if self.param("lm_head") is not None:
                self.lm_head[self.cfg["vocab_size"]:].zero_()

    def randomize_biases_and_norms(self, seed):
        """Fixture only: the design's init leaves biases 0 and LayerNorm at (1, 0), which would let a
        trainer that forgets a bias or a norm's weight pass the forward check. Draw them instead."""
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name in DECAYED:
                    continue
                if name.startswith("ln") and name.endswith("w"):
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.02 * torch.randn(p.shape, generator=g))

    def norm(self, x, w, b):
        """LayerNorm (weight, bias) or RMSNorm (weight; transformers' LlamaRMSNorm) over the channels."""
        if self.cfg["norm"] == fmt.NORM_RMSNORM:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["norm_eps"]) * w
        return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)

    def rope_inv_freq(self, HD):
        """The (HD/2,) inverse frequencies theta^(-2i/HD) in float64, with the config's RoPE scaling:
        llama3 (transformers' rope_type "llama3", Llama 3.1 / 3.2) divides the frequencies of wavelengths
        over original / low_freq_factor by factor, keeps those under original / high_freq_factor, and
        blends between: s = (original / wavelength - low) / (high - low) clamped to [0, 1],
        f' = (1 - s) f / factor + s f."""
        cfg = self.cfg
        inv_freq = cfg["rope_theta"] ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
        if cfg["rope_scaling"] == fmt.ROPE_SCALING_LLAMA3:
            low, high, factor = cfg["rope_low_freq_factor"], cfg["rope_high_freq_factor"], cfg["rope_factor"]
            wavelength = 2 * math.pi / inv_freq
            s = ((cfg["rope_original_max_pos"] / wavelength - low) / (high - low)).clamp(0.0, 1.0)
            inv_freq = (1 - s) * inv_freq / factor + s * inv_freq
        elif cfg["rope_scaling"] != fmt.ROPE_SCALING_NONE:
            die(f"rope_scaling {cfg['rope_scaling']}: not 0 (none) or 1 (llama3)")
        return inv_freq

    def rope_tables(self, T, HD, dtype, device):
        """cos, sin (T, HD) in transformers' rotate_half layout (each half repeats the HD/2 angles);
        the angles in float64 (llmc/cpu/rope.h)."""
        inv_freq = self.rope_inv_freq(HD)
        angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, HD/2)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(dtype=dtype, device=device), angles.sin().to(dtype=dtype, device=device)

    def forward(self, idx, targets=None):
        cfg, P = self.cfg, self.param
        B, T = idx.shape
        C, NH, NKV, W = cfg["channels"], cfg["num_heads"], cfg["num_kv_heads"], cfg["window"]
        HD = C // NH
        layer = lambda name, l: None if P(name) is None else P(name)[l]  # noqa: E731  (a bias, or None)
        # query t sees keys max(0, t-W+1)..t; W = 0 (or W >= T) is plain causal, SDPA's fast path. With
        # self.docs, only keys of its own document too (llmc/cpu/attention.h): doc_start[b, t] = the last
        # position <= t holding the document token (0 if none), and positions restart there if asked
        mask, pos = None, None
        t = torch.arange(T, device=idx.device)
        if self.docs is not None:
            token, restart = self.docs
            doc_start = torch.where(idx == token, t, 0).cummax(dim=1).values       # (B, T)
            mask = (t[None, None, :] <= t[None, :, None]) & (t[None, None, :] >= doc_start[:, :, None])
            if W > 0:
                mask &= t[None, None, :] > t[None, :, None] - W
            mask = mask[:, None]                                                   # (B, 1, T, T), True = attend
            pos = t - doc_start if restart else None                               # (B, T) position ids
        elif 0 < W < T:
            mask = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - W)  # (T, T), True = attend
        rope = cfg["position"] == fmt.POS_ROPE
        if rope:
            cos, sin = self.rope_tables(T, HD, self.wte.dtype, idx.device)
            if pos is not None:
                cos, sin = cos[pos][:, None], sin[pos][:, None]                    # (B, 1, T, HD)

        def rotate(x):  # (B, heads, T, HD): x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]
            x1, x2 = x.chunk(2, dim=-1)
            return x * cos + torch.cat([-x2, x1], dim=-1) * sin

        x = self.wte[idx]                                       # (B, T, C)
        if not rope:
            x = x + (self.wpe[:T] if pos is None else self.wpe[pos])
        for l in range(cfg["num_layers"]):
            # the block's four linear layers: plain, or through the FP8 emulation
            linear = self.fp8.linear if self.fp8 and self.fp8.covers(l, cfg["num_layers"]) else F.linear
            h = self.norm(x, self.ln1w[l], layer("ln1b", l))
            qkv = linear(h, self.qkvw[l], layer("qkvb", l))   # (B, T, (NH+2NKV)*HD): all Q heads, all K, all V
            q, k, v = (t.view(B, T, -1, HD).transpose(1, 2) for t in qkv.split([C, NKV * HD, NKV * HD], dim=2))
            if rope:
                q, k = rotate(q), rotate(k)
            # grouped-query: query head h uses key/value head h // (NH/NKV)
            k, v = (t.repeat_interleave(NH // NKV, dim=1) for t in (k, v))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)  # (B, NH, T, HD)
            a = a.transpose(1, 2).reshape(B, T, C)
            x = x + linear(a, self.attprojw[l], layer("attprojb", l))
            h = self.norm(x, self.ln2w[l], layer("ln2b", l))
            h = linear(h, self.fcw[l], layer("fcb", l))      # (B, T, H) or SwiGLU's (B, T, 2H) = [gate | up]
            if cfg["mlp"] == fmt.MLP_SWIGLU:
                gate, up = h.chunk(2, dim=-1)
                h = F.silu(gate) * up
            else:
                h = F.gelu(h, approximate="tanh")
            x = x + linear(h, self.fcprojw[l], layer("fcprojb", l))
        x = self.norm(x, self.lnfw, P("lnfb"))
        logits = F.linear(x, self.wte if cfg["tied_head"] else self.lm_head)  # (B, T, Vp)
        loss = None
        if targets is not None:  # the padded columns are not part of the softmax (autocast runs it in fp32)
            # mean over the targets that are not -100 (masked), as cross_entropy's ignore_index=-100; with
            # none left, 0 and a zero gradient (where the mean would be 0/0)
            V = cfg["vocab_size"]
            targets = targets.reshape(-1)
            loss = F.cross_entropy(logits[..., :V].reshape(-1, V), targets, ignore_index=-100, reduction="sum")
            loss = loss / (targets != -100).sum().clamp(min=1)
        return logits, loss

    def flat(self, grads=False):
        """All parameters (or their gradients) as one vector in checkpoint order."""
        ts = [p.grad if grads else p for p in self.parameters()]
        return torch.cat([t.detach().reshape(-1) for t in ts])

    def load_flat(self, vec):
        off = 0
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(vec[off:off + p.numel()].view_as(p))
                off += p.numel()

    def optimizer(self, lr, weight_decay, betas=(0.9, 0.95), eps=1e-8, fused=False, muon=None):
        """AdamW over every parameter, weight decay on DECAYED only. With muon (LayerMuon's keyword
        arguments): LayerMuon over MUON_MATRICES and this AdamW over the rest, stepped together."""
        adamw = [(n, p) for n, p in self.named_parameters() if muon is None or n not in MUON_MATRICES]
        decay = [p for n, p in adamw if n in DECAYED]
        no_decay = [p for n, p in adamw if n not in DECAYED]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)
        return opt if muon is None else Optimizers(LayerMuon(self, **muon), opt)


# ---------------------------------------------------------------- Muon (--optimizer muon)
def newton_schulz(grad, ns_coefficients, ns_steps, eps):
    """torch.optim.Muon's _zeropower_via_newtonschulz operation by operation, but in grad's dtype where
    torch's casts grad to bf16 first (tests/python/test_muon.py: on a bf16 grad the two are bitwise
    equal). X = grad, or grad^T when rows > cols (the Gram matrix is the small one); X /= max(||X||_F, eps);
    ns_steps times A = X X^T, B = b A + c A A, X = a X + B X; transposed back. llmc/cpu/muon.h in fp32."""
    a, b, c = ns_coefficients
    x = grad.clone()
    if grad.size(0) > grad.size(1):
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram = x @ x.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, update, x, beta=a)
    if grad.size(0) > grad.size(1):
        x = x.T
    return x


@contextlib.contextmanager
def newton_schulz_in_param_dtype():
    """Within: torch.optim.Muon's step calls newton_schulz in place of its bf16 iteration (the one
    function torch's _single_tensor_muon looks up in its module at each call)."""
    module = torch.optim._muon
    saved = module._zeropower_via_newtonschulz
    module._zeropower_via_newtonschulz = newton_schulz
    try:
        yield
    finally:
        module._zeropower_via_newtonschulz = saved


def muon_row_blocks(cfg, name):
    """The rows of each of Muon's matrices in one layer's (out, in) slice of MUON_MATRICES tensor name, top
    to bottom (llmc/cpu/muon.h's muon_row_blocks): qkvw Q (NH HD = C), K (NKV HD), V (NKV HD), as nanochat's
    separate c_q, c_k, c_v; SwiGLU's fcw gate (H), up (H), as Hugging Face Llama's gate_proj, up_proj; GELU's
    fcw, attprojw and fcprojw one matrix each."""
    cfg = fmt.full_config(cfg)
    C, H = cfg["channels"], cfg["mlp_hidden"]
    KV = cfg["num_kv_heads"] * (C // cfg["num_heads"])
    if name == "qkvw":
        return [C, KV, KV]
    if name == "fcw":
        return [H, H] if cfg["mlp"] == fmt.MLP_SWIGLU else [H]
    return [C]


class LayerMuon(torch.optim.Muon if torch is not None else object):
    """torch.optim.Muon (Nesterov) on each layer's MUON_MATRICES, each cut into muon_row_blocks' matrices.
    Our parameters stack the layers (L, out, in) and torch applies Muon to each 2-D parameter on its own, so
    each block of each layer goes to it as a leaf view sharing the stacked tensor's storage (a row block of a
    contiguous (out, in) matrix is contiguous): step() points each view's .grad at the same rows of the
    stacked gradient, and torch's in-place update of the view updates the parameter. torch keeps each
    view's momentum buffer in its own state. ns_in_param_dtype: the Newton-Schulz in the parameters' dtype
    (newton_schulz), else torch's own in bf16. The group's base_lr is lr, for the schedule (lr_at_step)."""

    def __init__(self, model, lr, momentum, weight_decay, ns_steps, adjust_lr_fn, ns_in_param_dtype):
        self.stacked = [model.param(name) for name in MUON_MATRICES]
        self.blocks = []  # (stacked tensor, layer, first row, rows, the view)
        for name, p in zip(MUON_MATRICES, self.stacked):
            rows = muon_row_blocks(model.cfg, name)
            assert sum(rows) == p.shape[1], (name, rows, p.shape)
            for l in range(p.shape[0]):
                r0 = 0
                for r in rows:
                    self.blocks.append((p, l, r0, r, p.detach()[l, r0:r0 + r]))
                    r0 += r
        super().__init__([view for *_, view in self.blocks], lr=lr, momentum=momentum, weight_decay=weight_decay,
                         nesterov=True, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
        self.param_groups[0]["base_lr"] = lr
        self.ns_in_param_dtype = ns_in_param_dtype

    def step(self, closure=None):
        for p, l, r0, r, view in self.blocks:
            view.grad = None if p.grad is None else p.grad[l, r0:r0 + r]
        with newton_schulz_in_param_dtype() if self.ns_in_param_dtype else contextlib.nullcontext():
            return super().step(closure)

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none=set_to_none)  # the views'
        for p in self.stacked:
            if p.grad is not None:
                p.grad = None if set_to_none else p.grad.zero_()


class Optimizers:
    """Optimizers over disjoint parameters, stepped together; param_groups lists all their groups."""

    def __init__(self, *opts):
        self.opts = opts

    @property
    def param_groups(self):
        return [g for opt in self.opts for g in opt.param_groups]

    def step(self):
        for opt in self.opts:
            opt.step()

    def zero_grad(self, set_to_none=True):
        for opt in self.opts:
            opt.zero_grad(set_to_none=set_to_none)


# ---------------------------------------------------------------- transformers import
def from_hf(hf_model, what="transformers model"):
    """Our model from a transformers model object (GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM,
    Qwen2ForCausalLM) through scripts/hf_interop.py, the one copy of the name and layout mapping that
    scripts/import_hf.py uses on a local folder without torch (GPT-2's Conv1D weights transposed;
    Llama's qkvw = [q_proj; k_proj; v_proj] and fcw = [gate_proj; up_proj], q/k rows already in the
    rotate_half order our RoPE uses). A config our model cannot compute exactly is one error line."""
    sd = {k: v.detach().float().cpu().numpy() for k, v in hf_model.state_dict().items()}
    try:
        cfg = hf_interop.config_from_hf(hf_model.config.to_dict(), what)
        flat = hf_interop.params_from_hf_tensors(cfg, sd, what)
    except hf_interop.HFError as e:
        die(str(e))
    model = GPT2(cfg)
    model.load_flat(torch.from_numpy(flat))
    return model


def hf_random_model(cfg, seed):
    """A transformers GPT2LMHeadModel with transformers' own random init (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    hc = GPT2Config(vocab_size=cfg["vocab_size"], n_positions=cfg["max_seq_len"], n_embd=cfg["channels"],
                    n_layer=cfg["num_layers"], n_head=cfg["num_heads"], resid_pdrop=0.0, embd_pdrop=0.0,
                    attn_pdrop=0.0)
    return GPT2LMHeadModel(hc).eval()


def build_model(args):
    """The model named by --load / --model / the shape flags, fp32 on the CPU."""
    if args.load:
        cfg, params = fmt.read_model(args.load)
        if args.kv_heads not in (0, cfg["num_kv_heads"]) or args.window not in (0, cfg["window"]):
            die(f"--load {args.load}: the file has num_kv_heads {cfg['num_kv_heads']} and window {cfg['window']}; "
                "--kv-heads and --window shape only a new model")
        given = [k for k in ("arch",) + KNOBS if getattr(args, k) is not None]
        if given:
            die(f"--load {args.load}: --{given[0].replace('_', '-')} shapes only a new model (the file has its own)")
        model = GPT2(cfg)
        model.load_flat(torch.from_numpy(np.array(params, dtype=np.float32)))
        return model
    if args.model in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "hf-random"):
        if args.kv_heads != 0 or args.window != 0 or any(getattr(args, k) is not None for k in ("arch",) + KNOBS):
            die(f"--model {args.model}: transformers' GPT-2 is multi-head with full causal attention "
                "(no --kv-heads, no --window, no --arch or its knobs)")
        try:
            import transformers  # noqa: F401
        except ImportError:
            die(f"--model {args.model} needs the transformers package (pip install transformers)")
        if args.model == "hf-random":
            hf = hf_random_model(shape_config(args), args.seed)
        else:
            from transformers import GPT2LMHeadModel
            try:
                hf = GPT2LMHeadModel.from_pretrained(args.model)
            except (OSError, ValueError) as e:
                die(f"--model {args.model}: cannot load the pretrained weights ({str(e).splitlines()[0]})")
        return from_hf(hf, f"--model {args.model}")
    cfg = (config_from_descriptor(args.model, args.kv_heads, args.window, args.arch or "gpt2", **knob_args(args))
           if args.model else shape_config(args))
    model = GPT2(cfg)
    model.init_weights(args.seed)
    return model


def knob_args(args):
    return {k: getattr(args, k) for k in KNOBS}


def shape_config(args):
    return make_config("model shape", args.layers, args.channels, args.heads, args.vocab, args.max_seq,
                       args.kv_heads, args.window, args.arch or "gpt2", **knob_args(args))


# ---------------------------------------------------------------- reference state (GPTX)
def reference_batch(args, V):
    """(inputs, targets) int64 (B, T): random ids from --seed, or the first B*T+1 tokens of --data."""
    B, T = args.batch, args.seq
    if args.data:
        tokens = read_tokens(args.data, V, "--data")
        if len(tokens) < B * T + 1:
            die(f"--data {args.data}: {len(tokens)} tokens, a {B}x{T} batch needs {B * T + 1}")
        buf = torch.from_numpy(tokens[:B * T + 1].astype(np.int64))
        return buf[:-1].view(B, T), buf[1:].view(B, T)
    g = torch.Generator().manual_seed(args.seed)
    buf = torch.randint(0, V, (B, T + 1), generator=g)
    return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()


def read_tokens(path, V, flag, with_mask=False):
    """The shard's ids (checked < V); with with_mask, (ids, its loss mask or None)."""
    tokens, _, mask = fmt.read_shard(path, with_mask=True)
    if len(tokens) and int(tokens.max()) >= V:
        die(f"{flag} {path}: token id {int(tokens.max())} >= the model's vocab_size {V}")
    return (tokens, mask) if with_mask else tokens


def reference_state(model, args):
    """Logits, loss and grads of one batch, then args.steps AdamW steps on that batch, in float64 (on
    --device: the CPU, or a GPU, the same float64 math summed in another order), so the expected
    numbers carry no error of their own at fp32 test tolerances."""
    cfg = model.cfg
    inputs, targets = (t.to(args.device) for t in reference_batch(args, cfg["vocab_size"]))
    m = GPT2(cfg).double().to(args.device)
    m.load_flat(model.flat().double().to(args.device))  # exactly the fp32 values the checkpoint holds
    opt = m.optimizer(args.lr, args.weight_decay, betas=(args.beta1, args.beta2), eps=args.eps)
    losses, first = [], None
    for step in range(args.steps + 1):
        opt.zero_grad(set_to_none=True)
        logits, loss = m(inputs, targets)
        loss.backward()
        if first is None:
            first = (logits[..., :cfg["vocab_size"]].detach().float().cpu(), loss.item(), m.flat(grads=True).float().cpu())
        if step == args.steps:
            break
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), args.grad_clip if args.grad_clip > 0 else math.inf)
        losses.append(loss.item())
        print(f"step {step} loss {loss.item():.6f} grad_norm {norm.item():.6f}")
        opt.step()
    logits, loss0, grads = first
    hyper = dict(lr=args.lr, beta1=args.beta1, beta2=args.beta2, eps=args.eps, weight_decay=args.weight_decay,
                 grad_clip=args.grad_clip)
    return dict(inputs=inputs.cpu(), targets=targets.cpu(), logits=logits, loss=loss0, grads=grads,
                losses=losses, hyper=hyper)


def write_outputs(model, args):
    if args.write_debug and args.dtype != "fp32":
        die("--write-debug: the debug state belongs beside an fp32 checkpoint; use --dtype fp32")
    if args.write_debug and args.seq > model.cfg["max_seq_len"]:
        die(f"--seq {args.seq} exceeds the model's max_seq_len {model.cfg['max_seq_len']}")
    if args.write_model:
        fmt.write_model(args.write_model, model.cfg, model.flat().numpy(), dtype=DTYPES[args.dtype])
        print(f"wrote {args.write_model} ({args.dtype}, {model.flat().numel()} parameters)")
    if args.write_debug:
        st = reference_state(model, args)
        fmt.write_debug_state(args.write_debug, model.cfg, st["inputs"].numpy(), st["targets"].numpy(),
                              st["logits"].numpy(), st["loss"], st["grads"].numpy(), st["losses"], st["hyper"])
        print(f"wrote {args.write_debug} (B={args.batch} T={args.seq}, loss {st['loss']:.6f}, {args.steps} steps)")


def fixture(args):
    """tests/fixture: the tiny models + their reference states that `make test` checks the trainers
    against: DIR/<prefix>model.bin + <prefix>debug.bin for each of FIXTURES."""
    args.model, args.load, args.data, args.dtype = None, None, None, "fp32"
    os.makedirs(args.fixture, exist_ok=True)
    for prefix, settings in FIXTURES:
        for k in ("arch",) + KNOBS:  # what a fixture does not set is its --arch default
            setattr(args, k, None)
        for k, v in settings.items():
            setattr(args, k, v)
        args.write_model = os.path.join(args.fixture, prefix + "model.bin")
        args.write_debug = os.path.join(args.fixture, prefix + "debug.bin")
        model = build_model(args)
        model.randomize_biases_and_norms(args.seed)
        write_outputs(model, args)


# ---------------------------------------------------------------- train and bench
def shard_windows(pattern, B, T, V, flag, shuffle_seed=None):
    """Endless (inputs, targets) batches: B*T+1 token windows overlapping by one token (llmc/dataloader.h's),
    shard after shard in file order; with shuffle_seed, each epoch visits the shards and each shard's windows
    in a random order drawn from (shuffle_seed, epoch) (the C++ loader's statistics, not its exact order).
    A target whose loss mask value is 0 (version-3 shards) is -100, Hugging Face's ignored label."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        die(f"{flag} '{pattern}': no token shards match")
    shards, masks = zip(*(read_tokens(path, V, flag, with_mask=True) for path in paths))
    if len({m is None for m in masks}) > 1:
        die(f"{flag} '{pattern}': some shards have a loss mask and some do not")
    if all(len(t) <= B * T for t in shards):
        die(f"{flag} '{pattern}': no shard holds the {B * T + 1} tokens of one {B}x{T} batch")
    epoch = 0
    while True:
        rng = None if shuffle_seed is None else np.random.default_rng([shuffle_seed, epoch])
        for s in (range(len(shards)) if rng is None else rng.permutation(len(shards))):
            starts = np.arange(0, len(shards[s]) - B * T, B * T)
            for start in (starts if rng is None else rng.permutation(starts)):
                buf = torch.from_numpy(shards[s][start:start + B * T + 1].astype(np.int64))
                y = buf[1:].clone()
                if masks[s] is not None:
                    y[torch.from_numpy(masks[s][start + 1:start + B * T + 1] == 0)] = -100
                yield buf[:-1].view(B, T), y.view(B, T)
        epoch += 1


def lr_at_step(args, step, lr=None):
    """llmc/schedule.h's learning rate at 0-based step: linear warmup to lr (default --lr) over --warmup
    steps, then --schedule down to lr * --final-lr-frac at the last step (constant: lr throughout)."""
    lr, warmup = args.lr if lr is None else lr, args.warmup
    if step < warmup:
        return lr * (step + 1) / warmup
    if args.schedule == "constant":
        return lr
    lr_min = lr * args.final_lr_frac
    decay = args.steps - warmup
    progress = min(1.0, (step - warmup) / decay) if decay > 0 else 1.0
    if args.schedule == "linear":
        return lr - (lr - lr_min) * progress
    return lr_min + (lr - lr_min) * 0.5 * (1.0 + math.cos(math.pi * progress))


def autocast(device, dtype):
    return torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=(dtype == "bf16"))


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def make_optimizer(model, args):
    muon = None
    if args.optimizer == "muon":  # the Newton-Schulz in bf16 where the run computes in bf16, as torch's does
        muon = dict(lr=args.muon_lr, momentum=args.muon_momentum, weight_decay=args.muon_wd,
                    ns_steps=args.muon_ns_steps, adjust_lr_fn=args.muon_adjust_lr,
                    ns_in_param_dtype=args.dtype != "bf16")
    return model.optimizer(args.lr, args.weight_decay, betas=(args.beta1, args.beta2), eps=args.eps,
                           fused=(args.device == "cuda"), muon=muon)


def train_step(model, step_model, opt, x, y, args):
    """One optimizer step; step_model is model or its torch.compile wrapper."""
    with autocast(args.device, args.dtype):
        loss = step_model(x, y)[1]  # drop the (B, T, Vp) logits now, not after backward
    loss.backward()
    if args.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip, foreach=True)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def doc_masking(cfg, args):
    """--doc-mask's (document token, restart positions), or None: the token is --doc-token, else GPT-2's
    <|endoftext|> 50256 for a GPT-2 model that holds it (the C++ trainer also reads its --tokenizer's)."""
    if not args.doc_mask:
        return None
    V, token = cfg["vocab_size"], args.doc_token
    if token is None and cfg["architecture"] == fmt.ARCH_GPT2 and V > 50256:
        token = 50256
    if token is None:
        die("--doc-mask 1: no document token: give --doc-token ID")
    if not 0 <= token < V:
        die(f"--doc-token {token}: out of range for the model's vocabulary of {V}")
    return token, args.doc_positions == "restart"


def train(model, args):
    """Trains on token shards; every printed line is `step <n> <key> <value> ...` (n = optimizer
    steps done), the format scripts/plot_log.py reads."""
    dev, B, T, V = args.device, args.batch, args.seq, model.cfg["vocab_size"]
    if T > model.cfg["max_seq_len"]:
        die(f"--seq {T} exceeds the model's max_seq_len {model.cfg['max_seq_len']}")
    model = model.to(dev)
    if args.fp8_emulate != "none":
        model.fp8 = fp8_emulate.Fp8Emulation(args.fp8_emulate, args.fp8_emulate_grad, args.fp8_emulate_bf16_layers,
                                             torch.bfloat16 if args.dtype == "bf16" else torch.float32)
        if dev == "cuda" and args.dtype == "bf16":
            # Under bf16 autocast the emulation's matmuls are the only fp32 ones, and their operands are FP8
            # values (at most 4 significant bits): exact in TF32, which only makes them faster.
            torch.backends.cuda.matmul.allow_tf32 = True
    opt = make_optimizer(model, args)
    step_model = torch.compile(model) if args.compile else model
    model.docs = doc_masking(model.cfg, args)
    batches = shard_windows(args.train, B, T, V, "--train", args.seed if args.shuffle else None)
    log = open(args.log, "w") if args.log else None

    def emit(line):
        print(line, flush=True)
        if log:
            log.write(line + "\n")
            log.flush()

    for step in range(args.steps + 1):
        if args.val and args.val_every > 0 and (step % args.val_every == 0 or step == args.steps):
            model.eval()
            val_batches = shard_windows(args.val, B, T, V, "--val")
            with torch.no_grad(), autocast(dev, args.dtype):
                val = sum(step_model(x.to(dev), y.to(dev))[1].item()
                          for x, y in (next(val_batches) for _ in range(args.val_batches)))
            emit(f"step {step} val_loss {val / args.val_batches:.6f}")
            model.train()
        if step == args.steps:
            break
        t0 = time.perf_counter()
        lr = lr_at_step(args, step)
        for group in opt.param_groups:  # Muon's group: the same schedule from its own base lr
            group["lr"] = lr_at_step(args, step, group["base_lr"]) if "base_lr" in group else lr
        x, y = next(batches)
        loss = train_step(model, step_model, opt, x.to(dev), y.to(dev), args).item()
        ms = (time.perf_counter() - t0) * 1e3
        emit(f"step {step + 1} train_loss {loss:.6f} lr {lr:.6e} ms {ms:.1f} tok_s {B * T / ms * 1e3:.0f}")
    if log:
        log.close()
    if args.write_model:
        fmt.write_model(args.write_model, model.cfg, model.cpu().flat().numpy(), dtype=DTYPES[args.dtype])
        print(f"wrote {args.write_model}")


def bench(model, args):
    """GPT-2 training steps as a PyTorch user would write them: bf16 autocast, SDPA (flash on a
    GPU), fused AdamW, clipping, on one batch of random tokens. The median is over the steps after
    a warm-up that also absorbs torch.compile's compilation. Runs on the CPU too (smoke test)."""
    dev, B, T, V = args.device, args.batch, args.seq, model.cfg["vocab_size"]
    if T > model.cfg["max_seq_len"]:
        die(f"--seq {T} exceeds the model's max_seq_len {model.cfg['max_seq_len']}")
    warmup = max(3, args.steps // 3)
    if args.steps <= warmup:
        die(f"--steps {args.steps}: the bench needs more than {warmup} steps (the first {warmup} are warm-up)")
    torch.backends.cuda.matmul.allow_tf32 = True  # what a user runs for the fp32 matmuls outside autocast
    model = model.to(dev)
    opt = make_optimizer(model, args)
    step_model = torch.compile(model) if args.compile else model
    g = torch.Generator(device=dev).manual_seed(args.seed)
    x = torch.randint(0, V, (B, T), device=dev, generator=g)
    y = torch.randint(0, V, (B, T), device=dev, generator=g)
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.steps):
        sync(dev)
        t0 = time.perf_counter()
        loss = train_step(model, step_model, opt, x, y, args)
        sync(dev)
        times.append((time.perf_counter() - t0) * 1e3)
        print(f"step {step + 1} train_loss {loss.item():.6f} ms {times[-1]:.1f}", flush=True)
    ms = statistics.median(times[warmup:])
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if dev == "cuda" else float("nan")
    name = "compile" if args.compile else "eager"
    print(f"BENCH name={name} ms={ms:.2f} tok_s={B * T / ms * 1e3:.0f} peak_gib={peak:.2f}")


def hellaswag(model, args):
    """acc_norm on a GPTE eval file, the reference for llmc/hellaswag.h: row k of an example is the
    context + completion k; the completion's score is the mean cross-entropy of its own tokens,
    each predicted after everything before it; the pick is the lowest score (the first of equal
    ones). fp64, one example (K rows, padded to the longest) per forward pass. Prints
    `example <i> label <l> pick <p> norm_losses <x_0> .. <x_K-1>` per example, then
    `hellaswag acc_norm <x> correct <n> examples <n>`."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    from hellaswag import read_eval  # noqa: E402  (scripts/data/hellaswag.py, the validating reader)
    cfg, dev = model.cfg, args.device
    V = cfg["vocab_size"]
    examples, _ = read_eval(args.hellaswag)
    m = model.double().to(dev).eval()
    correct = 0
    for i, (label, ctx, ends) in enumerate(examples):
        rows = [ctx + e for e in ends]
        n = max(len(r) for r in rows) - 1  # inputs of the longest row
        if n > cfg["max_seq_len"] or max(max(r) for r in rows) >= V:
            die(f"--hellaswag {args.hellaswag}: example {i} needs {n} positions (the model has {cfg['max_seq_len']}) "
                f"and token ids below {V}")
        x = torch.zeros((len(rows), n), dtype=torch.long)
        y = torch.zeros((len(rows), n), dtype=torch.long)
        for k, r in enumerate(rows):
            x[k, :len(r) - 1] = torch.tensor(r[:-1])
            y[k, :len(r) - 1] = torch.tensor(r[1:])
        with torch.no_grad():
            logits = m(x.to(dev))[0][..., :V]
            losses = F.cross_entropy(logits.reshape(-1, V), y.to(dev).reshape(-1), reduction="none").view(len(rows), n)
        # row k's completion tokens are targets len(ctx)-1 .. len(row)-2
        norms = [losses[k, len(ctx) - 1:len(r) - 1].mean().item() for k, r in enumerate(rows)]
        pick = norms.index(min(norms))
        correct += pick == label
        print(f"example {i} label {label} pick {pick} norm_losses " + " ".join(f"{v:.9g}" for v in norms))
    print(f"hellaswag acc_norm {correct / len(examples):.6f} correct {correct} examples {len(examples)}")


# ---------------------------------------------------------------- command line
# The shape flags of a new model and their defaults (a tiny test shape).
SHAPE_DEFAULTS = {"--layers": 2, "--channels": 32, "--heads": 4, "--vocab": 250, "--max-seq": 32}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_argument_group("model (default: the shape flags; in bench mode without them, --model d12)")
    s.add_argument("--model", help="dN (N layers, 64N channels, N heads), gpt2|gpt2-medium|gpt2-large|gpt2-xl "
                                   "(pretrained, via transformers) or hf-random (transformers init, shape flags)")
    s.add_argument("--load", metavar="PATH", help="start from one of our checkpoints (GPTM)")
    for flag, default in SHAPE_DEFAULTS.items():
        s.add_argument(flag, type=int, help=f"(default {default})")
    s.add_argument("--kv-heads", type=int, default=0, help="key/value heads of a dN or shape-flag model, dividing "
                                                          "the heads (grouped-query attention; 0 = as many as heads)")
    s.add_argument("--window", type=int, default=0, help="attention window W of a dN or shape-flag model: position t "
                                                        "sees t-W+1..t (0 = full causal)")
    s.add_argument("--arch", choices=sorted(ARCH_DEFAULTS), help="model family of a dN or shape-flag model: "
                   "gpt2 (LayerNorm, learned positions, GELU 4C, biases, tied) or llama (RMSNorm eps 1e-5, RoPE theta "
                   "10000, SwiGLU 8C/3 rounded up to 64, no biases, tied); the flags below change one knob (default gpt2)")
    s.add_argument("--norm", choices=["layernorm", "rmsnorm"])
    s.add_argument("--norm-eps", type=float, help="RMSNorm eps (LayerNorm: only 1e-5)")
    s.add_argument("--position", choices=["learned", "rope"])
    s.add_argument("--rope-theta", type=float)
    s.add_argument("--mlp", choices=["gelu", "swiglu"])
    s.add_argument("--mlp-hidden", type=int, help="the MLP's hidden width H (fc has H rows, or 2H for SwiGLU)")
    s.add_argument("--bias", type=int, choices=[0, 1], help="1 = the attention output and MLP projections have biases "
                   "(and qkv, unless --qkv-bias 0)")
    s.add_argument("--qkv-bias", type=int, choices=[0, 1], help="1 = the qkv projection has a bias (default: --bias; "
                   "--arch llama --qkv-bias 1 is Qwen2)")
    s.add_argument("--tied", type=int, choices=[0, 1], help="1 = logits through wte, 0 = a separate lm_head")
    s.add_argument("--seed", type=int, default=1337, help="init and random batch seed")
    o = p.add_argument_group("outputs")
    o.add_argument("--write-model", metavar="PATH", help="write the (initial) model as a GPTM checkpoint")
    o.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                   help="checkpoint dtype; in train/bench: compute with bf16 autocast or fp32 "
                        "(default fp32, bench bf16)")
    o.add_argument("--write-debug", metavar="PATH", help="write the reference state (GPTX) of one batch")
    o.add_argument("--fixture", metavar="DIR", help="write DIR/model.bin + DIR/debug.bin with the test fixture "
                                                    "settings (" + ", ".join(f"{k}={v}" for k, v in FIXTURE.items()) +
                                                    "), and DIR/<prefix>model.bin + <prefix>debug.bin for gqa_, "
                                                    "llama_, llama_gqa_ and llama_window_ (FIXTURES in this script)")
    d = p.add_argument_group("data and optimization")
    d.add_argument("--batch", type=int, default=4, help="B")
    d.add_argument("--seq", type=int, default=16, help="T")
    d.add_argument("--data", metavar="SHARD", help="reference batch from the first B*T+1 tokens of this shard "
                                                   "(default: random ids from --seed)")
    d.add_argument("--steps", type=int, default=0, help="AdamW steps (reference state, train, bench)")
    d.add_argument("--lr", type=float, default=1e-3)
    d.add_argument("--beta1", type=float, default=0.9)
    d.add_argument("--beta2", type=float, default=0.95)
    d.add_argument("--eps", type=float, default=1e-8)
    d.add_argument("--weight-decay", type=float, default=0.1)
    d.add_argument("--grad-clip", type=float, default=1.0, help="global norm clip; <= 0 disables")
    d.add_argument("--schedule", choices=["constant", "cosine", "linear"], default="constant",
                   help="train: the learning rate after --warmup, as llmc/schedule.h (the C++ trainers' default "
                        "is cosine; here constant)")
    d.add_argument("--warmup", type=int, default=0, help="train: linear warmup steps")
    d.add_argument("--final-lr-frac", type=float, default=0.0, help="train: cosine/linear end at lr * this")
    d.add_argument("--optimizer", choices=["adamw", "muon"], default="adamw",
                   help="muon (train, bench): torch.optim.Muon, Nesterov, on each layer's Q, K and V, attention "
                        "projection, fc (SwiGLU's gate and up apart) and fc projection matrices, and AdamW (--lr, "
                        "--weight-decay) on the rest; its Newton-Schulz in bf16 with --dtype bf16 (as torch.optim.Muon "
                        "always), else in fp32")
    d.add_argument("--muon-lr", type=float, default=0.02, help="Muon's lr, before --muon-adjust-lr's factor; "
                                                              "the schedule scales it as it scales --lr")
    d.add_argument("--muon-momentum", type=float, default=0.95, help="in [0, 1)")
    d.add_argument("--muon-wd", type=float, default=0.0, help="Muon's decoupled weight decay: w *= 1 - lr * wd")
    d.add_argument("--muon-ns-steps", type=int, default=5, help="Newton-Schulz iterations, 1..99")
    d.add_argument("--muon-adjust-lr", choices=MUON_ADJUST_LR, default="original",
                   help="the lr of a (rows, cols) matrix: original lr * sqrt(max(1, rows/cols)); match_rms_adamw "
                        "lr * 0.2 sqrt(max(rows, cols))")
    d.add_argument("--doc-mask", type=int, choices=[0, 1], default=0,
                   help="train: 1 = a document starts at each --doc-token, and a token attends only to its own "
                        "document (and --window): an explicit block-diagonal causal mask (train and validation)")
    d.add_argument("--doc-positions", choices=["continue", "restart"], default="continue",
                   help="with --doc-mask 1: restart = position ids count from each document's start (Hugging "
                        "Face's packed SFT), continue = position t is t")
    d.add_argument("--doc-token", type=int, metavar="ID", help="with --doc-mask 1: the id that starts a document "
                   "(default GPT-2's <|endoftext|> 50256, for a GPT-2 model)")
    t = p.add_argument_group("train / bench")
    t.add_argument("--train", metavar="GLOB", help="train on these token shards and print the losses")
    t.add_argument("--val", metavar="GLOB", help="validation shards")
    t.add_argument("--val-every", type=int, default=0, help="steps between validations (0: never)")
    t.add_argument("--val-batches", type=int, default=4)
    t.add_argument("--log", metavar="PATH", help="also write the train/val lines here (scripts/plot_log.py reads it)")
    t.add_argument("--shuffle", type=int, choices=[0, 1], default=0,
                   help="train: 1 = each epoch in a random shard and window order from --seed, as the C++ "
                        "trainers do (their order differs); 0 = file order")
    f = p.add_argument_group("FP8 emulation (train; scripts/fp8_emulate.py, docs/numerics.md)")
    f.add_argument("--fp8-emulate", choices=FP8_RECIPES, default="none",
                   help="the four linear layers of every block (qkv, attproj, fc, fcproj) compute their forward, "
                        "input- and weight-gradient matmuls on fake-quantized FP8 operands (e4m3 x and W, "
                        "--fp8-emulate-grad dY), current amax scaling with one scale per: tensor (tensorwise, as "
                        "the GPU trainer's --fp8 1), row/output channel (rowwise), the same with the weight "
                        "gradient unquantized (rowwise_gw_bf16), 1x128 activation and 128x128 weight tiles "
                        "(blockwise, DeepSeek-V3); none = off")
    f.add_argument("--fp8-emulate-grad", choices=["e5m2", "e4m3"], default="e5m2", help="format of the gradients dY")
    f.add_argument("--fp8-emulate-bf16-layers", type=int, default=0, metavar="N",
                   help="the first N and last N blocks stay in the compute dtype (as --fp8-bf16-layers)")
    t.add_argument("--bench", action="store_true", help="time training steps on random tokens")
    t.add_argument("--compile", action="store_true", help="bench/train through torch.compile")
    t.add_argument("--device", default="cpu", help="cpu or cuda (train, bench, hellaswag)")
    t.add_argument("--hellaswag", metavar="FILE", help="score the model on this eval file (GPTE, "
                                                       "scripts/data/hellaswag.py) and print acc_norm")
    args = p.parse_args(argv)
    shape_given = False
    for flag, default in SHAPE_DEFAULTS.items():
        key = flag[2:].replace("-", "_")
        shape_given |= getattr(args, key) is not None
        if getattr(args, key) is None:
            setattr(args, key, default)
    modes = [m for m in ("fixture", "train", "bench", "hellaswag") if getattr(args, m)]
    if len(modes) > 1:
        p.error("choose one of --fixture, --train, --bench, --hellaswag")
    if args.model and args.load:
        p.error("--model and --load both name the model: give one")
    for flag in ("batch", "seq", "val_batches"):
        if getattr(args, flag) <= 0:
            p.error(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.steps < 0:
        p.error(f"--steps must be >= 0, got {args.steps}")
    if args.lr <= 0:
        p.error(f"--lr must be positive, got {args.lr}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if not 0 <= args.final_lr_frac <= 1:
        p.error(f"--final-lr-frac must be in [0, 1], got {args.final_lr_frac}")
    if args.fp8_emulate_bf16_layers < 0:
        p.error(f"--fp8-emulate-bf16-layers must be >= 0, got {args.fp8_emulate_bf16_layers}")
    fp8_given = [f for f, v, d in (("--fp8-emulate", args.fp8_emulate, "none"), ("--fp8-emulate-grad", args.fp8_emulate_grad,
                 "e5m2"), ("--fp8-emulate-bf16-layers", args.fp8_emulate_bf16_layers, 0)) if v != d]
    if fp8_given and not args.train:
        p.error(f"{fp8_given[0]}: only in train mode (--train)")
    if fp8_given and fp8_given[0] != "--fp8-emulate" and args.fp8_emulate == "none":
        p.error(f"{fp8_given[0]}: only with --fp8-emulate")
    muon_given = [f for f, v, d in (("--muon-lr", args.muon_lr, 0.02), ("--muon-momentum", args.muon_momentum, 0.95),
                  ("--muon-wd", args.muon_wd, 0.0), ("--muon-ns-steps", args.muon_ns_steps, 5),
                  ("--muon-adjust-lr", args.muon_adjust_lr, "original")) if v != d]
    if muon_given and args.optimizer != "muon":
        p.error(f"{muon_given[0]}: only with --optimizer muon")
    if args.optimizer == "muon" and not (args.train or args.bench):
        p.error("--optimizer muon: only in train and bench modes (the debug state, GPTX, records AdamW's settings)")
    if args.muon_lr <= 0:
        p.error(f"--muon-lr must be positive, got {args.muon_lr}")
    if not 0 <= args.muon_momentum < 1:
        p.error(f"--muon-momentum must be in [0, 1), got {args.muon_momentum}")
    if args.muon_wd < 0:
        p.error(f"--muon-wd must be >= 0, got {args.muon_wd}")
    if not 1 <= args.muon_ns_steps <= 99:
        p.error(f"--muon-ns-steps must be in 1..99, got {args.muon_ns_steps}")
    if args.doc_mask and not args.train:
        p.error("--doc-mask 1: only in train mode (--train)")
    doc_given = [f for f, v, d in (("--doc-positions restart", args.doc_positions, "continue"),
                                   ("--doc-token", args.doc_token, None)) if v != d]
    if doc_given and not args.doc_mask:
        p.error(f"{doc_given[0]}: only with --doc-mask 1 (as train_gpt2_cpu)")
    if args.device not in ("cpu", "cuda"):
        p.error(f"--device {args.device}: expected cpu or cuda")
    if args.device == "cuda" and torch is not None and not torch.cuda.is_available():
        p.error("--device cuda: no GPU is visible to PyTorch")
    if args.bench and not args.model and not args.load and not shape_given:
        args.model = "d12"
    if args.dtype is None:
        args.dtype = "bf16" if args.bench else "fp32"
    if not (args.fixture or args.train or args.bench or args.hellaswag or args.write_model or args.write_debug):
        p.error("nothing to do: give --write-model/--write-debug, --fixture, --train, --bench or --hellaswag")
    return args


def main(argv=None):
    args = parse_args(argv)
    if torch is None:
        die("scripts/train_gpt2.py needs PyTorch (pip install torch); only --help works without it")
    try:
        if args.fixture:
            fixture(args)
            return
        model = build_model(args)
        if args.bench:
            bench(model, args)
        elif args.train:
            train(model, args)
        elif args.hellaswag:
            hellaswag(model, args)
        else:
            write_outputs(model, args)
    except (fmt.FormatError, OSError) as e:  # a bad or unwritable file: one line, no traceback
        die(str(e))


if __name__ == "__main__":
    main()
