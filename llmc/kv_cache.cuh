// kv_cache.cuh: the inference KV cache of one layer and the copies into it: kv_cache_fill writes a
// prompt's keys and values (prefill), kv_cache_append each new token's (decode). The attention that
// reads it is llmc/attention_decode.cuh; the layout and its reasons are in docs/design.md ("KV cache
// and decode attention").
//   k_cache, v_cache  (B, NKV, S, HD) floatX  S slots per (sequence, KV head); position p in slot p % S
//                                             (S = the longest sequence, or S >= W for a sliding
//                                             window W: S = W is a ring buffer of the last W positions)
//   qkv               (B, T, (NH + 2*NKV) * HD) or, for a step, (B, (NH + 2*NKV) * HD): the QKV
//                                             matmul's output (after any rotary embedding), whose K
//                                             and V heads are copied
// Pure copies, 16 bytes a thread; the CPU twins are in llmc/cpu/kv_cache.h.
#pragma once
#include <cfloat>
#include <cstdint>
#include "llmc/attention_layout.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

namespace attention_detail {

// Which cache slots a sequence attends (attention_decode.cuh's kernels and attention_decode_mma.cuh's):
// n keys, the oldest in slot `first`, then first+1, ... (mod S).
struct DecodeSpan {
    int n, first;
};
__host__ __device__ inline DecodeSpan decode_span(int pos, int S, int window) {
    if (pos < 0) return {0, 0};
    const int cap = window > 0 && window < S ? window : S;
    const int n = pos + 1 < cap ? pos + 1 : cap;
    return {n, (pos + 1 - n) % S};
}

// Merges the nsplits partials of (sequence b, head h) (partial s at (b * NH + h) * max_splits + s) into
// out, dims d = first, first + step, ...: out = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s. Loads
// bypass L1 (__ldcg): in the fused combine other blocks wrote the partials during this kernel.
template <typename T>
__device__ __forceinline__ void decode_merge_splits(T* out, const float* part_o, const float* part_ml, int b, int h,
                                                    int NH, int HD, int nsplits, int max_splits, int first, int step) {
    const size_t p0 = (size_t)(b * NH + h) * max_splits;
    float M = -FLT_MAX;
    for (int s = 0; s < nsplits; s++) M = fmaxf(M, __ldcg(part_ml + 2 * (p0 + s)));
    for (int d = first; d < HD; d += step) {
        float o = 0.0f, sum = 0.0f;
        for (int s = 0; s < nsplits; s++) {
            const float f = exp2f(__ldcg(part_ml + 2 * (p0 + s)) - M);
            o += f * __ldcg(part_o + (p0 + s) * HD + d);
            sum += f * __ldcg(part_ml + 2 * (p0 + s) + 1);
        }
        out[(size_t)(b * NH + h) * HD + d] = from_float<T>(o / sum);  // nsplits > 1: keys exist, sum > 0
    }
}

// The sizes every cache user needs (window: the attention's, 0 for the copies).
inline void check_kv_cache_sizes(const char* what, int B, int NH, int NKV, int HD, int S, int window) {
    check_attention_sizes(what, B, 1, NH, NKV, HD, window);
    if (S <= 0) fail("%s: the cache needs at least one slot (S=%d)", what, S);
    if (B > 65535) fail("%s: B=%d sequences exceed the grid's 65535", what, B);
    if (window > S) fail("%s: a window of %d positions needs at least %d cache slots, not %d", what, window, window, S);
}
// The kernels move K, V and q rows in 16-byte pieces.
inline void check_kv_cache_aligned(const char* what, const void* a, const void* b, const void* c) {
    for (const void* p : {a, b, c})
        if ((uintptr_t)p % 16 != 0) fail("%s: qkv, k_cache and v_cache must be 16-byte aligned", what);
}

// Copies each sequence's new K and V rows (NKV heads x HD) from its qkv row into slot pos % S of the
// cache; idle sequences (pos < 0) are skipped. One 16-byte copy a thread: 2 * B * NKV * HD elements.
template <typename T>
static __global__ void kv_cache_append_kernel(T* k_cache, T* v_cache, const T* qkv, const int* pos, QKVLayout L,
                                              int S, int B) {
    constexpr int EPT = 16 / (int)sizeof(T);
    const int per_seq = L.NKV * L.HD / EPT;  // 16-byte pieces of one sequence's K (or V)
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= 2 * B * per_seq) return;
    const int is_v = idx / (B * per_seq), rest = idx % (B * per_seq), b = rest / per_seq, piece = rest % per_seq;
    const int p = pos[b];
    if (p < 0) return;
    const int kvh = piece * EPT / L.HD, d = piece * EPT % L.HD;
    const T* src = qkv + (size_t)b * L.row() + (is_v ? L.v_col(kvh) : L.k_col(kvh)) + d;
    T* dst = (is_v ? v_cache : k_cache) + (((size_t)b * L.NKV + kvh) * S + p % S) * L.HD + d;
    store128(dst, load128(src));
}

