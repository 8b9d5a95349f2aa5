// attention_hopper_common.cuh: the Hopper (sm_90a) building blocks the attention kernels share: TMA
// tile loads and bulk reductions, 128B-swizzled smem panels and their wgmma descriptors, the wgmma
// instructions, named barriers, tensor map encoding. Part of llmc/attention.cuh; it builds on
// attention_mma.cuh and llmc/cuda_common.cuh (mbarriers, pack_bf16, smem_addr).
//
// Layouts: a (R, HD) bf16 tile lives in smem as HD/64 panels of R rows x 64 columns (128-byte rows),
// the 16-byte chunks of row r XOR-swizzled by r % 8: what the TMA's 128B swizzle writes and what a
// wgmma descriptor with 128B swizzle reads. Accumulators are wgmma's: thread t of a warpgroup holds,
// for each 8-column block nb, d[nb*4 + 0..1] at row 16*warp + t%32/4, columns 8*nb + 2*(t%4) + 0..1,
// and d[nb*4 + 2..3] eight rows further down.
#pragma once
#include <cudaTypedefs.h>
#include "llmc/attention_mma.cuh"

// Whether the Hopper attention kernels run on the context's device (the build has them and it is an
// sm_90 GPU, not forced onto the portable path).
inline bool attention_hopper_available(const CudaContext& ctx) { return ctx.runs_sm90a; }

// Where the Hopper kernels' device code compiles: the host pass and the sm_90a device pass. In the
// other device passes of a fat build (GPU_ARCH=all or a list holding 90a) their bodies are a trap, so
// no wgmma, setmaxnreg or TMA instruction reaches those architectures' machine code.
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LLMC_SM90A_DEVICE 1
#else
#define LLMC_SM90A_DEVICE 0
#endif

#if defined(LLMC_SM90A)
namespace attention_hopper_detail {
using namespace attention_detail;

// ============================================================================ TMA, wgmma
// One box of the tensor map (64 columns x 64 rows of one sequence) into smem, completing on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int col, int row, int seq, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
            dst),
        "l"(map), "r"(col), "r"(row), "r"(seq), "r"(bar)
        : "memory");
}
// One box of a one-dimensional tensor map (elements c0..) into smem, completing on `bar`.
__device__ __forceinline__ void tma_load_1d(uint32_t dst, const CUtensorMap* map, int c0, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];\n" ::"r"(
                     dst),
                 "l"(map), "r"(c0), "r"(bar)
                 : "memory");
}
// Adds one smem box element-wise into the tensor (fp32 reduction in L2; out-of-bounds elements are
// skipped), as a bulk async-group of the issuing thread: commit, then wait before reusing the smem.
__device__ __forceinline__ void tma_reduce_add(const CUtensorMap* map, uint32_t src, int col, int row, int seq) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(map),
        "r"(col), "r"(row), "r"(seq), "r"(src)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's bulk groups still read their smem source.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until at most N of this thread's bulk groups are incomplete (their global writes done).
template <int N>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// Shared-memory matrix descriptor, 128B swizzle. K-major operands (Q, K): 8-row groups of 128-byte
// rows SBO = 1024 bytes apart, LBO unused. MN-major (V, transposed): LBO = the distance between
// 64-column panels, SBO = 1024 between groups of 8 keys.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 | 1ull << 62;
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins registers the tensor cores write (or read) asynchronously to this point, after a wgmma_wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+r"(r[i][j])::"memory");
}

#define HG_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define HG_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define HG_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define HG_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define HG_ACC16 HG_ACC8(0), HG_ACC8(8)
#define HG_ACC32 HG_ACC8(0), HG_ACC8(8), HG_ACC8(16), HG_ACC8(24)
#define HG_ACC64 HG_ACC32, HG_ACC8(32), HG_ACC8(40), HG_ACC8(48), HG_ACC8(56)

