"""attention_decode.py: decode attention (one new query per sequence against its KV cache) through
PyTorch's scaled_dot_product_attention, through torch.compile, and as a split-K flash-decoding kernel in
Triton, beside dev/cuda/attention_decode.cu's shipped kernel (llmc/attention_decode.cuh, variant 0).
  python3 dev/triton/attention_decode.py [row ...] [--check-only] [--reps N] [--compile-mode M] [--small]
Shapes and row names: the CUDA lab's "gpt2" (NH = NKV = 12, HD 64) and "gqa" (NH 32, NKV 8, HD 128)
caches of S = 4096 slots at B = 1, 8, 64, each at lengths 128, 512, 1024, 2048, 4096 (every sequence
at position len - 1) and, for B > 1, "mixed": the lab's own positions (its seeds and splitmix64 draws,
lab::rand_ints, reproduced here: sequence 0 at S - 1, sequence 1 idle, pos = -1, the rest uniform in
[0, S)), so each op name, key count and byte count is the CUDA row's:
  attention_decode gqa B=8 NH=32 NKV=8 HD=128 S=4096 W=0 len=mixed
(The lab's windowed, generate-sized and odd-group configurations have no rows here.)
Layout (llmc/cpu/attention_decode.h): qkv (B, (NH + 2 NKV) HD), this step's token, the query heads
first; k_cache and v_cache (B, NKV, S, HD), position p in slot p; pos (B) int32 on the device; out
(B, NH HD), zeros for an idle sequence. Query head h reads KV head h / G, G = NH / NKV; scale 1/sqrt(HD).
The new token's K and V are written into slot pos first, untimed (the lab's kv_cache_append).
Bytes as the lab counts them: the K and V rows each sequence attends (NKV heads), q and out once, pos;
FLOPs 4 HD per (query head, key). Memory-bound: % of the 4.0 TB/s copy.
Check: every sequence (idle included) against fp32 PyTorch math from the same bf16 values, the lab's
bf16 tolerance (1.6e-2 rel + 1e-2 rms, attention_decode.cu's lab.check) with the rms each sequence's
own (an idle one's: the whole output's), every element of the Triton output written, the others'
finite. Per sequence because a mixed batch's outputs differ in scale by orders of magnitude (a short
sequence's are ~v, a 4096-key one's ~v / 64) and the kernels that round P to bf16 for the PV product
(SDPA's, Triton's) err by ~2^-9 of the short ones: against the whole batch's rms, the H200 failed
SDPA and all three Triton rows on gqa B=64 mixed by the same bf16 value (2 elements, 1.6e-3 off).
Variants:
  triton b64 w4      split-K flash decoding: one program per (split, sequence, KV head) serving the
                     head's whole query group (padded to 16 rows, the tensor-core tile: K and V read
                     once per KV head); keys in tiles of 64, online softmax in base 2, P rounded to
                     bf16 for the PV product; fp32 partials (m, l, o) merged by a second kernel. Splits
                     from the longest sequence: about 2 programs an SM, chunks of >= 128 keys; each
                     sequence's chunk from its own length on the device; 1 split: no merge kernel, the
                     program writes out itself. 4 warps, 3 stages
  triton b128 w8     the same with tiles of 128 keys, 8 warps, 2 stages
  triton no split    one program per (sequence, KV head), tiles of 64, 4 warps: what the split buys
  torch.compile      softmax(q k^T * scale) v in fp32 as the reference: q k^T written as the product
                     of the bf16 cache and q, upcast, summed over HD (inductor fuses the upcast into the
                     reduction, so the cache is read once in bf16; the same matmul on fp32 copies would
                     write and read fp32 copies of the cache, and in bf16 would round the scores, which
                     fails the lab's tolerance), fp32 softmax, p v as a product summed over the keys;
                     the query group as a (G, HD) block against its KV head (no copy of K/V); mixed
                     batches through a visibility mask built once per step (untimed: a server builds it
                     once for all layers), the idle sequence's output zeroed. Compiled as every lab
                     script compiles (dynamic=False), with the cache length marked dynamic (it grows
                     every step; and 34 static graphs take minutes to compile): one graph per
                     configuration, plus one for len = S (a contiguous view) and one for the mask
  sdpa               F.scaled_dot_product_attention on the cache as stored (slots 0..len-1 of it, a
                     strided view), q of length 1, no mask (every cached key visible); GQA through
                     enable_gqa=True ("sdpa expand kv" where this PyTorch lacks it: K/V repeated per
                     query head inside the call); mixed batches with the same boolean mask (which rules
                     out the flash backend), the idle sequence's output zeroed; the backend PyTorch's
                     dispatcher picks is printed in the log
  sdpa grouped       GQA only: each KV head's G queries as a query sequence of length G against it
                     (plain multi-head SDPA, no enable_gqa, the same result)
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_common as lc  # noqa: E402

ARGS = lc.parse_args(__file__, __doc__)
torch, triton, tl = lc.require(__file__)
F = torch.nn.functional
from lab_triton import mma  # noqa: E402

MIXED = 0  # a case's len: the lab's mixed positions
LENS = (128, 512, 1024, 2048, 4096)
LAB_SEED = 4321  # attention_decode.cu's first configuration seed; each next configuration + 1000
# (name, B, NH, NKV, HD, S, lens, index of the configuration in the CUDA lab's list, for its seed)
FULL_CONFIGS = [(name, B, nh, nkv, hd, 4096, LENS + ((MIXED,) if B > 1 else ()))
                for B in (1, 8, 64) for name, nh, nkv, hd in (("gpt2", 12, 12, 64), ("gqa", 32, 8, 128))]
SMALL_CONFIGS = [("small", 3, 6, 2, 64, 200, (MIXED, 200)),        # the lab's --small "small": group of 3
                 ("small-mha", 3, 4, 4, 128, 200, (MIXED, 77)),    # not a lab row: HD 128 without a group
                 ("small-g12", 2, 12, 1, 64, 130, (130, MIXED))]   # the lab's "small-g12": group of 12
# Triton rows: (name, keys a tile, warps, stages, split: whether the plan may split a sequence)
TRITON_CONFIGS = (("triton b64 w4", 64, 4, 3, True), ("triton b128 w8", 128, 8, 2, True),
                  ("triton no split", 64, 4, 3, False))
MIN_CHUNK = 128      # fewest keys a split takes
PROGRAMS_PER_SM = 2  # the split plan aims at this many programs an SM
LOG2E = 1.4426950408889634

# One function compiled for every configuration: ~16 graphs (34 where this PyTorch ignores the dynamic
# length), past Dynamo's default of 8 recompiles of one function, after which it would run it uncompiled.
import torch._dynamo  # noqa: E402

for _name in ("recompile_limit", "cache_size_limit"):
    if hasattr(torch._dynamo.config, _name):
        setattr(torch._dynamo.config, _name, 256)
        break


# ---------------------------------------------------------------- the lab's positions
def splitmix64_below(n, seed, below):
    """lab::rand_ints(n, seed, below): n draws of llmc/rand.h's Rng(seed).below(below)."""
    mask, step, state, out = (1 << 64) - 1, 0x9E3779B97F4A7C15, seed, []
    for _ in range(n):
        state = (state + step) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append((z ^ (z >> 31)) % below)
    return out


