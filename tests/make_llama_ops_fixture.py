"""Writes tests/fixture/llama_ops.bin, the PyTorch reference that tests/test_llama_ops_cpu.cpp
checks the Llama-family CPU ops against: llmc/cpu/rmsnorm.h (RMSNorm and the fused residual-add +
RMSNorm), llmc/cpu/rope.h (rotary embeddings on the fused QKV activation, and its tables with Llama
3.x's llama3 frequency scaling) and llmc/cpu/swiglu.h.

Regenerate (needs torch, CPU is enough; deterministic, so the file only changes if this script does):
    python3 tests/make_llama_ops_fixture.py [--out PATH] [--no-transformers]

Every expected number comes from float64 PyTorch below: the formulas written here and autograd for
the gradients. None of it comes from the project's C++. Inputs are drawn in float64 and rounded to
fp32 first, and the reference is computed (in float64) from those fp32 values, so the C++ sees
exactly the same inputs. The RoPE formula is written the way Hugging Face writes it (cos/sin of the
angles concatenated twice, rotate_half). When `transformers` is importable, the script also asserts
that its LlamaRMSNorm, LlamaRotaryEmbedding + apply_rotary_pos_emb, LlamaMLP and the llama3 rope
scaling's inverse frequencies agree with the formulas here on the same inputs, which pins the
conventions (pairing of channels, inverse frequencies, the [gate | up] layout) to Hugging Face's; without it (or with --no-transformers) those
checks are skipped, with a note. The file does not depend on them.

File (docs/formats.md convention): 1024-byte header of 128 little-endian int64, h[0] = fourcc("GPTL"),
h[1] = 1 (version), h[2..6] = the number of rmsnorm, fused residual+rmsnorm, rope, swiglu and scaled
RoPE table cases (h[6] = 0 in files of earlier versions of this script, which had none).
Then the cases in that order; each is int64 sizes, float64 parameters, then little-endian fp32 arrays:
  rmsnorm: B, T, C; eps; inp, weight, dout; out, rstd, dinp, dweight
  fused:   B, T, C; eps; inp1, inp2, weight, dout, dresidual; residual, out, rstd, dres_total, dweight
           (dresidual: the gradient reaching residual from later layers; dres_total: the whole
           gradient of residual = d(inp1) = d(inp2))
  rope:    B, T, NH, NKV, HD, pos_offset; theta; qkv, dqkv_rot; cos, sin (T, HD/2) (the table rows
           of positions pos_offset .. pos_offset+T-1), qkv_rot, dqkv   (dqkv_rot: the gradient of
           the rotated qkv; dqkv: of the input qkv)
  swiglu:  N, H; (no parameters); inp (N, 2H) rows [gate | up], dout (N, H); out (N, H), dinp (N, 2H)
  rope_scaled: HD, pos_offset, T, original_max_position_embeddings; theta, factor, low_freq_factor,
           high_freq_factor; cos, sin (T, HD/2): the table rows of positions pos_offset ..
           pos_offset+T-1 with the llama3 scaling (rope_type "llama3" of Llama 3.1 / 3.2)
"""
import argparse
import os
import sys

import numpy as np

# Imported by main() after the arguments are parsed, so that --help is instant and works without them
torch = None
hf_llama = LlamaConfig = None  # transformers' Llama modules, when installed and not --no-transformers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import llmc_formats as fmt  # noqa: E402

MAGIC_LLAMA_OPS = fmt.fourcc("GPTL")
OUT_PATH = os.path.join(ROOT, "tests", "fixture", "llama_ops.bin")

# (B, T, C, eps, input scale): at scale 3e-3 mean(x^2) is ~1e-5, so eps changes rstd by ~10% and a
# wrong eps fails the check
RMSNORM_CASES = [
    (1, 3, 776, 1e-5, 1.5),
    (2, 3, 64, 1e-6, 3e-3),
]
FUSED_CASES = [
    (1, 2, 776, 1e-6, 1.0),
    (2, 2, 96, 1e-5, 1e-2),
]
ROPE_CASES = [  # (B, T, NH, NKV, HD, pos_offset, theta)
    (1, 7, 4, 2, 64, 0, 10000.0),      # GQA, Llama 2's theta
    (1, 3, 4, 2, 128, 4093, 500000.0),  # Llama 3's head dim and theta, deep into a long context
    (2, 3, 2, 2, 16, 5, 10000.0),       # MHA, B > 1, a small offset
    (1, 2, 3, 1, 32, 0, 1000000.0),     # MQA, Qwen2's theta
]
SWIGLU_CASES = [  # (N, H)
    (4, 341),
    (3, 64),
]
# (HD, pos_offset, T, theta, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
# every case has frequencies in all three bands (kept, blended, divided by the factor)
ROPE_SCALED_CASES = [
    (16, 0, 48, 10000.0, 8.0, 1.0, 4.0, 32),         # a tiny model's: scaled within 48 positions
    (128, 8190, 3, 500000.0, 32.0, 1.0, 4.0, 8192),  # Llama 3.2 1B/3B's, at the original context's end
    (64, 100, 5, 10000.0, 4.0, 2.0, 8.0, 64),        # other factors
]


