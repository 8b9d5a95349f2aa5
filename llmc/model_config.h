// model_config.h: the model's config (shape, and the knobs that make it GPT-2 or Llama-style) and the
// layout of its parameters, shared by both trainers, the tests and the lab. All parameters live in
// ONE contiguous buffer in the order of MODEL_PARAM_NAMES (docs/design.md), so optimizer state and
// gradients use the same offsets and ZeRO slices the buffers by rank (llmc/zero.h).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include "llmc/utils.h"

// The two model families. The knobs below say what a model computes; the architecture names the
// family: the defaults of a fresh model, and which Hugging Face class it maps to.
enum ModelArch : int { ARCH_GPT2 = 0, ARCH_LLAMA = 1 };
enum NormKind : int { NORM_LAYERNORM = 0, NORM_RMSNORM = 1 };
enum PositionKind : int { POS_LEARNED = 0, POS_ROPE = 1 };
enum MlpKind : int { MLP_GELU = 0, MLP_SWIGLU = 1 };
enum RopeScalingKind : int { ROPE_SCALING_NONE = 0, ROPE_SCALING_LLAMA3 = 1 };

// RoPE frequency scaling, config.json's rope_scaling / rope_parameters (llmc/cpu/rope.h applies it).
// type ROPE_SCALING_NONE: plain RoPE, every other field 0. ROPE_SCALING_LLAMA3 (rope_type "llama3",
// Llama 3.1 / 3.2): with wavelength w = 2 pi / f of the frequency f = theta^(-2i/HD) and
// L = original_max_pos, frequencies with w < L / high_freq_factor are kept, those with
// w > L / low_freq_factor divided by factor, and those between blended: with
// s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor), f' = (1 - s) f / factor + s f.
struct RopeScaling {
    int type = ROPE_SCALING_NONE;
    double factor = 0.0;           // >= 1 (Llama 3.1: 8, Llama 3.2: 32)
    double low_freq_factor = 0.0;  // > 0 (1)
    double high_freq_factor = 0.0; // > low_freq_factor (4)
    int original_max_pos = 0;      // original_max_position_embeddings, >= 1 (8192)
};

inline bool rope_same_scaling(const RopeScaling& a, const RopeScaling& b) {
    return a.type == b.type && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
           a.high_freq_factor == b.high_freq_factor && a.original_max_pos == b.original_max_pos;
}

// The defaults of the fields after `window` are GPT-2's: a config that sets only the fields up to
// `window` (a version-1 model file) is a GPT-2.
struct ModelConfig {
    int max_seq_len;        // maxT
    int vocab_size;         // V
    int padded_vocab_size;  // Vp >= V, a multiple of 128 for the matmuls (or == V)
    int num_layers;         // L
    int num_heads;          // NH
    int num_kv_heads;       // NKV, divides NH: query head h uses key/value head h / (NH / NKV)
    int channels;           // C = NH * HD
    int window;             // 0 = full causal attention; W > 0: query t sees keys t-W+1 .. t
    int architecture = ARCH_GPT2;
    int norm = NORM_LAYERNORM;   // LayerNorm (weight and bias) | RMSNorm (weight only)
    int position = POS_LEARNED;  // learned wpe added to the token embedding | RoPE on Q and K
    int mlp = MLP_GELU;          // fc -> GELU (tanh) -> fcproj | fc = [gate | up] -> SwiGLU -> fcproj
    int mlp_hidden = 0;          // H, the MLP's hidden width; 0 = 4C (GPT-2's), see model_mlp_hidden
    int qkv_bias = 1;            // 1: the qkv projection has a bias (Qwen2: qkv_bias 1, biases 0)
    int biases = 1;              // 1: the attproj, fc and fcproj projections have biases
    int tied_head = 1;           // 1: logits through wte; 0: through a separate lm_head
    double norm_eps = 1e-5;      // LayerNorm: 1e-5 (the kernels' constant); RMSNorm: config.json's rms_norm_eps
    double rope_theta = 0.0;     // RoPE base (10000 Llama 2, 500000 Llama 3); 0 with learned positions
    RopeScaling rope_scaling;    // RoPE frequency scaling (Llama 3.x's llama3); none by default
};

