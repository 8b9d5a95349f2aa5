// fp8_fused.cuh: FP8 casts fused into the kernels that produce their input (docs/numerics.md,
// "FP8 in the trainer"). Under delayed scaling a tensor's scale is known before it exists, so the
// pass that would write it in bf16 can write its FP8 copies instead, and record its amax on the way:
//   fp8_cast_transpose_fused(out_t, out, in, pre, R, C, format, meta, prologue, dbias, scratch, stream, dq)
//     x = prologue(in, pre) (R, C), rounded to floatX as the unfused kernel's output would be:
//       NONE            x = in                   (a dY as the matmul wrote it)
//       GELU_FORWARD    x = gelu(in)             (in: fc's pre-activation; x: fcproj's X)
//       GELU_BACKWARD   x = in * gelu'(pre)      (in: d(GELU output), pre: the pre-activation; x: fc's dY)
//       DQ_ACCUM        x = dq_from_accum(dq.accum) in columns < dq.q_cols, in elsewhere (qkv's dY: dqkv
//                       with the dQ columns the attention backward left in its fp32 sums, Fp8DqAccum)
//     out (R, C) = fp8(x * meta->scale), out_t (C, R) its transpose, meta->amax_bits = max(itself,
//     max |x|); with dbias, dbias (C) += column sums of x (the linear's bias gradient).
//   One read of in (and pre), one write of each FP8 copy: the bf16 x is never written. Bytes, against
//   the separate passes replaced (the unfused op, fp8_cast_transpose, bias_backward, the dQ store):
//     GELU_FORWARD      reads 2RC, writes 2RC              (separate: 4RC, 4RC)
//     GELU_BACKWARD     reads 4RC, writes 2RC              (separate: 8RC, 4RC)
//     NONE + dbias      reads 2RC, writes 2RC              (separate: 4RC, 2RC)
//     DQ_ACCUM + dbias  reads 4RQ + 2R(C - Q), writes 2RC  (separate: 4RQ + 2RC, 2RQ + 2RC; Q = q_cols)
//   The FP8 bytes and the amax are bit-identical to the unfused kernels' at the same scale (the same
//   device functions and floatX rounding before the cast; DQ_ACCUM's is the dQ store's dq_from_accum);
//   the bias gradient is the same sum in another fixed fp32 order (deterministic).
//   layernorm_fp8_forward: the (residual add +) LayerNorm writing e4m3 X and X^T (qkv's, fc's): below.
// Kernel: fp8_cast_transpose's 64 x 64 tile (llmc/fp8.cuh) down a chunk of rows per block, grid
// (C / 64, chunks); each thread always holds the same 8 columns (pack tid % 8 of rows tid / 8 and
// tid / 8 + 32). Light prologues (NONE, DQ_ACCUM) are pipelined, the next tile's loads issued before
// this tile's shared-memory passes, 2-4 tiles a block, the bias's column sums in registers over the
// chunk, then through shared memory added in row-group order by threads 0..63 into the chunk's
// partials (column_partials_add folds the chunks). The GELU prologues run a tile at a time, their
// column sums through a floatX copy of the tile. Memory-bound: a few flops per byte (GELU's tanh: ~20
// per element). Measured: dev/cuda/fp8_cast.cu.
// DQ_ACCUM: a 64-column tile lies wholly in the dQ columns or outside them (q_cols a multiple of 64),
// so the choice is per block; the dQ tiles' threads load 2 x 16 bytes of fp32 a pack instead of 16 of
// bf16. Shapes: R and C multiples of 64; pointers 16-byte aligned.
#pragma once
#include <cstdint>
#include <type_traits>
#include "llmc/attention_layout.cuh"  // dq_from_accum: DQ_ACCUM's rounding, the dQ store's
#include "llmc/cuda_common.cuh"
#include "llmc/fp8.cuh"
#include "llmc/gelu.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/utils.h"

enum class Fp8Prologue { NONE, GELU_FORWARD, GELU_BACKWARD, DQ_ACCUM };

// DQ_ACCUM's second input: the dQ columns [0, q_cols) of the cast's input come from accum, the
// single-pass attention backward's unscaled dQ sums (attention_backward with keep_dq returns it), as
// dq_from_accum<head_dim> rounds them.
struct Fp8DqAccum {
    const float* accum = nullptr;  // (R, q_cols)
    int q_cols = 0;                // NH * HD: a multiple of 64
    int head_dim = 0;              // HD, 64 or 128: the scale rsqrt(HD)
};

