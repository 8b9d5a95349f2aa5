// global_norm.h: the global L2 norm of all gradients and the clipping factor, on the CPU.
// Shapes: grads (N) flat (the whole contiguous gradient buffer, or one slice of it).
// Nothing is written: the factor is applied by the optimizer (adamw.h takes it as grad_scale).
// Sums in double: for 124M squared values fp32 accumulation would lose ~3 digits. `simd` lets the
// compiler keep several partial sums per thread (a single dependent chain of double adds is ~5x slower).
#pragma once
#include <cmath>
#include <cstddef>

namespace cpu {

// sum of squares; split so that shards of a buffer can be combined before the sqrt
inline double global_norm_squared(const float* grads, size_t N) {
    double sum = 0.0;
#pragma omp parallel for simd reduction(+ : sum)
    for (size_t i = 0; i < N; i++) sum += (double)grads[i] * grads[i];
    return sum;
}

inline float global_norm(const float* grads, size_t N) { return (float)std::sqrt(global_norm_squared(grads, N)); }

// torch.nn.utils.clip_grad_norm_: every gradient is multiplied by min(1, clip / (norm + 1e-6)).
// clip <= 0 disables clipping (factor 1).
inline float grad_clip_scale(float norm, float clip) {
    if (clip <= 0.0f) return 1.0f;
    const float coef = clip / (norm + 1e-6f);
    return coef < 1.0f ? coef : 1.0f;
}

}  // namespace cpu
