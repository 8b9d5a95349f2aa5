// fused_classifier.cuh: the classifier head's loss and its gradient in one pass per row, never
// materializing the probabilities. logits (N, Vp) floatX, only the first V columns are real.
//   losses[r] = logsumexp(logits[r, :V]) - logits[r, targets[r]]                          (=)
//   if write_dlogits: logits[r, c] is overwritten by dloss * (softmax(logits[r, :V])[c] - [c == target])
//   for c < V and by 0 for the padded columns V <= c < Vp                                  (=)
// dloss is the loss gradient of each position: 1 / (B * T * grad_accum) for a mean over the batch.
// With write_dlogits false (validation) the logits stay untouched.
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

constexpr int CLASSIFIER_BLOCK = 1024;

// One row's loss and gradient by a block of CLASSIFIER_BLOCK threads, the row read from `x` (global
// memory here; shared memory in the lab's rows-in-smem variant), the gradient written to `out`
// (global). Thread i handles packs i, i+1024, ... Pass 1: running (max, sum of exp) per thread,
// merged across the block. Pass 2 re-reads the row and writes the gradient. Every read of pass 1
// (including the target's logit) happens before the block reductions' barriers and every write
// after them, so out may be x (in place).
__device__ inline void classifier_row(floatX* out, float* loss, const floatX* x, int target, float dloss, int V, int Vp,
                                      bool write_dlogits) {
    float m = -INFINITY, s = 0.0f;
    for (int c = threadIdx.x * x128::size; c < V; c += blockDim.x * x128::size) {
        const x128 v = load128(x + c);
        float pack_max = -INFINITY;
        for (int k = 0; k < x128::size && c + k < V; k++) pack_max = fmaxf(pack_max, to_float(v[k]));
        const float new_m = fmaxf(m, pack_max);
        s *= expf(m - new_m);
        for (int k = 0; k < x128::size && c + k < V; k++) s += expf(to_float(v[k]) - new_m);
        m = new_m;
    }
    const float target_logit = threadIdx.x == 0 ? to_float(x[target]) : 0.0f;
    const float row_max = block_reduce_max(m);
    const float row_sum = block_reduce_sum(m == -INFINITY ? 0.0f : s * expf(m - row_max));
    if (threadIdx.x == 0) *loss = logf(row_sum) + row_max - target_logit;
    if (!write_dlogits) return;
    const float inv_sum = 1.0f / row_sum;
    for (int c = threadIdx.x * x128::size; c < Vp; c += blockDim.x * x128::size) {
        x128 v = load128(x + c);
        for (int k = 0; k < x128::size; k++) {
            const int col = c + k;
            float g = 0.0f;
            if (col < V) g = dloss * (expf(to_float(v[k]) - row_max) * inv_sum - (col == target ? 1.0f : 0.0f));
            v[k] = from_float<floatX>(g);
        }
        store128(out + c, v);
    }
}

// The shipped kernel: one block of CLASSIFIER_BLOCK threads per row, straight from global memory.
// Pass 2 re-reads the row (100 KB in bf16 at Vp = 50304: still in L2). DRAM: ~2 * N * Vp *
// sizeof(floatX) bytes, ~4 FLOPs + 2 exp per element: memory-bound. H200, bf16, B*T = 65536,
// Vp 50304: 4.26 ms, 77% of the copy (loss only 2.20 ms, 75%). The lab's variant 1 (rows brought
// into shared memory by bulk copies, read from DRAM once) measured no faster (4.29 ms, 76.9%; loss
// only 2.32 ms, 71.0%): dev/cuda/fused_classifier.cu.
static __global__ void fused_classifier_block_per_row(floatX* logits, float* losses, const int* targets, float dloss,
                                                      int V, int Vp, bool write_dlogits) {
    floatX* x = logits + (int64_t)blockIdx.x * Vp;
    classifier_row(x, losses + blockIdx.x, x, targets[blockIdx.x], dloss, V, Vp, write_dlogits);
}

inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                             bool write_dlogits, cudaStream_t stream) {
    if (Vp % x128::size != 0) fail("fused_classifier: padded vocab %d is not a multiple of %d", Vp, x128::size);
    fused_classifier_block_per_row<<<N, CLASSIFIER_BLOCK, 0, stream>>>(logits, losses, targets, dloss, V, Vp,
                                                                       write_dlogits);
    cudaCheckLaunch();
}
