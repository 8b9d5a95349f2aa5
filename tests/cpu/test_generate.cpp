// test_generate_cpu: the cached forward of llmc/cpu/model_infer.h (prefill + one decode step per
// token through the KV cache) gives the logits of the full-sequence forward of llmc/cpu/model.h
// (itself checked against PyTorch by test_gpt2_cpu) at every position, teacher-forced.
// Each case draws B random sequences of N tokens; sequence b's first lengths[b] tokens are its
// prompt (one right-padded prefill of the whole batch: the logits of every prompt position, then
// again those of each prompt's last position, as generation asks for them), then it decodes its remaining tokens one step at a time, in lockstep with the others, idle
// (pos < 0) once it has reached N. The cache starts as NaN, so a read of a slot that was never
// written, or one read after the ring buffer overwrote it, poisons the logits; the logits buffers
// are poisoned before every call, so every compared element must have been written.
// Cases, on the committed fixtures: GPT-2 multi-head (tests/fixture/model.bin); GPT-2 GQA (6 query
// heads, 2 KV heads) with a window of 6 (gqa_model.bin), whose cache is a ring of 6 slots wrapped 5
// times, one prompt longer than the ring; the same model with --max-seq 5 <= W (full attention,
// S = 5); the multi-head model with --max-seq 12 < max_seq_len; Llama-style (RMSNorm, RoPE at each
// token's position, SwiGLU, no biases): multi-head with a tied head (llama_model.bin), GQA with an
// untied head (llama_gqa_model.bin), GQA with a window of 5 (llama_window_model.bin, a wrapped ring).
// Tolerance: max |cached - full| / max |full| <= 1e-5 (fp32, the same ops on different row counts).
// Then the trainer's samples (model_infer_sample: a one-token prefill, a decode step per token): on
// four of those models, greedy and three temperatures, three RNG seeds each, the tokens and the RNG
// state after them equal those of a full forward over the whole sequence per token (the CPU
// trainer's sampler before it used the cache), once with the cache over the sample's own length (as
// the trainer builds it) and once over the whole context, asked for 5 tokens more than it holds
// (the sample must stop at the context end). The draws could differ only where rounding moves a
// logit across a boundary (the greedy runner-up, or the uniform's cumulative sum): greedy prints
// its smallest top-2 gap, to set beside the cached logits' error above (within 1e-5 relative).
// Prints one line per case and `test_generate_cpu: PASSED (N cases)` or FAILED; exits 1 on failure.
//   build/test_generate_cpu [fixture dir, default tests/fixture]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>
#include "llmc/cpu/model.h"
#include "llmc/cpu/model_infer.h"
#include "llmc/formats.h"
#include "llmc/rand.h"

struct Case {
    const char* name;
    const char* model;  // file in the fixture dir
    int max_seq;        // N: tokens per sequence, the cache's --max-seq
    std::vector<int> lengths;
};

struct ErrTally {
    double max_err = 0.0, max_ref = 0.0;
    long rows = 0;
    // row (V logits) of the cached forward against the full forward's
    void add(const float* got, const float* ref, int V) {
        for (int v = 0; v < V; v++) {
            const double e = std::fabs((double)got[v] - ref[v]);
            max_err = std::isnan(e) || std::isnan(max_err) ? NAN : std::max(max_err, e);
            max_ref = std::max(max_ref, std::fabs((double)ref[v]));
        }
        rows++;
    }
};

