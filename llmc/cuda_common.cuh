// cuda_common.cuh: the one copy of the CUDA infrastructure every GPU file includes (the trainer,
// the GPU test, every dev/cuda lab file): error checking, the precision type floatX, 128-bit packed
// loads and stores, warp/block reductions, and the context struct passed to launchers.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

// ---------------------------------------------------------------- error checking
// Each names the failing statement, file and line, then exits 1.
inline void cuda_check_impl(cudaError_t err, const char* stmt, const char* file, int line) {
    if (err != cudaSuccess) {
        fprintf(stderr, "error: CUDA: %s\n  in %s at %s:%d\n", cudaGetErrorString(err), stmt, file, line);
        exit(1);
    }
}
#define cudaCheck(stmt) cuda_check_impl((stmt), #stmt, __FILE__, __LINE__)

inline void cublas_check_impl(cublasStatus_t st, const char* stmt, const char* file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "error: cuBLAS status %d (%s)\n  in %s at %s:%d\n", (int)st, cublasGetStatusString(st), stmt,
                file, line);
        exit(1);
    }
}
#define cublasCheck(stmt) cublas_check_impl((stmt), #stmt, __FILE__, __LINE__)

// Checks the last launch; use after every kernel launch.
#define cudaCheckLaunch() cuda_check_impl(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// ---------------------------------------------------------------- precision
// floatX is the type of parameters, activations and their gradients. Master weights, optimizer
// state, reductions and softmax statistics are always fp32.
#if defined(PRECISION_FP32)
typedef float floatX;
#define PRECISION_NAME "fp32"
constexpr cudaDataType_t CUBLAS_FLOATX = CUDA_R_32F;
#else
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16"
constexpr cudaDataType_t CUBLAS_FLOATX = CUDA_R_16BF;
#endif

template <typename T>
__host__ __device__ inline float to_float(T x) { return (float)x; }
template <>
__host__ __device__ inline float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__host__ __device__ inline T from_float(float x) { return (T)x; }
template <>
__host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// ---------------------------------------------------------------- sizes
template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }

constexpr int WARP_SIZE = 32;

// Threads an SM holds at once on the architecture a device pass compiles for (the host pass sees
// 2048). __launch_bounds__ asks for sm_blocks(threads, blocks) blocks an SM: the wanted count where it
// fits, else as many as fit (ptxas ignores a larger hint with a warning).
#if defined(__CUDA_ARCH__) && \
    (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 890 || __CUDA_ARCH__ >= 1200)
constexpr int SM_MAX_THREADS = 1536;
#else
constexpr int SM_MAX_THREADS = 2048;
#endif
__host__ __device__ constexpr int sm_blocks(int threads, int blocks) {
    return blocks * threads <= SM_MAX_THREADS ? blocks : SM_MAX_THREADS / threads;
}

// ---------------------------------------------------------------- 128-bit packed access
// One 16-byte load/store moves 8 bf16 or 4 fp32 values; memory-bound kernels use these so every
// thread issues full-width transactions. Pointers must be 16-byte aligned.
template <typename T>
struct alignas(16) Packed128 {
    static constexpr int size = 16 / sizeof(T);
    T v[size];
    Packed128() = default;
    __device__ static Packed128 constant(T x) {
        Packed128 p;
        for (int i = 0; i < size; i++) p.v[i] = x;
        return p;
    }
    __device__ T& operator[](int i) { return v[i]; }
    __device__ const T& operator[](int i) const { return v[i]; }
};
typedef Packed128<floatX> x128;
typedef Packed128<float> f128;

template <typename T>
__device__ inline Packed128<T> load128(const T* p) { return *reinterpret_cast<const Packed128<T>*>(p); }
// Streaming load: bypasses L1 and marks the line evict-first (data read once).
template <typename T>
__device__ inline Packed128<T> load128cs(const T* p) {
    int4 r = __ldcs(reinterpret_cast<const int4*>(p));
    return *reinterpret_cast<Packed128<T>*>(&r);
}
// L2 load: bypasses L1, so it sees what other blocks of the same kernel wrote before a grid barrier.
template <typename T>
__device__ inline Packed128<T> load128cg(const T* p) {
    int4 r = __ldcg(reinterpret_cast<const int4*>(p));
    return *reinterpret_cast<Packed128<T>*>(&r);
}
template <typename T>
__device__ inline void store128(T* p, const Packed128<T>& x) { *reinterpret_cast<Packed128<T>*>(p) = x; }
template <typename T>
__device__ inline void store128cs(T* p, const Packed128<T>& x) {
    __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(&x));
}

