// gemv.cuh: the linear layers of a decode step, y = x W^T (+ b), at the few rows M a step has
// (M = batch <= GEMV_MAX_M), where cuBLAS's tiled GEMMs leave most of the weight bandwidth unused.
// Row-major as matmul.cuh: inp (M, K), weight (N, K) ("out x in"), bias (N) or nullptr, out (M, N).
//   gemv_forward  out = epilogue(inp W^T + b)                                                   (=)
//     GEMV_PLAIN   out (M, N) = inp W^T + b
//     GEMV_GELU    out (M, N) = gelu_tanh(inp W^T + b) (the pre-activation is not kept: inference)
//     GEMV_SWIGLU  W is SwiGLU's fused [gate (H) | up (H)], N = 2H: out (M, H) = silu(g) * u, with
//                  g, u the fp32 sums of rows j and H + j (swiglu.cuh's formula, no floatX round trip)
// Each weight element is read once from DRAM with 16-byte streaming loads (ld.global.cs): near the copy
// bandwidth once the matrix is a few MB (GPT-2 124M's step: ~250 MB of bf16, ~62 us at 4 TB/s). The
// inputs (M*K*2 bytes, 48 KB at most) come from L1/L2.
// Work split: a warp computes R consecutive output rows (SwiGLU: the pair j, H + j) for all M inputs;
// lane i walks the packs i, i + 32, ... of K, U packs per row in flight (U*R loads before any math),
// then each of the R*M sums is reduced across the warp. R = 1 below M = 4, else 2 (GemvPolicy::rows).
// PDL (llmc/cuda_common.cuh): the weights never depend on the kernel before, so a warp's first round of
// weight packs, its rows' bias (and residual) and the norm's weight and bias load before the wait, and
// the next kernel may launch and load its own weights while this one finishes.
// Split K (GemvPolicy::split_k): a row needing more than one round per lane (fcproj, K = 3072) is split
// over 2 or 4 warps of a block, all of a row in one round; their sums meet in shared memory in warp
// order (deterministic), at KS times the registers a row holds.
//
//   gemv_fused_forward  the decode step's fused kernels (model_infer.cuh, B <= 8): the same weight
//                       loop with a GemvFusion around it, so a layer is 4 GEMVs + attention_decode:
//     prologue  norm: inp (M, K) is the residual stream; each block normalizes the M rows (LayerNorm or
//               RMSNorm, layernorm.cuh / rmsnorm.cuh's fp32 statistics and formula, rounded to floatX)
//               into shared memory ((M + 2)*K floatX with the norm's weight and bias: 15 KB at M = 8,
//               C = 768 in bf16) instead of a norm kernel writing `ln`. The grid is capped at one wave
//               (GEMV_NORM_BLOCKS_PER_SM blocks an SM, or what the registers allow; the warps loop over
//               their row groups), so lm_head's 12576 blocks (M = 1) do not each redo the norm.
//     GEMV_RESIDUAL  out (M, N) = residual + (inp W^T + b) (the sum rounded to floatX first, as the
//               unfused matmul + residual add): attproj and fcproj.
//     GEMV_QKV  out = qkv (M, N = (NH + 2*NKV)*HD), row m being sequence m at position pos[m]: K and V
//               also go to cache slot pos[m] % S (kv_cache_append), and with RoPE a warp owns the row
//               pair (d, d + HD/2) of one head (R = 2) and rotates q and k (rope_forward_at's formula
//               and tables) before storing; pos[m] < 0 (idle): no rotation, no cache write.
//     The other epilogues as gemv_forward's; lm_head is plain with the lnf prologue and, with
//     GemvFusion::argmax, also takes each input row's greedy argmax (no sampler kernel).
//     Outputs equal the unfused kernels' up to the order of fp32 additions in the norm and RoPE.
// fp32 accumulation; K a multiple of x128::size. CPU reference: cpu::matmul_forward (and
// cpu::gelu_forward / cpu::swiglu_forward on its output). The lab: dev/cuda/gemv.cu.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include "llmc/cuda_common.cuh"
#include "llmc/gelu.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/sampler.cuh"
#include "llmc/swiglu.cuh"
#include "llmc/utils.h"

