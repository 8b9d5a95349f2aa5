// gemv.cu: the decode step's linear layers at M <= 8 rows (llmc/gemv.cuh), against
// cpu::matmul_forward (+ cpu::gelu_forward / cpu::swiglu_forward on its fp32 output), and timed
// beside the cuBLASLt path that generate runs for larger M (matmul.cuh; + swiglu.cuh for SwiGLU).
//   ./gemv [variant ...] [--check-only] [--reps N] [--small] [--fused-only]
// Shapes, at M = 1, 2, 4, 8: GPT-2 124M's five (qkv 768->2304 + bias, attproj 768->768 + bias,
// fc 768->3072 + bias + GELU, fcproj 3072->768 + bias, lm_head 768->50304) and the Llama 114M's
// (12 heads / 4 KV heads of 64, SwiGLU hidden 2048, no biases: qkv 768->1280, attproj 768->768,
// fc 768->[gate | up] 4096 -> 2048 with SwiGLU, fcproj 2048->768, lm_head 768->50304); --small: the
// awkward K=776, N=2312 (+ bias + GELU) and K=776, N=2*1000 SwiGLU only.
// Every output element is compared (M rows are cheap on the CPU). Inputs uniform in [-1, 1],
// weights in [-0.05, 0.05], biases in [-1, 1], fresh per shape; outputs poisoned before each run.
// Bytes: the weight once, the inputs once, the outputs once (the cuBLASLt GELU path also writes the
// pre-activation its epilogue keeps; the SwiGLU path writes and reads the (M, 2H) pre-activation).
// Timing: the harness flushes L2 before each repeat, so the weight comes from DRAM as in a decode
// step (the model's ~250 MB never fits the 50 MB L2).
//
// Variants (each a policy in place of GemvPolicy, through gemv_detail's launchers; below):
//   0 shipped: gemv_forward with GemvPolicy's rows per warp (1 below M = 4, else 2), launched as
//     generate launches it (programmatic dependent launch: no effect on one kernel)
//   1 one row per warp        2 two rows per warp        3 four rows per warp (SwiGLU: 0 only)
//   4 cuBLASLt: matmul_forward (bias / GELU epilogue), + swiglu_forward for SwiGLU
//   5 before the latency work: an L2 prefetch of the first round before the wait instead of the
//     register preload, no split of K (the kernel shipped until the register preload)
//   6 the register preload without the split of K
//   7 tensor cores: llmc/gemv_mma.cuh's kernel without a fusion (plain and GELU epilogues), 8 warps a
//     tile, so a warp's instruction covers 16 rows x 8 inputs x 16 k instead of a lane's 8 FMAs a
//     weight element at M = 8
//
// The fused kernels of the decode step (gemv_fused_forward, model_infer.cuh's fused step at B <= 8), as "gemv-fused"
// ops at M = 1, 2, 4, 8 for both models (gpt2: LayerNorm, biases, GELU, 12 heads; llama: RMSNorm eps
// 1e-5, RoPE, SwiGLU, 12 / 4 KV heads, no biases; a 256-slot cache): norm+qkv+kv (the norm of the
// residual rows, the QKV product, RoPE for llama, the K/V cache append at per-row positions with row
// M-1 idle (pos -1) when M > 1), attproj+residual, norm+fc+gelu / +swiglu, fcproj+residual,
// norm+lm_head. Checked against the CPU ops in sequence (cpu::layernorm_forward / rmsnorm_forward,
// the normalized rows rounded to floatX as the GPU keeps them, matmul, gelu / swiglu, rope_forward at
// each row's position, kv_cache_append, residual add); the cache starts random and is compared whole
// (the written slots and the untouched ones).
//   0 shipped: gemv_fused_forward, as generate launches it (pdl): on the tensor cores where
//     GemvPolicy::tensor_cores(M, K) takes them (llmc/gemv_mma.cuh), else on the CUDA cores
//   4 the CUDA cores at every M and K   5 the tensor cores at every M and K
//   6, 7 (the residual ops at M = 8) the tensor cores with 8 and 16 warps a tile: more warps in flight
//     where N / 16 tiles leave SMs idle (fcproj, K 2048-3072)
//   2 before the latency work: gemv_fused_forward's kernels under variant 5's policy (an L2 prefetch
//     of the first weight round, no split of K)
//   3 norm+lm_head only: the shipped kernel with the greedy argmax folded in (GemvFusion::argmax, the
//     folded-argmax step), its logits checked as variant 0's and its argmax against the first
//     largest of the first 50257 stored logits of each row (the argmax poisoned before each run)
//   1 unfused: the one-op-a-kernel step's kernels for the same result (norm kernel + gemv_forward
//     [+ rope_forward_at] [+ kv_cache_append]; gemv_forward + fused_residual_*norm_forward, which
//     also writes the next norm: the work the fused kernel leaves to the next GEMV's prologue)
//
// Measured (H200, commit b0218d8, docs/perf.md "Generation"): variant 0 beats cuBLASLt at M = 1, 2, 4
// for GPT-2's qkv, attproj and fc (7.1 vs 7.9 us, 6.4 vs 8.0, 7.7 vs 8.8 at M = 1) and loses at M = 8
// (10.2 vs 8.2 us for qkv); both are latency-bound here (~12% of copy at M = 1).
#include "dev/cuda/harness.cuh"
#include "llmc/cpu/gelu.h"
#include "llmc/cpu/kv_cache.h"
#include "llmc/cpu/layernorm.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/rmsnorm.h"
#include "llmc/cpu/rope.h"
#include "llmc/cpu/swiglu.h"
#include "llmc/gemv.cuh"
#include "llmc/kv_cache.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/matmul.cuh"
#include "llmc/rmsnorm.cuh"
#include "llmc/rope.cuh"

