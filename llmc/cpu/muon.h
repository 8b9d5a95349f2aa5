// muon.h: the Muon update of one weight matrix on the CPU, torch.optim.Muon's step
// (torch/optim/_muon.py, _single_tensor_muon) operation by operation, except that the
// Newton-Schulz iteration runs in fp32 where torch always casts to bf16 first (the reference
// trainer scripts/train_gpt2.py runs torch's step with the iteration in the parameters' dtype).
// Shapes: w, grad, momentum_buf (rows, cols) row-major, a Linear weight stored (out, in) as in
// PyTorch. Updates w and momentum_buf in place (=); grad is read only and multiplied by grad_scale
// first (the clipping factor from global_norm.h, as clip_grad_norm_ scales the gradient before
// torch's step; 1 for none). fp32 throughout; the hyperparameters are combined in double where
// PyTorch combines them as Python floats.
//
// One step, g = grad * grad_scale, mu = momentum, lr = the group's lr, in this order:
//   1. buf = lerp(buf, g, 1 - mu)                buf.lerp_(grad, 1 - momentum): mu buf + (1 - mu) g
//   2. U = nesterov ? lerp(g, buf, mu) : buf     grad.lerp(buf, momentum): (1 - mu) g + mu buf
//   3. O = newton_schulz5(U), with (m, n) = (min, max)(rows, cols):
//        X = U, or U^T when rows > cols, so X is (m, n) and the Gram matrix the small (m, m)
//        X = X / max(||X||_F, eps)                 the spectral norm is then at most 1
//        ns_steps times:  A = X X^T;  B = b A + c (A A);  X = a X + B X
//                         (a, b, c) = (3.4445, -4.7750, 2.0315)
//        O = X, or X^T when rows > cols
//   4. w = w * (1 - lr * weight_decay)          decoupled, with the unadjusted lr
//   5. w = w - adjusted_lr * O, adjusted_lr = lr * ratio:
//        ORIGINAL         ratio = sqrt(max(1, rows / cols))  (torch's default, Keller Jordan's)
//        MATCH_RMS_ADAMW  ratio = 0.2 * sqrt(max(rows, cols)) (Moonshot's: AdamW's update RMS)
// lerp(s, e, t) is torch's: s + t (e - s) for |t| < 0.5, else e - (e - s) (1 - t).
// Note the momentum is an average (1 - mu) g + mu buf, not torch's documented mu buf + g:
// the docstring's formula and the code differ by the factor 1 - mu, which the Frobenius
// normalisation of step 3 removes except through eps.
//
// muon_update_model applies muon_update to every layer's model_param_muon matrices of a model buffer,
// qkvw as three matrices (Q, K, V) and SwiGLU's fcw as two (gate, up): muon_row_blocks, listed by
// muon_matrices; at ZeRO 1/2 each rank updates the matrices muon_assign_owners gives it, whole
// (llmc/cpu/data_parallel.h).
//
// Cost: ns_steps (4 m^2 n + 2 m^3) GEMM FLOPs (X X^T, A A, B X) and O(m n) elementwise work. The
// GEMMs are llmc/cpu/matmul.h's gemm_accumulate and the norm sums row by row, then the rows in
// order, so every result is bitwise identical for any OMP_NUM_THREADS.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>
#include "llmc/cpu/matmul.h"
#include "llmc/model_config.h"

