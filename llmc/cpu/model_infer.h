// model_infer.h: inference on the CPU with a KV cache, for both model families, the model half of
// generate_cpu.cpp and the CPU twin of llmc/model_infer.cuh. It runs the training forward's layer ops
// (llmc/cpu/*.h, llmc/cpu/model.h's norm helpers) in the same layer structure, in a per-layer loop that
// keeps no activations for a backward; tests/cpu/test_generate.cpp checks it against the full-sequence
// forward of llmc/cpu/model.h. RoPE turns q and k at each token's own position, before k is cached.
//
// The cache (docs/design.md, "KV cache and decode attention"; the GPU's layout): per layer k and v,
// each (B, NKV, S, HD) fp32; position p of sequence b in slot p % S. S = max_seq, or S = W (a ring
// buffer of the last W positions) for a window W < max_seq.
//
// One batch of prompts: model_prefill (every layer over the prompts, cpu::kv_cache_fill), then
// model_decode_step per new token (cpu::kv_cache_append, cpu::attention_decode). A new prefill starts
// the cache over: a slot is only read after this batch wrote it. model_infer_sample: the CPU trainer's
// samples, through the two. fp32 throughout; the results do not depend on the thread count.
#pragma once
#include <algorithm>
#include <vector>
#include "llmc/cpu/attention.h"
#include "llmc/cpu/attention_decode.h"
#include "llmc/cpu/encoder.h"
#include "llmc/cpu/gelu.h"
#include "llmc/cpu/model.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/rope.h"
#include "llmc/cpu/swiglu.h"
#include "llmc/model_config.h"
#include "llmc/rand.h"
#include "llmc/sampler.h"
#include "llmc/utils.h"

struct ModelKVCache {
    int B = 0, NKV = 0, S = 0, HD = 0;
    int window = 0;           // what attention_decode applies: the model's W when S = W, else 0
    std::vector<float> k, v;  // (L, B, NKV, S, HD) each
    size_t layer_floats() const { return (size_t)B * NKV * S * HD; }
    float* k_layer(int l) { return k.data() + l * layer_floats(); }
    float* v_layer(int l) { return v.data() + l * layer_floats(); }
};

// One layer's activations for `rows` = B * T positions (T the prompt length of a prefill, 1 for a
// decode step), reused by every layer.
struct ModelInferActs {
    size_t rows = 0;
    std::vector<float> x;        // (rows, C) the residual stream, updated in place
    std::vector<float> ln;       // (rows, C) a norm's output; after the last layer the final norm's
    std::vector<float> mean;     // (rows) LayerNorm only
    std::vector<float> rstd;     // (rows)
    std::vector<float> qkv;      // (rows, QKV)
    std::vector<float> atty;     // (rows, C)
    std::vector<float> lse;      // (rows * NH) the prefill attention's log-sum-exp (unused here)
    std::vector<float> proj;     // (rows, C) the output of attproj and of fcproj
    std::vector<float> fch;      // (rows, FC): H, or SwiGLU's [gate | up] 2H
    std::vector<float> fch_act;  // (rows, H) GELU or SwiGLU of fch
    std::vector<float> logits;   // (B, Vp), or (rows, Vp) for a prefill's every position
};

struct ModelInfer {
    ModelConfig config{};
    ModelTensors<const float> params{};  // views of the caller's buffer (MODEL_PARAMETER_TABLE order)
    int B = 0;                          // sequences the cache holds
    int max_seq = 0;                    // positions a sequence may use, <= config.max_seq_len
    ModelKVCache cache;
    ModelInferActs acts;
    std::vector<float> rope_cos, rope_sin;  // (max_seq, HD/2) each, with RoPE (llmc/cpu/rope.h)
};

