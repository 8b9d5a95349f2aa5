// swiglu.cu: the SwiGLU activation (llmc/swiglu.cuh), forward and backward, against
// cpu::swiglu_forward / cpu::swiglu_backward (llmc/cpu/swiglu.h; its += backward started from zeros,
// since the GPU backward writes dinp with =).
//   ./swiglu [variant ...] [--check-only] [--reps N]
// Shapes: the MLP of the 124M Llama-style model (N = B*T = 65536 rows, hidden H = 2048) and the
// awkward N = 651, H = 1000. Gate values in [-8, 8] (both sigmoid tails and silu's minimum at -1.28).
// Bytes counted: forward 2NH in + NH out; backward dout NH + inp 2NH in, dinp 2NH out.
// FLOPs: forward 6 per output (the exp counted as 1), backward 12.
//
// Variants (measured on the H200 at commit 5abe2b8: docs/perf.md, "Llama-family kernels"):
//   forward   0 shipped: swiglu_forward_packed, thread = one 16-byte output pack
//   forward   1 scalar: one output element per thread, 2-byte loads (baseline)
//   backward  0 shipped: swiglu_backward_packed, thread = one pack of dgate and of dup
//   backward  1 scalar: one column (dgate and dup element) per thread (baseline)
#include "dev/cuda/harness.cuh"
#include "llmc/cpu/swiglu.h"
#include "llmc/swiglu.cuh"

static __global__ void swiglu_forward_scalar(floatX* out, const floatX* inp, int N, int H) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)N * H) return;
    const int64_t row = idx / H, j = idx % H;
    const float g = to_float(inp[row * 2 * H + j]), u = to_float(inp[row * 2 * H + H + j]);
    out[idx] = from_float<floatX>(g * swiglu_sigmoid(g) * u);
}

static __global__ void swiglu_backward_scalar(floatX* dinp, const floatX* dout, const floatX* inp, int N, int H) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)N * H) return;
    const int64_t row = idx / H, j = idx % H;
    const float g = to_float(inp[row * 2 * H + j]), u = to_float(inp[row * 2 * H + H + j]), d = to_float(dout[idx]);
    const float s = swiglu_sigmoid(g);
    dinp[row * 2 * H + j] = from_float<floatX>(d * u * s * (1.0f + g * (1.0f - s)));
    dinp[row * 2 * H + H + j] = from_float<floatX>(d * g * s);
}

static void run_shape(lab::Lab& L, int N, int H) {
    const std::string shape = " N=" + std::to_string(N) + " H=" + std::to_string(H);
    const size_t NH = (size_t)N * H, s = sizeof(floatX);
    // inp (N, 2H): each row [gate | up]; gates in [-8, 8], ups in [-2, 2]
    std::vector<float> gate = lab::rand_uniform(NH, 61, -8.0f, 8.0f), up = lab::rand_uniform(NH, 62, -2.0f, 2.0f);
    std::vector<float> inp(2 * NH);
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++) {
            inp[(size_t)n * 2 * H + j] = gate[(size_t)n * H + j];
            inp[(size_t)n * 2 * H + H + j] = up[(size_t)n * H + j];
        }
    std::vector<float> dout = lab::rand_uniform(NH, 63);  // (N, H)
    std::vector<float> ref_out(NH), ref_dinp(2 * NH, 0.0f);
    cpu::swiglu_forward(ref_out.data(), inp.data(), N, H);
    cpu::swiglu_backward(ref_dinp.data(), dout.data(), inp.data(), N, H);

    lab::DevBuf<floatX> d_inp(2 * NH, "inp"), d_out(NH, "out"), d_dout(NH, "dout"), d_dinp(2 * NH, "dinp");
    d_inp.upload(inp);
    d_dout.upload(dout);
    const int block = 256;
    const unsigned scalar_blocks = (unsigned)ceil_div<int64_t>((int64_t)NH, block);

    const double fwd_bytes = 3.0 * NH * s, fwd_flops = 6.0 * NH;
    auto reset_fwd = [&] { d_out.poison(L.stream()); };
    auto check_fwd = [&] { return L.check(d_out, ref_out); };
    L.run("swiglu_forward" + shape, 0, "shipped", fwd_bytes, fwd_flops, lab::Bound::Memory, reset_fwd,
          [&] { swiglu_forward(d_out, d_inp, N, H, L.stream()); }, check_fwd);
    L.run("swiglu_forward" + shape, 1, "scalar", fwd_bytes, fwd_flops, lab::Bound::Memory, reset_fwd,
          [&] { swiglu_forward_scalar<<<scalar_blocks, block, 0, L.stream()>>>(d_out, d_inp, N, H); }, check_fwd);

    const double bwd_bytes = 5.0 * NH * s, bwd_flops = 12.0 * NH;
    auto reset_bwd = [&] { d_dinp.poison(L.stream()); };
    auto check_bwd = [&] { return L.check(d_dinp, ref_dinp); };
    L.run("swiglu_backward" + shape, 0, "shipped", bwd_bytes, bwd_flops, lab::Bound::Memory, reset_bwd,
          [&] { swiglu_backward(d_dinp, d_dout, d_inp, N, H, L.stream()); }, check_bwd);
    L.run("swiglu_backward" + shape, 1, "scalar", bwd_bytes, bwd_flops, lab::Bound::Memory, reset_bwd, [&] {
        swiglu_backward_scalar<<<scalar_blocks, block, 0, L.stream()>>>(d_dinp, d_dout, d_inp, N, H);
    }, check_bwd);
}

int main(int argc, char** argv) {
    lab::Lab L(argc, argv, "swiglu.cu");
    run_shape(L, lab::GPT2_B * lab::GPT2_T, 2048);
    run_shape(L, lab::ODD_B * lab::ODD_T, 1000);
    return L.finish();
}
