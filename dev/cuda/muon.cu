// muon.cu: the Muon step of --optimizer muon (llmc/muon.cuh's muon_update: momentum, the Newton-Schulz
// iteration as batched cuBLASLt GEMMs, the update of the master weights) against cpu::muon_update
// (llmc/cpu/muon.h, torch.optim.Muon operation by operation), then its time against its floor.
//   ./muon [variant ...] [--check-only] [--reps N] [--step-ms X]
// Shapes: muon_build's groups of the cpu::muon_row_blocks matrices of four models:
//   gpt2:L2,C96,H3                   Q, K, V, attproj (96, 96); fc (384, 96); fcproj (96, 384)
//   llama:L2,C96,H6,KV2,F200,V1000   GQA: Q, attproj (96, 96), K, V (32, 96); SwiGLU gate, up (200, 96);
//                                    fcproj (96, 200); --muon-adjust-lr match_rms_adamw
//   d12 (GPT-2 124M)                 48 (768, 768), 12 (3072, 768), 12 (768, 3072)
//   llama-114m                       24 (768, 768), 24 (256, 768), 24 (2048, 768), 12 (768, 2048)
// The two small models check every matrix; the two large ones the first matrix of each shape (layer
// 0's), and their whole step is timed. Step: lr 0.02, momentum 0.95, wd 0.1, 5 Newton-Schulz steps,
// clip factor 0.7, a random momentum buffer (a later step), stochastic rounding of the bf16 params.
// Bytes per Muon element, the fewest a step moves: grads read, momentum and master read and written,
// bf16 params written: 2 + 8 + 8 + 2 = 20 (fp32 build: 4 + 8 + 8, master is params). FLOPs per (m, n)
// matrix, m = min(rows, cols): 5 (4 m^2 n + 2 m^3), the Newton-Schulz GEMMs.
// Checks:
//   buf     the momentum buffer, elementwise: the same fp32 operations as the CPU's (1e-6).
//   update  per matrix, w - w0 (1 - lr wd) (= -adjusted_lr O) against the CPU's by the relative
//           Frobenius norm of the difference. fp32 build: 1e-5 (two fp32 iterations whose products
//           sum in different orders, torch's and 256-deep slabs as the CPU's, differ by up to 2.1e-6 at
//           these shapes). bf16 build: 5e-2: the iteration in bf16 (torch's bf16 iteration is
//           1.0-1.7e-2 off its fp32 one at these shapes; elementwise up to 15% of the largest value on
//           decaying spectra); the CPU stands in for a fp32 GPU iteration, which the fp32 build ties
//           to it at 1e-5.
//   params  bf16 build: within one bf16 ulp of the GPU's master (stochastic rounding).
// The floor (large models, after the timing): the Newton-Schulz GEMMs alone at cuBLASLt's rate there
// (muon_build's GEMMs run as plain products, alpha 1 and beta 0, batched as muon_update batches them,
// ns_steps times) plus 20 bytes per element at the device's measured copy rate (cudaMemcpyAsync,
// read + write). The table: ms, floor ms, % of floor (floor / ms: 100% = at the floor), and the share
// of a training step of --step-ms X ms (default 114.6: the H100 bf16 d12 step at B=64 T=1024).
//
// Variants: 0 shipped (muon_update).
#include <cstdlib>
#include "dev/cuda/harness.cuh"
#include "llmc/cpu/muon.h"
#include "llmc/muon.cuh"

