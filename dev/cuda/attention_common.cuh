// attention_common.cuh: what the two attention lab files share: the shapes they run, the bf16
// tolerance (and why), and the FLOP count of a causal / windowed head.
#pragma once
#include <algorithm>
#include "harness.cuh"

struct Shape {
    const char* name;
    int B, T, NH, NKV, HD, window;
    int ref_batches;  // sequences checked against the CPU reference
};

const Shape FULL_SHAPES[] = {
    {"gpt2", 64, 1024, 12, 12, 64, 0, 2},       // GPT-2 124M
    {"long", 16, 4096, 16, 16, 128, 0, 1},      // long context, HD 128
    {"gqa", 64, 1024, 12, 4, 64, 0, 2},         // GQA 12 query heads / 4 KV heads
    {"window", 16, 4096, 16, 16, 128, 256, 1},  // sliding window 256
    {"odd", 3, 777, 6, 2, 128, 0, 3},           // T a multiple of no tile, GQA 6/2
    {"odd-w", 5, 1000, 4, 4, 64, 100, 5},       // awkward T with a window that is no tile multiple
};
const Shape SMALL_SHAPES[] = {
    {"small", 1, 200, 2, 1, 64, 0, 1},
    {"small-w", 2, 150, 2, 2, 128, 40, 2},
};

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
