// attention_decode.cu: the decode attention lab: one new token per sequence against its layer's KV
// cache (llmc/attention_decode.cuh; the cache copies of llmc/kv_cache.cuh), B = 1, 8, 64 at cache
// lengths 128..4096, mixed lengths in a batch (with an idle sequence), sliding windows over a wrapped
// ring buffer, and awkward groups.
// Each configuration first fills its cache from a prompt of mixed lengths with kv_cache_fill (checked
// exactly on every slot it may write); each case appends the token's K/V with kv_cache_append
// (checked slot by slot, exactly), then every variant runs with poisoned outputs, is checked against
// the CPU reference (llmc/cpu/attention_decode.h, fp32, every sequence of the batch) and timed by the
// shared harness.
//   0  shipped attention_decode, as the fused step at B <= 8 launches it (pdl, early loads: these keep
//      it on the CUDA-core kernels at every shape; the tensor-core route runs in 8 and 9): split-K
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
//      a second kernel (this file's decode_combine_kernel) merges them; what the fused combine of
//      variant 0 saves (one launch a call)
//   5  8 keys a row group per step instead of 4 (twice the loads in flight, more registers; GB 8 spills)
//   6  prefetch: the next step's K/V loads issued before the current step's math (a second register set)
//   7  reduce-scatter: the U*GB dot products of a step summed over the row group's lanes by halving
//      exchanges (15 shuffles for 16 sums over 16 lanes, then 16 to gather) instead of one butterfly
//      each (64 shuffles and adds): ~14% fewer instructions a key at G 4
//      (5-7: the shipped split kernel with a key loop of this file in place of DecodeKeyLoop)
//   8  append folded in (attention_decode(..., append = true), the decode step at B > 8): the
//      appended slots are poisoned first; the kernel writes them from qkv and reads the newest key
//      from qkv; checked on the output and on the slots, as kv_cache_append is. Against variant 0 +
//      the kv_cache_append line: one launch less. Where the entry point takes the tensor-core route
//      (decode_mma_route: bf16, G <= 16, the large-batch plan; a "#" line says so), this is
//      kv_cache_append then variant 13's kernels, named "append, then tensor cores"; 15 is the old call
//   9  without the early loads (attention_decode(..., early = false)): pos and the first step's keys
//      read after the wait, as before the latency work and as the B > 8 step runs it (a lone kernel
//      gains nothing from them: the gain is in a PDL chain, dev/cuda/decode_step.cu's whole step); on
//      the tensor-core route (as 8) variant 13's kernels, with the entry point's splits; 14 is the old call
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
//      shape (Triton: 4230 GB/s at gqa B 64 len 4096, variant 0 1525). Its code is now
//      llmc/attention_decode_mma.cuh (decode_mma), which attention_decode routes the batched decode to;
//      here it runs at every shape whose group fits, with the same plan (decode_mma_splits)
//  14  old shipped path (CUDA cores): attention_decode_with_plan with decode_plan and pdl, no early
//      loads: what variant 9 ran before the tensor-core route (the same as 9 where it is not taken)
//  15  old shipped path (CUDA cores), append folded in: what variant 8 ran before the route (as 8)
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
// gpt2-1k B 1 len 320 0.0117 vs 0.0100, odd-g12 (B 3, G 12, window) 0.0169 vs 0.0133. Since wired
// into attention_decode for the batched decode only (merged in 2355b3c; variants 8 and 9 where
// routed, 14 and 15 the old path beside them): it neither appends the token's K/V (kv_cache_append
// runs first), nor waits through PDL or the step counters, nor reads its first keys early, so the
// fused step at B <= 8 keeps the CUDA-core kernels by default (docs/perf.md, "Decode attention").
// H200, 2026-12-05 (thirtieth run, the merged tree 2355b3c; every check passed, memcheck clean on --small),
// route against old path, 14/9 and 15/8: gpt2 B 64 1.24x-1.54x and 1.11x-1.50x, gqa B 64 1.61x-2.54x and
// 1.41x-2.44x, gpt2-r2 2.08x/1.84x at mixed lengths; slower only at g12-r3: 0.79x and 0.73x. gpt2-r2,
// g12-r3 and small-route run the route with 2-3 splits (on 132 SMs). The route's threshold shapes
// (llama114: generate's Llama 114M bench shape, a group of 3, which lost 1.6% end to end with the route;
// g12 past the threshold) are here for a sweep; not yet run.
// The numbers behind decode_plan (llmc/attention_decode.cuh; H200, ms):
// - large batches (base = B * NKV * head_blocks >= SMs): the waves plan split a 128-key cache in 2 and
//   a 512-key cache in 8; at B 64 (waves plan without early loads, as B > 8 runs it, vs no split):
//   gpt2 len 128 0.0307 vs 0.0200, 512 0.0612 vs 0.0528, 1024 0.0902 vs 0.0952; gqa len 128 0.0476 vs
//   0.0336, 512 0.1110 vs 0.1025, 1024 0.1746 vs 0.1881: up to 1024 keys the split gains at most ~7%,
//   hence 1024-key chunks; longer caches still split (gpt2 len 2048: 0.147 split vs 0.179 not).
//   Unsplit, 768 blocks of 4096 keys on 660 block slots make 1.16 waves (~40% of the time idle).
// - small batches: the cluster merge against the fused combine's chain of global round trips: B 1
//   gpt2 len 128 0.0115 ms for the waves plan, ~0.005 of it the harness's empty-kernel time.
// - past DECODE_CLUSTER_MAX_KEYS (S 4096), gpt2 B 1 len 4096: cluster 0.0252 (8 splits of 512 keys;
//   the same splits through global memory 0.0269) vs waves 0.0185 (~32 splits of 128); a short
//   sequence in such a cache pays the global merge (len 128: 0.0108 vs 0.0084).
// And behind decode_mma_route: B 64 gqa 32/8 HD 128 2.5-2.8x, gpt2 12/12 HD 64 1.4-1.55x; a group of
// 12 at the threshold (B 33, 3 splits) 0.73-0.79x; generate's whole step for the Llama 114M shape
// (groups of 3, B 64) 0.98x; small batches: gqa B 8 2.3x, but B 1 with generate's 1024-slot cache
// 0.85x and a group of 12 with a window at B 3 0.79x.
#include <algorithm>
#include "harness.cuh"
#include "llmc/attention_decode.cuh"
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

