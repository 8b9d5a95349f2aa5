// fp8.cuh: per-tensor scaled casts to FP8 for the FP8 matmuls of llmc/matmul_fp8.cuh, the amax that
// sets each tensor's scale, and the scale update itself (docs/numerics.md, "FP8: formats, scales, and
// what the lab measures").
// E4M3 (max 448) for weights and activations, E5M2 (max 57344) for gradients. A tensor is stored as
// x_fp8 = fp8(x * scale) and read back as x_fp8 * scale_inv (the matmul's A/B scale pointer): x * scale
// rounded once to fp32, then by cvt.rn.satfinite (nearest, ties to even; beyond the max and infinity
// to +-max; NaN to NaN), bit for bit cpu::fp8_cast (dev/cuda/fp8_cast.cu checks all 65536 bf16 values).
// Recipes, one Fp8Meta per tensor:
//   current  fp8_amax(x) -> fp8_update_scales(history_len 1) -> fp8_cast(x, no amax): x read twice.
//   delayed  fp8_cast(x, with amax) at the previous amaxes' scale, recording this one (x read once; a
//            value above the history's amax saturates), then fp8_update_scales(history_len H) once a
//            step. The scale being known first, the cast can run inside x's producer (llmc/fp8_fused.cuh).
// The scale: (fp8 max / the history window's largest amax) / 2^margin, capped at 2^64; an amax of 0
// or a non-finite one keeps the previous scale. Bit-identical to cpu::fp8_scale_from_amax (__fdiv_rn,
// __frcp_rn despite --use_fast_math).
// Amax: one atomicMax per block on the float bits of the block's max (non-negative floats' bits order
// like the values, a NaN's above +inf's): exact in any order, deterministic, no second pass or scratch.
//
// Kernels, n elements of floatX (bf16: 2 bytes), the FP8 outputs 1 byte each; all memory-bound (a few
// flops per byte). Measured: docs/perf.md, "Memory-bound kernels" (dev/cuda/fp8_cast.cu).
//   fp8_cast                    reads 2n, writes n; with amax one atomic more per block. 16-byte
//                               loads, grid-stride over one full wave, 4 loads in flight.
//   fp8_amax                    reads 2n (current scaling's extra pass).
//   fp8_cast_transpose          (R, C) -> (C, R) FP8, the K-major operands of the weight gradient
//                               (matmul_fp8.cuh), optionally the straight (R, C) cast from the same
//                               read: reads 2RC, writes RC or 2RC.
//   fp8_transpose               FP8 bytes (R, C) -> (C, R): reads RC, writes RC.
//   fp8_update_scales           one warp per tensor: reads and writes ~history_len * 4 bytes.
//   fp8_cast_rowwise            a scale per row (--fp8-scaling rowwise): reads 2RC, writes RC + 4R.
//   fp8_cast_transpose_colwise  a scale per input column, transposed: reads 4RC, writes RC + 4C.
// Pointers: inputs 16-byte aligned (cudaMalloc'd tensors and their offsets in the trainer are).
#pragma once
#include <cuda_fp8.h>
#include <cstdint>
#include <type_traits>
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"
#include "llmc/cpu/fp8.h"

enum class Fp8Format { E4M3, E5M2 };
constexpr float fp8_format_max(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0f : 57344.0f; }
constexpr const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }
constexpr cudaDataType_t fp8_cuda_type(Fp8Format f) { return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
constexpr cpu::Fp8Format fp8_cpu_format(Fp8Format f) { return f == Fp8Format::E4M3 ? cpu::Fp8Format::E4M3 : cpu::Fp8Format::E5M2; }

// Calls fn(std::integral_constant<Fp8Format, f>{}): a launcher's run-time format as a kernel's template argument.
template <typename Fn>
inline void with_fp8_format(Fp8Format f, Fn&& fn) {
    if (f == Fp8Format::E4M3) fn(std::integral_constant<Fp8Format, Fp8Format::E4M3>{});
    else fn(std::integral_constant<Fp8Format, Fp8Format::E5M2>{});
}
// The same for a flag: fn(std::bool_constant<b>{}).
template <typename Fn>
inline void with_bool(bool b, Fn&& fn) {
    if (b) fn(std::true_type{});
    else fn(std::false_type{});
}

constexpr int FP8_AMAX_HISTORY_MAX = 1024;
constexpr float FP8_SCALE_CAP = 18446744073709551616.0f;  // 2^64, as cpu::FP8_SCALE_CAP

// One per FP8 tensor, in device memory (fp8_meta_init). 16-byte aligned with scale_inv first, also in
// an array: cuBLASLt's A/B scale pointers must be (4 bytes off, it returns CUBLAS_STATUS_NOT_SUPPORTED).
struct alignas(16) Fp8Meta {
    float scale_inv;          // 1 / scale: the matmul's A/B scale pointer points here
    float scale;              // x_fp8 = fp8(x * scale)
    unsigned int amax_bits;   // float bits of max |x| over the casts since the last update
    int history_pos;          // next slot of amax_history to write
    float fp8_max;            // 448 or 57344: the format this tensor is cast to
    float amax_history[FP8_AMAX_HISTORY_MAX];
};

// ---------------------------------------------------------------- device helpers
template <Fp8Format F>
__device__ inline uint16_t fp8x2_from_float2(float lo, float hi) {
    // cvt.rn.satfinite.{e4m3,e5m2}x2.f32 on sm_89+: lo lands in the low byte
    return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE,
                                              F == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2);
}
template <Fp8Format F>
__device__ inline uint8_t fp8_from_float(float x) {
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, F == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2);
}
// |x| as ordered bits (NaN above inf)
__device__ inline unsigned int abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

