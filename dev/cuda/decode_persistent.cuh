// decode_persistent.cuh: a decode step's transformer blocks as one persistent kernel, a lab variant
// that lost to the shipped fused step (dev/cuda/decode_step.cu runs it between the step's first
// kernel, advance_and_encode or the encoder, and the norm+lm_head GEMV of llmc/model_infer.cuh).
//
// Why: at B = 1 the fused step (model_infer.cuh, decode_layers_fused) is 5 kernels a layer, each a
// 1-5 MB read that spends 4-8 us, most of it the hand-off from one grid to the next (a grid's
// completion, the next one's wait), not bandwidth: GPT-2 124M's layers are 170 MB, 43 us at 4 TB/s,
// and took ~216 us of a 251 us token (docs/perf.md, "Generation"). Here one grid of one block per SM
// runs all layers; the five steps of a layer are phases separated by a grid barrier (a release
// reduction on a counter, polled with an acquire load: the pattern of cooperative groups' grid sync
// and of a counter-per-kernel wait tried on the fused step), and the weights stream on their own: the weights never depend on the
// step, so each block's slice of every matrix it multiplies is copied into shared memory by the copy
// engine (cp.async.bulk, completing on an mbarrier) up to PERSIST_MAX_SLOTS matrices ahead, while the
// block is still in the phases before it. After a barrier a phase reads only its inputs from L2 and
// multiplies from shared memory.
//
// Phases of layer l (M = B sequences, G = the grid's blocks, block g):
//   qkv       xs = ln1(res1) (every block normalizes the M rows: gemv.cuh's normalize_rows), then
//             rows [QKV*g/G, QKV*(g+1)/G) of qkv = xs Wqkv^T + b, the K and V rows also into the
//             cache slot pos % S (gemv.cuh's store_qkv, as the fused GEMV)
//   attention work items (sequence b, query head h, split s) round-robin over the blocks: the keys
//             of the span (kv_cache.cuh's decode_span) cut into nsplit chunks, each an online
//             softmax in base 2 over its keys (a row group of HD / 8 lanes a key), merged over the
//             block's row groups into a partial (max, sum, output) in global memory
//   attproj   xs = the partials merged per (b, h) (attention_decode.cuh's decode_merge_splits, the
//             floatX rounding of attention_decode's output), then res2 = res1 + (xs Wproj^T + b)
//   fc        xs = ln2(res2), fch = gelu(xs Wfc^T + b)
//   fcproj    xs = fch, res1 = res2 + (xs Wfcproj^T + b)
// with a grid barrier after each (4 * L + ... = 5L - 1 barriers). The matrices' rows are split evenly
// over the blocks (a block's rows are contiguous, so its slice is one bulk copy). Outputs are those
// of the fused step up to the order of fp32 additions (a warp a row, lanes over K; the attention's
// split and merge), with the same floatX roundings.
// Scope: GPT-2-style blocks (LayerNorm, GELU, learned positions; biases or not; any NKV and window),
// M <= 8, head size 64 or 128, and slices that fit two slots of shared memory; anything else runs
// the fused step (decode_persistent_plan says why). Memory visibility: a phase's reads of what other
// blocks wrote in this kernel go through L2 (__ldcg, or after the barrier's acquire).
// Residency: the grid is one block per SM (its shared memory admits no second one), launched as a
// programmatic dependent of the step's first kernel (which has B blocks and finishes on its own), so
// every block becomes resident and the barriers cannot deadlock; decode_persistent_plan checks the
// occupancy. The lm_head GEMV after it is its programmatic dependent too: the last layer lets it
// launch, so its blocks load their first weights beside this kernel's last phase.
// Measured (H200, GPT-2 124M, B = 1, 64-token prompt, 256 new greedy tokens; docs/perf.md):
// correct (the fp32 build's tokens equal the CPU twin's, cached logits equal a full forward, memcheck
// and racecheck clean) but slower than the fused step: 365 against 241 us a token. Block 0's clock
// per phase (PersistentArgs::trace; decode_step prints it): work 3.7 (qkv),
// 2.0 (attention), 6.5-7.6 (attproj, with the merge), 3.8 (fc), 2.1 (fcproj) us, barriers 1.0-2.0 us
// each: ~27 us a layer against the fused step's ~17. Each phase is still a chain of L2 round trips
// (the barrier's release and acquire, the inputs, the partials), each ~0.7-1 us under load, which is
// what a PDL kernel boundary costs too; streaming the weights ahead removes only the weight loads,
// which the fused GEMVs already issue before their wait. What would be next: fewer phases a layer
// (per-head flags instead of the barrier before attention), and the merge's loads in one round.
#pragma once
#include <algorithm>
#include "llmc/attention_decode.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/gemv.cuh"
#include "llmc/model_config.h"

