// global_norm.cu: the squared global L2 norm of the gradients (llmc/global_norm.cuh) against
// cpu::global_norm_squared (llmc/cpu/global_norm.h, double accumulation).
//   ./global_norm [variant ...] [--check-only] [--reps N]
// Shapes: every gradient of GPT-2 124M, n = 124,475,904, and the awkward n = 1,000,003 (not a
// multiple of the 16-byte pack: exercises the tail loop). Bytes: n gradients read once. FLOPs: 2n.
//
// Variants (H200, bf16, n = 124.5M, 2026-12-02, one run; % of the 4.0 TB/s copy):
//   0 shipped: 528 blocks (4 per SM) x 512 threads of fp32 partials, folded by one block   0.072 ms, 86%
//   1 the shipped kernels with 1056 blocks (8 per SM)                                        0.072 ms, 87%
//   2 the shipped kernels with 264 blocks (2 per SM)                                         0.077 ms, 81%
// The grid is fixed, never derived from the device, so the bits do not change between GPUs; the
// variants ask whether 528 leaves bandwidth on the table.
#include "dev/cuda/harness.cuh"
#include "llmc/cpu/global_norm.h"
#include "llmc/model_config.h"
#include "llmc/global_norm.cuh"

static void run_shape(lab::Lab& L, int64_t n) {
    const std::string shape = " n=" + std::to_string(n);
    const std::vector<float> grads = lab::rand_uniform(n, 71, -0.01f, 0.01f);
    const std::vector<float> ref = {(float)cpu::global_norm_squared(grads.data(), n)};
    lab::DevBuf<floatX> d_grads(n, "grads");
    lab::DevBuf<float> d_out(1, "norm^2"), d_scratch(2 * GLOBAL_NORM_BLOCKS, "scratch");
    d_grads.upload(grads);
    // fp32 partial sums of ~500 squares per thread, then a tree: ~1e-6 relative in practice
    const lab::Tol tol = {2e-5, 0};
    const int grids[] = {GLOBAL_NORM_BLOCKS, 2 * GLOBAL_NORM_BLOCKS, GLOBAL_NORM_BLOCKS / 2};
    for (int variant = 0; variant < 3; variant++) {
        const char* what = variant == 0 ? "shipped" : variant == 1 ? "1056 blocks" : "264 blocks";
        L.run("global_norm_squared" + shape, variant, what, (double)n * sizeof(floatX), 2.0 * n, lab::Bound::Memory,
              [&] { d_out.poison(L.stream()); },
              [&] {
                  if (variant == 0) {
                      global_norm_squared(d_out, d_scratch, d_grads, n, L.stream());
                  } else {
                      global_norm_partials<<<grids[variant], GLOBAL_NORM_THREADS, 0, L.stream()>>>(d_scratch, d_grads,
                                                                                                   n);
                      global_norm_finish<<<1, 1024, 0, L.stream()>>>(d_out, d_scratch, grids[variant]);
                  }
              },
              [&] { return L.check(d_out, ref, tol); });
    }
}

int main(int argc, char** argv) {
    lab::Lab L(argc, argv, "global_norm.cu");
    const ModelConfig cfg = model_config_from_descriptor("d12");
    run_shape(L, (int64_t)model_num_params(cfg));
    run_shape(L, 1000003);
    return L.finish();
}
