// crossentropy.h: softmax over the real vocabulary, cross-entropy loss and its gradient on the CPU.
// Shapes: logits, probs, dlogits (B, T, Vp) with only the first V columns real (Vp = V padded
// for the matmuls); targets (B, T) ids < V or nullptr; losses (B, T); mask (B, T) or nullptr (all
// ones): mask[i] = 1 where the loss at position i counts. The loss is the mean over the counted
// positions (PyTorch's cross_entropy with ignore_index); with none counted it is 0 and so is its gradient.
// Padded columns get probability 0 and gradient 0. softmax_crossentropy_forward writes (=) probs
// and losses; crossentropy_softmax_backward WRITES (=) dlogits and may work in place (dlogits ==
// probs). fp32 values, row sums in double.
#pragma once
#include <cmath>
#include <cstddef>

namespace cpu {

// The positions whose loss counts: the ones of mask (B*T = rows values), or rows without a mask.
inline int crossentropy_counted(const int* mask, int rows) {
    if (!mask) return rows;
    int n = 0;
    for (int i = 0; i < rows; i++) n += mask[i] != 0;
    return n;
}

// probs = softmax(logits[..., :V]); losses = -log probs[target] computed as logsumexp - logit[target]
// (exact even where the probability underflows), 0 at masked positions. Returns the mean loss over
// the counted positions, or 0 when targets is nullptr (then losses is not touched and may be nullptr).
inline float softmax_crossentropy_forward(float* probs, float* losses, const float* logits, const int* targets, int B,
                                          int T, int V, int Vp, const int* mask = nullptr) {
    const int rows = B * T;
    const int counted = crossentropy_counted(mask, rows);
    double total = 0.0;
#pragma omp parallel for reduction(+ : total)
    for (int i = 0; i < rows; i++) {
        const float* x = logits + (size_t)i * Vp;
        float* p = probs + (size_t)i * Vp;
        float maxv = -INFINITY;
        for (int v = 0; v < V; v++) maxv = x[v] > maxv ? x[v] : maxv;
        double sum = 0.0;
        for (int v = 0; v < V; v++) {
            p[v] = expf(x[v] - maxv);
            sum += p[v];
        }
        const float inv = (float)(1.0 / sum);
        for (int v = 0; v < V; v++) p[v] *= inv;
        for (int v = V; v < Vp; v++) p[v] = 0.0f;
        if (targets) {
            const float loss = mask && !mask[i] ? 0.0f : (float)(log(sum) + maxv - x[targets[i]]);
            losses[i] = loss;
            total += loss;
        }
    }
    return targets && counted ? (float)(total / counted) : 0.0f;
}

// Gradient of grad_scale * mean_{counted}(loss) w.r.t. the logits:
//   dlogits = (probs - onehot(target)) * grad_scale / counted at counted positions, 0 at masked
//   ones and in the padded columns (counted = B*T without a mask).
// grad_scale is 1/grad_accum when micro-batches are accumulated (docs/design.md).
inline void crossentropy_softmax_backward(float* dlogits, const float* probs, const int* targets, int B, int T, int V,
                                          int Vp, float grad_scale, const int* mask = nullptr) {
    const int rows = B * T;
    const int counted = crossentropy_counted(mask, rows);
    const float s = counted ? grad_scale / (float)counted : 0.0f;
#pragma omp parallel for
    for (int i = 0; i < rows; i++) {
        const float* p = probs + (size_t)i * Vp;
        float* d = dlogits + (size_t)i * Vp;
        if (mask && !mask[i]) {
            for (int v = 0; v < Vp; v++) d[v] = 0.0f;
            continue;
        }
        for (int v = 0; v < V; v++) d[v] = p[v] * s;
        for (int v = V; v < Vp; v++) d[v] = 0.0f;
        d[targets[i]] -= s;
    }
}

}  // namespace cpu
