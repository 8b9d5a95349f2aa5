// rope.h: rotary position embeddings (RoPE) on the CPU, applied in place to the query and key heads
// of the fused QKV activation, in the Hugging Face Llama convention.
// Shapes: qkv, dqkv (B, T, (NH + 2*NKV) * HD), per position NH query heads, then NKV key heads, then
//   NKV value heads (llmc/cpu/attention.h's layout); cos, sin (max_pos, HD/2) from rope_tables.
// Convention (transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb, "rotate_half"): in each
// head vector x of HD channels, channel i pairs with channel i + HD/2 (not with i + 1, as in Meta's
// original interleaved code; Hugging Face checkpoints have their q/k rows permuted for this pairing,
// so imported weights need no permutation), and the pair turns by the angle p * theta^(-2i/HD) at
// position p, i = 0 .. HD/2-1 (with RopeScaling's llama3, the frequencies scaled first as transformers
// does):
//   x'[i] = x[i] cos - x[i + HD/2] sin,   x'[i + HD/2] = x[i + HD/2] cos + x[i] sin.
// Token t of every sequence sits at position pos_offset + t (pos_offset > 0: a KV cache's next
// tokens), so the tables need max_pos >= pos_offset + T rows; with doc_start (B, T) (llmc/cpu/attention.h:
// the first position of each token's document) at pos_offset + t - doc_start[b,t] (positions restart at
// each document).
//   rope_tables_for  cos, sin (=) of a model's config (in double, rounded once to fp32): what every model uses
//   rope_forward     rotates the Q and K heads of qkv in place; V is untouched
//   rope_backward    the inverse rotation (by -angle) of the Q and K heads of dqkv in place; dV untouched
// fp32; each element is written by one thread, so results do not depend on the thread count.
#pragma once
#include <cmath>
#include <cstddef>
#include <vector>
#include "llmc/model_config.h"
#include "llmc/utils.h"

namespace cpu {

inline void rope_check_shape(int HD, int pos_offset) {
    if (HD <= 0 || HD % 2 != 0) fail("rope: head dim %d must be positive and even", HD);
    if (pos_offset < 0) fail("rope: position offset %d must be >= 0", pos_offset);
}

// inv_freq[i] = theta^(-2i/HD), i = 0 .. HD/2-1, scaled by `scaling` (its values as model_validate_config
// admits them: every model file and config passes there first). llama3, with L the original
// context length: a pair whose wavelength 2 pi / f is below L / high_freq_factor keeps f, one above
// L / low_freq_factor gets f / factor, and one between gets the blend (1 - s) f / factor + s f with
// s = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor), which runs from 0 at
// the long end to 1 at the short end, so the scaled frequencies are continuous in the wavelength.
inline void rope_inv_freq(double* inv_freq, int HD, double theta, const RopeScaling& scaling = RopeScaling()) {
    rope_check_shape(HD, 0);
    if (!(theta > 1.0)) fail("rope: theta %g must be > 1", theta);
    const RopeScaling& r = scaling;
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < HD / 2; i++) {
        const double f = std::pow(theta, -2.0 * i / HD);
        inv_freq[i] = f;
        if (r.type != ROPE_SCALING_LLAMA3) continue;
        const double wavelength = 2.0 * pi / f, L = r.original_max_pos;
        if (wavelength > L / r.low_freq_factor) {
            inv_freq[i] = f / r.factor;  // long wavelengths: interpolated by the factor
        } else if (wavelength >= L / r.high_freq_factor) {  // between: the blend
            const double s = (L / wavelength - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
            inv_freq[i] = (1.0 - s) * f / r.factor + s * f;
        }  // short wavelengths keep f
    }
}

// cos[p, i] = cos(p * inv_freq[i]), sin likewise, for p = 0 .. max_pos-1 (rope_inv_freq). Hugging Face
// computes these angles in fp32, which at p ~ 4096 is off by ~2e-4 rad; here they are exact to fp32
// rounding.
inline void rope_tables(float* cos, float* sin, int max_pos, int HD, double theta,
                        const RopeScaling& scaling = RopeScaling()) {
    std::vector<double> inv_freq(HD > 0 ? HD / 2 : 0);
    rope_inv_freq(inv_freq.data(), HD, theta, scaling);
    const int half = HD / 2;
#pragma omp parallel for
    for (int p = 0; p < max_pos; p++) {
        for (int i = 0; i < half; i++) {
            const double angle = p * inv_freq[i];
            cos[(size_t)p * half + i] = (float)std::cos(angle);
            sin[(size_t)p * half + i] = (float)std::sin(angle);
        }
    }
}

// The tables of a RoPE model (max_pos rows of HD/2 = model_head_dim(c) / 2): its theta and scaling.
// Every model (CPU and GPU trainers, the generators, the tests) builds its tables here, so none can
// forget the scaling.
inline void rope_tables_for(const ModelConfig& c, float* cos, float* sin, int max_pos) {
    if (c.position != POS_ROPE) fail("rope: tables asked for a model with learned positions");
    rope_tables(cos, sin, max_pos, model_head_dim(c), c.rope_theta, c.rope_scaling);
}

namespace detail {
// Turns every Q and K head of qkv by the angles of the table rows: sign = +1 forward, -1 inverse.
inline void rope_rotate(float* qkv, const float* cos, const float* sin, int B, int T, int NH, int NKV, int HD,
                        int pos_offset, float sign, const int* doc_start) {
    rope_check_shape(HD, pos_offset);
    const size_t QKV = (size_t)(NH + 2 * NKV) * HD;
    const int half = HD / 2, heads = NH + NKV;  // the Q heads and then the K heads are contiguous
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const size_t pos = pos_offset + t - (doc_start ? doc_start[(size_t)b * T + t] : 0);
            const float* c = cos + pos * half;
            const float* s = sin + pos * half;
            float* row = qkv + ((size_t)b * T + t) * QKV;
            for (int h = 0; h < heads; h++) {
                float* x = row + (size_t)h * HD;
                for (int i = 0; i < half; i++) {
                    const float x1 = x[i], x2 = x[i + half], si = sign * s[i];
                    x[i] = x1 * c[i] - x2 * si;
                    x[i + half] = x2 * c[i] + x1 * si;
                }
            }
        }
    }
}
}  // namespace detail

inline void rope_forward(float* qkv, const float* cos, const float* sin, int B, int T, int NH, int NKV, int HD,
                         int pos_offset = 0, const int* doc_start = nullptr) {
    detail::rope_rotate(qkv, cos, sin, B, T, NH, NKV, HD, pos_offset, 1.0f, doc_start);
}

// d(qkv) = R^T d(rotated qkv): dx[i] = dy[i] cos + dy[i + HD/2] sin, dx[i + HD/2] = dy[i + HD/2] cos - dy[i] sin.
inline void rope_backward(float* dqkv, const float* cos, const float* sin, int B, int T, int NH, int NKV, int HD,
                          int pos_offset = 0, const int* doc_start = nullptr) {
    detail::rope_rotate(dqkv, cos, sin, B, T, NH, NKV, HD, pos_offset, -1.0f, doc_start);
}

}  // namespace cpu
