// attention_decode.cuh: attention of one new token per sequence against a KV cache (inference; the
// cache and kv_cache_fill / kv_cache_append are in kv_cache.cuh).
// Flash-decoding: a sequence's keys are split across thread blocks, each computing a partial softmax
// (max, sum, unnormalised output) in fp32; the partials merge through a thread-block cluster's
// distributed shared memory at a small batch, through global memory (the last split block of a head to
// finish) at a large one. A block serves up to 8 query heads of a KV head: each K/V element is read once
// for its group. The batched decode runs on the tensor cores in the bf16 build (attention_decode_mma.cuh,
// decode_mma_route below). FP32 build: the same kernels with floatX = float.
//
// Shapes (row-major; docs/design.md, "KV cache and decode attention"):
//   qkv      (B, (NH + 2*NKV) * HD)  this step's QKV matmul output (attention.cuh's row layout); q is read
//                                    from it directly
//   k_cache  (B, NKV, S, HD)         one layer's keys, S slots per (sequence, KV head)
//   v_cache  (B, NKV, S, HD)         its values
//   pos      (B) int, on the device  each sequence's new position; the cache holds positions 0..pos (this
//                                    token's K/V included), p in slot p % S. pos < 0: idle, out is zeros.
//   out      (B, NH * HD)            written (=), ready for the attention projection
// Query head h reads KV head h / (NH / NKV). window = 0: keys 0..pos (pos < S; a larger pos reads only
// the last S positions); window W > 0: keys max(0, pos-W+1)..pos, needs S >= W (S = W: a ring buffer).
// Scale 1/sqrt(HD); floatX operands, dot products and softmax in fp32. The launch configuration depends
// on (B, NH, NKV, HD, S, window) only, never on pos, so a CUDA graph captures it once for every token.
// Measurements: the lab (dev/cuda/attention_decode.cu: plans, route) and docs/perf.md, "Decode attention".
#pragma once
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cooperative_groups.h>
#include "llmc/attention_decode_mma.cuh"
#include "llmc/attention_layout.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/kv_cache.cuh"
#include "llmc/utils.h"

