// attention.h: causal multi-head self-attention on the CPU, straight from the fused QKV projection.
// Shapes: qkv (B, T, (NH + 2*NKV) * HD), per position all NH query heads, then NKV key heads, then
//   NKV value heads, HD channels each (docs/design.md); out (B, T, NH*HD); lse (B, NH, T) fp32, the
//   log-sum-exp of each query row's scaled scores, from which the backward rebuilds the probabilities.
// Query head h attends with key/value head h / (NH / NKV). window = 0 is full causal attention;
// window = W > 0 lets query t see keys max(0, t-W+1) .. t. Scores are scaled by 1/sqrt(HD).
// Document masking: doc_start (B, T) int32 holds for each position the first position of its document
// within its row (doc_starts below), and key j is visible to query t iff doc_start[t] <= j <= t (and
// j > t - W with a window): a block-diagonal causal mask. doc_start nullptr: each row is one sequence
// (the same bits as a doc_start of zeros).
// attention_forward writes (=) out and lse. attention_backward WRITES (=) dqkv, like the GPU
// launcher it is the reference for. fp32; results do not depend on the thread count. The head-dim
// loops are `omp simd`: without it the compiler cannot rule out that dq, dk and dv overlap.
#pragma once
#include <cmath>
#include <cstddef>
#include <vector>
#include "llmc/utils.h"

namespace cpu {

inline void attention_check_shape(int NH, int NKV, int HD, int window) {
    if (NH <= 0 || NKV <= 0 || HD <= 0 || NH % NKV != 0)
        fail("attention: num_heads %d must be a positive multiple of num_kv_heads %d (head dim %d)", NH, NKV, HD);
    if (window < 0) fail("attention: window %d must be >= 0", window);
}

// doc_start[b,t] = the last position p <= t of row b with tokens[b,p] == doc_token, or 0 where the row
// has none up to t (the row starts inside a document): the token at a document token's position is
// the new document's first. tokens, doc_start (B, T).
inline void doc_starts(int* doc_start, const int* tokens, int B, int T, int doc_token) {
    for (int b = 0; b < B; b++) {
        int start = 0;
        for (int t = 0; t < T; t++) {
            if (tokens[(size_t)b * T + t] == doc_token) start = t;
            doc_start[(size_t)b * T + t] = start;
        }
    }
}

namespace detail {
// The first key query t of row b sees: the window's and the document's bounds.
inline int attention_first_key(int b, int t, int T, int window, const int* doc_start) {
    const int lo = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
    const int doc = doc_start ? doc_start[(size_t)b * T + t] : 0;
    return doc > lo ? doc : lo;
}
}  // namespace detail

inline void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int NKV, int HD,
                              int window = 0, const int* doc_start = nullptr) {
    attention_check_shape(NH, NKV, HD, window);
    for (size_t i = 0; doc_start && i < (size_t)B * T; i++)
        if (doc_start[i] < 0 || doc_start[i] > (int)(i % T))
            fail("attention: doc_start %d at position %zu of the batch is outside [0, t]", doc_start[i], i);
    const size_t QKV = (size_t)(NH + 2 * NKV) * HD, C = (size_t)NH * HD;
    const int group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel
    {
        std::vector<float> score(T);
#pragma omp for collapse(3) schedule(dynamic, 16)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int t = 0; t < T; t++) {
                    const float* q = qkv + ((size_t)b * T + t) * QKV + (size_t)h * HD;
                    const size_t k_off = C + (size_t)(h / group) * HD, v_off = k_off + (size_t)NKV * HD;
                    const int lo = detail::attention_first_key(b, t, T, window, doc_start);
                    float maxs = -INFINITY;
                    for (int t2 = lo; t2 <= t; t2++) {
                        const float* k = qkv + ((size_t)b * T + t2) * QKV + k_off;
                        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                        for (int d = 0; d < HD; d++) dot += q[d] * k[d];
                        score[t2] = dot * scale;
                        if (score[t2] > maxs) maxs = score[t2];
                    }
                    float sum = 0.0f;
                    for (int t2 = lo; t2 <= t; t2++) {
                        score[t2] = expf(score[t2] - maxs);
                        sum += score[t2];
                    }
                    const float inv = 1.0f / sum;
                    float* o = out + ((size_t)b * T + t) * C + (size_t)h * HD;
                    for (int d = 0; d < HD; d++) o[d] = 0.0f;
                    for (int t2 = lo; t2 <= t; t2++) {
                        const float* v = qkv + ((size_t)b * T + t2) * QKV + v_off;
                        const float p = score[t2] * inv;
#pragma omp simd
                        for (int d = 0; d < HD; d++) o[d] += p * v[d];
                    }
                    lse[((size_t)b * NH + h) * T + t] = maxs + logf(sum);
                }
            }
        }
    }
}

