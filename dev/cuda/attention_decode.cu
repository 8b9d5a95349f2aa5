// attention_decode.cu: the decode attention lab: one new token per sequence against its layer's KV
// cache (llmc/attention_decode.cuh; the cache copies of llmc/kv_cache.cuh), B = 1, 8, 64 at cache
// lengths 128..4096, mixed lengths in a batch (with an idle sequence), sliding windows over a wrapped
// ring buffer, and awkward groups.
// Each configuration first fills its cache from a prompt of mixed lengths with kv_cache_fill (checked
// exactly on every slot it may write); each case appends the token's K/V with kv_cache_append
// (checked slot by slot, exactly), then every variant runs with poisoned outputs, is checked against
// the CPU reference (llmc/cpu/attention_decode.h, fp32, every sequence of the batch) and timed by the
// shared harness.
//   0  shipped attention_decode, as the fused step at B <= 8 launches it (pdl, early loads): split-K
//      blocks of 128 threads, each serving a KV head's whole query group (up to 8 heads); decode_plan:
//      at a small grid (B * NKV * head blocks < SMs) up to 8 splits, one cluster per (sequence, head
//      block), the partials merged through distributed shared memory (past 1024 keys of capacity the
//      waves plan of variant 10 where it splits more: B 1 at S 4096); at a large one chunks of 1024
//      keys (no split up to 1024), fp32 partials merged by the last split block of each (sequence,
//      head block) when a sequence needs > 1 split (the fused combine, shipped after commit 24fefd9)
//   1  baseline: one block per (sequence, query head), no split, no sharing of K/V across the group
//      (4 warps, one key per warp at a time, a warp-wide dot product per key)
//   2  the shipped kernel without the split (one block per (sequence, KV head)): what the split buys
//   3  the shipped kernel with twice the plan's splits (and half its smallest chunk), merged through
//      global memory (fused combine)
//   4  separate combine kernel (shipped until commit 24fefd9's run): the split blocks write partials,
//      a second kernel merges them; what the fused combine of variant 0 saves (one launch a call)
//   5  8 keys a row group per step instead of 4 (twice the loads in flight, more registers)
//   6  prefetch: the next step's K/V loads issued before the current step's math (a second register set)
//   7  reduce-scatter: the U*GB dot products of a step summed over the row group's lanes by halving
//      exchanges (15 shuffles for 16 sums over 16 lanes, then 16 to gather) instead of one butterfly
//      each (64 shuffles and adds): ~14% fewer instructions a key at G 4
//   8  append folded in (attention_decode(..., append = true), the --fused 1 step at B > 8): the
//      appended slots are poisoned first; the kernel writes them from qkv and reads the newest key
//      from qkv; checked on the output and on the slots, as kv_cache_append is. Against variant 0 +
//      the kv_cache_append line: one launch less.
//   9  without the early loads (attention_decode(..., early = false)): pos and the first step's keys
//      read after the wait, as before the latency work and as the B > 8 step runs it (a lone kernel
//      gains nothing from them: the gain is in a PDL chain, generate --latency-kernels 1 vs 0)
//  10  the waves plan (decode_plan_waves: ~4 blocks an SM, chunks of 64..512 keys, fused combine through
//      global memory; shipped until issue 15's second round) with the early loads: the old variant 0
//  11  the waves plan without the early loads: the old variant 9 (what B > 8 ran)
//  12  the shipped plan without the cluster: its splits merged by the fused combine through global
//      memory (what the cluster merge buys at small batches; the same as 0 at large ones)
//  13  tensor cores (bf16 only; not built in the FP32 build): the Triton kernel's design
//      (dev/triton/attention_decode.py) in CUDA: a KV head's query group as the 16 rows of an
//      m16n8k16 tile (groups of up to 16), S = Q K^T and O += P V by mma.sync over cp.async-staged
//      tiles of 64 keys (16 a warp), P rounded to bf16; ~2 blocks an SM of splits of >= 128 keys, a
//      second kernel merging the fp32 partials. Whether the tensor cores lift the issue-bound GQA
//      shape (Triton: 4230 GB/s at gqa B 64 len 4096, variant 0 1525)
// kv_cache_fill and kv_cache_append: one line each (variant 0) per cache configuration.
// Bytes: the K and V rows each sequence attends (NKV heads), q and out once, pos; FLOPs: 4 * HD per
// (query head, key). Memory-bound: % of the 4.0 TB/s copy.
//
// Build: make -C dev/cuda build/attention_decode   (PRECISION=FP32: build/fp32/attention_decode)
// Run:   dev/cuda/build/attention_decode [variant ...] [--check-only] [--reps N] [--small]
//        --small: three tiny awkward configurations (for compute-sanitizer --tool memcheck/racecheck).
//
// Results (H200, commit 24fefd9, 2026-12-03; every check passed, memcheck/racecheck clean on --small),
// variant 0, ms and % of the copy ceiling:
//   gpt2 (12/12, HD 64)  B 1: len 1024 0.0146 (5%), 4096 0.0197 (16%); B 64: 1024 0.0849 (59%),
//                        4096 0.2556 (79%)
//   gqa  (32/8, HD 128)  B 1: 1024 0.0185 (6%), 4096 0.0311 (14%); B 64: 1024 0.1687 (40%), 4096
//                        0.5477 (49%)
// (Those are the waves plan's, now variants 10/11; issue 15's second round replaced it with decode_plan:
// the cluster merge at small grids, 1024-key chunks at large ones. H200, 0fdec65, variant 0 against 10:
// gpt2 B 1 len 128 0.0084 vs 0.0108, len 4096 0.0252 vs 0.0185 (worse: 8 splits of 512 keys); B 64
// len 128 0.0227 vs 0.0347, len 4096 0.2826 vs 0.2922; docs/perf.md, seventeenth run. Since, B 1 with
// S 4096 takes the waves plan (DECODE_CLUSTER_MAX_KEYS): variant 0 = 10 there, 12 = 10 as well.)
// Small batches are latency-bound (an empty kernel times ~0.005 ms here); fused combine (then variant 4,
// since shipped as 0) wins at
// B 8 / mixed lengths (0.0329 vs 0.0360), 2x splits (3) at B 8 len 4096 (0.0494 vs 0.0553); GQA at
// B 64 is issue-bound (49% of copy). Full table: docs/perf.md, "Decode attention".
// Variant 13 (H200, 2026-12-04, twenty-eighth run, its first run: every check passed, memcheck clean on
// --small), ms against variant 0 in the same run: gqa B 64 len 1024 0.0780 vs 0.1950 (2.50x), len 4096
// 0.2553 vs 0.7048 (2.76x, 4210 GB/s: 105% of copy, as Triton's and cuDNN's SDPA), mixed 0.1465 vs
// 0.3903; gqa B 8 len 4096 0.0609 vs 0.1409; gpt2 B 64 len 1024 0.0621 vs 0.0964 (1.55x), len 4096
// 0.2044 vs 0.2842; gpt2 B 1 len 128 0.0105 vs 0.0120. Slower only where a few blocks set the time:
// gpt2-1k B 1 len 320 0.0117 vs 0.0100, odd-g12 (B 3, G 12, window) 0.0169 vs 0.0133. Not shipped yet:
// the decode step's attention also appends the token's K/V, waits through PDL or the step counters,
// and reads its first keys early, which this kernel does not (docs/perf.md, "Decode attention").
// Since that run its merge kernel is the shipped merge (decode_merge_splits, the partials in its
// layout) instead of its own copy of the formula: rebuilt, not yet rerun on a GPU.
#include <algorithm>
#include "harness.cuh"
#include "llmc/attention_decode.cuh"
#include "llmc/attention_mma.cuh"
#include "llmc/cpu/attention_decode.h"