constexpr int GEMV_MAX_M = 8;    // rows of inp the kernels are instantiated for (1..8)
constexpr int GEMV_THREADS = 128;  // 4 warps a block
constexpr int GEMV_UNROLL = 4;   // 16-byte packs per weight row a lane loads before its math
// Fused norm prologue: blocks per SM at most (fewer where the registers allow fewer: one wave, the
// grid loops over the rest), and the shared memory of its rows and the norm's weight and bias.
constexpr int GEMV_NORM_BLOCKS_PER_SM = 8;
constexpr int GEMV_NORM_MAX_SMEM = 48 * 1024;
inline size_t gemv_norm_smem(int M, int K) { return (size_t)(M + 2) * K * sizeof(floatX); }
// floats of GemvFusion::argmax_scratch: a counter (padded to 4), then (M, blocks) maxima and indices
// for the one-wave grid of a norm GEMV on `sms` SMs.
inline size_t gemv_argmax_scratch_floats(int M, int sms) {
    return 4 + 2 * (size_t)M * GEMV_NORM_BLOCKS_PER_SM * sms;
}

enum GemvEpilogue : int { GEMV_PLAIN = 0, GEMV_GELU = 1, GEMV_SWIGLU = 2, GEMV_RESIDUAL = 3, GEMV_QKV = 4 };
enum GemvNorm : int { GEMV_NORM_NONE = 0, GEMV_NORM_LAYER = 1, GEMV_NORM_RMS = 2 };

// What gemv_fused_forward does around the product (the top of the file); value-initialized: nothing.
struct GemvFusion {
    GemvNorm norm = GEMV_NORM_NONE;    // prologue over inp's rows
    const floatX* norm_w = nullptr;    // (K)
    const floatX* norm_b = nullptr;    // (K) LayerNorm's bias
    float eps = 0.0f;                  // RMSNorm's (LayerNorm: LAYERNORM_EPS)
    // GEMV_RESIDUAL: (M, N), read before pdl_wait, so it must not come from the kernel this one waits
    // for (the decode step's come from two and three kernels earlier)
    const floatX* residual = nullptr;
    floatX* k_cache = nullptr;         // GEMV_QKV: one layer's (M, NKV, S, HD)
    floatX* v_cache = nullptr;         // (M, NKV, S, HD)
    const int* pos = nullptr;          // (M) device positions, < 0 idle
    const float* rope_cos = nullptr;   // (max_pos, HD/2), or nullptr: no RoPE
    const float* rope_sin = nullptr;   // (max_pos, HD/2)
    int NH = 0, NKV = 0, HD = 0, S = 0;
    // GEMV_PLAIN with the norm (lm_head): argmax (M) = for each input row, the first largest of its
    // outputs 0..argmax_cols-1 as stored (floatX), NaN skipped, 0 if all are NaN (the greedy sampler's
    // token). The last block to count in merges the blocks' candidates and resets the counter.
    // argmax_scratch: gemv_argmax_scratch_floats(M, SMs) floats, zeroed once.
    int* argmax = nullptr;
    float* argmax_scratch = nullptr;
    int argmax_cols = 0;
};

// The policy: how a launch splits the work and hides the latency (the top of the file). The lab
// (dev/cuda/gemv.cu) passes its own policies to gemv_detail's launchers.
struct GemvPolicy {
    // R, rows a warp computes where the epilogue leaves the choice (the SwiGLU and RoPE pairs: 2): 2
    // from M = 4 halves the warps and their registers, so more of the next kernel's blocks fit early.
    static constexpr int rows(int M) { return M >= 4 ? 2 : 1; }
    // KS, warps sharing a row group: the fewest (1, 2, 4) that load a row's K / 8 packs in one round
    // of GEMV_UNROLL packs a lane (K = 768: 1; 2048: 2; 3072: 4).
    static constexpr int split_k(int K) {
        return K / x128::size <= 32 * GEMV_UNROLL ? 1 : K / x128::size <= 64 * GEMV_UNROLL ? 2 : 4;
    }
    // Before the PDL wait: the first round of a warp's weight packs into registers, with its group's
    // epilogue inputs (false, the lab's: an L2 prefetch instead).
    static constexpr bool preload = true;
    // The fused kernels on the tensor cores (gemv_mma.cuh), bf16 build: at M = 8 input rows where a row's K
    // is one CUDA-core round (split_k 1, K <= 1024). Fewer rows: the CUDA-core kernel is as fast or faster
    // (its FMAs hide under the loads); K 2048-3072 (fcproj, N = 768): the mma kernel's N / 16 tiles fill
    // 48 of the SMs. Measured per op in dev/cuda/gemv.cu (docs/perf.md, "Generation").
    static constexpr bool tensor_cores_rows(int M) { return M >= GEMV_MAX_M; }  // compiled for these M only
    static constexpr bool tensor_cores(int M, int K) { return tensor_cores_rows(M) && split_k(K) == 1; }
};