static bool run_case(const Case& k, const std::string& dir, uint64_t seed) {
    const std::string path = dir + "/" + k.model;
    const ModelConfig c = model_read_info(path.c_str()).config;
    std::vector<float> params(model_num_params(c));
    model_read_fp32(path.c_str(), params.data());
    const int B = (int)k.lengths.size(), N = k.max_seq, V = c.vocab_size, Vp = c.padded_vocab_size;

    std::vector<int> tokens((size_t)B * N);
    Rng rng(seed);
    for (int& t : tokens) t = (int)rng.below(V);
    Model full;
    model_build(full, c, B, N);
    model_set_params(full, params.data());
    model_forward(full, tokens.data(), B, N);
    auto ref = [&](int b, int t) { return full.acts.logits.data() + ((size_t)b * N + t) * Vp; };

    ModelInfer m;
    model_infer_build(m, c, params.data(), B, N);
    std::fill(m.cache.k.begin(), m.cache.k.end(), NAN);
    std::fill(m.cache.v.begin(), m.cache.v.end(), NAN);
    ErrTally prefill, decode;
    int T = 0;
    for (int len : k.lengths) T = std::max(T, len);
    std::vector<int> prompt((size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) prompt[(size_t)b * T + t] = t < k.lengths[b] ? tokens[(size_t)b * N + t] : V - 1;
    if (!m.acts.logits.empty()) std::fill(m.acts.logits.begin(), m.acts.logits.end(), NAN);
    const float* logits = model_prefill(m, prompt.data(), k.lengths.data(), B, T, true);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < k.lengths[b]; t++) prefill.add(logits + ((size_t)b * T + t) * Vp, ref(b, t), V);
    // as generation runs it: the logits of each prompt's last position only (and the cache again)
    std::fill(m.acts.logits.begin(), m.acts.logits.end(), NAN);
    logits = model_prefill(m, prompt.data(), k.lengths.data(), B, T);
    for (int b = 0; b < B; b++) prefill.add(logits + (size_t)b * Vp, ref(b, k.lengths[b] - 1), V);

    std::vector<int> next(B), pos(B);
    for (int step = 0;; step++) {
        bool any = false;
        for (int b = 0; b < B; b++) {
            const int p = k.lengths[b] + step;
            pos[b] = p < N ? p : -1;
            next[b] = p < N ? tokens[(size_t)b * N + p] : V + 7;  // an idle sequence's token is never read
            any |= p < N;
        }
        if (!any) break;
        std::fill(m.acts.logits.begin(), m.acts.logits.end(), NAN);
        logits = model_decode_step(m, next.data(), pos.data(), B);
        for (int b = 0; b < B; b++)
            if (pos[b] >= 0) decode.add(logits + (size_t)b * Vp, ref(b, pos[b]), V);
    }
    const double p_rel = prefill.max_err / prefill.max_ref, d_rel = decode.max_err / decode.max_ref;
    const bool ok = p_rel <= 1e-5 && (decode.rows == 0 || d_rel <= 1e-5);  // false for NaN
    std::string lens;
    for (int len : k.lengths) lens += (lens.empty() ? "" : ",") + std::to_string(len);
    printf("  %-24s NH=%d NKV=%d W=%d S=%d, prompts %s of %d: prefill %ld rows err %.2e, decode %ld rows err %.2e  %s\n",
           k.name, c.num_heads, c.num_kv_heads, c.window, m.cache.S, lens.c_str(), N, prefill.rows, p_rel, decode.rows,
           decode.rows ? d_rel : 0.0, ok ? "ok" : "FAIL");
    return ok;
}

// The reference sampler: `gen` tokens after `eot`, one full forward per token over the whole
// sequence, each drawn from its last position's logits. *min_gap: the smallest top-2 logit gap.
static std::vector<int> sample_full(Model& full, int eot, int gen, float temperature, Rng& rng, float* min_gap) {
    const int V = full.config.vocab_size, Vp = full.config.padded_vocab_size;
    std::vector<int> ctx{eot};
    for (int i = 0; i < gen; i++) {
        const int n = (int)ctx.size();
        model_forward(full, ctx.data(), 1, n);
        const float* row = full.acts.logits.data() + (size_t)(n - 1) * Vp;
        std::vector<float> sorted(row, row + V);
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        *min_gap = std::min(*min_gap, sorted[0] - sorted[1]);
        ctx.push_back(sample_token(row, V, temperature, rng));
    }
    return std::vector<int>(ctx.begin() + 1, ctx.end());
}