using attention_detail::DecodePlan;
using attention_detail::QKVLayout;

// ---------------------------------------------------------------- variant 1: the baseline kernel
// grid (NH, B), 128 threads: warp w takes keys w, w + 4, ... of the span, lane owns dims
// lane * HD/32 .. + HD/32, a key's dot product is a warp reduction (5 shuffles) and the online softmax
// is rescaled per key; the 4 warps merge in shared memory. K/V read once per query head (G times per
// KV head, from L2 if they stay there), one 4- or 8-byte load a lane.
constexpr int BASELINE_WARPS = 4;
template <typename T, int HD>
static __global__ void __launch_bounds__(BASELINE_WARPS * WARP_SIZE)
    decode_baseline_kernel(T* out, const T* qkv, const T* k_cache, const T* v_cache, const int* pos, QKVLayout L, int S,
                           int window) {
    constexpr int DPL = HD / WARP_SIZE;
    __shared__ float sm_m[BASELINE_WARPS], sm_l[BASELINE_WARPS], sm_o[BASELINE_WARPS][HD];
    const int h = blockIdx.x, b = blockIdx.y, warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int kvh = h / (L.NH / L.NKV);
    const attention_detail::DecodeSpan span = attention_detail::decode_span(pos[b], S, window);
    const float qscale = 1.4426950408889634f * rsqrtf((float)HD);
    float q[DPL], o[DPL], m = -FLT_MAX, l = 0.0f;
    for (int e = 0; e < DPL; e++) {
        q[e] = to_float(qkv[(size_t)b * L.row() + L.q_col(h) + lane * DPL + e]) * qscale;
        o[e] = 0.0f;
    }
    const size_t head = ((size_t)b * L.NKV + kvh) * S;
    for (int j = warp; j < span.n; j += BASELINE_WARPS) {
        const size_t off = (head + (span.first + j) % S) * HD + lane * DPL;
        float dot = 0.0f;
        for (int e = 0; e < DPL; e++) dot += q[e] * to_float(k_cache[off + e]);
        dot = warp_reduce_sum(dot);
        const float m_new = fmaxf(m, dot), corr = exp2f(m - m_new), p = exp2f(dot - m_new);
        l = l * corr + p;
        for (int e = 0; e < DPL; e++) o[e] = o[e] * corr + p * to_float(v_cache[off + e]);
        m = m_new;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
    for (int e = 0; e < DPL; e++) sm_o[warp][lane * DPL + e] = o[e];
    __syncthreads();
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float M = -FLT_MAX, acc = 0.0f, sum = 0.0f;
        for (int w = 0; w < BASELINE_WARPS; w++) M = fmaxf(M, sm_m[w]);
        for (int w = 0; w < BASELINE_WARPS; w++) {
            const float f = exp2f(sm_m[w] - M);
            acc += f * sm_o[w][d];
            sum += f * sm_l[w];
        }
        out[((size_t)b * L.NH + h) * HD + d] = from_float<T>(sum > 0.0f ? acc / sum : 0.0f);
    }
}