namespace gemv_detail {

constexpr int WARPS = GEMV_THREADS / WARP_SIZE;

// A launch's settings from the policy, a kernel argument: as a template parameter, preload would change
// the registers ptxas gives the kernels, and with them the norm kernels' one-wave grids.
struct GemvLaunch {
    bool preload;  // GemvPolicy::preload
    int split_k;   // KS = GemvPolicy::split_k(K)
};

// acc[r][m] += dot(w[r], input row m's pack at element k), one lane's share.
template <int M, int R>
__device__ inline void gemv_packs(float (&acc)[R][M], const x128 (&w)[R], const floatX* inp, int K, int k) {
    float wf[R][x128::size];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int e = 0; e < x128::size; e++) wf[r][e] = to_float(w[r][e]);
#pragma unroll
    for (int m = 0; m < M; m++) {
        const x128 x = load128(inp + (int64_t)m * K + k);
#pragma unroll
        for (int e = 0; e < x128::size; e++) {
            const float xf = to_float(x[e]);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r][m] = fmaf(wf[r][e], xf, acc[r][m]);
        }
    }
}

// The fused prologue: warp w of W normalizes rows w, w + W, ... of inp (M, K) into xs (M, K), lane i
// taking packs i, i + 32, ..., with layernorm / rmsnorm_forward_warp_per_row's loops and fp32 order.
// nw, nb: the norm's weight and bias, staged in shared memory before pdl_wait (nb unused by RMSNorm).
template <int M>
__device__ inline void normalize_rows(floatX* xs, const floatX* inp, const floatX* nw, const floatX* nb, int K,
                                      const GemvFusion& f) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const bool layer = f.norm == GEMV_NORM_LAYER;
    for (int m = warp; m < M; m += blockDim.x / WARP_SIZE) {
        const floatX* x = inp + (int64_t)m * K;
        float mean = 0.0f, sq = 0.0f;
        if (layer) {
            float sum = 0.0f;
            for (int c = lane * x128::size; c < K; c += WARP_SIZE * x128::size) {
                const x128 v = load128(x + c);
                for (int k = 0; k < x128::size; k++) sum += to_float(v[k]);
            }
            mean = warp_reduce_sum(sum) / K;
            for (int c = lane * x128::size; c < K; c += WARP_SIZE * x128::size) {
                const x128 v = load128(x + c);
                for (int k = 0; k < x128::size; k++) { const float d = to_float(v[k]) - mean; sq += d * d; }
            }
        } else {
            for (int c = lane * x128::size; c < K; c += WARP_SIZE * x128::size) {
                const x128 v = load128(x + c);
                for (int k = 0; k < x128::size; k++) sq += to_float(v[k]) * to_float(v[k]);
            }
        }
        const float s = rsqrtf(warp_reduce_sum(sq) / K + (layer ? LAYERNORM_EPS : f.eps));
        for (int c = lane * x128::size; c < K; c += WARP_SIZE * x128::size) {
            const x128 v = load128(x + c), w = load128(nw + c);
            x128 o;
            if (layer) {
                const x128 b = load128(nb + c);
                for (int k = 0; k < x128::size; k++)
                    o[k] = from_float<floatX>((to_float(v[k]) - mean) * s * to_float(w[k]) + to_float(b[k]));
            } else {
                for (int k = 0; k < x128::size; k++) o[k] = from_float<floatX>(to_float(v[k]) * s * to_float(w[k]));
            }
            store128(xs + (int64_t)m * K + c, o);
        }
    }
}

// The fused kernels' hand-off after their early loads: NORM stages the norm's weight and bias in shared
// memory (they never depend on the kernel before), then the PDL wait, then the block normalizes inp's
// M rows into xs (normalize_rows). Returns the rows the product reads: xs (NORM) or inp. xs: the
// kernel's dynamic shared memory, gemv_norm_smem(M, K) bytes with NORM.
template <int M, bool NORM>
__device__ inline const floatX* wait_for_inputs(floatX* xs, const floatX* inp, int K, const GemvFusion& f) {
    floatX* nw = xs + (int64_t)M * K;
    floatX* nb = nw + K;
    if constexpr (NORM) {
        for (int i = threadIdx.x; i < K / x128::size; i += blockDim.x) {
            store128(nw + i * x128::size, load128(f.norm_w + i * x128::size));
            if (f.norm == GEMV_NORM_LAYER) store128(nb + i * x128::size, load128(f.norm_b + i * x128::size));
        }
        __syncthreads();
    }
    pdl_wait();
    pdl_launch_dependents();
    if constexpr (NORM) {
        normalize_rows<M>(xs, inp, nw, nb, K, f);
        __syncthreads();
        return xs;
    } else {
        return inp;
    }
}

