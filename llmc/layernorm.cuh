// layernorm.cuh: LayerNorm over the last axis (eps 1e-5), optionally fused with the residual add
// that precedes it in every GPT-2 block. Rows are N = B*T, width C; floatX in and out, fp32 statistics.
//   layernorm_forward                 out (N, C), mean (N), rstd (N)                       (=)
//   fused_residual_layernorm_forward  residual (N, C) = inp1 + inp2 (rounded to floatX), then
//                                     out = LN(residual); the statistics are those of the stored
//                                     residual, so the backward sees exactly what the forward used (=)
//   layernorm_backward                dinp += ..., dweight += ..., dbias += ...            (+=)
// The weight/bias gradients are column sums over N rows in fixed order (norm_backward.cuh):
// deterministic. C must be a multiple of x128::size.
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/norm_backward.cuh"
#include "llmc/utils.h"

constexpr float LAYERNORM_EPS = 1e-5f;
constexpr int LAYERNORM_BLOCK = 256;  // 8 warps = 8 rows per block

// One warp per row; lane l handles the packs at columns (l + 32 i) * x128::size. DRAM traffic: read
// N*C (x2 inputs when fused), write N*C (x2 when fused): memory-bound, ~60 us at N = 65536, C = 768.
// The row's work, shared with the FP8 LayerNorm of llmc/fp8_fused.cuh (the same bits): the residual
// add, mean and rstd written; store(c, o) takes the normalized pack at column c. PACKS = 0: passes
// over the row in memory (the residual written, then read back for the sum, the variance and the
// output, from L1/L2). PACKS > 0 (>= the row's packs per lane): the row read once into registers; the
// same sums in the same order, so the same bits.
template <bool FUSED_RESIDUAL, int PACKS = 0, typename Store>
__device__ inline void layernorm_row_warp(floatX* residual, float* mean, float* rstd, const floatX* inp1,
                                          const floatX* inp2, const floatX* weight, const floatX* bias, int row, int C,
                                          Store store) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t base = (int64_t)row * C;
    if constexpr (PACKS > 0) {
        x128 v[PACKS];
#pragma unroll
        for (int i = 0; i < PACKS; i++) {
            const int c = (lane + i * WARP_SIZE) * x128::size;
            if (c >= C) continue;
            if (FUSED_RESIDUAL) {
                const x128 a = load128cs(inp1 + base + c), b = load128cs(inp2 + base + c);
#pragma unroll
                for (int k = 0; k < x128::size; k++) v[i][k] = from_float<floatX>(to_float(a[k]) + to_float(b[k]));
                store128(residual + base + c, v[i]);
            } else {
                v[i] = load128cs(inp1 + base + c);
            }
        }
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < PACKS; i++)
            if ((lane + i * WARP_SIZE) * x128::size < C)
#pragma unroll
                for (int k = 0; k < x128::size; k++) sum += to_float(v[i][k]);
        const float m = warp_reduce_sum(sum) / C;
        float sq = 0.0f;
#pragma unroll
        for (int i = 0; i < PACKS; i++)
            if ((lane + i * WARP_SIZE) * x128::size < C)
#pragma unroll
                for (int k = 0; k < x128::size; k++) { const float d = to_float(v[i][k]) - m; sq += d * d; }
        const float s = rsqrtf(warp_reduce_sum(sq) / C + LAYERNORM_EPS);