inline int model_head_dim(const ModelConfig& c) { return c.channels / c.num_heads; }
// Width of the fused QKV projection: NH query heads plus NKV key and NKV value heads.
inline int model_qkv_channels(const ModelConfig& c) {
    return (c.num_heads + 2 * c.num_kv_heads) * model_head_dim(c);
}
// The MLP's hidden width H: mlp_hidden, where 0 means GPT-2's 4C.
inline int model_mlp_hidden(const ModelConfig& c) { return c.mlp_hidden > 0 ? c.mlp_hidden : 4 * c.channels; }
// Rows of the fc matmul: H, or 2H for SwiGLU's [gate | up].
inline int model_fc_channels(const ModelConfig& c) { return (c.mlp == MLP_SWIGLU ? 2 : 1) * model_mlp_hidden(c); }

inline bool model_same_config(const ModelConfig& a, const ModelConfig& b) {
    return a.max_seq_len == b.max_seq_len && a.vocab_size == b.vocab_size &&
           a.padded_vocab_size == b.padded_vocab_size && a.num_layers == b.num_layers &&
           a.num_heads == b.num_heads && a.num_kv_heads == b.num_kv_heads && a.channels == b.channels &&
           a.window == b.window && a.architecture == b.architecture && a.norm == b.norm &&
           a.position == b.position && a.mlp == b.mlp && model_mlp_hidden(a) == model_mlp_hidden(b) &&
           a.qkv_bias == b.qkv_bias && a.biases == b.biases && a.tied_head == b.tied_head && a.norm_eps == b.norm_eps &&
           a.rope_theta == b.rope_theta && rope_same_scaling(a.rope_scaling, b.rope_scaling);
}

// True when the config is GPT-2 in every knob (a version-1 model file can hold it).
inline bool model_is_plain_gpt2(const ModelConfig& c) {
    return c.architecture == ARCH_GPT2 && c.norm == NORM_LAYERNORM && c.position == POS_LEARNED &&
           c.mlp == MLP_GELU && model_mlp_hidden(c) == 4 * c.channels && c.qkv_bias == 1 && c.biases == 1 &&
           c.tied_head == 1 && c.norm_eps == 1e-5 && c.rope_theta == 0.0 && c.rope_scaling.type == ROPE_SCALING_NONE;
}

// The parameter tensors, in buffer order, written once: X(name, element count, decayed). Every
// list below (names, sizes, the named pointers of ModelTensors, the decay rule) expands this table.
// The counts read the locals of model_param_sizes: Vp, C, L, maxT, QKV, H (the MLP hidden width),
// FC (the fc rows: H, or 2H for SwiGLU's [gate | up]) and the 0/1 switches learned (wpe), ln_bias
// (LayerNorm), qkv_bias (qkv), bias (attproj, fc, fcproj) and untied (lm_head). A tensor the config
// lacks has count 0.
// Shapes are row-major, "out x in" for matrices (y = x W^T + b), per layer stacked along a leading L.
#define MODEL_PARAMETER_TABLE(X)                                        \
    X(wte, Vp * C, true)                     /* (Vp, C) token embedding, also the tied head */ \
    X(wpe, learned * maxT * C, true)         /* (maxT, C) position embedding, learned only */   \
    X(ln1w, L * C, false)                    /* (L, C) */                                       \
    X(ln1b, ln_bias * L * C, false)          /* (L, C) LayerNorm only */                        \
    X(qkvw, L * QKV * C, true)               /* (L, QKV, C), QKV = (NH + 2*NKV) * HD */         \
    X(qkvb, qkv_bias * L * QKV, false)       /* (L, QKV) */                                     \
    X(attprojw, L * C * C, true)             /* (L, C, C) */                                    \
    X(attprojb, bias * L * C, false)         /* (L, C) */                                       \
    X(ln2w, L * C, false)                    /* (L, C) */                                       \
    X(ln2b, ln_bias * L * C, false)          /* (L, C) LayerNorm only */                        \
    X(fcw, L * FC * C, true)                 /* (L, FC, C): GELU (L, H, C), SwiGLU (L, 2H, C) */ \
    X(fcb, bias * L * FC, false)             /* (L, FC) */                                      \
    X(fcprojw, L * C * H, true)              /* (L, C, H) */                                    \
    X(fcprojb, bias * L * C, false)          /* (L, C) */                                       \
    X(lnfw, C, false)                        /* (C) */                                          \
    X(lnfb, ln_bias * C, false)              /* (C) LayerNorm only */                           \
    X(lm_head, untied * Vp * C, true)        /* (Vp, C) untied output head */