// GEMV_QKV's store of input row m (sequence m): y[r] = row[r]'s value; with `pair` rows (d, d + HD/2)
// of one head, turned by RoPE first when that head is a q or k head.
template <int R>
__device__ inline void store_qkv(floatX* out, const float (&v)[R], const int (&row)[R], int nrows, int m, int N,
                                 bool pair, const GemvFusion& f) {
    floatX y[R];
#pragma unroll
    for (int r = 0; r < R; r++) y[r] = from_float<floatX>(v[r]);
    const int p = f.pos[m];
    if constexpr (R == 2) {
        const int half = f.HD / 2, i = row[0] % f.HD;
        if (pair && p >= 0 && row[0] / f.HD < f.NH + f.NKV) {
            const float c = f.rope_cos[(int64_t)p * half + i], s = f.rope_sin[(int64_t)p * half + i];
            const float a = to_float(y[0]), b = to_float(y[1]);
            y[0] = from_float<floatX>(a * c - b * s);
            y[1] = from_float<floatX>(b * c + a * s);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r >= nrows) break;
        out[(int64_t)m * N + row[r]] = y[r];
        const int h = row[r] / f.HD;
        if (p < 0 || h < f.NH) continue;
        const int kv = h - f.NH;  // K heads NH .. NH+NKV-1, then the V heads
        floatX* cache = kv < f.NKV ? f.k_cache : f.v_cache;
        cache[(((int64_t)m * f.NKV + kv % f.NKV) * f.S + p % f.S) * f.HD + row[r] % f.HD] = y[r];
    }
}

// The folded argmax's end (GemvFusion::argmax), called by every thread: lane m of each warp holds its
// candidate for input row m; the block's go to the scratch, and the last block merges them row by row,
// each thread loading ARGMAX_LOADS candidates before merging any (not an L2 latency per candidate).
constexpr int ARGMAX_LOADS = 8;
template <int M>
__device__ inline void argmax_finish(sampler_detail::ArgMax cand, const GemvFusion& f) {
    __shared__ float sh_v[WARPS][M], red_v[32];
    __shared__ int sh_i[WARPS][M], red_i[32];
    __shared__ bool sh_last;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, P = gridDim.x;
    const int none = f.argmax_cols;
    int* counter = reinterpret_cast<int*>(f.argmax_scratch);
    float* part_v = f.argmax_scratch + 4;                                 // (M, P)
    int* part_i = reinterpret_cast<int*>(part_v + (size_t)M * P);       // (M, P)
    if (lane < M) { sh_v[warp][lane] = cand.v; sh_i[warp][lane] = cand.i; }
    __syncthreads();
    if (threadIdx.x < M) {
        const int m = threadIdx.x;
        sampler_detail::ArgMax a{sh_v[0][m], sh_i[0][m]};
        for (int w = 1; w < WARPS; w++) sampler_detail::argmax_merge(a, {sh_v[w][m], sh_i[w][m]});
        part_v[(size_t)m * P + blockIdx.x] = a.v;
        part_i[(size_t)m * P + blockIdx.x] = a.i;
        __threadfence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        sh_last = atomicAdd(counter, 1) == P - 1;
        if (sh_last) *counter = 0;  // every block has counted: ready for the next call
    }
    __syncthreads();
    if (!sh_last) return;
    __threadfence();
    for (int m = 0; m < M; m++) {
        const float* pv = part_v + (size_t)m * P;
        const int* pi = part_i + (size_t)m * P;
        sampler_detail::ArgMax a{-INFINITY, none};
        for (int base = threadIdx.x; base < P; base += GEMV_THREADS * ARGMAX_LOADS) {
            float v[ARGMAX_LOADS];
            int ix[ARGMAX_LOADS];
#pragma unroll
            for (int u = 0; u < ARGMAX_LOADS; u++) {
                const int i = base + u * GEMV_THREADS;
                v[u] = i < P ? __ldcg(pv + i) : -INFINITY;
                ix[u] = i < P ? __ldcg(pi + i) : none;
            }
#pragma unroll
            for (int u = 0; u < ARGMAX_LOADS; u++) sampler_detail::argmax_merge(a, {v[u], ix[u]});
        }
        a = sampler_detail::block_argmax_merge(a, red_v, red_i, none);
        if (threadIdx.x == 0) f.argmax[m] = a.i < none ? a.i : 0;
    }
}

