// attention_forward.cuh: the forward half of llmc/attention.cuh (shapes, precision and the three
// implementations are described there): attention_forward and its simple, mma.sync and Hopper
// kernels, without any backward kernel. Inference includes this header; training includes
// llmc/attention.cuh, which includes it and adds the backward.
#pragma once
#include <cmath>
#include <type_traits>
#include "llmc/attention_layout.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

namespace attention_detail {

// ============================================================================ simple kernels
// Mapping: SIMPLE_TPR threads own one query row (forward, dQ) or one key row (dK/dV); thread `part`
// holds dims part, part+4, part+8, ... so the four threads of a row read four consecutive smem words
// (no bank conflict). The other operand streams through shared memory SIMPLE_TILE rows at a time, one
// smem load per FMA: bound by the load/store pipe at ~12 TFLOP/s forward, ~10 backward on the H200.
constexpr int SIMPLE_TPR = 4;
constexpr int SIMPLE_ROWS = 64;  // rows owned per block: 256 threads
constexpr int SIMPLE_TILE = 32;  // rows of the streamed operand per smem tile
constexpr int SIMPLE_THREADS = SIMPLE_ROWS * SIMPLE_TPR;

__device__ __forceinline__ float sum_over_row_threads(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

// Copies rows [row0, row0 + SIMPLE_TILE) of one head (HD columns at `col`) into fp32 smem, zeros past T.
template <int HD>
__device__ void simple_load_tile(float (*dst)[HD], const floatX* src, int row0, int T, int stride, int col) {
    for (int idx = threadIdx.x; idx < SIMPLE_TILE * HD; idx += blockDim.x) {
        int r = idx / HD, d = idx % HD, row = row0 + r;
        dst[r][d] = row < T ? to_float(src[(size_t)row * stride + col + d]) : 0.0f;
    }
}

// grid (ceil(T / SIMPLE_ROWS), NH, B), SIMPLE_THREADS threads. DOC: doc_start (B, T) masks keys before
// each query's document (attention_layout.cuh); DOC false is the unmasked kernel, doc_start unread.
template <int HD, bool DOC>
__global__ void __launch_bounds__(SIMPLE_THREADS) attention_forward_simple(floatX* out, float* lse, const floatX* qkv,
                                                                         const int* doc_start, int T, QKVLayout L,
                                                                         int window) {
    constexpr int DPT = HD / SIMPLE_TPR;
    __shared__ float sK[SIMPLE_TILE][HD], sV[SIMPLE_TILE][HD];
    const int tile = gridDim.x - 1 - blockIdx.x;  // longest rows first: the causal work is a triangle
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (L.NH / L.NKV);
    const int part = threadIdx.x % SIMPLE_TPR;
    const int i = tile * SIMPLE_ROWS + threadIdx.x / SIMPLE_TPR;  // this row's query
    const int stride = L.row();
    const floatX* seq = qkv + (size_t)b * T * stride;
    const float scale = rsqrtf((float)HD);

    float q[DPT], o[DPT];
    const floatX* qrow = seq + (size_t)min(i, T - 1) * stride + L.q_col(h);
    for (int d = 0; d < DPT; d++) q[d] = to_float(qrow[part + SIMPLE_TPR * d]) * scale, o[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;  // running max and sum of exp(score - m)

    const int first = tile * SIMPLE_ROWS, last = min(first + SIMPLE_ROWS, T) - 1;
    int k_begin = window > 0 ? max(0, first - window + 1) / SIMPLE_TILE * SIMPLE_TILE : 0;
    // the block's lowest document start is its first row's (doc_start is nondecreasing)
    const int* row_start = DOC ? doc_start + (size_t)b * T : nullptr;
    const int ds = DOC ? row_start[min(i, T - 1)] : 0;
    if (DOC) k_begin = max(k_begin, row_start[first] / SIMPLE_TILE * SIMPLE_TILE);
    for (int k0 = k_begin; k0 <= last; k0 += SIMPLE_TILE) {
        __syncthreads();  // the previous tile is consumed
        simple_load_tile<HD>(sK, seq, k0, T, stride, L.k_col(kvh));
        simple_load_tile<HD>(sV, seq, k0, T, stride, L.v_col(kvh));
        __syncthreads();
        float s[SIMPLE_TILE], m_new = m;
#pragma unroll
        for (int j = 0; j < SIMPLE_TILE; j++) {
            float dot = 0.0f;
            for (int d = 0; d < DPT; d++) dot += q[d] * sK[j][part + SIMPLE_TPR * d];
            dot = sum_over_row_threads(dot);
            s[j] = attends(i, k0 + j, window) && (!DOC || k0 + j >= ds) ? dot : -INFINITY;
            m_new = fmaxf(m_new, s[j]);
        }
        if (m_new == -INFINITY) continue;  // nothing visible yet in this tile for this row
        const float corr = expf(m - m_new);  // 0 on the first visible tile (m = -inf)
        l *= corr;
        for (int d = 0; d < DPT; d++) o[d] *= corr;
#pragma unroll
        for (int j = 0; j < SIMPLE_TILE; j++) {
            const float p = expf(s[j] - m_new);
            l += p;
            for (int d = 0; d < DPT; d++) o[d] += p * sV[j][part + SIMPLE_TPR * d];
        }
        m = m_new;
    }
    if (i >= T) return;
    floatX* orow = out + ((size_t)b * T + i) * L.NH * HD + h * HD;
    for (int d = 0; d < DPT; d++) orow[part + SIMPLE_TPR * d] = from_float<floatX>(o[d] / l);
    if (part == 0) lse[((size_t)b * L.NH + h) * T + i] = m + logf(l);
}

}  // namespace attention_detail

// The simple kernels on their own: the FP32 build's path, and a baseline in dev/cuda.
inline void attention_forward_simple(floatX* out, float* lse, const floatX* qkv, const AttnShape& s,
                                     const CudaContext& ctx) {
    using namespace attention_detail;
    check_attention_sizes("attention_forward", s);
    const QKVLayout L = qkv_layout(s);
    const dim3 grid(ceil_div(s.T, SIMPLE_ROWS), s.NH, s.B);
    auto kernel = s.doc_start ? (s.HD == 64 ? attention_forward_simple<64, true> : attention_forward_simple<128, true>)
                              : (s.HD == 64 ? attention_forward_simple<64, false> : attention_forward_simple<128, false>);
    kernel<<<grid, SIMPLE_THREADS, 0, ctx.stream>>>(out, lse, qkv, s.doc_start, s.T, L, s.window);
    cudaCheckLaunch();
}

// ============================================================================ tensor-core kernels
#include "llmc/attention_mma_forward.cuh"  // mma.sync, bf16 only: design and tile budget in attention_mma.cuh
#include "llmc/attention_hopper.cuh"       // sm_90a: wgmma, TMA, warp specialization

// FlashAttention-2 on tensor cores; bf16 tensors, HD 64 or 128, every pointer 16-byte aligned.
inline void attention_forward_flash(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, const AttnShape& s,
                                    const CudaContext& ctx) {
    using namespace attention_detail;
    check_attention_sizes("attention_forward", s);
    if (!aligned16(out) || !aligned16(qkv)) fail("attention_forward: out and qkv must be 16-byte aligned");
    if (s.HD == 64) forward_flash<FwdCfg<64>>(out, lse, qkv, s, ctx);
    else forward_flash<FwdCfg<128>>(out, lse, qkv, s, ctx);
}

// ============================================================================ the launchers
// bf16 build: the Hopper kernels (sm_90a builds on an sm_90 GPU) or the mma.sync kernels, the
// deterministic backward always on mma.sync; FP32 build: the simple kernels (tensor cores take no fp32).
// Document masking (s.doc_start) routes the same way, through each kernel's DOC instantiation; where
// the Hopper backward does not run, the backward is the deterministic mma.sync pair (the single pass
// has no document mask). No FP8 copies with it.
// Whether attention_forward can also write the FP8 copies of its output (AttnFp8Out) at this shape: the
// Hopper kernel (sm_90a build and GPU), T a multiple of 16.
inline bool attention_forward_fp8_available(const AttnShape& s, const CudaContext& ctx) {
#if defined(PRECISION_FP32)
    (void)s, (void)ctx;
    return false;
#else
    return attention_hopper_available(ctx) && s.T % 16 == 0 && !s.doc_start;
#endif
}
// out (B, T, NH * HD) and lse (B, NH, T) written with `=` from qkv; on ctx.stream. f8: also the FP8
// copies of out (only where attention_forward_fp8_available).
inline void attention_forward(floatX* out, float* lse, const floatX* qkv, const AttnShape& s, const CudaContext& ctx,
                              const AttnFp8Out* f8 = nullptr) {
    if (f8 && !attention_forward_fp8_available(s, ctx))
        fail("attention_forward: FP8 copies of the output need the Hopper kernel and T (%d) a multiple of 16", s.T);
#if defined(PRECISION_FP32)
    attention_forward_simple(out, lse, qkv, s, ctx);
#else
    if (attention_hopper_available(ctx)) attention_forward_hopper(out, lse, qkv, s, ctx, f8);
    else attention_forward_flash(out, lse, qkv, s, ctx);
#endif
}