#pragma unroll
        for (int i = 0; i < PACKS; i++) {
            const int c = (lane + i * WARP_SIZE) * x128::size;
            if (c >= C) continue;
            const x128 w = load128(weight + c), b = load128(bias + c);
            x128 o;
#pragma unroll
            for (int k = 0; k < x128::size; k++)
                o[k] = from_float<floatX>((to_float(v[i][k]) - m) * s * to_float(w[k]) + to_float(b[k]));
            store(c, o);
        }
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = s;
        }
        return;
    }
    const floatX* x = FUSED_RESIDUAL ? residual + base : inp1 + base;
    if (FUSED_RESIDUAL) {
        for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
            const x128 a = load128(inp1 + base + c), b = load128(inp2 + base + c);
            x128 r;
            for (int k = 0; k < x128::size; k++) r[k] = from_float<floatX>(to_float(a[k]) + to_float(b[k]));
            store128(residual + base + c, r);  // read back below by this same lane
        }
    }
    float sum = 0.0f;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        const x128 v = load128(x + c);
        for (int k = 0; k < x128::size; k++) sum += to_float(v[k]);
    }
    const float m = warp_reduce_sum(sum) / C;
    float sq = 0.0f;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        const x128 v = load128(x + c);
        for (int k = 0; k < x128::size; k++) { const float d = to_float(v[k]) - m; sq += d * d; }
    }
    const float s = rsqrtf(warp_reduce_sum(sq) / C + LAYERNORM_EPS);
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        const x128 v = load128(x + c), w = load128(weight + c), b = load128(bias + c);
        x128 o;
        for (int k = 0; k < x128::size; k++)
            o[k] = from_float<floatX>((to_float(v[k]) - m) * s * to_float(w[k]) + to_float(b[k]));
        store(c, o);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

template <bool FUSED_RESIDUAL>
static __global__ void layernorm_forward_warp_per_row(floatX* residual, floatX* out, float* mean, float* rstd,
                                                      const floatX* inp1, const floatX* inp2, const floatX* weight,
                                                      const floatX* bias, int N, int C) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    floatX* out_row = out + (int64_t)row * C;
    layernorm_row_warp<FUSED_RESIDUAL>(residual, mean, rstd, inp1, inp2, weight, bias, row, C,
                                       [&](int c, const x128& o) { store128(out_row + c, o); });
}