// Input row m's outputs of row group g (gemv_kernel's epilogue): v = the group's sums plus the bias,
// res_v GEMV_RESIDUAL's residual of row m; cand: the folded argmax's candidate of input row m.
template <int M, int R, int EPI>
__device__ __forceinline__ void store_outputs(floatX* out, const float (&v)[R], const float (&res_v)[R],
                                              const int (&row)[R], int nrows, int m, int N, int g, bool pair,
                                              const GemvFusion& f, sampler_detail::ArgMax& cand) {
    if constexpr (EPI == GEMV_SWIGLU) {
        out[(int64_t)m * (N / 2) + g] = from_float<floatX>(v[0] * swiglu_sigmoid(v[0]) * v[1]);
    } else if constexpr (EPI == GEMV_QKV) {
        store_qkv<R>(out, v, row, nrows, m, N, pair, f);
    } else {
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r >= nrows) break;
            const int64_t o = (int64_t)m * N + row[r];
            if constexpr (EPI == GEMV_GELU) out[o] = from_float<floatX>(gelu_tanh(v[r]));
            else if constexpr (EPI == GEMV_RESIDUAL)
                out[o] = from_float<floatX>(res_v[r] + to_float(from_float<floatX>(v[r])));
            else {
                const floatX y = from_float<floatX>(v[r]);
                out[o] = y;
                const float yf = to_float(y);
                if (f.argmax && row[r] < f.argmax_cols && !isnan(yf)) sampler_detail::argmax_merge(cand, {yf, row[r]});
            }
        }
    }
}

// Row group g (a warp's R rows, or a pair: GEMV_SWIGLU: rows g and g + N/2; GEMV_QKV with RoPE: rows
// h*HD + i and h*HD + i + HD/2 for g = h*HD/2 + i) is computed by KS = l.split_k warps of one block
// (WARPS / KS groups a block; the blocks loop over the rest): warp kw of the KS takes the packs
// lane + 32*(kw + KS*i), i = 0, 1, ... Rows past N read row N-1 and write nothing. NORM: inp's rows
// are read from shared memory (normalize_rows). Phases: the loads before the PDL wait, the norm
// prologue, then per group the rounds of weight packs, the reductions and the epilogue (store_outputs).
template <int M, int R, int EPI, bool NORM>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_kernel(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int K, int N, GemvFusion f,
            GemvLaunch l) {
    static_assert(R == 1 || R == 2 || R == 4, "1, 2 or 4 rows a warp");
    static_assert(EPI != GEMV_SWIGLU || R == 2, "SwiGLU pairs rows j and H + j");
    extern __shared__ x128 gemv_smem[];  // NORM: rows (M, K), norm weight (K), norm bias (K), floatX
    __shared__ float split_sums[WARPS][R][M];  // KS > 1: each warp's R*M sums
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const bool pair = EPI == GEMV_SWIGLU || (EPI == GEMV_QKV && R == 2 && f.rope_cos != nullptr);
    const int H = N / 2, groups = pair ? H : (N + R - 1) / R, half = f.HD / 2;
    const int KS = l.split_k, per_block = WARPS / KS, kw = warp % KS;
    const int packs = K / x128::size, p0 = lane + kw * WARP_SIZE, pstep = KS * WARP_SIZE;
    auto rows_of = [&](int g, int (&row)[R]) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (EPI == GEMV_SWIGLU) row[r] = g + r * H;
            else if (pair) row[r] = (g / half) * f.HD + g % half + r * half;
            else row[r] = min(g * R + r, N - 1);
        }
    };
    // one round: the U packs p, p + pstep, ... of each of the R rows (predicated at the end of a row)
    x128 w[GEMV_UNROLL][R];
    auto load_round = [&](const int (&row)[R], int p) {
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (p + u * pstep < packs) w[u][r] = load128cs(weight + (int64_t)row[r] * K + (p + u * pstep) * x128::size);
    };
    // the epilogue's inputs of a group: the bias of its rows, and lane m's residual of input row m
    // (GEMV_RESIDUAL: written kernels before the one this waits for, see model_infer.cuh; __ldcg: L2)
    float bias_v[R], res_v[R];
    auto load_bias = [&](const int (&row)[R]) {
#pragma unroll
        for (int r = 0; r < R; r++) bias_v[r] = bias ? to_float(bias[row[r]]) : 0.0f;
    };
    auto load_residual = [&](const int (&row)[R]) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            res_v[r] = 0.0f;
            if constexpr (EPI == GEMV_RESIDUAL)
                if (lane < M) res_v[r] = to_float(__ldcg(f.residual + (int64_t)lane * N + row[r]));
        }
    };
    // before the wait: this warp's first round (or the lab's L2 prefetch), its epilogue inputs, the norm's
    // weight and bias into shared memory
    const int first = min(blockIdx.x * per_block + warp / KS, groups - 1);
    bool loaded = false;
    if (blockIdx.x * per_block < groups) {
        int row[R];
        rows_of(first, row);
        if (l.preload) {
            load_round(row, p0);
            load_bias(row);
            load_residual(row);
            loaded = true;
        } else {
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (p0 + u * pstep < packs)
                        prefetch_l2(weight + (int64_t)row[r] * K + (p0 + u * pstep) * x128::size);
        }
    }
    const floatX* x = wait_for_inputs<M, NORM>(reinterpret_cast<floatX*>(gemv_smem), inp, K, f);
    // the folded argmax: lane m's candidate of input row m among this warp's rows
    sampler_detail::ArgMax cand{-INFINITY, f.argmax_cols};
    // block-uniform loop (the split's __syncthreads): this warp's group g, valid when g < groups
    for (int gb = blockIdx.x; gb * per_block < groups; gb += gridDim.x) {
        const int g_raw = gb * per_block + warp / KS, g = min(g_raw, groups - 1);
        int row[R];
        rows_of(g, row);
        if (!loaded) {
            load_bias(row);
            load_residual(row);
        }
        float acc[R][M];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < M; m++) acc[r][m] = 0.0f;
        // rounds of U packs per row, all U*R loads before the math (the first one preloaded before the wait)
        for (int p = p0; p < packs; p += GEMV_UNROLL * pstep) {
            if (!loaded) load_round(row, p);
            loaded = false;
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++)
                if (p + u * pstep < packs) gemv_packs<M, R>(acc, w[u], x, K, (p + u * pstep) * x128::size);
        }
        loaded = false;  // (a group with no packs for this warp: K < 32 * x128::size * kw)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < M; m++) acc[r][m] = warp_reduce_sum(acc[r][m]);
        if (KS > 1) {  // warp kw = 0 of the group adds the others' sums, in warp order
            __syncthreads();  // the previous group's readers are done
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int m = 0; m < M; m++) split_sums[warp][r][m] = acc[r][m];
            __syncthreads();
            if (kw != 0) continue;
            for (int j = 1; j < KS; j++)
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int m = 0; m < M; m++) acc[r][m] += split_sums[warp + j][r][m];
        }

        // lane m writes input row m's outputs (every lane holds every sum after the reduction)
        if (lane >= M || g_raw >= groups) continue;
        const int nrows = pair ? R : min(R, N - g * R);  // rows of this group inside N