static bool run_sample_case(const char* name, const std::string& dir, const char* model) {
    const std::string path = dir + "/" + model;
    const ModelConfig c = model_read_info(path.c_str()).config;
    std::vector<float> params(model_num_params(c));
    model_read_fp32(path.c_str(), params.data());
    const int maxT = c.max_seq_len, own = maxT * 2 / 3, eot = c.vocab_size - 1;
    Model full;
    model_build(full, c, 1, maxT);
    model_set_params(full, params.data());
    ModelInfer whole, trainer;  // over the whole context; over `own` positions, as the trainer builds it
    model_infer_build(whole, c, params.data(), 1, maxT);
    model_infer_build(trainer, c, params.data(), 1, own);
    int samples = 0, differ = 0, rng_differ = 0, wrong_length = 0;
    float min_gap = INFINITY;
    for (float temperature : {0.0f, 0.7f, 1.0f, 1.5f}) {
        for (uint64_t seed : {1, 42, 1337}) {
            Rng ref_rng(seed), ref_own_rng(seed), rng_whole(seed), rng_trainer(seed);
            float gap = INFINITY;
            const std::vector<int> ref = sample_full(full, eot, maxT, temperature, ref_rng, &gap);
            const std::vector<int> ref_own = sample_full(full, eot, own, temperature, ref_own_rng, &gap);
            if (temperature == 0.0f) min_gap = std::min(min_gap, gap);
            const std::vector<int> a = model_infer_sample(whole, eot, maxT + 5, temperature, rng_whole);
            const std::vector<int> b = model_infer_sample(trainer, eot, own, temperature, rng_trainer);
            wrong_length += (a.size() != ref.size()) + (b.size() != ref_own.size());
            for (size_t i = 0; i < a.size() && i < ref.size(); i++) differ += a[i] != ref[i];
            for (size_t i = 0; i < b.size() && i < ref_own.size(); i++) differ += b[i] != ref_own[i];
            rng_differ += (rng_whole.state != ref_rng.state) + (rng_trainer.state != ref_own_rng.state);
            samples += 2;
        }
    }
    const bool ok = differ == 0 && rng_differ == 0 && wrong_length == 0;
    printf("  sample: %-24s W=%d, %d samples of %d and %d tokens: %d tokens differ, %d RNG states differ, %d wrong "
           "lengths; greedy's smallest top-2 gap %.2e  %s\n", name, c.window, samples, maxT, own, differ, rng_differ,
           wrong_length, min_gap, ok ? "ok" : "FAIL");
    return ok;
}

int main(int argc, char** argv) {
    const std::string dir = argc > 1 ? argv[1] : "tests/fixture";
    const Case cases[] = {
        {"multi-head", "model.bin", 32, {1, 9, 20}},
        {"GQA + window ring", "gqa_model.bin", 32, {1, 4, 13}},
        {"GQA, window >= max-seq", "gqa_model.bin", 5, {1, 3, 5}},
        {"multi-head, max-seq 12", "model.bin", 12, {12, 2}},
        {"Llama multi-head", "llama_model.bin", 32, {1, 9, 20}},
        {"Llama GQA, untied head", "llama_gqa_model.bin", 32, {3, 17}},
        {"Llama GQA + window ring", "llama_window_model.bin", 32, {1, 4, 13}},
    };
    int failed = 0, n = 0;
    for (const Case& k : cases) failed += !run_case(k, dir, 1000 + n++);
    const char* sample_models[][2] = {{"multi-head", "model.bin"},
                                      {"GQA + window ring", "gqa_model.bin"},
                                      {"Llama multi-head", "llama_model.bin"},
                                      {"Llama GQA + window ring", "llama_window_model.bin"}};
    for (const auto& s : sample_models) failed += !run_sample_case(s[0], dir, s[1]), n++;
    printf("test_generate_cpu: %s (%d cases)\n", failed ? "FAILED" : "PASSED", n);
    return failed ? 1 : 0;
}