// Sizes the cache for B sequences of up to max_seq positions (1 <= max_seq <= max_seq_len) of the
// model `c` whose parameters are `params` (model_num_params(c) floats, kept by the caller).
inline void model_infer_build(ModelInfer& m, const ModelConfig& c, const float* params, int B, int max_seq) {
    model_validate_config(c, "model");
    if (B < 1) fail("internal: model_infer_build with B=%d", B);
    if (max_seq < 1 || max_seq > c.max_seq_len)
        fail("--max-seq %d: must be in [1, %d] (the model's max_seq_len)", max_seq, c.max_seq_len);
    m.config = c;
    m.params = model_point_tensors(params, c);
    m.B = B;
    m.max_seq = max_seq;
    ModelKVCache& kv = m.cache;
    const bool ring = c.window > 0 && c.window < max_seq;
    kv.B = B;
    kv.NKV = c.num_kv_heads;
    kv.HD = model_head_dim(c);
    kv.S = ring ? c.window : max_seq;
    kv.window = ring ? c.window : 0;  // W >= max_seq never hides a position: full causal
    const size_t floats = 2 * (size_t)c.num_layers * kv.layer_floats();
    char what[128];
    snprintf(what, sizeof what, "the KV cache of %d sequences of %d positions (%zu floats)", B, max_seq, floats);
    check_host_memory(floats * sizeof(float), what, "lower --max-seq or the number of prompts");
    kv.k.assign(floats / 2, 0.0f);
    kv.v.assign(floats / 2, 0.0f);
    m.acts = ModelInferActs();
    m.rope_cos.clear();
    m.rope_sin.clear();
    if (c.position == POS_ROPE) {
        m.rope_cos.resize((size_t)max_seq * kv.HD / 2);
        m.rope_sin.resize((size_t)max_seq * kv.HD / 2);
        cpu::rope_tables_for(c, m.rope_cos.data(), m.rope_sin.data(), max_seq);
    }
}

namespace detail {
inline void infer_size_acts(ModelInfer& m, size_t rows, size_t logit_rows) {
    const ModelConfig& c = m.config;
    const size_t C = c.channels, QKV = model_qkv_channels(c);
    ModelInferActs& a = m.acts;
    if (rows > a.rows) {
        a.x.resize(rows * C);
        a.ln.resize(rows * C);
        a.mean.resize(rows);
        a.rstd.resize(rows);
        a.qkv.resize(rows * QKV);
        a.atty.resize(rows * C);
        a.lse.resize(rows * c.num_heads);
        a.proj.resize(rows * C);
        a.fch.resize(rows * model_fc_channels(c));
        a.fch_act.resize(rows * model_mlp_hidden(c));
        a.rows = rows;
    }
    if (a.logits.size() < logit_rows * c.padded_vocab_size) a.logits.resize(logit_rows * c.padded_vocab_size);
}

// The transformer blocks over the embeddings in acts.x (B, T, C), updated in place; leaves the final
// norm in acts.ln. attend(l) fills acts.atty from acts.qkv for layer l (RoPE, and its K/V into the cache).
template <typename Attend>
inline void infer_layers(ModelInfer& m, int B, int T, Attend&& attend) {
    const ModelConfig& c = m.config;
    const int C = c.channels, QKV = model_qkv_channels(c), FC = model_fc_channels(c), H = model_mlp_hidden(c);
    const int L = c.num_layers, rows = B * T;
    const ModelTensors<const float>& p = m.params;
    ModelInferActs& a = m.acts;
    float *x = a.x.data(), *ln = a.ln.data(), *mean = a.mean.data(), *rstd = a.rstd.data();
    detail::norm_forward(c, ln, mean, rstd, x, p.ln1w, p.ln1b, B, T);
    for (int l = 0; l < L; l++) {
        cpu::matmul_forward(a.qkv.data(), ln, p.qkvw + (size_t)l * QKV * C, tensor_at(p.qkvb, (size_t)l * QKV), B, T, C, QKV);
        attend(l);
        cpu::matmul_forward(a.proj.data(), a.atty.data(), p.attprojw + (size_t)l * C * C, tensor_at(p.attprojb, (size_t)l * C),
                            B, T, C, C);
        detail::residual_norm_forward(c, x, ln, mean, rstd, x, a.proj.data(), p.ln2w + l * C, tensor_at(p.ln2b, (size_t)l * C),
                                      B, T);
        cpu::matmul_forward(a.fch.data(), ln, p.fcw + (size_t)l * FC * C, tensor_at(p.fcb, (size_t)l * FC), B, T, C, FC);
        if (c.mlp == MLP_SWIGLU) cpu::swiglu_forward(a.fch_act.data(), a.fch.data(), rows, H);
        else cpu::gelu_forward(a.fch_act.data(), a.fch.data(), (size_t)rows * H);
        cpu::matmul_forward(a.proj.data(), a.fch_act.data(), p.fcprojw + (size_t)l * C * H, tensor_at(p.fcprojb, (size_t)l * C),
                            B, T, H, C);
        const bool last = l + 1 == L;  // then the final norm, else the next layer's ln1
        detail::residual_norm_forward(c, x, ln, mean, rstd, x, a.proj.data(), last ? p.lnfw : p.ln1w + (l + 1) * C,
                                      last ? p.lnfb : tensor_at(p.ln1b, (size_t)(l + 1) * C), B, T);
    }
}

// The classifier (wte, or the untied lm_head) over `rows` rows of final-norm outputs h (rows, C).
inline void infer_logits(ModelInfer& m, const float* h, int rows) {
    const ModelConfig& c = m.config;
    const float* head = c.tied_head ? m.params.wte : m.params.lm_head;
    cpu::matmul_forward(m.acts.logits.data(), h, head, nullptr, 1, rows, c.channels, c.padded_vocab_size);
}
}  // namespace detail