// Pipelined prologues (see the top) at 4 blocks an SM (64 registers a thread); the GELU prologues one
// tile at a time at 8 (32 registers): pipelined they spill and run slower (dev/cuda/fp8_cast.cu).
__host__ __device__ constexpr bool fp8_fused_pipelined(Fp8Prologue pro) { return pro == Fp8Prologue::NONE || pro == Fp8Prologue::DQ_ACCUM; }
__host__ __device__ constexpr int fp8_fused_min_blocks(Fp8Prologue pro) { return fp8_fused_pipelined(pro) ? 4 : 8; }

namespace fp8_detail {
// The tiles of one block's chunk of rows [r_begin, r_end) at column tile c0, as the top describes.
// FROM_DQ: a DQ_ACCUM tile of the dQ columns (the fp32 sums read, `in` not). Each thread holds LOADS
// packs of P columns, rows ROW_STEP apart. COLSUM into partials[chunk * C + c0 + c]: pipelined through
// col_part, else through vals. Returns the thread's amax bits.
template <Fp8Format F, Fp8Prologue PRO, bool COLSUM, int DQ_HD, bool FROM_DQ>
__device__ __forceinline__ unsigned int fused_cast_chunk(uint8_t* __restrict__ out_t, uint8_t* __restrict__ out,
                                                         const floatX* __restrict__ in, const floatX* __restrict__ pre,
                                                         const float* __restrict__ dq_accum, int q_cols,
                                                         float* __restrict__ partials, int R, int C, int c0,
                                                         int r_begin, int r_end, float scale,
                                                         uint8_t (&tile)[FP8_T_TILE][FP8_T_PITCH], float* col_part,
                                                         floatX* vals) {
    constexpr int P = x128::size, PACKS_PER_ROW = FP8_T_TILE / P;
    constexpr int LOADS = FP8_T_TILE * PACKS_PER_ROW / FP8_T_BLOCK, ROW_STEP = FP8_T_BLOCK / PACKS_PER_ROW;
    constexpr bool GB = PRO == Fp8Prologue::GELU_BACKWARD;
    constexpr int DQ_PARTS = P / f128::size;
    struct Raw {  // one tile's loads of this thread
        x128 v[FROM_DQ ? 1 : LOADS];
        x128 g[GB ? LOADS : 1];
        f128 d[FROM_DQ ? LOADS : 1][DQ_PARTS];
    };
    const int p = threadIdx.x % PACKS_PER_ROW, rr = threadIdx.x / PACKS_PER_ROW;
    auto load = [&](Raw& x, int r0) {
#pragma unroll
        for (int j = 0; j < LOADS; j++) {
            const int64_t r = r0 + rr + j * ROW_STEP;
            if constexpr (FROM_DQ) {
                const float* src = dq_accum + r * q_cols + c0 + p * P;
#pragma unroll
                for (int q = 0; q < DQ_PARTS; q++) x.d[j][q] = load128cs(src + q * f128::size);
            } else {
                x.v[j] = load128cs(in + r * C + c0 + p * P);
            }
            if constexpr (GB) x.g[j] = load128cs(pre + r * C + c0 + p * P);
        }
    };
    constexpr bool PIPELINED = fp8_fused_pipelined(PRO);
    // the column sums: pipelined, in registers; else through vals (64, 64 + 8) (see the top)
    constexpr bool REG_COLSUM = COLSUM && PIPELINED, SMEM_COLSUM = COLSUM && !PIPELINED;
    constexpr int VPITCH = FP8_T_TILE + 8;  // 16-byte rows, no bank conflicts on the pack stores
    unsigned int amax = 0;
    float colsum = 0.0f;  // SMEM_COLSUM: column c0 + threadIdx.x (threads < 64)
    float csum[COLSUM ? P : 1];
#pragma unroll
    for (int k = 0; k < (COLSUM ? P : 1); k++) csum[k] = 0.0f;
    Raw cur;
    if (PIPELINED) load(cur, r_begin);
#pragma unroll 1
    for (int r0 = r_begin; r0 < r_end; r0 += FP8_T_TILE) {
        const bool more = r0 + FP8_T_TILE < r_end;
        Raw nxt;
        if (!PIPELINED) load(cur, r0);
        else if (more) load(nxt, r0 + FP8_T_TILE);
#pragma unroll
        for (int j = 0; j < LOADS; j++) {
            const int r = rr + j * ROW_STEP;
            x128 v;
            // x rounded to floatX: the values the unfused kernel would have written
#pragma unroll
            for (int k = 0; k < P; k++) {
                if constexpr (FROM_DQ)  // the dQ store's bf16 (floatX is bf16 wherever the backward leaves dQ)
                    v[k] = from_float<floatX>(
                        to_float(attention_detail::dq_from_accum<DQ_HD>(cur.d[j][k / f128::size][k % f128::size])));
                else if constexpr (PRO == Fp8Prologue::GELU_FORWARD)
                    v[k] = from_float<floatX>(gelu_tanh(to_float(cur.v[j][k])));
                else if constexpr (GB)
                    v[k] = from_float<floatX>(to_float(cur.v[j][k]) * gelu_tanh_grad(to_float(cur.g[j][k])));
                else
                    v[k] = cur.v[j][k];
                if constexpr (REG_COLSUM) csum[k] += to_float(v[k]);
            }
            Fp8Pack o;
#pragma unroll
            for (int k = 0; k < P; k += 2) {
                const float a = to_float(v[k]), b = to_float(v[k + 1]);
                amax = max(amax, max(abs_bits(a), abs_bits(b)));
                o.h[k / 2] = fp8x2_from_float2<F>(a * scale, b * scale);
                *reinterpret_cast<uint16_t*>(&tile[r][p * P + k]) = o.h[k / 2];
            }
            *reinterpret_cast<Fp8Pack*>(out + (int64_t)(r0 + r) * C + c0 + p * P) = o;
            if constexpr (SMEM_COLSUM) store128(vals + r * VPITCH + p * P, v);
        }
        __syncthreads();
        fp8_tile_store_transposed(out_t, tile, R, r0, c0);
        if (SMEM_COLSUM && threadIdx.x < FP8_T_TILE)
#pragma unroll 16
            for (int r = 0; r < FP8_T_TILE; r++) colsum += to_float(vals[r * VPITCH + threadIdx.x]);
        __syncthreads();  // the next tile overwrites the shared tiles
        if (PIPELINED && more) cur = nxt;
    }
    if (SMEM_COLSUM && threadIdx.x < FP8_T_TILE) partials[(int64_t)blockIdx.y * C + c0 + threadIdx.x] = colsum;
    if constexpr (REG_COLSUM) {  // (ROW_STEP, 64) row-group sums, then each column's in row-group order
#pragma unroll
        for (int k = 0; k < P; k += 4)
            *reinterpret_cast<float4*>(col_part + rr * FP8_T_TILE + p * P + k) =
                make_float4(csum[k], csum[k + 1], csum[k + 2], csum[k + 3]);
        __syncthreads();
        if (threadIdx.x < FP8_T_TILE) {
            float s = 0.0f;
#pragma unroll 8
            for (int g = 0; g < ROW_STEP; g++) s += col_part[g * FP8_T_TILE + threadIdx.x];
            partials[(int64_t)blockIdx.y * C + c0 + threadIdx.x] = s;
        }
    }
    return amax;
}
}  // namespace fp8_detail