// A decode step's rows (NormLaunch::block_per_row, llmc/cuda_common.cuh): block = row, thread t owns
// pack t of the row (threads past C / x128::size hold zeros), the row read once into registers, mean
// and variance by two block reductions. Latency-bound (196 KB in and out at M = 64, C = 768). The
// weight and bias load before the PDL wait.
template <bool FUSED_RESIDUAL>
static __global__ void layernorm_forward_block_per_row(floatX* residual, floatX* out, float* mean, float* rstd,
                                                       const floatX* inp1, const floatX* inp2, const floatX* weight,
                                                       const floatX* bias, int N, int C) {
    const int row = blockIdx.x, c = threadIdx.x * x128::size;
    const bool on = c < C;
    x128 w, b;
    if (on) {
        w = load128(weight + c);
        b = load128(bias + c);
    }
    pdl_wait();
    pdl_launch_dependents();
    const int64_t at = (int64_t)row * C + c;
    float v[x128::size] = {};
    float sum = 0.0f;
    if (on) norm_load_pack<FUSED_RESIDUAL>(v, residual, inp1, inp2, at, [&](float x) { sum += x; });
    const float m = block_reduce_sum(sum) / C;
    float sq = 0.0f;
    if (on)
        for (int k = 0; k < x128::size; k++) sq += (v[k] - m) * (v[k] - m);
    const float s = rsqrtf(block_reduce_sum(sq) / C + LAYERNORM_EPS);
    if (on) {
        x128 o;
        for (int k = 0; k < x128::size; k++)
            o[k] = from_float<floatX>((v[k] - m) * s * to_float(w[k]) + to_float(b[k]));
        store128(out + at, o);
    }
    if (threadIdx.x == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// The forward's launch: the block-per-row kernel where `how` asks for it and the rows fit, else the
// large-M kernel (how: NormLaunch, llmc/cuda_common.cuh; the default is the large-M kernel at every N).
template <bool FUSED_RESIDUAL>
inline void layernorm_forward_launch(const char* what, floatX* residual, floatX* out, float* mean, float* rstd,
                                     const floatX* inp1, const floatX* inp2, const floatX* weight, const floatX* bias,
                                     int N, int C, cudaStream_t stream, NormLaunch how) {
    norm_check(what, C);
    if (how.block_per_row && norm_block_per_row_fits(N, C))
        launch_kernel(layernorm_forward_block_per_row<FUSED_RESIDUAL>, dim3(N), dim3(norm_block_per_row_threads(C)), 0,
                      stream, how.pdl, residual, out, mean, rstd, inp1, inp2, weight, bias, N, C);
    else
        layernorm_forward_warp_per_row<FUSED_RESIDUAL><<<ceil_div(N, LAYERNORM_BLOCK / WARP_SIZE), LAYERNORM_BLOCK, 0,
                                                         stream>>>(residual, out, mean, rstd, inp1, inp2, weight, bias,
                                                                   N, C);
    cudaCheckLaunch();
}
inline void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                              const floatX* bias, int N, int C, cudaStream_t stream, NormLaunch how = {}) {
    layernorm_forward_launch<false>("layernorm_forward", nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C,
                                    stream, how);
}
inline void fused_residual_layernorm_forward(floatX* residual, floatX* out, float* mean, float* rstd,
                                             const floatX* inp1, const floatX* inp2, const floatX* weight,
                                             const floatX* bias, int N, int C, cudaStream_t stream,
                                             NormLaunch how = {}) {
    layernorm_forward_launch<true>("fused_residual_layernorm_forward", residual, out, mean, rstd, inp1, inp2, weight,
                                   bias, N, C, stream, how);
}

// ---------------------------------------------------------------- backward
// With norm = (x - mean) * rstd and g = dout * weight:
// dinp += rstd * (g - mean(g) - norm * mean(g * norm)), dweight += sum over rows of dout * norm,
// dbias += sum over rows of dout.
//
// The fused kernel (norm_backward.cuh: its plan and launch) keeps a lane's dweight and dbias sums and
// writes (chunks, 2, C) partials, [k][0] = dweight, [k][1] = dbias. Wide regime (PACKS 5..8 in bf16):
// norm_backward_smem(2, C); 2 blocks per SM at 5 packs (52 bytes of spill stores a thread), at 6-8
// packs 1 (128 registers would spill 264-528 bytes). Measured: docs/perf.md "Memory-bound kernels".
template <int PACKS>
__host__ __device__ constexpr int layernorm_backward_min_blocks() { return PACKS <= 5 ? 2 : 1; }
// The wide regime's sums, in the kernel's dynamic shared memory: (warp, sum: dweight then dbias, F4,
// P = C / x128::size packs) float4; slot (sum, h) of pack q holds columns q * x128::size + 4h .. + 3 of
// the warp's sum, and only pack q's lane touches it.
struct LayerNormWideSums {
    static constexpr int F4 = x128::size / 4;  // float4 slots per pack and sum
    float4* base;
    int warp, P;
    __device__ float4& operator()(int sum, int h, int q) const { return base[((warp * 2 + sum) * F4 + h) * P + q]; }
};

// The wide regime's step: one row, r. The loaded packs live across the reductions instead of t and
// norm (3 x 4 registers a pack against 2 x 8), and phase 2 recomputes norm, g and t from them (the
// same expressions, the same values).
template <int PACKS>
__device__ __forceinline__ void layernorm_backward_wide_row(const LayerNormWideSums& slot, floatX* dinp,
                                                            const floatX* dout, const floatX* inp,
                                                            const floatX* weight, float mr, float sr, int r, int C,
                                                            int lane) {
    constexpr int F4 = LayerNormWideSums::F4;
    const int P = slot.P;
    x128 d[PACKS], x[PACKS], di[PACKS];
    norm_backward_load_row<PACKS>(d, x, di, dout, inp, dinp, (int64_t)r * C, C, lane);
    float sgr = 0.0f, sgnr = 0.0f;
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        const int q = p * WARP_SIZE + lane;
        if (q >= P) continue;  // a pack past C: nothing to add (its loads read the last pack)
        const x128 w = load128(weight + q * x128::size);
        float pw[x128::size], pb[x128::size];
#pragma unroll
        for (int h = 0; h < F4; h++) {
            const float4 a = slot(0, h, q), b = slot(1, h, q);
            pw[4 * h] = a.x, pw[4 * h + 1] = a.y, pw[4 * h + 2] = a.z, pw[4 * h + 3] = a.w;
            pb[4 * h] = b.x, pb[4 * h + 1] = b.y, pb[4 * h + 2] = b.z, pb[4 * h + 3] = b.w;
        }
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            const float dk = to_float(d[p][k]);
            const float nk = (to_float(x[p][k]) - mr) * sr;
            const float g = dk * to_float(w[k]);
            sgr += g;
            sgnr += g * nk;
            pw[k] += dk * nk;
            pb[k] += dk;
        }
#pragma unroll
        for (int h = 0; h < F4; h++) {
            slot(0, h, q) = make_float4(pw[4 * h], pw[4 * h + 1], pw[4 * h + 2], pw[4 * h + 3]);
            slot(1, h, q) = make_float4(pb[4 * h], pb[4 * h + 1], pb[4 * h + 2], pb[4 * h + 3]);
        }
        // one pack's sums at a time: keeps the compiler from hoisting the next packs' shared loads
        // (2 x 8 registers a pack) above these stores, which spilled
        asm volatile("" ::: "memory");
    }
    sgr = warp_reduce_sum(sgr) / C * sr;    // rstd * mean(g)
    sgnr = warp_reduce_sum(sgnr) / C * sr;  // rstd * mean(g * norm)
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        const int q = p * WARP_SIZE + lane;
        if (q >= P) continue;
        const x128 w = load128(weight + q * x128::size);
        x128 o;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            const float nk = (to_float(x[p][k]) - mr) * sr;
            const float t = to_float(di[p][k]) + sr * (to_float(d[p][k]) * to_float(w[k]));
            o[k] = from_float<floatX>(t - (sgr + nk * sgnr));
        }
        store128(dinp + (int64_t)r * C + q * x128::size, o);
    }
}

