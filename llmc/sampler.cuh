// sampler.cuh: the next token of each sequence drawn on the GPU from its row of logits, the twin of
// sample_token in llmc/sampler.h (same rule, same RNG stream, weights in fp64) but for ties at the top-p
// cut, kept whole here (the CPU's stable sort splits them by id). One block of SAMPLE_THREADS per
// sequence; the k-th largest logit and the top-p cut come from a radix select over order-preserving
// 32-bit keys: 32 block-wide counts (or sums), each reading the row (from L2 after the first). Greedy
// reads the row once, top-k/top-p ~32x that: latency-bound either way.
// Greedy alone (model_infer.cuh's greedy step): the row is split over ceil(V / SAMPLE_GREEDY_CHUNK)
// blocks (25 for GPT-2: one round of loads), each writing its (max, first index), merged by the last to
// finish (ties to the lower index), where a one-block scan would be ~50 dependent load rounds. At B <= 8
// the lm_head GEMV takes the argmax instead (llmc/gemv.cuh, GemvFusion::argmax; same tie rule).
#pragma once
#include <cstdint>
#include "llmc/cuda_common.cuh"

constexpr int SAMPLE_THREADS = 1024;
constexpr int SAMPLE_GREEDY_THREADS = 256;
constexpr int SAMPLE_GREEDY_CHUNK = 2048;  // logits a block of the greedy argmax scans
inline int sample_greedy_blocks(int V) { return (V + SAMPLE_GREEDY_CHUNK - 1) / SAMPLE_GREEDY_CHUNK; }

struct SamplingParams {
    float temperature;  // 0 = greedy
    int top_k;          // 0 = off
    float top_p;        // 1 = off
};

namespace sampler_detail {

// splitmix64, the step of Rng::next_u64 and Rng::uniform (llmc/rand.h)
__device__ inline float rng_uniform(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

// A float's bits as an unsigned key with the same order (negative values flipped).
__device__ inline uint32_t order_key(float x) {
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Block-wide sum of a double or an int; every thread gets the result. `shared` holds 32 values.
template <typename T>
__device__ inline T block_sum(T v, T* shared) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();  // the previous call's readers are done with `shared`
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / WARP_SIZE) ? shared[lane] : T(0);
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// A candidate of the argmax: value and index; i = `none` (past every real index) when there is none.
struct ArgMax {
    float v;
    int i;
};
// a := the larger of a and o, ties to the lower index (never NaN: the scan below skips NaN logits)
__device__ inline void argmax_merge(ArgMax& a, ArgMax o) {
    if (o.v > a.v || (o.v == a.v && o.i < a.i)) a = o;
}
// Block-wide merge; every thread gets the result. shared_v, shared_i hold 32 values each.
__device__ inline ArgMax block_argmax_merge(ArgMax a, float* shared_v, int* shared_i, int none) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    for (int o = WARP_SIZE / 2; o > 0; o /= 2)
        argmax_merge(a, {__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)});
    __syncthreads();
    if (lane == 0) { shared_v[warp] = a.v; shared_i[warp] = a.i; }
    __syncthreads();
    a.v = lane < (int)(blockDim.x / WARP_SIZE) ? shared_v[lane] : -INFINITY;
    a.i = lane < (int)(blockDim.x / WARP_SIZE) ? shared_i[lane] : none;
    for (int o = WARP_SIZE / 2; o > 0; o /= 2)
        argmax_merge(a, {__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)});
    return a;
}
// The first largest of row[lo..hi), i = none if every value is NaN.
__device__ inline ArgMax block_argmax_range(const floatX* row, int lo, int hi, int none, float* shared_v,
                                            int* shared_i) {
    ArgMax a{-INFINITY, none};
    for (int v = lo + threadIdx.x; v < hi; v += blockDim.x) {
        const float x = to_float(row[v]);
        if (x > a.v || (a.i == none && x == a.v)) a = {x, v};
    }
    return block_argmax_merge(a, shared_v, shared_i, none);
}
// The first largest of row[0..V) (0 if all are NaN).
__device__ inline int block_argmax(const floatX* row, int V, float* shared_v, int* shared_i) {
    const ArgMax a = block_argmax_range(row, 0, V, V, shared_v, shared_i);
    return a.i < V ? a.i : 0;
}

