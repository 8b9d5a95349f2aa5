// rmsnorm.cuh: RMSNorm over the last axis (Llama-family models; Hugging Face's LlamaRMSNorm), optionally
// fused with the residual add before it. Rows are N = B*T, width C; floatX in and out, fp32 statistics;
// eps is an argument (config.json's rms_norm_eps: 1e-5 Llama 2, 1e-6 Llama 3 / Qwen2 / SmolLM).
//   rmsnorm_forward                 out (N, C) = inp * rstd * weight, rstd (N) = 1/sqrt(mean(inp^2) + eps)  (=)
//   fused_residual_rmsnorm_forward  residual (N, C) = inp1 + inp2 (rounded to floatX), then
//                                   out = rmsnorm(residual); the statistics are those of the stored
//                                   residual, so the backward sees exactly what the forward used    (=)
//   rmsnorm_backward                dinp (N, C) += ..., dweight (C) += ...                          (+=)
//                                   (the fused pair's backward is this call with dinp = dresidual and
//                                   inp = residual, as cpu::fused_residual_rmsnorm_backward)
// The weight gradient is a column sum over N rows in fixed order (norm_backward.cuh): deterministic.
// C must be a multiple of x128::size. References: llmc/cpu/rmsnorm.h.
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/norm_backward.cuh"
#include "llmc/utils.h"

constexpr int RMSNORM_BLOCK = 256;  // 8 warps = 8 rows per block

// One warp per row; lane i handles packs i, i+32, ... Two passes over the row: the sum of squares,
// then the output, which re-reads the row from L1/L2. Fused: the first pass also writes residual =
// inp1 + inp2 and the second reads the stored residual back (one pack instead of two).
// DRAM traffic, bytes of floatX: read N*C, write N*C (fused: twice that) plus 4N of rstd: ~50 us
// (~100 us fused) at N = 65536, C = 768; ~3 FLOPs per element: memory-bound.
template <bool FUSED_RESIDUAL>
static __global__ void rmsnorm_forward_warp_per_row(floatX* residual, floatX* out, float* rstd, const floatX* inp1,
                                                    const floatX* inp2, const floatX* weight, int N, int C,
                                                    float eps) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    const int64_t base = (int64_t)row * C;
    float sq = 0.0f;
#pragma unroll 4
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        x128 x = load128(inp1 + base + c);
        if constexpr (FUSED_RESIDUAL) {
            const x128 b = load128(inp2 + base + c);
            for (int k = 0; k < x128::size; k++) x[k] = from_float<floatX>(to_float(x[k]) + to_float(b[k]));
            store128(residual + base + c, x);  // read back below by this same lane
        }
        for (int k = 0; k < x128::size; k++) sq += to_float(x[k]) * to_float(x[k]);
    }
    const float s = rsqrtf(warp_reduce_sum(sq) / C + eps);
    const floatX* xrow = FUSED_RESIDUAL ? residual + base : inp1 + base;
#pragma unroll 4
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        const x128 x = load128(xrow + c), w = load128(weight + c);
        x128 o;
        for (int k = 0; k < x128::size; k++) o[k] = from_float<floatX>(to_float(x[k]) * s * to_float(w[k]));
        store128(out + base + c, o);
    }
    if (lane == 0) rstd[row] = s;
}

// A decode step's rows (NormLaunch::block_per_row, llmc/cuda_common.cuh): block = row, thread t owns
// pack t of the row, held in registers, the sum of squares by one block reduction; latency-bound as
// layernorm_forward_block_per_row. The weight loads before the PDL wait.
template <bool FUSED_RESIDUAL>
static __global__ void rmsnorm_forward_block_per_row(floatX* residual, floatX* out, float* rstd, const floatX* inp1,
                                                     const floatX* inp2, const floatX* weight, int N, int C,
                                                     float eps) {
    const int row = blockIdx.x, c = threadIdx.x * x128::size;
    const bool on = c < C;
    x128 w;
    if (on) w = load128(weight + c);
    pdl_wait();
    pdl_launch_dependents();
    const int64_t at = (int64_t)row * C + c;
    float v[x128::size] = {};
    float sq = 0.0f;
    if (on) norm_load_pack<FUSED_RESIDUAL>(v, residual, inp1, inp2, at, [&](float x) { sq += x * x; });
    const float s = rsqrtf(block_reduce_sum(sq) / C + eps);
    if (on) {
        x128 o;
        for (int k = 0; k < x128::size; k++) o[k] = from_float<floatX>(v[k] * s * to_float(w[k]));
        store128(out + at, o);
    }
    if (threadIdx.x == 0) rstd[row] = s;
}

