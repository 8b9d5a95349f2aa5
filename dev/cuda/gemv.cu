// gemv.cu: the decode step's linear layers at M <= 8 rows (llmc/gemv.cuh), against
// cpu::matmul_forward (+ cpu::gelu_forward / cpu::swiglu_forward on its fp32 output), and timed
// beside the cuBLASLt path that generate runs for larger M (matmul.cuh; + swiglu.cuh for SwiGLU).
//   ./gemv [variant ...] [--check-only] [--reps N] [--small]
// Shapes, at M = 1, 2, 4, 8: GPT-2 124M's five (qkv 768->2304 + bias, attproj 768->768 + bias,
// fc 768->3072 + bias + GELU, fcproj 3072->768 + bias, lm_head 768->50304) and the Llama 114M's
// (12 heads / 4 KV heads of 64, SwiGLU hidden 2048, no biases: qkv 768->1280, attproj 768->768,
// fc 768->[gate | up] 4096 -> 2048 with SwiGLU, fcproj 2048->768, lm_head 768->50304); --small: the
// awkward K=776, N=2312 (+ bias + GELU) and K=776, N=2*1000 SwiGLU only.
// Every output element is compared (M rows are cheap on the CPU). Inputs uniform in [-1, 1],
// weights in [-0.05, 0.05], biases in [-1, 1], fresh per shape; outputs poisoned before each run.
// Bytes: the weight once, the inputs once, the outputs once (the cuBLASLt GELU path also writes the
// pre-activation its epilogue keeps; the SwiGLU path writes and reads the (M, 2H) pre-activation).
// Timing: the harness flushes L2 before each repeat, so the weight comes from DRAM as in a decode
// step (the model's ~250 MB never fits the 50 MB L2).
//
// Variants:
//   0 shipped: gemv_forward with gemv_rows_per_warp(M) rows per warp (1 below M = 4, else 2),
//     launched as generate launches it (programmatic dependent launch: no effect on one kernel)
//   1 one row per warp        2 two rows per warp        3 four rows per warp (SwiGLU: 0 only)
//   4 cuBLASLt: matmul_forward (bias / GELU epilogue), + swiglu_forward for SwiGLU
// Measured (H200, commit b0218d8, docs/perf.md "Generation"): variant 0 beats cuBLASLt at M = 1, 2, 4
// for GPT-2's qkv, attproj and fc (7.1 vs 7.9 us, 6.4 vs 8.0, 7.7 vs 8.8 at M = 1) and loses at M = 8
// (10.2 vs 8.2 us for qkv); both are latency-bound here (~12% of copy at M = 1).
#include "dev/cuda/harness.cuh"
#include "llmc/cpu/gelu.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/swiglu.h"
#include "llmc/gemv.cuh"
#include "llmc/matmul.cuh"

struct Shape {
    const char* model;
    const char* name;
    int K, N;  // inp (M, K), weight (N, K); SwiGLU: N = 2H
    bool bias;
    GemvEpilogue epi;
};