// With P = exp(S - lse) the probabilities, dP = dout V^T and D_t = sum_d dout[t,d] out[t,d]:
//   dS = P * (dP - D),  dQ = dS K / sqrt(HD),  dK = dS^T Q / sqrt(HD),  dV = P^T dout.
// One task per (batch, key/value head) owns that head's dK, dV and the dQ of its query heads,
// so no two threads write the same element.
inline void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                               int B, int T, int NH, int NKV, int HD, int window = 0,
                               const int* doc_start = nullptr) {
    attention_check_shape(NH, NKV, HD, window);
    const size_t QKV = (size_t)(NH + 2 * NKV) * HD, C = (size_t)NH * HD;
    const int group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int kvh = 0; kvh < NKV; kvh++) {
            const size_t k_off = C + (size_t)kvh * HD, v_off = k_off + (size_t)NKV * HD;
            for (int t = 0; t < T; t++) {
                float* row = dqkv + ((size_t)b * T + t) * QKV;
                for (int d = 0; d < group * HD; d++) row[(size_t)kvh * group * HD + d] = 0.0f;
                for (int d = 0; d < HD; d++) row[k_off + d] = row[v_off + d] = 0.0f;
            }
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int t = 0; t < T; t++) {
                    const size_t row_t = ((size_t)b * T + t) * QKV;
                    const float* q = qkv + row_t + (size_t)h * HD;
                    float* dq = dqkv + row_t + (size_t)h * HD;
                    const float* o = out + ((size_t)b * T + t) * C + (size_t)h * HD;
                    const float* dout_t = dout + ((size_t)b * T + t) * C + (size_t)h * HD;
                    const float lse_t = lse[((size_t)b * NH + h) * T + t];
                    float D = 0.0f;
#pragma omp simd reduction(+ : D)
                    for (int d = 0; d < HD; d++) D += dout_t[d] * o[d];
                    const int lo = detail::attention_first_key(b, t, T, window, doc_start);
                    for (int t2 = lo; t2 <= t; t2++) {
                        const size_t row_t2 = ((size_t)b * T + t2) * QKV;
                        const float* k = qkv + row_t2 + k_off;
                        const float* v = qkv + row_t2 + v_off;
                        float* dk = dqkv + row_t2 + k_off;
                        float* dv = dqkv + row_t2 + v_off;
                        float s = 0.0f, dp = 0.0f;
#pragma omp simd reduction(+ : s, dp)
                        for (int d = 0; d < HD; d++) {
                            s += q[d] * k[d];
                            dp += dout_t[d] * v[d];
                        }
                        const float p = expf(s * scale - lse_t);
                        const float ds = p * (dp - D) * scale;
#pragma omp simd  // dq, dk, dv are different heads' slices of dqkv: no overlap
                        for (int d = 0; d < HD; d++) {
                            dq[d] += ds * k[d];
                            dk[d] += ds * q[d];
                            dv[d] += p * dout_t[d];
                        }
                    }
                }
            }
        }
    }
}

}  // namespace cpu