inline void rmsnorm_check_eps(const char* what, float eps) {
    if (!(eps > 0.0f)) fail("%s: eps %g must be > 0", what, (double)eps);
}

// The forward's launch: the block-per-row kernel where `how` asks for it and the rows fit, else the
// large-M kernel (how: NormLaunch, llmc/cuda_common.cuh; the default is the large-M kernel at every N).
template <bool FUSED_RESIDUAL>
inline void rmsnorm_forward_launch(const char* what, floatX* residual, floatX* out, float* rstd, const floatX* inp1,
                                   const floatX* inp2, const floatX* weight, int N, int C, float eps,
                                   cudaStream_t stream, NormLaunch how) {
    norm_check(what, C);
    rmsnorm_check_eps(what, eps);
    if (how.block_per_row && norm_block_per_row_fits(N, C))
        launch_kernel(rmsnorm_forward_block_per_row<FUSED_RESIDUAL>, dim3(N), dim3(norm_block_per_row_threads(C)), 0,
                      stream, how.pdl, residual, out, rstd, inp1, inp2, weight, N, C, eps);
    else
        rmsnorm_forward_warp_per_row<FUSED_RESIDUAL><<<ceil_div(N, RMSNORM_BLOCK / WARP_SIZE), RMSNORM_BLOCK, 0,
                                                       stream>>>(residual, out, rstd, inp1, inp2, weight, N, C, eps);
    cudaCheckLaunch();
}
inline void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C, float eps,
                            cudaStream_t stream, NormLaunch how = {}) {
    rmsnorm_forward_launch<false>("rmsnorm_forward", nullptr, out, rstd, inp, nullptr, weight, N, C, eps, stream, how);
}
inline void fused_residual_rmsnorm_forward(floatX* residual, floatX* out, float* rstd, const floatX* inp1,
                                           const floatX* inp2, const floatX* weight, int N, int C, float eps,
                                           cudaStream_t stream, NormLaunch how = {}) {
    rmsnorm_forward_launch<true>("fused_residual_rmsnorm_forward", residual, out, rstd, inp1, inp2, weight, N, C, eps,
                                 stream, how);
}

