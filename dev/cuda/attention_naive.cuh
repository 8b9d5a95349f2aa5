// attention_naive.cuh: the first step of the attention labs' progression (naive -> tiled -> tensor
// cores -> Hopper), lab-only: the CPU reference's loops moved onto the GPU, one thread per query row
// (forward, dQ) or key row (dK/dV), every operand read straight from global memory, no shared memory,
// no tiling, fp32 math. It shows what the later steps buy: each K/V row is re-read from L2 by every
// query thread of its head, so it runs at a few TFLOP/s. Same interface and semantics as
// llmc/attention.cuh (qkv (B, T, (NH + 2*NKV) * HD), out (B, T, NH*HD), lse (B, NH, T), dqkv written
// with `=`, GQA, causal with an optional window, AttnShape::doc_start's document mask); HD 64 or 128.
// The document rule is written here from its contract (key j visible to query t iff doc_start[t] <= j),
// not taken from the kernels under test: no tile bounds, no doc_query_end.
#pragma once
#include "llmc/attention.cuh"

namespace attention_naive {
using attention_detail::attends;
using attention_detail::QKVLayout;
constexpr int THREADS = 128;

// grid (ceil(T / THREADS), NH, B): thread t of the sequence owns query row t of head h.
// Online softmax over the visible keys, the output row accumulated in HD fp32 registers.
// The first key query t of row b sees: its window's and its document's (doc_start (B, T) or null).
__device__ __forceinline__ int first_key(const int* doc_start, int b, int t, int T, int window) {
    const int lo = window > 0 ? max(0, t - window + 1) : 0;
    return doc_start ? max(lo, doc_start[(size_t)b * T + t]) : lo;
}

template <int HD>
__global__ void forward(floatX* out, float* lse, const floatX* qkv, const int* doc_start, int T, QKVLayout L,
                        int window) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
    if (t >= T) return;
    const int kvh = h / (L.NH / L.NKV), stride = L.row();
    const floatX* seq = qkv + (size_t)b * T * stride;
    const floatX* q = seq + (size_t)t * stride + L.q_col(h);
    const float scale = rsqrtf((float)HD);
    float acc[HD], m = -INFINITY, l = 0.0f;
    for (int d = 0; d < HD; d++) acc[d] = 0.0f;
    for (int j = first_key(doc_start, b, t, T, window); j <= t; j++) {
        const floatX* k = seq + (size_t)j * stride + L.k_col(kvh);
        const floatX* v = seq + (size_t)j * stride + L.v_col(kvh);
        float s = 0.0f;
        for (int d = 0; d < HD; d++) s += to_float(q[d]) * to_float(k[d]);
        s *= scale;
        const float m_new = fmaxf(m, s), corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
        for (int d = 0; d < HD; d++) acc[d] = acc[d] * corr + p * to_float(v[d]);
        m = m_new;
    }
    floatX* o = out + ((size_t)b * T + t) * L.NH * HD + h * HD;
    for (int d = 0; d < HD; d++) o[d] = from_float<floatX>(acc[d] / l);
    lse[((size_t)b * L.NH + h) * T + t] = m + logf(l);
}

// grid (ceil(T / THREADS), NH, B): dQ of query row t; D_t = dO_t . O_t, dS = P (dP - D).
template <int HD>
__global__ void backward_dq(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                            const int* doc_start, int T, QKVLayout L, int window) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
    if (t >= T) return;
    const int kvh = h / (L.NH / L.NKV), stride = L.row(), C = L.NH * HD;
    const floatX* seq = qkv + (size_t)b * T * stride;
    const floatX* q = seq + (size_t)t * stride + L.q_col(h);
    const floatX* dO = dout + ((size_t)b * T + t) * C + h * HD;
    const floatX* O = out + ((size_t)b * T + t) * C + h * HD;
    const float scale = rsqrtf((float)HD), lse_t = lse[((size_t)b * L.NH + h) * T + t];
    float D = 0.0f, dq[HD];
    for (int d = 0; d < HD; d++) D += to_float(dO[d]) * to_float(O[d]), dq[d] = 0.0f;
    for (int j = first_key(doc_start, b, t, T, window); j <= t; j++) {
        const floatX* k = seq + (size_t)j * stride + L.k_col(kvh);
        const floatX* v = seq + (size_t)j * stride + L.v_col(kvh);
        float s = 0.0f, dp = 0.0f;
        for (int d = 0; d < HD; d++) s += to_float(q[d]) * to_float(k[d]), dp += to_float(dO[d]) * to_float(v[d]);
        const float ds = expf(s * scale - lse_t) * (dp - D);
        for (int d = 0; d < HD; d++) dq[d] += ds * to_float(k[d]);
    }
    floatX* dst = dqkv + ((size_t)b * T + t) * stride + L.q_col(h);
    for (int d = 0; d < HD; d++) dst[d] = from_float<floatX>(dq[d] * scale);
}

