// attention_common.cuh: what the attention lab files share (attention_forward.cu, attention_backward.cu,
// attention_hopper.cu): the shapes they run (the document-masked ones too, with their token streams),
// the bf16 tolerance (and why), the FLOP count of a causal / windowed / document-masked head, the
// forward labs' shape (checks, the shipped and cuDNN variants), the time ratio of a document-masked
// shape to its one-document twin, and the one main (attention_lab_main).
#pragma once
#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include "harness.cuh"
#include "llmc/attention.cuh"
#include "llmc/cpu/attention.h"
#if defined(USE_CUDNN)
#include "cudnn_attention.cuh"
#endif

// docs: 0 no document mask (AttnShape::doc_start stays null); n > 0 n equal documents a row (the
// first at 0, then every T / n tokens); DOCS_RANDOM random lengths (doc_tokens says how).
constexpr int DOCS_RANDOM = -1;
struct Shape {
    const char* name;
    AttnShape a;      // B, T, NH, NKV, HD, window
    int ref_batches;  // sequences checked against the CPU reference
    int docs = 0;
    const char* twin = nullptr;  // the one-document shape whose time this one's is divided by
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
// Document-masked shapes (AttnShape::doc_start set, the trainer's --doc-mask 1 call): GPT-2's and a
// GQA HD 128 one at T 4096, each as one document a row (the twin: full causal through the masked
// path), 8 equal documents and random lengths. The three attention labs run them after their own shapes.
const std::vector<Shape> DOC_SHAPES = {
    {"doc1-gpt2", {64, 1024, 12, 12, 64, 0}, 2, 1},
    {"doc8-gpt2", {64, 1024, 12, 12, 64, 0}, 2, 8, "doc1-gpt2"},
    {"docr-gpt2", {64, 1024, 12, 12, 64, 0}, 2, DOCS_RANDOM, "doc1-gpt2"},
    {"doc1-gqa128", {16, 4096, 16, 4, 128, 0}, 1, 1},
    {"doc8-gqa128", {16, 4096, 16, 4, 128, 0}, 1, 8, "doc1-gqa128"},
    {"docr-gqa128", {16, 4096, 16, 4, 128, 0}, 2, DOCS_RANDOM, "doc1-gqa128"},
};
const std::vector<Shape> DOC_SMALL_SHAPES = {
    {"doc-small", {4, 203, 3, 1, 128, 0}, 4, DOCS_RANDOM},  // no tile multiple, MQA 3/1, one-document row 1
    {"doc-small-w", {3, 150, 2, 2, 64, 40}, 3, DOCS_RANDOM},  // and a window
};

// The token stream of a document-masked shape (B, T): ids below DOC_TOKEN, and DOC_TOKEN (GPT-2's
// <|endoftext|>) at each document's first position. cpu::doc_starts turns it into doc_start, the
// trainer's way. DOCS_RANDOM, row b: Rng(DOC_SEED + b); rows b % 4 == 1 are one document (no
// DOC_TOKEN); the others draw maxlen = max(1, T >> below(8)), then from p = 0 while p < T: a document
// starts at p (at p = 0 only if below(2) is 1: else the row begins inside one) and p += 1 + below(maxlen).
// dev/triton/attention_doc.py draws the same documents (its doc_starts mirrors this function).
constexpr int DOC_TOKEN = 50256;
constexpr uint64_t DOC_SEED = 2024;
inline std::vector<int> doc_tokens(const Shape& s) {
    const int B = s.a.B, T = s.a.T;
    std::vector<int> tokens = lab::rand_ints((size_t)B * T, DOC_SEED ^ 0x70C5ull, DOC_TOKEN);
    for (int b = 0; b < B; b++) {
        int* row = tokens.data() + (size_t)b * T;
        if (s.docs > 0) {
            for (int d = 0; d < s.docs; d++) row[(size_t)d * T / s.docs] = DOC_TOKEN;
        } else if (b % 4 != 1) {
            Rng rng(DOC_SEED + b);
            const int maxlen = std::max(1, T >> (int)rng.below(8));
            for (int p = 0; p < T; p += 1 + (int)rng.below((uint64_t)maxlen))
                if (p > 0 || rng.below(2)) row[p] = DOC_TOKEN;
        }
    }
    return tokens;
}
// doc_start (B, T) of a shape with docs != 0 (llmc/cpu/attention.h's doc_starts of doc_tokens).
inline std::vector<int> doc_starts_of(const Shape& s) {
    std::vector<int> ds((size_t)s.a.B * s.a.T);
    cpu::doc_starts(ds.data(), doc_tokens(s).data(), s.a.B, s.a.T, DOC_TOKEN);
    return ds;
}

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
// Visible pairs of one head summed over the B rows: without doc_start B * visible_pairs(T, window)
// (causal: half the square, docs/h200.md's convention); with it each query's keys doc_start[t]..t
// (inside the window): a row's sum over its documents of len * (len + 1) / 2 without a window.
inline double visible_pairs(const Shape& s, const std::vector<int>& doc_start) {
    const int B = s.a.B, T = s.a.T, W = s.a.window;
    if (doc_start.empty()) return B * visible_pairs(T, W);
    double n = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const int keys = t - doc_start[(size_t)b * T + t] + 1;
            n += W > 0 ? std::min(keys, W) : keys;
        }
    return n;
}

// The device copy of a shape's doc_start, and the AttnShape pointing at it (a.doc_start null for docs 0).
struct DocMask {
    std::vector<int> host;  // (B, T); empty for docs 0
    std::unique_ptr<lab::DevBuf<int>> dev;
    AttnShape a;
    explicit DocMask(const Shape& s) : a(s.a) {
        if (!s.docs) return;
        host = doc_starts_of(s);
        dev = std::make_unique<lab::DevBuf<int>>(host.size(), "doc_start");
        dev->upload(host);
        a.doc_start = *dev;
    }
};