// ---------------------------------------------------------------- backward
// With n = inp * rstd and g = dout * weight (no mean is subtracted, so no mean(g) term as in
// LayerNorm): dinp += rstd * (g - n * mean(g * n)), dweight += sum over rows of dout * n.
//
// The fused kernel (norm_backward.cuh: its plan and launch) keeps a lane's dweight sums and writes
// (chunks, C) partials, folded by column_partials_add. Wide regime (PACKS 5..8 in bf16):
// norm_backward_smem(1, C), 40 KB at C = 1280, 1 block per SM (255 registers). PACKS = packs per
// lane (3 at C = 768 in bf16), R = rows per warp step (norm_backward_rows).
template <int PACKS, int R>
static __global__ __launch_bounds__(NORM_BWD_BLOCK, norm_backward_min_blocks<PACKS>()) void rmsnorm_backward_fused(
    floatX* dinp, float* partials, const floatX* dout, const floatX* inp, const floatX* weight, const float* rstd,
    int N, int C, int rows_per_chunk) {
    static_assert(PACKS <= NORM_BWD_MAX_PACKS, "rows up to NORM_BWD_MAX_C columns");
    constexpr bool WIDE = norm_backward_wide<PACKS>();
    constexpr int F4 = x128::size / 4;  // float4 slots per pack
    // WIDE: (warp, F4, C / x128::size packs) float4; slot h of pack q holds columns q * x128::size + 4h
    // .. + 3 of this warp's dweight sum, and only pack q's lane touches it
    extern __shared__ float4 wide_dw[];
    const int P = C / x128::size;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int r0 = blockIdx.x * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    auto slot = [&](int h, int q) -> float4& { return wide_dw[(warp * F4 + h) * P + q]; };
    float dw[WIDE ? 1 : PACKS][x128::size];  // narrow: the sums
    if constexpr (WIDE) {
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int q = p * WARP_SIZE + lane;
            if (q < P)
#pragma unroll
                for (int h = 0; h < F4; h++) slot(h, q) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    } else {
#pragma unroll
        for (int p = 0; p < PACKS; p++)
#pragma unroll
            for (int k = 0; k < x128::size; k++) dw[p][k] = 0.0f;
    }
    // r is the same for all lanes of a warp: the loop, the row checks and the shuffles are warp-uniform
#pragma unroll 1
    for (int r = r0 + warp * R; r < r1; r += NORM_BWD_WARPS * R) {
        // Phase 1 needs only what was loaded: dweight's sum (dout * n, n = inp * rstd), this lane's
        // part of sum(g * inp), and t = dinp + rstd * g. Phase 2, after the row's reduction, writes
        // dinp = t - n * rstd * mean(g * n); only t and n live across the reduction.
        float t[R][PACKS][x128::size], n[R][PACKS][x128::size];
        float s[R], gx[R];
        {
            x128 w[PACKS], d[R][PACKS], x[R][PACKS], di[R][PACKS];
            norm_backward_load_weight<PACKS>(w, weight, C, lane);
#pragma unroll
            for (int i = 0; i < R; i++) {  // every load of the R rows first
                const int64_t base = (int64_t)min(r + i, r1 - 1) * C;
                s[i] = rstd[min(r + i, r1 - 1)];
                norm_backward_load_row<PACKS>(d[i], x[i], di[i], dout, inp, dinp, base, C, lane);
            }
#pragma unroll
            for (int i = 0; i < R; i++) {
                gx[i] = 0.0f;
#pragma unroll
                for (int p = 0; p < PACKS; p++) {
                    const int q = p * WARP_SIZE + lane;
                    const bool ok = r + i < r1 && q * x128::size < C;
                    float pw[x128::size] = {};  // this pack's dweight sums
                    if constexpr (WIDE) {
                        if (q < P)
#pragma unroll
                            for (int h = 0; h < F4; h++) {
                                const float4 a = slot(h, q);
                                pw[4 * h] = a.x, pw[4 * h + 1] = a.y, pw[4 * h + 2] = a.z, pw[4 * h + 3] = a.w;
                            }
                    } else {
#pragma unroll
                        for (int k = 0; k < x128::size; k++) pw[k] = dw[p][k];
                    }
#pragma unroll
                    for (int k = 0; k < x128::size; k++) {
                        const float dk = ok ? to_float(d[i][p][k]) : 0.0f, xk = ok ? to_float(x[i][p][k]) : 0.0f;
                        const float g = dk * to_float(w[p][k]);
                        gx[i] += g * xk;
                        n[i][p][k] = xk * s[i];
                        pw[k] += dk * n[i][p][k];
                        t[i][p][k] = to_float(di[i][p][k]) + s[i] * g;
                    }
                    if constexpr (WIDE) {
                        if (q < P)
#pragma unroll
                            for (int h = 0; h < F4; h++)
                                slot(h, q) = make_float4(pw[4 * h], pw[4 * h + 1], pw[4 * h + 2], pw[4 * h + 3]);
                    } else {
#pragma unroll
                        for (int k = 0; k < x128::size; k++) dw[p][k] = pw[k];
                    }
                }
            }
        }
        // rstd * mean(g * n) = rstd^2 * sum(g * inp) / C; the R reductions are independent shuffle chains
#pragma unroll
        for (int i = 0; i < R; i++) gx[i] = warp_reduce_sum(gx[i]) * s[i] * s[i] / C;
        norm_backward_store_rows<PACKS, R>(dinp, r, r1, C, lane,
                                           [&](int i, int p, int k) { return t[i][p][k] - n[i][p][k] * gx[i]; });
    }
    norm_backward_write_partials<1, PACKS>(partials, wide_dw, C, lane, warp, dw, dw);
}