// grid (ceil(T / THREADS), NKV, B): dK and dV of key row j of KV head kvh, summed over the query heads
// of its group and every query that sees it (D recomputed per query: naive on purpose).
template <int HD>
__global__ void backward_dkdv(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                              const int* doc_start, int T, QKVLayout L, int window) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    if (j >= T) return;
    const int group = L.NH / L.NKV, stride = L.row(), C = L.NH * HD;
    const floatX* seq = qkv + (size_t)b * T * stride;
    const floatX* k = seq + (size_t)j * stride + L.k_col(kvh);
    const floatX* v = seq + (size_t)j * stride + L.v_col(kvh);
    const float scale = rsqrtf((float)HD);
    float dk[HD], dv[HD];
    for (int d = 0; d < HD; d++) dk[d] = 0.0f, dv[d] = 0.0f;
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
        for (int t = j; t < T; t++) {
            if (!attends(t, j, window)) break;  // past the window every later query is too
            if (first_key(doc_start, b, t, T, window) > j) continue;  // j is before query t's document
            const floatX* q = seq + (size_t)t * stride + L.q_col(h);
            const floatX* dO = dout + ((size_t)b * T + t) * C + h * HD;
            const floatX* O = out + ((size_t)b * T + t) * C + h * HD;
            float s = 0.0f, dp = 0.0f, D = 0.0f;
            for (int d = 0; d < HD; d++) {
                s += to_float(q[d]) * to_float(k[d]);
                dp += to_float(dO[d]) * to_float(v[d]);
                D += to_float(dO[d]) * to_float(O[d]);
            }
            const float p = expf(s * scale - lse[((size_t)b * L.NH + h) * T + t]), ds = p * (dp - D);
            for (int d = 0; d < HD; d++) dv[d] += p * to_float(dO[d]), dk[d] += ds * to_float(q[d]);
        }
    floatX* dst = dqkv + ((size_t)b * T + j) * stride;
    for (int d = 0; d < HD; d++) {
        dst[L.k_col(kvh) + d] = from_float<floatX>(dk[d] * scale);
        dst[L.v_col(kvh) + d] = from_float<floatX>(dv[d]);
    }
}
}  // namespace attention_naive

inline void attention_forward_naive(floatX* out, float* lse, const floatX* qkv, const AttnShape& s,
                                    const CudaContext& ctx) {
    using namespace attention_naive;
    attention_detail::check_attention_sizes("attention_forward_naive", s);
    const QKVLayout L = attention_detail::qkv_layout(s);
    const dim3 grid(ceil_div(s.T, THREADS), s.NH, s.B);
    if (s.HD == 64) forward<64><<<grid, THREADS, 0, ctx.stream>>>(out, lse, qkv, s.doc_start, s.T, L, s.window);
    else forward<128><<<grid, THREADS, 0, ctx.stream>>>(out, lse, qkv, s.doc_start, s.T, L, s.window);
    cudaCheckLaunch();
}

inline void attention_backward_naive(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                     const float* lse, const AttnShape& s, const CudaContext& ctx) {
    using namespace attention_naive;
    attention_detail::check_attention_sizes("attention_backward_naive", s);
    const QKVLayout L = attention_detail::qkv_layout(s);
    const int T = s.T, W = s.window;
    const dim3 grid_q(ceil_div(T, THREADS), s.NH, s.B), grid_kv(ceil_div(T, THREADS), s.NKV, s.B);
    cudaStream_t st = ctx.stream;
    if (s.HD == 64) {
        backward_dq<64><<<grid_q, THREADS, 0, st>>>(dqkv, dout, qkv, out, lse, s.doc_start, T, L, W);
        cudaCheckLaunch();
        backward_dkdv<64><<<grid_kv, THREADS, 0, st>>>(dqkv, dout, qkv, out, lse, s.doc_start, T, L, W);
    } else {
        backward_dq<128><<<grid_q, THREADS, 0, st>>>(dqkv, dout, qkv, out, lse, s.doc_start, T, L, W);
        cudaCheckLaunch();
        backward_dkdv<128><<<grid_kv, THREADS, 0, st>>>(dqkv, dout, qkv, out, lse, s.doc_start, T, L, W);
    }
    cudaCheckLaunch();
}