// tokens (B, T) ids < V; sequence b is tokens[b*T .. b*T + lengths[b]), 1 <= lengths[b] <= T <= max_seq,
// then padding (causal attention: it never reaches a prompt position). Fills the cache for positions
// 0 .. lengths[b]-1 (the last S) and returns the logits (B, Vp) of each prompt's last position, or
// with all_positions (B, T, Vp).
inline const float* model_prefill(ModelInfer& m, const int* tokens, const int* lengths, int B, int T,
                                 bool all_positions = false) {
    const ModelConfig& c = m.config;
    if (B < 1 || B > m.B || T < 1 || T > m.max_seq)
        fail("internal: prefill of B=%d T=%d, the cache holds B=%d of %d positions", B, T, m.B, m.max_seq);
    for (int b = 0; b < B; b++)
        if (lengths[b] < 1 || lengths[b] > T) fail("internal: prefill length %d of sequence %d is not in [1, %d]",
                                                   lengths[b], b, T);
    for (size_t i = 0; i < (size_t)B * T; i++)
        if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
            fail("internal: prefill token id %d out of range [0, %d)", tokens[i], c.vocab_size);
    const int C = c.channels, NH = c.num_heads, NKV = c.num_kv_heads, HD = model_head_dim(c);
    ModelInferActs& a = m.acts;
    ModelKVCache& kv = m.cache;
    detail::infer_size_acts(m, (size_t)B * T, all_positions ? (size_t)B * T : (size_t)B);
    cpu::encoder_forward(a.x.data(), tokens, m.params.wte, m.params.wpe, B, T, C);  // wpe nullptr with RoPE
    detail::infer_layers(m, B, T, [&](int l) {
        if (c.position == POS_ROPE) cpu::rope_forward(a.qkv.data(), m.rope_cos.data(), m.rope_sin.data(), B, T, NH, NKV, HD);
        cpu::attention_forward(a.atty.data(), a.lse.data(), a.qkv.data(), B, T, NH, NKV, HD, c.window);
        cpu::kv_cache_fill(kv.k_layer(l), kv.v_layer(l), a.qkv.data(), lengths, B, T, NH, NKV, HD, kv.S);
    });
    if (all_positions) {
        detail::infer_logits(m, a.ln.data(), B * T);
    } else {
        for (int b = 0; b < B; b++)  // each prompt's last position, gathered into the front rows of proj
            std::copy_n(a.ln.data() + ((size_t)b * T + lengths[b] - 1) * C, C, a.proj.data() + (size_t)b * C);
        detail::infer_logits(m, a.proj.data(), B);
    }
    return a.logits.data();
}