// Index of each tensor in the table (model_param::qkvw == 4), and their number.
namespace model_param {
#define PARAM_X(name, count, decays) name,
enum : int { MODEL_PARAMETER_TABLE(PARAM_X) num_tensors };
#undef PARAM_X
}  // namespace model_param
constexpr int NUM_PARAM_TENSORS = model_param::num_tensors;

#define PARAM_X(name, count, decays) #name,
inline const char* const MODEL_PARAM_NAMES[NUM_PARAM_TENSORS] = {MODEL_PARAMETER_TABLE(PARAM_X)};
#undef PARAM_X


inline void model_param_sizes(const ModelConfig& c, size_t out[NUM_PARAM_TENSORS]) {
    const size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, maxT = c.max_seq_len;
    const size_t QKV = model_qkv_channels(c), H = model_mlp_hidden(c), FC = c.mlp == MLP_SWIGLU ? 2 * H : H;
    const size_t learned = c.position == POS_LEARNED, ln_bias = c.norm == NORM_LAYERNORM;
    const size_t qkv_bias = c.qkv_bias != 0, bias = c.biases != 0, untied = c.tied_head == 0;
#define PARAM_X(name, count, decays) out[model_param::name] = (count);
    MODEL_PARAMETER_TABLE(PARAM_X)
#undef PARAM_X
}

inline size_t model_num_params(const ModelConfig& c) {
    size_t s[NUM_PARAM_TENSORS], n = 0;
    model_param_sizes(c, s);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) n += s[i];
    return n;
}

// Offsets of each tensor inside the contiguous buffer.
inline void model_param_offsets(const ModelConfig& c, size_t out[NUM_PARAM_TENSORS]) {
    size_t s[NUM_PARAM_TENSORS], off = 0;
    model_param_sizes(c, s);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { out[i] = off; off += s[i]; }
}

// base + offset inside a tensor of ModelTensors, or nullptr for a tensor the config lacks (count 0:
// the biases of a bias-free model), so a layer's slice of an absent tensor stays absent.
template <typename T>
inline T* tensor_at(T* base, size_t offset) { return base ? base + offset : nullptr; }

// Named views of one parameter-layout buffer (parameters, gradients, or anything of that layout):
// T = float on the CPU, floatX on the GPU. Layer l of a per-layer tensor starts at l * its size / L.
// A tensor the config lacks is nullptr, so code that forgets to check crashes at once.
template <typename T>
struct ModelTensors {
#define PARAM_X(name, count, decays) T* name;
    MODEL_PARAMETER_TABLE(PARAM_X)
#undef PARAM_X
};

template <typename T>
inline ModelTensors<T> model_point_tensors(T* base, const ModelConfig& c) {
    size_t off[NUM_PARAM_TENSORS], n[NUM_PARAM_TENSORS];
    model_param_offsets(c, off);
    model_param_sizes(c, n);
    ModelTensors<T> t;
#define PARAM_X(name, count, decays) t.name = n[model_param::name] ? base + off[model_param::name] : nullptr;
    MODEL_PARAMETER_TABLE(PARAM_X)
#undef PARAM_X
    return t;
}

// The tensor of index i (model_param::...) of a view, for code that walks the table.
template <typename T>
inline T*& model_tensor(ModelTensors<T>& t, int i) {
    switch (i) {
#define PARAM_X(name, count, decays) \
    case model_param::name:          \
        return t.name;
        MODEL_PARAMETER_TABLE(PARAM_X)
#undef PARAM_X
    }
    fail("internal: parameter tensor %d of %d", i, NUM_PARAM_TENSORS);
}

// The tensors made of L equal per-layer slices (ln1w .. fcprojb); the others (wte, wpe, lnfw, lnfb,
// lm_head) are outside the layers.
inline bool model_param_per_layer(int i) { return i >= model_param::ln1w && i <= model_param::fcprojb; }