// d (64 x N fp32, this thread's N/2) (+)= A (64 x 16, smem) * B (16 x N, smem); accumulate = 0
// overwrites d. Both K-major by default; TRANS_A / TRANS_B = 1 reads that operand MN-major
// (transposed: its 128-byte rows run along M or N, as V's and dS^T's tiles in smem).
template <int N, int TRANS_A = 0, int TRANS_B = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, int accumulate) {
    static_assert(N == 32 || N == 64 || N == 128, "wgmma n");
    if constexpr (N == 32)
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " HG_D16 ", %16, %17, p, 1, 1, %19, %20;\n}\n"
                     : HG_ACC16
                     : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
    else if constexpr (N == 64)
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HG_D32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                     : HG_ACC32
                     : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
    else
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " HG_D64 ", %64, %65, p, 1, 1, %67, %68;\n}\n"
                     : HG_ACC64
                     : "l"(a), "l"(b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
}
// d (64 x N fp32) (+)= A (64 x 16 bf16, registers: the m16n8k16 A fragment of each warp's 16 rows) *
// B (16 x N, smem): MN-major (transposed, TRANS_B = 1, as V in P V) or K-major (TRANS_B = 0);
// accumulate = 0 overwrites d.
template <int N, int TRANS_B = 1>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, int accumulate = 1) {
    static_assert(N == 64 || N == 128, "wgmma n");
    if constexpr (N == 64)
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " HG_D32
                     ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                     : HG_ACC32
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(TRANS_B));
    else
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " HG_D64
                     ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                     : HG_ACC64
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(TRANS_B));
}
#undef HG_D16
#undef HG_D32
#undef HG_D64
#undef HG_ACC8
#undef HG_ACC16
#undef HG_ACC32
#undef HG_ACC64

// Byte offset of element (r, c) inside a (R, HD) tile stored as 64-column panels of 128-byte rows,
// 16-byte chunks XOR-swizzled by r % 8 (what the TMA's 128B swizzle writes).
template <int R>
__device__ __forceinline__ uint32_t panel_offset(int r, int c) {
    return (c / 64) * R * 128 + r * 128 + ((((c % 64) >> 3) ^ (r & 7)) << 4) + (c & 7) * 2;
}

// TMA loads of a (R, HD) tile: rows t0.. of sequence b, columns col.., as HD/64 panels.
template <int R, int HD>
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap* map, int col, int t0, int b, uint32_t bar) {
#pragma unroll
    for (int p = 0; p < HD / 64; p++)
#pragma unroll
        for (int rb = 0; rb < R / 64; rb++) tma_load(dst + (p * R + rb * 64) * 128, map, col + p * 64, t0 + rb * 64, b, bar);
}

// Probabilities (S accumulator layout) -> bf16 A fragments of the P V wgmma, one per 16 keys.
template <int BKV>
__device__ __forceinline__ void pack_p(uint32_t (&p)[BKV / 16][4], const float (&s)[BKV / 2]) {
#pragma unroll
    for (int kk = 0; kk < BKV / 16; kk++) {
        p[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
        p[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        p[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        p[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
}
// Named barriers (0 is __syncthreads; each kernel's ids in its enum): two consumer warpgroups, 256
// threads, where one arrives and the other syncs, or both sync; or one warpgroup's 128 threads.
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_sync_warpgroup(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda): a tensor map of `rank`
// dims (dims[0] contiguous; strides in bytes of dims 1..; none for rank 1), out-of-bounds elements read
// as zeros.
inline CUtensorMap encode_tensor_map(CUtensorMapDataType type, int rank, const void* ptr, const cuuint64_t* dims,
                                     const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || !fn) fail("attention (Hopper): no cuTensorMapEncodeTiled in the driver");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }();
    CUtensorMap map;
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    const CUresult r = encode(&map, type, rank, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        fail("attention (Hopper): cuTensorMapEncodeTiled failed (%d): rank %d, dims %llu x %llu, box %u x %u", (int)r,
             rank, (unsigned long long)dims[0], rank > 1 ? (unsigned long long)dims[1] : 1ull, box[0], rank > 1 ? box[1] : 1u);
    return map;
}
// A tensor map over a (B, T, row) bf16 tensor (qkv, or out / dout): boxes of 64 columns x 64 rows,
// 128B swizzle, out-of-bounds rows (past T) read as zeros.
inline CUtensorMap token_rows_map(const bf16* ptr, int B, int T, int row) {
    const cuuint64_t dims[3] = {(cuuint64_t)row, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t strides[2] = {(cuuint64_t)row * 2, (cuuint64_t)T * row * 2};  // bytes, dims 1 and 2
    const cuuint32_t box[3] = {64, 64, 1};
    return encode_tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, ptr, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace attention_hopper_detail
#endif  // LLMC_SM90A
