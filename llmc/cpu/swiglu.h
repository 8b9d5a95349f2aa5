// swiglu.h: the SwiGLU activation of Llama-family MLPs on the CPU, on the output of one fused
// gate/up matmul: mlp(x) = down(silu(gate(x)) * up(x)), silu(g) = g * sigmoid(g).
// Shapes: inp, dinp (N, 2H), each row [gate (H) | up (H)]: the two halves of the row are contiguous
//   runs; out, dout (N, H); N = B*T rows, H the MLP hidden size (config.json's intermediate_size).
// Layout against Hugging Face: the fused matmul's weight (2H, C), "out x in", is
//   torch.cat([gate_proj.weight, up_proj.weight], dim=0): rows 0..H-1 are gate_proj's, rows
//   H..2H-1 up_proj's, so out = act_fn(gate_proj(x)) * up_proj(x) of LlamaMLP, ready for down_proj.
//   swiglu_forward   out = silu(gate) * up                                    (=)
//   swiglu_backward  d(gate) += dout * up * silu'(gate), d(up) += dout * silu(gate), into dinp  (+=)
// fp32 with the library expf; sigmoid(g) = 1 / (1 + exp(-g)) is exact at both tails (exp(-g) = inf
// for g < -88 gives sigmoid 0, silu -0). Each element is written by one thread.
#pragma once
#include <cmath>
#include <cstddef>

namespace cpu {

inline void swiglu_forward(float* out, const float* inp, int N, int H) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* gate = inp + (size_t)n * 2 * H;
        const float* up = gate + H;
        float* o = out + (size_t)n * H;
        for (int j = 0; j < H; j++) {
            const float g = gate[j];
            o[j] = g / (1.0f + expf(-g)) * up[j];
        }
    }
}

// With s = sigmoid(g): silu(g) = g s, silu'(g) = s + g s (1 - s) = s (1 + g (1 - s)).
inline void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int H) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* gate = inp + (size_t)n * 2 * H;
        const float* up = gate + H;
        float* dgate = dinp + (size_t)n * 2 * H;
        float* dup = dgate + H;
        const float* d = dout + (size_t)n * H;
        for (int j = 0; j < H; j++) {
            const float g = gate[j], s = 1.0f / (1.0f + expf(-g));
            dgate[j] += d[j] * up[j] * s * (1.0f + g * (1.0f - s));
            dup[j] += d[j] * g * s;
        }
    }
}

}  // namespace cpu
