// fp8_lab.cuh: what only the FP8 cast lab (fp8_cast.cu) runs beside the shipped kernels of
// llmc/fp8.cuh and llmc/fp8_fused.cuh: the previous transpose kernel and the transpose's tile and grid
// order knobs, the fused cast at a given number of tiles a block, and the FP8 LayerNorm with the row's
// passes in memory at every C. The shipped launchers take one configuration each; these wrappers reach
// the same kernels (fp8_transpose_tiled_kernel, fp8_cast_transpose_fused_kernel,
// layernorm_fp8_forward_kernel) through llmc's fp8_detail launch functions at other settings.
#pragma once
#include <algorithm>
#include <climits>
#include <cstdint>
#include "llmc/cuda_common.cuh"
#include "llmc/fp8.cuh"
#include "llmc/fp8_fused.cuh"
#include "llmc/utils.h"

// ---------------------------------------------------------------- transpose
// fp8_transpose_64x128_kernel, the previous transpose: two of fp8_cast_transpose's 64 x 64 tiles a
// block (the second absent when R is an odd multiple of 64), 64-byte runs read and written.
constexpr int FP8_TR_TILES = 2;  // fp8_transpose_64x128_kernel's 64-row tiles a block
static __global__ void __launch_bounds__(FP8_T_BLOCK)
    fp8_transpose_64x128_kernel(uint8_t* __restrict__ out, int64_t out_pitch, const uint8_t* __restrict__ in,
                                int64_t in_pitch, int R) {
    static_assert(FP8_T_TILE * FP8_T_TILE == 16 * FP8_T_BLOCK, "one 16-byte load a thread a tile");
    __shared__ alignas(16) uint8_t tile[FP8_TR_TILES][FP8_T_TILE][FP8_T_PITCH];  // 2-byte stores into it
    const int r0 = blockIdx.y * FP8_TR_TILES * FP8_T_TILE, c0 = blockIdx.x * FP8_T_TILE;
    const int tiles = min(FP8_TR_TILES, (R - r0) / FP8_T_TILE);  // the same for the whole block
    const int r = threadIdx.x / 4, p = (threadIdx.x % 4) * 16;
    uint4 v[FP8_TR_TILES];
#pragma unroll
    for (int j = 0; j < FP8_TR_TILES; j++)
        if (j < tiles) v[j] = __ldcs(reinterpret_cast<const uint4*>(in + (int64_t)(r0 + j * FP8_T_TILE + r) * in_pitch + c0 + p));
#pragma unroll
    for (int j = 0; j < FP8_TR_TILES; j++) {
        if (j >= tiles) break;
        const uint16_t* vh = reinterpret_cast<const uint16_t*>(&v[j]);
#pragma unroll
        for (int k = 0; k < 8; k++) *reinterpret_cast<uint16_t*>(&tile[j][r][p + 2 * k]) = vh[k];
    }
    __syncthreads();
    const int c = threadIdx.x / 4, rs = (threadIdx.x % 4) * 16;
#pragma unroll
    for (int j = 0; j < FP8_TR_TILES; j++) {
        if (j >= tiles) break;
        uint4 w;
        uint32_t* wb = reinterpret_cast<uint32_t*>(&w);
#pragma unroll
        for (int q = 0; q < 4; q++)
            wb[q] = (uint32_t)tile[j][rs + 4 * q][c] | ((uint32_t)tile[j][rs + 4 * q + 1][c] << 8) |
                    ((uint32_t)tile[j][rs + 4 * q + 2][c] << 16) | ((uint32_t)tile[j][rs + 4 * q + 3][c] << 24);
        __stcs(reinterpret_cast<uint4*>(out + (int64_t)(c0 + c) * out_pitch + r0 + j * FP8_T_TILE + rs), w);
    }
}


namespace fp8_lab {
// Which transpose kernel and grid order (fp8_transpose: the defaults).
struct Fp8TransposeConfig {
    int tile_rows = 128;         // TR of fp8_transpose_tiled_kernel: 128, or 256 (32 KB of shared memory,
                                 // 62 registers: 4 blocks a SM)
    int group = FP8_TR_GROUP;    // column tiles a group; 0: one group of all (row after row of tiles)
    bool previous = false;       // fp8_transpose_64x128_kernel instead (tile_rows and group unused)
};
inline void transpose_launch(uint8_t* out, int64_t out_pitch, const uint8_t* in, int64_t in_pitch, int R, int C,
                             cudaStream_t stream, Fp8TransposeConfig cfg) {
    if (cfg.previous) {
        fp8_detail::transpose_check(out, out_pitch, in, in_pitch, R, C);
        const int row_blocks = ceil_div(R, FP8_TR_TILES * FP8_T_TILE);
        if (row_blocks > 65535) fail("fp8_transpose: R = %d rows: more than 65535 row blocks", R);
        fp8_transpose_64x128_kernel<<<dim3(C / FP8_T_TILE, row_blocks), FP8_T_BLOCK, 0, stream>>>(out, out_pitch, in,
                                                                                                 in_pitch, R);
        cudaCheckLaunch();
        return;
    }
    const int group = cfg.group > 0 ? cfg.group : INT_MAX;  // transpose_tiled_launch caps it at the column tiles
    if (cfg.tile_rows == 128)
        fp8_detail::transpose_tiled_launch<128>(out, out_pitch, in, in_pitch, R, C, group, stream);
    else if (cfg.tile_rows == 256)
        fp8_detail::transpose_tiled_launch<256>(out, out_pitch, in, in_pitch, R, C, group, stream);
    else
        fail("fp8_transpose: tile_rows %d (128 or 256)", cfg.tile_rows);
}

// ---------------------------------------------------------------- fused casts
// fp8_cast_transpose_fused at `tiles` 64-row tiles a block (0: fp8_fused_rows_per_chunk's choice), at
// least the fused_min_tiles(R) that keep the chunks within the bias scratch.
inline void fused_cast_tiles(uint8_t* out_t, uint8_t* out, const floatX* in, const floatX* pre, int R, int C,
                             Fp8Format f, Fp8Meta* meta, Fp8Prologue prologue, floatX* dbias, float* scratch,
                             cudaStream_t stream, const Fp8DqAccum& dq, int tiles) {
    const int rpc = tiles <= 0 ? fp8_fused_rows_per_chunk(R, C, prologue)
                               : std::max(tiles, fp8_detail::fused_min_tiles(R)) * FP8_T_TILE;
    fp8_detail::fused_cast_launch(out_t, out, in, pre, R, C, f, meta, prologue, dbias, scratch, stream, dq, rpc);
}

// ---------------------------------------------------------------- LayerNorm with FP8 outputs
// layernorm_fp8_forward with the row's passes in memory at every C (PACKS 0: the shipped kernel's path
// past NORM_BWD_MAX_C only).
inline void layernorm_fp8_in_memory(uint8_t* out_t, uint8_t* out, floatX* residual, float* mean, float* rstd,
                                    const floatX* inp1, const floatX* inp2, const floatX* weight, const floatX* bias,
                                    int N, int C, Fp8Meta* meta, const CudaContext& ctx) {
    fp8_detail::layernorm_fp8_launch<0>(out_t, out, residual, mean, rstd, inp1, inp2, weight, bias, N, C, meta, ctx);
}
}  // namespace fp8_lab
