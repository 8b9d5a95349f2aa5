// attention_common.cuh: what the attention lab files share (attention_forward.cu, attention_backward.cu,
// attention_hopper.cu): the shapes they run, the bf16 tolerance (and why), the FLOP count of a causal
// / windowed head, the forward labs' shape (checks, the shipped and cuDNN variants), and the one main
// (attention_lab_main).
#pragma once
#include <algorithm>
#include <iterator>
#include "harness.cuh"
#include "llmc/attention.cuh"
#include "llmc/cpu/attention.h"
#if defined(USE_CUDNN)
#include "cudnn_attention.cuh"
#endif

struct Shape {
    const char* name;
    AttnShape a;      // B, T, NH, NKV, HD, window
    int ref_batches;  // sequences checked against the CPU reference
};

const Shape FULL_SHAPES[] = {
    {"gpt2", {64, 1024, 12, 12, 64, 0}, 2},       // GPT-2 124M
    {"long", {16, 4096, 16, 16, 128, 0}, 1},      // long context, HD 128
    {"gqa", {64, 1024, 12, 4, 64, 0}, 2},         // GQA 12 query heads / 4 KV heads
    {"window", {16, 4096, 16, 16, 128, 256}, 1},  // sliding window 256
    {"odd", {3, 777, 6, 2, 128, 0}, 3},           // T a multiple of no tile, GQA 6/2
    {"odd-w", {5, 1000, 4, 4, 64, 100}, 5},       // awkward T with a window that is no tile multiple
};
const Shape SMALL_SHAPES[] = {
    {"small", {1, 200, 2, 1, 64, 0}, 1},
    {"small-w", {2, 150, 2, 2, 128, 40}, 2},
    {"small-3", {2, 170, 3, 1, 64, 0}, 2},  // MQA 3/1; T pads to 192: the HD 64 backward's 128-query box passes it
};
// The name of a lab row: "<op> <shape> B=.. T=.. NH=.. NKV=.. HD=.. W=.." (dev/triton reads it).
inline std::string shape_row(const char* op, const Shape& s) {
    const AttnShape& a = s.a;
    return lab::Lab::strprintf("%s %s B=%d T=%d NH=%d NKV=%d HD=%d W=%d", op, s.name, a.B, a.T, a.NH, a.NKV, a.HD,
                               a.window);
}

// bf16: P (and dS) enter their matmuls rounded to bf16, as in FlashAttention and cuDNN (whose errors
// on these inputs match ours to the digit: docs/perf.md), so an element's error follows the size of
// the terms of its sum, not the often cancelled result, which near a sequence start can be 1% of rms.
// So two criteria: element-wise |err| <= 2e-2 |ref| + 1e-1 rms(ref) catches a wrong row or tile, and
// the normalised squared error (nmse) <= NMSE_MAX catches small widespread errors: ours and cuDNN's
// are 4e-6..6e-6, the fp32-math kernel with bf16 output 2.7e-6. fp32: the harness default, 1e-9.
#if defined(PRECISION_FP32)
constexpr double NMSE_MAX = 1e-9;
#else
constexpr double NMSE_MAX = 2e-5;
#endif
inline lab::Tol attention_tol() {
    lab::Tol t = lab::default_tol();
#if !defined(PRECISION_FP32)
    t.abs = 1e-1;
#endif
    return t;
}
// lab.compare plus the nmse bound.
inline bool compare_attention(lab::Lab& lab, const char* what, const std::vector<float>& got,
                              const std::vector<float>& ref) {
    bool ok = lab.compare(what, got, ref, attention_tol());
    const double nmse = lab::measure(got, ref, attention_tol()).nmse;
    if (!(nmse <= NMSE_MAX)) {
        printf("    %-10s FAIL: nmse %.2e over %.0e\n", what, nmse, NMSE_MAX);
        ok = false;
    }
    return ok;
}

// Visible (query, key) pairs of one head of one sequence.
inline double visible_pairs(int T, int window) {
    if (window == 0) return 0.5 * T * T;
    double n = 0;
    for (int t = 0; t < T; t++) n += std::min(t + 1, window);
    return n;
}

