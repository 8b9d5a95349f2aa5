// adamw.cu: the fused AdamW step over the whole parameter buffer (llmc/adamw.cuh) against
// cpu::adamw_update_model (llmc/cpu/adamw.h, torch.optim.AdamW operation by operation).
//   ./adamw [variant ...] [--check-only] [--reps N]
// Shapes: GPT-2 124M's 124,475,904 parameters with its weight-decay ranges, and two awkward
// two-tensor layouts of 1,000,003 and 1,000,004 elements (decay on the first 600,001 only).
// Step 10, lr 6e-4, betas (0.9, 0.95), eps 1e-8, wd 0.1, clip factor 0.7 (grad_scale).
// Bytes per element: bf16 build reads g (2), m, v, master (12), writes m, v, master (12) and the
// bf16 params (2) = 28; fp32 build (master is params) reads 16, writes 12. FLOPs: ~15 per element.
// Checks: master (fp32) against the reference at ~1e-5; the bf16 params (stochastically rounded,
// up to 1 bf16 ulp off) at the bf16 tolerance; m and v at ~1e-5.
//
// Variants (H200, bf16, n = 124.5M, 2026-12-02, one run; % of the 4.0 TB/s copy):
//   0 shipped: adamw_fused<4>, 4 elements per thread, 16-byte loads of m, v, master (the
//     lab's packed4 until it was promoted; the launcher takes 1 element a thread where a slice is
//     not a multiple of 4 or not aligned: the awkward layout below)                   0.937 ms, 93%
//   1 scalar: adamw_fused<1>, one element per thread (shipped before)              1.094 ms, 80%
// Both round alike: same operation order, the same hash of the element index.
#include "dev/cuda/harness.cuh"
#include "llmc/adamw.cuh"
#include "llmc/cpu/adamw.h"

struct Layout {
    const char* name;
    int64_t n;
    std::vector<int64_t> sizes;  // tensor sizes, in order
    std::vector<bool> decays;    // per tensor
};

static void run_layout(lab::Lab& L, const Layout& lay) {
    const int64_t n = lay.n;
    const float lr = 6e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.7f;
    const int64_t step = 10;
    std::vector<float> master0 = lab::rand_uniform(n, 81, -0.05f, 0.05f);
    std::vector<float> grads = lab::rand_uniform(n, 82, -0.01f, 0.01f);
    std::vector<float> m0 = lab::rand_uniform(n, 83, -1e-3f, 1e-3f), v0 = lab::rand_uniform(n, 84, 0.0f, 1e-5f);

    // reference: one cpu::adamw_update per tensor, decay where the layout says
    std::vector<float> ref_p = master0, ref_m = m0, ref_v = v0;
    DecayRanges decay;
    int64_t off = 0;
    for (size_t t = 0; t < lay.sizes.size(); t++) {
        cpu::adamw_update(ref_p.data() + off, ref_m.data() + off, ref_v.data() + off, grads.data() + off, lay.sizes[t],
                          lr, b1, b2, eps, lay.decays[t] ? wd : 0.0f, grad_scale, step);
        if (lay.decays[t]) {
            decay.begin[decay.count] = off;
            decay.end[decay.count] = off + lay.sizes[t];
            decay.count++;
        }
        off += lay.sizes[t];
    }
    if (off != n) fail("adamw.cu: layout %s sums to %lld, not %lld", lay.name, (long long)off, (long long)n);
    const AdamWArgs host_args = adamw_args(lr, b1, b2, eps, wd, grad_scale, step, 85);
    lab::DevBuf<AdamWArgs> args(1, "args");  // the kernels read the step's scalars from device memory
    cudaCheck(cudaMemcpy(args.get(), &host_args, sizeof(AdamWArgs), cudaMemcpyHostToDevice));

    lab::DevBuf<floatX> d_params(n, "params"), d_grads(n, "grads");
    lab::DevBuf<float> d_master(n, "master"), d_m(n, "m"), d_v(n, "v");
    d_grads.upload(grads);
#if defined(PRECISION_FP32)
    float* master = d_params.get();  // the FP32 build keeps no separate master copy
#else
    float* master = d_master.get();
#endif
    const double bytes = 28.0 * n;
    auto reset = [&] {
        d_params.poison(L.stream());
        if (master == d_master.get()) d_master.upload(master0);
        else d_params.upload(master0);
        d_m.upload(m0);
        d_v.upload(v0);
    };
    const lab::Tol fp32_tol = {1e-5, 1e-5};
    auto check = [&] {
        bool ok = L.check(d_m, ref_m, fp32_tol);
        ok = L.check(d_v, ref_v, fp32_tol) && ok;
        if (master == d_master.get()) ok = L.check(d_master, ref_p, fp32_tol) && ok;
        return L.check(d_params, ref_p, master == d_master.get() ? lab::default_tol() : fp32_tol) && ok;
    };
    const std::string op = lab::Lab::strprintf("adamw %s n=%lld", lay.name, (long long)n);
    const int block = 512;
    L.run(op, 0, "shipped", bytes, 15.0 * n, lab::Bound::Memory, reset,
          [&] { adamw_update(d_params, master, d_grads, d_m, d_v, n, args.get(), decay, L.stream()); }, check);
    L.run(op, 1, "scalar", bytes, 15.0 * n, lab::Bound::Memory, reset, [&] {
        adamw_fused<1><<<(unsigned)ceil_div<int64_t>(n, block), block, 0, L.stream()>>>(d_params, master, d_grads, d_m,
                                                                                        d_v, 0, n, args.get(), decay);
    }, check);
}

int main(int argc, char** argv) {
    lab::Lab L(argc, argv, "adamw.cu");
    const ModelConfig cfg = model_config_from_descriptor("d12");
    size_t sizes[NUM_PARAM_TENSORS];
    model_param_sizes(cfg, sizes);
    Layout gpt2 = {"gpt2-124M", (int64_t)model_num_params(cfg), {}, {}};
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        gpt2.sizes.push_back((int64_t)sizes[i]);
        gpt2.decays.push_back(model_param_decays(i));
    }
    run_layout(L, gpt2);
    run_layout(L, {"awkward", 1000003, {600001, 400002}, {true, false}});        // 1 element a thread
    run_layout(L, {"awkward4", 1000004, {600001, 400003}, {true, false}});       // 4, a decay edge inside a 4

    return L.finish();
}
