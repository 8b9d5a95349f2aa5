// kv_cache.h: the inference KV cache of one layer on the CPU and the copies into it, the twins of
// llmc/kv_cache.cuh (same layout and arguments; docs/design.md, "KV cache and decode attention"):
//   k_cache, v_cache  (B, NKV, S, HD)  position p of a sequence in slot p % S
//   kv_cache_fill     a prompt qkv (B, T, (NH+2*NKV)*HD): token t < lengths[b] (nullptr: T) of
//                     sequence b into slot t % S, only each sequence's last S tokens
//   kv_cache_append   a step's qkv (B, (NH+2*NKV)*HD): each sequence's new K and V into slot
//                     pos[b] % S; pos[b] < 0 (an idle sequence) writes nothing
#pragma once
#include <cstddef>
#include "llmc/utils.h"

namespace cpu {

inline void kv_cache_check(const char* what, int NH, int NKV, int HD, int S, int window) {
    if (NH <= 0 || NKV <= 0 || HD <= 0 || NH % NKV != 0)
        fail("%s: num_heads %d must be a positive multiple of num_kv_heads %d (head dim %d)", what, NH, NKV, HD);
    if (S <= 0 || window < 0 || window > S)
        fail("%s: %d cache slots cannot hold a window of %d positions", what, S, window);
}

inline void kv_cache_append(float* k_cache, float* v_cache, const float* qkv, const int* pos, int B, int NH, int NKV,
                            int HD, int S) {
    kv_cache_check("kv_cache_append", NH, NKV, HD, S, 0);
    const size_t QKV = (size_t)(NH + 2 * NKV) * HD, C = (size_t)NH * HD;
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0) continue;
        for (int kvh = 0; kvh < NKV; kvh++) {
            const size_t dst = (((size_t)b * NKV + kvh) * S + pos[b] % S) * HD;
            const float* row = qkv + (size_t)b * QKV;
            for (int d = 0; d < HD; d++) {
                k_cache[dst + d] = row[C + (size_t)kvh * HD + d];
                v_cache[dst + d] = row[C + (size_t)(NKV + kvh) * HD + d];
            }
        }
    }
}

inline void kv_cache_fill(float* k_cache, float* v_cache, const float* qkv, const int* lengths, int B, int T, int NH,
                          int NKV, int HD, int S) {
    kv_cache_check("kv_cache_fill", NH, NKV, HD, S, 0);
    const size_t QKV = (size_t)(NH + 2 * NKV) * HD, C = (size_t)NH * HD;
    for (int b = 0; b < B; b++) {
        const int len = lengths ? lengths[b] : T;
        for (int t = len > S ? len - S : 0; t < len && t < T; t++) {
            const float* row = qkv + ((size_t)b * T + t) * QKV;
            for (int kvh = 0; kvh < NKV; kvh++) {
                const size_t dst = (((size_t)b * NKV + kvh) * S + t % S) * HD;
                for (int d = 0; d < HD; d++) {
                    k_cache[dst + d] = row[C + (size_t)kvh * HD + d];
                    v_cache[dst + d] = row[C + (size_t)(NKV + kvh) * HD + d];
                }
            }
        }
    }
}

}  // namespace cpu