// Prefill: token t < lengths[b] of sequence b (its qkv row (b, t)) into slot t % S; only its last S
// tokens are written, so no two threads write one slot. One 16-byte copy a thread.
template <typename T>
static __global__ void kv_cache_fill_kernel(T* k_cache, T* v_cache, const T* qkv, const int* lengths, QKVLayout L,
                                            int S, int B, int Tlen) {
    constexpr int EPT = 16 / (int)sizeof(T);
    const int per_row = L.NKV * L.HD / EPT;  // 16-byte pieces of one token's K (or V)
    const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= 2 * (size_t)B * Tlen * per_row) return;
    const int is_v = (int)(idx / ((size_t)B * Tlen * per_row));
    const size_t rest = idx % ((size_t)B * Tlen * per_row), bt = rest / per_row;
    const int piece = (int)(rest % per_row), b = (int)(bt / Tlen), t = (int)(bt % Tlen);
    const int len = lengths ? lengths[b] : Tlen;
    if (t >= len || t < len - S) return;
    const int kvh = piece * EPT / L.HD, d = piece * EPT % L.HD;
    const T* src = qkv + bt * L.row() + (is_v ? L.v_col(kvh) : L.k_col(kvh)) + d;
    T* dst = (is_v ? v_cache : k_cache) + (((size_t)b * L.NKV + kvh) * S + t % S) * L.HD + d;
    store128(dst, load128(src));
}

}  // namespace attention_detail

// Writes each sequence's new key and value (from its qkv row) into slot pos[b] % S of the layer's cache.
inline void kv_cache_append(floatX* k_cache, floatX* v_cache, const floatX* qkv, const int* pos, int B, int NH,
                            int NKV, int HD, int S, cudaStream_t stream) {
    using namespace attention_detail;
    check_kv_cache_sizes("kv_cache_append", B, NH, NKV, HD, S, 0);
    check_kv_cache_aligned("kv_cache_append", qkv, k_cache, v_cache);
    const int pieces = 2 * B * NKV * HD / (16 / (int)sizeof(floatX));
    kv_cache_append_kernel<<<ceil_div(pieces, 256), 256, 0, stream>>>(k_cache, v_cache, qkv, pos,
                                                                      QKVLayout{NH, NKV, HD}, S, B);
    cudaCheckLaunch();
}

// Prefill: the keys and values of the prompt qkv (B, T, (NH+2*NKV)*HD) into the layer's cache, token t
// of sequence b into slot t % S for t < lengths[b] (a device array of values <= T; nullptr: T; the rest
// is padding), only each sequence's last S tokens.
inline void kv_cache_fill(floatX* k_cache, floatX* v_cache, const floatX* qkv, const int* lengths, int B, int T,
                          int NH, int NKV, int HD, int S, cudaStream_t stream) {
    using namespace attention_detail;
    check_kv_cache_sizes("kv_cache_fill", B, NH, NKV, HD, S, 0);
    check_kv_cache_aligned("kv_cache_fill", qkv, k_cache, v_cache);
    if (T <= 0) fail("kv_cache_fill: T=%d tokens", T);
    const size_t pieces = 2 * (size_t)B * T * NKV * HD / (16 / sizeof(floatX));
    kv_cache_fill_kernel<<<(unsigned)ceil_div<size_t>(pieces, 256), 256, 0, stream>>>(
        k_cache, v_cache, qkv, lengths, QKVLayout{NH, NKV, HD}, S, B, T);
    cudaCheckLaunch();
}