// DQ_HD: DQ_ACCUM's head size (a template parameter, as in attention_backward_dq_store: the same
// code for the scale), 0 for the other prologues.
template <Fp8Format F, Fp8Prologue PRO, bool COLSUM, int DQ_HD = 0>
static __global__ void __launch_bounds__(FP8_T_BLOCK, sm_blocks(FP8_T_BLOCK, fp8_fused_min_blocks(PRO)))
    fp8_cast_transpose_fused_kernel(uint8_t* __restrict__ out_t, uint8_t* __restrict__ out, const floatX* __restrict__ in,
                                    const floatX* __restrict__ pre, const float* __restrict__ dq_accum, int q_cols,
                                    float* __restrict__ partials, int R, int C, int rows_per_chunk, Fp8Meta* meta) {
    static_assert((PRO == Fp8Prologue::DQ_ACCUM) == (DQ_HD == 64 || DQ_HD == 128), "DQ_HD: DQ_ACCUM's head size");
    constexpr int ROW_STEP = FP8_T_BLOCK / (FP8_T_TILE / x128::size);
    static_assert(x128::size % 4 == 0, "float4 stores of the column sums");
    __shared__ alignas(16) uint8_t tile[FP8_T_TILE][FP8_T_PITCH];
    constexpr bool REG_COLSUM = COLSUM && fp8_fused_pipelined(PRO);
    __shared__ alignas(16) float col_part[REG_COLSUM ? ROW_STEP * FP8_T_TILE : 1];                       // (ROW_STEP, 64)
    __shared__ alignas(16) floatX vals[COLSUM && !REG_COLSUM ? FP8_T_TILE * (FP8_T_TILE + 8) : 8];  // (64, 72)
    const int c0 = blockIdx.x * FP8_T_TILE;
    const int r_begin = blockIdx.y * rows_per_chunk, r_end = min(R, r_begin + rows_per_chunk);
    const float scale = meta->scale;
    unsigned int amax;
    if (PRO == Fp8Prologue::DQ_ACCUM && c0 < q_cols)  // block-uniform: whole tiles
        amax = fp8_detail::fused_cast_chunk<F, PRO, COLSUM, DQ_HD, PRO == Fp8Prologue::DQ_ACCUM>(
            out_t, out, in, pre, dq_accum, q_cols, partials, R, C, c0, r_begin, r_end, scale, tile, col_part, vals);
    else
        amax = fp8_detail::fused_cast_chunk<F, PRO, COLSUM, DQ_HD, false>(
            out_t, out, in, pre, dq_accum, q_cols, partials, R, C, c0, r_begin, r_end, scale, tile, col_part, vals);
    amax_block_commit(meta, amax);
}

