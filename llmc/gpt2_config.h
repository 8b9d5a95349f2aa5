// gpt2_config.h: the model's shape and the layout of its parameters, shared by both trainers,
// the tests and the lab. All parameters live in ONE contiguous buffer in the order of
// GPT2_PARAM_NAMES (docs/design.md), so optimizer state and gradients use the same offsets and a
// later multi-GPU version can slice the buffers by rank.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include "llmc/utils.h"

struct GPT2Config {
    int max_seq_len;        // maxT
    int vocab_size;         // V
    int padded_vocab_size;  // Vp >= V, a multiple of 128 for the matmuls (or == V)
    int num_layers;         // L
    int num_heads;          // NH
    int num_kv_heads;       // NKV, divides NH: query head h uses key/value head h / (NH / NKV)
    int channels;           // C = NH * HD
    int window;             // 0 = full causal attention; W > 0: query t sees keys t-W+1 .. t
};

// The parameter tensors, in buffer order, written once: X(name, element count, decayed). Every
// list below (names, sizes, the named pointers of GPT2Tensors, the decay rule) expands this table.
// The counts read the locals Vp, C, L, maxT and QKV of gpt2_param_sizes. Shapes are row-major,
// "out x in" for matrices (y = x W^T + b), per layer stacked along a leading L.
#define GPT2_PARAMETER_TABLE(X)                                  \
    X(wte, Vp * C, true)              /* (Vp, C) token embedding, also the classifier */ \
    X(wpe, maxT * C, true)            /* (maxT, C) position embedding */                  \
    X(ln1w, L * C, false)             /* (L, C) */                                        \
    X(ln1b, L * C, false)             /* (L, C) */                                        \
    X(qkvw, L * QKV * C, true)        /* (L, QKV, C), QKV = (NH + 2*NKV) * HD */          \
    X(qkvb, L * QKV, false)           /* (L, QKV) */                                      \
    X(attprojw, L * C * C, true)      /* (L, C, C) */                                     \
    X(attprojb, L * C, false)         /* (L, C) */                                        \
    X(ln2w, L * C, false)             /* (L, C) */                                        \
    X(ln2b, L * C, false)             /* (L, C) */                                        \
    X(fcw, L * 4 * C * C, true)       /* (L, 4C, C) */                                    \
    X(fcb, L * 4 * C, false)          /* (L, 4C) */                                       \
    X(fcprojw, L * C * 4 * C, true)   /* (L, C, 4C) */                                    \
    X(fcprojb, L * C, false)          /* (L, C) */                                        \
    X(lnfw, C, false)                 /* (C) */                                           \
    X(lnfb, C, false)                 /* (C) */

// Index of each tensor in the table (gpt2_param::qkvw == 4), and their number.
namespace gpt2_param {
#define GPT2_X(name, count, decays) name,
enum : int { GPT2_PARAMETER_TABLE(GPT2_X) num_tensors };
#undef GPT2_X
}  // namespace gpt2_param
constexpr int NUM_PARAM_TENSORS = gpt2_param::num_tensors;

#define GPT2_X(name, count, decays) #name,
inline const char* const GPT2_PARAM_NAMES[NUM_PARAM_TENSORS] = {GPT2_PARAMETER_TABLE(GPT2_X)};
#undef GPT2_X

inline int gpt2_head_dim(const GPT2Config& c) { return c.channels / c.num_heads; }
// Width of the fused QKV projection: NH query heads plus NKV key and NKV value heads.
inline int gpt2_qkv_channels(const GPT2Config& c) {
    return (c.num_heads + 2 * c.num_kv_heads) * gpt2_head_dim(c);
}

inline void gpt2_param_sizes(const GPT2Config& c, size_t out[NUM_PARAM_TENSORS]) {
    const size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, maxT = c.max_seq_len;
    const size_t QKV = gpt2_qkv_channels(c);
#define GPT2_X(name, count, decays) out[gpt2_param::name] = (count);
    GPT2_PARAMETER_TABLE(GPT2_X)
#undef GPT2_X
}

inline size_t gpt2_num_params(const GPT2Config& c) {
    size_t s[NUM_PARAM_TENSORS], n = 0;
    gpt2_param_sizes(c, s);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) n += s[i];
    return n;
}

// Offsets of each tensor inside the contiguous buffer.
inline void gpt2_param_offsets(const GPT2Config& c, size_t out[NUM_PARAM_TENSORS]) {
    size_t s[NUM_PARAM_TENSORS], off = 0;
    gpt2_param_sizes(c, s);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { out[i] = off; off += s[i]; }
}

// Named views of one parameter-layout buffer (parameters, gradients, or anything of that layout):
// T = float on the CPU, floatX on the GPU. Layer l of a per-layer tensor starts at l * its size / L.
template <typename T>
struct GPT2Tensors {
#define GPT2_X(name, count, decays) T* name;
    GPT2_PARAMETER_TABLE(GPT2_X)
#undef GPT2_X
};

template <typename T>
inline GPT2Tensors<T> gpt2_point_tensors(T* base, const GPT2Config& c) {
    size_t off[NUM_PARAM_TENSORS];
    gpt2_param_offsets(c, off);
    GPT2Tensors<T> t;
#define GPT2_X(name, count, decays) t.name = base + off[gpt2_param::name];
    GPT2_PARAMETER_TABLE(GPT2_X)
#undef GPT2_X
    return t;
}

