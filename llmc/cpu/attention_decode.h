// attention_decode.h: attention of one new token per sequence against a KV cache, on the CPU: the
// reference for llmc/attention_decode.cuh (same layout, same arguments) and the CPU generate's op.
// Shapes (docs/design.md, "KV cache and decode attention"):
//   qkv      (B, (NH + 2*NKV) * HD)  this step's token per sequence (cpu/attention.h's qkv row layout)
//   k_cache  (B, NKV, S, HD)         one layer's keys, this step's included (cpu/kv_cache.h); p in slot p % S
//   v_cache  (B, NKV, S, HD)         its values
//   pos      (B)                     each sequence's new-token position; < 0: an idle sequence
//   out      (B, NH * HD)            written (=); zeros for an idle sequence
// Attends to positions 0..pos (window = 0; needs pos < S) or max(0, pos-W+1)..pos (window W > 0; needs
// S >= W, S = W is a ring buffer). Query head h reads KV head h / (NH / NKV); scale 1/sqrt(HD). fp32;
// the result does not depend on the thread count.
#pragma once
#include <cmath>
#include <cstddef>
#include <vector>
#include "llmc/cpu/kv_cache.h"
#include "llmc/utils.h"

namespace cpu {

inline void attention_decode(float* out, const float* qkv, const float* k_cache, const float* v_cache, const int* pos,
                             int B, int NH, int NKV, int HD, int S, int window = 0) {
    kv_cache_check("attention_decode", NH, NKV, HD, S, window);
    for (int b = 0; b < B; b++)
        if (window == 0 && pos[b] >= S)
            fail("attention_decode: sequence %d is at position %d, past the %d positions of its cache", b, pos[b], S);
    const size_t QKV = (size_t)(NH + 2 * NKV) * HD;
    const int group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel
    {
        std::vector<float> score(S);
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                float* o = out + ((size_t)b * NH + h) * HD;
                for (int d = 0; d < HD; d++) o[d] = 0.0f;
                const int p = pos[b];
                if (p < 0) continue;
                const int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
                const float* q = qkv + (size_t)b * QKV + (size_t)h * HD;
                const size_t head = ((size_t)b * NKV + h / group) * S;
                float maxs = -INFINITY;
                for (int t = lo; t <= p; t++) {
                    const float* k = k_cache + (head + t % S) * HD;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int d = 0; d < HD; d++) dot += q[d] * k[d];
                    score[t - lo] = dot * scale;
                    if (score[t - lo] > maxs) maxs = score[t - lo];
                }
                float sum = 0.0f;
                for (int t = lo; t <= p; t++) {
                    score[t - lo] = expf(score[t - lo] - maxs);
                    sum += score[t - lo];
                }
                const float inv = 1.0f / sum;
                for (int t = lo; t <= p; t++) {
                    const float* v = v_cache + (head + t % S) * HD;
                    const float w = score[t - lo] * inv;
#pragma omp simd
                    for (int d = 0; d < HD; d++) o[d] += w * v[d];
                }
            }
        }
    }
}

}  // namespace cpu