// The block's max of `bits` into meta->amax_bits: warp max, block max, one atomic by thread 0 when it
// raises the current value. Every thread of the block must call it.
__device__ inline void amax_block_commit(Fp8Meta* meta, unsigned int bits) {
    __shared__ unsigned int warp_max[32];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, nwarps = blockDim.x / WARP_SIZE;
    bits = __reduce_max_sync(0xffffffffu, bits);
    if (lane == 0) warp_max[warp] = bits;
    __syncthreads();
    if (warp == 0) {
        bits = __reduce_max_sync(0xffffffffu, lane < nwarps ? warp_max[lane] : 0u);
        if (lane == 0 && bits > *(volatile unsigned int*)&meta->amax_bits) atomicMax(&meta->amax_bits, bits);
    }
}

// The scale of an amax given as float bits, the rule at the top: false (scale untouched) for an amax of
// 0 or a non-finite one. The one copy of the rule on the GPU (fp8_update_scales, the rowwise casts).
__device__ inline bool fp8_scale_of_amax(unsigned int amax, float fp8_max, int margin, float* scale) {
    if (amax == 0 || amax >= 0x7f800000u) return false;  // zero, or inf / NaN
    const float s = __fdiv_rn(fp8_max, __uint_as_float(amax)) * __uint_as_float((unsigned)(127 - margin) << 23);
    *scale = fminf(s, FP8_SCALE_CAP);
    return true;
}

// The FP8 bytes of one Packed128<floatX> (8 for bf16, 4 for fp32), stored in one instruction.
struct alignas(x128::size) Fp8Pack {
    uint16_t h[x128::size / 2];
};

// ---------------------------------------------------------------- straight cast (+ amax)
constexpr int FP8_CAST_BLOCK = 256;
constexpr int FP8_CAST_UNROLL = 4;  // 16-byte loads in flight per thread

template <Fp8Format F, bool AMAX>
static __global__ void __launch_bounds__(FP8_CAST_BLOCK)
    fp8_cast_kernel(uint8_t* __restrict__ out, const floatX* __restrict__ in, size_t n, Fp8Meta* meta) {
    constexpr int P = x128::size;
    const float scale = meta->scale;
    const size_t packs = n / P, stride = (size_t)gridDim.x * blockDim.x;
    unsigned int amax = 0;
    for (size_t base = (size_t)blockIdx.x * blockDim.x + threadIdx.x; base < packs; base += FP8_CAST_UNROLL * stride) {
        x128 v[FP8_CAST_UNROLL];
#pragma unroll
        for (int u = 0; u < FP8_CAST_UNROLL; u++)
            if (base + u * stride < packs) v[u] = load128cs(in + (base + u * stride) * P);
#pragma unroll
        for (int u = 0; u < FP8_CAST_UNROLL; u++) {
            if (base + u * stride >= packs) break;
            Fp8Pack o;
#pragma unroll
            for (int k = 0; k < P; k += 2) {
                const float a = to_float(v[u][k]), b = to_float(v[u][k + 1]);
                if (AMAX) amax = max(amax, max(abs_bits(a), abs_bits(b)));
                o.h[k / 2] = fp8x2_from_float2<F>(a * scale, b * scale);
            }
            *reinterpret_cast<Fp8Pack*>(out + (base + u * stride) * P) = o;
        }
    }
    // the last n % P elements, one per thread of block 0
    if (blockIdx.x == 0 && threadIdx.x < n - packs * P) {
        const size_t i = packs * P + threadIdx.x;
        const float a = to_float(in[i]);
        if (AMAX) amax = max(amax, abs_bits(a));
        out[i] = fp8_from_float<F>(a * scale);
    }
    if (AMAX) amax_block_commit(meta, amax);
}

