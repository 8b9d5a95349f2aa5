// layernorm.h: LayerNorm over the channels on the CPU, eps 1e-5 (PyTorch's default, GPT-2's value).
// Shapes: inp, out (B, T, C); weight, bias (C); mean, rstd (B, T) saved for the backward.
// layernorm_forward writes (=) out, mean, rstd; layernorm_backward accumulates (+=) into dinp,
// dweight and dbias. fp32; per-row sums are taken in double so the reference is not limited by
// rounding in the statistics. Results do not depend on the thread count.
#pragma once
#include <cmath>
#include <cstddef>

namespace cpu {

constexpr float LAYERNORM_EPS = 1e-5f;

// out = (inp - mean) * rstd * weight + bias, with the biased variance (as PyTorch).
inline void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                              const float* bias, int B, int T, int C) {
    const int rows = B * T;
#pragma omp parallel for
    for (int i = 0; i < rows; i++) {
        const float* x = inp + (size_t)i * C;
        double s = 0.0;
        for (int c = 0; c < C; c++) s += x[c];
        const float m = (float)(s / C);
        double v = 0.0;
        for (int c = 0; c < C; c++) v += (double)(x[c] - m) * (x[c] - m);
        const float r = 1.0f / sqrtf((float)(v / C) + LAYERNORM_EPS);
        float* o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * weight[c] + bias[c];
        mean[i] = m;
        rstd[i] = r;
    }
}

// With n = (x - mean) * rstd and g = dout * weight:
//   dinp += rstd * (g - mean_c(g) - n * mean_c(g * n)),  dweight += sum_rows dout * n,  dbias += sum_rows dout.
// dinp is split by rows; dweight/dbias by channel blocks, so no two threads touch one element.
inline void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, const float* mean, const float* rstd, int B, int T, int C) {
    const int rows = B * T;
#pragma omp parallel for
    for (int i = 0; i < rows; i++) {
        const float* x = inp + (size_t)i * C;
        const float* d = dout + (size_t)i * C;
        const float m = mean[i], r = rstd[i];
        double g_sum = 0.0, gn_sum = 0.0;
        for (int c = 0; c < C; c++) {
            const float g = d[c] * weight[c];
            g_sum += g;
            gn_sum += g * (x[c] - m) * r;
        }
        const float g_mean = (float)(g_sum / C), gn_mean = (float)(gn_sum / C);
        float* dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) {
            const float n = (x[c] - m) * r;
            dx[c] += r * (d[c] * weight[c] - g_mean - n * gn_mean);
        }
    }
    constexpr int CB = 64;  // channels per task
#pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += CB) {
        const int cb = C - c0 < CB ? C - c0 : CB;
        float dw[CB] = {}, db[CB] = {};
        for (int i = 0; i < rows; i++) {
            const float* x = inp + (size_t)i * C + c0;
            const float* d = dout + (size_t)i * C + c0;
            const float m = mean[i], r = rstd[i];
            for (int c = 0; c < cb; c++) {
                dw[c] += d[c] * (x[c] - m) * r;
                db[c] += d[c];
            }
        }
        for (int c = 0; c < cb; c++) {
            dweight[c0 + c] += dw[c];
            dbias[c0 + c] += db[c];
        }
    }
}

}  // namespace cpu