namespace attention_detail {

// ============================================================================ the split plan
// Keys a split block takes: a multiple of DECODE_MIN_CHUNK (every kernel's keys per step) and at least
// it (below it the block's fixed costs, loading q and merging its warps, outweigh its keys).
constexpr int DECODE_MIN_CHUNK = 64;
// A sequence's n keys go to as few splits as chunks of ceil(n / max_splits) keys (rounded up to
// DECODE_MIN_CHUNK, at least min_chunk) need: the splits follow the length, the grid the capacity.
__host__ __device__ inline int decode_chunk(int n, int max_splits, int min_chunk) {
    const int c = ceil_div(ceil_div(n > 0 ? n : 1, max_splits), DECODE_MIN_CHUNK) * DECODE_MIN_CHUNK;
    return c > min_chunk ? c : min_chunk;
}
__host__ __device__ inline int decode_splits(int n, int max_splits, int min_chunk) {
    return n > 0 ? ceil_div(n, decode_chunk(n, max_splits, min_chunk)) : 1;
}

// Query heads a block serves: its KV head's whole group, up to 8 (more would not fit the registers; a
// larger group takes ceil(G / 8) blocks per KV head).
constexpr int DECODE_MAX_HEADS = 8;
inline int decode_heads_per_block(int G) { return G == 1 ? 1 : G == 2 ? 2 : G <= 4 ? 4 : DECODE_MAX_HEADS; }

// Blocks per split = B * NKV * ceil(G / 8). The waves plan aims at DECODE_WAVES blocks per SM (enough
// loads in flight to cover the memory latency), each taking at most DECODE_MAX_CHUNK keys of a full
// cache (long equal blocks run in waves, and a few per SM would leave the last wave mostly empty).
constexpr int DECODE_WAVES = 4;
constexpr int DECODE_MAX_CHUNK = 512;
constexpr int DECODE_CLUSTER_MAX = 8;   // split blocks a cluster holds at most (the portable size)
constexpr int DECODE_FULL_CHUNK = 1024; // keys a split block takes at least when the batch fills the SMs
struct DecodePlan {
    int max_splits;       // grid.x: split blocks per (sequence, head block)
    int head_blocks;      // blocks per KV head: ceil(G / heads_per_block)
    int heads_per_block;
    bool fused_combine;   // the last split block merges the partials (false: the lab's second kernel)
    int min_chunk = DECODE_MIN_CHUNK;  // keys a split block takes at least (decode_chunk)
    bool cluster = false; // the split blocks of a head block are one cluster, merged in shared memory
};
// The waves plan: DECODE_WAVES blocks an SM, chunks of DECODE_MIN_CHUNK..DECODE_MAX_CHUNK keys, the
// fused combine through global memory.
inline DecodePlan decode_plan_waves(int B, int NH, int NKV, int S, int window, int num_sms) {
    const int G = NH / NKV, hpb = decode_heads_per_block(G), head_blocks = ceil_div(G, hpb);
    const int max_keys = window > 0 && window < S ? window : S;
    const int want = ceil_div(DECODE_WAVES * num_sms, B * NKV * head_blocks);
    const int splits = std::clamp(std::max(want, ceil_div(max_keys, DECODE_MAX_CHUNK)), 1,
                                  ceil_div(max_keys, DECODE_MIN_CHUNK));
    return {splits, head_blocks, hpb, true};
}
// The policy, from the batch's own blocks, base = B * NKV * head_blocks:
// - base >= num_sms (the batch alone fills the SMs; GPT-2 at B 64: 768): split only long caches, into
//   DECODE_FULL_CHUNK-key chunks (more splits cost more in partials and combine than the SMs they'd fill;
//   generate's GPT-2 cache, S 1024, gets one split a head).
// - base < num_sms (latency): up to DECODE_CLUSTER_MAX splits of >= DECODE_MIN_CHUNK keys, one cluster a
//   head block, merged through distributed shared memory: no global partials, fence, atomic counter or
//   the fused combine's ~4 dependent global round trips.
// - ...unless the capacity passes DECODE_CLUSTER_MAX_KEYS and the waves plan's chunks are smaller than
//   the cluster's: then the waves plan. It follows the capacity, not the length (on the device; the
//   graph is captured once), so a short sequence in such a cache pays the global merge.
// - clusters = false (decode_clusters_available: code below sm_90): the fused combine instead.
constexpr int DECODE_CLUSTER_MAX_KEYS = 1024;
inline DecodePlan decode_plan(int B, int NH, int NKV, int S, int window, int num_sms, bool clusters) {
    const int G = NH / NKV, hpb = decode_heads_per_block(G), head_blocks = ceil_div(G, hpb);
    const int max_keys = window > 0 && window < S ? window : S;
    if (B * NKV * head_blocks >= num_sms)
        return {ceil_div(max_keys, DECODE_FULL_CHUNK), head_blocks, hpb, true, DECODE_FULL_CHUNK, false};
    const int splits = std::min(DECODE_CLUSTER_MAX, ceil_div(max_keys, DECODE_MIN_CHUNK));
    if (max_keys > DECODE_CLUSTER_MAX_KEYS) {
        const DecodePlan waves = decode_plan_waves(B, NH, NKV, S, window, num_sms);
        const int waves_chunk = decode_chunk(max_keys, waves.max_splits, waves.min_chunk);
        if (waves_chunk < decode_chunk(max_keys, splits, DECODE_MIN_CHUNK)) return waves;
    }
    return {splits, head_blocks, hpb, true, DECODE_MIN_CHUNK, clusters && splits > 1};
}


// The scratch of one plan: a counter per (sequence, head block) for the fused combine (zero between
// calls), then the partials. Counters first, so their place does not depend on the split count.
struct DecodeScratch {
    int* counters;  // (B, NKV * head_blocks), padded to 16 bytes
    float* part_o;  // (B, NH, max_splits, HD)  unnormalised outputs
    float* part_ml; // (B, NH, max_splits, 2)   base-2 max and sum of each split
    static size_t counter_floats(int B, int NKV, const DecodePlan& p) {
        return (size_t)ceil_div(B * NKV * p.head_blocks, 4) * 4;
    }
    static size_t floats(int B, int NH, int NKV, int HD, const DecodePlan& p) {
        return p.max_splits > 1 && !p.cluster ? counter_floats(B, NKV, p) + (size_t)B * NH * p.max_splits * (HD + 2) : 0;
    }
    DecodeScratch(float* scratch, int B, int NH, int NKV, int HD, const DecodePlan& p) {
        counters = reinterpret_cast<int*>(scratch);
        part_o = scratch ? scratch + counter_floats(B, NKV, p) : nullptr;
        part_ml = scratch ? part_o + (size_t)B * NH * p.max_splits * HD : nullptr;
    }
};

// ============================================================================ the tensor-core route
// attention_decode runs the tensor-core kernels (attention_decode_mma.cuh, bf16 build) where the call
// allows it (mma, not early) and: HD 64 or 128, a group of up to 16 query heads (the mma tile's rows),
// decode_plan's large-batch plan (B * NKV * head_blocks >= num_sms: the lab measures 1.4-2.8x the
// CUDA-core kernels there; a group of 12 at the threshold batch loses), a grid y of B * NKV <= 65535,
// and a device that gives a block their shared memory (decode_mma_smem_fits: not HD 128 on sm_86/89).
// Small batches stay on the CUDA-core kernels: mixed results there, and the fused step at B <= 8 needs
// the early loads before the PDL wait, which the tensor-core kernels lack.
inline bool decode_mma_route(int B, int NH, int NKV, int HD, const DecodePlan& plan, int num_sms) {
#if defined(PRECISION_FP32)
    (void)B, (void)NH, (void)NKV, (void)HD, (void)plan, (void)num_sms;
    return false;
#else
    return (HD == 64 || HD == 128) && NH / NKV <= DECODE_MMA_ROWS && (long long)B * NKV <= 65535 &&
           B * NKV * plan.head_blocks >= num_sms && decode_mma_smem_fits(HD);
#endif
}
// The route's scratch: its partials (none at one split) after the plan's counters (DecodeScratch), so a
// scratch the CUDA-core kernels also use keeps their counters at zero; 16-byte aligned.
inline size_t decode_mma_route_floats(int B, int NH, int NKV, int HD, int S, int window, const DecodePlan& plan,
                                      int num_sms) {
#if defined(PRECISION_FP32)
    (void)B, (void)NH, (void)NKV, (void)HD, (void)S, (void)window, (void)plan, (void)num_sms;
    return 0;
#else
    const size_t part = decode_mma_scratch_floats(B, NH, HD, decode_mma_splits(B, NKV, S, window, num_sms));
    return part > 0 ? DecodeScratch::counter_floats(B, NKV, plan) + part : 0;
#endif
}

// ============================================================================ the split kernel
// Mapping: a block owns (sequence b, KV head kvh, head block, split) and GB query heads. TPR = HD / EPT
// threads share a key row (EPT elements a 16-byte load: 8 bf16, 4 fp32), so the block's threads form
// ROWS row groups. Row group r takes keys r, r + ROWS, ... of the chunk, U = 4 at a time (DecodeKeyLoop):
// U keys' K and V rows loaded before any is used (16 KB a block in flight in bf16), each dot product
// reduced over TPR lanes by xor shuffles, an online softmax per query head in base 2 (q pre-scaled by
// log2(e) / sqrt(HD)), rescaled once per U keys. The row groups merge in shared memory; a sequence of
// one split writes out, the others merge across the cluster or, through the scratch, in the last split
// block of the head block (fused_combine).
// Early loads (DecodeKnobs::EARLY): pos and the first step's keys but the newest are loaded before
// griddepcontrol.wait (only q and the newest K/V come from the kernel waited for): at 64 keys a split
// block the whole chunk is in registers when the QKV kernel finishes.
// Bytes: each K/V element of the span once per head block, q and out once; FLOPs: 4 * HD per (query
// head, key): memory-bound, but at G 4 a thread issues ~140 instructions a key (~2x the issue rate
// 4 TB/s needs); G 8 would be issue-bound.
// Registers (bf16, ptxas -v, sm_90a): ~96 at GB 1 (the bound of 5 blocks an SM), ~122 at 2, ~165 at
// 4, ~252 at 8; the early loads add 20-40.
constexpr int DECODE_THREADS = 128;

// The shared memory of a split block: the row groups' partials, merged at the end.
template <int HD, int GB, int ROWS>
struct DecodeSplitSmem {
    alignas(16) float o[ROWS][GB][HD];  // unnormalised outputs; o[0] then the block's (cluster plan)
    float m[ROWS][GB], l[ROWS][GB];     // each row group's max and sum; m[0] then the block's max
    float f[ROWS][GB];                  // each row group's factor exp2(m - M)
    float sum[GB];                      // the block's sum (cluster plan)
    bool last;                          // this block merges the partials (fused combine)
};

// One split block's keys and softmax, in the phases the split kernel (attention_decode_split_block)
// runs; a key loop (DecodeKeyLoop, or one of the lab's) drives load_step and consume. U: keys a row
// group takes per step. Every member is per thread; the phases' returns are block-uniform.
template <typename T, int HD, int GB, int U_>
struct DecodeSplitBlock {
    static constexpr int U = U_;
    static constexpr int EPT = 16 / (int)sizeof(T);   // elements per 16-byte load
    static constexpr int TPR = HD / EPT;               // threads per key row
    static constexpr int ROWS = DECODE_THREADS / TPR;  // row groups
    static constexpr int STEP = ROWS * U;              // keys of the block's step
    static_assert(TPR <= WARP_SIZE && WARP_SIZE % TPR == 0, "a key row's threads must sit in one warp");
    using Pack = Packed128<T>;
    using Smem = DecodeSplitSmem<HD, GB, ROWS>;

