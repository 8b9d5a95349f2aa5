// attention_layout.cuh: what every attention implementation shares: the shape of a call (AttnShape),
// where a head's columns sit in a token row of qkv/dqkv (QKVLayout), the causal/sliding-window mask
// (attends), the size checks, where an FP8 copy of the forward's output goes (AttnFp8Out), and the
// rounding of dQ out of the single-pass backwards' fp32 accumulator (dq_from_accum).
// The shapes and conventions are described at the top of llmc/attention.cuh.
#pragma once
#include <cstdint>
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

// One attention call's shape, the one size argument of every attention entry point: B sequences of T
// tokens, NH query heads sharing NKV key/value heads (NKV divides NH), HD channels a head, and the
// sliding window (query t sees keys t-window+1..t; 0: every key <= t).
// doc_start (B, T) int32 on the device, or nullptr: document masking (llmc/cpu/attention.h's contract):
// doc_start[b, t] = the last position <= t of row b holding the document token, else 0 (nondecreasing
// along a row); key j is visible to query t iff doc_start[t] <= j (and the causal/window rule). Every
// kernel family takes it (a DOC instantiation each); the Hopper backward wants it 16-byte aligned.
struct AttnShape {
    int B, T, NH, NKV, HD;
    int window = 0;
    const int* doc_start = nullptr;
};

// An FP8 copy of the forward's output, written by the Hopper forward's epilogue beside the bf16 one
// (--fp8's attproj X under delayed scaling, llmc/model_fp8.cuh): x = e4m3(out * scale) and xt its
// transpose, amax_bits raised to max |out| (float bits), as fp8_cast_transpose of out would write them.
struct AttnFp8Out {
    uint8_t* x = nullptr;               // (rows, NH * HD)
    uint8_t* xt = nullptr;              // (NH * HD, rows)
    const float* scale = nullptr;       // device
    unsigned int* amax_bits = nullptr;  // device
    int rows = 0;                       // B * T
};

namespace attention_detail {

// Token-row stride of qkv/dqkv and the column where each head starts inside a token row.
struct QKVLayout {
    int NH, NKV, HD;
    __host__ __device__ int row() const { return (NH + 2 * NKV) * HD; }
    __host__ __device__ int q_col(int h) const { return h * HD; }
    __host__ __device__ int k_col(int kvh) const { return (NH + kvh) * HD; }
    __host__ __device__ int v_col(int kvh) const { return (NH + NKV + kvh) * HD; }
};

// Whether query i may look at key j (both absolute positions).
__device__ __forceinline__ bool attends(int i, int j, int window) {
    return j <= i && (window == 0 || i - j < window);
}

// The end of the queries that can see any key <= last of the document holding `last` (row_start: one row
// of doc_start, nondecreasing): the first q > last whose document starts after `last`, else T. Queries
// from there on see no key <= last. Binary search; every thread of a block gets the same answer.
__device__ __forceinline__ int doc_query_end(const int* row_start, int last, int T) {
    int lo = last + 1, hi = T;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (row_start[mid] > last) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

// doc_query_end with WAYS - 1 independent loads a round, for one thread whose search is on a critical
// path (the Hopper backward's producer): about log_WAYS(T) load latencies instead of log_2(T). The
// answer stays in [lo, hi]: rows below lo start their document at or before `last`, hi is T or a row
// that starts after it; each round probes WAYS - 1 evenly spaced rows of [lo, hi).
template <int WAYS>
__host__ __device__ __forceinline__ int doc_query_end_wide(const int* row_start, int last, int T) {
    int lo = last + 1, hi = T;
    while (lo < hi) {
        const int step = (hi - lo + WAYS - 1) / WAYS;
        int v[WAYS - 1];
#pragma unroll
        for (int k = 1; k < WAYS; k++) v[k - 1] = lo + k * step - 1 < hi ? row_start[lo + k * step - 1] : 0;
        int new_lo = lo, new_hi = hi;
#pragma unroll
        for (int k = 1; k < WAYS; k++) {
            const int p = lo + k * step - 1;
            if (p >= hi) break;
            if (v[k - 1] > last) new_hi = new_hi < p ? new_hi : p;
            else new_lo = p + 1;
        }
        lo = new_lo, hi = new_hi;
    }
    return lo;
}

// dQ from the single-pass backwards' fp32 accumulator (attention_mma_backward.cuh's scratch layout,
// dq_accum (B, T, NH * HD)): scale * sum, rounded to bf16. The dQ store (attention_backward_dq_store)
// and the FP8 cast that reads the accumulator in its place (fp8_cast_transpose_fused DQ_ACCUM,
// llmc/fp8_fused.cuh) must produce the same bits, so both call this one definition.
template <int HD>
__device__ __forceinline__ __nv_bfloat16 dq_from_accum(float sum) {
    return from_float<__nv_bfloat16>(sum * rsqrtf((float)HD));
}

inline QKVLayout qkv_layout(const AttnShape& s) { return {s.NH, s.NKV, s.HD}; }

// Checks the sizes every implementation needs; a bad one is a caller bug, reported in one line. (The
// scalar form is the KV cache's, whose calls have no AttnShape.)
inline void check_attention_sizes(const char* what, int B, int T, int NH, int NKV, int HD, int window) {
    if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0 || HD <= 0 || window < 0)
        fail("%s: sizes must be positive (B=%d T=%d NH=%d NKV=%d HD=%d window=%d)", what, B, T, NH, NKV, HD, window);
    if (NH % NKV != 0) fail("%s: NKV=%d must divide NH=%d", what, NKV, NH);
    if (HD != 64 && HD != 128) fail("%s: head size HD=%d is not supported (64 or 128)", what, HD);
}
inline void check_attention_sizes(const char* what, const AttnShape& s) {
    check_attention_sizes(what, s.B, s.T, s.NH, s.NKV, s.HD, s.window);
}

}  // namespace attention_detail