static void run_shape(lab::Lab& L, const Shape& s, int M) {
    const int K = s.K, N = s.N, NO = s.epi == GEMV_SWIGLU ? N / 2 : N;  // NO: output columns
    const std::string op = lab::Lab::strprintf("gemv %s %s M=%d K=%d N=%d%s%s", s.model, s.name, M, K, N,
                                               s.bias ? " +bias" : "", s.epi == GEMV_GELU ? " +gelu"
                                               : s.epi == GEMV_SWIGLU ? " +swiglu" : "");
    lab::DevBuf<floatX> d_inp((size_t)M * K, "inp"), d_w((size_t)N * K, "weight"), d_bias(N, "bias");
    lab::DevBuf<floatX> d_out((size_t)M * NO, "out"), d_pre((size_t)M * N, "pre");
    const uint64_t seed = 1000 + 17 * (uint64_t)M + (uint64_t)K * 3 + N;
    d_inp.fill_uniform(seed);
    d_w.fill_uniform(seed + 1, -0.05f, 0.05f);
    d_bias.fill_uniform(seed + 2);
    const std::vector<float> inp = d_inp.download(), w = d_w.download(), bias = d_bias.download();
    std::vector<float> pre((size_t)M * N), ref((size_t)M * NO);
    cpu::matmul_forward(pre.data(), inp.data(), w.data(), s.bias ? bias.data() : nullptr, 1, M, K, N);
    if (s.epi == GEMV_GELU) cpu::gelu_forward(ref.data(), pre.data(), ref.size());
    else if (s.epi == GEMV_SWIGLU) cpu::swiglu_forward(ref.data(), pre.data(), M, NO);
    else ref = pre;

    const double X = sizeof(floatX);
    const double bytes = ((double)N * K + (double)M * K + (double)M * NO) * X, flops = 2.0 * M * K * N;
    const floatX* b = s.bias ? d_bias.get() : nullptr;
    auto reset = [&] { d_out.poison(L.stream()); };
    auto check = [&] { return L.check(d_out, ref); };
    L.run(op, 0, "shipped", bytes, flops, lab::Bound::Memory, reset,
          [&] { gemv_forward(d_out, d_inp, d_w, b, M, K, N, s.epi, L.stream(), 0, true); }, check);
    if (s.epi != GEMV_SWIGLU) {
        const char* names[] = {"1 row a warp", "2 rows a warp", "4 rows a warp"};
        for (int v = 1; v <= 3; v++)
            L.run(op, v, names[v - 1], bytes, flops, lab::Bound::Memory, reset,
                  [&] { gemv_forward(d_out, d_inp, d_w, b, M, K, N, s.epi, L.stream(), 1 << (v - 1)); }, check);
    }
    const double pre_bytes = s.epi == GEMV_GELU ? (double)M * N * X : s.epi == GEMV_SWIGLU ? 2.0 * M * N * X : 0.0;
    L.run(op, 4, "cuBLASLt", bytes + pre_bytes, flops, lab::Bound::Memory, reset, [&] {
        if (s.epi == GEMV_SWIGLU) {
            matmul_forward(d_pre, nullptr, d_inp, d_w, b, M, K, N, L.ctx);
            swiglu_forward(d_out, d_pre, M, NO, L.stream());
        } else {
            matmul_forward(d_out, s.epi == GEMV_GELU ? d_pre.get() : nullptr, d_inp, d_w, b, M, K, N, L.ctx);
        }
    }, check);
}

int main(int argc, char** argv) {
    bool small = false;
    std::vector<char*> args;
    for (int i = 0; i < argc; i++) {
        if (std::string(argv[i]) == "--small") small = true;
        else args.push_back(argv[i]);
    }
    lab::Lab L((int)args.size(), args.data(), "gemv.cu");
    const int C = lab::GPT2_C, VP = lab::GPT2_VP;
    std::vector<Shape> shapes;
    if (small) {
        shapes = {{"odd", "fc", 776, 2312, true, GEMV_GELU}, {"odd", "swiglu", 776, 2000, false, GEMV_SWIGLU}};
    } else {
        shapes = {{"gpt2", "qkv", C, 3 * C, true, GEMV_PLAIN},         {"gpt2", "attproj", C, C, true, GEMV_PLAIN},
                  {"gpt2", "fc", C, 4 * C, true, GEMV_GELU},           {"gpt2", "fcproj", 4 * C, C, true, GEMV_PLAIN},
                  {"gpt2", "lm_head", C, VP, false, GEMV_PLAIN},       {"llama", "qkv", C, 20 * 64, false, GEMV_PLAIN},
                  {"llama", "attproj", C, C, false, GEMV_PLAIN},       {"llama", "fc", C, 2 * 2048, false, GEMV_SWIGLU},
                  {"llama", "fcproj", 2048, C, false, GEMV_PLAIN}};
    }
    for (const Shape& s : shapes)
        for (int M : {1, 2, 4, 8}) run_shape(L, s, M);
    return L.finish();
}