static void decode_baseline(floatX* out, const floatX* qkv, const floatX* k_cache, const floatX* v_cache,
                            const int* pos, int B, int NH, int NKV, int HD, int S, int window, cudaStream_t st) {
    const QKVLayout L{NH, NKV, HD};
    if (HD == 64)
        decode_baseline_kernel<floatX, 64>
            <<<dim3(NH, B), BASELINE_WARPS * WARP_SIZE, 0, st>>>(out, qkv, k_cache, v_cache, pos, L, S, window);
    else
        decode_baseline_kernel<floatX, 128>
            <<<dim3(NH, B), BASELINE_WARPS * WARP_SIZE, 0, st>>>(out, qkv, k_cache, v_cache, pos, L, S, window);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------- variant 13: tensor cores
// bf16 only (mma.sync has no fp32 operands): in the FP32 build the variant is not compiled or registered.
#if !defined(PRECISION_FP32)
// What the Triton kernel (dev/triton/attention_decode.py, decode_split_kernel) does, in CUDA: the G
// query heads of a KV head are the 16 rows of an m16n8k16 A tile (rows >= G are zero queries whose
// outputs are never written), so S = Q K^T and O += P V run on the tensor cores instead of the
// shipped kernel's scalar FMAs and shuffles (issue-bound at G 4: 49% of copy at gqa B 64).
// Mapping: grid (splits, B * NKV); a block of 4 warps owns (sequence b, KV head kvh, split) and keys
// [lo, hi) of the sequence's span, in tiles of 64 keys staged in shared memory by cp.async (3 stages,
// 2 tiles in flight while one is used). Warp w takes keys 16w .. 16w + 15 of each tile with its own
// online softmax (m, l, O for the 16 rows), so the loop needs no exchange between warps; the 4 warps'
// partials are merged once, in shared memory, at the end. Per tile and warp: HD/8 mma for S (2 n-blocks
// of 8 keys x HD/16 k-steps) and HD/8 for P V (HD/8 n-blocks x one 16-key k-step).
// Numerics: q and K in bf16 as stored, S in fp32, scaled by log2(e)/sqrt(HD) in fp32 (not folded into
// a bf16 q); softmax in base 2 with the running max subtracted before exp2; P rounded to bf16 for the
// P V mma, and l summed from the same rounded p, so numerator and denominator weigh each key alike.
// Risk: that rounding errs by ~2^-9 of a short sequence's output (~|v|), and the lab's check is
// against the rms of the whole batch's output, which the long sequences of a mixed batch make small:
// the Triton lab failed all its bf16-P kernels (cuDNN's SDPA included) on gqa B=64 mixed by 2 elements
// there; this variant may do the same.
// Splits (the Triton plan): ~2 blocks an SM over B * NKV, chunks of >= 128 keys of the capacity; each
// sequence's chunk comes from its own length on the device (decode_mma_chunk), so the launch depends
// on the shapes only. A sequence with one chunk is written by its block; the others' blocks write fp32
// partials (o, m, l) that decode_mma_merge_kernel combines.
// Shared memory (DecodeMmaSmem): q 16 x HD + 3 stages of K and V 64 x HD, bf16: 100 KB at HD 128
// (2 blocks an SM), 50 KB at HD 64 (4); the K stages hold the warps' fp32 O for the final merge.
// Registers (ptxas -v, sm_90a, no spills): 214 at HD 128, 120 at HD 64; below the smem limits of 2 and 4
// blocks an SM.
constexpr int DECODE_MMA_ROWS = 16;       // query rows of the tile: groups of up to 16 heads
constexpr int DECODE_MMA_TILE = 64;       // keys a stage
constexpr int DECODE_MMA_WARPS = 4;       // 16 keys of each tile a warp
constexpr int DECODE_MMA_THREADS = DECODE_MMA_WARPS * WARP_SIZE;
constexpr int DECODE_MMA_STAGES = 3;
constexpr int DECODE_MMA_MIN_CHUNK = 128; // below it a block's fixed costs (q, the merges) outweigh its keys
constexpr int DECODE_MMA_BLOCKS_PER_SM = 2;
static_assert(DECODE_MMA_TILE == 16 * DECODE_MMA_WARPS, "each warp takes one 16-key k-step of a tile");
static_assert(DECODE_MMA_MIN_CHUNK % DECODE_MMA_TILE == 0, "chunks are whole tiles");

template <int HD>
struct DecodeMmaSmem {
    attention_detail::bf16 q[DECODE_MMA_ROWS * HD];                     // swizzled (attention_mma.cuh's swz)
    attention_detail::bf16 k[DECODE_MMA_STAGES][DECODE_MMA_TILE * HD];  // swizzled; after the loop: o below
    attention_detail::bf16 v[DECODE_MMA_STAGES][DECODE_MMA_TILE * HD];  // swizzled
    float m[DECODE_MMA_WARPS][DECODE_MMA_ROWS], l[DECODE_MMA_WARPS][DECODE_MMA_ROWS];  // each warp's row stats
    float f[DECODE_MMA_WARPS][DECODE_MMA_ROWS];  // each warp's factor exp2(m_w - M)
    float M[DECODE_MMA_ROWS], L[DECODE_MMA_ROWS];  // the block's row max and sum
    // the warps' unnormalised O (WARPS, ROWS, HD) fp32, in the K stages once the loop is done
    __device__ float* o() { return reinterpret_cast<float*>(&k[0][0]); }
    static_assert(sizeof(k) >= sizeof(float) * DECODE_MMA_WARPS * DECODE_MMA_ROWS * HD, "O must fit in the K stages");
};

// Keys one split of a sequence of n keys takes (whole tiles, >= DECODE_MMA_MIN_CHUNK), and the splits
// the sequence uses (1 for an idle one: its first block writes the zeros).
__host__ __device__ inline int decode_mma_chunk(int n, int splits) {
    const int c = ceil_div(ceil_div(n > 0 ? n : 1, splits), DECODE_MMA_TILE) * DECODE_MMA_TILE;
    return c > DECODE_MMA_MIN_CHUNK ? c : DECODE_MMA_MIN_CHUNK;
}
__host__ __device__ inline int decode_mma_used_splits(int n, int splits) {
    return n > 0 ? ceil_div(n, decode_mma_chunk(n, splits)) : 1;
}
// Splits of the grid: DECODE_MMA_BLOCKS_PER_SM blocks an SM over the B * NKV heads, no more than
// chunks of DECODE_MMA_MIN_CHUNK keys of the capacity need.
static int decode_mma_splits(int B, int NKV, int S, int window, int num_sms) {
    const int max_keys = window > 0 && window < S ? window : S;
    const int want = ceil_div(DECODE_MMA_BLOCKS_PER_SM * num_sms, B * NKV);
    return std::max(1, std::min(want, ceil_div(max_keys, DECODE_MMA_MIN_CHUNK)));
}

// Keys j0 .. j0 + TILE - 1 of the span (slot (first + j) % S of the head's K and V rows) into a stage;
// keys >= hi are zero-filled (cp.async src-size 0: never read, and zeros, not garbage, so p = 0 times
// them stays 0).
template <int HD>
__device__ __forceinline__ void decode_mma_load_tile(attention_detail::bf16* ks, attention_detail::bf16* vs,
                                                     const attention_detail::bf16* k_head,
                                                     const attention_detail::bf16* v_head, int first, int S, int j0,
                                                     int hi) {
    using namespace attention_detail;
    constexpr int CHUNKS = HD / 8;  // 16-byte chunks a row
    static_assert(DECODE_MMA_TILE * CHUNKS % DECODE_MMA_THREADS == 0, "a tile splits evenly over the threads");
#pragma unroll
    for (int i = 0; i < DECODE_MMA_TILE * CHUNKS / DECODE_MMA_THREADS; i++) {
        const int idx = i * DECODE_MMA_THREADS + threadIdx.x, r = idx / CHUNKS, c = (idx % CHUNKS) * 8;
        const int j = j0 + r;
        const bool valid = j < hi;
        int slot = first + (valid ? j : 0);  // < 2S: first < S, j < n <= S
        if (slot >= S) slot -= S;
        const size_t off = (size_t)slot * HD + c;
        cp_async16(ks + swz<HD>(r, c), k_head + off, valid);
        cp_async16(vs + swz<HD>(r, c), v_head + off, valid);
    }
}

// Fragments of m16n8k16 (bf16, fp32 accumulate) this kernel relies on, lane = 4 * gr + t4:
//   A (16 x 16, row-major): a0 (row gr, cols 2t4, 2t4+1), a1 (row gr+8, same cols), a2 (row gr, cols
//     8+2t4, 8+2t4+1), a3 (row gr+8, those cols); here rows are query heads, cols head dims (Q) or keys (P).
//   B (16 x 8, "col"): b0 (k rows 2t4, 2t4+1, col gr), b1 (k rows 8+2t4, 8+2t4+1, col gr); for S the k
//     rows are head dims and the cols keys (K's rows, ldmatrix of the [key][dim] tile), for P V the k
//     rows are keys and the cols dims (ldmatrix.trans of the [key][dim] V tile).
//   C (16 x 8): c0, c1 (row gr, cols 2t4, 2t4+1), c2, c3 (row gr+8, same cols).
// So a thread's scores are rows gr and gr+8 (index r = e / 2 of c_e) of keys 16w + 8nb + 2t4 + (e & 1),
// a row's max and sum are over the 4 lanes of a quad, and the two C n-blocks of S are, converted to
// bf16, the A fragment of P (mma_p_regs_b_kn: a0 = c0,c1 of nb 0, a1 = c2,c3 of nb 0, a2/a3 of nb 1).
template <int HD>
static __global__ void __launch_bounds__(DECODE_MMA_THREADS)
    decode_mma_split_kernel(attention_detail::bf16* out, float* part_o, float* part_ml,
                            const attention_detail::bf16* qkv, const attention_detail::bf16* k_cache,
                            const attention_detail::bf16* v_cache, const int* pos, QKVLayout L, int S, int window,
                            int splits) {
    using namespace attention_detail;
    extern __shared__ __align__(16) unsigned char decode_mma_smem_raw[];
    DecodeMmaSmem<HD>& sm = *reinterpret_cast<DecodeMmaSmem<HD>*>(decode_mma_smem_raw);
    const int split = blockIdx.x, bk = blockIdx.y, b = bk / L.NKV, kvh = bk % L.NKV, G = L.NH / L.NKV;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, gr = lane / 4, t4 = lane % 4;

    const attention_detail::DecodeSpan span = attention_detail::decode_span(pos[b], S, window);
    const int chunk = decode_mma_chunk(span.n, splits), used = decode_mma_used_splits(span.n, splits);
    if (split >= used) return;  // block-uniform, before any barrier
    const int lo = split * chunk, hi = min(span.n, lo + chunk);
    const int tiles = hi > lo ? ceil_div(hi - lo, DECODE_MMA_TILE) : 0;
    const size_t head = (size_t)bk * S * HD;  // (b, kvh) of the (B, NKV, S, HD) caches
    const bf16* k_head = k_cache + head;
    const bf16* v_head = v_cache + head;

    // The first STAGES - 1 tiles in flight (one commit group each, empty past the last tile, so the
    // group count stays uniform), then q: 16 rows of HD, rows >= G zero.
#pragma unroll
    for (int s = 0; s < DECODE_MMA_STAGES - 1; s++) {
        if (s < tiles)
            decode_mma_load_tile<HD>(sm.k[s], sm.v[s], k_head, v_head, span.first, S, lo + s * DECODE_MMA_TILE, hi);
        cp_async_commit();
    }
    const bf16* q_row = qkv + (size_t)b * L.row() + L.q_col(kvh * G);
    for (int idx = threadIdx.x; idx < DECODE_MMA_ROWS * HD / 8; idx += DECODE_MMA_THREADS) {
        const int r = idx / (HD / 8), c = (idx % (HD / 8)) * 8;
        int4 v = make_int4(0, 0, 0, 0);
        if (r < G) v = *reinterpret_cast<const int4*>(q_row + (size_t)r * HD + c);
        *reinterpret_cast<int4*>(sm.q + swz<HD>(r, c)) = v;
    }
    __syncthreads();
    uint32_t qf[1][HD / 16][4];  // Q's A fragments, every warp all 16 rows
    load_a_frags<HD, HD>(qf[0], sm.q, 0);

    const float scale = LOG2E * rsqrtf((float)HD);  // scores in log2 units
    float o[1][HD / 8][4] = {};
    // rows gr and gr + 8 (r = 0, 1): running max (finite: a warp whose keys so far were all masked keeps
    // exp2(m - m_new) = 1 and p = exp2(-inf) = 0, never inf - inf) and this thread's part of the sum
    float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.0f, 0.0f};
    for (int t = 0; t < tiles; t++) {
        const int stage = t % DECODE_MMA_STAGES;
        cp_async_wait<DECODE_MMA_STAGES - 2>();  // this thread's copies of tile t have landed...
        __syncthreads();  // ...everyone's, and every warp is done with tile t - 1, whose stage is reused next
        const int next = t + DECODE_MMA_STAGES - 1;
        if (next < tiles) {
            const int ns = next % DECODE_MMA_STAGES;
            decode_mma_load_tile<HD>(sm.k[ns], sm.v[ns], k_head, v_head, span.first, S, lo + next * DECODE_MMA_TILE,
                                     hi);
        }
        cp_async_commit();

        float s[1][2][4] = {};  // S for this warp's 16 keys: 2 n-blocks of 8
        mma_a_regs_b_nk<HD, 16, HD>(s, qf, sm.k[stage], 16 * warp);
        const int key0 = lo + t * DECODE_MMA_TILE + 16 * warp + 2 * t4;
#pragma unroll
        for (int nb = 0; nb < 2; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[0][nb][e] = key0 + 8 * nb + (e & 1) < hi ? s[0][nb][e] * scale : -INFINITY;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = fmaxf(fmaxf(s[0][0][2 * r], s[0][0][2 * r + 1]), fmaxf(s[0][1][2 * r], s[0][1][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[r], mx), corr = exp2f(m[r] - m_new);
            m[r] = m_new;
            l[r] *= corr;
#pragma unroll
            for (int nd = 0; nd < HD / 8; nd++) {
                o[0][nd][2 * r] *= corr;
                o[0][nd][2 * r + 1] *= corr;
            }
#pragma unroll
            for (int nb = 0; nb < 2; nb++)
#pragma unroll
                for (int e = 2 * r; e < 2 * r + 2; e++) {
                    // p as the P V mma will see it (bf16), so l sums the same weights
                    const float p = __bfloat162float(__float2bfloat16_rn(exp2f(s[0][nb][e] - m_new)));
                    s[0][nb][e] = p;
                    l[r] += p;
                }
        }
        mma_p_regs_b_kn<HD, 16>(o, s, sm.v[stage], 16 * warp);
    }
    cp_async_wait<0>();  // only empty groups can be pending here; the K stages become O below
    __syncthreads();

    // Merge the 4 warps: the row sums over each quad, then per row the block max M, each warp's factor
    // and the block's sum; every thread then sums the warps' O for its output elements.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    float* so = sm.o();  // (WARPS, ROWS, HD)
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = gr + 8 * r;
        if (t4 == 0) {
            sm.m[warp][row] = m[r];
            sm.l[warp][row] = l[r];
        }
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++)
            *reinterpret_cast<float2*>(so + ((size_t)warp * DECODE_MMA_ROWS + row) * HD + nd * 8 + 2 * t4) =
                make_float2(o[0][nd][2 * r], o[0][nd][2 * r + 1]);
    }
    __syncthreads();
    if (threadIdx.x < DECODE_MMA_ROWS) {
        const int row = threadIdx.x;
        float M = -FLT_MAX, sum = 0.0f;
        for (int w = 0; w < DECODE_MMA_WARPS; w++) M = fmaxf(M, sm.m[w][row]);
        for (int w = 0; w < DECODE_MMA_WARPS; w++) {
            sm.f[w][row] = exp2f(sm.m[w][row] - M);  // a warp without keys: exp2(-FLT_MAX - M) = 0, or 1 if none has
            sum += sm.f[w][row] * sm.l[w][row];
        }
        sm.M[row] = M;
        sm.L[row] = sum;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += DECODE_MMA_THREADS) {
        const int g = idx / HD, d = idx % HD;
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < DECODE_MMA_WARPS; w++) acc += sm.f[w][g] * so[((size_t)w * DECODE_MMA_ROWS + g) * HD + d];
        if (used == 1) {  // sum = 0 only for an idle sequence (no keys): zeros
            const float sum = sm.L[g];
            out[((size_t)b * L.NH + kvh * G + g) * HD + d] = from_float<bf16>(sum > 0.0f ? acc / sum : 0.0f);
        } else {  // partial `split` of head kvh * G + g, in the layout decode_merge_splits reads
            const size_t p = ((size_t)bk * G + g) * splits + split;  // bk * G = b * NH + kvh * G
            part_o[p * HD + d] = acc;
            if (d == 0) {
                part_ml[2 * p] = sm.M[g];
                part_ml[2 * p + 1] = sm.L[g];
            }
        }
    }
}

