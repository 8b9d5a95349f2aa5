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
// The weight gradient is a column sum over N rows, done in fixed order (column_partials_add), so it
// is deterministic. C must be a multiple of x128::size. References: llmc/cpu/rmsnorm.h.
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

constexpr int RMSNORM_BLOCK = 256;  // 8 warps = 8 rows per block

// One warp per row; lane i handles packs i, i+32, ... Two passes over the row: the sum of squares,
// then the output, which re-reads the row from L1/L2 (the first pass loads it with L1 caching).
// Fused: the first pass also writes residual = inp1 + inp2 and the second reads the stored residual
// back (one pack instead of two; fused_residual_layernorm_forward does the same at 94% of copy).
// DRAM traffic, bytes of floatX: read N*C, write N*C (fused: read 2 N*C, write 2 N*C) plus 4N of
// rstd: ~0.2 GB (0.4 GB fused) at N = 65536, C = 768, ~50 us (~100 us) at the 4.0 TB/s copy;
// ~3 FLOPs per element: memory-bound.
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

inline void rmsnorm_check(const char* what, int C) {
    if (C % x128::size != 0) fail("%s: C = %d is not a multiple of %d", what, C, x128::size);
}
inline void rmsnorm_check_eps(const char* what, float eps) {
    if (!(eps > 0.0f)) fail("%s: eps %g must be > 0", what, (double)eps);
}

inline void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C, float eps,
                            cudaStream_t stream) {
    rmsnorm_check("rmsnorm_forward", C);
    rmsnorm_check_eps("rmsnorm_forward", eps);
    const int rows_per_block = RMSNORM_BLOCK / WARP_SIZE;
    rmsnorm_forward_warp_per_row<false><<<ceil_div(N, rows_per_block), RMSNORM_BLOCK, 0, stream>>>(
        nullptr, out, rstd, inp, nullptr, weight, N, C, eps);
    cudaCheckLaunch();
}

inline void fused_residual_rmsnorm_forward(floatX* residual, floatX* out, float* rstd, const floatX* inp1,
                                           const floatX* inp2, const floatX* weight, int N, int C, float eps,
                                           cudaStream_t stream) {
    rmsnorm_check("fused_residual_rmsnorm_forward", C);
    rmsnorm_check_eps("fused_residual_rmsnorm_forward", eps);
    const int rows_per_block = RMSNORM_BLOCK / WARP_SIZE;
    rmsnorm_forward_warp_per_row<true><<<ceil_div(N, rows_per_block), RMSNORM_BLOCK, 0, stream>>>(
        residual, out, rstd, inp1, inp2, weight, N, C, eps);
    cudaCheckLaunch();
}

// dinp: one warp per row. With n = inp * rstd and g = dout * weight (no mean is subtracted, so no
// mean(g) term as in LayerNorm): dinp += rstd * (g - n * mean(g * n)). Two passes over dout, inp and
// weight (the second from L1), one read-modify-write of dinp: ~4 N*C*sizeof(floatX) bytes of DRAM.
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

// dweight stage 1: thread = one pack of columns, blockIdx.y = one chunk of rows, walked in order.
// partials (chunks, C) = sum over the chunk's rows of dout * inp * rstd. Reads dout and inp once
// (2 N*C values), coalesced across the threads of a row; stage 2 is column_partials_add.
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

// Floats of scratch rmsnorm_backward needs for N rows of C channels.
inline size_t rmsnorm_backward_scratch_floats(int N, int C) { return (size_t)column_num_chunks(N) * C; }

// scratch: at least rmsnorm_backward_scratch_floats(N, C) floats. rstd: the forward's.
inline void rmsnorm_backward(floatX* dinp, floatX* dweight, float* scratch, const floatX* dout, const floatX* inp,
                             const floatX* weight, const float* rstd, int N, int C, cudaStream_t stream) {
    rmsnorm_check("rmsnorm_backward", C);
    const int rows_per_block = RMSNORM_BLOCK / WARP_SIZE;
    rmsnorm_backward_input_warp_per_row<<<ceil_div(N, rows_per_block), RMSNORM_BLOCK, 0, stream>>>(
        dinp, dout, inp, weight, rstd, N, C);
    cudaCheckLaunch();
    const int chunks = column_num_chunks(N), rows_per_chunk = ceil_div(N, chunks);
    const int packs = C / x128::size, threads = 128;
    rmsnorm_backward_weight_partials<<<dim3(ceil_div(packs, threads), chunks), threads, 0, stream>>>(
        scratch, dout, inp, rstd, N, C, rows_per_chunk);
    cudaCheckLaunch();
    column_partials_add(dweight, scratch, chunks, (int64_t)C, C, stream);
}