// Rows per block of fp8_cast_transpose_fused (fp8_fused_rows_per_chunk): whole tiles; pipelined,
// FP8_FUSED_TILES of them (DQ_ACCUM: FP8_FUSED_DQ_TILES) while the grid keeps at least
// FP8_FUSED_MIN_BLOCKS blocks (fewer otherwise), else one; and at least enough that the chunks fit the
// bias scratch (column_num_chunks(R): 2 tiles at R = 65536). Lab (1, 2, 4, 8 tiles): a dY with bias
// best at 4 (8 within 1%), DQ_ACCUM at 2.
constexpr int FP8_FUSED_TILES = 4, FP8_FUSED_DQ_TILES = 2, FP8_FUSED_MIN_BLOCKS = 1024;
namespace fp8_detail {
// The fewest tiles a chunk that keep the chunks within the bias scratch (column_num_chunks(R)).
inline int fused_min_tiles(int R) { return ceil_div(ceil_div(R, FP8_T_TILE), column_num_chunks(R)); }
// fp8_cast_transpose_fused at rpc rows a block: a multiple of FP8_T_TILE, at least fused_min_tiles(R)
// tiles (fp8_fused_rows_per_chunk's choice is the product's).
inline void fused_cast_launch(uint8_t* out_t, uint8_t* out, const floatX* in, const floatX* pre, int R, int C,
                              Fp8Format f, Fp8Meta* meta, Fp8Prologue prologue, floatX* dbias, float* scratch,
                              cudaStream_t stream, const Fp8DqAccum& dq, int rpc) {
    if (R % FP8_T_TILE != 0 || C % FP8_T_TILE != 0)
        fail("fp8_cast_transpose_fused: R = %d and C = %d must be multiples of %d", R, C, FP8_T_TILE);
    if ((prologue == Fp8Prologue::GELU_BACKWARD) != (pre != nullptr))
        fail("fp8_cast_transpose_fused: the pre-activation goes with GELU_BACKWARD, and only there");
    if ((prologue == Fp8Prologue::DQ_ACCUM) != (dq.accum != nullptr))
        fail("fp8_cast_transpose_fused: the dQ sums go with DQ_ACCUM, and only there");
    if (dq.accum) {
        if (dq.q_cols <= 0 || dq.q_cols > C || dq.q_cols % FP8_T_TILE != 0 || (dq.head_dim != 64 && dq.head_dim != 128))
            fail("fp8_cast_transpose_fused: DQ_ACCUM's q_cols = %d must be a multiple of %d up to C = %d, head_dim = %d "
                 "64 or 128", dq.q_cols, FP8_T_TILE, C, dq.head_dim);
        fp8_check_aligned(dq.accum, "fp8_cast_transpose_fused dQ sums");
    }
    if (dbias && !scratch) fail("fp8_cast_transpose_fused: a bias gradient needs its scratch");
    if (dbias && prologue == Fp8Prologue::GELU_FORWARD)  // an activation: no bias of its own here
        fail("fp8_cast_transpose_fused: GELU_FORWARD takes no bias gradient");
    fp8_check_aligned(in, "fp8_cast_transpose_fused input");
    if (pre) fp8_check_aligned(pre, "fp8_cast_transpose_fused pre-activation");
    fp8_check_aligned(out_t, "fp8_cast_transpose_fused output");
    fp8_check_aligned(out, "fp8_cast_transpose_fused straight output");
    const int chunks = ceil_div(R, rpc);
    const dim3 grid(C / FP8_T_TILE, chunks);
    const bool bias = dbias != nullptr;
    with_fp8_format(f, [&](auto F) {
        with_bool(bias, [&](auto B) {
            constexpr Fp8Format FF = decltype(F)::value;
            constexpr bool BB = decltype(B)::value;
            constexpr Fp8Prologue NO = Fp8Prologue::NONE, GF = Fp8Prologue::GELU_FORWARD, GB = Fp8Prologue::GELU_BACKWARD;
            constexpr Fp8Prologue DQ = Fp8Prologue::DQ_ACCUM;
            auto launch = [&](auto kernel) {
                kernel<<<grid, FP8_T_BLOCK, 0, stream>>>(out_t, out, in, pre, dq.accum, dq.q_cols, scratch, R, C, rpc,
                                                         meta);
            };
            switch (prologue) {
                case NO: launch(fp8_cast_transpose_fused_kernel<FF, NO, BB>); break;
                case GF:  // no bias (refused above)
                    if constexpr (!BB) launch(fp8_cast_transpose_fused_kernel<FF, GF, false>);
                    break;
                case GB: launch(fp8_cast_transpose_fused_kernel<FF, GB, BB>); break;
                case DQ:  // a dY (qkv's): the gradient formats, with or without the bias
                    if (dq.head_dim == 64) launch(fp8_cast_transpose_fused_kernel<FF, DQ, BB, 64>);
                    else launch(fp8_cast_transpose_fused_kernel<FF, DQ, BB, 128>);
                    break;
            }
        });
    });
    cudaCheckLaunch();
    if (bias) column_partials_add(dbias, scratch, chunks, C, C, stream);
}
}  // namespace fp8_detail