// The forward labs' shared part of one shape (attention_forward.cu, attention_hopper.cu): fresh random
// qkv, the CPU reference on the first ref_batches sequences, poisoned outputs and the checks (every
// element written, guard regions, element-wise tolerance and nmse). Variant 0 is the shipped
// attention_forward; `variants(variant, out, lse, qkv)` registers the file's own through
// variant(number, name, launch); with USE_CUDNN=1 cuDNN's forward is variant `cudnn_variant`.
template <class Variants>
inline void run_forward_shape(lab::Lab& lab, const Shape& s, uint64_t seed, int cudnn_variant, Variants&& variants) {
    const AttnShape& a = s.a;
    const int B = a.B, T = a.T, NH = a.NH, NKV = a.NKV, HD = a.HD, W = a.window, RB = s.ref_batches;
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
    const std::string op = shape_row("attention_forward", s);
    cudaStream_t st = lab.stream();
    auto reset = [&] {
        out.poison(st);
        lse.poison(st);
    };
    auto check = [&] {
        const bool ok_out = lab.check(out, out_ref, attention_tol(), out_rows, (size_t)NH * HD);  // + written, guard
        const bool ok_lse = lab.check(lse, lse_ref, lab::default_tol(), lse_rows, (size_t)NH * T);
        const double nmse = lab::measure(out.download(0, out_ref.size()), out_ref, attention_tol()).nmse;
        if (!(nmse <= NMSE_MAX)) printf("    out        FAIL: nmse %.2e over %.0e\n", nmse, NMSE_MAX);
        return ok_out && ok_lse && nmse <= NMSE_MAX;
    };
    auto variant = [&](int v, const char* what, const std::function<void()>& launch) {
        lab.run(op, v, what, bytes, flops, lab::Bound::Compute, reset, launch, check);
    };
    variant(0, "shipped", [&] { attention_forward(out, lse, qkv, a, lab.ctx); });
    variants(variant, out, lse, qkv);
#if defined(USE_CUDNN)
    if (lab.selected(cudnn_variant) && cudnn_attention_supported(false, a))
        variant(cudnn_variant, "cuDNN", [&] { cudnn_attention_forward(out, lse, qkv, a, lab.ctx); });
#else
    (void)cudnn_variant;
#endif
}

// The attention labs' main: the harness's flags plus --small (only the tiny awkward SMALL_SHAPES, for
// compute-sanitizer) and --shape NAME (only the shape of that name, e.g. gpt2: what dev/triton's
// attention.py times beside it); otherwise FULL_SHAPES, then the lab's `extra` shapes. Each shape
// goes to run_shape(lab, shape, seed) with its own seed (seed, seed + 1, ... in list order, the same
// with or without --shape). Returns lab.finish()'s status.
template <class RunShape>
inline int attention_lab_main(int argc, char** argv, const char* file, uint64_t seed, RunShape&& run_shape,
                              const std::vector<Shape>& extra = {}) {
    std::vector<char*> args;
    bool small = false;
    const char* only = nullptr;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) {
            small = true;
        } else if (!strcmp(argv[i], "--shape")) {
            if (i + 1 >= argc) fail("%s: --shape needs a shape name (gpt2, long, gqa, ...)", file);
            only = argv[++i];
        } else {
            args.push_back(argv[i]);
        }
    }
    std::vector<Shape> shapes;
    if (small) shapes.assign(std::begin(SMALL_SHAPES), std::end(SMALL_SHAPES));
    else {
        shapes.assign(std::begin(FULL_SHAPES), std::end(FULL_SHAPES));
        shapes.insert(shapes.end(), extra.begin(), extra.end());
    }
    if (only && std::none_of(shapes.begin(), shapes.end(), [&](const Shape& s) { return !strcmp(s.name, only); })) {
        std::string names;
        for (const Shape& s : shapes) names += std::string(" ") + s.name;
        fail("%s: --shape %s: no such shape; this lab's shapes%s:%s", file, only, small ? " with --small" : "",
             names.c_str());
    }
    lab::Lab lab((int)args.size(), args.data(), file);
    if (!attention_hopper_available(lab.ctx))
        printf("# the sm_90a kernels do not run here (build or GPU): the Hopper variants are skipped\n");
    for (const Shape& s : shapes) {
        if (!only || !strcmp(s.name, only)) run_shape(lab, s, seed);
        seed++;
    }
    return lab.finish();
}