// The lab's policies (GemvPolicy's fields overridden).
template <int R>
struct RowsPolicy : GemvPolicy {  // variants 1-3: R rows a warp
    static constexpr int rows(int) { return R; }
};
struct NoSplitPolicy : GemvPolicy {  // variant 6
    static constexpr int split_k(int) { return 1; }
};
struct PrefetchPolicy : NoSplitPolicy {  // variant 5, and the fused kernels' 2
    static constexpr bool preload = false;
};
struct MmaPolicy : GemvPolicy {  // the fused kernels' 5: the tensor cores at every M and K
    static constexpr bool tensor_cores_rows(int) { return true; }
    static constexpr bool tensor_cores(int, int) { return true; }
};

struct Shape {
    const char* model;
    const char* name;
    int K, N;  // inp (M, K), weight (N, K); SwiGLU: N = 2H
    bool bias;
    GemvEpilogue epi;
};

static void run_shape(lab::Lab& L, const Shape& s, int M) {
    const int K = s.K, N = s.N, NO = s.epi == GEMV_SWIGLU ? N / 2 : N;  // NO: output columns
    const std::string op = lab::Lab::strprintf("gemv %s %s M=%d K=%d N=%d%s%s", s.model, s.name, M, K, N,
                                               s.bias ? " +bias" : "", s.epi == GEMV_GELU ? " +gelu"
                                               : s.epi == GEMV_SWIGLU ? " +swiglu" : "");
    lab::DevBuf<floatX> d_inp((size_t)M * K, "inp"), d_w((size_t)N * K, "weight"), d_bias(N, "bias");
    lab::DevBuf<floatX> d_out((size_t)M * NO, "out"), d_pre((size_t)M * N, "pre");
    const uint64_t seed = 1000 + 17 * (uint64_t)M + (uint64_t)K * 3 + N;
    d_inp.fill_uniform(seed);
    d_w.fill_uniform(seed + 1, -0.05f, 0.05f);
    d_bias.fill_uniform(seed + 2);
    const std::vector<float> inp = d_inp.download(), w = d_w.download(), bias = d_bias.download();
    std::vector<float> pre((size_t)M * N), ref((size_t)M * NO);
    cpu::matmul_forward(pre.data(), inp.data(), w.data(), s.bias ? bias.data() : nullptr, 1, M, K, N);
    if (s.epi == GEMV_GELU) cpu::gelu_forward(ref.data(), pre.data(), ref.size());
    else if (s.epi == GEMV_SWIGLU) cpu::swiglu_forward(ref.data(), pre.data(), M, NO);
    else ref = pre;

    const double X = sizeof(floatX);
    const double bytes = ((double)N * K + (double)M * K + (double)M * NO) * X, flops = 2.0 * M * K * N;
    const floatX* b = s.bias ? d_bias.get() : nullptr;
    auto reset = [&] { d_out.poison(L.stream()); };
    auto check = [&] { return L.check(d_out, ref); };
    L.run(op, 0, "shipped", bytes, flops, lab::Bound::Memory, reset,
          [&] { gemv_forward(d_out, d_inp, d_w, b, M, K, N, s.epi, L.ctx, true); }, check);
    auto policy = [&](int v, const char* what, auto p, bool pdl) {
        L.run(op, v, what, bytes, flops, lab::Bound::Memory, reset, [&] {
            gemv_detail::forward<decltype(p)>(d_out, d_inp, d_w, b, M, K, N, s.epi, L.ctx, pdl);
        }, check);
    };
    if (s.epi != GEMV_SWIGLU) {
        policy(1, "1 row a warp", RowsPolicy<1>{}, false);
        policy(2, "2 rows a warp", RowsPolicy<2>{}, false);
        policy(3, "4 rows a warp", RowsPolicy<4>{}, false);
    }
    if (s.epi != GEMV_SWIGLU && std::is_same<floatX, __nv_bfloat16>::value)  // bf16 operands only
        L.run(op, 7, "tensor cores (mma.sync, 8 warps a tile)", bytes, flops, lab::Bound::Memory, reset, [&] {
            gemv_detail::with_m(M, [&](auto m) {
                constexpr int MM = decltype(m)::value;
                const GemvFusion none{};
                auto launch = s.epi == GEMV_GELU ? gemv_detail::launch_mma<MM, GEMV_GELU, false, 8>
                                                 : gemv_detail::launch_mma<MM, GEMV_PLAIN, false, 8>;
                launch(false, d_out, d_inp, d_w, b, K, N, none, L.ctx);
            });
            cudaCheck(cudaGetLastError());
        }, check);
    policy(5, "before: prefetch, no split", PrefetchPolicy{}, true);
    policy(6, "preload, no split", NoSplitPolicy{}, true);
    const double pre_bytes = s.epi == GEMV_GELU ? (double)M * N * X : s.epi == GEMV_SWIGLU ? 2.0 * M * N * X : 0.0;
    L.run(op, 4, "cuBLASLt", bytes + pre_bytes, flops, lab::Bound::Memory, reset, [&] {
        if (s.epi == GEMV_SWIGLU) {
            matmul_forward(d_pre, nullptr, d_inp, d_w, b, M, K, N, L.ctx);
            swiglu_forward(d_out, d_pre, M, NO, L.stream());
        } else {
            matmul_forward(d_out, s.epi == GEMV_GELU ? d_pre.get() : nullptr, d_inp, d_w, b, M, K, N, L.ctx);
        }
    }, check);
}