// The narrow regime's step: rows r .. r + R - 1 (those below r1), the sums dw, db in registers.
// Phase 1 needs only what was loaded: the dweight and dbias sums, this lane's parts of sum(g) and
// sum(g * norm), and t = dinp + rstd * g. Phase 2, after the rows' reductions, writes
// dinp = t - rstd * (mean(g) + norm * mean(g * norm)); only t and norm live across them.
template <int PACKS, int R>
__device__ __forceinline__ void layernorm_backward_narrow_step(float (&dw)[PACKS][x128::size],
                                                               float (&db)[PACKS][x128::size], floatX* dinp,
                                                               const floatX* dout, const floatX* inp,
                                                               const floatX* weight, const float* mean,
                                                               const float* rstd, int r, int r1, int C, int lane) {
    float t[R][PACKS][x128::size], nrm[R][PACKS][x128::size];
    float m[R], s[R], sg[R], sgn[R];
    {
        x128 w[PACKS], d[R][PACKS], x[R][PACKS], di[R][PACKS];
        norm_backward_load_weight<PACKS>(w, weight, C, lane);
#pragma unroll
        for (int i = 0; i < R; i++) {  // every load of the R rows first
            const int row = min(r + i, r1 - 1);
            const int64_t base = (int64_t)row * C;
            m[i] = mean[row];
            s[i] = rstd[row];
            norm_backward_load_row<PACKS>(d[i], x[i], di[i], dout, inp, dinp, base, C, lane);
        }
#pragma unroll
        for (int i = 0; i < R; i++) {
            sg[i] = sgn[i] = 0.0f;
#pragma unroll
            for (int p = 0; p < PACKS; p++) {
                const int q = p * WARP_SIZE + lane;
                const bool ok = r + i < r1 && q * x128::size < C;
                float pw[x128::size], pb[x128::size];  // this pack's dweight and dbias sums
#pragma unroll
                for (int k = 0; k < x128::size; k++) pw[k] = dw[p][k], pb[k] = db[p][k];
#pragma unroll
                for (int k = 0; k < x128::size; k++) {
                    const float dk = ok ? to_float(d[i][p][k]) : 0.0f;
                    const float nk = ok ? (to_float(x[i][p][k]) - m[i]) * s[i] : 0.0f;
                    const float g = dk * to_float(w[p][k]);
                    sg[i] += g;
                    sgn[i] += g * nk;
                    nrm[i][p][k] = nk;
                    pw[k] += dk * nk;
                    pb[k] += dk;
                    t[i][p][k] = to_float(di[i][p][k]) + s[i] * g;
                }
#pragma unroll
                for (int k = 0; k < x128::size; k++) dw[p][k] = pw[k], db[p][k] = pb[k];
            }
        }
    }
    // the 2R reductions are independent shuffle chains
#pragma unroll
    for (int i = 0; i < R; i++) {
        sg[i] = warp_reduce_sum(sg[i]) / C * s[i];    // rstd * mean(g)
        sgn[i] = warp_reduce_sum(sgn[i]) / C * s[i];  // rstd * mean(g * norm)
    }
    norm_backward_store_rows<PACKS, R>(dinp, r, r1, C, lane,
                                       [&](int i, int p, int k) { return t[i][p][k] - (sg[i] + nrm[i][p][k] * sgn[i]); });
}