// tokens (B): sequence b's next token, at position pos[b] (0 <= pos[b] < max_seq, with positions
// before it already in the cache), or pos[b] < 0 for an idle sequence (its token is not read).
// Returns the logits (B, Vp) of the new positions.
inline const float* model_decode_step(ModelInfer& m, const int* tokens, const int* pos, int B) {
    const ModelConfig& c = m.config;
    if (B < 1 || B > m.B) fail("internal: decode step of B=%d, the cache holds %d sequences", B, m.B);
    for (int b = 0; b < B; b++) {
        if (pos[b] >= m.max_seq) fail("internal: decode position %d of sequence %d is past --max-seq %d", pos[b], b,
                                      m.max_seq);
        if (pos[b] >= 0 && (tokens[b] < 0 || tokens[b] >= c.vocab_size))
            fail("internal: decode token id %d out of range [0, %d)", tokens[b], c.vocab_size);
    }
    const int C = c.channels, NH = c.num_heads, NKV = c.num_kv_heads, HD = model_head_dim(c);
    ModelInferActs& a = m.acts;
    ModelKVCache& kv = m.cache;
    detail::infer_size_acts(m, B, B);
    for (int b = 0; b < B; b++) {  // token b at its own position: a one-token encoder from wpe row pos[b]
        const int token = pos[b] < 0 ? 0 : tokens[b], p = pos[b] < 0 ? 0 : pos[b];
        cpu::encoder_forward(a.x.data() + (size_t)b * C, &token, m.params.wte, tensor_at(m.params.wpe, (size_t)p * C), 1,
                             1, C);
    }
    const size_t QKV = model_qkv_channels(c);
    detail::infer_layers(m, B, 1, [&](int l) {
        if (c.position == POS_ROPE)
            for (int b = 0; b < B; b++)
                if (pos[b] >= 0)
                    cpu::rope_forward(a.qkv.data() + b * QKV, m.rope_cos.data(), m.rope_sin.data(), 1, 1, NH, NKV, HD,
                                      pos[b]);
        cpu::kv_cache_append(kv.k_layer(l), kv.v_layer(l), a.qkv.data(), pos, B, NH, NKV, HD, kv.S);
        cpu::attention_decode(a.atty.data(), a.qkv.data(), kv.k_layer(l), kv.v_layer(l), pos, B, NH, NKV, HD, kv.S,
                              kv.window);
    });
    detail::infer_logits(m, a.ln.data(), B);
    return a.logits.data();
}

// ============================================================================ the trainer's samples
// `gen_tokens` tokens after one end-of-text token, drawn with sample_token at `temperature` from `rng`,
// through the cache (a one-token prefill, then a decode step per token); the CPU twin of the GPU's
// model_infer_sample (the same draws from the same RNG state). Build `m` with B = 1 over the parameters
// to sample from (the trainer's own buffer: no copy). A sample ends at the context end (m.max_seq
// tokens). The logits equal the full forward's up to float rounding (tests/cpu/test_generate.cpp).
inline std::vector<int> model_infer_sample(ModelInfer& m, int eot, int gen_tokens, float temperature, Rng& rng) {
    if (m.B != 1) fail("internal: model_infer_sample needs a model built for one sequence (B = %d)", m.B);
    const int one = 1;
    const float* logits = model_prefill(m, &eot, &one, 1, 1);
    std::vector<int> out;
    for (;;) {
        out.push_back(sample_token(logits, m.config.vocab_size, temperature, rng));
        const int pos = (int)out.size();  // the new token's position, after the end-of-text token at 0
        if (pos >= gen_tokens || pos == m.max_seq) return out;  // at the context end it is drawn, never fed
        logits = model_decode_step(m, &out.back(), &pos, 1);
    }
}