// ---------------------------------------------------------------- reductions
__device__ inline float warp_reduce_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ inline float warp_reduce_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
// Over the whole block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
template <float (*WARP_REDUCE)(float)>
__device__ inline float block_reduce(float x, float identity) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, nwarps = blockDim.x / WARP_SIZE;
    x = WARP_REDUCE(x);
    __syncthreads();  // partial may still be read by a previous call
    if (lane == 0) partial[warp] = x;
    __syncthreads();
    x = lane < nwarps ? partial[lane] : identity;
    return WARP_REDUCE(x);
}
__device__ inline float block_reduce_sum(float x) { return block_reduce<warp_reduce_sum>(x, 0.0f); }
__device__ inline float block_reduce_max(float x) { return block_reduce<warp_reduce_max>(x, -INFINITY); }

// ---------------------------------------------------------------- programmatic dependent launch
// A kernel launched with launch_kernel(..., pdl = true) may start while the kernel before it is still
// running: its blocks become resident and do what needs nothing of earlier kernels (the GEMVs prefetch
// weights), then pdl_wait() blocks until the previous grid has finished and its writes are visible;
// pdl_launch_dependents() lets the next kernel start. The decode step (model_infer.cuh) calls wait, then
// launch_dependents, at the top of every kernel: as every kernel waits, everything before kernel N is
// complete when N's wait returns; as a kernel triggers only after its wait, at most two grids are live
// (the next one fills only the slots the running one leaves): no deadlock. No-ops in a plain launch and
// below sm_90.
__device__ inline void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ inline void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ inline void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// ---------------------------------------------------------------- shared memory, async copies, mma.sync (sm_80)
// The building blocks of the tensor-core kernels (the attention kernels, the decode attention): the
// shared-window address of a pointer (what cp.async, ldmatrix, mbarriers and TMA take), cp.async
// copies global -> shared, ldmatrix, the bf16 m16n8k16 mma, and fp32 vector reductions.
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
inline bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

// 16-byte async copy global -> shared; zero-fills when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
// 4-byte async copy global -> shared (no alignment past 4 bytes); zero-fills when !valid.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const __nv_bfloat16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const __nv_bfloat16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
// c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col)
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats as a bf16 pair, the first in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
// dst[0..1] += {a, b} in global memory, one reduction (8-byte aligned); vector reductions need
// sm_90, older GPUs take two scalar atomics.
__device__ __forceinline__ void red_add_v2(float* dst, float a, float b) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(dst, a);
    atomicAdd(dst + 1, b);
