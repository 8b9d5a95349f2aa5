// test_attention_decode_cpu: the CPU decode attention (llmc/cpu/attention_decode.h) through its KV
// cache (llmc/cpu/kv_cache.h) equals the full causal forward (llmc/cpu/attention.h, itself checked against PyTorch by
// test_attention_cpu). Each case draws one random qkv (B, T, (NH+2*NKV)*HD) and runs it token by
// token: sequence b starts b steps late (so a batch mixes lengths and holds idle sequences, pos < 0),
// every step appends the tokens' K/V with kv_cache_append and decodes with attention_decode, and the
// output of sequence b at position p must equal row p of attention_forward's output (idle: zeros).
// Cases: MHA, GQA, MQA, a ring buffer of exactly W slots (wrapped many times) and one of S > W slots;
// then two prefills (kv_cache_fill of prompts of different lengths, one longer than its ring) followed
// by decoding in lockstep.
// Tolerance: max |decode - forward| / max |forward| <= 1e-5 (both fp32, different summation order).
// Prints one line per case and `test_attention_decode_cpu: PASSED (N cases)` or FAILED; exits 1 on failure.
#include <cmath>
#include <cstdio>
#include <vector>
#include "llmc/cpu/attention.h"
#include "llmc/cpu/attention_decode.h"
#include "llmc/rand.h"

struct Case {
    const char* name;
    int B, T, NH, NKV, HD, window, S;
};

static bool run_case(const Case& c, uint64_t seed) {
    const int B = c.B, T = c.T, NH = c.NH, NKV = c.NKV, HD = c.HD, W = c.window, S = c.S;
    const size_t QKV = (size_t)(NH + 2 * NKV) * HD, C = (size_t)NH * HD;
    std::vector<float> qkv((size_t)B * T * QKV), full((size_t)B * T * C), lse((size_t)B * NH * T);
    Rng rng(seed);
    for (float& x : qkv) x = 4.0f * rng.uniform() - 2.0f;
    cpu::attention_forward(full.data(), lse.data(), qkv.data(), B, T, NH, NKV, HD, W);

    // NaN in every slot: a read of a slot never written (or overwritten too early) shows up
    std::vector<float> k_cache((size_t)B * NKV * S * HD, NAN), v_cache(k_cache.size(), NAN);
    std::vector<float> step_qkv((size_t)B * QKV), out((size_t)B * C);
    std::vector<int> pos(B);
    double max_err = 0.0, max_ref = 0.0;
    int decoded = 0;
    for (int step = 0; step < T + B - 1; step++) {
        for (int b = 0; b < B; b++) {
            pos[b] = step - b < T ? step - b : -1;  // not started yet or finished: idle
            for (size_t i = 0; i < QKV; i++)
                step_qkv[(size_t)b * QKV + i] = pos[b] >= 0 ? qkv[((size_t)b * T + pos[b]) * QKV + i] : NAN;
        }
        cpu::kv_cache_append(k_cache.data(), v_cache.data(), step_qkv.data(), pos.data(), B, NH, NKV, HD, S);
        for (float& x : out) x = NAN;  // poison: every element must be written
        cpu::attention_decode(out.data(), step_qkv.data(), k_cache.data(), v_cache.data(), pos.data(), B, NH, NKV, HD,
                              S, W);
        for (int b = 0; b < B; b++) {
            const float* ref = pos[b] >= 0 ? &full[((size_t)b * T + pos[b]) * C] : nullptr;
            for (size_t i = 0; i < C; i++) {
                const double r = ref ? ref[i] : 0.0, e = std::fabs((double)out[(size_t)b * C + i] - r);
                max_err = std::isnan(e) || std::isnan(max_err) ? NAN : std::max(max_err, e);
                max_ref = std::max(max_ref, std::fabs(r));
            }
            decoded += pos[b] >= 0;
        }
    }
    const double rel = max_err / max_ref;
    const bool ok = rel <= 1e-5;  // false for NaN
    printf("  %-8s B=%d T=%d NH=%d NKV=%d HD=%d W=%d S=%d: %d tokens decoded, max err / max ref %.2e  %s\n", c.name, B,
           T, NH, NKV, HD, W, S, decoded, rel, ok ? "ok" : "FAIL");
    return ok;
}

