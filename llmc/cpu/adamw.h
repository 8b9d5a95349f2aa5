// adamw.h: the AdamW update on the CPU, torch.optim.AdamW's single-tensor path operation by
// operation (docs/design.md), so the trajectory matches PyTorch's in fp32.
// Shapes: params, m, v, grads (N) flat. Updates params, m, v in place (=); grads is read only and
// multiplied by grad_scale first (the clipping factor from global_norm.h; 1 for none).
// step is 1-based (the bias corrections use it). Weight decay is per tensor: adamw_update_model
// applies it only where model_param_decays(i) says so. With skip_muon (--optimizer muon) the
// model-buffer updates leave the model_param_muon tensors (params, m, v) untouched: Muon's.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include "llmc/model_config.h"

namespace cpu {

namespace detail {
// One contiguous range. Build with -fno-math-errno (the Makefile does for the CPU trainer and test):
// v >= 0, so sqrtf never sets errno, but with errno semantics GCC will not vectorize this loop and
// the update is 4.5x slower (124M parameters: 480 ms vs 105 ms on one Zen 5 core). Same bits either way.
inline void adamw_range(float* params, float* m, float* v, const float* grads, size_t n, float step_size,
                        float bc2_sqrt, float decay, float one_minus_b1, float beta2, float one_minus_b2, float eps,
                        float grad_scale) {
    for (size_t i = 0; i < n; i++) {
        const float g = grads[i] * grad_scale;
        float p = params[i] * decay;                          // param.mul_(1 - lr * wd)
        const float mi = m[i] + one_minus_b1 * (g - m[i]);    // exp_avg.lerp_(grad, 1 - beta1)
        const float vi = v[i] * beta2 + one_minus_b2 * g * g;  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        p -= step_size * (mi / denom);                        // param.addcdiv_(exp_avg, denom, -step_size)
        m[i] = mi;
        v[i] = vi;
        params[i] = p;
    }
}
}  // namespace detail

inline void adamw_update(float* params, float* m, float* v, const float* grads, size_t N, float lr, float beta1,
                         float beta2, float eps, float weight_decay, float grad_scale, int64_t step) {
    // PyTorch computes these on Python floats (double) and rounds when they meet a tensor
    const double bc1 = 1.0 - std::pow((double)beta1, (double)step);
    const double bc2 = 1.0 - std::pow((double)beta2, (double)step);
    const float step_size = (float)(lr / bc1);
    const float bc2_sqrt = (float)std::sqrt(bc2);
    const float decay = (float)(1.0 - (double)lr * weight_decay);
    const float one_minus_b1 = (float)(1.0 - beta1), one_minus_b2 = (float)(1.0 - beta2);
    constexpr size_t CHUNK = 1 << 14;  // elements per task
#pragma omp parallel for
    for (size_t i0 = 0; i0 < N; i0 += CHUNK)
        detail::adamw_range(params + i0, m + i0, v + i0, grads + i0, N - i0 < CHUNK ? N - i0 : CHUNK, step_size,
                            bc2_sqrt, decay, one_minus_b1, beta2, one_minus_b2, eps, grad_scale);
}

// One AdamW step over elements [begin, end) of a model parameter buffer (params has the layout of
// model_param_offsets and is whole; grads, m and v hold the range only: m[0] is element begin's, as
// a ZeRO shard keeps them, llmc/zero.h); weight decay only on the tensors model_param_decays selects;
// skip_muon: not the model_param_muon tensors.
inline void adamw_update_model_range(float* params, float* m, float* v, const float* grads, const ModelConfig& cfg,
                                    size_t begin, size_t end, float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float grad_scale, int64_t step, bool skip_muon = false) {
    size_t sizes[NUM_PARAM_TENSORS], off = 0;
    model_param_sizes(cfg, sizes);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const size_t lo = off > begin ? off : begin, hi = off + sizes[i] < end ? off + sizes[i] : end;
        if (lo < hi && !(skip_muon && model_param_muon(i)))
            adamw_update(params + lo, m + (lo - begin), v + (lo - begin), grads + (lo - begin), hi - lo, lr, beta1, beta2,
                         eps, model_param_decays(i) ? weight_decay : 0.0f, grad_scale, step);
        off += sizes[i];
    }
}

// One AdamW step over all the tensors of a model parameter buffer (params, m, v, grads share the
// layout of model_param_offsets); skip_muon: all but the model_param_muon tensors.
inline void adamw_update_model(float* params, float* m, float* v, const float* grads, const ModelConfig& cfg, float lr,
                              float beta1, float beta2, float eps, float weight_decay, float grad_scale, int64_t step,
                              bool skip_muon = false) {
    adamw_update_model_range(params, m, v, grads, cfg, 0, model_num_params(cfg), lr, beta1, beta2, eps, weight_decay,
                            grad_scale, step, skip_muon);
}

}  // namespace cpu