#endif
}
// Raises a kernel's dynamic shared-memory limit to `bytes` (past the default 48 KB; the attribute holds
// for the process). Launchers call it through CudaContext::allow_smem, which does it once a kernel.
template <typename Kernel>
inline void allow_smem(Kernel kernel, int bytes) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// ---------------------------------------------------------------- mbarriers and bulk copies (sm_90)
// mbarriers with transaction counts, on which the copy engine's bulk copies into shared memory
// complete (the Hopper attention kernels' tma_load, the FP8 classifier's rows in shared memory).
// Addresses are shared-window ones (__cvta_generic_to_shared). The instructions exist from sm_90 on: a
// kernel compiled for older GPUs too guards its calls with LLMC_HAS_BULK_COPY (ptxas refuses them).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define LLMC_HAS_BULK_COPY 1
#else
#define LLMC_HAS_BULK_COPY 0
#endif
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also announces `bytes` to come from the copy engine.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed (a fresh barrier counts parity 1 as done).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
// `bytes` contiguous bytes from global memory into smem by the copy engine, completing on `bar`;
// both addresses 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// ---------------------------------------------------------------- architecture policy
// One binary may hold machine code for several GPUs (build.mk: GPU_ARCH=all or a list), so the host
// picks kernels at run time: device code is guarded by __CUDA_ARCH__ (and __CUDA_ARCH_FEAT_SM90_ALL
// for sm_90a), and the host asks these functions which code the current device runs.
// LLMC_PORTABLE=1 in the environment: run the portable path on any GPU, what an sm_80-89 GPU runs (the
// mma.sync attention, no thread-block clusters, no programmatic dependent launch, no bulk copies), so
// that a Hopper GPU tests it. The kernels stay this build's machine code: their own __CUDA_ARCH__
// branches are not forced (a GPU_ARCH=80 GPU_ARCH_PTX=80 build is the whole Ampere binary).
inline bool portable_forced() {
    static const bool on = [] {
        const char* e = getenv("LLMC_PORTABLE");
        return e != nullptr && strcmp(e, "1") == 0;
    }();
    return on;
}
// Whether the Hopper kernels (wgmma, setmaxnreg, TMA tensor copies: llmc/attention_hopper*.cuh) run on
// a device of compute capability major.minor: the build has their sm_90a machine code (LLMC_SM90A:
// GPU_ARCH holds 90a) and the device is 9.0, for which the driver loads that code. Else the portable kernels.
inline bool device_runs_sm90a(int major, int minor) {
#if defined(LLMC_SM90A)
    return major == 9 && minor == 0 && !portable_forced();
#else
    (void)major, (void)minor;
    return false;
#endif
}
// The __CUDA_ARCH__ / 10 (80, 90, ...) that the current device's code of `kernel` was compiled for:
// the device's own architecture where the build has its SASS, an older one where the driver runs the
// SASS of an older minor version or JIT-compiles older PTX (a compute_80 build on an H100). Code that a
// kernel guards with __CUDA_ARCH__ >= 900 runs where this is >= 90 (cub's PtxVersion asks the same).
// Under LLMC_PORTABLE=1 at most 80, so every choice made from it takes the portable path.
template <typename... KArgs>
inline int kernel_code_arch(void (*kernel)(KArgs...)) {
    cudaFuncAttributes attr{};
    cudaCheck(cudaFuncGetAttributes(&attr, kernel));
    return portable_forced() && attr.ptxVersion > 80 ? 80 : attr.ptxVersion;
}
// The same for every kernel of this program: a build's kernels share one set of architectures.
static __global__ void code_arch_probe_kernel() {}
inline int device_code_arch() {
    static const int arch = kernel_code_arch(code_arch_probe_kernel);
    return arch;
}


// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization attribute when
// pdl (the kernel must call pdl_wait() before it reads what earlier kernels wrote) and the code that
// runs was compiled for sm_90 or newer: below it pdl_wait() is compiled out, so the launch is plain.
template <typename... KArgs, typename... Args>
inline void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                          Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl && device_code_arch() >= 90 ? 1 : 0;
    cudaCheck(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// The SMs of the current device.
inline int current_sm_count() {
    int dev = 0, sms = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
}

// ---------------------------------------------------------------- context
// One per process: the stream every launch goes to, the cuBLASLt handle and its workspace, and
// the device's properties. Passed explicitly, never global. matmul_algos: generate's cache of tuned
// cuBLASLt algorithms (llmc/matmul.cuh; nullptr, the trainer's: the heuristic's pick).
// allow_smem raises a kernel's shared-memory limit the first time a launcher asks (each launcher of a
// kernel past 48 KB asks before each launch; lazily, as the kernels that run depend on build, device
// and shapes). The record is `mutable`: it mirrors the device's state, so launchers take a const context.
struct MatmulAlgoCache;
struct CudaContext {
    cudaStream_t stream = nullptr;
    cublasLtHandle_t cublaslt = nullptr;
    void* cublaslt_workspace = nullptr;
    size_t cublaslt_workspace_size = 32u << 20;
    MatmulAlgoCache* matmul_algos = nullptr;  // owned by the caller
    cudaDeviceProp props{};
    int sm_count = 0;         // streaming multiprocessors (the persistent grids' size)
    bool runs_sm90a = false;  // device_runs_sm90a: the Hopper kernels (wgmma, TMA) run here
    int code_arch = 0;        // device_code_arch(): the architecture this program's kernels run as here

    void init(int dev = 0) {
        cudaCheck(cudaSetDevice(dev));
        cudaCheck(cudaGetDeviceProperties(&props, dev));
        sm_count = props.multiProcessorCount;
        runs_sm90a = device_runs_sm90a(props.major, props.minor);
        code_arch = device_code_arch();  // cached now: launch_kernel asks it, and graph captures come later
        cudaCheck(cudaStreamCreate(&stream));
        cublasCheck(cublasLtCreate(&cublaslt));
        cudaCheck(cudaMalloc(&cublaslt_workspace, cublaslt_workspace_size));
    }
    void destroy() {
        if (cublaslt_workspace) cudaCheck(cudaFree(cublaslt_workspace));
        if (cublaslt) cublasCheck(cublasLtDestroy(cublaslt));
        if (stream) cudaCheck(cudaStreamDestroy(stream));
        cublaslt_workspace = nullptr; cublaslt = nullptr; stream = nullptr;
    }
    // ::allow_smem(kernel, bytes) unless this context already raised the kernel's limit that far.
    template <typename... KArgs>
    void allow_smem(void (*kernel)(KArgs...), int bytes) const {
        const void* k = reinterpret_cast<const void*>(kernel);
        for (const SmemLimit& r : smem_raised)
            if (r.kernel == k && r.bytes >= bytes) return;
        ::allow_smem(kernel, bytes);
        smem_raised.push_back({k, bytes});
    }
    // cudaOccupancyMaxActiveBlocksPerMultiprocessor(kernel, threads, smem), asked once for each triple
    // (at a size's first launch, the uncaptured warm-up step, never inside a graph capture).
    template <typename... KArgs>
    int blocks_per_sm(void (*kernel)(KArgs...), int threads, size_t smem) const {
        const void* k = reinterpret_cast<const void*>(kernel);
        for (const Occupancy& o : occupancy)
            if (o.kernel == k && o.threads == threads && o.smem == smem) return o.blocks;
        int blocks = 0;
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem));
        occupancy.push_back({k, threads, smem, blocks});
        return blocks;
    }

  private:
    struct SmemLimit {
        const void* kernel;
        int bytes;
    };
    struct Occupancy {
        const void* kernel;
        int threads;
        size_t smem;
        int blocks;
    };
    mutable std::vector<SmemLimit> smem_raised;  // a handful of kernels: a linear search
    mutable std::vector<Occupancy> occupancy;
};

// The kernel path ctx's device runs, for the programs' startup line.
inline const char* kernel_path_name(const CudaContext& ctx) {
    if (ctx.runs_sm90a) return "Hopper kernels (sm_90a: wgmma, TMA, clusters, PDL)";
    return portable_forced() ? "portable kernels (LLMC_PORTABLE=1)" : "portable kernels (mma.sync)";
}

// ---------------------------------------------------------------- deterministic column sums
#include <algorithm>
// Parameter gradients of biases and LayerNorm are sums over all N = B*T rows of a (N, C) matrix.
// Atomics would make them depend on scheduling (and break bit-exact resume), so they are summed in
// two fixed-order stages: a kernel of the op writes fp32 partial sums of row chunks, (chunks, C) at
// a row stride, and column_partials_add folds the chunks in order and adds (+=) into the gradient.
constexpr int COLUMN_MAX_CHUNKS = 512;  // 128 rows per chunk at B*T = 65536: enough blocks to fill 132 SMs
constexpr int COLUMN_MIN_ROWS = 32;     // fewer rows per chunk would make stage 2 the larger cost
inline int column_num_chunks(int N) { return std::min(COLUMN_MAX_CHUNKS, ceil_div(N, COLUMN_MIN_ROWS)); }