// An acquire load at GPU scope: the barrier's poll (the pattern of cooperative groups' grid sync).
__device__ inline int load_acquire_gpu(const int* p) {
    int v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
    v = *(volatile const int*)p;
#endif
    return v;
}

constexpr int PERSIST_THREADS = 256;
constexpr int PERSIST_WARPS = PERSIST_THREADS / WARP_SIZE;
constexpr int PERSIST_MAX_SLOTS = 6;    // weight slices in flight a block (shared memory allowing)
constexpr int PERSIST_JOBS_PER_LAYER = 4;  // qkv, attproj, fc, fcproj
constexpr int PERSIST_SYNC_WORDS = 64;  // the barrier counter, and the exit counter 32 words on

// Everything the kernel reads: layer 0's tensors (layer l's at l times the per-layer size), the
// activations of M rows, one layer's cache stride, the partials and the counters.
struct PersistentArgs {
    const floatX *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
    floatX *res1, *res2, *qkv, *fch;
    floatX *k_cache, *v_cache;  // (L, B, NKV, S, HD)
    size_t cache_layer;         // elements of one layer's k (or v) cache
    const int* pos;             // (B) positions, < 0 idle
    float* part;                // (B, NH, nsplit, HD) partial outputs, then (B, NH, nsplit, 2) (max, sum)
    unsigned* sync;             // PERSIST_SYNC_WORDS, zero between launches (the kernel leaves them zero)
    int L, C, H, QKV, NH, NKV, HD, S, window, nsplit;
    int slots;                  // weight slots of slot_bytes each in shared memory
    int slot_bytes;
    int xs_bytes;               // M rows of max(C, H) floatX, rounded to 128
    // nullptr, or (L, PERSIST_TRACE_POINTS) %globaltimer readings of block 0 (the lab's phase table):
    // each phase's start (after its barrier) and end (before the next barrier)
    unsigned long long* trace;
};
constexpr int PERSIST_TRACE_POINTS = 10;

// What the host decided for one (config, B, cache) and why not, when it cannot run.
struct PersistentPlan {
    bool ok = false;
    const char* why = "not planned";
    int grid = 0, slots = 0, slot_bytes = 0, xs_bytes = 0, nsplit = 1;
    size_t smem = 0;
    size_t part_floats = 0;  // the partials' scratch
};