// Prefill then decode: sequence b's prompt is its first T0 - 3b tokens (kv_cache_fill with per-sequence
// lengths from one padded (B, T0) prompt), then every sequence decodes its next tokens in lockstep
// (idle once past T) and each output must equal the forward's row.
static bool run_prefill_case(const Case& c, int T0, uint64_t seed) {
    const int B = c.B, T = c.T, NH = c.NH, NKV = c.NKV, HD = c.HD, W = c.window, S = c.S;
    const size_t QKV = (size_t)(NH + 2 * NKV) * HD, C = (size_t)NH * HD;
    std::vector<float> qkv((size_t)B * T * QKV), full((size_t)B * T * C), lse((size_t)B * NH * T);
    Rng rng(seed);
    for (float& x : qkv) x = 4.0f * rng.uniform() - 2.0f;
    cpu::attention_forward(full.data(), lse.data(), qkv.data(), B, T, NH, NKV, HD, W);

    std::vector<float> k_cache((size_t)B * NKV * S * HD, NAN), v_cache(k_cache.size(), NAN);
    std::vector<float> prompt((size_t)B * T0 * QKV), step_qkv((size_t)B * QKV), out((size_t)B * C);
    std::vector<int> lengths(B), pos(B);
    for (int b = 0; b < B; b++) {
        lengths[b] = T0 - 3 * b;
        for (size_t i = 0; i < (size_t)T0 * QKV; i++)  // rows past the length: padding, never read
            prompt[(size_t)b * T0 * QKV + i] = i < (size_t)lengths[b] * QKV ? qkv[(size_t)b * T * QKV + i] : NAN;
    }
    cpu::kv_cache_fill(k_cache.data(), v_cache.data(), prompt.data(), lengths.data(), B, T0, NH, NKV, HD, S);
    double max_err = 0.0, max_ref = 0.0;
    int decoded = 0;
    for (int step = 0; step < T - T0 + 3 * B; step++) {
        for (int b = 0; b < B; b++) {
            pos[b] = lengths[b] + step < T ? lengths[b] + step : -1;
            for (size_t i = 0; i < QKV; i++)
                step_qkv[(size_t)b * QKV + i] = pos[b] >= 0 ? qkv[((size_t)b * T + pos[b]) * QKV + i] : NAN;
        }
        cpu::kv_cache_append(k_cache.data(), v_cache.data(), step_qkv.data(), pos.data(), B, NH, NKV, HD, S);
        for (float& x : out) x = NAN;
        cpu::attention_decode(out.data(), step_qkv.data(), k_cache.data(), v_cache.data(), pos.data(), B, NH, NKV, HD,
                              S, W);
        for (int b = 0; b < B; b++) {
            if (pos[b] < 0) continue;
            for (size_t i = 0; i < C; i++) {
                const double r = full[((size_t)b * T + pos[b]) * C + i],
                             e = std::fabs((double)out[(size_t)b * C + i] - r);
                max_err = std::isnan(e) || std::isnan(max_err) ? NAN : std::max(max_err, e);
                max_ref = std::max(max_ref, std::fabs(r));
            }
            decoded++;
        }
    }
    const double rel = max_err / max_ref;
    const bool ok = rel <= 1e-5;
    printf(
        "  %-8s prompt %d (lengths %d..%d) B=%d T=%d NH=%d NKV=%d HD=%d W=%d S=%d: %d tokens decoded, max err / max "
        "ref %.2e  %s\n",
        c.name, T0, T0 - 3 * (B - 1), T0, B, T, NH, NKV, HD, W, S, decoded, rel, ok ? "ok" : "FAIL");
    return ok;
}

int main() {
    const Case cases[] = {
        {"mha", 3, 70, 4, 4, 64, 0, 70},
        {"gqa", 4, 50, 6, 2, 128, 0, 64},
        {"mqa", 2, 40, 3, 1, 64, 0, 40},
        {"ring", 3, 90, 4, 2, 64, 16, 16},   // S = W: the ring wraps five times
        {"ring-s", 2, 80, 2, 1, 128, 12, 29},  // S > W, no multiple of it
    };
    int failed = 0;
    uint64_t seed = 77;
    for (const Case& c : cases) failed += !run_case(c, seed++);
    failed += !run_prefill_case(cases[1], 30, seed++);  // GQA, the prompt inside the cache
    failed += !run_prefill_case(cases[3], 40, seed++);  // a prompt longer than the ring of 16 slots
    const int n = (int)(sizeof(cases) / sizeof(cases[0])) + 2;
    if (failed) printf("test_attention_decode_cpu: FAILED (%d of %d cases)\n", failed, n);
    else printf("test_attention_decode_cpu: PASSED (%d cases)\n", n);
    return failed ? 1 : 0;
}
