// norm_backward.cuh: what LayerNorm's and RMSNorm's kernels share (llmc/layernorm.cuh, llmc/rmsnorm.cuh):
// the size check, the block-per-row forwards' load, and the backwards' fused kernel plan, common pieces
// and launches. The backwards add (+=) into dinp (N, C) and the column sums over the N rows, dweight (C)
// and LayerNorm's dbias (C); the sums go through fp32 partials of chunks of rows in scratch, (chunks,
// SUMS, C), folded in fixed chunk order (column_partials_add): the same bits run to run. The constants,
// regimes and row loads are in llmc/cuda_common.cuh ("The fused norm backwards").
// The fused kernel, C <= NORM_BWD_MAX_C: it reads each row of dout, inp and dinp once and writes dinp
// once (the fewest bytes: 4 N*C*sizeof(floatX), ~100 us at N = 65536, C = 768 in bf16). Block = one
// chunk of consecutive rows; warp w takes R rows at a time (a step), rows r0 + w*R, r0 + (w + 8)*R, ...
// A lane owns the column packs lane, lane + 32, ... and keeps its column sums over all its rows.
// Summation order: column c of chunk k = warps 0..7 in order, each warp's sum over its rows in row
// order; then the fold over the chunks. Every load of a step's R rows is issued before the first
// reduction (one DRAM round trip a step), and the rows stay in registers. The loads are unconditional
// (branches around them cost registers): a row past the chunk's end reads the chunk's last row, a pack
// past C the row's last pack, and both read as zeros (a select, not a multiply: no 0 * inf); their
// stores are skipped. Regimes: narrow (C <= 1024), the sums in registers, at the end through a static
// 32 KB buffer; wide (bf16, 1024 < C <= 2048), the sums in dynamic shared memory (norm_backward_smem),
// each lane its own 16-byte slots (conflict-free, no synchronization until the end).
// An op describes itself to the launches by a struct (LayerNormBackward, RMSNormBackward):
//   what                 its name in errors
//   SUMS                 column sums a row adds: 2 (dweight, dbias) or 1 (dweight)
//   fused<PACKS, R>()    the fused kernel (dinp, partials, dout, inp, weight, stats..., N, C,
//                        rows_per_chunk): PACKS packs a lane, R rows a warp step
//   min_blocks<PACKS>()  its blocks per SM (__launch_bounds__), which size the wide regime's grid
//   input(), partials()  the two-kernel path's kernels: (dinp, dout, inp, weight, stats..., N, C) a
//                        warp a row, and (partials, dout, inp, stats..., N, C, rows_per_chunk)
// stats: LayerNorm's (mean, rstd), RMSNorm's (rstd), the forward's, fp32 (N).
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

// The norms take rows of C channels in 16-byte packs.
inline void norm_check(const char* what, int C) {
    if (C % x128::size != 0) fail("%s: C = %d is not a multiple of %d", what, C, x128::size);
}

// A block-per-row forward's pack at `at` as floats, each then passed to add(v[k]): inp1, or
// (FUSED_RESIDUAL) the rounded sum inp1 + inp2, also stored into residual.
template <bool FUSED_RESIDUAL, typename Add>
__device__ __forceinline__ void norm_load_pack(float (&v)[x128::size], floatX* residual, const floatX* inp1,
                                               const floatX* inp2, int64_t at, Add add) {
    x128 x = load128(inp1 + at);
    if constexpr (FUSED_RESIDUAL) {
        const x128 y = load128(inp2 + at);
        for (int k = 0; k < x128::size; k++) x[k] = from_float<floatX>(to_float(x[k]) + to_float(y[k]));
        store128(residual + at, x);
    }
    for (int k = 0; k < x128::size; k++) {
        v[k] = to_float(x[k]);
        add(v[k]);
    }
}

// Rows per warp step of the fused kernels: 2 while a lane's share of a row is at most 16 values
// (C <= 512 in bf16), else 1 (at C = 768, R = 2 spills past the 128 registers of 2 blocks per SM).
template <int PACKS>
constexpr int norm_backward_rows() { return PACKS * x128::size <= 16 ? 2 : 1; }

// The weight's packs of the lane (a pack past C: the row's last), for a step of the fused kernels:
// L1 hits, reloaded each step to keep registers free.
template <int PACKS>
__device__ __forceinline__ void norm_backward_load_weight(x128 (&w)[PACKS], const floatX* weight, int C, int lane) {
#pragma unroll
    for (int p = 0; p < PACKS; p++) w[p] = load128(weight + min((p * WARP_SIZE + lane) * x128::size, C - x128::size));
}