// Block (32 columns, 8 chunk lanes): lane y sums chunks y, y+8, ... in order, then lane 0 adds the
// 8 lane sums in order. Reads chunks*C floats (~3 MB for C = 768): a few microseconds. blockIdx.y = 1
// (column_partials_add2) folds a second set of partials, `second` floats further, into out2.
template <typename T>
static __global__ void column_partials_add_kernel(T* out, T* out2, const float* partials, int64_t second, int chunks,
                                                  int64_t stride, int C) {
    __shared__ float lane_sum[8][32];
    if (blockIdx.y == 1) {
        out = out2;
        partials += second;
    }
    const int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < C)
        for (int k = threadIdx.y; k < chunks; k += 8) s += partials[k * stride + c];
    lane_sum[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float total = 0.0f;
        for (int y = 0; y < 8; y++) total += lane_sum[y][threadIdx.x];
        out[c] = from_float<T>(to_float(out[c]) + total);
    }
}

// out[c] += sum_k partials[k * stride + c] for c < C.
template <typename T>
inline void column_partials_add(T* out, const float* partials, int chunks, int64_t stride, int C, cudaStream_t stream) {
    column_partials_add_kernel<<<ceil_div(C, 32), dim3(32, 8), 0, stream>>>(out, out, partials, 0, chunks, stride, C);
    cudaCheckLaunch();
}
// Two folds in one launch (the norm backwards' dweight and dbias): out[c] as column_partials_add, and
// out2[c] += sum_k partials[second + k * stride + c]; the same order, the same bits as two calls.
template <typename T>
inline void column_partials_add2(T* out, T* out2, const float* partials, int64_t second, int chunks, int64_t stride,
                                 int C, cudaStream_t stream) {
    column_partials_add_kernel<<<dim3(ceil_div(C, 32), 2), dim3(32, 8), 0, stream>>>(out, out2, partials, second,
                                                                                   chunks, stride, C);
    cudaCheckLaunch();
}

// The norm forwards' launch at a decode step's few rows (llmc/layernorm.cuh, llmc/rmsnorm.cuh):
// block_per_row: up to NORM_ROW_MAX_M rows, a block per row of C / x128::size threads (rounded up to
// a warp; <= 1024), one 16-byte pack a thread held in registers: one read of the row instead of the
// large-M kernel's three (a warp per row). pdl: launched as a programmatic dependent (it loads the
// norm's weight and bias before pdl_wait). More or wider rows take the large-M kernel (plain).
constexpr int NORM_ROW_MAX_M = 256;
struct NormLaunch {
    bool block_per_row = false;
    bool pdl = false;
};
inline bool norm_block_per_row_fits(int N, int C) { return N <= NORM_ROW_MAX_M && C / x128::size <= 1024; }
inline int norm_block_per_row_threads(int C) { return ceil_div(C / x128::size, WARP_SIZE) * WARP_SIZE; }