def case_positions(B, S, length, case_seed):
    """attention_decode.cu's case_positions (window 0): every sequence at len - 1, or mixed."""
    if length != MIXED:
        return [length - 1] * B
    pos = splitmix64_below(B, case_seed, S)
    pos[0] = S - 1
    if B >= 3:
        pos[1] = -1
    return pos


# ---------------------------------------------------------------- Triton: split-K flash decoding
@triton.jit
def keys_of(pos_ptr, b):
    # keys sequence b attends: slots 0..pos (window 0), none for an idle sequence (pos < 0)
    p = tl.load(pos_ptr + b)
    return tl.where(p >= 0, p + 1, 0)


@triton.jit
def chunk_of(n, n_splits, BLOCK_N: tl.constexpr):
    # keys one split of a sequence of n keys takes: ceil(n / n_splits) rounded up to whole tiles
    return tl.cdiv(tl.cdiv(tl.maximum(n, 1), n_splits), BLOCK_N) * BLOCK_N


@triton.jit
def decode_split_kernel(out_ptr, part_o_ptr, part_m_ptr, part_l_ptr, qkv_ptr, k_ptr, v_ptr, pos_ptr,
                        S, NKV, G, n_splits, qkv_row, qk_scale,
                        HD: tl.constexpr, G_PAD: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr,
                        UPCAST: tl.constexpr):
    # grid (n_splits, B * NKV): keys [lo, hi) of sequence b for the G query heads of KV head kvh
    split = tl.program_id(0)
    bk = tl.program_id(1)
    b = bk // NKV
    kvh = bk % NKV
    n = keys_of(pos_ptr, b)
    chunk = chunk_of(n, n_splits, BLOCK_N)
    lo = split * chunk
    hi = tl.minimum(n, lo + chunk)
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, HD)
    offs_n = tl.arange(0, BLOCK_N)
    in_group = offs_g < G
    q = tl.load(qkv_ptr + b.to(tl.int64) * qkv_row + (kvh * G + offs_g)[:, None] * HD + offs_d[None, :],
                mask=in_group[:, None], other=0.0)                        # (G_PAD, HD), rows >= G zero
    tile = bk.to(tl.int64) * S * HD + offs_n[:, None] * HD + offs_d[None, :]  # keys 0..BLOCK_N-1 of the head
    m_i = tl.full([G_PAD], -1.0e30, dtype=tl.float32)   # running max of the scores, log2 units
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, HD], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        live = start + offs_n < hi
        k = tl.load(k_ptr + tile + start * HD, mask=live[:, None], other=0.0)   # (BLOCK_N, HD)
        s = mma(q, tl.trans(k), UPCAST) * qk_scale                         # (G_PAD, BLOCK_N)
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))       # finite: every tile holds a live key
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + tile + start * HD, mask=live[:, None], other=0.0)   # (BLOCK_N, HD)
        acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, UPCAST)
        m_i = m_new
    if DIRECT:  # one split: the output itself (out row b holds heads kvh*G.., so offset (bk*G + g)*HD)
        o = tl.where(l_i[:, None] > 0.0, acc / tl.maximum(l_i, 1e-30)[:, None], 0.0)
        tl.store(out_ptr + (bk * G + offs_g)[:, None] * HD + offs_d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=in_group[:, None])
    else:  # the partials of this split: m, l and the unnormalised o of each query head of the group
        row = (bk * n_splits + split) * G + offs_g
        tl.store(part_m_ptr + row, m_i, mask=in_group)
        tl.store(part_l_ptr + row, l_i, mask=in_group)
        tl.store(part_o_ptr + row[:, None] * HD + offs_d[None, :], acc, mask=in_group[:, None])