    const T* k_cache;
    const T* v_cache;
    QKVLayout L;
    int S, window, max_splits, min_chunk;
    int split, b, kvh, h0, heads, lane, row, d0;  // heads: query heads h0 .. h0 + heads - 1 of this block
    size_t head_base;                             // (b, kvh)'s first slot in the caches
    const T* qrow;                                // b's qkv row
    DecodeSpan span{0, 0};
    int chunk = 0, nsplits = 0, j0 = 0, j1 = 0;  // this split's keys: j0 .. j1 - 1 of the span
    float q[GB][EPT], acc[GB][EPT], m[GB], l[GB];

    __device__ __forceinline__ DecodeSplitBlock(const T* qkv, const T* k_cache_, const T* v_cache_, QKVLayout L_,
                                                int S_, int window_, int max_splits_, int min_chunk_)
        : k_cache(k_cache_), v_cache(v_cache_), L(L_), S(S_), window(window_), max_splits(max_splits_),
          min_chunk(min_chunk_) {
        split = blockIdx.x, b = blockIdx.z;
        const int G = L.NH / L.NKV, head_blocks = gridDim.y / L.NKV;
        kvh = blockIdx.y / head_blocks, h0 = kvh * G + (blockIdx.y % head_blocks) * GB;
        heads = min(GB, kvh * G + G - h0);
        lane = threadIdx.x % TPR, row = threadIdx.x / TPR, d0 = lane * EPT;
        head_base = ((size_t)b * L.NKV + kvh) * S;
        qrow = qkv + (size_t)b * L.row();
    }