namespace persist_detail {

// The rows [r0, r1) of an N-row matrix that block g of G multiplies.
__host__ __device__ inline int row_begin(int N, int g, int G) { return (int)((long long)N * g / G); }

// The matrix of job j (layer j / 4, phase j % 4): its weight, rows N and inner size K.
struct JobShape {
    const floatX* w;
    const floatX* b;  // the bias (N), or nullptr
    int N, K;
};
__device__ inline const floatX* at(const floatX* base, int l, int n);
__device__ inline JobShape job_shape(const PersistentArgs& a, int j) {
    const int l = j / PERSIST_JOBS_PER_LAYER;
    switch (j % PERSIST_JOBS_PER_LAYER) {
        case 0: return {a.qkvw + (size_t)l * a.QKV * a.C, at(a.qkvb, l, a.QKV), a.QKV, a.C};
        case 1: return {a.attprojw + (size_t)l * a.C * a.C, at(a.attprojb, l, a.C), a.C, a.C};
        case 2: return {a.fcw + (size_t)l * a.H * a.C, at(a.fcb, l, a.H), a.H, a.C};
        default: return {a.fcprojw + (size_t)l * a.C * a.H, at(a.fcprojb, l, a.C), a.C, a.H};
    }
}
// A slot holds the block's rows (r1 - r0) x K, then its bias from row r0 rounded down to a 16-byte
// pack (bias_first) to r1 rounded up: the bias rides with the weights (one copy-engine wait, no L2
// round trip per row in the epilogue).
__host__ __device__ inline int bias_first(int r0) { return r0 - r0 % (int)(16 / sizeof(floatX)); }
__host__ __device__ inline int bias_span(int r0, int r1) {
    const int e = (int)(16 / sizeof(floatX));
    return ceil_div(r1, e) * e - bias_first(r0);
}

// The per-layer slice of a vector tensor (a bias or a norm's weight), or nullptr.
__device__ inline const floatX* at(const floatX* base, int l, int n) { return base ? base + (size_t)l * n : nullptr; }

#if LLMC_HAS_BULK_COPY
// Thread 0: job j's slice into slot j % slots, completing on that slot's mbarrier (a plain arrival
// when the block has no rows of it, so the barrier's phases stay one per job).
__device__ inline void issue_job(const PersistentArgs& a, int j, uint32_t slots_addr, uint32_t bars_addr) {
    if (j >= a.L * PERSIST_JOBS_PER_LAYER) return;
    const int s = j % a.slots;
    const uint32_t bar = bars_addr + 8 * s;
    const JobShape js = job_shape(a, j);
    const int r0 = row_begin(js.N, blockIdx.x, gridDim.x), r1 = row_begin(js.N, blockIdx.x + 1, gridDim.x);
    const uint32_t bytes = (uint32_t)((r1 - r0) * js.K * sizeof(floatX));
    if (bytes == 0) {
        mbar_arrive(bar);
        return;
    }
    const uint32_t bbytes = js.b ? (uint32_t)(bias_span(r0, r1) * sizeof(floatX)) : 0u;
    mbar_expect_tx(bar, bytes + bbytes);
    const uint32_t dst = slots_addr + (uint32_t)s * a.slot_bytes;
    bulk_load(dst, js.w + (size_t)r0 * js.K, bytes, bar);
    if (bbytes) bulk_load(dst + bytes, js.b + bias_first(r0), bbytes, bar);
}
#endif

// Every thread: until job j's slice is in its slot.
__device__ inline void wait_job(const PersistentArgs& a, int j, uint32_t bars_addr) {
#if LLMC_HAS_BULK_COPY
    mbar_wait(bars_addr + 8 * (j % a.slots), (uint32_t)(j / a.slots) & 1u);
#endif
}

// Every thread, after the phase's last read of job j's slot: thread 0 refills the slot with job
// j + slots (generic-proxy reads of the slot are ordered before the copy engine's writes by the
// barrier and the proxy fence).
__device__ inline void release_job(const PersistentArgs& a, int j, uint32_t slots_addr, uint32_t bars_addr) {
    __syncthreads();
#if LLMC_HAS_BULK_COPY
    if (threadIdx.x == 0) {
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        issue_job(a, j + a.slots, slots_addr, bars_addr);
    }
#endif
}

// The grid barrier: every thread calls it; `target` counts the arrivals expected so far.
__device__ inline void grid_sync(unsigned* counter, unsigned& target) {
    target += gridDim.x;
    __syncthreads();  // the block's writes are done
    if (threadIdx.x == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
#else
        __threadfence();
        atomicAdd(counter, 1u);
#endif
        while ((unsigned)load_acquire_gpu(reinterpret_cast<const int*>(counter)) < target) {
        }
    }
    __syncthreads();
}

// rows [r0, r1) of out = epi(xs (M, K) W^T + b), W's rows in shared memory (ws: row r0 first): a warp
// a row, lane i over the packs i, i + 32, ... (gemv.cuh's gemv_packs), then the fused GEMV's epilogues
// (lane m writes input row m).
template <int M, int EPI>
__device__ inline void slice_gemv(floatX* out, const floatX* ws, const floatX* xs, bool has_bias,
                                  const floatX* residual, int r0, int r1, int K, int N, const GemvFusion& f) {
    const floatX* bias = ws + (size_t)(r1 - r0) * K - bias_first(r0);  // the slot's bias, indexed by row
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, packs = K / x128::size;
    for (int r = r0 + warp; r < r1; r += PERSIST_WARPS) {
        const floatX* wrow = ws + (size_t)(r - r0) * K;
        // the epilogue's inputs first, so their loads overlap the products
        const float b = has_bias ? to_float(bias[r]) : 0.0f;
        float res = 0.0f;
        if constexpr (EPI == GEMV_RESIDUAL)
            if (lane < M) res = to_float(__ldcg(residual + (int64_t)lane * N + r));
        float acc[1][M];
#pragma unroll
        for (int m = 0; m < M; m++) acc[0][m] = 0.0f;
#pragma unroll 4
        for (int p = lane; p < packs; p += WARP_SIZE) {
            const x128 w[1] = {load128(wrow + p * x128::size)};
            gemv_detail::gemv_packs<M, 1>(acc, w, xs, K, p * x128::size);
        }
#pragma unroll
        for (int m = 0; m < M; m++) acc[0][m] = warp_reduce_sum(acc[0][m]);
#pragma unroll
        for (int m = 0; m < M; m++) {
            if (m != lane) continue;
            const float v = acc[0][m] + b;
            const int64_t o = (int64_t)m * N + r;
            if constexpr (EPI == GEMV_QKV) {
                const float vv[1] = {v};
                const int row[1] = {r};
                gemv_detail::store_qkv<1>(out, vv, row, 1, m, N, false, f);
            } else if constexpr (EPI == GEMV_GELU) {
                out[o] = from_float<floatX>(gelu_tanh(v));
            } else {  // GEMV_RESIDUAL
                out[o] = from_float<floatX>(res + to_float(from_float<floatX>(v)));
            }
        }
    }
}

// The attention phase of one layer (the top of the file). red: (ROWS * HD + 2 * ROWS) floats.
template <int HD>
__device__ inline void attention_items(const PersistentArgs& a, int M, const floatX* kc, const floatX* vc,
                                       float* red) {
    constexpr int EPT = x128::size, TPR = HD / EPT, ROWS = PERSIST_THREADS / TPR;
    static_assert(TPR <= WARP_SIZE && WARP_SIZE % TPR == 0, "a key's lanes in one warp");
    const int lane = threadIdx.x % TPR, row = threadIdx.x / TPR, d0 = lane * EPT;
    const int G = a.NH / a.NKV, qkv_row = (a.NH + 2 * a.NKV) * HD;
    float* red_o = red;                // (ROWS, HD)
    float* red_m = red + ROWS * HD;    // (ROWS)
    float* red_l = red_m + ROWS;       // (ROWS)
    float* part_o = a.part;
    float* part_ml = a.part + (size_t)M * a.NH * a.nsplit * HD;
    const float qscale = 1.4426950408889634f * rsqrtf((float)HD);  // log2(e) / sqrt(HD): base-2 softmax
    const int items = M * a.NH * a.nsplit;
    for (int it = blockIdx.x; it < items; it += gridDim.x) {
        const int s = it % a.nsplit, h = (it / a.nsplit) % a.NH, b = it / (a.nsplit * a.NH);
        const int p = a.pos[b];
        if (p < 0) continue;  // block-uniform
        const attention_detail::DecodeSpan sp = attention_detail::decode_span(p, a.S, a.window);
        const int chunk = ceil_div(sp.n, a.nsplit), k0 = s * chunk, k1 = min(sp.n, k0 + chunk);
        if (k0 >= k1) continue;
        float q[EPT];
        {
            const x128 qv = load128cg(a.qkv + (size_t)b * qkv_row + h * HD + d0);
#pragma unroll
            for (int e = 0; e < EPT; e++) q[e] = to_float(qv[e]) * qscale;
        }
        const size_t base = ((size_t)b * a.NKV + h / G) * a.S;
        float mr = -INFINITY, lr = 0.0f, o[EPT];
#pragma unroll
        for (int e = 0; e < EPT; e++) o[e] = 0.0f;
        for (int jb = k0; jb < k1; jb += ROWS) {  // block-uniform trip count (the shuffles)
            const int j = jb + row;
            const bool valid = j < k1;
            x128 kp = x128::constant(from_float<floatX>(0.0f)), vp = kp;
            if (valid) {
                int slot = sp.first + j;
                if (slot >= a.S) slot -= a.S;
                kp = load128cg(kc + (base + slot) * HD + d0);
                vp = load128cg(vc + (base + slot) * HD + d0);
            }
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < EPT; e++) dot = fmaf(q[e], to_float(kp[e]), dot);
#pragma unroll
            for (int off = TPR / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
            if (valid) {
                const float mn = fmaxf(mr, dot), f = exp2f(mr - mn), pe = exp2f(dot - mn);
                lr = lr * f + pe;
#pragma unroll
                for (int e = 0; e < EPT; e++) o[e] = fmaf(pe, to_float(vp[e]), o[e] * f);
                mr = mn;
            }
        }
        if (lane == 0) {
            red_m[row] = mr;
            red_l[row] = lr;
        }
#pragma unroll
        for (int e = 0; e < EPT; e++) red_o[row * HD + d0 + e] = o[e];
        __syncthreads();
        const size_t idx = ((size_t)b * a.NH + h) * a.nsplit + s;
        for (int d = threadIdx.x; d < HD; d += PERSIST_THREADS) {
            float mx = -INFINITY;
            for (int r = 0; r < ROWS; r++) mx = fmaxf(mx, red_m[r]);
            float acc = 0.0f, sum = 0.0f;
            for (int r = 0; r < ROWS; r++) {
                const float f = exp2f(red_m[r] - mx);  // 0 for a row group without keys
                acc = fmaf(f, red_o[r * HD + d], acc);
                sum = fmaf(f, red_l[r], sum);
            }
            part_o[idx * HD + d] = acc;
            if (d == 0) {
                part_ml[2 * idx] = mx;
                part_ml[2 * idx + 1] = sum;
            }
        }
        __syncthreads();  // red is the next item's
    }
}

// Block 0's reading of the clock at trace point i of layer l (nothing without a.trace).
__device__ inline void trace_point(const PersistentArgs& a, int l, int i) {
    if (a.trace && blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        a.trace[l * PERSIST_TRACE_POINTS + i] = t;
    }
}

// xs (M, C) = the attention output: each (b, h)'s partials merged (decode_merge_splits' formula,
// out = sum_s 2^(m_s - max) o_s / sum_s 2^(m_s - max) l_s, rounded to floatX), zeros for an idle
// sequence. A warp a (b, h): lane s holds split s's (max, sum) (nsplit <= 32), then each lane's dims
// gather their splits' outputs MERGE_LOADS loads at a time (the loads of a round in flight together:
// a loop of dependent L2 loads would pay a round trip a split). (Measured against a three-step
// version, a thread per output element: 6.5 against 7.6 us a layer at B = 1, 21.9 against 29.2 at 8.)
constexpr int MERGE_LOADS = 8;
__device__ inline void merge_heads(const PersistentArgs& a, int M, floatX* xs) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const float* part_o = a.part;
    const float* part_ml = a.part + (size_t)M * a.NH * a.nsplit * a.HD;
    for (int bh = warp; bh < M * a.NH; bh += PERSIST_WARPS) {
        const int b = bh / a.NH, p = a.pos[b];
        if (p < 0) {
            for (int d = lane; d < a.HD; d += WARP_SIZE) xs[(size_t)bh * a.HD + d] = from_float<floatX>(0.0f);
            continue;
        }
        const int n = attention_detail::decode_span(p, a.S, a.window).n, used = ceil_div(n, ceil_div(n, a.nsplit));
        const size_t p0 = (size_t)bh * a.nsplit;  // (b * NH + h) * nsplit
        const float ms = lane < used ? __ldcg(part_ml + 2 * (p0 + lane)) : -INFINITY;
        const float ls = lane < used ? __ldcg(part_ml + 2 * (p0 + lane) + 1) : 0.0f;
        const float mx = warp_reduce_max(ms);
        const float f = lane < used ? exp2f(ms - mx) : 0.0f;
        const float sum = warp_reduce_sum(f * ls);
        for (int d = lane; d < a.HD; d += WARP_SIZE) {
            float o = 0.0f;
            for (int s0 = 0; s0 < used; s0 += MERGE_LOADS) {
                float v[MERGE_LOADS];
#pragma unroll
                for (int u = 0; u < MERGE_LOADS; u++)
                    v[u] = s0 + u < used ? __ldcg(part_o + (p0 + s0 + u) * a.HD + d) : 0.0f;
#pragma unroll
                for (int u = 0; u < MERGE_LOADS; u++) o = fmaf(__shfl_sync(0xffffffffu, f, (s0 + u) & 31), v[u], o);
            }
            xs[(size_t)bh * a.HD + d] = from_float<floatX>(o / sum);
        }
    }
}

