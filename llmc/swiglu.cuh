// swiglu.cuh: the SwiGLU activation of Llama-family MLPs on the GPU, on the output of one fused
// gate/up matmul: mlp(x) = down(silu(gate(x)) * up(x)), silu(g) = g * sigmoid(g).
// Shapes: inp, dinp (N, 2H) floatX, each row [gate (H) | up (H)]; out, dout (N, H) floatX; N = B*T,
//   H the MLP hidden size (the layout against Hugging Face's gate_proj/up_proj: llmc/cpu/swiglu.h).
//   swiglu_forward   out = silu(gate) * up                                                (=)
//   swiglu_backward  dinp = [dout * up * silu'(gate) | dout * silu(gate)] from dout and inp (=)
//                    (written, not accumulated: dinp feeds the fused matmul's backward, which
//                    nothing else writes; cpu::swiglu_backward accumulates, so it is checked
//                    against the CPU op started from zeros)
// fp32 math with the hardware exp (--use_fast_math: ex2.approx, ~1e-7 relative at |g| < 10);
// sigmoid(g) = 1 / (1 + exp(-g)) stays exact at both tails (exp(-g) = inf gives 0). H must be a
// multiple of x128::size. Both kernels are memory-bound. Measured: docs/perf.md, "Memory-bound kernels".
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

__device__ inline float swiglu_sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// Thread = one 16-byte pack of output columns j..j+size-1 of one row: reads the gate pack at j and
// the up pack at H + j of the input row, writes one pack. Consecutive threads take consecutive packs
// of a row, so a warp reads two contiguous runs and writes one. DRAM: 2NH in, NH out
// (x sizeof(floatX)); ~6 FLOPs and one exp per output: memory-bound.
static __global__ void swiglu_forward_packed(floatX* out, const floatX* inp, int N, int H) {
    const int packs = H / x128::size;
    const unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;  // 32-bit: the launcher checks N * packs fits
    if (idx >= (unsigned)N * packs) return;
    const int64_t row = idx / packs;
    const int j = (int)(idx % packs) * x128::size;
    const floatX* gate = inp + row * 2 * H + j;
    const x128 g = load128cs(gate), u = load128cs(gate + H);
    x128 o;
    for (int k = 0; k < x128::size; k++) {
        const float gk = to_float(g[k]);
        o[k] = from_float<floatX>(gk * swiglu_sigmoid(gk) * to_float(u[k]));
    }
    store128(out + row * H + j, o);
}

// Thread = one pack of columns of one row, as the forward: reads dout's pack and the gate and up
// packs, writes the dgate and dup packs. With s = sigmoid(g): silu'(g) = s (1 + g (1 - s)).
// DRAM: 3NH in, 2NH out (x sizeof(floatX)): memory-bound.
static __global__ void swiglu_backward_packed(floatX* dinp, const floatX* dout, const floatX* inp, int N, int H) {
    const int packs = H / x128::size;
    const unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;  // 32-bit: the launcher checks N * packs fits
    if (idx >= (unsigned)N * packs) return;
    const int64_t row = idx / packs;
    const int j = (int)(idx % packs) * x128::size;
    const floatX* gate = inp + row * 2 * H + j;
    const x128 g = load128cs(gate), u = load128cs(gate + H), d = load128cs(dout + row * H + j);
    x128 dg, du;
    for (int k = 0; k < x128::size; k++) {
        const float gk = to_float(g[k]), dk = to_float(d[k]), s = swiglu_sigmoid(gk);
        dg[k] = from_float<floatX>(dk * to_float(u[k]) * s * (1.0f + gk * (1.0f - s)));
        du[k] = from_float<floatX>(dk * gk * s);
    }
    floatX* dgate = dinp + row * 2 * H + j;
    store128(dgate, dg);
    store128(dgate + H, du);
}

constexpr int SWIGLU_BLOCK = 256;
// Both kernels' grid, one thread per pack of the (N, H) output, once the shape is checked.
inline unsigned swiglu_grid(const char* what, int N, int H) {
    if (N <= 0 || H <= 0 || H % x128::size != 0)
        fail("%s: N = %d, H = %d: both must be positive and H a multiple of %d", what, N, H, x128::size);
    if ((int64_t)N * (H / x128::size) >= (1ll << 32)) fail("%s: N = %d, H = %d: too many packs for a 32-bit index", what, N, H);
    return (unsigned)ceil_div<int64_t>((int64_t)N * (H / x128::size), SWIGLU_BLOCK);
}

// out (N, H) = silu(inp[:, :H]) * inp[:, H:], inp (N, 2H).
inline void swiglu_forward(floatX* out, const floatX* inp, int N, int H, cudaStream_t stream) {
    swiglu_forward_packed<<<swiglu_grid("swiglu_forward", N, H), SWIGLU_BLOCK, 0, stream>>>(out, inp, N, H);
    cudaCheckLaunch();
}

// dinp (N, 2H) = the gradients of gate and up (=), from dout (N, H) and the forward's inp (N, 2H).
inline void swiglu_backward(floatX* dinp, const floatX* dout, const floatX* inp, int N, int H, cudaStream_t stream) {
    swiglu_backward_packed<<<swiglu_grid("swiglu_backward", N, H), SWIGLU_BLOCK, 0, stream>>>(dinp, dout, inp, N, H);
    cudaCheckLaunch();
}