#pragma unroll
        for (int m = 0; m < M; m++) {
            if (m != lane) continue;
            float v[R];
#pragma unroll
            for (int r = 0; r < R; r++) v[r] = acc[r][m] + bias_v[r];
            store_outputs<M, R, EPI>(out, v, res_v, row, nrows, m, N, g, pair, f, cand);
        }
    }
    if constexpr (EPI == GEMV_PLAIN)
        if (f.argmax) argmax_finish<M>(cand, f);
}

// The grid of a kernel with NORM: at most one wave (the warps loop over the rest), each block
// normalizing once; `blocks` without.
template <class Kernel>
inline int norm_grid(Kernel kernel, int blocks, size_t smem, const CudaContext& ctx, int threads = GEMV_THREADS) {
    const int resident = ctx.blocks_per_sm(kernel, threads, smem);
    return std::min(blocks, std::max(1, std::min(resident, GEMV_NORM_BLOCKS_PER_SM)) * ctx.sm_count);
}

// One launch of gemv_mma_kernel<M, EPI, NORM, W> (bf16 build only), with the attribute when pdl: in
// llmc/gemv_mma.cuh (included at the end).
constexpr int GEMV_MMA_WARPS = GEMV_THREADS / WARP_SIZE;  // the policy's warps a tile (argmax_finish's block)
template <int M, int EPI, bool NORM, int W = GEMV_MMA_WARPS>
inline void launch_mma(bool pdl, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int K,
                       int N, const GemvFusion& f, const CudaContext& ctx);

