// rmsnorm.h: RMSNorm over the channels on the CPU (Llama-family models; Hugging Face's LlamaRMSNorm),
// and the fused residual-add + RMSNorm that sits between two blocks.
// Shapes: inp, out, residual, inp1, inp2 (B, T, C); weight (C), no bias; rstd (B, T) saved for the
// backward. eps is an argument: Llama 2 uses 1e-5, Llama 3, Qwen2 and SmolLM 1e-6 (config.json's
// rms_norm_eps).
//   rmsnorm_forward                  out = inp * rstd * weight, rstd = 1 / sqrt(mean_c(inp^2) + eps)  (=)
//   rmsnorm_backward                 dinp += ..., dweight += ...                                      (+=)
//   fused_residual_rmsnorm_forward   residual = inp1 + inp2, then out = rmsnorm(residual)            (=)
//   fused_residual_rmsnorm_backward  dresidual += the norm's input gradient, dweight += ...          (+=)
// The fused pair is the reference for the GPU kernels of the same names: the statistics are those of the
// stored residual. fp32; the per-row sum of squares is taken in double so the reference is not limited
// by rounding in the statistics. Results do not depend on the thread count.
#pragma once
#include <cmath>
#include <cstddef>
#include "llmc/cpu/residual.h"

namespace cpu {

inline void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int B, int T, int C,
                            float eps) {
    const int rows = B * T;
#pragma omp parallel for
    for (int i = 0; i < rows; i++) {
        const float* x = inp + (size_t)i * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        const float r = 1.0f / sqrtf((float)(ss / C) + eps);
        float* o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = x[c] * r * weight[c];
        rstd[i] = r;
    }
}

// With n = inp * rstd and g = dout * weight (no mean is subtracted, so unlike LayerNorm there is no
// mean_c(g) term):
//   dinp += rstd * (g - n * mean_c(g * n)),  dweight += sum_rows dout * n.
// dinp is split by rows; dweight by channel blocks, so no two threads touch one element.
inline void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                             const float* rstd, int B, int T, int C) {
    const int rows = B * T;
#pragma omp parallel for
    for (int i = 0; i < rows; i++) {
        const float* x = inp + (size_t)i * C;
        const float* d = dout + (size_t)i * C;
        const float r = rstd[i];
        double gn_sum = 0.0;
        for (int c = 0; c < C; c++) gn_sum += d[c] * weight[c] * x[c] * r;
        const float gn_mean = (float)(gn_sum / C);
        float* dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) dx[c] += r * (d[c] * weight[c] - x[c] * r * gn_mean);
    }
    constexpr int CB = 64;  // channels per task
#pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += CB) {
        const int cb = C - c0 < CB ? C - c0 : CB;
        float dw[CB] = {};
        for (int i = 0; i < rows; i++) {
            const float* x = inp + (size_t)i * C + c0;
            const float* d = dout + (size_t)i * C + c0;
            const float r = rstd[i];
            for (int c = 0; c < cb; c++) dw[c] += d[c] * x[c] * r;
        }
        for (int c = 0; c < cb; c++) dweight[c0 + c] += dw[c];
    }
}

// residual = inp1 + inp2 (inp1 the residual stream, inp2 the block's output projection), then
// out = rmsnorm(residual). Two passes here; the GPU kernel does both in one.
inline void fused_residual_rmsnorm_forward(float* residual, float* out, float* rstd, const float* inp1,
                                           const float* inp2, const float* weight, int B, int T, int C, float eps) {
    residual_forward(residual, inp1, inp2, (size_t)B * T * C);
    rmsnorm_forward(out, rstd, residual, weight, B, T, C, eps);
}

// dresidual: on entry d(loss)/d(residual) from the residual stream's later uses; on return plus the
// norm's input gradient, the whole gradient of residual, which the add passes unchanged to inp1 and
// inp2. The arithmetic is rmsnorm_backward's with dinp = dresidual.
inline void fused_residual_rmsnorm_backward(float* dresidual, float* dweight, const float* dout,
                                            const float* residual, const float* weight, const float* rstd, int B,
                                            int T, int C) {
    rmsnorm_backward(dresidual, dweight, dout, residual, weight, rstd, B, T, C);
}

}  // namespace cpu