inline int fp8_fused_rows_per_chunk(int R, int C, Fp8Prologue prologue) {
    const int row_tiles = ceil_div(R, FP8_T_TILE), col_tiles = ceil_div(C, FP8_T_TILE);
    int tiles = !fp8_fused_pipelined(prologue) ? 1 : prologue == Fp8Prologue::DQ_ACCUM ? FP8_FUSED_DQ_TILES : FP8_FUSED_TILES;
    while (tiles > 1 && (int64_t)ceil_div(row_tiles, tiles) * col_tiles < FP8_FUSED_MIN_BLOCKS) tiles /= 2;
    tiles = std::max(tiles, fp8_detail::fused_min_tiles(R));
    return tiles * FP8_T_TILE;
}

// See the top. pre: GELU_BACKWARD's pre-activation (R, C), else unused; dq: DQ_ACCUM's dQ sums, and
// only there (in's dQ columns are then not read). dbias (C) and scratch (column_num_chunks(R) * C
// floats) only with a bias, else null. Records the amax (delayed scaling).
inline void fp8_cast_transpose_fused(uint8_t* out_t, uint8_t* out, const floatX* in, const floatX* pre, int R, int C,
                                     Fp8Format f, Fp8Meta* meta, Fp8Prologue prologue, floatX* dbias, float* scratch,
                                     cudaStream_t stream, const Fp8DqAccum& dq = {}) {
    fp8_detail::fused_cast_launch(out_t, out, in, pre, R, C, f, meta, prologue, dbias, scratch, stream, dq,
                                  fp8_fused_rows_per_chunk(R, C, prologue));
}