// grid (B * NKV), 128 threads: the partials of the sequences that used more than one split, merged by
// the shipped kernel's decode_merge_splits (those with one were written by the split kernel). Every
// used split holds >= 1 key, so its m is finite and the sum > 0.
static __global__ void decode_mma_merge_kernel(attention_detail::bf16* out, const float* part_o, const float* part_ml,
                                               const int* pos, QKVLayout L, int S, int window, int splits) {
    const int bk = blockIdx.x, b = bk / L.NKV, kvh = bk % L.NKV, G = L.NH / L.NKV;
    const int used = decode_mma_used_splits(attention_detail::decode_span(pos[b], S, window).n, splits);
    if (used <= 1) return;
    for (int g = 0; g < G; g++)
        attention_detail::decode_merge_splits(out, part_o, part_ml, b, kvh * G + g, L.NH, L.HD, used, splits,
                                              threadIdx.x, blockDim.x);
}

// scratch: decode_mma_scratch_floats(...) floats (none for one split).
static size_t decode_mma_scratch_floats(int B, int NH, int HD, int splits) {
    return splits > 1 ? (size_t)B * NH * splits * (HD + 2) : 0;
}
template <int HD>
static void decode_mma_launch(floatX* out, float* scratch, const floatX* qkv, const floatX* k_cache,
                              const floatX* v_cache, const int* pos, int B, int NH, int NKV, int S, int window,
                              int splits, cudaStream_t st) {
    constexpr int smem = (int)sizeof(DecodeMmaSmem<HD>);
    static const bool once = (attention_detail::allow_smem(decode_mma_split_kernel<HD>, smem), true);
    (void)once;
    const QKVLayout L{NH, NKV, HD};
    float* part_o = splits > 1 ? scratch : nullptr;
    float* part_ml = splits > 1 ? scratch + (size_t)B * NH * splits * HD : nullptr;
    decode_mma_split_kernel<HD><<<dim3(splits, B * NKV), DECODE_MMA_THREADS, smem, st>>>(
        out, part_o, part_ml, qkv, k_cache, v_cache, pos, L, S, window, splits);
    cudaCheckLaunch();
    if (splits > 1) {
        decode_mma_merge_kernel<<<B * NKV, 128, 0, st>>>(out, part_o, part_ml, pos, L, S, window, splits);
        cudaCheckLaunch();
    }
}
static void decode_mma(floatX* out, float* scratch, const floatX* qkv, const floatX* k_cache, const floatX* v_cache,
                       const int* pos, int B, int NH, int NKV, int HD, int S, int window, int splits,
                       cudaStream_t st) {
    if (NH / NKV > DECODE_MMA_ROWS)
        fail("decode_mma: a group of %d query heads (at most %d)", NH / NKV, DECODE_MMA_ROWS);
    if (HD == 64)
        decode_mma_launch<64>(out, scratch, qkv, k_cache, v_cache, pos, B, NH, NKV, S, window, splits, st);
    else if (HD == 128)
        decode_mma_launch<128>(out, scratch, qkv, k_cache, v_cache, pos, B, NH, NKV, S, window, splits, st);
    else
        fail("decode_mma: HD=%d (64 or 128)", HD);
}
#endif  // !PRECISION_FP32