// Layer l's slices of a whole-buffer view: each per-layer tensor advanced to layer l (absent ones
// stay nullptr); the tensors outside the layers are left as they are. What the backward writes
// layer l's gradients into on one process.
template <typename T>
inline ModelTensors<T> model_layer_slices(ModelTensors<T> t, const ModelConfig& c, int l) {
    size_t n[NUM_PARAM_TENSORS];
    model_param_sizes(c, n);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        if (model_param_per_layer(i)) model_tensor(t, i) = tensor_at(model_tensor(t, i), (size_t)l * (n[i] / c.num_layers));
    return t;
}

// Weight decay applies to the embeddings and the weight matrices (lm_head too), never to biases or norms.
inline bool model_param_decays(int i) {
#define PARAM_X(name, count, decays) decays,
    static constexpr bool table[NUM_PARAM_TENSORS] = {MODEL_PARAMETER_TABLE(PARAM_X)};
#undef PARAM_X
    return table[i];
}

// --optimizer muon: the tensors Muon updates, stored (out, in): qkvw as three matrices Q (NH HD, C),
// K and V (NKV HD, C); attprojw (C, C); fcw (H, C), or SwiGLU's gate and up as two (H, C); fcprojw (C, H)
// (cpu::muon_row_blocks). AdamW updates the others (embeddings, lm_head, norms, biases).
inline bool model_param_muon(int i) {
    return i == model_param::qkvw || i == model_param::attprojw || i == model_param::fcw || i == model_param::fcprojw;
}

// The optimizer of a run; a training state records it (llmc/formats.h, TrainState::optimizer).
enum OptimizerKind : int { OPTIMIZER_ADAMW = 0, OPTIMIZER_MUON = 1 };
inline const char* optimizer_name(int kind) { return kind == OPTIMIZER_MUON ? "muon" : "adamw"; }

// The optimizer step's settings, from the run's flags (lr and muon_lr from the schedule, per step).
// AdamW's fields first: every tensor, or with OPTIMIZER_MUON those model_param_muon leaves out.
struct OptimizerSettings {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    int optimizer = OPTIMIZER_ADAMW;
    // OPTIMIZER_MUON: torch.optim.Muon's settings (Nesterov), llmc/cpu/muon.h
    float muon_lr = 0.0f;               // this step's, before the adjustment below
    float muon_momentum = 0.95f;
    float muon_weight_decay = 0.0f;     // decoupled: w *= 1 - muon_lr * muon_weight_decay
    int muon_ns_steps = 5;              // Newton-Schulz iterations
    bool muon_match_rms_adamw = false;  // the lr adjustment: 0.2 sqrt(max(rows, cols)), else original's
                                        // sqrt(max(1, rows / cols))
};