    // The span of the sequence at position p and this split's share of it.
    __device__ __forceinline__ void plan(int p) {
        span = decode_span(p, S, window);
        chunk = decode_chunk(span.n, max_splits, min_chunk);
        nsplits = decode_splits(span.n, max_splits, min_chunk);
        j0 = split * chunk;
        j1 = min(span.n, j0 + chunk);
    }
    // Offset of this lane's elements of key j (slot (first + j) % S) in the caches.
    __device__ __forceinline__ size_t key_offset(int j) const {
        int slot = span.first + j;  // < 2S: first < S, j < n <= S
        if (slot >= S) slot -= S;
        return (head_base + slot) * HD + d0;
    }
    // This row group's U keys of the step at jb: K and V rows, zeros past the chunk (0 * garbage may be NaN).
    __device__ __forceinline__ void load_step(int jb, Pack (&kr)[U], Pack (&vr)[U]) const {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = jb + u * ROWS + row;
            if (j < j1) {
                const size_t off = key_offset(j);
                kr[u] = load128cs(k_cache + off);
                vr[u] = load128cs(v_cache + off);
            } else {
                kr[u] = vr[u] = Pack::constant(from_float<T>(0.0f));
            }
        }
    }
    // The block's query heads, this lane's elements (zeros past `heads`).
    __device__ __forceinline__ void load_q(Pack (&qv)[GB]) const {
#pragma unroll
        for (int g = 0; g < GB; g++)
            qv[g] = g < heads ? load128(qrow + L.q_col(h0 + g) + d0) : Pack::constant(from_float<T>(0.0f));
    }
    // DecodeKnobs::APPEND: the last split (the only chunk holding the newest key) copies this step's K
    // and V rows from qkv into slot pos % S, read back as any other key (several head blocks write the
    // same values). The caches are writable here (attention_decode with append; the const is for loads).
    __device__ __forceinline__ void append_newest() const {
        if (split != nsplits - 1 || span.n == 0) return;  // the same for every thread of the block
        if (threadIdx.x < TPR) {
            const size_t off = key_offset(span.n - 1);
            store128(const_cast<T*>(k_cache) + off, load128(qrow + L.k_col(kvh) + d0));
            store128(const_cast<T*>(v_cache) + off, load128(qrow + L.v_col(kvh) + d0));
        }
        __syncthreads();  // the block's other threads read the row
    }
    // DecodeKnobs::EARLY, after the wait: the newest key (if in the first step, loaded early with the
    // slot's old contents) again, through L2 (__ldcg), never from a line this SM cached.
    __device__ __forceinline__ void reload_newest(Pack (&kr)[U], Pack (&vr)[U]) const {
        const int jn = span.n - 1;
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (jn == j0 + u * ROWS + row && jn < j1) {
                const size_t off = key_offset(jn);
                kr[u] = load128cg(k_cache + off);
                vr[u] = load128cg(v_cache + off);
            }
        }
    }
    // q in fp32, pre-scaled by log2(e) / sqrt(HD); the softmax empty.
    __device__ __forceinline__ void start(const Pack (&qv)[GB]) {
        const float qscale = 1.4426950408889634f * rsqrtf((float)HD);
#pragma unroll
        for (int g = 0; g < GB; g++) {
#pragma unroll
            for (int e = 0; e < EPT; e++) {
                q[g][e] = to_float(qv[g][e]) * qscale;
                acc[g][e] = 0.0f;
            }
            m[g] = -FLT_MAX;  // finite: exp2(m - m_new) stays 0 or 1 while every key so far was masked
            l[g] = 0.0f;
        }
    }
    // This lane's part of query head g's dot product with a key.
    __device__ __forceinline__ float lane_dot(int g, const Pack& k) const {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < EPT; e++) dot += q[g][e] * to_float(k[e]);
        return dot;
    }
    // The scores of the step's U keys for every head (a butterfly over TPR lanes each); -inf past the chunk.
    __device__ __forceinline__ void scores(int jb, const Pack (&kr)[U], float (&s)[U][GB]) const {
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int g = 0; g < GB; g++) {
                float dot = lane_dot(g, kr[u]);
#pragma unroll
                for (int o = TPR / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                s[u][g] = jb + u * ROWS + row < j1 ? dot : -INFINITY;
            }
        }
    }
    // The online softmax over the step's U keys, rescaling once.
    __device__ __forceinline__ void update(const float (&s)[U][GB], const Pack (&vr)[U]) {
#pragma unroll
        for (int g = 0; g < GB; g++) {
            float m_new = m[g];
#pragma unroll
            for (int u = 0; u < U; u++) m_new = fmaxf(m_new, s[u][g]);
            const float corr = exp2f(m[g] - m_new);
            l[g] *= corr;
#pragma unroll
            for (int e = 0; e < EPT; e++) acc[g][e] *= corr;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const float p = exp2f(s[u][g] - m_new);
                l[g] += p;
#pragma unroll
                for (int e = 0; e < EPT; e++) acc[g][e] += p * to_float(vr[u][e]);
            }
            m[g] = m_new;
        }
    }
    __device__ __forceinline__ void consume(int jb, const Pack (&kr)[U], const Pack (&vr)[U]) {
        float s[U][GB];
        scores(jb, kr, s);
        update(s, vr);
    }

    // Merges the ROWS row groups (block max M, each group's factor exp2(m - M), then sums) into out at
    // one split, else into the block's partial (in shared memory in a cluster, else in the scratch).
    __device__ __forceinline__ void merge_rows(Smem& sm, T* out, const DecodeScratch& scratch, bool in_cluster) const {
#pragma unroll
        for (int g = 0; g < GB; g++) {
            if (lane == 0) {
                sm.m[row][g] = m[g];
                sm.l[row][g] = l[g];
            }
#pragma unroll
            for (int e = 0; e < EPT; e++) sm.o[row][g][d0 + e] = acc[g][e];
        }
        __syncthreads();
        if (threadIdx.x < GB) {
            const int g = threadIdx.x;
            float M = -FLT_MAX;
            for (int r = 0; r < ROWS; r++) M = fmaxf(M, sm.m[r][g]);
            for (int r = 0; r < ROWS; r++) sm.f[r][g] = exp2f(sm.m[r][g] - M);
            sm.m[0][g] = M;  // row 0's max was read above; from here it holds the block's
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < heads * HD; idx += DECODE_THREADS) {
            const int g = idx / HD, d = idx % HD;
            float o = 0.0f, sum = 0.0f;
            for (int r = 0; r < ROWS; r++) {
                o += sm.f[r][g] * sm.o[r][g][d];
                sum += sm.f[r][g] * sm.l[r][g];
            }
            if (nsplits == 1) {  // sum = 0 only for an idle sequence (no keys): zeros
                out[((size_t)b * L.NH + h0 + g) * HD + d] = from_float<T>(sum > 0.0f ? o / sum : 0.0f);
            } else if (in_cluster) {  // the block's partial stays in its shared memory (row 0's slots:
                sm.o[0][g][d] = o;    // this thread read sm.o[.][g][d] above and no other thread does)
                if (d == 0) sm.sum[g] = sum;
            } else {
                const size_t p = ((size_t)b * L.NH + h0 + g) * max_splits + split;
                scratch.part_o[p * HD + d] = o;
                if (d == 0) {
                    scratch.part_ml[2 * p] = sm.m[0][g];
                    scratch.part_ml[2 * p + 1] = sum;
                }
            }
        }
    }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    // Cluster combine (block `split` is the cluster's rank `split`): after the barrier every block's
    // partial (sm.m[0], sm.sum, sm.o[0]) is readable by the others; the cluster merges heads * HD outputs.
    __device__ __forceinline__ void combine_cluster(Smem& sm, T* out) const {
        namespace cg = cooperative_groups;
        cg::cluster_group cl = cg::this_cluster();
        cl.sync();
        for (int idx = split * DECODE_THREADS + threadIdx.x; idx < heads * HD; idx += gridDim.x * DECODE_THREADS) {
            const int g = idx / HD, d = idx % HD;
            float ms[DECODE_CLUSTER_MAX], M = -FLT_MAX;
#pragma unroll
            for (int s = 0; s < DECODE_CLUSTER_MAX; s++) {
                ms[s] = s < nsplits ? *cl.map_shared_rank(&sm.m[0][g], s) : -FLT_MAX;
                M = fmaxf(M, ms[s]);
            }
            float o = 0.0f, sum = 0.0f;
#pragma unroll
            for (int s = 0; s < DECODE_CLUSTER_MAX; s++) {
                if (s < nsplits) {
                    const float f = exp2f(ms[s] - M);
                    o += f * *cl.map_shared_rank(&sm.o[0][g][d], s);
                    sum += f * *cl.map_shared_rank(&sm.sum[g], s);
                }
            }
            out[((size_t)b * L.NH + h0 + g) * HD + d] = from_float<T>(o / sum);  // nsplits > 1: sum > 0
        }
        cl.sync();  // no block exits while another reads its shared memory
    }
