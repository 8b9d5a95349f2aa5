// gelu.cu: the standalone GELU forward (llmc/gelu.cuh, used by --recompute) against
// cpu::gelu_forward (llmc/cpu/gelu.h). The trainer's usual GELU and its backward run inside the
// matmul epilogues and are checked by matmul.cu.
//   ./gelu [variant ...] [--check-only] [--reps N]
// Shapes: the MLP activation of GPT-2 124M, n = B*T*4C = 65536 * 3072, and the awkward 651 * 3104.
// Bytes: n in + n out. FLOPs: ~10 per element plus one tanh (counted as 10).
//
// Variants (H200, bf16, n = 201M, 2026-12-02, one run; % of the 4.0 TB/s copy):
//   0 shipped: gelu_forward_packed, 16-byte streaming loads, libdevice tanhf     0.197 ms, 102%
//   1 scalar: one element per thread, 2-byte loads                                0.540 ms, 37%
//   2 tanh.approx: shipped layout with the hardware tanh (MUFU, ~2^-11 rel)       0.197 ms, 102%
//     (no gain: the op is at the copy ceiling, the tanh is free; kept as the evidence)
#include "dev/cuda/harness.cuh"
#include "llmc/cpu/gelu.h"
#include "llmc/gelu.cuh"

static __global__ void gelu_forward_scalar(floatX* out, const floatX* inp, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_float<floatX>(gelu_tanh(to_float(inp[i])));
}

__device__ inline float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
static __global__ void gelu_forward_tanh_approx(floatX* out, const floatX* inp, int64_t n) {
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= n) return;
    const x128 x = load128cs(inp + i);
    x128 y;
    for (int k = 0; k < x128::size; k++) {
        const float v = to_float(x[k]);
        y[k] = from_float<floatX>(0.5f * v * (1.0f + tanh_approx(0.7978845608028654f * (v + 0.044715f * v * v * v))));
    }
    store128(out + i, y);
}

static void run_shape(lab::Lab& L, int64_t n) {
    const std::string shape = " n=" + std::to_string(n);
    std::vector<float> inp = lab::rand_uniform(n, 31, -4.0f, 4.0f);
    std::vector<float> ref(n);
    cpu::gelu_forward(ref.data(), inp.data(), n);
    lab::DevBuf<floatX> d_inp(n, "inp"), d_out(n, "out");
    d_inp.upload(inp);
    const double bytes = 2.0 * n * sizeof(floatX), flops = 20.0 * n;
    auto reset = [&] { d_out.poison(L.stream()); };
    auto check = [&] { return L.check(d_out, ref); };
    const int block = 256;
    L.run("gelu_forward" + shape, 0, "shipped", bytes, flops, lab::Bound::Memory, reset,
          [&] { gelu_forward(d_out, d_inp, n, L.stream()); }, check);
    L.run("gelu_forward" + shape, 1, "scalar", bytes, flops, lab::Bound::Memory, reset, [&] {
        gelu_forward_scalar<<<(unsigned)ceil_div<int64_t>(n, block), block, 0, L.stream()>>>(d_out, d_inp, n);
    }, check);
    // the hardware tanh is ~2^-11 relative: fine under bf16 rounding, not at the fp32 tolerance
    L.run("gelu_forward" + shape, 2, "tanh.approx", bytes, flops, lab::Bound::Memory, reset, [&] {
        gelu_forward_tanh_approx<<<(unsigned)ceil_div<int64_t>(n / x128::size, block), block, 0, L.stream()>>>(
            d_out, d_inp, n);
    }, [&] { return L.check(d_out, ref, lab::Tol{std::max(lab::default_tol().rel, 2e-3), std::max(lab::default_tol().abs, 1e-3)}); });
}

int main(int argc, char** argv) {
    lab::Lab L(argc, argv, "gelu.cu");
    run_shape(L, (int64_t)lab::GPT2_B * lab::GPT2_T * 4 * lab::GPT2_C);
    run_shape(L, (int64_t)lab::ODD_B * lab::ODD_T * 4 * 776);
    return L.finish();
}