namespace {
constexpr float LR = 0.02f, MOMENTUM = 0.95f, WD = 0.1f, GRAD_SCALE = 0.7f;
constexpr int NS_STEPS = 5;
constexpr double BYTES_PER_ELEMENT = 20.0;

struct Row {  // a large model's timing, for the floor table
    std::string model;
    size_t matrices;
    double ms, gemm_ms, elems, flops;
};

double ns_flops(int rows, int cols) {
    const double m = std::min(rows, cols), n = std::max(rows, cols);
    return NS_STEPS * (4 * m * m * n + 2 * m * m * m);
}

// muon_update's Newton-Schulz GEMMs alone, on its scratch as left by a step: each group's planned
// GEMMs as plain products, ns_steps times a chunk, the iterate not fed back (the values stay bounded).
void ns_gemms(const Muon& mu, const CudaContext& ctx) {
    using muon_detail::run_gemm;
    for (const MuonGroup& g : mu.groups) {
        MuonGemm gram = g.gram, update = g.update, iterate = g.iterate;
        for (MuonGemm* p : {&gram, &update, &iterate}) p->alpha = 1.0f, p->beta = 0.0f;
        for (int first = 0; first < g.count; first += g.chunk)
            for (int s = 0; s < mu.ns_steps; s++) {
                run_gemm(gram, mu.a, mu.x, mu.x, mu.a, ctx);
                run_gemm(update, mu.b, mu.a, mu.a, mu.b, ctx);
                if (g.rows > g.cols) run_gemm(iterate, mu.y, mu.b, mu.x, mu.y, ctx);
                else run_gemm(iterate, mu.y, mu.x, mu.b, mu.y, ctx);
            }
    }
}

void run_model(lab::Lab& L, const char* desc, bool small, bool match_rms, std::vector<Row>& rows) {
    const ModelConfig cfg = model_config_from_descriptor(desc);
    const int64_t n = (int64_t)model_num_params(cfg);
    OptimizerSettings o{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    o.optimizer = OPTIMIZER_MUON;
    o.muon_lr = LR, o.muon_momentum = MOMENTUM, o.muon_weight_decay = WD, o.muon_ns_steps = NS_STEPS;
    o.muon_match_rms_adamw = match_rms;
    cpu::MuonSettings s;
    s.lr = LR, s.momentum = MOMENTUM, s.weight_decay = WD, s.ns_steps = NS_STEPS;
    s.adjust_lr = match_rms ? cpu::MuonAdjustLr::MATCH_RMS_ADAMW : cpu::MuonAdjustLr::ORIGINAL;
    Muon mu;
    muon_build(mu, cfg, L.ctx);
    muon_set_args(mu, o);
    const AdamWArgs host_args = adamw_args(6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, GRAD_SCALE, 10, 94);  // clip, seed
    lab::DevBuf<AdamWArgs> args(1, "args");
    cudaCheck(cudaMemcpy(args.get(), &host_args, sizeof(AdamWArgs), cudaMemcpyHostToDevice));

    const std::vector<float> w0 = lab::rand_uniform(n, 91, -0.02f, 0.02f);
    const std::vector<float> grads = lab::rand_uniform(n, 92, -0.01f, 0.01f);
    const std::vector<float> buf0 = lab::rand_uniform(n, 93, -0.01f, 0.01f);
    const std::vector<cpu::MuonMatrix> all = cpu::muon_matrices(cfg);
    std::vector<cpu::MuonMatrix> checked;  // every matrix, or the first of each shape
    double elems = 0, flops = 0;
    for (const cpu::MuonMatrix& x : all) {
        elems += (double)x.size(), flops += ns_flops(x.rows, x.cols);
        auto same = [&](const cpu::MuonMatrix& y) { return y.rows == x.rows && y.cols == x.cols; };
        if (small || std::none_of(checked.begin(), checked.end(), same)) checked.push_back(x);
    }
    // the checked matrices' values, concatenated in `checked` order
    auto gather = [&](const std::function<std::vector<float>(size_t, size_t)>& slice) {
        std::vector<float> v;
        for (const cpu::MuonMatrix& x : checked) {
            const std::vector<float> part = slice(x.offset, x.size());
            v.insert(v.end(), part.begin(), part.end());
        }
        return v;
    };
    auto host = [](const std::vector<float>& h) {
        return [&h](size_t at, size_t count) { return std::vector<float>(h.begin() + at, h.begin() + at + count); };
    };
    const std::vector<float> w_start = gather(host(w0));
    std::vector<float> ref_w = w_start, ref_buf = gather(host(buf0));
    {
        std::vector<float> scratch(cpu::muon_scratch_floats(checked));
        size_t at = 0;
        for (const cpu::MuonMatrix& x : checked) {
            cpu::muon_update(ref_w.data() + at, grads.data() + x.offset, ref_buf.data() + at, x.rows, x.cols, s,
                             GRAD_SCALE, scratch.data());
            at += x.size();
        }
    }

    lab::DevBuf<floatX> d_params(n, "params"), d_grads(n, "grads");
    lab::DevBuf<float> d_master(HAS_MASTER ? n : 1, "master"), d_buf(n, "buf");
    float* master = HAS_MASTER ? d_master.get() : reinterpret_cast<float*>(d_params.get());  // fp32: params
    d_grads.upload(grads);
    auto reset = [&] {
        d_params.upload(w0);
        if (HAS_MASTER) d_master.upload(w0);
        d_buf.upload(buf0);
    };
    const float decay = (float)(1.0 - (double)LR * WD);  // muon_set_args's and the CPU's
    const double bound = HAS_MASTER ? 5e-2 : 1e-5;
    auto check = [&] {
        cudaCheck(cudaDeviceSynchronize());
        const std::vector<float> got_w = gather([&](size_t at, size_t count) {
            return HAS_MASTER ? d_master.download(at, count) : d_params.download(at, count);
        });
        bool ok = L.compare("buf", gather([&](size_t at, size_t count) { return d_buf.download(at, count); }), ref_buf,
                            {1e-6, 1e-6});
        if (HAS_MASTER)
            ok = L.compare("params", gather([&](size_t at, size_t count) { return d_params.download(at, count); }),
                           got_w, {1.0 / 128, 0}) && ok;
        double worst = 0;
        size_t worst_k = 0, at = 0, bad = 0;
        for (size_t k = 0; k < checked.size(); k++) {
            double err = 0, norm = 0;
            for (size_t i = at; i < at + checked[k].size(); i++) {
                const float kept = w_start[i] * decay;
                const double want = (double)ref_w[i] - kept, got = (double)got_w[i] - kept;
                err += (got - want) * (got - want), norm += want * want;
            }
            err = std::sqrt(err / norm);
            if (!(err <= bound)) bad++;
            if (std::isnan(err) || err > worst) worst = err, worst_k = k;
            at += checked[k].size();
        }
        const cpu::MuonMatrix& w = checked[worst_k];
        printf("    %-10s worst relative Frobenius error %.2e (bound %.0e) of %zu matrices, at %dx%d (offset %zu)"
               "  %s\n", "update", worst, bound, checked.size(), w.rows, w.cols, w.offset, bad ? "FAIL" : "ok");
        return ok && bad == 0;
    };
    const std::string op = lab::Lab::strprintf("muon_step %s (%zu matrices)", desc, all.size());
    L.run(op, 0, "shipped", BYTES_PER_ELEMENT * elems, flops, lab::Bound::Compute, reset,
          [&] { muon_update(d_params, master, d_grads, d_buf, mu, args.get(), L.ctx); }, check);
    if (!small && L.last_ms() > 0)
        rows.push_back({desc, all.size(), L.last_ms(), L.time_median_ms([&] { ns_gemms(mu, L.ctx); }), elems, flops});
    muon_free(mu);
}

void print_floor(lab::Lab& L, const std::vector<Row>& rows, double step_ms) {
    const size_t bytes = 512u << 20;
    lab::DevBuf<char> src(bytes, "copy source"), dst(bytes, "copy destination");
    cudaCheck(cudaMemset(src, 1, bytes));
    const double copy_ms = L.time_median_ms(
        [&] { cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, L.stream())); });
    const double copy_gbps = 2.0 * bytes / (copy_ms * 1e6);
    printf("\n# the Muon step against its floor: the Newton-Schulz GEMMs alone at cuBLASLt's rate + %.0f bytes an "
           "element at the copy rate (%.0f GB/s, read + write); %% of floor = floor / ms\n", BYTES_PER_ELEMENT,
           copy_gbps);
    printf("%-12s | %8s | %8s | %10s | %12s | %8s | %8s | %10s | %% of a %.1f ms step\n", "model", "matrices", "ms",
           "NS GEMM ms", "GEMM TFLOP/s", "bytes ms", "floor ms", "% of floor", step_ms);
    for (const Row& r : rows) {
        const double bytes_ms = BYTES_PER_ELEMENT * r.elems / (copy_gbps * 1e6), floor_ms = r.gemm_ms + bytes_ms;
        printf("%-12s | %8zu | %8.3f | %10.3f | %12.1f | %8.3f | %8.3f | %9.1f%% | %.2f%%\n", r.model.c_str(),
               r.matrices, r.ms, r.gemm_ms, r.flops / (r.gemm_ms * 1e9), bytes_ms, floor_ms, 100.0 * floor_ms / r.ms,
               100.0 * r.ms / step_ms);
    }
}
}  // namespace

int main(int argc, char** argv) {
    double step_ms = 114.6;
    std::vector<char*> args;  // the harness's arguments: all but --step-ms X
    for (int i = 0; i < argc; i++) {
        if (i > 0 && !strcmp(argv[i], "--step-ms")) {
            char* end = nullptr;
            step_ms = i + 1 < argc ? strtod(argv[i + 1], &end) : 0.0;
            if (!end || *end != '\0' || !(step_ms > 0.0)) fail("muon.cu: --step-ms needs a step time in ms (> 0)");
            i++;
        } else {
            args.push_back(argv[i]);
        }
    }
    lab::Lab L((int)args.size(), args.data(), "muon.cu");
    std::vector<Row> rows;
    run_model(L, "gpt2:L2,C96,H3", true, false, rows);
    run_model(L, "llama:L2,C96,H6,KV2,F200,V1000", true, true, rows);
    run_model(L, "d12", false, false, rows);
    run_model(L, "llama-114m", false, false, rows);
    if (!rows.empty()) print_floor(L, rows, step_ms);
    return L.finish();
}