#endif
    // Fused combine: the last split block of this (sequence, head block) to count in merges the partials
    // (CUDA's threadFenceReduction sample) and resets the counter; every thread fences its partials first.
    __device__ __forceinline__ void combine_fused(Smem& sm, T* out, const DecodeScratch& scratch) const {
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            int* counter = scratch.counters + (size_t)b * gridDim.y + blockIdx.y;
            sm.last = atomicAdd(counter, 1) == nsplits - 1;
            if (sm.last) *counter = 0;
        }
        __syncthreads();
        if (!sm.last) return;
        __threadfence();
        const int warp = threadIdx.x / WARP_SIZE;  // warp w merges heads w, w + 4, ...
        for (int g = warp; g < heads; g += DECODE_THREADS / WARP_SIZE)
            decode_merge_splits(out, scratch.part_o, scratch.part_ml, b, h0 + g, L.NH, HD, nsplits, max_splits,
                                threadIdx.x % WARP_SIZE, WARP_SIZE);
    }
};

// The shipped key loop: each step loads a row group's U keys, then scores them and updates the softmax.
// preloaded: the first step's rows are in kr, vr already (the early loads).
struct DecodeKeyLoop {
    static constexpr int U = 4;
    template <class Block>
    __device__ __forceinline__ static void run(Block& blk, typename Block::Pack (&kr)[Block::U],
                                               typename Block::Pack (&vr)[Block::U], bool preloaded) {
        for (int jb = blk.j0; jb < blk.j1; jb += Block::STEP) {
            if (jb != blk.j0 || !preloaded) blk.load_step(jb, kr, vr);
            blk.consume(jb, kr, vr);
        }
    }
};