// The fused kernel (norm_backward.cuh launches it): the phases above over the block's chunk of rows,
// then the chunk's partials (norm_backward_write_partials).
template <int PACKS, int R>
static __global__ __launch_bounds__(NORM_BWD_BLOCK, layernorm_backward_min_blocks<PACKS>()) void
    layernorm_backward_fused(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                             const floatX* weight, const float* mean, const float* rstd, int N, int C,
                             int rows_per_chunk) {
    static_assert(PACKS <= NORM_BWD_MAX_PACKS, "rows up to NORM_BWD_MAX_C columns");
    constexpr bool WIDE = norm_backward_wide<PACKS>();
    static_assert(!WIDE || R == 1, "the wide regime takes one row a warp step");
    constexpr int F4 = LayerNormWideSums::F4;
    extern __shared__ float4 wide_sums[];  // WIDE: LayerNormWideSums
    const int P = C / x128::size;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int r0 = blockIdx.x * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    const LayerNormWideSums slot{wide_sums, warp, P};
    float dw[WIDE ? 1 : PACKS][x128::size], db[WIDE ? 1 : PACKS][x128::size];  // narrow: the sums
    if constexpr (WIDE) {
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int q = p * WARP_SIZE + lane;
            if (q < P)
#pragma unroll
                for (int h = 0; h < F4; h++) slot(0, h, q) = slot(1, h, q) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    } else {
#pragma unroll
        for (int p = 0; p < PACKS; p++)
#pragma unroll
            for (int k = 0; k < x128::size; k++) dw[p][k] = db[p][k] = 0.0f;
    }
    // r is the same for all lanes of a warp: the loop, the row checks and the shuffles are warp-uniform
#pragma unroll 1
    for (int r = r0 + warp * R; r < r1; r += NORM_BWD_WARPS * R) {
        if constexpr (WIDE)
            layernorm_backward_wide_row<PACKS>(slot, dinp, dout, inp, weight, mean[r], rstd[r], r, C, lane);
        else
            layernorm_backward_narrow_step<PACKS, R>(dw, db, dinp, dout, inp, weight, mean, rstd, r, r1, C, lane);
    }
    norm_backward_write_partials<2, PACKS>(partials, wide_sums, C, lane, warp, dw, db);
}

