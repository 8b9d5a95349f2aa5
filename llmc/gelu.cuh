// gelu.cuh: GELU, tanh approximation (PyTorch's approximate="tanh"):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// The forward and its derivative normally run inside the matmul epilogues (matmul.cuh); this
// standalone forward serves --recompute, which keeps only the pre-activation of each layer and
// rebuilds the GELU output in the backward pass when the weight gradient of fcproj needs it.
// The FP8 path with separate casts (llmc/model_fp8.cuh) runs both standalone: its matmuls take no GELU epilogue.
//   gelu_forward           out (n) = gelu(inp) (=); n a multiple of x128::size
//   gelu_backward_inplace  d (n) = d * gelu'(pre) (=, in place): d(GELU output) -> d(pre-activation)
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

__device__ inline float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// One thread per 16-byte pack: reads and writes n * sizeof(floatX) bytes, ~10 FLOPs per element:
// memory-bound. Measured: docs/perf.md, "The kernel lab beside Triton and `torch.compile`".
static __global__ void gelu_forward_packed(floatX* out, const floatX* inp, int64_t n) {
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= n) return;
    const x128 x = load128cs(inp + i);
    x128 y;
    for (int k = 0; k < x128::size; k++) y[k] = from_float<floatX>(gelu_tanh(to_float(x[k])));
    store128(out + i, y);
}

inline void gelu_forward(floatX* out, const floatX* inp, int64_t n, cudaStream_t stream) {
    if (n % x128::size != 0) fail("gelu_forward: n = %lld is not a multiple of %d", (long long)n, x128::size);
    const int block = 256;
    gelu_forward_packed<<<(unsigned)ceil_div<int64_t>(n / x128::size, block), block, 0, stream>>>(out, inp, n);
    cudaCheckLaunch();
}

// d/dx of gelu_tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2), t = tanh(k (x + 0.044715 x^3)).
__device__ inline float gelu_tanh_grad(float x) {
    const float k = 0.7978845608028654f;
    const float t = tanhf(k * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x * x);
}

// One thread per 16-byte pack: reads 2n and writes n floatX, memory-bound like the forward.
static __global__ void gelu_backward_inplace_packed(floatX* d, const floatX* pre, int64_t n) {
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= n) return;
    const x128 x = load128cs(pre + i);
    x128 g = load128(d + i);
    for (int k = 0; k < x128::size; k++) g[k] = from_float<floatX>(to_float(g[k]) * gelu_tanh_grad(to_float(x[k])));
    store128(d + i, g);
}

inline void gelu_backward_inplace(floatX* d, const floatX* pre, int64_t n, cudaStream_t stream) {
    if (n % x128::size != 0) fail("gelu_backward_inplace: n = %lld is not a multiple of %d", (long long)n, x128::size);
    const int block = 256;
    gelu_backward_inplace_packed<<<(unsigned)ceil_div<int64_t>(n / x128::size, block), block, 0, stream>>>(d, pre, n);
    cudaCheckLaunch();
}