// The split kernel's variant: attention_decode's append and early (each its own instantiation: the
// early loads cost registers, 4 blocks an SM at GB 1 instead of 5), and the key loop (the lab's own).
template <bool APPEND_ = false, bool EARLY_ = false, class Loop_ = DecodeKeyLoop>
struct DecodeKnobs {
    static constexpr bool APPEND = APPEND_;  // kv_cache_append folded in (DecodeSplitBlock::append_newest)
    static constexpr bool EARLY = EARLY_;    // pos and the first step's keys read before the PDL wait
    using Loop = Loop_;
};

// Blocks an SM must hold (__launch_bounds__): 5 at GB 1 without the early loads (96 registers; unbounded,
// ptxas takes more and 4 fit, where B = 64 needs the blocks), else no bound.
template <int GB, class Knobs>
constexpr int decode_min_blocks() { return GB == 1 && !Knobs::EARLY ? 5 : 1; }

// The split kernel's body, phase by phase.
template <typename T, int HD, int GB, class Knobs>
__device__ __forceinline__ void attention_decode_split_block(T* out, DecodeScratch scratch, const T* qkv,
                                                             const T* k_cache, const T* v_cache, const int* pos,
                                                             QKVLayout L, int S, int window, int max_splits,
                                                             int min_chunk, bool fused_combine, bool cluster) {
    using Block = DecodeSplitBlock<T, HD, GB, Knobs::Loop::U>;
    __shared__ typename Block::Smem sm;
    Block blk(qkv, k_cache, v_cache, L, S, window, max_splits, min_chunk);
    typename Block::Pack kr[Knobs::Loop::U], vr[Knobs::Loop::U];
    // early: pos and the older keys were complete before the kernel waited for started (every kernel of
    // the step waits before it triggers: llmc/cuda_common.cuh); the newest key is reloaded after the wait
    if constexpr (Knobs::EARLY) {
        blk.plan(__ldcg(pos + blk.b));
        if (blk.split < blk.nsplits) blk.load_step(blk.j0, kr, vr);
    }
    pdl_wait();  // a programmatic dependent of the QKV kernel (pdl): q and this step's K/V come from it
    pdl_launch_dependents();
    // q before pos is read: the two loads' latencies overlap (a short sequence's step is latency-bound)
    typename Block::Pack qv[GB];
    blk.load_q(qv);
    if constexpr (!Knobs::EARLY) blk.plan(pos[blk.b]);
    // In a cluster every block takes part in the merge's barriers, keys or not (j0 >= j1: no loop
    // steps); the decision is cluster-uniform (its blocks share b, so nsplits).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    cluster = false;  // no clusters below sm_90: the host plans none there (decode_plan)
#endif
    const bool in_cluster = cluster && blk.nsplits > 1;
    if (blk.split >= blk.nsplits && !in_cluster) return;
    if constexpr (Knobs::APPEND) blk.append_newest();
    if constexpr (Knobs::EARLY) blk.reload_newest(kr, vr);
    blk.start(qv);
    Knobs::Loop::run(blk, kr, vr, Knobs::EARLY);
    blk.merge_rows(sm, out, scratch, in_cluster);
    if (blk.nsplits == 1) return;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    if (in_cluster) {
        blk.combine_cluster(sm, out);
        return;
    }
#endif
    if (fused_combine) blk.combine_fused(sm, out, scratch);
}

