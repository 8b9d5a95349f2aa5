// encoder.h: token + position embedding on the CPU.
// Shapes: inp (B, T) token ids < V, wte (Vp, C), wpe (maxT, C) or nullptr (no learned position
// embedding: a RoPE model), out (B, T, C). Position t of a row takes wpe row t, or with doc_start (B, T)
// (llmc/cpu/attention.h: the first position of each token's document) row t - doc_start[t]: positions
// restart at 0 at each document.
// encoder_forward writes (=) out; encoder_backward accumulates (+=) into dwte and dwpe.
// fp32. Padded rows of wte (ids V..Vp-1) never receive gradient because no id points at them.
#pragma once
#include <cstddef>

namespace cpu {

// out[b,t,:] = wte[inp[b,t],:] + wpe[pos(b,t),:]
inline void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C,
                            const int* doc_start = nullptr) {
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float* o = out + ((size_t)b * T + t) * C;
            const float* we = wte + (size_t)inp[b * T + t] * C;
            if (!wpe) {
                for (int c = 0; c < C; c++) o[c] = we[c];
                continue;
            }
            const float* pe = wpe + (size_t)(doc_start ? t - doc_start[b * T + t] : t) * C;
            for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
        }
    }
}

// dwte[inp[b,t],:] += dout[b,t,:]; dwpe[pos(b,t),:] += dout[b,t,:] (dwpe nullptr: none).
// Threads split the channels, so two positions holding the same token never race and the
// summation order (b, t ascending) does not depend on the thread count.
inline void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C,
                             const int* doc_start = nullptr) {
    constexpr int CB = 64;  // channels per task
#pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += CB) {
        const int c1 = c0 + CB < C ? c0 + CB : C;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const float* d = dout + ((size_t)b * T + t) * C;
                float* we = dwte + (size_t)inp[b * T + t] * C;
                if (!dwpe) {
                    for (int c = c0; c < c1; c++) we[c] += d[c];
                    continue;
                }
                float* pe = dwpe + (size_t)(doc_start ? t - doc_start[b * T + t] : t) * C;
                for (int c = c0; c < c1; c++) {
                    we[c] += d[c];
                    pe[c] += d[c];
                }
            }
        }
    }
}

}  // namespace cpu
