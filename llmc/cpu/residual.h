// residual.h: the residual connection on the CPU, out = inp1 + inp2, N elements of any shape.
// residual_forward writes (=) out; residual_backward accumulates (+=) dout into both inputs' grads.
// fp32. (The CPU trainer folds the backward into a running residual-stream gradient; the GPU
// tests and the kernel lab use both functions as the reference.)
#pragma once
#include <cstddef>

namespace cpu {

inline void residual_forward(float* out, const float* inp1, const float* inp2, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) out[i] = inp1[i] + inp2[i];
}

inline void residual_backward(float* dinp1, float* dinp2, const float* dout, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        dinp1[i] += dout[i];
        dinp2[i] += dout[i];
    }
}

}  // namespace cpu