// ---------------------------------------------------------------- variant 4: a second kernel merges
// The split kernel under a plan without the fused combine leaves its partials in the scratch; grid
// (NH, B), HD threads: thread d merges dim d of one (sequence, head) over that sequence's splits
// (the sequences of one split were written by the split kernel). Reads (HD + 2) floats a split.
static __global__ void decode_combine_kernel(floatX* out, attention_detail::DecodeScratch scratch, const int* pos,
                                             int NH, int HD, int S, int window, int max_splits, int min_chunk) {
    using namespace attention_detail;
    const int h = blockIdx.x, b = blockIdx.y;
    const int nsplits = decode_splits(decode_span(pos[b], S, window).n, max_splits, min_chunk);
    if (nsplits > 1)
        decode_merge_splits(out, scratch.part_o, scratch.part_ml, b, h, NH, HD, nsplits, max_splits, threadIdx.x,
                            blockDim.x);
}
static void decode_unfused(floatX* out, const floatX* qkv, const floatX* k_cache, const floatX* v_cache,
                           const int* pos, int B, int NH, int NKV, int HD, int S, int window, float* scratch,
                           const DecodePlan& plan, const CudaContext& ctx) {
    attention_detail::attention_decode_with_plan(out, qkv, k_cache, v_cache, pos, B, NH, NKV, HD, S, window, scratch,
                                                 plan, ctx);
    if (plan.max_splits == 1) return;
    const attention_detail::DecodeScratch sc(scratch, B, NH, NKV, HD, plan);
    decode_combine_kernel<<<dim3(NH, B), HD, 0, ctx.stream>>>(out, sc, pos, NH, HD, S, window, plan.max_splits, plan.min_chunk);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------- variants 5-7: other key loops
// The shipped split kernel with one of these in place of its key loop (DecodeKnobs' Loop, which
// attention_detail::DecodeKeyLoop ships): each drives the kernel's DecodeSplitBlock phases.
using attention_detail::DecodeKnobs;
// variant 5: 8 keys a row group per step (the shipped loop at U = 8)
struct KeyLoopU8 : attention_detail::DecodeKeyLoop {
    static constexpr int U = 8;
};
// variant 6: the next step's loads issued before this step's math
struct KeyLoopPrefetch {
    static constexpr int U = 4;
    template <class Block>
    __device__ __forceinline__ static void run(Block& blk, typename Block::Pack (&kr)[U],
                                               typename Block::Pack (&vr)[U], bool preloaded) {
        if (!preloaded) blk.load_step(blk.j0, kr, vr);
        for (int jb = blk.j0; jb < blk.j1; jb += Block::STEP) {
            typename Block::Pack kn[U], vn[U];
            blk.load_step(jb + Block::STEP, kn, vn);  // past the chunk: zeros, no loads
            blk.consume(jb, kr, vr);
#pragma unroll
            for (int u = 0; u < U; u++) {
                kr[u] = kn[u];
                vr[u] = vn[u];
            }
        }
    }
};
// variant 7: sums each of v[0..N) over the TPR lanes of a row group, reduce-scatter style: at every
// xor level a lane keeps half of the values it still holds (the upper lane the upper half) and adds
// the partner's copy of that half, so log2(TPR) levels take N/2 + N/4 + ... shuffles instead of
// N * log2(TPR). After it, lane r of the group holds the sums of indices r*N/TPR .. + N/TPR - 1 in
// v[0..N/TPR) when N >= TPR; when N < TPR, v[0] holds the sum of index r / (TPR/N) (the levels past
// the scatter are plain butterflies). gather_sums then gives every lane all N sums.
template <int N, int TPR>
__device__ __forceinline__ void reduce_scatter(float (&v)[N], int lane) {
    static_assert((N & (N - 1)) == 0 && (TPR & (TPR - 1)) == 0, "halving needs powers of two");
#pragma unroll
    for (int k = 0; (1 << k) < TPR; k++) {
        const int o = TPR >> (k + 1);
        const int held = N >> k;  // values this lane still holds (compile-time after unrolling)
        if (held > 1) {
            const bool upper = lane & o;
#pragma unroll
            for (int i = 0; i < held / 2; i++) {
                const float send = upper ? v[i] : v[i + held / 2];
                const float keep = upper ? v[i + held / 2] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
        }
    }
}
template <int N, int TPR>
__device__ __forceinline__ void gather_sums(float (&sums)[N], const float (&v)[N]) {
    constexpr int R = N >= TPR ? N / TPR : 1;  // sums a lane holds
#pragma unroll
    for (int i = 0; i < N; i++)
        sums[i] = __shfl_sync(0xffffffffu, v[i % R], N >= TPR ? i / R : i * (TPR / N), TPR);
}
// DecodeSplitBlock::consume with the U*GB dot products reduced together
template <typename T, int HD, int GB, int U>
__device__ __forceinline__ void consume_scatter(attention_detail::DecodeSplitBlock<T, HD, GB, U>& blk, int jb,
                                                const Packed128<T> (&kr)[U], const Packed128<T> (&vr)[U]) {
    using Block = attention_detail::DecodeSplitBlock<T, HD, GB, U>;
    float part[U * GB], sums[U * GB], s[U][GB];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int g = 0; g < GB; g++) part[u * GB + g] = blk.lane_dot(g, kr[u]);
    reduce_scatter<U * GB, Block::TPR>(part, blk.lane);
    gather_sums<U * GB, Block::TPR>(sums, part);
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int g = 0; g < GB; g++) s[u][g] = jb + u * Block::ROWS + blk.row < blk.j1 ? sums[u * GB + g] : -INFINITY;
    blk.update(s, vr);
}
struct KeyLoopScatter {
    static constexpr int U = 4;
    template <class Block>
    __device__ __forceinline__ static void run(Block& blk, typename Block::Pack (&kr)[U],
                                               typename Block::Pack (&vr)[U], bool preloaded) {
        for (int jb = blk.j0; jb < blk.j1; jb += Block::STEP) {
            if (jb != blk.j0 || !preloaded) blk.load_step(jb, kr, vr);
            consume_scatter(blk, jb, kr, vr);
        }
    }
};

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
    // The tensor-core route (variants 8, 9) with more than one split, so its merge runs (on 132 SMs: the
    // route needs B * NKV * head_blocks >= 132, and takes ceil(264 / (B * NKV)) splits): 2 splits; 3 splits
    // with a group of 12 (two head blocks), a window and S no multiple of the 64-key tile.
    c.push_back({"gpt2-r2", 16, 12, 12, 64, 1024, 0, {512, MIXED}});
    c.push_back({"g12-r3", 33, 24, 2, 64, 777, 300, {1000, MIXED}});
    // Where the route's gain is in doubt (docs/perf.md, "Decode attention"): the Llama 114M shape (12/4,
    // HD 64, generate's 1024-slot cache) at the bench's B 64 and lengths and just past the threshold
    // (B 34: 136 KV heads), and a group of 12 with twice the threshold's batch.
    c.push_back({"llama114", 64, 12, 4, 64, 1024, 0, {128, 320, 1024}});
    c.push_back({"llama114", 34, 12, 4, 64, 1024, 0, {320, 1024}});
    c.push_back({"g12", 66, 24, 2, 64, 1024, 0, {320, 1024}});
    return c;
}
static std::vector<Config> small_configs() {
    return {
        {"small", 3, 6, 2, 64, 200, 0, {MIXED, 200}},
        {"small-w", 3, 4, 4, 128, 200, 200, {700, MIXED}},  // split and wrapped
        {"small-g12", 2, 12, 1, 64, 130, 0, {130, MIXED}},
        {"small-route", 34, 12, 4, 64, 200, 0, {MIXED, 200}},  // the tensor-core route, 2 splits (132 SMs)
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

    const DecodePlan plan = attention_detail::decode_plan(B, NH, NKV, S, W, lab.ctx.props.multiProcessorCount,
                                                                 attention_detail::decode_clusters_available(lab.ctx));
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
    // Sized for the plan with the most splits (the counters come first in every plan's layout) and for
    // the shipped entry point's routes (attention_decode_scratch_floats); zeroed once.
    size_t scratch_floats = std::max<size_t>(1, attention_decode_scratch_floats(B, NH, NKV, HD, S, W, lab.ctx));
    for (DecodePlan* p : {&twice, &waves, &no_cluster})
        scratch_floats = std::max(scratch_floats, attention_detail::DecodeScratch::floats(B, NH, NKV, HD, *p));
    lab::DevBuf<float> scratch(scratch_floats, "scratch");
    cudaCheck(cudaMemset(scratch, 0, scratch.size() * sizeof(float)));
    printf("# %s B=%d NH=%d NKV=%d HD=%d S=%d W=%d: %d splits at most (chunks >= %d keys%s), %d head block(s) of %d "
           "heads per KV head; waves plan: %d splits\n",
           c.name, B, NH, NKV, HD, S, W, plan.max_splits, plan.min_chunk, plan.cluster ? ", a cluster" : "",
           plan.head_blocks, plan.heads_per_block, waves.max_splits);
#if !defined(PRECISION_FP32)
    // Variant 13's plan and scratch (its own layout, allocated once here, outside the timing).
    using attention_detail::DECODE_MMA_ROWS;
    const int mma_splits = attention_detail::decode_mma_splits(B, NKV, S, W, lab.ctx.props.multiProcessorCount);
    const bool mma_fits = NH / NKV <= DECODE_MMA_ROWS;
    lab::DevBuf<float> mma_scratch(
        std::max<size_t>(1, attention_detail::decode_mma_scratch_floats(B, NH, HD, mma_splits)), "mma scratch");
    if (lab.selected(13)) {
        if (mma_fits)
            printf("# variant 13: %d splits at most (chunks >= %d keys)\n", mma_splits,
                   attention_detail::DECODE_MMA_MIN_CHUNK);
        else printf("# variant 13 skipped: a group of %d query heads does not fit its %d-row tile\n", NH / NKV,
                    DECODE_MMA_ROWS);
    }
#endif
    // Where the entry point's calls without early loads (variants 8 and 9) take the tensor-core kernels.
    const bool routed = attention_detail::decode_mma_route(B, NH, NKV, HD, plan, lab.ctx.props.multiProcessorCount);
    if (routed) printf("# variants 8 and 9 run the tensor-core kernels here (variant 13's)\n");

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
        variant(0, "shipped", [&] {
            attention_decode(out, qkv, kc, vc, pos, B, NH, NKV, HD, S, lab.ctx, W, scratch, true, false, true);
        });
        variant(1, "baseline, block per query head",
                [&] { decode_baseline(out, qkv, kc, vc, pos, B, NH, NKV, HD, S, W, st); });
        variant(2, "shipped kernel, no split", [&] {
            attention_detail::attention_decode_with_plan(out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH,
                                                         NKV, HD, S, W, scratch.get(), no_split, lab.ctx);
        });
        variant(3, "shipped kernel, 2x splits", [&] {
            attention_detail::attention_decode_with_plan(out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH,
                                                         NKV, HD, S, W, scratch.get(), twice, lab.ctx);
        });
        variant(4, "combine kernel (unfused)",
                [&] { decode_unfused(out, qkv, kc, vc, pos, B, NH, NKV, HD, S, W, scratch, unfused, lab.ctx); });
        variant(5, "8 keys a row group per step", [&] {
            attention_detail::attention_decode_with_plan<floatX, DecodeKnobs<false, false, KeyLoopU8>>(
                out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH, NKV, HD, S, W, scratch.get(), plan, lab.ctx);
        });
        variant(6, "prefetch the next step", [&] {
            attention_detail::attention_decode_with_plan<floatX, DecodeKnobs<false, false, KeyLoopPrefetch>>(
                out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH, NKV, HD, S, W, scratch.get(), plan, lab.ctx);
        });
        variant(7, "reduce-scatter dot products", [&] {
            attention_detail::attention_decode_with_plan<floatX, DecodeKnobs<false, false, KeyLoopScatter>>(
                out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH, NKV, HD, S, W, scratch.get(), plan, lab.ctx);
        });
        variant(9, routed ? "no early loads: tensor cores" : "no early loads", [&] {
            attention_decode(out, qkv, kc, vc, pos, B, NH, NKV, HD, S, lab.ctx, W, scratch, true, false, false);
        });
        variant(10, "waves plan, early loads (old 0)", [&] {
            attention_detail::attention_decode_with_plan<floatX, DecodeKnobs<false, true>>(
                out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH, NKV, HD, S, W, scratch.get(), waves, lab.ctx,
                true);
        });
        variant(11, "waves plan, no early loads (old 9)", [&] {
            attention_detail::attention_decode_with_plan(out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH,
                                                         NKV, HD, S, W, scratch.get(), waves, lab.ctx, true);
        });
        variant(12, "shipped plan, no cluster", [&] {
            attention_detail::attention_decode_with_plan<floatX, DecodeKnobs<false, true>>(
                out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH, NKV, HD, S, W, scratch.get(), no_cluster,
                lab.ctx, true);
        });
#if !defined(PRECISION_FP32)
        if (mma_fits)
            variant(13, "tensor cores (mma), query group as a 16-row tile", [&] {
                attention_detail::decode_mma(out, mma_scratch, qkv, kc, vc, pos, B, NH, NKV, HD, S, W, mma_splits,
                                             lab.ctx);
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
        lab.run(op, 8, routed ? "append, then tensor cores" : "append folded in", bytes, flops, lab::Bound::Memory,
                poison_appended,
                [&] { attention_decode(out, qkv, kc, vc, pos, B, NH, NKV, HD, S, lab.ctx, W, scratch, true, true); },
                [&] { return check() && check_append(); });
        // The CUDA-core kernels as the entry point ran them before the tensor-core route, whatever it
        // takes now: variant 9's call (14) and variant 8's (15), side by side with them.
        variant(14, "old shipped path (CUDA cores)", [&] {
            attention_detail::attention_decode_with_plan(out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH,
                                                         NKV, HD, S, W, scratch.get(), plan, lab.ctx, true);
        });
        lab.run(op, 15, "old shipped path (CUDA cores), append folded in", bytes, flops, lab::Bound::Memory,
                poison_appended, [&] {
                    attention_detail::attention_decode_with_plan<floatX, DecodeKnobs<true, false>>(
                        out.get(), qkv.get(), kc.get(), vc.get(), pos.get(), B, NH, NKV, HD, S, W, scratch.get(), plan,
                        lab.ctx, true);
                },
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