template <typename T, int HD, int GB, class Knobs>
static __global__ void __launch_bounds__(DECODE_THREADS, decode_min_blocks<GB, Knobs>())
    attention_decode_split_kernel(T* out, DecodeScratch scratch, const T* qkv, const T* k_cache, const T* v_cache,
                                  const int* pos, QKVLayout L, int S, int window, int max_splits, int min_chunk,
                                  bool fused_combine, bool cluster) {
    attention_decode_split_block<T, HD, GB, Knobs>(out, scratch, qkv, k_cache, v_cache, pos, L, S, window, max_splits,
                                                   min_chunk, fused_combine, cluster);
}

// Whether the split kernel's code on ctx's device has the cluster merge: compiled for sm_90 or later (a
// build for an older architecture runs without it even on a newer GPU).
inline bool decode_clusters_available(const CudaContext& ctx) { return ctx.code_arch >= 90; }

// The launches of one plan with the split kernel's variant Knobs.
template <typename T, class Knobs = DecodeKnobs<>>
inline void attention_decode_with_plan(T* out, const T* qkv, const T* k_cache, const T* v_cache, const int* pos,
                                      int B, int NH, int NKV, int HD, int S, int window, float* scratch_buf,
                                      const DecodePlan& plan, const CudaContext& ctx, bool pdl = false) {
    const QKVLayout L{NH, NKV, HD};
    const DecodeScratch scratch(scratch_buf, B, NH, NKV, HD, plan);
    const dim3 grid(plan.max_splits, NKV * plan.head_blocks, B);
    if (plan.cluster && (plan.max_splits > DECODE_CLUSTER_MAX))
        fail("attention_decode: a cluster of %d split blocks (at most %d)", plan.max_splits, DECODE_CLUSTER_MAX);
    if (plan.cluster && !decode_clusters_available(ctx))
        fail("attention_decode: a cluster plan, but this device runs code compiled below sm_90 (no clusters)");
    auto launch = [&](auto kernel) {
        if (!plan.cluster) {
            launch_kernel(kernel, grid, dim3(DECODE_THREADS), 0, ctx.stream, pdl, out, scratch, qkv, k_cache, v_cache,
                          pos, L, S, window, plan.max_splits, plan.min_chunk, plan.fused_combine, false);
        } else {  // launch_kernel's launch with the cluster's dimensions as a second attribute
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = grid;
            cfg.blockDim = dim3(DECODE_THREADS);
            cfg.stream = ctx.stream;
            cudaLaunchAttribute attr[2];
            attr[0].id = cudaLaunchAttributeClusterDimension;
            attr[0].val.clusterDim = {(unsigned)plan.max_splits, 1, 1};
            attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[1].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = attr;
            cfg.numAttrs = pdl ? 2 : 1;
            cudaCheck(cudaLaunchKernelEx(&cfg, kernel, out, scratch, qkv, k_cache, v_cache, pos, L, S, window,
                                         plan.max_splits, plan.min_chunk, plan.fused_combine, true));
        }
        cudaCheckLaunch();
    };
    switch (HD * 100 + plan.heads_per_block) {
        case 6401: launch(attention_decode_split_kernel<T, 64, 1, Knobs>); break;
        case 6402: launch(attention_decode_split_kernel<T, 64, 2, Knobs>); break;
        case 6404: launch(attention_decode_split_kernel<T, 64, 4, Knobs>); break;
        case 6408: launch(attention_decode_split_kernel<T, 64, 8, Knobs>); break;
        case 12801: launch(attention_decode_split_kernel<T, 128, 1, Knobs>); break;
        case 12802: launch(attention_decode_split_kernel<T, 128, 2, Knobs>); break;
        case 12804: launch(attention_decode_split_kernel<T, 128, 4, Knobs>); break;
        case 12808: launch(attention_decode_split_kernel<T, 128, 8, Knobs>); break;
        default: fail("attention_decode: no kernel for HD=%d with %d heads a block", HD, plan.heads_per_block);
    }
}

}  // namespace attention_detail