@triton.jit
def decode_merge_kernel(out_ptr, part_o_ptr, part_m_ptr, part_l_ptr, pos_ptr, NKV, G, n_splits,
                        HD: tl.constexpr, G_PAD: tl.constexpr, BLOCK_N: tl.constexpr):
    # grid (B * NKV,): the splits sequence b used (as many as its own length needed), merged
    bk = tl.program_id(0)
    n = keys_of(pos_ptr, bk // NKV)
    used = tl.cdiv(n, chunk_of(n, n_splits, BLOCK_N))
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, HD)
    in_group = offs_g < G
    m = tl.full([G_PAD], -1.0e30, dtype=tl.float32)
    l_sum = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, HD], dtype=tl.float32)
    for split in range(0, used):
        row = (bk * n_splits + split) * G + offs_g
        m_s = tl.load(part_m_ptr + row, mask=in_group, other=-1.0e30)
        l_s = tl.load(part_l_ptr + row, mask=in_group, other=0.0)
        o_s = tl.load(part_o_ptr + row[:, None] * HD + offs_d[None, :], mask=in_group[:, None], other=0.0)
        m_new = tl.maximum(m, m_s)
        a = tl.math.exp2(m - m_new)
        w = tl.math.exp2(m_s - m_new)
        l_sum = l_sum * a + l_s * w
        acc = acc * a[:, None] + o_s * w[:, None]
        m = m_new
    o = tl.where(l_sum[:, None] > 0.0, acc / tl.maximum(l_sum, 1e-30)[:, None], 0.0)  # idle: zeros
    tl.store(out_ptr + (bk * G + offs_g)[:, None] * HD + offs_d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=in_group[:, None])


def group_pad(G):
    return max(16, triton.next_power_of_2(G))  # tl.dot's smallest tile: 16 rows


def plan_splits(B, NKV, max_keys, block_n, num_sms, may_split):
    """Splits of a sequence: about PROGRAMS_PER_SM programs an SM, no chunk under MIN_CHUNK keys."""
    if not may_split or max_keys <= 0:
        return 1
    want = triton.cdiv(PROGRAMS_PER_SM * num_sms, B * NKV)
    most = triton.cdiv(max_keys, max(MIN_CHUNK, block_n))
    return max(1, min(want, most))