// One launch of gemv_kernel<M, R, EPI, NORM> under the policy P, with the programmatic-serialization
// attribute when pdl.
template <int M, int R, int EPI, bool NORM, class P>
inline void launch(bool pdl, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int K, int N,
                  const GemvFusion& f, const CudaContext& ctx) {
    const int split_k = P::split_k(K);
    if (split_k != 1 && split_k != 2 && split_k != 4) fail("gemv: split_k %d is not 1, 2 or 4", split_k);
    const bool pair = EPI == GEMV_SWIGLU || (EPI == GEMV_QKV && R == 2 && f.rope_cos != nullptr);
    int blocks = ceil_div(pair ? N / 2 : ceil_div(N, R), WARPS / split_k);
    size_t smem = 0;
    if constexpr (NORM) {
        smem = gemv_norm_smem(M, K);
        blocks = norm_grid(gemv_kernel<M, R, EPI, NORM>, blocks, smem, ctx);
    }
    if (f.argmax && (EPI != GEMV_PLAIN || !NORM))
        fail("internal: the folded argmax needs a plain GEMV with its norm (a grid of one wave)");
    launch_kernel(gemv_kernel<M, R, EPI, NORM>, dim3(blocks), dim3(GEMV_THREADS), smem, ctx.stream, pdl, out, inp,
                  weight, bias, K, N, f, GemvLaunch{P::preload, split_k});
}

// fn(std::integral_constant<int, M>{}) for the runtime M in 1..GEMV_MAX_M.
template <class Fn>
inline void with_m(int M, Fn&& fn) {
    switch (M) {
        case 1: return fn(std::integral_constant<int, 1>{});
        case 2: return fn(std::integral_constant<int, 2>{});
        case 3: return fn(std::integral_constant<int, 3>{});
        case 4: return fn(std::integral_constant<int, 4>{});
        case 5: return fn(std::integral_constant<int, 5>{});
        case 6: return fn(std::integral_constant<int, 6>{});
        case 7: return fn(std::integral_constant<int, 7>{});
        default: return fn(std::integral_constant<int, 8>{});
    }
}

// gemv_forward and gemv_fused_forward under the policy P (the lab's override; no checks of the shapes).
template <class P>
inline void forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int M, int K, int N,
                    GemvEpilogue epi, const CudaContext& ctx, bool pdl) {
    const GemvFusion none{};
    with_m(M, [&](auto m) {
        constexpr int MM = decltype(m)::value, R = P::rows(MM);
        if (epi == GEMV_GELU) return launch<MM, R, GEMV_GELU, false, P>(pdl, out, inp, weight, bias, K, N, none, ctx);
        if (epi == GEMV_SWIGLU) return launch<MM, 2, GEMV_SWIGLU, false, P>(pdl, out, inp, weight, bias, K, N, none, ctx);
        return launch<MM, R, GEMV_PLAIN, false, P>(pdl, out, inp, weight, bias, K, N, none, ctx);
    });
    cudaCheckLaunch();
}
// tensor_cores: where P::tensor_cores(M, K) takes them (bf16 build), gemv_mma_kernel.
template <class P>
inline void fused_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int M, int K,
                          int N, GemvEpilogue epi, const GemvFusion& f, const CudaContext& ctx, bool pdl,
                          bool tensor_cores) {
    const bool norm = f.norm != GEMV_NORM_NONE;
    if (epi == GEMV_QKV && !norm) fail("internal: the fused QKV GEMV comes with its norm prologue");
    if (epi == GEMV_RESIDUAL && norm) fail("internal: the fused residual GEMV has no norm prologue");
    if (epi != GEMV_QKV && epi != GEMV_RESIDUAL && !norm) fail("internal: use gemv_forward for a GEMV without a fusion");
    with_m(M, [&](auto m) {
        constexpr int MM = decltype(m)::value, R = P::rows(MM);
        if constexpr (std::is_same<floatX, __nv_bfloat16>::value && P::tensor_cores_rows(MM))
            if (tensor_cores && P::tensor_cores(MM, K)) {
                switch (epi) {
                    case GEMV_QKV: return launch_mma<MM, GEMV_QKV, true>(pdl, out, inp, weight, bias, K, N, f, ctx);
                    case GEMV_RESIDUAL:
                        return launch_mma<MM, GEMV_RESIDUAL, false>(pdl, out, inp, weight, bias, K, N, f, ctx);
                    case GEMV_GELU: return launch_mma<MM, GEMV_GELU, true>(pdl, out, inp, weight, bias, K, N, f, ctx);
                    case GEMV_SWIGLU: return launch_mma<MM, GEMV_SWIGLU, true>(pdl, out, inp, weight, bias, K, N, f, ctx);
                    default: return launch_mma<MM, GEMV_PLAIN, true>(pdl, out, inp, weight, bias, K, N, f, ctx);
                }
            }
        switch (epi) {
            case GEMV_QKV:
                if (f.rope_cos) return launch<MM, 2, GEMV_QKV, true, P>(pdl, out, inp, weight, bias, K, N, f, ctx);
                return launch<MM, R, GEMV_QKV, true, P>(pdl, out, inp, weight, bias, K, N, f, ctx);
            case GEMV_RESIDUAL: return launch<MM, R, GEMV_RESIDUAL, false, P>(pdl, out, inp, weight, bias, K, N, f, ctx);
            case GEMV_GELU: return launch<MM, R, GEMV_GELU, true, P>(pdl, out, inp, weight, bias, K, N, f, ctx);
            case GEMV_SWIGLU: return launch<MM, 2, GEMV_SWIGLU, true, P>(pdl, out, inp, weight, bias, K, N, f, ctx);
            default: return launch<MM, R, GEMV_PLAIN, true, P>(pdl, out, inp, weight, bias, K, N, f, ctx);
        }
    });
    cudaCheckLaunch();
}

}  // namespace gemv_detail

