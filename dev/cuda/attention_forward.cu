// attention_forward.cu: the attention forward lab (causal, GQA, sliding window).
// Every variant runs on fresh random inputs with poisoned outputs, is checked against the CPU
// reference (llmc/cpu/attention.h, fp32, on the first sequences of each batch: the whole batch
// would take the CPU minutes at T = 4096) and then timed by the shared harness.
//   0  shipped attention_forward (llmc/attention.cuh): the tensor-core kernel in the bf16 build,
//      the simple kernel in the FP32 build
//   1  attention_forward_simple: scalar fp32, four threads a query, K/V tiles in smem
//   2  tensor-core kernel, no register cap (__launch_bounds__ min blocks 1)        (bf16 only)
//   3  tensor-core kernel with 8 warps, 128 queries a block                          (bf16 only)
//   4  cuDNN fused attention (llmc/cudnn_attention.cuh)                 (bf16 with USE_CUDNN=1)
// FLOPs: 4 * HD per visible (query, key) pair; causal counts half the square, 2*B*NH*T^2*HD (the
// convention of ../shared/H200.md); a window W counts its visible pairs (~T*W). Bytes: qkv read
// once, out and lse written once.
//
// Build: make -C dev/cuda [USE_CUDNN=1 CUDNN_FRONTEND_PATH=$PWD/build/cudnn_frontend/include]
// Run:   dev/cuda/build/attention_forward [variant ...] [--check-only] [--reps N] [--small]
//        --small: only two tiny awkward shapes (for compute-sanitizer --tool racecheck).
//
// Measured on the H200 (docs/perf.md, "Attention", has the table): see there for each variant's
// numbers and the designs that were tried and dropped.
#include "harness.cuh"
#include "llmc/attention.cuh"
#include "llmc/cpu/attention.h"
#if defined(USE_CUDNN)
#include "llmc/cudnn_attention.cuh"
#endif

struct Shape {
    const char* name;
    int B, T, NH, NKV, HD, window;
    int ref_batches;  // sequences checked against the CPU reference
};

const Shape FULL_SHAPES[] = {
    {"gpt2", 64, 1024, 12, 12, 64, 0, 4},       // GPT-2 124M
    {"gqa", 64, 1024, 12, 4, 64, 0, 4},         // GQA 12 query heads / 4 KV heads
    {"long", 16, 4096, 16, 16, 128, 0, 1},      // long context, HD 128
    {"window", 16, 4096, 16, 16, 128, 256, 1},  // same, sliding window 256
    {"odd", 3, 777, 6, 2, 128, 0, 3},           // T a multiple of no tile, GQA 6/2
    {"odd-w", 5, 1000, 4, 4, 64, 100, 5},       // awkward T with a window that is no tile multiple
};
const Shape SMALL_SHAPES[] = {
    {"small", 1, 200, 2, 1, 64, 0, 1},
    {"small-w", 2, 150, 2, 2, 128, 40, 2},
};

// Visible (query, key) pairs of one head of one sequence.
inline double visible_pairs(int T, int window) {
    if (window == 0) return 0.5 * T * T;
    double n = 0;
    for (int t = 0; t < T; t++) n += std::min(t + 1, window);
    return n;
}

static void run_shape(lab::Lab& lab, const Shape& s, uint64_t seed) {
    const int B = s.B, T = s.T, NH = s.NH, NKV = s.NKV, HD = s.HD, W = s.window, RB = s.ref_batches;
    const size_t n_qkv = (size_t)B * T * (NH + 2 * NKV) * HD, n_out = (size_t)B * T * NH * HD, n_lse = (size_t)B * NH * T;
    // uniform(-2, 2): scores q.k/sqrt(HD) have std 4/3, peaked enough to test the softmax
    const std::vector<float> qkv_h = lab::rand_uniform(n_qkv, seed, -2.0f, 2.0f);
    std::vector<float> out_ref((size_t)RB * T * NH * HD), lse_ref((size_t)RB * NH * T);
    cpu::attention_forward(out_ref.data(), lse_ref.data(), qkv_h.data(), RB, T, NH, NKV, HD, W);

    lab::DevBuf<floatX> qkv(n_qkv, "qkv"), out(n_out, "out");
    lab::DevBuf<float> lse(n_lse, "lse");
    qkv.upload(qkv_h);
    std::vector<int> out_rows(RB * T), lse_rows(RB);
    for (int i = 0; i < RB * T; i++) out_rows[i] = i;  // (B*T, NH*HD): the first RB sequences
    for (int i = 0; i < RB; i++) lse_rows[i] = i;      // (B, NH*T)

    const double flops = 4.0 * HD * B * NH * visible_pairs(T, W);
    const double bytes = (double)(n_qkv + n_out) * sizeof(floatX) + n_lse * sizeof(float);
    const std::string op = lab::Lab::strprintf("attention_forward %s B=%d T=%d NH=%d NKV=%d HD=%d W=%d", s.name, B, T,
                                               NH, NKV, HD, W);
    cudaStream_t st = lab.stream();
    auto reset = [&] {
        out.poison(st);
        lse.poison(st);
    };
    auto check = [&] {
        const bool a = lab.check(out, out_ref, lab::default_tol(), out_rows, (size_t)NH * HD);
        const bool b = lab.check(lse, lse_ref, lab::default_tol(), lse_rows, (size_t)NH * T);
        return a && b;
    };
    auto variant = [&](int v, const char* what, const std::function<void()>& launch) {
        lab.run(op, v, what, bytes, flops, lab::Bound::Compute, reset, launch, check);
    };
    variant(0, "shipped", [&] { attention_forward(out, lse, qkv, B, T, NH, NKV, HD, st, W); });
    variant(1, "simple fp32", [&] { attention_forward_simple(out, lse, qkv, B, T, NH, NKV, HD, st, W); });
#if !defined(PRECISION_FP32)
    using namespace attention_detail;
    const QKVLayout L{NH, NKV, HD};
    variant(2, "mma, no register cap", [&] {
        if (HD == 64) forward_flash<FlashCfg<64, 4, 64, 1>>(out, lse, qkv, B, T, L, W, st);
        else forward_flash<FlashCfg<128, 4, 64, 1>>(out, lse, qkv, B, T, L, W, st);
    });
    variant(3, "mma, 8 warps, 128 queries", [&] {
        if (HD == 64) forward_flash<FlashCfg<64, 8, 64, 2>>(out, lse, qkv, B, T, L, W, st);
        else forward_flash<FlashCfg<128, 8, 64, 1>>(out, lse, qkv, B, T, L, W, st);
    });
#endif
#if defined(USE_CUDNN)
    if (lab.selected(4) && cudnn_attention_supported(false, B, T, NH, NKV, HD, W))
        variant(4, "cuDNN", [&] { cudnn_attention_forward(out, lse, qkv, B, T, NH, NKV, HD, st, W); });
#endif
}

int main(int argc, char** argv) {
    // --small is this file's own flag; the rest goes to the harness.
    bool small = false;
    std::vector<char*> args;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) small = true;
        else args.push_back(argv[i]);
    }
    lab::Lab lab((int)args.size(), args.data(), "attention_forward.cu");
    uint64_t seed = 1234;
    if (small)
        for (const Shape& s : SMALL_SHAPES) run_shape(lab, s, seed++);
    else
        for (const Shape& s : FULL_SHAPES) run_shape(lab, s, seed++);
    return lab.finish();
}