// The fused kernels' last phase of a step: dinp of rows r .. r + R - 1 (those below r1), element k of
// the lane's pack p of row i = value(i, p, k).
template <int PACKS, int R, typename Value>
__device__ __forceinline__ void norm_backward_store_rows(floatX* dinp, int r, int r1, int C, int lane, Value value) {
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int64_t base = (int64_t)(r + i) * C;
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int c = (p * WARP_SIZE + lane) * x128::size;
            if (r + i < r1 && c < C) {
                x128 o;
#pragma unroll
                for (int k = 0; k < x128::size; k++) o[k] = from_float<floatX>(value(i, p, k));
                store128(dinp + base + c, o);
            }
        }
    }
}

// The fused kernels' end: the block's partials (SUMS, C) of chunk blockIdx.x; every warp's sums hold all
// its columns (zeros if it had no rows), and column c adds warps 0..7 in order. Wide: from the float4
// slots (warp, sum, x128::size / 4, C / x128::size packs) in dynamic smem `wide`; narrow: the lane's
// register sums s0 (and s1), [pack][k], through a static 32 KB buffer, one sum at a time.
template <int SUMS, int PACKS, int NP>
__device__ __forceinline__ void norm_backward_write_partials(float* partials, const float4* wide, int C, int lane,
                                                             int warp, const float (&s0)[NP][x128::size],
                                                             const float (&s1)[NP][x128::size]) {
    float* out = partials + (int64_t)blockIdx.x * SUMS * C;
    if constexpr (norm_backward_wide<PACKS>()) {
        constexpr int F4 = x128::size / 4;
        const int P = C / x128::size;
        __syncthreads();
        const float* sums = reinterpret_cast<const float*>(wide);
        for (int c = threadIdx.x; c < C; c += NORM_BWD_BLOCK) {
            const int q = c / x128::size, h = (c % x128::size) / 4, e = c % 4;
#pragma unroll
            for (int j = 0; j < SUMS; j++) {
                float sum = 0.0f;
                for (int v = 0; v < NORM_BWD_WARPS; v++) sum += sums[(((v * SUMS + j) * F4 + h) * P + q) * 4 + e];
                out[j * C + c] = sum;
            }
        }
    } else {
        __shared__ float warp_sum[NORM_BWD_WARPS * NORM_BWD_REG_PACKS * WARP_SIZE * x128::size];  // [warp][c], 32 KB
#pragma unroll
        for (int j = 0; j < SUMS; j++) {
            if (j > 0) __syncthreads();  // every thread has read the previous sum
#pragma unroll
            for (int p = 0; p < PACKS; p++) {
                const int c = (p * WARP_SIZE + lane) * x128::size;
                if (c < C)
#pragma unroll
                    for (int k = 0; k < x128::size; k++) warp_sum[warp * C + c + k] = j == 0 ? s0[p][k] : s1[p][k];
            }
            __syncthreads();
            for (int c = threadIdx.x; c < C; c += NORM_BWD_BLOCK) {
                float sum = 0.0f;
                for (int v = 0; v < NORM_BWD_WARPS; v++) sum += warp_sum[v * C + c];
                out[j * C + c] = sum;
            }
        }
    }
}

// dweight (and dbias) += the (chunks, SUMS, C) partials in scratch.
template <int SUMS>
inline void norm_backward_fold(floatX* dweight, floatX* dbias, const float* scratch, int C, int chunks,
                               cudaStream_t stream) {
    if constexpr (SUMS == 2) column_partials_add2(dweight, dbias, scratch, C, chunks, 2 * (int64_t)C, C, stream);
    else column_partials_add(dweight, scratch, chunks, (int64_t)C, C, stream);
}

// The wide kernels' shared-memory opt-in, once per kernel (ctx.allow_smem), to norm_backward_smem's
// most for any C <= NORM_BWD_MAX_C.
template <class Op, int PACKS, int R>
inline void norm_backward_fused_optin(const CudaContext& ctx) {
    ctx.allow_smem(Op::template fused<PACKS, R>(), (int)norm_backward_smem(Op::SUMS, NORM_BWD_MAX_C));
}