// Whether gemv_forward runs this shape.
inline bool gemv_supported(int M, int K, int N, GemvEpilogue epi) {
    return M >= 1 && M <= GEMV_MAX_M && K > 0 && K % x128::size == 0 && N > 0 &&
           (epi == GEMV_PLAIN || epi == GEMV_GELU || (epi == GEMV_SWIGLU && N % 2 == 0));
}

// Whether gemv_fused_forward runs this shape and fusion: gemv_forward's shapes, the normalized rows
// and the norm's weight and bias within GEMV_NORM_MAX_SMEM, the QKV layout whole (RoPE: HD even).
inline bool gemv_fused_supported(int M, int K, int N, GemvEpilogue epi, const GemvFusion& f) {
    const bool norm = f.norm != GEMV_NORM_NONE;
    if (!(M >= 1 && M <= GEMV_MAX_M && K > 0 && K % x128::size == 0 && N > 0)) return false;
    if (norm && (gemv_norm_smem(M, K) > GEMV_NORM_MAX_SMEM || !f.norm_w ||
                 (f.norm == GEMV_NORM_LAYER && !f.norm_b) || (f.norm == GEMV_NORM_RMS && !(f.eps > 0.0f))))
        return false;
    if (f.argmax && !(epi == GEMV_PLAIN && norm && f.argmax_scratch && f.argmax_cols > 0 && f.argmax_cols <= N))
        return false;
    switch (epi) {
        case GEMV_QKV:
            return norm && f.k_cache && f.v_cache && f.pos && f.NH > 0 && f.NKV > 0 && f.HD > 0 && f.S > 0 &&
                   N == (f.NH + 2 * f.NKV) * f.HD && (!f.rope_cos || (f.rope_sin && f.HD % 2 == 0));
        case GEMV_RESIDUAL: return !norm && f.residual;
        case GEMV_SWIGLU: return norm && N % 2 == 0;
        default: return norm;
    }
}

// out = epilogue(inp (M, K) W^T (N, K) + bias); out (M, N), or (M, N/2) for GEMV_SWIGLU. pdl: launch
// as a programmatic dependent of the previous kernel in the stream (see the top).
inline void gemv_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int M, int K, int N,
                         GemvEpilogue epi, const CudaContext& ctx, bool pdl = false) {
    if (!gemv_supported(M, K, N, epi))
        fail("gemv_forward: M = %d (1..%d), K = %d (a multiple of %d), N = %d (even for SwiGLU), epilogue %d not "
             "supported", M, GEMV_MAX_M, K, x128::size, N, (int)epi);
    gemv_detail::forward<GemvPolicy>(out, inp, weight, bias, M, K, N, epi, ctx, pdl);
}

// The decode step's fused kernels (the top of the file): out = epilogue(norm(inp) W^T + bias), or with
// f's residual; shapes as gemv_forward; gemv_fused_supported must hold. tensor_cores: false keeps the
// CUDA-core kernel where GemvPolicy::tensor_cores would take gemv_mma.cuh's.
inline void gemv_fused_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int M, int K,
                               int N, GemvEpilogue epi, const GemvFusion& f, const CudaContext& ctx, bool pdl = true,
                               bool tensor_cores = true) {
    if (!gemv_fused_supported(M, K, N, epi, f))
        fail("gemv_fused_forward: M = %d, K = %d, N = %d, epilogue %d, norm %d not supported", M, K, N, (int)epi,
             (int)f.norm);
    gemv_detail::fused_forward<GemvPolicy>(out, inp, weight, bias, M, K, N, epi, f, ctx, pdl, tensor_cores);
}

#include "llmc/gemv_mma.cuh"  // the tensor-core kernels (gemv_detail::launch_mma)