def decode_triton(out, part, qkv, k_cache, v_cache, pos, B, NH, NKV, HD, S, n_splits, block_n, warps, stages):
    """out (B, NH*HD) written with `=`; part = (o, m, l) fp32 scratch for n_splits > 1."""
    G = NH // NKV
    direct = n_splits == 1
    part_o, part_m, part_l = part if not direct else (out, out, out)  # unused when direct
    qk_scale = LOG2E / math.sqrt(HD)
    decode_split_kernel[(n_splits, B * NKV)](out, part_o, part_m, part_l, qkv, k_cache, v_cache, pos, S, NKV, G,
                                              n_splits, qkv.stride(0), qk_scale, HD=HD, G_PAD=group_pad(G),
                                              BLOCK_N=block_n, DIRECT=direct, UPCAST=lc.INTERPRET, num_warps=warps,
                                              num_stages=stages)
    if not direct:
        decode_merge_kernel[(B * NKV,)](out, part_o, part_m, part_l, pos, NKV, G, n_splits, HD=HD,
                                        G_PAD=group_pad(G), BLOCK_N=block_n, num_warps=4)


# ---------------------------------------------------------------- PyTorch
def decode_expr(q, k, v, visible, idle):
    """q (B, NKV, G, HD), k and v (B, NKV, L, HD) bf16 views of the cache; visible (B, 1, 1, L) bool or
    None (every key); idle (B, 1, 1, 1) bool or None. fp32 scores and sums, as the reference."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = (q.float().unsqueeze(-2) * k.float().unsqueeze(-3)).sum(-1) * scale       # (B, NKV, G, L)
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, dim=-1)
    out = (p.unsqueeze(-1) * v.float().unsqueeze(-3)).sum(-2)                      # (B, NKV, G, HD)
    if idle is not None:
        out = out.masked_fill(idle, 0.0)
    return out.to(q.dtype)


def mark_length_dynamic(t, dim):
    """The key dimension of a cache view or mask symbolic in the compiled graph (maybe_: Dynamo may
    specialize it again, without an error, where the graph needs that)."""
    mark = getattr(torch._dynamo, "maybe_mark_dynamic", None) or torch._dynamo.mark_dynamic
    mark(t, dim)


def sdpa_choice(q, k, v, mask, kwargs):
    """The backend the dispatcher picks for these arguments (a name), or '?' where this PyTorch hides it."""
    try:
        from torch.nn.attention import SDPBackend
        return SDPBackend(int(torch._fused_sdp_choice(q, k, v, mask, 0.0, False, **kwargs))).name
    except Exception:  # noqa: BLE001 - a private function: report nothing rather than fail
        return "?"


def run_case(L, compiled, cfg, k_cache, v_cache, length, case_seed):
    name, B, NH, NKV, HD, S, _ = cfg
    G = NH // NKV
    pos_list = case_positions(B, S, length, case_seed)
    keys = [p + 1 if p >= 0 else 0 for p in pos_list]
    n_max = max(keys)
    op = f"attention_decode {name} B={B} NH={NH} NKV={NKV} HD={HD} S={S} W=0 len={length or 'mixed'}"
    pos = torch.tensor(pos_list, dtype=torch.int32, device=lc.DEVICE)
    qkv = L.rand((B, (NH + 2 * NKV) * HD), case_seed + 1, -2.0, 2.0)
    live = [b for b in range(B) if pos_list[b] >= 0]
    if live:  # the new token's K and V into slot pos (kv_cache_append's job in the lab)
        idx = torch.tensor(live, device=lc.DEVICE)
        at = pos[idx].long()
        k_cache[idx, :, at] = qkv[idx, NH * HD:(NH + NKV) * HD].view(len(live), NKV, HD)
        v_cache[idx, :, at] = qkv[idx, (NH + NKV) * HD:].view(len(live), NKV, HD)
    q_groups = qkv[:, :NH * HD].view(B, NKV, G, HD)   # strided views of qkv's query columns
    q_heads = qkv[:, :NH * HD].view(B, NH, 1, HD)

    # fp32 reference, every sequence: slots 0..n_max-1, keys past a sequence's position masked
    slot = torch.arange(n_max, device=lc.DEVICE)
    visible = (slot[None, :] <= pos[:, None]).view(B, 1, 1, n_max)
    idle = (pos < 0).view(B, 1, 1, 1)
    s = (q_groups.float() @ k_cache[:, :, :n_max].float().transpose(-2, -1)) * (1.0 / math.sqrt(HD))
    p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1).masked_fill(idle, 0.0)
    ref = (p @ v_cache[:, :, :n_max].float()).reshape(B, NH * HD)
    del s, p

    total = sum(keys)
    nbytes = total * NKV * HD * 2 * 2.0 + 2.0 * B * NH * HD * 2 + B * 4.0
    flops = 4.0 * HD * NH * total
    k_view, v_view = k_cache[:, :, :n_max], v_cache[:, :, :n_max]
    uniform = length != MIXED
    # mixed: the mask the reference uses, except that an idle sequence sees slot 0 (a finite row,
    # zeroed afterwards), built once here as a server builds it once a step for all layers
    step_mask = None if uniform else (visible | (slot == 0).view(1, 1, 1, n_max))
    step_idle = None if uniform else idle
    plans = [plan_splits(B, NKV, n_max, block_n, L.num_sms, may_split) for _, block_n, _, _, may_split in TRITON_CONFIGS]
    gqa_kw = {"enable_gqa": True} if NH != NKV else {}
    backend = sdpa_choice(q_heads, k_view, v_view, step_mask, gqa_kw) if L.wants("sdpa") else ""
    print(f"# {op}: {total} keys; triton splits {'/'.join(map(str, plans))}"
          + (f"; sdpa picks {backend}" if backend else ""), flush=True)

    # ---- Triton
    out = lc.Out((B, NH * HD), torch.bfloat16, "out")

    def check_triton(_):
        return L.check_out(out, ref, per_row=True)

    for (what, block_n, warps, stages, _), n_splits in zip(TRITON_CONFIGS, plans):
        part = None
        if n_splits > 1 and L.wants(what):
            rows = B * NKV * n_splits * G
            part = (torch.empty(rows * HD, dtype=torch.float32, device=lc.DEVICE),
                    torch.empty(rows, dtype=torch.float32, device=lc.DEVICE),
                    torch.empty(rows, dtype=torch.float32, device=lc.DEVICE))

        def launch(cfg=(n_splits, block_n, warps, stages), part=part):
            decode_triton(out.t, part, qkv, k_cache, v_cache, pos, B, NH, NKV, HD, S, *cfg)

        L.run(op, what, nbytes, flops, lc.MEMORY, out.poison, launch, check_triton)
    del out

    # ---- the returned-tensor rows: (B, NH, 1, HD) or (B, NKV, G, HD), the lab's order of heads
    def check_fresh(y):  # compare() flattens both and fails a different count
        return L.check_fresh("out", y, ref, per_row=True)

    for t, dim in ((k_view, 2), (v_view, 2)) + (() if uniform else ((step_mask, 3),)):
        mark_length_dynamic(t, dim)
    L.run(op, "torch.compile", nbytes, flops, lc.MEMORY, lambda: None,
          lambda: compiled(q_groups, k_view, v_view, step_mask, step_idle), check_fresh)

    def zero_idle(y):
        return y if step_idle is None else y.masked_fill_(step_idle, 0.0)

    def sdpa():
        return zero_idle(F.scaled_dot_product_attention(q_heads, k_view, v_view, attn_mask=step_mask, **gqa_kw))

    L.run(op, "sdpa", nbytes, flops, lc.MEMORY, lambda: None, sdpa, check_fresh, optional=bool(gqa_kw))
    if NH != NKV:
        def sdpa_grouped():
            return zero_idle(F.scaled_dot_product_attention(q_groups, k_view, v_view, attn_mask=step_mask))

        L.run(op, "sdpa grouped", nbytes, flops, lc.MEMORY, lambda: None, sdpa_grouped, check_fresh)


def main():
    L = lc.Lab(__file__, ARGS)
    compiled = L.compile(decode_expr)
    for index, cfg in enumerate(SMALL_CONFIGS if ARGS.small else FULL_CONFIGS):
        name, B, NH, NKV, HD, S, lens = cfg
        seed = LAB_SEED + 1000 * index  # the lists are in the lab's order
        k_cache = L.rand((B, NKV, S, HD), seed, -2.0, 2.0)
        v_cache = L.rand((B, NKV, S, HD), seed + 1, -2.0, 2.0)
        for ci, length in enumerate(lens):
            run_case(L, compiled, cfg, k_cache, v_cache, length, seed + 100 * (ci + 1))
        del k_cache, v_cache
        torch.cuda.empty_cache()
    return L.finish()


if __name__ == "__main__":
    sys.exit(main())