// Checks a config read from a file or built from flags; `what` names the source in the message.
inline void model_validate_config(const ModelConfig& c, const char* what) {
    if (c.max_seq_len <= 0 || c.max_seq_len > (1 << 20)) fail("%s: max_seq_len %d out of range", what, c.max_seq_len);
    if (c.vocab_size <= 0 || c.vocab_size > (1 << 20)) fail("%s: vocab_size %d out of range [1, 2^20]", what, c.vocab_size);
    if (c.padded_vocab_size < c.vocab_size || c.padded_vocab_size > (1 << 20))
        fail("%s: padded_vocab_size %d must be >= vocab_size %d", what, c.padded_vocab_size, c.vocab_size);
    if (c.num_layers <= 0 || c.num_layers > 1024) fail("%s: num_layers %d out of range", what, c.num_layers);
    if (c.num_heads <= 0 || c.channels <= 0 || c.channels > 65536 || c.channels % c.num_heads != 0)
        fail("%s: channels %d must be a positive multiple of num_heads %d", what, c.channels, c.num_heads);
    if (c.num_kv_heads < 1 || c.num_kv_heads > c.num_heads || c.num_heads % c.num_kv_heads != 0)
        fail("%s: num_kv_heads %d must divide num_heads %d (1 <= num_kv_heads <= num_heads)", what, c.num_kv_heads,
             c.num_heads);
    if (c.window < 0) fail("%s: attention window %d must be >= 0 (0 = full causal)", what, c.window);
    if (c.architecture != ARCH_GPT2 && c.architecture != ARCH_LLAMA)
        fail("%s: architecture %d is not 0 (gpt2) or 1 (llama)", what, c.architecture);
    if (c.norm != NORM_LAYERNORM && c.norm != NORM_RMSNORM)
        fail("%s: norm %d is not 0 (LayerNorm) or 1 (RMSNorm)", what, c.norm);
    if (c.position != POS_LEARNED && c.position != POS_ROPE)
        fail("%s: position %d is not 0 (learned) or 1 (RoPE)", what, c.position);
    if (c.mlp != MLP_GELU && c.mlp != MLP_SWIGLU) fail("%s: mlp %d is not 0 (GELU) or 1 (SwiGLU)", what, c.mlp);
    if (c.mlp_hidden < 0 || c.mlp_hidden > (1 << 20))
        fail("%s: mlp_hidden %d out of range [1, 1048576]", what, c.mlp_hidden);
    if ((c.qkv_bias != 0 && c.qkv_bias != 1) || (c.biases != 0 && c.biases != 1) ||
        (c.tied_head != 0 && c.tied_head != 1))
        fail("%s: qkv_bias %d, biases %d and tied_head %d must be 0 or 1", what, c.qkv_bias, c.biases, c.tied_head);
    if (c.norm == NORM_LAYERNORM && c.norm_eps != 1e-5)
        fail("%s: LayerNorm eps %g: only 1e-5 is supported (the kernels' constant)", what, c.norm_eps);
    if (c.norm == NORM_RMSNORM && !(c.norm_eps > 0.0 && c.norm_eps < 1.0))
        fail("%s: RMSNorm eps %g must be in (0, 1)", what, c.norm_eps);
    if (c.position == POS_ROPE && !(c.rope_theta > 1.0 && c.rope_theta < 1e12))
        fail("%s: RoPE needs theta in (1, 1e12), got %g", what, c.rope_theta);
    if (c.position == POS_ROPE && model_head_dim(c) % 2 != 0)
        fail("%s: RoPE needs an even head dim (channels / heads), got %d", what, model_head_dim(c));
    if (c.position == POS_LEARNED && c.rope_theta != 0.0)
        fail("%s: rope_theta %g given for learned positions (0 there)", what, c.rope_theta);
    const RopeScaling& r = c.rope_scaling;
    if (r.type != ROPE_SCALING_NONE && r.type != ROPE_SCALING_LLAMA3)
        fail("%s: rope_scaling type %d is not 0 (none) or 1 (llama3)", what, r.type);
    if (r.type == ROPE_SCALING_NONE && (r.factor != 0.0 || r.low_freq_factor != 0.0 || r.high_freq_factor != 0.0 ||
                                        r.original_max_pos != 0))
        fail("%s: RoPE scaling parameters without a scaling type (factor %g, low_freq_factor %g, high_freq_factor %g, "
             "original_max_position_embeddings %d: all 0 without scaling)", what, r.factor, r.low_freq_factor,
             r.high_freq_factor, r.original_max_pos);
    if (r.type == ROPE_SCALING_LLAMA3) {
        if (c.position != POS_ROPE) fail("%s: llama3 RoPE scaling given for learned positions (RoPE only)", what);
        if (!(r.factor >= 1.0 && r.factor <= 1e6))
            fail("%s: llama3 RoPE scaling factor %g must be in [1, 1e6]", what, r.factor);
        if (!(r.low_freq_factor > 0.0 && r.low_freq_factor <= 1e6))
            fail("%s: llama3 RoPE scaling low_freq_factor %g must be in (0, 1e6]", what, r.low_freq_factor);
        if (!(r.high_freq_factor > r.low_freq_factor && r.high_freq_factor <= 1e6))
            fail("%s: llama3 RoPE scaling high_freq_factor %g must be greater than low_freq_factor %g (and <= 1e6)",
                 what, r.high_freq_factor, r.low_freq_factor);
        if (r.original_max_pos < 1 || r.original_max_pos > (1 << 24))
            fail("%s: llama3 RoPE scaling original_max_position_embeddings %d out of range [1, 2^24]", what,
                 r.original_max_pos);
    }
}

