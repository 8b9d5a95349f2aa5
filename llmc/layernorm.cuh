// layernorm.cuh: LayerNorm over the last axis (eps 1e-5), optionally fused with the residual add
// that precedes it in every GPT-2 block. Rows are N = B*T, width C; floatX in and out, fp32 statistics.
//   layernorm_forward                 out (N, C), mean (N), rstd (N)                       (=)
//   fused_residual_layernorm_forward  residual (N, C) = inp1 + inp2 (rounded to floatX), then
//                                     out = LN(residual); the statistics are those of the stored
//                                     residual, so the backward sees exactly what the forward used (=)
//   layernorm_backward                dinp += ..., dweight += ..., dbias += ...            (+=)
// The weight/bias gradients are column sums over N rows, done in fixed order (column_partials_add),
// so they are deterministic. C must be a multiple of x128::size.
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

constexpr float LAYERNORM_EPS = 1e-5f;
constexpr int LAYERNORM_BLOCK = 256;  // 8 warps = 8 rows per block

// One warp per row; lane i handles packs i, i+32, ... Three passes over the row (mean, variance,
// normalize) re-read it from L1/L2, which is cheaper than holding C/32 values per lane in registers
// for every C. DRAM traffic: read N*C (x2 inputs when fused), write N*C (x2 when fused):
// ~0.2 GB per call at GPT-2 124M, B*T = 65536, memory-bound at ~60 us on an H200.
template <bool FUSED_RESIDUAL>
static __global__ void layernorm_forward_warp_per_row(floatX* residual, floatX* out, float* mean, float* rstd,
                                                      const floatX* inp1, const floatX* inp2, const floatX* weight,
                                                      const floatX* bias, int N, int C) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    const int64_t base = (int64_t)row * C;
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
        store128(out + base + c, o);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

inline void layernorm_check(const char* what, int C) {
    if (C % x128::size != 0) fail("%s: C = %d is not a multiple of %d", what, C, x128::size);
}

inline void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                              const floatX* bias, int N, int C, cudaStream_t stream) {
    layernorm_check("layernorm_forward", C);
    const int rows_per_block = LAYERNORM_BLOCK / WARP_SIZE;
    layernorm_forward_warp_per_row<false><<<ceil_div(N, rows_per_block), LAYERNORM_BLOCK, 0, stream>>>(
        nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C);
    cudaCheckLaunch();
}

inline void fused_residual_layernorm_forward(floatX* residual, floatX* out, float* mean, float* rstd,
                                             const floatX* inp1, const floatX* inp2, const floatX* weight,
                                             const floatX* bias, int N, int C, cudaStream_t stream) {
    layernorm_check("fused_residual_layernorm_forward", C);
    const int rows_per_block = LAYERNORM_BLOCK / WARP_SIZE;
    layernorm_forward_warp_per_row<true><<<ceil_div(N, rows_per_block), LAYERNORM_BLOCK, 0, stream>>>(
        residual, out, mean, rstd, inp1, inp2, weight, bias, N, C);
    cudaCheckLaunch();
}

// dinp: one warp per row. With norm = (x - mean) * rstd and g = dout * weight,
// dinp += rstd * (g - mean(g) - norm * mean(g * norm)). Two passes over dout, inp and weight,
// one read-modify-write of dinp: ~4 * N * C * sizeof(floatX) bytes, memory-bound.
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

// dweight/dbias stage 1: thread = one pack of columns, blockIdx.y = one chunk of rows, walked in
// order. partials (chunks, 2, C): [k][0] = sum dout * norm, [k][1] = sum dout. Reads 2 * N * C
// values once, coalesced across the threads of a row.
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

// scratch: at least column_num_chunks(N) * 2 * C floats.
inline void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                               const floatX* inp, const floatX* weight, const float* mean, const float* rstd, int N,
                               int C, cudaStream_t stream) {
    layernorm_check("layernorm_backward", C);
    const int rows_per_block = LAYERNORM_BLOCK / WARP_SIZE;
    layernorm_backward_input_warp_per_row<<<ceil_div(N, rows_per_block), LAYERNORM_BLOCK, 0, stream>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    cudaCheckLaunch();
    const int chunks = column_num_chunks(N), rows_per_chunk = ceil_div(N, chunks);
    const int packs = C / x128::size, threads = 128;
    layernorm_backward_param_partials<<<dim3(ceil_div(packs, threads), chunks), threads, 0, stream>>>(
        scratch, dout, inp, mean, rstd, N, C, rows_per_chunk);
    cudaCheckLaunch();
    column_partials_add(dweight, scratch, chunks, 2 * (int64_t)C, C, stream);
    column_partials_add(dbias, scratch + C, chunks, 2 * (int64_t)C, C, stream);
}