// ---------------------------------------------------------------- LayerNorm with FP8 outputs
// layernorm_fp8_forward: LayerNorm (with the residual add when inp2 is given: residual = inp1 + inp2)
// whose output goes straight to FP8: out (N, C) = fp8(LN * scale) and out_t (C, N) its transpose
// (qkv's or fc's X and X^T), meta->amax_bits raised; mean, rstd and the residual as the bf16 kernel
// writes them, no bf16 LN output. The row math is layernorm_row_warp's, so the bytes are those of
// layernorm_forward_warp_per_row + fp8_cast_transpose at the same scale.
// PACKS: layernorm_row_warp's (the row in registers, with_ln_fp8_packs; 0 for rows past
// NORM_BWD_MAX_C): one read of the row where the passes in memory walked it four times.
// Block: 32 rows (8 warps, a warp per row, 4 rows each), every row's FP8 bytes into a shared
// (32, C + 2) tile and straight to `out`; then the tile is written transposed, 16 bytes (16 rows of a
// column) a thread-store, as fp8_cast_transpose's store (the 2-byte pitch pad puts the 2 row groups a
// warp reads 8 banks apart); each column's 32 bytes are one DRAM sector. 32 (C + 2) bytes of shared
// memory: 24.6 KB at C = 768, 8 blocks (64 warps) an SM as the bf16 kernel; above 48 KB (C > 1534)
// opted in. Against a 64-row tile (49 KB, 4 blocks an SM): twice the warps in flight for the
// latency-bound row passes. Bytes: reads 2NC (4NC with the residual), writes 2NC (+2NC), where the
// separate passes read 2NC and write 2NC more (the bf16 output and the cast's read of it).
constexpr int LN_FP8_ROWS = 32, LN_FP8_GROUPS = LN_FP8_ROWS / 16;  // 16-row groups of a column
// Blocks an SM the kernel is compiled for: the row in registers up to 5 packs a lane at 64 registers
// (4 blocks; C = 1280: 5 fit in shared memory), more packs uncapped; the passes in memory at 48 (5).
__host__ __device__ constexpr int ln_fp8_min_blocks(int packs) { return packs == 0 ? 5 : packs <= 5 ? 4 : 1; }
template <bool FUSED_RESIDUAL, int PACKS>
static __global__ void __launch_bounds__(LAYERNORM_BLOCK, ln_fp8_min_blocks(PACKS))
    layernorm_fp8_forward_kernel(uint8_t* __restrict__ out_t, uint8_t* __restrict__ out, floatX* residual, float* mean,
                                 float* rstd, const floatX* inp1, const floatX* inp2, const floatX* weight,
                                 const floatX* bias, int N, int C, Fp8Meta* meta) {
    static_assert(LN_FP8_ROWS % 16 == 0 && LN_FP8_ROWS % (LAYERNORM_BLOCK / WARP_SIZE) == 0, "whole 16-row groups, rows per warp");
    extern __shared__ __align__(16) uint8_t ln_tile[];  // (LN_FP8_ROWS, C + 2)
    const int pitch = C + 2, warp = threadIdx.x / WARP_SIZE, warps = LAYERNORM_BLOCK / WARP_SIZE;
    const int r0 = blockIdx.x * LN_FP8_ROWS;
    const float scale = meta->scale;
    unsigned int amax = 0;
    for (int i = warp; i < LN_FP8_ROWS; i += warps) {
        const int row = r0 + i;
        uint8_t* out_row = out + (int64_t)row * C;
        uint8_t* tile_row = ln_tile + i * pitch;
        layernorm_row_warp<FUSED_RESIDUAL, PACKS>(residual, mean, rstd, inp1, inp2, weight, bias, row, C,
                                                  [&](int c, const x128& o) {
                                               Fp8Pack p;
#pragma unroll
                                               for (int k = 0; k < x128::size; k += 2) {
                                                   const float a = to_float(o[k]), b = to_float(o[k + 1]);
                                                   amax = max(amax, max(abs_bits(a), abs_bits(b)));
                                                   p.h[k / 2] = fp8x2_from_float2<Fp8Format::E4M3>(a * scale, b * scale);
                                                   *reinterpret_cast<uint16_t*>(tile_row + c + k) = p.h[k / 2];
                                               }
                                               *reinterpret_cast<Fp8Pack*>(out_row + c) = p;
                                           });
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < C * LN_FP8_GROUPS; idx += LAYERNORM_BLOCK) {
        const int c = idx / LN_FP8_GROUPS, rs = (idx % LN_FP8_GROUPS) * 16;
        uint4 w;
        uint32_t* wb = reinterpret_cast<uint32_t*>(&w);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint8_t* t = ln_tile + (rs + 4 * q) * pitch + c;
            wb[q] = (uint32_t)t[0] | ((uint32_t)t[pitch] << 8) | ((uint32_t)t[2 * pitch] << 16) | ((uint32_t)t[3 * pitch] << 24);
        }
        *reinterpret_cast<uint4*>(out_t + (int64_t)c * N + r0 + rs) = w;
    }
    amax_block_commit(meta, amax);
}