// The fused norm backwards (llmc/rmsnorm.cuh, llmc/layernorm.cuh) share one plan: blocks of 8 warps,
// each over one chunk of consecutive rows, whose (chunks, C) weight partials column_partials_add
// folds; rows up to NORM_BWD_MAX_C wide (wider ones take each op's two-kernel path). Two regimes:
//  - narrow, up to NORM_BWD_REG_PACKS packs per lane (C <= 1024): each lane's weight-gradient sums in
//    registers (128 at 2 blocks per SM); at most NORM_BWD_MAX_CHUNKS = 256 chunks (one wave on 132 SMs).
//  - wide (bf16 only: 1024 < C <= 2048): the row in flight alone takes ~128 registers, so the sums move
//    to dynamic shared memory (each lane its own slots, the same order of additions) at
//    norm_backward_min_blocks (1) block per SM (255 registers), at most blocks x NORM_BWD_WIDE_CHUNKS =
//    132 chunks (one wave on the H200; a constant, so the sums' order does not depend on the GPU).
// Either way at least COLUMN_MIN_ROWS rows a chunk, so the chunks fit the scratch of column_num_chunks(N).
constexpr int NORM_BWD_BLOCK = 256;
constexpr int NORM_BWD_WARPS = NORM_BWD_BLOCK / WARP_SIZE;
constexpr int NORM_BWD_REG_PACKS = 1024 / (WARP_SIZE * x128::size);          // 4 bf16, 8 fp32
constexpr int NORM_BWD_MAX_PACKS = x128::size == 8 ? 2 * NORM_BWD_REG_PACKS : NORM_BWD_REG_PACKS;  // 8 bf16, 8 fp32
constexpr int NORM_BWD_MAX_C = NORM_BWD_MAX_PACKS * WARP_SIZE * x128::size;  // 2048 bf16, 1024 fp32
constexpr int NORM_BWD_MAX_CHUNKS = 256;
constexpr int NORM_BWD_WIDE_CHUNKS = 132;
inline int norm_backward_chunks(int N) { return std::min(NORM_BWD_MAX_CHUNKS, ceil_div(N, COLUMN_MIN_ROWS)); }
// One row's loads of the fused norm backwards: the lane's packs of dout, inp and dinp at row offset
// base. Unconditional: a pack past C reads the row's last pack (the caller adds it as zeros).
template <int PACKS>
__device__ __forceinline__ void norm_backward_load_row(x128 (&d)[PACKS], x128 (&x)[PACKS], x128 (&di)[PACKS],
                                                       const floatX* dout, const floatX* inp, const floatX* dinp,
                                                       int64_t base, int C, int lane) {
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        const int64_t at = base + min((p * WARP_SIZE + lane) * x128::size, C - x128::size);
        d[p] = load128cs(dout + at);
        x[p] = load128cs(inp + at);
        di[p] = load128cs(dinp + at);
    }
}
inline int norm_backward_chunks_wide(int N, int blocks_per_sm = 1) {
    return std::min(blocks_per_sm * NORM_BWD_WIDE_CHUNKS, ceil_div(N, COLUMN_MIN_ROWS));
}
// the wide regime's packs: sums in shared memory, 1 block per SM
template <int PACKS>
__host__ __device__ constexpr bool norm_backward_wide() { return PACKS > NORM_BWD_REG_PACKS; }
template <int PACKS>
__host__ __device__ constexpr int norm_backward_min_blocks() { return norm_backward_wide<PACKS>() ? 1 : 2; }
// The wide regime's shared memory: SUMS column sums (2 LayerNorm, 1 RMSNorm) of C floats per warp.
// Past the default 48 KB (C > 768 with 2 sums), so the launchers opt in, once per kernel, to the
// most any C <= NORM_BWD_MAX_C needs (128 KB for LayerNorm: 1 block per SM fits in 227 KB).
inline size_t norm_backward_smem(int sums, int C) { return (size_t)NORM_BWD_WARPS * sums * C * sizeof(float); }
// Calls f(std::integral_constant<int, PACKS>) with the packs per lane the fused backwards take for
// rows of C <= NORM_BWD_MAX_C: narrow, rounded up to a quarter of NORM_BWD_REG_PACKS (1..4 bf16;
// 2, 4, 6, 8 fp32); wide (bf16), the exact count, 5..8 (C = 1280: 5, C = 1600: 7).
template <typename F>
inline void norm_backward_dispatch(int C, F&& f) {
    constexpr int Q = NORM_BWD_REG_PACKS / 4;
    const int packs = ceil_div(ceil_div(C, x128::size), WARP_SIZE);
    if (packs <= 1 * Q) f(std::integral_constant<int, 1 * Q>{});
    else if (packs <= 2 * Q) f(std::integral_constant<int, 2 * Q>{});
    else if (packs <= 3 * Q) f(std::integral_constant<int, 3 * Q>{});
    else if (packs <= 4 * Q) f(std::integral_constant<int, 4 * Q>{});
    else if constexpr (NORM_BWD_MAX_PACKS == 8 && NORM_BWD_REG_PACKS == 4) {
        if (packs == 5) f(std::integral_constant<int, 5>{});
        else if (packs == 6) f(std::integral_constant<int, 6>{});
        else if (packs == 7) f(std::integral_constant<int, 7>{});
        else f(std::integral_constant<int, 8>{});
    }
}