// ---------------------------------------------------------------- configurations
// One cache per configuration (B, heads, HD, S slots, window), filled once; its cases then set the
// positions: len > 0 puts every sequence at position len - 1 (len > S with a window: a wrapped ring);
// MIXED draws each position from [0, S) (window: [0, 4S), most of them wrapped), puts sequence 0 at
// the last one and sequence 1 (B >= 3) idle (pos = -1).
constexpr int MIXED = 0;
struct Config {
    const char* name;
    int B, NH, NKV, HD, S, window;
    std::vector<int> lens;
};

static std::vector<Config> full_configs() {
    std::vector<Config> c;
    const std::vector<int> lens = {128, 512, 1024, 2048, 4096};
    for (int B : {1, 8, 64}) {
        std::vector<int> l = lens;
        if (B > 1) l.push_back(MIXED);
        c.push_back({"gpt2", B, 12, 12, 64, 4096, 0, l});
        c.push_back({"gqa", B, 32, 8, 128, 4096, 0, l});
    }
    for (int B : {1, 64})  // generate's cache for GPT-2 124M (S = 1024) at the bench's lengths (64 + 1..256)
        c.push_back({"gpt2-1k", B, 12, 12, 64, 1024, 0, {128, 320}});
    c.push_back({"gpt2-w", 8, 12, 12, 64, 1024, 1024, {4096, MIXED}});  // ring of W = 1024 slots
    c.push_back({"gqa-w", 64, 32, 8, 128, 1024, 1024, {4000, MIXED}});
    c.push_back({"odd", 5, 6, 2, 128, 1000, 0, {777, MIXED}});           // group of 3 in a 4-head block
    c.push_back({"odd-g12", 3, 24, 2, 64, 777, 300, {1000, MIXED}});     // group of 12: two head blocks; S > W
    return c;
}
static std::vector<Config> small_configs() {
    return {
        {"small", 3, 6, 2, 64, 200, 0, {MIXED, 200}},
        {"small-w", 3, 4, 4, 128, 200, 200, {700, MIXED}},  // split and wrapped
        {"small-g12", 2, 12, 1, 64, 130, 0, {130, MIXED}},
    };
}