// The sampled token of one row (every thread of the block returns it). rng: the sequence's state,
// advanced by one draw unless greedy. Needs blockDim.x == SAMPLE_THREADS.
__device__ inline int block_sample(const floatX* row, int V, SamplingParams sp, uint64_t* rng) {
    __shared__ float sh_f[32];
    __shared__ int sh_i[32];
    __shared__ double sh_d[32];
    __shared__ int sh_pick;
    __shared__ float sh_u;
    const int best = block_argmax(row, V, sh_f, sh_i);
    if (sp.temperature == 0.0f) return best;
    const float maxv = to_float(row[best]);
    const double inv_t = 1.0 / (double)sp.temperature;
    auto weight = [&](float x) { return exp((double)(x - maxv) * inv_t); };
    // top-k: the largest key t with at least k logits >= t
    uint32_t cut = 0;
    if (sp.top_k > 0 && sp.top_k < V) {
        for (int bit = 31; bit >= 0; bit--) {
            const uint32_t cand = cut | (1u << bit);
            int n = 0;
            for (int v = threadIdx.x; v < V; v += blockDim.x) n += order_key(to_float(row[v])) >= cand;
            if (block_sum(n, sh_i) >= sp.top_k) cut = cand;
        }
    }
    // top-p: the largest key t whose tokens >= t (among the kept) hold at least p of the kept mass
    if (sp.top_p < 1.0f) {
        double total = 0.0;
        for (int v = threadIdx.x; v < V; v += blockDim.x) {
            const float x = to_float(row[v]);
            if (order_key(x) >= cut) total += weight(x);
        }
        const double goal = (double)sp.top_p * block_sum(total, sh_d);
        uint32_t t = 0;
        for (int bit = 31; bit >= 0; bit--) {
            const uint32_t cand = t | (1u << bit);
            double m = 0.0;
            if (cand >= cut)
                for (int v = threadIdx.x; v < V; v += blockDim.x) {
                    const float x = to_float(row[v]);
                    if (order_key(x) >= cand) m += weight(x);
                }
            if (cand < cut || block_sum(m, sh_d) >= goal) t = cand;
        }
        cut = t > cut ? t : cut;
    }
    // the draw: thread i owns the ids [i * chunk, (i + 1) * chunk); an exclusive scan of the chunks'
    // sums finds the chunk where the running sum passes r, and its owner walks it
    const int chunk = ceil_div(V, (int)blockDim.x), lo = min(V, (int)threadIdx.x * chunk), hi = min(V, lo + chunk);
    double mine = 0.0;
    int last = -1;
    for (int v = lo; v < hi; v++) {
        const float x = to_float(row[v]);
        if (order_key(x) >= cut) { mine += weight(x); last = v; }
    }
    // inclusive scan of `mine` over the block (warp shuffles, then the warp totals)
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    double incl = mine;
    for (int o = 1; o < WARP_SIZE; o *= 2) {
        const double up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
    }
    __syncthreads();
    if (lane == WARP_SIZE - 1) sh_d[warp] = incl;
    if (threadIdx.x == 0) {
        sh_pick = -1;
        sh_u = rng_uniform(rng);  // one draw per sequence and token
    }
    __syncthreads();
    double before_warp = 0.0, total = 0.0;
    for (int w = 0; w < (int)(blockDim.x / WARP_SIZE); w++) {
        if (w < warp) before_warp += sh_d[w];
        total += sh_d[w];
    }
    const double start = before_warp + incl - mine;
    const double r = (double)sh_u * total;
    if (mine > 0.0 && r >= start && r < start + mine) {
        double acc = start;
        for (int v = lo; v < hi; v++) {
            const float x = to_float(row[v]);
            if (order_key(x) < cut) continue;
            acc += weight(x);
            if (r < acc) { sh_pick = v; break; }
        }
        if (sh_pick < 0) sh_pick = last;  // rounding inside the chunk
    }
    __syncthreads();
    int pick = sh_pick;
    if (pick < 0) {  // r past the total by rounding: the highest kept id, as on the CPU
        __syncthreads();
        if (threadIdx.x == 0) sh_i[0] = -1;
        __syncthreads();
        if (last >= 0) atomicMax(&sh_i[0], last);
        __syncthreads();
        pick = sh_i[0];
    }
    return pick;
}

}  // namespace sampler_detail