namespace cpu {

enum class MuonAdjustLr { ORIGINAL, MATCH_RMS_ADAMW };

// torch.optim.Muon's arguments and defaults (ns_coefficients fixed to its default).
struct MuonSettings {
    float lr = 1e-3f;
    float momentum = 0.95f;
    float weight_decay = 0.1f;
    int ns_steps = 5;
    float eps = 1e-7f;
    MuonAdjustLr adjust_lr = MuonAdjustLr::ORIGINAL;
    bool nesterov = true;
};

constexpr float MUON_NS_A = 3.4445f, MUON_NS_B = -4.7750f, MUON_NS_C = 2.0315f;

// Floats of scratch newton_schulz5 needs: two (m, n) iterates and two (m, m) matrices.
inline size_t newton_schulz_scratch_floats(int rows, int cols) {
    const size_t m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
    return 2 * m * n + 2 * m * m;
}

// Floats of scratch muon_update needs: the (rows, cols) update U, then newton_schulz5's.
inline size_t muon_scratch_floats(int rows, int cols) {
    return (size_t)rows * cols + newton_schulz_scratch_floats(rows, cols);
}

// The learning rate step 5 applies, in double as torch's _adjust_lr computes it.
inline double muon_adjusted_lr(double lr, int rows, int cols, MuonAdjustLr adjust) {
    if (adjust == MuonAdjustLr::MATCH_RMS_ADAMW) return lr * (0.2 * std::sqrt((double)(rows > cols ? rows : cols)));
    const double ratio = (double)rows / (double)cols;
    return lr * std::sqrt(ratio > 1.0 ? ratio : 1.0);
}

namespace detail {
// torch.lerp's formula (ATen/native/Lerp.h), branch for branch.
inline float torch_lerp(float start, float end, float weight) {
    return std::fabs(weight) < 0.5f ? start + weight * (end - start) : end - (end - start) * (1.0f - weight);
}
}  // namespace detail

// out (rows, cols) = the ns_steps-step quintic Newton-Schulz orthogonalisation of G (rows, cols),
// step 3 above (torch's _zeropower_via_newtonschulz, in fp32). Writes (=) every element of out;
// out may be G. scratch: newton_schulz_scratch_floats(rows, cols) floats, contents not kept.
inline void newton_schulz5(float* out, const float* G, int rows, int cols, int ns_steps, float eps, float* scratch) {
    const bool transposed = rows > cols;
    const int m = transposed ? cols : rows, n = transposed ? rows : cols;
    float* X = scratch;                 // (m, n)
    float* Y = X + (size_t)m * n;       // (m, n), the next iterate
    float* A = Y + (size_t)m * n;       // (m, m)
    float* B = A + (size_t)m * m;       // (m, m)
    std::vector<double> row_sq(m);      // the norm's sum of squares, row by row, then in row order
#pragma omp parallel for
    for (int i = 0; i < m; i++) {
        double sq = 0.0;
        for (int j = 0; j < n; j++) {
            const float x = transposed ? G[(size_t)j * cols + i] : G[(size_t)i * cols + j];
            X[(size_t)i * n + j] = x;
            sq += (double)x * x;
        }
        row_sq[i] = sq;
    }
    double sq = 0.0;
    for (int i = 0; i < m; i++) sq += row_sq[i];
    const float norm = std::fmax((float)std::sqrt(sq), eps);  // X.norm().clamp(min=eps)
    const size_t mn = (size_t)m * n, mm = (size_t)m * m;
#pragma omp parallel for
    for (size_t i = 0; i < mn; i++) X[i] /= norm;
    for (int s = 0; s < ns_steps; s++) {
        memset(A, 0, mm * sizeof(float));
        detail::gemm_accumulate(A, m, X, n, 1, X, 1, n, m, m, n);  // A = X X^T
        memset(B, 0, mm * sizeof(float));
        detail::gemm_accumulate(B, m, A, m, 1, A, m, 1, m, m, m);  // B = A A
#pragma omp parallel for
        for (size_t i = 0; i < mm; i++) B[i] = MUON_NS_B * A[i] + MUON_NS_C * B[i];  // addmm(A, A, A, beta=b, alpha=c)
#pragma omp parallel for
        for (size_t i = 0; i < mn; i++) Y[i] = MUON_NS_A * X[i];
        detail::gemm_accumulate(Y, n, B, m, 1, X, n, 1, m, n, m);  // Y = a X + B X: addmm(X, B, X, beta=a)
        std::swap(X, Y);
    }
#pragma omp parallel for
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            const float x = X[(size_t)i * n + j];
            if (transposed) out[(size_t)j * cols + i] = x;
            else out[(size_t)i * cols + j] = x;
        }
}

// One Muon step on w (rows, cols), steps 1-5 above. momentum_buf starts at zero before the first
// step (torch's zeros_like). scratch: muon_scratch_floats(rows, cols) floats, contents not kept.
inline void muon_update(float* w, const float* grad, float* momentum_buf, int rows, int cols, const MuonSettings& s,
                        float grad_scale, float* scratch) {
    const size_t N = (size_t)rows * cols;
    float* U = scratch;  // (rows, cols), then O in place
    const float buf_weight = (float)(1.0 - (double)s.momentum);  // Python's 1 - momentum, rounded by lerp_
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        const float g = grad[i] * grad_scale;
        const float b = detail::torch_lerp(momentum_buf[i], g, buf_weight);
        momentum_buf[i] = b;
        U[i] = s.nesterov ? detail::torch_lerp(g, b, s.momentum) : b;
    }
    newton_schulz5(U, U, rows, cols, s.ns_steps, s.eps, scratch + N);
    const float decay = (float)(1.0 - (double)s.lr * s.weight_decay);
    const float alpha = (float)-muon_adjusted_lr(s.lr, rows, cols, s.adjust_lr);
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        const float p = w[i] * decay;  // param.mul_(1 - lr * weight_decay)
        w[i] = p + alpha * U[i];       // param.add_(update, alpha=-adjusted_lr)
    }
}