// Block row y (blockIdx.y) takes tensor y of a batch: in + y * in_stride, meta + y * meta_stride.
static __global__ void __launch_bounds__(FP8_CAST_BLOCK)
    fp8_amax_kernel(const floatX* __restrict__ in, size_t n, Fp8Meta* meta, size_t in_stride, int meta_stride) {
    constexpr int P = x128::size;
    in += blockIdx.y * in_stride;
    meta += blockIdx.y * meta_stride;
    const size_t packs = n / P, stride = (size_t)gridDim.x * blockDim.x;
    unsigned int amax = 0;
    for (size_t base = (size_t)blockIdx.x * blockDim.x + threadIdx.x; base < packs; base += FP8_CAST_UNROLL * stride) {
        x128 v[FP8_CAST_UNROLL];
#pragma unroll
        for (int u = 0; u < FP8_CAST_UNROLL; u++)
            if (base + u * stride < packs) v[u] = load128cs(in + (base + u * stride) * P);
#pragma unroll
        for (int u = 0; u < FP8_CAST_UNROLL; u++) {
            if (base + u * stride >= packs) break;
#pragma unroll
            for (int k = 0; k < P; k++) amax = max(amax, abs_bits(to_float(v[u][k])));
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < n - packs * P) amax = max(amax, abs_bits(to_float(in[packs * P + threadIdx.x])));
    amax_block_commit(meta, amax);
}

// One full wave of blocks on ctx's device (grid-stride beyond it): few blocks, so few amax atomics.
inline int fp8_wave_blocks(size_t work_items, int block, const CudaContext& ctx) {
    const int wave = ctx.sm_count * (ctx.props.maxThreadsPerMultiProcessor / block);
    return (int)std::max<size_t>(1, std::min<size_t>(wave, ceil_div<size_t>(work_items, block)));
}

inline void fp8_check_aligned(const void* p, const char* what) {
    if ((uintptr_t)p % 16 != 0) fail("fp8: %s must be 16-byte aligned", what);
}

// out (n bytes) = fp8(in * meta->scale); with `amax`, meta->amax_bits = max(itself, max |in|).
inline void fp8_cast(uint8_t* out, const floatX* in, size_t n, Fp8Format f, Fp8Meta* meta, bool amax,
                     const CudaContext& ctx) {
    fp8_check_aligned(in, "fp8_cast input");
    fp8_check_aligned(out, "fp8_cast output");
    const int blocks = fp8_wave_blocks(n / x128::size, FP8_CAST_BLOCK, ctx);
    with_fp8_format(f, [&](auto F) {
        with_bool(amax, [&](auto A) {
            fp8_cast_kernel<decltype(F)::value, decltype(A)::value>
                <<<blocks, FP8_CAST_BLOCK, 0, ctx.stream>>>(out, in, n, meta);
        });
    });
    cudaCheckLaunch();
}

// meta->amax_bits = max(itself, max |in|): current scaling's pass before fp8_update_scales. With
// count > 1, the same for count tensors of n elements in one launch (one wave of blocks shared among
// them): tensor i at in + i * in_stride (elements), its meta at meta + i * meta_stride.
inline void fp8_amax(const floatX* in, size_t n, Fp8Meta* meta, const CudaContext& ctx, int count = 1,
                     size_t in_stride = 0, int meta_stride = 0) {
    fp8_check_aligned(in, "fp8_amax input");
    if (count > 1 && in_stride % x128::size != 0) fail("fp8_amax: a batch's stride %zu is not whole packs", in_stride);
    const dim3 grid(std::max(1, fp8_wave_blocks(n / x128::size, FP8_CAST_BLOCK, ctx) / count), count);
    fp8_amax_kernel<<<grid, FP8_CAST_BLOCK, 0, ctx.stream>>>(in, n, meta, in_stride, meta_stride);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------- transposed cast (+ straight, + amax)
// Tile of 64 x 64 elements per block of 256 threads. Load: each thread converts whole 16-byte packs of
// tile rows into shared memory (and the straight output), keeping the amax. Store: thread t writes 16
// bytes of transposed row t / 4 (input column), tile rows 16 * (t % 4) .. +15 read down a shared
// column: the 66-byte row pitch puts the four 16-row groups a warp reads 8 banks apart.
constexpr int FP8_T_TILE = 64, FP8_T_BLOCK = 256, FP8_T_PITCH = FP8_T_TILE + 2;

// The store above, shared with llmc/fp8_fused.cuh: the block's (64, 64) FP8 tile of input rows r0..,
// columns c0.. into out_t (C, R) at rows c0.., columns r0... Call after the barrier that completes the tile.
__device__ __forceinline__ void fp8_tile_store_transposed(uint8_t* __restrict__ out_t,
                                                          const uint8_t (&tile)[FP8_T_TILE][FP8_T_PITCH], int R,
                                                          int r0, int c0) {
    static_assert(FP8_T_BLOCK == 4 * FP8_T_TILE, "four threads a tile column, 16 rows each");
    const int c = threadIdx.x / 4, rs = (threadIdx.x % 4) * 16;
    uint4 w;
    uint32_t* wb = reinterpret_cast<uint32_t*>(&w);
#pragma unroll
    for (int q = 0; q < 4; q++)
        wb[q] = (uint32_t)tile[rs + 4 * q][c] | ((uint32_t)tile[rs + 4 * q + 1][c] << 8) |
                ((uint32_t)tile[rs + 4 * q + 2][c] << 16) | ((uint32_t)tile[rs + 4 * q + 3][c] << 24);
    *reinterpret_cast<uint4*>(out_t + (int64_t)(c0 + c) * R + r0 + rs) = w;
}

// col_scale: one scale per input column (fp8_cast_transpose_colwise; meta unused), else meta->scale.
// blockIdx.z: tensor z of a batch (Fp8Batch).
struct Fp8Batch {
    size_t out_stride = 0, in_stride = 0;  // bytes between the tensors' outputs (both), elements between inputs
    int meta_stride = 0;                   // metas between the tensors' metas
};
template <Fp8Format F, bool AMAX, bool STRAIGHT>
static __global__ void __launch_bounds__(FP8_T_BLOCK)
    fp8_cast_transpose_kernel(uint8_t* __restrict__ out_t, uint8_t* __restrict__ out, const floatX* __restrict__ in,
                              int R, int C, Fp8Meta* meta, const float* __restrict__ col_scale, Fp8Batch batch) {
    constexpr int P = x128::size, PACKS_PER_ROW = FP8_T_TILE / P;
    out_t += blockIdx.z * batch.out_stride;
    if (STRAIGHT) out += blockIdx.z * batch.out_stride;
    in += blockIdx.z * batch.in_stride;
    if (!col_scale) meta += blockIdx.z * batch.meta_stride;
    constexpr int LOADS = FP8_T_TILE * PACKS_PER_ROW / FP8_T_BLOCK;  // 2 (bf16) or 4 (fp32) per thread
    __shared__ alignas(16) uint8_t tile[FP8_T_TILE][FP8_T_PITCH];  // 2-byte stores into it
    const int r0 = blockIdx.y * FP8_T_TILE, c0 = blockIdx.x * FP8_T_TILE;
    const float scale = col_scale ? 0.0f : meta->scale;
    unsigned int amax = 0;
    x128 v[LOADS];
#pragma unroll
    for (int j = 0; j < LOADS; j++) {
        const int idx = threadIdx.x + j * FP8_T_BLOCK, r = idx / PACKS_PER_ROW, p = idx % PACKS_PER_ROW;
        v[j] = load128cs(in + (int64_t)(r0 + r) * C + c0 + p * P);
    }
#pragma unroll
    for (int j = 0; j < LOADS; j++) {
        const int idx = threadIdx.x + j * FP8_T_BLOCK, r = idx / PACKS_PER_ROW, p = idx % PACKS_PER_ROW;
        Fp8Pack o;
        float sc[P];
#pragma unroll
        for (int k = 0; k < P; k++) sc[k] = col_scale ? col_scale[c0 + p * P + k] : scale;
#pragma unroll
        for (int k = 0; k < P; k += 2) {
            const float a = to_float(v[j][k]), b = to_float(v[j][k + 1]);
            if (AMAX) amax = max(amax, max(abs_bits(a), abs_bits(b)));
            o.h[k / 2] = fp8x2_from_float2<F>(a * sc[k], b * sc[k + 1]);
            *reinterpret_cast<uint16_t*>(&tile[r][p * P + k]) = o.h[k / 2];
        }
        if (STRAIGHT) *reinterpret_cast<Fp8Pack*>(out + (int64_t)(r0 + r) * C + c0 + p * P) = o;
    }
    __syncthreads();
    fp8_tile_store_transposed(out_t, tile, R, r0, c0);
    if (AMAX) amax_block_commit(meta, amax);
}

// out_t (C, R) = fp8(in^T * scale), in (R, C) row-major; with `out` also out (R, C) = fp8(in * scale)
// from the same read; with `amax`, meta->amax_bits as fp8_cast. R and C multiples of 64.
// With count > 1: count tensors in one launch, tensor i's input at in + i * batch.in_stride, its
// outputs at out_t / out + i * batch.out_stride, its meta at meta + i * batch.meta_stride (the
// weights of every block, fp8_cast_weights in llmc/model_fp8.cuh).
// col_scale: one scale per input column instead of meta's (fp8_cast_transpose_colwise).
inline void fp8_cast_transpose(uint8_t* out_t, uint8_t* out, const floatX* in, int R, int C, Fp8Format f,
                               Fp8Meta* meta, bool amax, cudaStream_t stream, int count = 1, Fp8Batch batch = {},
                               const float* col_scale = nullptr) {
    if (R % FP8_T_TILE != 0 || C % FP8_T_TILE != 0)
        fail("fp8_cast_transpose: R = %d and C = %d must be multiples of %d", R, C, FP8_T_TILE);
    if (R / FP8_T_TILE > 65535) fail("fp8_cast_transpose: R = %d rows: more than 65535 row tiles", R);
    fp8_check_aligned(in, "fp8_cast_transpose input");
    fp8_check_aligned(out_t, "fp8_cast_transpose output");
    if (out) fp8_check_aligned(out, "fp8_cast_transpose straight output");
    if (count > 1 && (batch.out_stride % 16 != 0 || batch.in_stride % x128::size != 0))
        fail("fp8_cast_transpose: a batch's strides (%zu bytes, %zu elements) break 16-byte alignment", batch.out_stride,
             batch.in_stride);
    const dim3 grid(C / FP8_T_TILE, R / FP8_T_TILE, count);
    with_fp8_format(f, [&](auto F) {
        with_bool(amax, [&](auto A) {
            with_bool(out != nullptr, [&](auto S) {
                fp8_cast_transpose_kernel<decltype(F)::value, decltype(A)::value, decltype(S)::value>
                    <<<grid, FP8_T_BLOCK, 0, stream>>>(out_t, out, in, R, C, meta, col_scale, batch);
            });
        });
    });
    cudaCheckLaunch();
}

// ---------------------------------------------------------------- transpose of FP8 bytes
// out (C, R) = in (R, C)^T, FP8 bytes (no conversion), each with its own row pitch in bytes: the
// output head's dlogits^T chunks (fp8_head_backward: R = 32768 tokens, C = 50304 vocabulary rows, both
// pitches 100608, twice a 124M step) in the logits buffer's halves. Memory-bound: reads RC, writes RC.
// fp8_transpose_tiled_kernel<TR = 128>: a block of 256 threads takes TR input rows by 128 input
// columns (16 KB of shared memory):
//   load   thread t reads 16-byte chunk t % 8 of rows t / 8 + 32 j, j < TR / 32 (64 bytes in flight a
//          thread; a warp reads 4 whole 128-byte rows) into shared memory at chunk (t % 8) ^ swizzle(row),
//          swizzle(row) = (row / 16) % 8, rows 128 bytes apart, no padding.
//   store  warp w owns tile columns 16 w .. +15; lane (rg = lane % 8, cg = lane / 8) reads the words of
//          columns 16 w + 4 cg .. +3 from rows 16 rg .. +15, turns each 4 x 4 byte block around with
//          byte permutes, and writes 16 bytes to each of its 4 output rows (a warp: 4 rows x 128 bytes).
//          The swizzle puts a warp's 8 row groups in 8 different chunks: no bank conflicts either way.
// Blocks run in groups of `group` column tiles, down all the row tiles of a group before the next, so
// the ~1000 resident blocks cover a patch (at 32: ~4 KB of each input and output row) instead of a
// full-width band that touches each of the 50304 output rows in ~340-byte runs.
// R and C multiples of 64: a tile over the edge by 64 rows or columns skips those loads and stores
// (block-uniform). Measured with the other orders and tiles: dev/cuda/fp8_cast.cu --op fp8_transpose.
constexpr int FP8_TR_COLS = 128;   // tile columns (input bytes a row)
constexpr int FP8_TR_BLOCK = 256;  // threads
constexpr int FP8_TR_GROUP = 32;   // column tiles a group (the grid order above)

// Byte permutes: the 4 x 4 block of bytes in a[0..3] (a[i] = row i, byte j = column j) turned around
// in place (a[j] = column j, byte i = row i).
__device__ __forceinline__ void transpose_4x4_bytes(uint32_t (&a)[4]) {
    const uint32_t t0 = __byte_perm(a[0], a[1], 0x5140), t1 = __byte_perm(a[0], a[1], 0x7362);
    const uint32_t t2 = __byte_perm(a[2], a[3], 0x5140), t3 = __byte_perm(a[2], a[3], 0x7362);
    a[0] = __byte_perm(t0, t2, 0x5410);
    a[1] = __byte_perm(t0, t2, 0x7632);
    a[2] = __byte_perm(t1, t3, 0x5410);
    a[3] = __byte_perm(t1, t3, 0x7632);
}

template <int TR>
static __global__ void __launch_bounds__(FP8_TR_BLOCK)
    fp8_transpose_tiled_kernel(uint8_t* __restrict__ out, int64_t out_pitch, const uint8_t* __restrict__ in,
                               int64_t in_pitch, int R, int C, int group) {
    static_assert(FP8_TR_COLS == 128 && FP8_TR_BLOCK == 256, "8 lanes a 128-byte row; 8 warps of 16 columns");
    static_assert(TR % 128 == 0, "the store phase takes 128 rows a pass (8 row groups of 16)");
    constexpr int CHUNKS = FP8_TR_COLS / 16, ROWS_A_PASS = FP8_TR_BLOCK / CHUNKS, LOADS = TR / ROWS_A_PASS;
    __shared__ alignas(16) uint8_t tile[TR][FP8_TR_COLS];  // chunk k of row r at k ^ swizzle(r)
    auto swizzle = [](int r) { return (r / 16) % CHUNKS; };
    // the block's tile in the grouped order
    const int col_tiles = ceil_div(C, FP8_TR_COLS), row_tiles = ceil_div(R, TR);
    const int per_group = group * row_tiles, g = blockIdx.x / per_group, first = g * group;
    const int width = min(group, col_tiles - first), within = blockIdx.x - g * per_group;
    const int c0 = (first + within % width) * FP8_TR_COLS, r0 = (within / width) * TR;
    const int rows = min(TR, R - r0), cols = min(FP8_TR_COLS, C - c0);  // multiples of 64

    const int k = threadIdx.x % CHUNKS, lr = threadIdx.x / CHUNKS;
    uint4 v[LOADS];
#pragma unroll
    for (int j = 0; j < LOADS; j++) {
        const int r = lr + j * ROWS_A_PASS;
        v[j] = make_uint4(0, 0, 0, 0);  // the bytes past the edge: stored to shared memory, never read back
        if (r < rows && k * 16 < cols)
            v[j] = __ldcs(reinterpret_cast<const uint4*>(in + (int64_t)(r0 + r) * in_pitch + c0 + k * 16));
    }
#pragma unroll
    for (int j = 0; j < LOADS; j++) {
        const int r = lr + j * ROWS_A_PASS;
        *reinterpret_cast<uint4*>(&tile[r][(k ^ swizzle(r)) * 16]) = v[j];
    }
    __syncthreads();

    const int lane = threadIdx.x % WARP_SIZE, w = threadIdx.x / WARP_SIZE, rg = lane % 8, cg = lane / 8;
    const int c = w * 16 + cg * 4;  // the lane's 4 tile columns, in chunk w
    if (c >= cols) return;          // warp-uniform: cols is 64 or 128
#pragma unroll
    for (int p = 0; p < TR / 128; p++) {
        const int rs = p * 128 + rg * 16;  // the lane's 16 tile rows
        if (rs >= rows) break;
        uint32_t a[4][4];  // [row quad q][row in quad] -> after the permutes [q][column]
#pragma unroll
        for (int q = 0; q < 4; q++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = rs + 4 * q + i;
                a[q][i] = *reinterpret_cast<const uint32_t*>(&tile[r][(w ^ swizzle(r)) * 16 + cg * 4]);
            }
            transpose_4x4_bytes(a[q]);
        }
#pragma unroll
        for (int b = 0; b < 4; b++)
            __stcs(reinterpret_cast<uint4*>(out + (int64_t)(c0 + c + b) * out_pitch + r0 + rs),
                   make_uint4(a[0][b], a[1][b], a[2][b], a[3][b]));
    }
}

namespace fp8_detail {
inline void transpose_check(uint8_t* out, int64_t out_pitch, const uint8_t* in, int64_t in_pitch, int R, int C) {
    if (R % FP8_T_TILE != 0 || C % FP8_T_TILE != 0 || R <= 0 || C <= 0)
        fail("fp8_transpose: R = %d and C = %d must be positive multiples of %d", R, C, FP8_T_TILE);
    if (in_pitch < C || out_pitch < R || in_pitch % 16 != 0 || out_pitch % 16 != 0)
        fail("fp8_transpose: pitches %lld (in) and %lld (out) must be multiples of 16 and hold a row",
             (long long)in_pitch, (long long)out_pitch);
    fp8_check_aligned(in, "fp8_transpose input");
    fp8_check_aligned(out, "fp8_transpose output");
}
// fp8_transpose_tiled_kernel<TR>, blocks in groups of `group` column tiles (at most all of them).
template <int TR>
inline void transpose_tiled_launch(uint8_t* out, int64_t out_pitch, const uint8_t* in, int64_t in_pitch, int R, int C,
                                   int group, cudaStream_t stream) {
    transpose_check(out, out_pitch, in, in_pitch, R, C);
    const int col_tiles = ceil_div(C, FP8_TR_COLS), row_tiles = ceil_div(R, TR);
    group = std::min(group, col_tiles);
    if ((int64_t)group * row_tiles > INT32_MAX) fail("fp8_transpose: R = %d: too many row tiles", R);
    const unsigned blocks = (unsigned)col_tiles * row_tiles;
    fp8_transpose_tiled_kernel<TR><<<blocks, FP8_TR_BLOCK, 0, stream>>>(out, out_pitch, in, in_pitch, R, C, group);
    cudaCheckLaunch();
}
}  // namespace fp8_detail

// out (C, R) at out_pitch bytes a row = in (R, C) at in_pitch bytes a row, transposed. R and C
// multiples of 64; pointers and pitches 16-byte aligned. The two may share an allocation, not bytes.
inline void fp8_transpose(uint8_t* out, int64_t out_pitch, const uint8_t* in, int64_t in_pitch, int R, int C,
                          cudaStream_t stream) {
    fp8_detail::transpose_tiled_launch<128>(out, out_pitch, in, in_pitch, R, C, FP8_TR_GROUP, stream);
}

// ---------------------------------------------------------------- rowwise scales (--fp8-scaling rowwise)
// One warp per row: the row's packs into registers (PACKS per lane: 4, 8, 12 or 16, the fewest that
// hold the row), the warp's amax, the row's scale by the rule at the top (margin 0; a zero or
// non-finite row keeps scale 1), then the cast from the registers. 8 rows per block of 256 threads;
// every load in flight before the reduction. Registers (ptxas, sm_90a): 48 at 4 packs (C <= 1024),
// 80 at 8, 137 at 12 (C = 3072: fcproj's X), 185 at 16 (one block per SM: low occupancy, 8 KB in flight a warp).
constexpr int FP8_ROW_BLOCK = 256;
constexpr int FP8_ROWWISE_MAX_C = 16 * WARP_SIZE * x128::size;  // 16 packs per lane: 4096 bf16

template <Fp8Format F, int PACKS>
static __global__ void __launch_bounds__(FP8_ROW_BLOCK)
    fp8_cast_rowwise_kernel(uint8_t* __restrict__ out, float* __restrict__ scale_inv, const floatX* __restrict__ in,
                            int R, int C) {
    constexpr int P = x128::size;
    constexpr float FMAX = F == Fp8Format::E4M3 ? 448.0f : 57344.0f;
    const int lane = threadIdx.x % WARP_SIZE, r = blockIdx.x * (FP8_ROW_BLOCK / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (r >= R) return;  // whole warps leave together
    const int packs = C / P;
    const floatX* row = in + (int64_t)r * C;
    x128 v[PACKS];
    unsigned int amax = 0;
#pragma unroll
    for (int j = 0; j < PACKS; j++)
        if (lane + j * WARP_SIZE < packs) v[j] = load128cs(row + (lane + j * WARP_SIZE) * P);
#pragma unroll
    for (int j = 0; j < PACKS; j++)
        if (lane + j * WARP_SIZE < packs)
#pragma unroll
            for (int k = 0; k < P; k++) amax = max(amax, abs_bits(to_float(v[j][k])));
    amax = __reduce_max_sync(0xffffffffu, amax);
    float scale = 1.0f;
    fp8_scale_of_amax(amax, FMAX, 0, &scale);
#pragma unroll
    for (int j = 0; j < PACKS; j++) {
        const int p = lane + j * WARP_SIZE;
        if (p >= packs) break;
        Fp8Pack o;
#pragma unroll
        for (int k = 0; k < P; k += 2) o.h[k / 2] = fp8x2_from_float2<F>(to_float(v[j][k]) * scale, to_float(v[j][k + 1]) * scale);
        *reinterpret_cast<Fp8Pack*>(out + (int64_t)r * C + p * P) = o;
    }
    if (lane == 0) scale_inv[r] = __frcp_rn(scale);
}

// out (R, C) = fp8(in * scale[r]) row by row, scale[r] from row r's amax; scale_inv (R) = 1 / scale[r],
// the OUTER_VEC scales of matmul_fp8. C a multiple of 8 (16-byte packs), at most 4096.
inline void fp8_cast_rowwise(uint8_t* out, float* scale_inv, const floatX* in, int R, int C, Fp8Format f,
                             cudaStream_t stream) {
    constexpr int P = x128::size;
    if (C % P != 0 || C > FP8_ROWWISE_MAX_C)
        fail("fp8_cast_rowwise: C = %d must be a multiple of %d, at most %d", C, P, FP8_ROWWISE_MAX_C);
    fp8_check_aligned(in, "fp8_cast_rowwise input");
    fp8_check_aligned(out, "fp8_cast_rowwise output");
    const int blocks = ceil_div(R, FP8_ROW_BLOCK / WARP_SIZE), packs_per_lane = ceil_div(C / P, WARP_SIZE);
    with_fp8_format(f, [&](auto F) {
        constexpr Fp8Format FF = decltype(F)::value;
        auto launch = [&](auto kernel) { kernel<<<blocks, FP8_ROW_BLOCK, 0, stream>>>(out, scale_inv, in, R, C); };
        if (packs_per_lane <= 4) launch(fp8_cast_rowwise_kernel<FF, 4>);
        else if (packs_per_lane <= 8) launch(fp8_cast_rowwise_kernel<FF, 8>);
        else if (packs_per_lane <= 12) launch(fp8_cast_rowwise_kernel<FF, 12>);
        else launch(fp8_cast_rowwise_kernel<FF, 16>);
    });
    cudaCheckLaunch();
}

// Column amaxes: thread = pack of 8 columns, blockIdx.y = a chunk of rows walked in order (4 loads in
// flight); per column one atomicMax per chunk, skipped when it would not raise the value.
constexpr int FP8_COL_BLOCK = 128, FP8_COL_ROWS = 64;
static __global__ void __launch_bounds__(FP8_COL_BLOCK)
    fp8_amax_columns_kernel(unsigned int* __restrict__ amax_bits, const floatX* __restrict__ in, int R, int C) {
    constexpr int P = x128::size;
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (c >= C) return;
    const int r0 = blockIdx.y * FP8_COL_ROWS, r1 = min(R, r0 + FP8_COL_ROWS);
    unsigned int m[P] = {};
#pragma unroll 4
    for (int r = r0; r < r1; r++) {
        const x128 v = load128cs(in + (int64_t)r * C + c);
#pragma unroll
        for (int k = 0; k < P; k++) m[k] = max(m[k], abs_bits(to_float(v[k])));
    }
#pragma unroll
    for (int k = 0; k < P; k++)
        if (m[k] > *(volatile unsigned int*)&amax_bits[c + k]) atomicMax(&amax_bits[c + k], m[k]);
}

// scale[i], scale_inv[i] from amax_bits[i] (margin 0; scale 1 for a zero or non-finite amax).
static __global__ void fp8_scales_from_amax_kernel(float* scale, float* scale_inv, const unsigned int* amax_bits, int n,
                                                   float fp8_max) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = 1.0f;
    fp8_scale_of_amax(amax_bits[i], fp8_max, 0, &s);
    scale[i] = s;
    scale_inv[i] = __frcp_rn(s);
}

// out_t (C, R) = fp8(in^T), row c of out_t (column c of in) scaled by scale[c] from column c's amax;
// col_scale_inv (C) = 1 / scale[c]. scratch: 2 * C words (the column amaxes, then the scales).
// R and C multiples of 64 (fp8_cast_transpose's tile).
inline void fp8_cast_transpose_colwise(uint8_t* out_t, float* col_scale_inv, const floatX* in, int R, int C,
                                       Fp8Format f, float* scratch, cudaStream_t stream) {
    fp8_check_aligned(in, "fp8_cast_transpose_colwise input");
    unsigned int* amax_bits = reinterpret_cast<unsigned int*>(scratch);
    float* scale = scratch + C;
    cudaCheck(cudaMemsetAsync(amax_bits, 0, sizeof(unsigned int) * C, stream));
    const dim3 grid(ceil_div(C / x128::size, FP8_COL_BLOCK), ceil_div(R, FP8_COL_ROWS));
    fp8_amax_columns_kernel<<<grid, FP8_COL_BLOCK, 0, stream>>>(amax_bits, in, R, C);
    cudaCheckLaunch();
    fp8_scales_from_amax_kernel<<<ceil_div(C, 256), 256, 0, stream>>>(scale, col_scale_inv, amax_bits, C, fp8_format_max(f));
    cudaCheckLaunch();
    fp8_cast_transpose(out_t, nullptr, in, R, C, f, nullptr, false, stream, 1, {}, scale);
}

// ---------------------------------------------------------------- scales
static __global__ void fp8_meta_init_kernel(Fp8Meta* metas, int count, float fp8_max) {
    const int m = blockIdx.x;
    if (m >= count) return;
    for (int i = threadIdx.x; i < FP8_AMAX_HISTORY_MAX; i += blockDim.x) metas[m].amax_history[i] = 0.0f;
    if (threadIdx.x == 0) {
        metas[m].scale = 1.0f;
        metas[m].scale_inv = 1.0f;
        metas[m].amax_bits = 0;
        metas[m].history_pos = 0;
        metas[m].fp8_max = fp8_max;
    }
}

// metas[0..count): scale 1, empty history, for tensors cast to format f.
inline void fp8_meta_init(Fp8Meta* metas, int count, Fp8Format f, cudaStream_t stream) {
    fp8_meta_init_kernel<<<count, 128, 0, stream>>>(metas, count, fp8_format_max(f));
    cudaCheckLaunch();
}

// One warp per tensor: amax_bits into the history ring, the scale from the ring's max over the last
// history_len entries (1: this amax only), amax_bits reset for the next casts.
static __global__ void fp8_update_scales_kernel(Fp8Meta* metas, int history_len, int margin) {
    Fp8Meta& m = metas[blockIdx.x];
    const int lane = threadIdx.x;
    const int pos = m.history_pos;
    const unsigned int now = m.amax_bits;
    unsigned int amax = 0;
    for (int i = lane; i < history_len; i += WARP_SIZE)
        amax = max(amax, i == pos ? now : __float_as_uint(m.amax_history[i]));
    amax = __reduce_max_sync(0xffffffffu, amax);
    if (lane == 0) {
        m.amax_history[pos] = __uint_as_float(now);
        m.history_pos = pos + 1 < history_len ? pos + 1 : 0;
        m.amax_bits = 0;
        float s;
        if (fp8_scale_of_amax(amax, m.fp8_max, margin, &s)) {  // positive and finite; else keep the scale
            m.scale = s;
            m.scale_inv = __frcp_rn(s);
        }
    }
}

// Updates metas[0..count) (consecutive, e.g. every tensor of one format) from their amaxes.
// history_len in 1..FP8_AMAX_HISTORY_MAX, the same for all calls on these metas; margin in 0..30.
inline void fp8_update_scales(Fp8Meta* metas, int count, int history_len, int margin, cudaStream_t stream) {
    if (history_len < 1 || history_len > FP8_AMAX_HISTORY_MAX)
        fail("fp8_update_scales: history_len = %d outside 1..%d", history_len, FP8_AMAX_HISTORY_MAX);
    if (margin < 0 || margin > 30) fail("fp8_update_scales: margin = %d outside 0..30", margin);
    fp8_update_scales_kernel<<<count, WARP_SIZE, 0, stream>>>(metas, history_len, margin);
    cudaCheckLaunch();
}