// The fused kernel at PACKS packs a lane and R rows a warp step, then the fold; needs
// C <= 32 * PACKS * x128::size and chunks * SUMS * C floats of scratch. chunks: 0 for the regime's
// own count (norm_backward_chunks, or norm_backward_chunks_wide at the kernel's blocks per SM), else
// at most column_num_chunks(N) (the labs time other counts, and other R).
template <class Op, int PACKS, int R, typename... Stats>
inline void norm_backward_fused_launch(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, int N, int C,
                                       const CudaContext& ctx, int chunks, const floatX* dout, const floatX* inp,
                                       const floatX* weight, Stats... stats) {
    if (C > PACKS * WARP_SIZE * x128::size) fail("%s: C = %d exceeds %d packs per lane", Op::what, C, PACKS);
    if (N <= 0) return;
    constexpr bool WIDE = norm_backward_wide<PACKS>();
    if (chunks <= 0)
        chunks = WIDE ? norm_backward_chunks_wide(N, Op::template min_blocks<PACKS>()) : norm_backward_chunks(N);
    if (chunks > column_num_chunks(N))
        fail("%s: %d chunks exceed the scratch's %d", Op::what, chunks, column_num_chunks(N));
    if constexpr (WIDE) norm_backward_fused_optin<Op, PACKS, R>(ctx);
    Op::template fused<PACKS, R>()<<<chunks, NORM_BWD_BLOCK, WIDE ? norm_backward_smem(Op::SUMS, C) : 0, ctx.stream>>>(
        dinp, scratch, dout, inp, weight, stats..., N, C, ceil_div(N, chunks));
    cudaCheckLaunch();
    norm_backward_fold<Op::SUMS>(dweight, dbias, scratch, C, chunks, ctx.stream);
}

// The two-kernel path, any C (the fallback past NORM_BWD_MAX_C): column_num_chunks(N) * SUMS * C
// floats of scratch. dinp: a warp a row, two passes over dout, inp and weight (the second from L1);
// the partials: a thread a pack of columns, a block row a chunk of rows walked in order.
template <class Op, typename... Stats>
inline void norm_backward_two_kernels(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, int N, int C,
                                      cudaStream_t stream, const floatX* dout, const floatX* inp,
                                      const floatX* weight, Stats... stats) {
    norm_check(Op::what, C);
    Op::input()<<<ceil_div(N, NORM_BWD_WARPS), NORM_BWD_BLOCK, 0, stream>>>(dinp, dout, inp, weight, stats..., N, C);
    cudaCheckLaunch();
    const int chunks = column_num_chunks(N), packs = C / x128::size, threads = 128;
    Op::partials()<<<dim3(ceil_div(packs, threads), chunks), threads, 0, stream>>>(scratch, dout, inp, stats..., N, C,
                                                                                 ceil_div(N, chunks));
    cudaCheckLaunch();
    norm_backward_fold<Op::SUMS>(dweight, dbias, scratch, C, chunks, stream);
}

// The backward: the fused kernel for rows of C <= NORM_BWD_MAX_C, else the two kernels. scratch:
// column_num_chunks(N) * SUMS * C floats (either path).
template <class Op, typename... Stats>
inline void norm_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, int N, int C,
                          const CudaContext& ctx, const floatX* dout, const floatX* inp, const floatX* weight,
                          Stats... stats) {
    norm_check(Op::what, C);
    if (N <= 0 || C <= 0) return;  // nothing to add (and no empty grid to launch)
    if (C > NORM_BWD_MAX_C) {
        norm_backward_two_kernels<Op>(dinp, dweight, dbias, scratch, N, C, ctx.stream, dout, inp, weight, stats...);
        return;
    }
    norm_backward_dispatch(C, [&](auto packs) {
        constexpr int PACKS = decltype(packs)::value;
        norm_backward_fused_launch<Op, PACKS, norm_backward_rows<PACKS>()>(dinp, dweight, dbias, scratch, N, C,
                                                                            ctx, 0, dout, inp, weight, stats...);
    });
}

// Opts in the kernel that rows of C channels take to its shared memory. Call it before a CUDA graph
// capture that may hold the first backward of that width (model_build does): the launcher would opt
// in itself, and whether cudaFuncSetAttribute may run inside a capture is not a thing to rely on.
template <class Op>
inline void norm_backward_prepare(int C, const CudaContext& ctx) {
    if (C <= 0 || C > NORM_BWD_MAX_C) return;
    norm_backward_dispatch(C, [&](auto packs) {
        constexpr int PACKS = decltype(packs)::value;
        if constexpr (norm_backward_wide<PACKS>()) norm_backward_fused_optin<Op, PACKS, norm_backward_rows<PACKS>()>(ctx);
    });
}