// fp32 floats of scratch attention_decode needs for these sizes on ctx's device (0: none), enough for
// either route, whatever the call's mma and early.
inline size_t attention_decode_scratch_floats(int B, int NH, int NKV, int HD, int S, int window, const CudaContext& ctx) {
    using namespace attention_detail;
    const int sms = ctx.sm_count;
    const DecodePlan plan = decode_plan(B, NH, NKV, S, window, sms, decode_clusters_available(ctx));
    size_t floats = DecodeScratch::floats(B, NH, NKV, HD, plan);
    if (decode_mma_route(B, NH, NKV, HD, plan, sms))
        floats = std::max(floats, decode_mma_route_floats(B, NH, NKV, HD, S, window, plan, sms));
    return floats;
}

// out (B, NH*HD) = softmax(q k^T / sqrt(HD)) v of each sequence's new token (q from its qkv row) over
// its cached positions, on ctx.stream. scratch: attention_decode_scratch_floats(...) fp32 floats, 16-byte
// aligned, zeroed once after allocation (its counters are left at zero by every call); nullptr when 0.
// qkv, k_cache, v_cache and out 16-byte aligned. Bit-identical run to run, not across SM counts.
// pdl: launched as programmatic dependents (llmc/cuda_common.cuh). append: the cache lacks this step's
// K and V; the kernel writes them (kv_cache_append's job, one launch less) and attends over them. early
// (without append): pos and the first step's keys but the newest are read before the PDL wait, so pos
// must not come from the kernel waited for; for a kernel PDL starts while the QKV kernel runs (the fused
// step). mma (bf16 build): where decode_mma_route allows and without early, the tensor-core kernels run
// instead (with append, kv_cache_append first), as plain launches whatever pdl says; the first such call
// raises their shared-memory limit, so make it outside a graph capture (model_infer_warmup does).
inline void attention_decode(floatX* out, const floatX* qkv, floatX* k_cache, floatX* v_cache, const int* pos, int B,
                            int NH, int NKV, int HD, int S, const CudaContext& ctx, int window = 0,
                            float* scratch = nullptr, bool pdl = false, bool append = false, bool early = false,
                            bool mma = true) {
    using namespace attention_detail;
    check_kv_cache_sizes("attention_decode", B, NH, NKV, HD, S, window);
    check_kv_cache_aligned("attention_decode", qkv, k_cache, v_cache);
    const int sms = ctx.sm_count;
    const DecodePlan plan = decode_plan(B, NH, NKV, S, window, sms, decode_clusters_available(ctx));
    const bool route = mma && !early && decode_mma_route(B, NH, NKV, HD, plan, sms);  // FP32: never
    const size_t need = route ? decode_mma_route_floats(B, NH, NKV, HD, S, window, plan, sms)
                              : DecodeScratch::floats(B, NH, NKV, HD, plan);
    if (need > 0 && !scratch)
        fail("attention_decode: B=%d NH=%d S=%d needs a scratch buffer of %zu floats", B, NH, S,
             attention_decode_scratch_floats(B, NH, NKV, HD, S, window, ctx));
#if !defined(PRECISION_FP32)
    if (route) {
        if (append) kv_cache_append(k_cache, v_cache, qkv, pos, B, NH, NKV, HD, S, ctx.stream);
        float* part = scratch ? scratch + DecodeScratch::counter_floats(B, NKV, plan) : nullptr;
        decode_mma(out, part, qkv, k_cache, v_cache, pos, B, NH, NKV, HD, S, window,
                   decode_mma_splits(B, NKV, S, window, sms), ctx);
        return;
    }
#endif
    auto run = [&](auto knobs) {
        attention_decode_with_plan<floatX, decltype(knobs)>(out, qkv, k_cache, v_cache, pos, B, NH, NKV, HD, S, window,
                                                            scratch, plan, ctx, pdl);
    };
    if (append) run(DecodeKnobs<true, false>{});
    else if (early) run(DecodeKnobs<false, true>{});
    else run(DecodeKnobs<>{});
}