// A fresh model's config from --init's descriptor (its --help is in llmc/train_config.h):
//   dN      GPT-2 with N layers, 64*N channels, N heads of 64: d12 is GPT-2 124M, and width grows
//           with depth (d24 ~ 0.7B), unlike llm.c's d24/d36/d48, which are the zoo's GPT-2 shapes
//   gpt2:L24,C1024,H16   a GPT-2-family model of any shape (vocab 50257)
//   llama:L12,C768,H12[,KV4][,F2048][,V50257][,theta10000][,eps1e-5][,untied]
//           a Llama-family model (RMSNorm, RoPE, SwiGLU, no biases): KV key/value heads (default H),
//           SwiGLU hidden F (default 8C/3 rounded up to a multiple of 64), vocab V (50257), RoPE
//           theta (10000), RMSNorm eps (1e-5), `untied` for a separate lm_head (default tied)
// All have maxT = 1024 (--max-seq changes it) and V padded to a multiple of 128.
inline ModelConfig model_shape(int L, int C, int NH, int V) {
    ModelConfig c;
    c.max_seq_len = 1024;
    c.vocab_size = V;
    c.padded_vocab_size = (V + 127) / 128 * 128;
    c.num_layers = L;
    c.channels = C;
    c.num_heads = NH;
    c.num_kv_heads = NH;
    c.window = 0;
    c.mlp_hidden = 4 * C;
    return c;
}

namespace detail {
// One `KEYvalue` item of a llama: descriptor: true and *v when `item` is key followed by a number.
inline bool descriptor_item(const std::string& item, const char* key, double* v) {
    const size_t n = strlen(key);
    if (item.compare(0, n, key) != 0 || item.size() == n) return false;
    const std::string num = item.substr(n);
    if (num.find_first_not_of("0123456789.e-+") != std::string::npos) return false;
    char* end = nullptr;
    *v = strtod(num.c_str(), &end);
    return *end == '\0' && std::isfinite(*v);
}

inline ModelConfig llama_config_from_descriptor(const char* desc) {
    const char* usage = "expected llama:L<layers>,C<channels>,H<heads>[,KV<kv heads>][,F<mlp hidden>][,V<vocab>]"
                        "[,theta<x>][,eps<x>][,untied], e.g. llama:L12,C768,H12,KV4,F2048";
    double L = 0, C = 0, NH = 0, NKV = 0, F = 0, V = 50257, theta = 10000.0, eps = 1e-5, untied = 0;
    // KV before H and theta before the single letters: the first key that matches an item names it
    const struct { const char* key; double* value; } keys[] = {{"KV", &NKV}, {"theta", &theta}, {"eps", &eps},
        {"L", &L}, {"C", &C}, {"H", &NH}, {"F", &F}, {"V", &V}, {"untied", &untied}};
    const size_t n_keys = sizeof keys / sizeof keys[0];
    bool given[n_keys] = {};
    std::string rest(desc + 6);
    while (!rest.empty()) {
        const size_t comma = rest.find(',');
        const std::string item = rest.substr(0, comma);
        rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
        if (comma != std::string::npos && rest.empty()) fail("--init %s: a trailing comma (%s)", desc, usage);
        double v = 1;  // `untied` stands alone, the other keys are followed by a number
        size_t k = 0;
        while (k < n_keys && !(strcmp(keys[k].key, "untied") == 0 ? item == "untied"
                                                                  : descriptor_item(item, keys[k].key, &v)))
            k++;
        if (k == n_keys)
            fail("--init %s: '%s' is not an item of a llama descriptor (%s)", desc, item.c_str(), usage);
        if (given[k]) fail("--init %s: %s is given twice (%s)", desc, keys[k].key, usage);
        given[k] = true;
        *keys[k].value = v;
    }
    for (double x : {L, C, NH, NKV, F, V})
        if (x != std::floor(x) || x < 0 || x > (1 << 24))
            fail("--init %s: sizes must be whole numbers (%s)", desc, usage);
    if (L < 1 || C < 1 || NH < 1) fail("--init %s: L, C and H are required (%s)", desc, usage);
    ModelConfig c = model_shape((int)L, (int)C, (int)NH, (int)V);
    c.architecture = ARCH_LLAMA;
    c.norm = NORM_RMSNORM;
    c.position = POS_ROPE;
    c.mlp = MLP_SWIGLU;
    c.qkv_bias = c.biases = 0;
    c.tied_head = untied != 0 ? 0 : 1;
    c.num_kv_heads = NKV > 0 ? (int)NKV : (int)NH;
    c.mlp_hidden = F > 0 ? (int)F : (int)((8 * (int64_t)C / 3 + 63) / 64 * 64);
    c.norm_eps = eps;
    c.rope_theta = theta;
    return c;
}

// gpt2:L<layers>,C<channels>,H<heads>: a GPT-2-family model of that shape (vocab 50257)
inline ModelConfig gpt2_config_from_descriptor(const char* desc) {
    const char* usage = "expected gpt2:L<layers>,C<channels>,H<heads>, e.g. gpt2:L24,C1024,H16";
    int L = 0, C = 0, NH = 0, used = 0;
    if (strpbrk(desc, " \t\n+-") != nullptr || sscanf(desc, "gpt2:L%d,C%d,H%d%n", &L, &C, &NH, &used) != 3 || desc[used] != '\0' || L < 1 || C < 1 ||
        NH < 1 || L > (1 << 24) || C > (1 << 24) || NH > (1 << 24))
        fail("--init %s: not a gpt2 descriptor (%s)", desc, usage);
    return model_shape(L, C, NH, 50257);
}
}  // namespace detail