def as_f32_exact(t):
    """Rounds to fp32 and back so the reference sees exactly what the file stores."""
    return t.to(torch.float32).to(torch.float64)


def f32(t):
    return t.detach().numpy().astype("<f4").reshape(-1)


def randn(gen, *shape, scale=1.0, shift=0.0):
    return as_f32_exact(shift + scale * torch.randn(*shape, dtype=torch.float64, generator=gen))


# ---- the reference formulas ----

def rmsnorm(x, weight, eps):
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * rstd * weight, rstd.squeeze(-1)


def rope_cos_sin(positions, HD, theta):
    """(P, HD) cos and sin, the angles concatenated twice as Hugging Face's LlamaRotaryEmbedding does."""
    inv_freq = theta ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)  # (HD/2,)
    freqs = positions.to(torch.float64)[:, None] * inv_freq[None, :]        # (P, HD/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def llama3_inv_freq(HD, theta, factor, low, high, original_max_pos):
    """The llama3-scaled inverse frequencies (HD/2,) in float64, written as one blend clamped to [0, 1]:
    s = (original / wavelength - low) / (high - low); f' = (1 - s) f / factor + s f. s <= 0 (long
    wavelengths) gives f / factor, s >= 1 (short ones) leaves f."""
    f = theta ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    s = ((original_max_pos * f / (2 * torch.pi) - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - s) * f / factor + s * f, s


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(qkv, cos, sin, NH, NKV, HD):
    """qkv (B, T, (NH+2NKV)*HD); cos, sin (T, HD) -> the same with Q and K heads rotated."""
    B, T, _ = qkv.shape
    x = qkv.view(B, T, NH + 2 * NKV, HD)
    qk, v = x[:, :, :NH + NKV], x[:, :, NH + NKV:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat((qk * c + rotate_half(qk) * s, v), dim=2).reshape(B, T, -1)


def swiglu(inp):
    """inp (N, 2H) rows [gate | up] -> silu(gate) * up (N, H)."""
    gate, up = inp.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


# ---- the cases ----

def make_rmsnorm(gen, B, T, C, eps, scale):
    inp = randn(gen, B, T, C, scale=scale, shift=0.2 * scale).requires_grad_(True)
    weight = randn(gen, C, scale=0.2, shift=1.0).requires_grad_(True)
    dout = randn(gen, B, T, C)
    out, rstd = rmsnorm(inp, weight, eps)
    dinp, dweight = torch.autograd.grad(out, (inp, weight), grad_outputs=dout)
    hf_check_rmsnorm(inp.detach(), weight.detach(), eps, out.detach())
    return [np.array([B, T, C], dtype="<i8"), np.array([eps], dtype="<f8"),
            f32(inp), f32(weight), f32(dout), f32(out), f32(rstd), f32(dinp), f32(dweight)]


def make_fused(gen, B, T, C, eps, scale):
    inp1 = randn(gen, B, T, C, scale=scale).requires_grad_(True)
    inp2 = randn(gen, B, T, C, scale=0.5 * scale).requires_grad_(True)
    weight = randn(gen, C, scale=0.2, shift=1.0).requires_grad_(True)
    dout = randn(gen, B, T, C)
    dresidual = randn(gen, B, T, C)
    residual = inp1 + inp2
    out, rstd = rmsnorm(residual, weight, eps)
    dinp1, dinp2, dweight = torch.autograd.grad((residual, out), (inp1, inp2, weight), grad_outputs=(dresidual, dout))
    assert torch.equal(dinp1, dinp2), "the residual add passes one gradient to both inputs"
    return [np.array([B, T, C], dtype="<i8"), np.array([eps], dtype="<f8"),
            f32(inp1), f32(inp2), f32(weight), f32(dout), f32(dresidual),
            f32(residual), f32(out), f32(rstd), f32(dinp1), f32(dweight)]


def make_rope(gen, B, T, NH, NKV, HD, pos_offset, theta):
    QKV = (NH + 2 * NKV) * HD
    qkv = randn(gen, B, T, QKV).requires_grad_(True)
    dqkv_rot = randn(gen, B, T, QKV)
    cos, sin = rope_cos_sin(torch.arange(pos_offset, pos_offset + T), HD, theta)  # (T, HD)
    qkv_rot = rope(qkv, cos, sin, NH, NKV, HD)
    (dqkv,) = torch.autograd.grad(qkv_rot, qkv, grad_outputs=dqkv_rot)
    hf_check_rope(qkv.detach(), cos, sin, qkv_rot.detach(), B, T, NH, NKV, HD, pos_offset, theta)
    half = HD // 2
    return [np.array([B, T, NH, NKV, HD, pos_offset], dtype="<i8"), np.array([theta], dtype="<f8"),
            f32(qkv), f32(dqkv_rot), f32(cos[:, :half]), f32(sin[:, :half]), f32(qkv_rot), f32(dqkv)]


def make_rope_scaled(HD, pos_offset, T, theta, factor, low, high, original_max_pos):
    inv_freq, s = llama3_inv_freq(HD, theta, factor, low, high, original_max_pos)
    assert (s == 0).any() and (s == 1).any() and ((s > 0) & (s < 1)).any(), "a case must cover all three bands"
    plain = theta ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    assert (inv_freq / plain).min() < 1.0 / factor + 1e-12, "the scaling must change the frequencies"
    hf_check_llama3(inv_freq, HD, theta, factor, low, high, original_max_pos)
    angles = torch.arange(pos_offset, pos_offset + T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, HD/2)
    return [np.array([HD, pos_offset, T, original_max_pos], dtype="<i8"),
            np.array([theta, factor, low, high], dtype="<f8"), f32(angles.cos()), f32(angles.sin())]


def make_swiglu(gen, N, H):
    inp = randn(gen, N, 2 * H, scale=3.0)
    inp[0, :4] = torch.tensor([-100.0, -30.0, 30.0, 0.0], dtype=torch.float64)  # both tails of sigmoid, and 0
    inp[0, H:H + 4] = 1.0  # their up values: keep max |out| that of the ordinary entries
    inp.requires_grad_(True)
    dout = randn(gen, N, H)
    out = swiglu(inp)
    (dinp,) = torch.autograd.grad(out, inp, grad_outputs=dout)
    return [np.array([N, H], dtype="<i8"), f32(inp), f32(dout), f32(out), f32(dinp)]


# ---- the same conventions in Hugging Face transformers, when it is installed ----

def import_libraries(use_transformers):
    global torch, hf_llama, LlamaConfig
    try:
        import torch
    except ImportError:
        die("tests/make_llama_ops_fixture.py needs PyTorch (pip install torch)")
    if use_transformers:
        try:
            from transformers.models.llama import modeling_llama as hf_llama
            from transformers.models.llama.configuration_llama import LlamaConfig
        except ImportError:
            pass


def hf_config(**kw):
    theta = kw.pop("rope_theta", 10000.0)
    cfg = LlamaConfig(**kw, rope_theta=theta)
    rope_parameters = getattr(cfg, "rope_parameters", None)  # transformers >= 5 keeps theta here
    if rope_parameters is not None:
        assert rope_parameters.get("rope_type", "default") == "default"
        rope_parameters["rope_theta"] = theta
    return cfg


def hf_check_rmsnorm(x, weight, eps, out):
    """LlamaRMSNorm normalizes in fp32 whatever the input dtype, hence the fp32-level tolerance."""
    if hf_llama is None:
        return
    norm = hf_llama.LlamaRMSNorm(x.shape[-1], eps=eps).double()
    with torch.no_grad():
        norm.weight.copy_(weight)
        hf = norm(x)
    err = ((hf - out).abs().max() / out.abs().max()).item()
    assert err < 1e-6, f"LlamaRMSNorm disagrees with the formula here: {err}"


def hf_check_rope(qkv, cos, sin, qkv_rot, B, T, NH, NKV, HD, pos_offset, theta):
    """apply_rotary_pos_emb on the same cos/sin must match exactly; LlamaRotaryEmbedding's own tables
    (fp32 angles) to fp32 accuracy of angles up to pos_offset + T."""
    if hf_llama is None:
        return
    x = qkv.view(B, T, NH + 2 * NKV, HD).transpose(1, 2)  # (B, heads, T, HD), HF's layout
    q, k = x[:, :NH], x[:, NH:NH + NKV]
    q_hf, k_hf = hf_llama.apply_rotary_pos_emb(q, k, cos[None].expand(B, T, HD), sin[None].expand(B, T, HD))
    ours = qkv_rot.view(B, T, NH + 2 * NKV, HD).transpose(1, 2)
    assert torch.equal(q_hf, ours[:, :NH]) and torch.equal(k_hf, ours[:, NH:NH + NKV]), \
        "apply_rotary_pos_emb disagrees with the rotation here"
    cfg = hf_config(hidden_size=NH * HD, num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD,
                    max_position_embeddings=pos_offset + T, rope_theta=theta)
    emb = hf_llama.LlamaRotaryEmbedding(cfg)
    positions = torch.arange(pos_offset, pos_offset + T)[None]
    cos_hf, sin_hf = emb(qkv.to(torch.float32), positions)
    tol = 4 * 2.0 ** -24 * (pos_offset + T) + 1e-6  # fp32 angle rounding, and fp32 cos/sin
    for a, b, what in ((cos_hf[0], cos, "cos"), (sin_hf[0], sin, "sin")):
        err = (a.double() - b).abs().max().item()
        assert err < tol, f"LlamaRotaryEmbedding's {what} differs from the table here by {err} (tolerance {tol})"


def hf_check_llama3(inv_freq, HD, theta, factor, low, high, original_max_pos):
    """transformers' llama3 inverse frequencies (fp32) agree with the float64 ones here to fp32 accuracy."""
    if hf_llama is None:
        return
    from transformers import modeling_rope_utils
    cfg = LlamaConfig(hidden_size=HD, num_attention_heads=1, head_dim=HD, max_position_embeddings=2 * original_max_pos,
                      rope_parameters=dict(rope_type="llama3", rope_theta=theta, factor=factor, low_freq_factor=low,
                                           high_freq_factor=high, original_max_position_embeddings=original_max_pos))
    hf, _ = modeling_rope_utils.ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    err = ((hf.double() - inv_freq).abs() / inv_freq).max().item()
    assert err < 1e-6, f"transformers' llama3 inverse frequencies differ from the formula here by {err} (relative)"


def hf_check_swiglu(H=40, C=24, N=3):
    """LlamaMLP's down(silu(gate(x)) * up(x)) == down(swiglu(x @ cat(gate.w, up.w)^T)): the layout.
    Its own generator, so the fixture's numbers do not depend on whether transformers is installed."""
    if hf_llama is None:
        return
    gen = torch.Generator().manual_seed(5678)
    cfg = hf_config(hidden_size=C, intermediate_size=H, hidden_act="silu", num_attention_heads=1)
    mlp = hf_llama.LlamaMLP(cfg).double()
    with torch.no_grad():
        for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            lin.weight.copy_(torch.randn(lin.weight.shape, dtype=torch.float64, generator=gen))
    x = torch.randn(N, C, dtype=torch.float64, generator=gen)
    with torch.no_grad():
        fused_w = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], dim=0)  # (2H, C)
        ours = swiglu(x @ fused_w.T) @ mlp.down_proj.weight.T
        err = (mlp(x) - ours).abs().max().item()
    assert err < 1e-12, f"LlamaMLP disagrees with swiglu on the [gate | up] layout: {err}"


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=OUT_PATH, help="file to write (default: the committed tests/fixture/llama_ops.bin)")
    ap.add_argument("--no-transformers", action="store_true",
                    help="skip the checks against transformers even if it is installed (they cost ~3 s of "
                         "importing; the file written is the same either way)")
    args = ap.parse_args(argv)
    import_libraries(not args.no_transformers)
    gen = torch.Generator().manual_seed(1234)
    counts = {2: len(RMSNORM_CASES), 3: len(FUSED_CASES), 4: len(ROPE_CASES), 5: len(SWIGLU_CASES),
              6: len(ROPE_SCALED_CASES)}
    chunks = [fmt.make_header(MAGIC_LLAMA_OPS, counts)]
    for case in RMSNORM_CASES:
        chunks += make_rmsnorm(gen, *case)
    for case in FUSED_CASES:
        chunks += make_fused(gen, *case)
    for case in ROPE_CASES:
        chunks += make_rope(gen, *case)
    for case in SWIGLU_CASES:
        chunks += make_swiglu(gen, *case)
    for case in ROPE_SCALED_CASES:  # no random inputs: the cases before keep their numbers
        chunks += make_rope_scaled(*case)
    hf_check_swiglu()
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        fmt.atomic_write(args.out, chunks)
    except OSError as e:
        die(f"--out {args.out}: cannot write ({e.strerror})")
    hf = "checked against transformers" if hf_llama is not None else \
        "the checks against transformers were skipped: " + \
        ("--no-transformers" if args.no_transformers else "it is not installed")
    print(f"wrote {args.out}: {sum(counts.values())} cases, {os.path.getsize(args.out)} bytes ({hf})")


if __name__ == "__main__":
    main()