// Weight decay applies to the embeddings and the weight matrices, never to biases or LayerNorm.
inline bool gpt2_param_decays(int i) {
#define GPT2_X(name, count, decays) decays,
    static constexpr bool table[NUM_PARAM_TENSORS] = {GPT2_PARAMETER_TABLE(GPT2_X)};
#undef GPT2_X
    return table[i];
}

// The optimizer step's settings, from the run's flags (lr from the schedule, per step).
struct OptimizerSettings {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
};

// Checks a config read from a file or built from flags; `what` names the source in the message.
inline void gpt2_validate_config(const GPT2Config& c, const char* what) {
    if (c.max_seq_len <= 0 || c.max_seq_len > (1 << 20)) fail("%s: max_seq_len %d out of range", what, c.max_seq_len);
    if (c.vocab_size <= 0 || c.vocab_size > 65536) fail("%s: vocab_size %d out of range (token ids are uint16)", what, c.vocab_size);
    if (c.padded_vocab_size < c.vocab_size || c.padded_vocab_size > (1 << 20))
        fail("%s: padded_vocab_size %d must be >= vocab_size %d", what, c.padded_vocab_size, c.vocab_size);
    if (c.num_layers <= 0 || c.num_layers > 1024) fail("%s: num_layers %d out of range", what, c.num_layers);
    if (c.num_heads <= 0 || c.channels <= 0 || c.channels > 65536 || c.channels % c.num_heads != 0)
        fail("%s: channels %d must be a positive multiple of num_heads %d", what, c.channels, c.num_heads);
    if (c.num_kv_heads < 1 || c.num_kv_heads > c.num_heads || c.num_heads % c.num_kv_heads != 0)
        fail("%s: num_kv_heads %d must divide num_heads %d (1 <= num_kv_heads <= num_heads)", what, c.num_kv_heads,
             c.num_heads);
    if (c.window < 0) fail("%s: attention window %d must be >= 0 (0 = full causal)", what, c.window);
}

// "dN": N layers, 64*N channels, N heads of 64: d12 is GPT-2 124M; other N scale width with depth
// (d24 ~ 0.7B), so they are not the GPT-2 350M/774M shapes (those load from checkpoints).
inline GPT2Config gpt2_config_from_descriptor(const char* desc) {
    int64_t n = 0;
    if (desc[0] != 'd' || !parse_int64(desc + 1, &n) || n <= 0 || n > 96)
        fail("--init %s: not a model descriptor (expected dN, e.g. d12 for GPT-2 124M) or an existing checkpoint file", desc);
    GPT2Config c;
    c.max_seq_len = 1024;
    c.vocab_size = 50257;
    c.padded_vocab_size = 50304;
    c.num_layers = (int)n;
    c.channels = 64 * (int)n;
    c.num_heads = (int)n;
    c.num_kv_heads = (int)n;
    c.window = 0;
    gpt2_validate_config(c, desc);
    return c;
}

inline void gpt2_print_config(const GPT2Config& c) {
    printf("model: L=%d C=%d NH=%d NKV=%d W=%d maxT=%d V=%d (padded %d) params=%zu\n", c.num_layers, c.channels,
           c.num_heads, c.num_kv_heads, c.window, c.max_seq_len, c.vocab_size, c.padded_vocab_size, gpt2_num_params(c));
}

#include "llmc/rand.h"
// GPT-2 init in fp32 (both trainers, so the same seed gives the same model on CPU and GPU):
// matrices and embeddings N(0, 0.02), the two residual projections N(0, 0.02/sqrt(2L)),
// biases 0, LayerNorm weights 1; the padded wte rows stay 0. Tensors are filled in layout order
// from one stream, so the result does not depend on threading.
inline void gpt2_init_params(float* params, const GPT2Config& c, uint64_t seed) {
    size_t sizes[NUM_PARAM_TENSORS];
    gpt2_param_sizes(c, sizes);
    Rng rng(seed);
    float* p = params;
    const float resid_std = 0.02f / std::sqrt(2.0f * c.num_layers);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        size_t n = sizes[i];
        if (i == gpt2_param::wte) {  // real rows random, padded rows zero
            size_t real = (size_t)c.vocab_size * c.channels;
            for (size_t k = 0; k < real; k++) p[k] = 0.02f * rng.normal();
            for (size_t k = real; k < n; k++) p[k] = 0.0f;
        } else if (gpt2_param_decays(i)) {
            const bool residual_proj = i == gpt2_param::attprojw || i == gpt2_param::fcprojw;
            float std = residual_proj ? resid_std : 0.02f;
            for (size_t k = 0; k < n; k++) p[k] = std * rng.normal();
        } else {
            const bool ln_weight = i == gpt2_param::ln1w || i == gpt2_param::ln2w || i == gpt2_param::lnfw;
            float v = ln_weight ? 1.0f : 0.0f;  // LayerNorm weights 1, biases 0
            for (size_t k = 0; k < n; k++) p[k] = v;
        }
        p += n;
    }
}