// The model zoo: the names --init accepts beside dN and llama:... Each row is a descriptor of the
// grammar above, plus llama3 RoPE scaling where the real model has it (factor, low, high, original
// max positions). maxT stays 1024 (--max-seq changes it); the published models' vocabularies and
// RoPE thetas are kept, so an imported checkpoint of that model has this shape.
struct ZooModel {
    const char* name;
    const char* descriptor;
    double rope_llama3[4];  // factor, low_freq_factor, high_freq_factor, original_max_pos; all 0 = none
    const char* about;
};
inline constexpr ZooModel MODEL_ZOO[] = {
    {"gpt2", "d12", {}, "GPT-2 124M: 12 layers, 768 channels, 12 heads"},
    {"gpt2-medium", "gpt2:L24,C1024,H16", {}, "GPT-2 350M"},
    {"gpt2-large", "gpt2:L36,C1280,H20", {}, "GPT-2 774M"},
    {"gpt2-xl", "gpt2:L48,C1600,H25", {}, "GPT-2 1.5B"},
    {"llama-114m", "llama:L12,C768,H12,KV4,F2048", {}, "a Llama-style 114M with GPT-2's vocabulary (GQA 12/4)"},
    {"llama3.2-1b", "llama:L16,C2048,H32,KV8,F8192,V128256,theta500000", {32, 1, 4, 8192}, "Llama 3.2 1B's shape"},
    {"llama3.2-3b", "llama:L28,C3072,H24,KV8,F8192,V128256,theta500000", {32, 1, 4, 8192}, "Llama 3.2 3B's shape"},
    {"llama3.1-8b", "llama:L32,C4096,H32,KV8,F14336,V128256,theta500000,untied", {8, 1, 4, 8192},
     "Llama 3.1 8B's shape"},
};

// "gpt2, gpt2-medium, ..., llama3.1-8b": the zoo's names, for --help and error messages
inline std::string model_zoo_names() {
    std::string s;
    for (const ZooModel& z : MODEL_ZOO) s += std::string(s.empty() ? "" : ", ") + z.name;
    return s;
}

inline ModelConfig model_config_from_descriptor(const char* desc) {
    for (const ZooModel& z : MODEL_ZOO)
        if (strcmp(desc, z.name) == 0) {
            ModelConfig c = model_config_from_descriptor(z.descriptor);
            if (z.rope_llama3[0] != 0) {
                c.rope_scaling = {ROPE_SCALING_LLAMA3, z.rope_llama3[0], z.rope_llama3[1], z.rope_llama3[2],
                                  (int)z.rope_llama3[3]};
                model_validate_config(c, desc);
            }
            return c;
        }
    ModelConfig c;
    int64_t n = 0;
    if (strncmp(desc, "llama:", 6) == 0) {
        c = detail::llama_config_from_descriptor(desc);
    } else if (strncmp(desc, "gpt2:", 5) == 0) {
        c = detail::gpt2_config_from_descriptor(desc);
    } else if (desc[0] == 'd' && parse_int64(desc + 1, &n) && n > 0 && n <= 96) {
        c = model_shape((int)n, 64 * (int)n, (int)n, 50257);
    } else {
        fail("--init %s: not a model descriptor (a name of the zoo: %s; dN such as d12; llama:L12,C768,H12,...; "
             "gpt2:L24,C1024,H16) or an existing checkpoint file", desc, model_zoo_names().c_str());
    }
    model_validate_config(c, desc);
    return c;
}