// Muon's matrices in one layer's slice of model_param_muon tensor i, stored (out, in) row-major: row
// blocks, contiguous, each orthogonalised with its own lr adjustment as nanochat's separate c_q, c_k,
// c_v and Hugging Face Llama's gate_proj, up_proj are. Writes each block's rows to block_rows (at most
// MUON_MAX_ROW_BLOCKS) and the common input width to cols; returns the number of blocks:
//   qkvw     3: Q (NH HD = C), K (NKV HD), V (NKV HD)       cols C
//   fcw      SwiGLU 2: gate (H), up (H); GELU 1: (H)         cols C
//   attprojw 1: (C)                                          cols C
//   fcprojw  1: (C)                                          cols H
constexpr int MUON_MAX_ROW_BLOCKS = 3;
inline int muon_row_blocks(const ModelConfig& c, int i, int block_rows[MUON_MAX_ROW_BLOCKS], int* cols) {
    const int C = c.channels, H = model_mlp_hidden(c), KV = c.num_kv_heads * model_head_dim(c);
    *cols = i == model_param::fcprojw ? H : C;
    if (i == model_param::qkvw) {
        block_rows[0] = C, block_rows[1] = KV, block_rows[2] = KV;
        return 3;
    }
    if (i == model_param::fcw && c.mlp == MLP_SWIGLU) {
        block_rows[0] = H, block_rows[1] = H;
        return 2;
    }
    block_rows[0] = i == model_param::fcw ? H : C;
    return 1;
}

// One Muon matrix of a model buffer: (rows, cols) row-major at element `offset` (model_param_offsets'
// layout), updated by rank `owner` when --optimizer muon runs at ZeRO 1/2 (muon_assign_owners).
struct MuonMatrix {
    size_t offset = 0;
    int rows = 0, cols = 0;
    int owner = 0;
    size_t size() const { return (size_t)rows * cols; }
};

// Every Muon matrix of a model, in update order: layer by layer, qkvw, attprojw, fcw, fcprojw, each
// muon_row_blocks block a matrix of its own; together they tile the model_param_muon tensors.
inline std::vector<MuonMatrix> muon_matrices(const ModelConfig& c) {
    size_t sizes[NUM_PARAM_TENSORS], off[NUM_PARAM_TENSORS];
    model_param_sizes(c, sizes);
    model_param_offsets(c, off);
    int block_rows[MUON_MAX_ROW_BLOCKS], cols;
    std::vector<MuonMatrix> mats;
    for (int l = 0; l < c.num_layers; l++)
        for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
            if (!model_param_muon(i)) continue;
            const int n = muon_row_blocks(c, i, block_rows, &cols);
            size_t at = off[i] + (size_t)l * (sizes[i] / c.num_layers);
            for (int k = 0; k < n; k++) {
                mats.push_back({at, block_rows[k], cols});
                at += mats.back().size();
            }
            if (at != off[i] + (size_t)(l + 1) * (sizes[i] / c.num_layers) || sizes[i] % c.num_layers != 0)
                fail("internal: muon_matrices: tensor %d's %d row blocks of %d columns do not tile a layer's slice of "
                     "its %zu values", i, n, cols, sizes[i]);
        }
    return mats;
}

// Sets each matrix's owner among `world` ranks, the same on every rank: largest first (ties: the
// earlier in update order), each to the rank with the fewest elements so far (ties: the lowest).
// Then no rank holds more elements than any other by more than the largest matrix: the last matrix
// the fullest rank took went to the then emptiest.
inline void muon_assign_owners(std::vector<MuonMatrix>& mats, int world) {
    std::vector<size_t> order(mats.size()), load((size_t)world, 0);
    for (size_t k = 0; k < order.size(); k++) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return mats[a].size() > mats[b].size(); });
    for (size_t k : order) {
        const int r = (int)(std::min_element(load.begin(), load.end()) - load.begin());
        mats[k].owner = r;
        load[(size_t)r] += mats[k].size();
    }
}

// Floats of scratch muon_update needs for the largest of `mats`.
inline size_t muon_scratch_floats(const std::vector<MuonMatrix>& mats) {
    size_t most = 0;
    for (const MuonMatrix& x : mats) most = std::max(most, muon_scratch_floats(x.rows, x.cols));
    return most;
}

// One Muon step on each muon_matrices matrix of a model buffer (params, momentum, grads share the
// layout of model_param_offsets; the other tensors are not touched), its slice of momentum as
// momentum_buf.
inline void muon_update_model(float* params, float* momentum, const float* grads, const ModelConfig& c,
                              const MuonSettings& s, float grad_scale) {
    const std::vector<MuonMatrix> mats = muon_matrices(c);
    std::vector<float> scratch(muon_scratch_floats(mats));
    for (const MuonMatrix& x : mats)
        muon_update(params + x.offset, grads + x.offset, momentum + x.offset, x.rows, x.cols, s, grad_scale,
                    scratch.data());
}

}  // namespace cpu