inline size_t layernorm_fp8_smem(int C) { return (size_t)LN_FP8_ROWS * (C + 2); }

namespace fp8_detail {
// The kernel's shared memory above the default 48 KB, opted in once per kernel (ctx.allow_smem) and
// only upward.
template <bool FUSED_RESIDUAL, int PACKS>
inline void layernorm_fp8_optin(size_t smem, const CudaContext& ctx) {
    if (smem > 48 * 1024) ctx.allow_smem(layernorm_fp8_forward_kernel<FUSED_RESIDUAL, PACKS>, (int)smem);
}
// Calls f(std::integral_constant<int, PACKS>): with the row in registers, the fused norm backwards'
// packs per lane for rows of C (norm_backward_dispatch: ceil(C / (32 x128::size)), 1..8 in bf16) up
// to NORM_BWD_MAX_C; wider rows 0 (the row's passes in memory).
template <typename F>
inline void with_ln_fp8_packs(int C, F&& f) {
    if (C <= NORM_BWD_MAX_C) norm_backward_dispatch(C, f);
    else f(std::integral_constant<int, 0>());
}
// layernorm_fp8_forward's kernel at PACKS (with_ln_fp8_packs's choice is the product's).
template <int PACKS>
inline void layernorm_fp8_launch(uint8_t* out_t, uint8_t* out, floatX* residual, float* mean, float* rstd,
                                 const floatX* inp1, const floatX* inp2, const floatX* weight, const floatX* bias, int N,
                                 int C, Fp8Meta* meta, const CudaContext& ctx) {
    if (N % LN_FP8_ROWS != 0 || C % 16 != 0)  // N: the FP8 path's multiple of 64
        fail("layernorm_fp8_forward: N = %d must be a multiple of %d and C = %d of 16", N, LN_FP8_ROWS, C);
    fp8_check_aligned(out, "layernorm_fp8_forward output");
    fp8_check_aligned(out_t, "layernorm_fp8_forward transposed output");
    const size_t smem = layernorm_fp8_smem(C);
    const dim3 grid(N / LN_FP8_ROWS);
    with_bool(inp2 != nullptr, [&](auto fused_residual) {
        constexpr bool RES = decltype(fused_residual)::value;
        layernorm_fp8_optin<RES, PACKS>(smem, ctx);
        layernorm_fp8_forward_kernel<RES, PACKS><<<grid, LAYERNORM_BLOCK, smem, ctx.stream>>>(
            out_t, out, residual, mean, rstd, inp1, inp2, weight, bias, N, C, meta);
    });
    cudaCheckLaunch();
}
}  // namespace fp8_detail

// Opts the kernels for rows of C channels in. Call it before a CUDA graph capture that may hold the
// first layernorm_fp8_forward of that width (model_build does): the launcher would opt in itself, and
// whether cudaFuncSetAttribute may run inside a capture is not a thing to rely on.
inline void layernorm_fp8_prepare(int C, const CudaContext& ctx) {
    fp8_detail::with_ln_fp8_packs(C, [&](auto P) {
        fp8_detail::layernorm_fp8_optin<false, decltype(P)::value>(layernorm_fp8_smem(C), ctx);
        fp8_detail::layernorm_fp8_optin<true, decltype(P)::value>(layernorm_fp8_smem(C), ctx);
    });
}

// See above. inp2 null: plain LayerNorm of inp1 (residual unused); else residual = inp1 + inp2 first.
// N a multiple of 64, C of 16; e4m3 (an activation); the scale is meta's (delayed scaling).
inline void layernorm_fp8_forward(uint8_t* out_t, uint8_t* out, floatX* residual, float* mean, float* rstd,
                                  const floatX* inp1, const floatX* inp2, const floatX* weight, const floatX* bias,
                                  int N, int C, Fp8Meta* meta, const CudaContext& ctx) {
    fp8_detail::with_ln_fp8_packs(C, [&](auto P) {
        fp8_detail::layernorm_fp8_launch<decltype(P)::value>(out_t, out, residual, mean, rstd, inp1, inp2, weight, bias,
                                                             N, C, meta, ctx);
    });
}