// xs (M, K) = rows of src written by other blocks in this kernel (through L2).
__device__ inline void copy_rows(floatX* xs, const floatX* src, int n) {
    for (int i = threadIdx.x * x128::size; i < n; i += PERSIST_THREADS * x128::size)
        store128(xs + i, load128cg(src + i));
}

// The shared memory of the attention phase's merge: (ROWS, HD) outputs, ROWS maxima, ROWS sums.
__host__ __device__ inline int red_bytes(int HD) {
    const int rows = PERSIST_THREADS / (HD / (int)(16 / sizeof(floatX)));
    return (rows * HD + 2 * rows) * (int)sizeof(float);
}

// (The bound of 2 blocks an SM only caps the registers at 128 a thread: half the register file stays
// free for the lm_head GEMV's blocks, which the last layer lets in early; the shared memory admits one.)
// Shared memory: the weight slots, xs, the attention's merge area, the norm's weight and bias (2C); the
// mbarriers are static: one a slot, one for the norm (its copies alternate ln1 (use 2l), ln2 (2l + 1)).
template <int M>
__global__ void __launch_bounds__(PERSIST_THREADS, 2) decode_persistent_kernel(PersistentArgs a) {
#if LLMC_HAS_BULK_COPY
    extern __shared__ __align__(128) unsigned char persist_smem[];
    unsigned char* slots = persist_smem;
    floatX* xs = reinterpret_cast<floatX*>(persist_smem + (size_t)a.slots * a.slot_bytes);
    float* red = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(xs) + a.xs_bytes);
    floatX* nrm = reinterpret_cast<floatX*>(reinterpret_cast<unsigned char*>(red) + red_bytes(a.HD));
    __shared__ alignas(8) uint64_t bars[PERSIST_MAX_SLOTS + 1];
    const uint32_t slots_addr = (uint32_t)__cvta_generic_to_shared(slots);
    const uint32_t bars_addr = (uint32_t)__cvta_generic_to_shared(bars);
    const uint32_t nbar = bars_addr + 8 * PERSIST_MAX_SLOTS;
    const uint32_t nrm_addr = (uint32_t)__cvta_generic_to_shared(nrm);
    const int L = a.L, C = a.C;
    const uint32_t nbytes = (uint32_t)(C * sizeof(floatX));
    // thread 0: norm use u's weight and bias (u = 2l: ln1 of layer l, 2l + 1: ln2) into nrm
    auto issue_norm = [&](int u) {
        const int l = u / 2;
        const floatX* w = u % 2 ? a.ln2w : a.ln1w;
        const floatX* b = u % 2 ? a.ln2b : a.ln1b;
        mbar_expect_tx(nbar, 2 * nbytes);
        bulk_load(nrm_addr, w + (size_t)l * C, nbytes, nbar);
        bulk_load(nrm_addr + nbytes, b + (size_t)l * C, nbytes, nbar);
    };
    // the weights never depend on the step: the first slots' copies start before the wait
    if (threadIdx.x == 0) {
        for (int s = 0; s <= PERSIST_MAX_SLOTS; s++) mbar_init(bars_addr + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        issue_norm(0);
        for (int j = 0; j < a.slots; j++) issue_job(a, j, slots_addr, bars_addr);
    }
    __syncthreads();
    pdl_wait();  // the step's first kernel: res1 (the embeddings) and pos
    unsigned target = 0;
    GemvFusion fq;  // the norm prologue's and store_qkv's parameters
    fq.norm = GEMV_NORM_LAYER;
    fq.pos = a.pos;
    fq.NH = a.NH;
    fq.NKV = a.NKV;
    fq.HD = a.HD;
    fq.S = a.S;
    const GemvFusion none{};
    auto rows = [&](int N, int& r0, int& r1) {
        r0 = row_begin(N, blockIdx.x, gridDim.x);
        r1 = row_begin(N, blockIdx.x + 1, gridDim.x);
    };
    auto slot = [&](int j) { return reinterpret_cast<const floatX*>(slots + (size_t)(j % a.slots) * a.slot_bytes); };
    // xs = the norm (use u) of M rows of inp; then thread 0 starts use u + 1's copy (after the barrier
    // that ends every thread's reads of nrm, and a proxy fence)
    auto norm_rows = [&](const floatX* inp, int u) {
        mbar_wait(nbar, (uint32_t)u & 1u);
        gemv_detail::normalize_rows<M>(xs, inp, nrm, nrm + C, C, fq);
        __syncthreads();
        if (threadIdx.x == 0 && u + 1 < 2 * L) {
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            issue_norm(u + 1);
        }
    };
    int r0, r1;
    for (int l = 0; l < L; l++) {
        const int j = l * PERSIST_JOBS_PER_LAYER;
        const floatX* kc = a.k_cache + (size_t)l * a.cache_layer;
        const floatX* vc = a.v_cache + (size_t)l * a.cache_layer;
        // qkv (and the new K, V into the cache)
        trace_point(a, l, 0);
        norm_rows(a.res1, 2 * l);
        fq.k_cache = const_cast<floatX*>(kc);
        fq.v_cache = const_cast<floatX*>(vc);
        rows(a.QKV, r0, r1);
        wait_job(a, j, bars_addr);
        slice_gemv<M, GEMV_QKV>(a.qkv, slot(j), xs, a.qkvb != nullptr, nullptr, r0, r1, C, a.QKV, fq);
        release_job(a, j, slots_addr, bars_addr);
        trace_point(a, l, 1);
        grid_sync(a.sync, target);
        // attention
        trace_point(a, l, 2);
        if (a.HD == 64) attention_items<64>(a, M, kc, vc, red);
        else attention_items<128>(a, M, kc, vc, red);
        trace_point(a, l, 3);
        grid_sync(a.sync, target);
        // attproj + residual
        trace_point(a, l, 4);
        merge_heads(a, M, xs);
        __syncthreads();
        rows(C, r0, r1);
        wait_job(a, j + 1, bars_addr);
        slice_gemv<M, GEMV_RESIDUAL>(a.res2, slot(j + 1), xs, a.attprojb != nullptr, a.res1, r0, r1, C, C, none);
        release_job(a, j + 1, slots_addr, bars_addr);
        trace_point(a, l, 5);
        grid_sync(a.sync, target);
        // fc + GELU
        trace_point(a, l, 6);
        norm_rows(a.res2, 2 * l + 1);
        rows(a.H, r0, r1);
        wait_job(a, j + 2, bars_addr);
        slice_gemv<M, GEMV_GELU>(a.fch, slot(j + 2), xs, a.fcb != nullptr, nullptr, r0, r1, C, a.H, none);
        release_job(a, j + 2, slots_addr, bars_addr);
        trace_point(a, l, 7);
        grid_sync(a.sync, target);
        // fcproj + residual
        trace_point(a, l, 8);
        if (l + 1 == L) pdl_launch_dependents();  // lm_head's blocks may become resident and load
        copy_rows(xs, a.fch, M * a.H);
        __syncthreads();
        rows(C, r0, r1);
        wait_job(a, j + 3, bars_addr);
        slice_gemv<M, GEMV_RESIDUAL>(a.res1, slot(j + 3), xs, a.fcprojb != nullptr, a.res2, r0, r1, a.H, C, none);
        release_job(a, j + 3, slots_addr, bars_addr);
        trace_point(a, l, 9);
        if (l + 1 < L) grid_sync(a.sync, target);
    }
    // the last block out zeroes the counters for the next launch (every block has passed every
    // barrier before it counts in here)
    if (threadIdx.x == 0) {
        unsigned* exits = a.sync + PERSIST_SYNC_WORDS / 2;
        if (atomicAdd(exits, 1u) == gridDim.x - 1) {
            a.sync[0] = 0;
            *exits = 0;
        }
    }
#endif
}