// The two-kernel path (C > NORM_BWD_MAX_C; norm_backward_two_kernels): dinp, a warp a row.
static __global__ void layernorm_backward_input_warp_per_row(floatX* dinp, const floatX* dout, const floatX* inp,
                                                             const floatX* weight, const float* mean,
                                                             const float* rstd, int N, int C) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    const int64_t base = (int64_t)row * C;
    const float m = mean[row], s = rstd[row];
    float sum_g = 0.0f, sum_gn = 0.0f;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        const x128 d = load128(dout + base + c), x = load128(inp + base + c), w = load128(weight + c);
        for (int k = 0; k < x128::size; k++) {
            const float g = to_float(d[k]) * to_float(w[k]);
            sum_g += g;
            sum_gn += g * (to_float(x[k]) - m) * s;
        }
    }
    const float mean_g = warp_reduce_sum(sum_g) / C, mean_gn = warp_reduce_sum(sum_gn) / C;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        const x128 d = load128(dout + base + c), x = load128(inp + base + c), w = load128(weight + c);
        x128 di = load128(dinp + base + c);
        for (int k = 0; k < x128::size; k++) {
            const float g = to_float(d[k]) * to_float(w[k]), norm = (to_float(x[k]) - m) * s;
            di[k] = from_float<floatX>(to_float(di[k]) + s * (g - mean_g - norm * mean_gn));
        }
        store128(dinp + base + c, di);
    }
}

// dweight/dbias partials of the two-kernel path: thread = one pack of columns, blockIdx.y = one chunk
// of rows, walked in order. partials (chunks, 2, C): [k][0] = sum dout * norm, [k][1] = sum dout.
static __global__ void layernorm_backward_param_partials(float* partials, const floatX* dout, const floatX* inp,
                                                         const float* mean, const float* rstd, int N, int C,
                                                         int rows_per_chunk) {
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (c >= C) return;
    const int chunk = blockIdx.y;
    const int r0 = chunk * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float dw[x128::size] = {}, db[x128::size] = {};
    for (int r = r0; r < r1; r++) {
        const float m = mean[r], s = rstd[r];
        const x128 d = load128(dout + (int64_t)r * C + c), x = load128(inp + (int64_t)r * C + c);
        for (int k = 0; k < x128::size; k++) {
            dw[k] += to_float(d[k]) * (to_float(x[k]) - m) * s;
            db[k] += to_float(d[k]);
        }
    }
    float* pw = partials + ((int64_t)chunk * 2) * C + c;
    float* pb = pw + C;
    for (int k = 0; k < x128::size; k++) { pw[k] = dw[k]; pb[k] = db[k]; }
}

// LayerNorm's backward for norm_backward.cuh's launchers.
struct LayerNormBackward {
    static constexpr const char* what = "layernorm_backward";
    static constexpr int SUMS = 2;  // dweight, dbias
    template <int PACKS, int R>
    static constexpr auto fused() { return layernorm_backward_fused<PACKS, R>; }
    template <int PACKS>
    static constexpr int min_blocks() { return layernorm_backward_min_blocks<PACKS>(); }
    static constexpr auto input() { return layernorm_backward_input_warp_per_row; }
    static constexpr auto partials() { return layernorm_backward_param_partials; }
};

// Floats of scratch layernorm_backward needs for N rows of C channels (either path).
inline size_t layernorm_backward_scratch_floats(int N, int C) { return (size_t)column_num_chunks(N) * 2 * C; }

// scratch: at least layernorm_backward_scratch_floats(N, C) floats.
inline void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                               const floatX* inp, const floatX* weight, const float* mean, const float* rstd, int N,
                               int C, const CudaContext& ctx) {
    norm_backward<LayerNormBackward>(dinp, dweight, dbias, scratch, N, C, ctx, dout, inp, weight, mean, rstd);
}
// Opts in the fused kernel that rows of C channels take to its shared memory (norm_backward_prepare).
inline void layernorm_backward_prepare(int C, const CudaContext& ctx) { norm_backward_prepare<LayerNormBackward>(C, ctx); }