// The two-kernel path (C > NORM_BWD_MAX_C; norm_backward_two_kernels): dinp, a warp a row.
static __global__ void rmsnorm_backward_input_warp_per_row(floatX* dinp, const floatX* dout, const floatX* inp,
                                                           const floatX* weight, const float* rstd, int N, int C) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    const int64_t base = (int64_t)row * C;
    const float s = rstd[row];
    float sum_gn = 0.0f;
#pragma unroll 4
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        const x128 d = load128(dout + base + c), x = load128(inp + base + c), w = load128(weight + c);
        for (int k = 0; k < x128::size; k++) sum_gn += to_float(d[k]) * to_float(w[k]) * to_float(x[k]) * s;
    }
    const float mean_gn = warp_reduce_sum(sum_gn) / C;
#pragma unroll 4
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        const x128 d = load128(dout + base + c), x = load128(inp + base + c), w = load128(weight + c);
        x128 di = load128(dinp + base + c);
        for (int k = 0; k < x128::size; k++) {
            const float g = to_float(d[k]) * to_float(w[k]), n = to_float(x[k]) * s;
            di[k] = from_float<floatX>(to_float(di[k]) + s * (g - n * mean_gn));
        }
        store128(dinp + base + c, di);
    }
}

// dweight partials of the two-kernel path: thread = one pack of columns, blockIdx.y = one chunk of
// rows, walked in order. partials (chunks, C) = sum over the chunk's rows of dout * inp * rstd.
static __global__ void rmsnorm_backward_weight_partials(float* partials, const floatX* dout, const floatX* inp,
                                                        const float* rstd, int N, int C, int rows_per_chunk) {
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (c >= C) return;
    const int chunk = blockIdx.y;
    const int r0 = chunk * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float dw[x128::size] = {};
    for (int r = r0; r < r1; r++) {
        const float s = rstd[r];
        const x128 d = load128(dout + (int64_t)r * C + c), x = load128(inp + (int64_t)r * C + c);
        for (int k = 0; k < x128::size; k++) dw[k] += to_float(d[k]) * to_float(x[k]) * s;
    }
    float* p = partials + (int64_t)chunk * C + c;
    for (int k = 0; k < x128::size; k++) p[k] = dw[k];
}

// RMSNorm's backward for norm_backward.cuh's launchers.
struct RMSNormBackward {
    static constexpr const char* what = "rmsnorm_backward";
    static constexpr int SUMS = 1;  // dweight
    template <int PACKS, int R>
    static constexpr auto fused() { return rmsnorm_backward_fused<PACKS, R>; }
    template <int PACKS>
    static constexpr int min_blocks() { return norm_backward_min_blocks<PACKS>(); }
    static constexpr auto input() { return rmsnorm_backward_input_warp_per_row; }
    static constexpr auto partials() { return rmsnorm_backward_weight_partials; }
};

// Floats of scratch rmsnorm_backward needs for N rows of C channels (either path).
inline size_t rmsnorm_backward_scratch_floats(int N, int C) { return (size_t)column_num_chunks(N) * C; }

// scratch: at least rmsnorm_backward_scratch_floats(N, C) floats. rstd: the forward's.
inline void rmsnorm_backward(floatX* dinp, floatX* dweight, float* scratch, const floatX* dout, const floatX* inp,
                             const floatX* weight, const float* rstd, int N, int C, const CudaContext& ctx) {
    norm_backward<RMSNormBackward>(dinp, dweight, nullptr, scratch, N, C, ctx, dout, inp, weight, rstd);
}
// Opts in the fused kernel that rows of C channels take to its shared memory (norm_backward_prepare).
inline void rmsnorm_backward_prepare(int C, const CudaContext& ctx) { norm_backward_prepare<RMSNormBackward>(C, ctx); }