// ------------------------------------------------------------------------------------------------
// the fused kernels of the decode step
struct ModelDims {
    const char* name;
    int C, NH, NKV, HD, FC, H, VP;  // FC: the fc matmul's outputs (SwiGLU: 2H)
    bool llama;                     // RMSNorm, RoPE, SwiGLU, no biases; else LayerNorm, GELU, biases
};
enum FusedKind { F_QKV, F_ATTPROJ, F_FC, F_FCPROJ, F_LMHEAD };

static float round_x(float v) { return to_float(from_float<floatX>(v)); }  // as the GPU stores a floatX

static void run_fused(lab::Lab& L, const ModelDims& d, FusedKind kind, int M) {
    const int C = d.C, HD = d.HD, NH = d.NH, NKV = d.NKV, S = 256, QKV = (NH + 2 * NKV) * HD;
    const int K = kind == F_FCPROJ ? d.H : C;
    const int N = kind == F_QKV ? QKV : kind == F_FC ? d.FC : kind == F_LMHEAD ? d.VP : C;
    const bool norm = kind == F_QKV || kind == F_FC || kind == F_LMHEAD, residual = !norm;
    const bool has_bias = !d.llama && kind != F_LMHEAD, rms = d.llama, rope = d.llama && kind == F_QKV;
    const GemvEpilogue epi = kind == F_QKV ? GEMV_QKV : residual ? GEMV_RESIDUAL : kind == F_LMHEAD ? GEMV_PLAIN
                             : d.llama ? GEMV_SWIGLU : GEMV_GELU;
    const int NO = epi == GEMV_SWIGLU ? N / 2 : N;
    const char* names[] = {"norm+qkv+kv", "attproj+residual", d.llama ? "norm+fc+swiglu" : "norm+fc+gelu",
                           "fcproj+residual", "norm+lm_head"};
    const std::string op = lab::Lab::strprintf("gemv-fused %s %s M=%d K=%d N=%d", d.name, names[kind], M, K, N);
    const uint64_t seed = 5000 + 31 * (uint64_t)M + 7 * (uint64_t)kind + (d.llama ? 1 : 0);
    const size_t cache_n = (size_t)M * NKV * S * HD;
    lab::DevBuf<floatX> d_inp((size_t)M * K, "inp"), d_w((size_t)N * K, "weight"), d_bias(N, "bias");
    lab::DevBuf<floatX> d_nw(K, "norm_w"), d_nb(K, "norm_b"), d_res((size_t)M * N, "residual");
    lab::DevBuf<floatX> d_out((size_t)M * NO, "out"), d_k(residual ? 1 : cache_n, "k_cache"),
        d_v(residual ? 1 : cache_n, "v_cache");
    lab::DevBuf<floatX> d_ln((size_t)M * C, "ln"), d_proj((size_t)M * N, "proj");  // the unfused variant's
    lab::DevBuf<float> d_mean(M, "mean"), d_rstd(M, "rstd"), d_cos((size_t)S * HD / 2, "cos"),
        d_sin((size_t)S * HD / 2, "sin");
    lab::DevBuf<int> d_pos(M, "pos");
    d_inp.fill_uniform(seed);
    d_w.fill_uniform(seed + 1, -0.05f, 0.05f);
    d_bias.fill_uniform(seed + 2);
    d_nw.fill_uniform(seed + 3, 0.5f, 1.5f);
    d_nb.fill_uniform(seed + 4, -0.5f, 0.5f);
    d_res.fill_uniform(seed + 5);
    if (!residual) {
        d_k.fill_uniform(seed + 6);
        d_v.fill_uniform(seed + 7);
    }
    std::vector<int> pos(M);
    for (int m = 0; m < M; m++) pos[m] = M > 1 && m == M - 1 ? -1 : (int)((37 * (m + 1) + 3 * kind) % S);
    d_pos.upload(pos);
    std::vector<float> cos((size_t)S * HD / 2), sin((size_t)S * HD / 2);
    cpu::rope_tables(cos.data(), sin.data(), S, HD, 10000.0f);
    d_cos.upload(cos);
    d_sin.upload(sin);
    const std::vector<float> k0 = residual ? std::vector<float>() : d_k.download(),
                             v0 = residual ? std::vector<float>() : d_v.download();

    // the reference, op by op
    const std::vector<float> inp = d_inp.download(), w = d_w.download(), bias = d_bias.download();
    const std::vector<float> nw = d_nw.download(), nb = d_nb.download(), res = d_res.download();
    std::vector<float> x = inp, stats(2 * M), pre((size_t)M * N), ref((size_t)M * NO);
    if (norm) {
        if (rms) cpu::rmsnorm_forward(x.data(), stats.data(), inp.data(), nw.data(), 1, M, K, 1e-5f);
        else cpu::layernorm_forward(x.data(), stats.data(), stats.data() + M, inp.data(), nw.data(), nb.data(), 1, M,
                                    K);
        for (float& v : x) v = round_x(v);
    }
    cpu::matmul_forward(pre.data(), x.data(), w.data(), has_bias ? bias.data() : nullptr, 1, M, K, N);
    std::vector<float> ref_k = k0, ref_v = v0;
    if (epi == GEMV_GELU) cpu::gelu_forward(ref.data(), pre.data(), ref.size());
    else if (epi == GEMV_SWIGLU) cpu::swiglu_forward(ref.data(), pre.data(), M, NO);
    else ref = pre;
    if (residual)
        for (size_t i = 0; i < ref.size(); i++) ref[i] = res[i] + round_x(ref[i]);
    if (kind == F_QKV) {
        for (int m = 0; m < M; m++)
            if (rope && pos[m] >= 0)
                cpu::rope_forward(ref.data() + (size_t)m * N, cos.data(), sin.data(), 1, 1, NH, NKV, HD, pos[m]);
        cpu::kv_cache_append(ref_k.data(), ref_v.data(), ref.data(), pos.data(), M, NH, NKV, HD, S);
    }

    GemvFusion f;
    if (norm) {
        f.norm = rms ? GEMV_NORM_RMS : GEMV_NORM_LAYER;
        f.norm_w = d_nw;
        f.norm_b = rms ? nullptr : d_nb.get();
        f.eps = 1e-5f;
    }
    if (residual) f.residual = d_res;
    if (kind == F_QKV) {
        f.k_cache = d_k;
        f.v_cache = d_v;
        f.pos = d_pos;
        f.rope_cos = rope ? d_cos.get() : nullptr;
        f.rope_sin = rope ? d_sin.get() : nullptr;
        f.NH = NH;
        f.NKV = NKV;
        f.HD = HD;
        f.S = S;
    }
    const double X = sizeof(floatX);
    const double bytes = ((double)N * K + (double)M * K + (double)M * NO * (residual ? 2 : 1) +
                          (kind == F_QKV ? 2.0 * M * NKV * HD : 0.0)) * X;
    const double flops = 2.0 * M * K * N;
    const floatX* b = has_bias ? d_bias.get() : nullptr;
    auto reset = [&] {
        d_out.poison(L.stream());
        if (kind == F_QKV) {
            d_k.upload(k0);
            d_v.upload(v0);
        }
    };
    auto check = [&] {
        bool ok = L.check(d_out, ref);
        if (kind == F_QKV) {
            ok = L.check(d_k, ref_k) && ok;
            ok = L.check(d_v, ref_v) && ok;
        }
        return ok;
    };
    L.run(op, 0, "shipped (fused)", bytes, flops, lab::Bound::Memory, reset,
          [&] { gemv_fused_forward(d_out, d_inp, d_w, b, M, K, N, epi, f, L.ctx, true); }, check);
    L.run(op, 2, "fused, before the latency work", bytes, flops, lab::Bound::Memory, reset,
          [&] { gemv_detail::fused_forward<PrefetchPolicy>(d_out, d_inp, d_w, b, M, K, N, epi, f, L.ctx, true, false); },
          check);
    if (std::is_same<floatX, __nv_bfloat16>::value)
        L.run(op, 4, "fused on the CUDA cores", bytes, flops, lab::Bound::Memory, reset,
              [&] { gemv_fused_forward(d_out, d_inp, d_w, b, M, K, N, epi, f, L.ctx, true, false); }, check);
    if (std::is_same<floatX, __nv_bfloat16>::value)
        L.run(op, 5, "fused on the tensor cores", bytes, flops, lab::Bound::Memory, reset,
              [&] { gemv_detail::fused_forward<MmaPolicy>(d_out, d_inp, d_w, b, M, K, N, epi, f, L.ctx, true, true); },
              check);
    if (residual && M == GEMV_MAX_M && std::is_same<floatX, __nv_bfloat16>::value) {  // 6, 7: more warps a tile
        auto wide = [&](int v, auto warps) {
            constexpr int W = decltype(warps)::value;
            L.run(op, v, lab::Lab::strprintf("fused on the tensor cores, %d warps a tile", W).c_str(), bytes, flops,
                  lab::Bound::Memory, reset, [&] {
                      gemv_detail::launch_mma<GEMV_MAX_M, GEMV_RESIDUAL, false, W>(true, d_out, d_inp, d_w, b, K, N, f,
                                                                                   L.ctx);
                  }, check);
        };
        wide(6, std::integral_constant<int, 8>{});
        wide(7, std::integral_constant<int, 16>{});
    }
    if (kind == F_LMHEAD) {  // the greedy argmax folded in: the first largest of each row's first V stored logits
        const int V = lab::GPT2_V;  // 50257 of 50304: the padded columns never count
        lab::DevBuf<int> d_am(M, "argmax");
        lab::DevBuf<float> d_scratch(gemv_argmax_scratch_floats(M, L.ctx.sm_count), "argmax_scratch");
        d_scratch.upload(std::vector<float>(gemv_argmax_scratch_floats(M, L.ctx.sm_count), 0.0f));
        GemvFusion fa = f;
        fa.argmax = d_am;
        fa.argmax_scratch = d_scratch;
        fa.argmax_cols = V;
        auto reset_am = [&] {
            reset();
            d_am.poison(L.stream());
        };
        auto check_am = [&] {
            bool ok = check();
            const std::vector<float> got = d_out.download(), am = d_am.download();
            for (int m = 0; m < M; m++) {
                int best = -1;
                for (int v = 0; v < V; v++) {
                    const float x = got[(size_t)m * N + v];
                    if (x == x && (best < 0 || x > got[(size_t)m * N + best])) best = v;
                }
                if ((int)am[m] != (best < 0 ? 0 : best)) {
                    printf("FAIL %s: folded argmax of row %d is %d, the stored logits' first largest %d\n", op.c_str(),
                           m, (int)am[m], best);
                    ok = false;
                }
            }
            return ok;
        };
        L.run(op, 3, "shipped + folded greedy argmax", bytes, flops, lab::Bound::Memory, reset_am,
              [&] { gemv_fused_forward(d_out, d_inp, d_w, b, M, K, N, epi, fa, L.ctx, true); }, check_am);
    }
    L.run(op, 1, "unfused kernels", bytes, flops, lab::Bound::Memory, reset, [&] {
        const cudaStream_t st = L.stream();
        const floatX* xin = d_inp;
        if (norm) {
            if (rms) rmsnorm_forward(d_ln, d_rstd, d_inp, d_nw, M, K, 1e-5f, st);
            else layernorm_forward(d_ln, d_mean, d_rstd, d_inp, d_nw, d_nb, M, K, st);
            xin = d_ln;
        }
        const GemvEpilogue e = residual || kind == F_QKV ? GEMV_PLAIN : epi;
        gemv_forward(residual ? d_proj.get() : d_out.get(), xin, d_w, b, M, K, N, e, L.ctx, true);
        if (residual) {  // the unfused step's residual add + the next norm (its output unused here)
            if (rms) fused_residual_rmsnorm_forward(d_out, d_ln, d_rstd, d_res, d_proj, d_nw, M, N, 1e-5f, st);
            else fused_residual_layernorm_forward(d_out, d_ln, d_mean, d_rstd, d_res, d_proj, d_nw, d_nb, M, N, st);
        }
        if (kind == F_QKV) {
            if (rope) rope_forward_at(d_out, d_cos, d_sin, d_pos, M, NH, NKV, HD, st);
            kv_cache_append(d_k, d_v, d_out, d_pos, M, NH, NKV, HD, S, st);
        }
    }, check);
}