template <int M>
inline void* kernel_of() {
    return reinterpret_cast<void*>(decode_persistent_kernel<M>);
}
inline void* kernel_for(int M) {
    switch (M) {
        case 1: return kernel_of<1>();
        case 2: return kernel_of<2>();
        case 3: return kernel_of<3>();
        case 4: return kernel_of<4>();
        case 5: return kernel_of<5>();
        case 6: return kernel_of<6>();
        case 7: return kernel_of<7>();
        default: return kernel_of<8>();
    }
}

}  // namespace persist_detail

// Whether (and how) the persistent step runs this model at B sequences and a cache of S slots with
// `window`; sets the kernel's shared memory limit. Host only, outside any graph capture.
inline PersistentPlan decode_persistent_plan(const ModelConfig& c, int B, int S, int window) {
    PersistentPlan p;
    const int C = c.channels, H = model_mlp_hidden(c), QKV = model_qkv_channels(c), HD = model_head_dim(c);
    const int X = (int)sizeof(floatX);
    if (B < 1 || B > GEMV_MAX_M) { p.why = "more than 8 sequences"; return p; }
    if (c.norm != NORM_LAYERNORM || c.mlp != MLP_GELU || c.position == POS_ROPE) {
        p.why = "a Llama-style block (RMSNorm, SwiGLU or RoPE)";
        return p;
    }
    if (HD != 64 && HD != 128) { p.why = "a head size other than 64 or 128"; return p; }
    if (C % x128::size != 0 || H % x128::size != 0) { p.why = "widths not multiples of 16 bytes"; return p; }
    int dev = 0, smem_optin = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const int G = current_sm_count();
    auto slice = [&](int N, int K) { return ceil_div(N, G) * K * X + (ceil_div(N, G) + 2 * x128::size) * X; };
    const int slot_bytes = ceil_div(std::max({slice(QKV, C), slice(C, C), slice(H, C), slice(C, H)}), 128) * 128;
    const int xs_bytes = ceil_div(B * std::max(C, H) * X, 128) * 128;
    const int red_bytes = persist_detail::red_bytes(HD), norm_bytes = 2 * C * X;
    const int fixed = xs_bytes + red_bytes + norm_bytes + 1024;  // + the static shared memory and slack
    const int slots = std::min(PERSIST_MAX_SLOTS, (smem_optin - fixed) / slot_bytes);
    if (slots < 2) { p.why = "weight slices too large for two slots of shared memory"; return p; }
    // splits a (sequence, head): enough items for every block, no more splits than keys, at most 32
    // (merge_heads: a lane a split)
    const int cap0 = window > 0 && window < S ? window : S;
    p.nsplit = std::clamp(G / (B * c.num_heads), 1, std::min(cap0, WARP_SIZE));
    p.grid = G;
    p.slots = slots;
    p.slot_bytes = slot_bytes;
    p.xs_bytes = xs_bytes;
    p.smem = (size_t)slots * slot_bytes + xs_bytes + red_bytes + norm_bytes;
    p.part_floats = (size_t)B * c.num_heads * p.nsplit * (HD + 2);
    void* k = persist_detail::kernel_for(B);
    cudaCheck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p.smem));
    int resident = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, k, PERSIST_THREADS, p.smem));
    if (resident < 1) { p.why = "no block fits an SM"; return p; }
    p.ok = true;
    p.why = "";
    return p;
}

// The launch: a programmatic dependent of the kernel before it (see the top).
inline void decode_persistent_forward(const PersistentPlan& plan, const PersistentArgs& a, int B,
                                      cudaStream_t stream) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(plan.grid);
    cfg.blockDim = dim3(PERSIST_THREADS);
    cfg.dynamicSmemBytes = plan.smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    void* args[] = {const_cast<PersistentArgs*>(&a)};
    cudaCheck(cudaLaunchKernelExC(&cfg, persist_detail::kernel_for(B), args));
}