inline const char* model_arch_name(const ModelConfig& c) { return c.architecture == ARCH_LLAMA ? "llama" : "gpt2"; }

inline void model_print_config(const ModelConfig& c) {
    printf("model: %s L=%d C=%d NH=%d NKV=%d W=%d maxT=%d V=%d (padded %d) params=%zu\n", model_arch_name(c),
           c.num_layers, c.channels, c.num_heads, c.num_kv_heads, c.window, c.max_seq_len, c.vocab_size,
           c.padded_vocab_size, model_num_params(c));
    if (model_is_plain_gpt2(c)) return;
    char pos[192] = "learned positions";
    if (c.position == POS_ROPE) snprintf(pos, sizeof pos, "RoPE theta %g", c.rope_theta);
    const RopeScaling& r = c.rope_scaling;
    if (c.position == POS_ROPE && r.type == ROPE_SCALING_LLAMA3)
        snprintf(pos, sizeof pos, "RoPE theta %g llama3 scaling (factor %g, low_freq_factor %g, high_freq_factor %g, "
                 "original_max_position_embeddings %d)", c.rope_theta, r.factor, r.low_freq_factor,
                 r.high_freq_factor, r.original_max_pos);
    const char* biases = c.qkv_bias == c.biases ? (c.biases ? "biases" : "no biases")
                                                : c.qkv_bias ? "q/k/v biases only" : "attproj/fc/fcproj biases";
    printf("model: %s eps %g, %s, %s hidden %d, %s, %s head\n", c.norm == NORM_RMSNORM ? "RMSNorm" : "LayerNorm",
           c.norm_eps, pos, c.mlp == MLP_SWIGLU ? "SwiGLU" : "GELU", model_mlp_hidden(c), biases,
           c.tied_head ? "tied" : "untied");
}

#include "llmc/rand.h"
// GPT-2 init in fp32 (both trainers, so the same seed gives the same model on CPU and GPU):
// matrices and embeddings N(0, 0.02), the two residual projections N(0, 0.02/sqrt(2L)), biases 0,
// norm weights 1; the padded rows of wte and lm_head stay 0. Llama models too (HF draws N(0, 0.02)
// everywhere). Tensors are filled in layout order from one stream (no dependence on threading); a
// tensor of count 0 draws nothing.
inline void model_init_params(float* params, const ModelConfig& c, uint64_t seed) {
    size_t sizes[NUM_PARAM_TENSORS];
    model_param_sizes(c, sizes);
    Rng rng(seed);
    float* p = params;
    const float resid_std = 0.02f / std::sqrt(2.0f * c.num_layers);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const size_t n = sizes[i];
        if (n == 0) continue;  // a tensor this config lacks
        if (i == model_param::wte || i == model_param::lm_head) {  // real rows random, padded rows zero
            size_t real = (size_t)c.vocab_size * c.channels;
            for (size_t k = 0; k < real; k++) p[k] = 0.02f * rng.normal();
            for (size_t k = real; k < n; k++) p[k] = 0.0f;
        } else if (model_param_decays(i)) {
            const bool residual_proj = i == model_param::attprojw || i == model_param::fcprojw;
            float std = residual_proj ? resid_std : 0.02f;
            for (size_t k = 0; k < n; k++) p[k] = std * rng.normal();
        } else {
            const bool ln_weight = i == model_param::ln1w || i == model_param::ln2w || i == model_param::lnfw;
            float v = ln_weight ? 1.0f : 0.0f;  // norm weights 1, biases 0
            for (size_t k = 0; k < n; k++) p[k] = v;
        }
        p += n;
    }
}