int main(int argc, char** argv) {
    bool small = false, fused_only = false;
    std::vector<char*> args;
    for (int i = 0; i < argc; i++) {
        if (std::string(argv[i]) == "--small") small = true;
        else if (std::string(argv[i]) == "--fused-only") fused_only = true;
        else args.push_back(argv[i]);
    }
    lab::Lab L((int)args.size(), args.data(), "gemv.cu");
    const int C = lab::GPT2_C, VP = lab::GPT2_VP;
    std::vector<Shape> shapes;
    if (small) {
        shapes = {{"odd", "fc", 776, 2312, true, GEMV_GELU}, {"odd", "swiglu", 776, 2000, false, GEMV_SWIGLU}};
    } else {
        shapes = {{"gpt2", "qkv", C, 3 * C, true, GEMV_PLAIN},         {"gpt2", "attproj", C, C, true, GEMV_PLAIN},
                  {"gpt2", "fc", C, 4 * C, true, GEMV_GELU},           {"gpt2", "fcproj", 4 * C, C, true, GEMV_PLAIN},
                  {"gpt2", "lm_head", C, VP, false, GEMV_PLAIN},       {"llama", "qkv", C, 20 * 64, false, GEMV_PLAIN},
                  {"llama", "attproj", C, C, false, GEMV_PLAIN},       {"llama", "fc", C, 2 * 2048, false, GEMV_SWIGLU},
                  {"llama", "fcproj", 2048, C, false, GEMV_PLAIN}};
    }
    if (!fused_only)
        for (const Shape& s : shapes)
            for (int M : {1, 2, 4, 8}) run_shape(L, s, M);
    if (!small) {
        const ModelDims models[] = {{"gpt2", C, 12, 12, 64, 4 * C, 4 * C, VP, false},
                                    {"llama", C, 12, 4, 64, 2 * 2048, 2048, VP, true}};
        for (const ModelDims& d : models)
            for (FusedKind k : {F_QKV, F_ATTPROJ, F_FC, F_FCPROJ, F_LMHEAD})
                for (int M : {1, 2, 4, 8}) run_fused(L, d, k, M);
    }
    return L.finish();
}