// Prints a document-masked row's time over its one-document twin's (same op and variant, this run):
// the target is 8 documents a row in <= 0.3x the twin's time. Call right after the row's lab.run.
inline void twin_ratio(lab::Lab& lab, const std::string& op_kind, int variant, const Shape& s) {
    static std::map<std::string, double> ms;  // "<op kind> <shape> <variant>" -> median ms
    if (!s.docs || lab.last_ms() <= 0) return;
    auto key = [&](const char* shape) { return op_kind + " " + shape + " " + std::to_string(variant); };
    ms[key(s.name)] = lab.last_ms();
    if (!s.twin) return;
    auto it = ms.find(key(s.twin));
    if (it != ms.end())
        printf("    %s %s / %s, variant %d: %.3fx the time\n", op_kind.c_str(), s.name, s.twin, variant,
               lab.last_ms() / it->second);
}

// The forward labs' shared part of one shape (attention_forward.cu, attention_hopper.cu): fresh random
// qkv, the CPU reference on the first ref_batches sequences, poisoned outputs and the checks (every
// element written, guard regions, element-wise tolerance and nmse). Variant 0 is the shipped
// attention_forward; `variants(variant, out, lse, qkv)` registers the file's own through
// variant(number, name, launch); with USE_CUDNN=1 cuDNN's forward is variant `cudnn_variant` (on a
// document-masked shape, the documents as packed sequences). A document-masked shape (s.docs) comes
// with s.a.doc_start set (DocMask); the reference and the FLOPs take doc_starts_of(s).
template <class Variants>
inline void run_forward_shape(lab::Lab& lab, const Shape& s, uint64_t seed, int cudnn_variant, Variants&& variants) {
    const AttnShape& a = s.a;
    const int B = a.B, T = a.T, NH = a.NH, NKV = a.NKV, HD = a.HD, W = a.window, RB = s.ref_batches;
    if (!s.docs != !a.doc_start) fail("attention lab: shape %s: doc_start must be set iff docs is", s.name);
    const std::vector<int> doc_start = s.docs ? doc_starts_of(s) : std::vector<int>{};
    const size_t n_qkv = (size_t)B * T * (NH + 2 * NKV) * HD, n_out = (size_t)B * T * NH * HD, n_lse = (size_t)B * NH * T;
    // uniform(-2, 2): scores q.k/sqrt(HD) have std 4/3, peaked enough to test the softmax
    const std::vector<float> qkv_h = lab::rand_uniform(n_qkv, seed, -2.0f, 2.0f);
    std::vector<float> out_ref((size_t)RB * T * NH * HD), lse_ref((size_t)RB * NH * T);
    cpu::attention_forward(out_ref.data(), lse_ref.data(), qkv_h.data(), RB, T, NH, NKV, HD, W,
                           s.docs ? doc_start.data() : nullptr);

    lab::DevBuf<floatX> qkv(n_qkv, "qkv"), out(n_out, "out");
    lab::DevBuf<float> lse(n_lse, "lse");
    qkv.upload(qkv_h);
    std::vector<int> out_rows(RB * T), lse_rows(RB);
    for (int i = 0; i < RB * T; i++) out_rows[i] = i;  // (B*T, NH*HD): the first RB sequences
    for (int i = 0; i < RB; i++) lse_rows[i] = i;      // (B, NH*T)

    const double flops = 4.0 * HD * NH * visible_pairs(s, doc_start);
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
    twin_ratio(lab, "attention_forward", 0, s);
    variants(variant, out, lse, qkv);
#if defined(USE_CUDNN)
    if (lab.selected(cudnn_variant) && s.docs) {
        // cuDNN's padded stats scattered into lse (B, NH, T) by the check, then the usual checks
        const CudnnDocs docs(doc_start, a);
        lab::DevBuf<float> stats(docs.stats_size(a), "stats");
        std::vector<float> lse_h(n_lse);
        if (cudnn_attention_docs_supported(false, a, docs)) {
            lab.run(op, cudnn_variant, "cuDNN, documents as sequences", bytes, flops, lab::Bound::Compute, reset,
                    [&] { cudnn_attention_forward_docs(out, stats, qkv, a, docs, lab.ctx); }, [&] {
                        docs.gather_stats(lse_h, stats.download(), a);
                        lse.upload(lse_h);
                        return check();
                    });
            twin_ratio(lab, "attention_forward", cudnn_variant, s);
        }
    } else if (lab.selected(cudnn_variant) && cudnn_attention_supported(false, a)) {
        variant(cudnn_variant, "cuDNN", [&] { cudnn_attention_forward(out, lse, qkv, a, lab.ctx); });
    }
#else
    (void)cudnn_variant;
#endif
}

// The attention labs' main: the harness's flags plus --small (only the tiny awkward SMALL_SHAPES, for
// compute-sanitizer, then the lab's `small_extra`) and --shape NAME (only the shape of that name, e.g.
// gpt2: what dev/triton's attention.py times beside it); otherwise FULL_SHAPES, then the lab's
// `extra`. Each shape goes to run_shape(lab, shape, seed) with its own seed (seed, seed + 1, ... in
// list order, the same with or without --shape). Returns lab.finish()'s status.
template <class RunShape>
inline int attention_lab_main(int argc, char** argv, const char* file, uint64_t seed, RunShape&& run_shape,
                              const std::vector<Shape>& extra = {}, const std::vector<Shape>& small_extra = {}) {
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
    if (small) {
        shapes.assign(std::begin(SMALL_SHAPES), std::end(SMALL_SHAPES));
        shapes.insert(shapes.end(), small_extra.begin(), small_extra.end());
    } else {
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
