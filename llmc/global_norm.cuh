// global_norm.cuh: the squared L2 norm of all parameter gradients (one contiguous floatX buffer),
// for clip_grad_norm_. Deterministic: a fixed grid writes one fp32 partial per block, and one block
// folds them in a fixed order, so the same gradients always give the same bits.
//   global_norm_squared  out[0] = sum_i grads[i]^2   (=), fp32 accumulation; scratch >= GLOBAL_NORM_BLOCKS floats
#pragma once
#include "llmc/cuda_common.cuh"

constexpr int GLOBAL_NORM_BLOCKS = 528;  // 4 per SM on an H200; fixed, never derived from the device
constexpr int GLOBAL_NORM_THREADS = 512;

// Grid-stride over 16-byte packs: reads n * sizeof(floatX) bytes once (0.25 GB for GPT-2 124M in
// bf16), 2 FLOPs per element: memory-bound. Measured: docs/perf.md, "Memory-bound kernels".
static __global__ void global_norm_partials(float* partials, const floatX* grads, int64_t n) {
    float s = 0.0f;
    const int64_t packs = n / x128::size, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < packs; p += stride) {
        const x128 g = load128cs(grads + p * x128::size);
        for (int k = 0; k < x128::size; k++) { const float v = to_float(g[k]); s += v * v; }
    }
    for (int64_t i = packs * x128::size + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = to_float(grads[i]);
        s += v * v;
    }
    s = block_reduce_sum(s);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

static __global__ void global_norm_finish(float* out, const float* partials, int count) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
    s = block_reduce_sum(s);
    if (threadIdx.x == 0) out[0] = s;
}

inline void global_norm_squared(float* out, float* scratch, const floatX* grads, int64_t n, cudaStream_t stream) {
    global_norm_partials<<<GLOBAL_NORM_BLOCKS, GLOBAL_NORM_THREADS, 0, stream>>>(scratch, grads, n);
    cudaCheckLaunch();
    global_norm_finish<<<1, 1024, 0, stream>>>(out, scratch, GLOBAL_NORM_BLOCKS);
    cudaCheckLaunch();
}