static std::vector<int> case_positions(const Config& c, int len, uint64_t seed) {
    std::vector<int> pos(c.B, len - 1);
    if (len == MIXED) {
        const int P = c.window > 0 ? 4 * c.S : c.S;
        pos = lab::rand_ints(c.B, seed, P);
        pos[0] = P - 1;
        if (c.B >= 3) pos[1] = -1;
    }
    return pos;
}

static void run_config(lab::Lab& lab, const Config& c, uint64_t seed) {
    const int B = c.B, NH = c.NH, NKV = c.NKV, HD = c.HD, S = c.S, W = c.window;
    const size_t n_qkv = (size_t)B * (NH + 2 * NKV) * HD, n_cache = (size_t)B * NKV * S * HD,
                 n_out = (size_t)B * NH * HD;
    cudaStream_t st = lab.stream();
    // uniform(-2, 2): scores q.k/sqrt(HD) have std 4/3, peaked enough to test the softmax
    std::vector<float> kc_h = lab::rand_uniform(n_cache, seed, -2.0f, 2.0f);
    std::vector<float> vc_h = lab::rand_uniform(n_cache, seed + 1, -2.0f, 2.0f);
    lab::DevBuf<floatX> kc(n_cache, "k_cache"), vc(n_cache, "v_cache"), qkv(n_qkv, "qkv"), out(n_out, "out");
    lab::DevBuf<int> pos(B, "pos");
    kc.upload(kc_h);
    vc.upload(vc_h);

    const DecodePlan plan = attention_detail::decode_plan(B, NH, NKV, S, W, lab.ctx.props.multiProcessorCount);
    DecodePlan no_split = plan, twice = plan;
    no_split.max_splits = 1;
    no_split.cluster = false;
    twice.max_splits = std::min(2 * plan.max_splits, ceil_div(W > 0 ? W : S, attention_detail::DECODE_MIN_CHUNK));
    twice.min_chunk = std::max(attention_detail::DECODE_MIN_CHUNK, plan.min_chunk / 2);
    twice.cluster = false;
    DecodePlan unfused = plan, no_cluster = plan;
    unfused.fused_combine = false;
    unfused.cluster = false;
    no_cluster.cluster = false;
    DecodePlan waves = attention_detail::decode_plan_waves(B, NH, NKV, S, W, lab.ctx.props.multiProcessorCount);
    // Sized for the plan with the most splits (the counters come first in every plan's layout); zeroed once.
    size_t scratch_floats = 1;
    for (DecodePlan* p : {&twice, &waves, &no_cluster})
        scratch_floats = std::max(scratch_floats, attention_detail::DecodeScratch::floats(B, NH, NKV, HD, *p));
    lab::DevBuf<float> scratch(scratch_floats, "scratch");
    if (attention_decode_scratch_floats(B, NH, NKV, HD, S, W) > scratch.size()) fail("lab: scratch too small");
    cudaCheck(cudaMemset(scratch, 0, scratch.size() * sizeof(float)));
    printf("# %s B=%d NH=%d NKV=%d HD=%d S=%d W=%d: %d splits at most (chunks >= %d keys%s), %d head block(s) of %d "
           "heads per KV head; waves plan: %d splits\n",
           c.name, B, NH, NKV, HD, S, W, plan.max_splits, plan.min_chunk, plan.cluster ? ", a cluster" : "",
           plan.head_blocks, plan.heads_per_block, waves.max_splits);
#if !defined(PRECISION_FP32)
    // Variant 13's plan and scratch (its own layout, allocated once here, outside the timing).
    const int mma_splits = decode_mma_splits(B, NKV, S, W, lab.ctx.props.multiProcessorCount);
    const bool mma_fits = NH / NKV <= DECODE_MMA_ROWS;
    lab::DevBuf<float> mma_scratch(std::max<size_t>(1, decode_mma_scratch_floats(B, NH, HD, mma_splits)),
                                   "mma scratch");
    if (lab.selected(13)) {
        if (mma_fits) printf("# variant 13: %d splits at most (chunks >= %d keys)\n", mma_splits, DECODE_MMA_MIN_CHUNK);
        else printf("# variant 13 skipped: a group of %d query heads does not fit its %d-row tile\n", NH / NKV,
                    DECODE_MMA_ROWS);
    }
#endif

    // A prompt of T tokens (lengths 1..T, sequence 0 the longest; small caches get more tokens than
    // slots) into the cache with kv_cache_fill; its check compares the slots it may write, exactly.
    {
        const int T = S <= 256 ? S + 50 : 100;
        const std::vector<float> prompt_h =
            lab::rand_uniform((size_t)B * T * (NH + 2 * NKV) * HD, seed + 2, -2.0f, 2.0f);
        std::vector<int> len_h = lab::rand_ints(B, seed + 3, T);
        for (int& x : len_h) x += 1;
        len_h[0] = T;
        lab::DevBuf<floatX> prompt(prompt_h.size(), "prompt");
        lab::DevBuf<int> lengths(B, "lengths");
        prompt.upload(prompt_h);
        lengths.upload(len_h);
        cpu::kv_cache_fill(kc_h.data(), vc_h.data(), prompt_h.data(), len_h.data(), B, T, NH, NKV, HD, S);
        auto fill = [&] { kv_cache_fill(kc, vc, prompt, lengths, B, T, NH, NKV, HD, S, st); };
        auto check_fill = [&] {
            const size_t rows = std::min(S, T) * (size_t)HD;  // slots 0 .. min(S, T) - 1 of each (b, kvh)
            std::vector<float> got, want;
            for (size_t bh = 0; bh < (size_t)B * NKV; bh++) {
                for (const auto* buf : {&kc, &vc}) {
                    auto r = buf->download(bh * S * HD, rows);
                    got.insert(got.end(), r.begin(), r.end());
                }
                want.insert(want.end(), kc_h.begin() + bh * S * HD, kc_h.begin() + bh * S * HD + rows);
                want.insert(want.end(), vc_h.begin() + bh * S * HD, vc_h.begin() + bh * S * HD + rows);
            }
            const bool guards = kc.guard_intact() && vc.guard_intact();
            if (!guards) printf("    k/v_cache  FAIL: the fill wrote into a guard region\n");
            return lab.compare("filled", got, want, lab::Tol{0.0, 0.0}) && guards;
        };
        fill();
        cudaCheck(cudaStreamSynchronize(st));
        long long tokens = 0;
        for (int x : len_h) tokens += std::min(x, S);
        const double bytes = (double)tokens * NKV * HD * 4 * sizeof(floatX) + B * sizeof(int);
        lab.run(lab::Lab::strprintf("kv_cache_fill %s B=%d T=%d NKV=%d HD=%d S=%d", c.name, B, T, NKV, HD, S), 0,
                "shipped", bytes, 0.0, lab::Bound::Memory, [] {}, fill, check_fill);
        if (!lab.selected(0) && !check_fill()) fail("lab: kv_cache_fill wrote wrong values (%s)", c.name);
    }

    for (size_t ci = 0; ci < c.lens.size(); ci++) {
        const uint64_t case_seed = seed + 100 * (ci + 1);
        const std::vector<int> pos_h = case_positions(c, c.lens[ci], case_seed);
        const std::vector<float> qkv_h = lab::rand_uniform(n_qkv, case_seed + 1, -2.0f, 2.0f);
        qkv.upload(qkv_h);
        pos.upload(pos_h);

        // The new token's K/V into the caches (host reference and device), then its check: every
        // appended row equals the qkv row's K/V exactly.
        cpu::kv_cache_append(kc_h.data(), vc_h.data(), qkv_h.data(), pos_h.data(), B, NH, NKV, HD, S);
        auto append = [&] { kv_cache_append(kc, vc, qkv, pos, B, NH, NKV, HD, S, st); };
        append();
        cudaCheck(cudaStreamSynchronize(st));
        auto check_append = [&] {
            std::vector<float> got, want;
            for (int b = 0; b < B; b++) {
                if (pos_h[b] < 0) continue;
                for (int kvh = 0; kvh < NKV; kvh++) {
                    const size_t off = (((size_t)b * NKV + kvh) * S + pos_h[b] % S) * HD;
                    for (const auto* buf : {&kc, &vc}) {
                        auto row = buf->download(off, HD);
                        got.insert(got.end(), row.begin(), row.end());
                    }
                    want.insert(want.end(), kc_h.begin() + off, kc_h.begin() + off + HD);
                    want.insert(want.end(), vc_h.begin() + off, vc_h.begin() + off + HD);
                }
            }
            const bool guards = kc.guard_intact() && vc.guard_intact();
            if (!guards) printf("    k/v_cache  FAIL: the append wrote into a guard region\n");
            return lab.compare("appended", got, want, lab::Tol{0.0, 0.0}) && guards;
        };
        long long keys = 0, appended = 0;
        for (int p : pos_h) {
            keys += attention_detail::decode_span(p, S, W).n;
            appended += p >= 0;
        }
        if (ci == 0 && lab.selected(0)) {
            const double bytes = (double)appended * NKV * HD * 4 * sizeof(floatX) + B * sizeof(int);
            lab.run(lab::Lab::strprintf("kv_cache_append %s B=%d NKV=%d HD=%d S=%d", c.name, B, NKV, HD, S), 0,
                    "shipped", bytes, 0.0, lab::Bound::Memory, [] {}, append, check_append);
        } else if (!check_append()) {
            fail("lab: kv_cache_append wrote wrong values (%s, case %zu)", c.name, ci);
        }

        std::vector<float> out_ref(n_out);
        cpu::attention_decode(out_ref.data(), qkv_h.data(), kc_h.data(), vc_h.data(), pos_h.data(), B, NH, NKV, HD, S,
                              W);
        const double bytes =
            (double)keys * NKV * HD * 2 * sizeof(floatX) + 2.0 * n_out * sizeof(floatX) + B * sizeof(int);
        const double flops = 4.0 * HD * NH * (double)keys;
        const std::string len = c.lens[ci] == MIXED ? std::string("mixed") : std::to_string(c.lens[ci]);
        const std::string op = lab::Lab::strprintf("attention_decode %s B=%d NH=%d NKV=%d HD=%d S=%d W=%d len=%s",
                                                   c.name, B, NH, NKV, HD, S, W, len.c_str());
        auto reset = [&] { out.poison(st); };
        auto check = [&] { return lab.check(out, out_ref); };
        auto variant = [&](int v, const char* what, const std::function<void()>& launch) {
            lab.run(op, v, what, bytes, flops, lab::Bound::Memory, reset, launch, check);
        };
        variant(0, "shipped", [&] { attention_decode(out, qkv, kc, vc, pos, B, NH, NKV, HD, S, st, W, scratch, true,
                                                     false, true); });
        variant(1, "baseline, block per query head",
                [&] { decode_baseline(out, qkv, kc, vc, pos, B, NH, NKV, HD, S, W, st); });
        variant(2, "shipped kernel, no split", [&] {
            attention_detail::attention_decode_with_plan(out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH,
                                                         NKV, HD, S, W, scratch.get(), no_split, st);
        });
        variant(3, "shipped kernel, 2x splits", [&] {
            attention_detail::attention_decode_with_plan(out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH,
                                                         NKV, HD, S, W, scratch.get(), twice, st);
        });
        variant(4, "combine kernel (unfused)", [&] {
            attention_detail::attention_decode_with_plan(out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH,
                                                         NKV, HD, S, W, scratch.get(), unfused, st);
        });
        variant(5, "8 keys a row group per step", [&] {
            attention_detail::attention_decode_with_plan<floatX, attention_detail::DecodeKnobs<8>>(
                out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH, NKV, HD, S, W, scratch.get(), plan, st);
        });
        variant(6, "prefetch the next step", [&] {
            attention_detail::attention_decode_with_plan<floatX, attention_detail::DecodeKnobs<4, true>>(
                out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH, NKV, HD, S, W, scratch.get(), plan, st);
        });
        variant(7, "reduce-scatter dot products", [&] {
            attention_detail::attention_decode_with_plan<floatX, attention_detail::DecodeKnobs<4, false, true>>(
                out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH, NKV, HD, S, W, scratch.get(), plan, st);
        });
        variant(9, "no early loads", [&] {
            attention_decode(out, qkv, kc, vc, pos, B, NH, NKV, HD, S, st, W, scratch, true, false, false);
        });
        variant(10, "waves plan, early loads (old 0)", [&] {
            attention_detail::attention_decode_with_plan<floatX, attention_detail::DecodeShippedEarly>(
                out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH, NKV, HD, S, W, scratch.get(), waves, st,
                true);
        });
        variant(11, "waves plan, no early loads (old 9)", [&] {
            attention_detail::attention_decode_with_plan(out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH,
                                                         NKV, HD, S, W, scratch.get(), waves, st, true);
        });
        variant(12, "shipped plan, no cluster", [&] {
            attention_detail::attention_decode_with_plan<floatX, attention_detail::DecodeShippedEarly>(
                out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH, NKV, HD, S, W, scratch.get(), no_cluster,
                st, true);
        });
#if !defined(PRECISION_FP32)
        if (mma_fits)
            variant(13, "tensor cores (mma), query group as a 16-row tile", [&] {
                decode_mma(out, mma_scratch, qkv, kc, vc, pos, B, NH, NKV, HD, S, W, mma_splits, st);
            });
#endif
        auto poison_appended = [&] {  // the slots variant 8 must write itself
            out.poison(st);
            for (int b = 0; b < B; b++) {
                if (pos_h[b] < 0) continue;
                for (int kvh = 0; kvh < NKV; kvh++) {
                    const size_t off = (((size_t)b * NKV + kvh) * S + pos_h[b] % S) * HD;
                    cudaCheck(cudaMemsetAsync(kc.get() + off, lab::POISON_BYTE, HD * sizeof(floatX), st));
                    cudaCheck(cudaMemsetAsync(vc.get() + off, lab::POISON_BYTE, HD * sizeof(floatX), st));
                }
            }
        };
        lab.run(op, 8, "append folded in", bytes, flops, lab::Bound::Memory, poison_appended,
                [&] { attention_decode(out, qkv, kc, vc, pos, B, NH, NKV, HD, S, st, W, scratch, true, true); },
                [&] { return check() && check_append(); });
    }
}

int main(int argc, char** argv) {
    std::vector<char*> args;
    bool small = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) small = true;
        else args.push_back(argv[i]);
    }
    lab::Lab lab((int)args.size(), args.data(), "attention_decode.cu");
    uint64_t seed = 4321;
    for (const Config& c : small ? small_configs() : full_configs()) {
        run_config(lab, c, seed);
        seed += 1000;
    }
    return lab.finish();
}
