// gelu.h: GELU with the tanh approximation (GPT-2's, PyTorch approximate="tanh") on the CPU.
// Shapes: any, N elements. gelu_forward writes (=) out; gelu_backward accumulates (+=) into dinp.
// fp32 with the library tanhf; no fast-math tricks, this is the reference.
#pragma once
#include <cmath>
#include <cstddef>

namespace cpu {

constexpr float GELU_SCALE = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float GELU_CUBIC = 0.044715f;

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
inline void gelu_forward(float* out, const float* inp, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        const float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + GELU_CUBIC * x * x * x)));
    }
}

// d/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2), u the tanh argument.
inline void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        const float x = inp[i];
        const float th = tanhf(GELU_SCALE * (x + GELU_CUBIC * x * x * x));
        const float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
        dinp[i] += (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du) * dout[i];
    }
}

}  // namespace cpu
