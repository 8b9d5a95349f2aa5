// fused_classifier.cuh: the classifier head's loss and its gradient in one pass per row, never
// materializing the probabilities. logits (N, Vp) floatX, only the first V columns are real.
//   losses[r] = logsumexp(logits[r, :V]) - logits[r, targets[r]]                          (=)
//   if write_dlogits: logits[r, c] is overwritten by dloss * (softmax(logits[r, :V])[c] - [c == target])
//   for c < V and by 0 for the padded columns V <= c < Vp                                  (=)
// dloss is the loss gradient of each position: 1 / (B * T * grad_accum) for a mean over the batch.
// With write_dlogits false (validation) the logits stay untouched.
// FP8 dlogits (fused_classifier_fp8; --fp8-head, llmc/gpt2_fp8.cuh): the same gradient, rounded to
// floatX as above, then cast to FP8 at a fixed power-of-two scale (|dlogits| <= dloss, so the scale
// is known before the kernel runs: cpu::fp8_pow2_scale(dloss)), written in place: row r's Vp bytes at
// the start of the logits' row r (a row pitch of 2 Vp bytes), the rest of each row left as it was.
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/fp8.cuh"
#include "llmc/utils.h"

constexpr int CLASSIFIER_BLOCK = 1024;

// What the gradient is written as: floatX (the bf16 trainer's dlogits), or FP8 at a given scale.
enum class ClassifierOut { FLOATX, E4M3, E5M2 };

// One row's loss and gradient by a block of CLASSIFIER_BLOCK threads, the row read from `x` (global
// or shared memory), the gradient written to `out` (global: floatX, or with an FP8 OUT that many
// bytes, fp8(gradient * fp8_scale)). Thread i handles packs i, i+1024, ...
// Pass 1: running (max, sum of exp) per thread, merged across the block. Pass 2 re-reads the row
// and writes the gradient. Every read of pass 1 (including the target's logit) happens before the
// block reductions' barriers and every write after them, so out may be x (in place) when x is in
// shared memory, or when out has floatX's layout (each thread writes the bytes it read).
template <ClassifierOut OUT = ClassifierOut::FLOATX>
__device__ inline void classifier_row(void* out, float* loss, const floatX* x, int target, float dloss, int V, int Vp,
                                      bool write_dlogits, float fp8_scale = 1.0f) {
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
        if constexpr (OUT == ClassifierOut::FLOATX) {
            store128(static_cast<floatX*>(out) + c, v);
        } else {  // the floatX value times the scale, as fp8_cast of the floatX dlogits would
            constexpr Fp8Format F = OUT == ClassifierOut::E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
            Fp8Pack o;
            for (int k = 0; k < x128::size; k += 2)
                o.h[k / 2] = fp8x2_from_float2<F>(to_float(v[k]) * fp8_scale, to_float(v[k + 1]) * fp8_scale);
            *reinterpret_cast<Fp8Pack*>(static_cast<uint8_t*>(out) + c) = o;
        }
    }
}

// Rows through shared memory, read from DRAM once (the FP8 head's classifier, fused_classifier_fp8,
// which needs the row in shared memory to write its FP8 gradient in place; the bf16 gradient's is
// the lab's variant 1, dev/cuda/fused_classifier.cu: it measured no faster than the block-per-row
// kernel, see below). Two rows must fit in shared memory: bf16 up to Vp ~ 58K; sm_90. A persistent grid of one block of
// CLASSIFIER_BLOCK threads a SM, block b takes rows b, b + grid, ...; two row buffers: while the
// block works on row i from one, the copy engine brings row i + grid into the other (one
// cp.async.bulk of Vp * sizeof(floatX) bytes, 100.6 KB at Vp 50304, completing on an mbarrier), so
// every SM always has a row's load in flight beside its gradient's stores, and no SM's block waits
// on DRAM latency between rows or spends barriers while nothing is loading. Both passes read shared
// memory; the gradient goes back to the row in global memory.
// DRAM: N * Vp * sizeof(floatX) read and (with write_dlogits) as much written, 13.2 GB at
// B*T = 65536, Vp 50304: 3.3 ms at the 4.0 TB/s copy; ~2.1 exp a logit (SFU: ~3.4 us a row a SM
// // against ~6.6 us of the SM's share of DRAM): memory-bound. H200 (2026-12-03), bf16 gradient: 4.289 ms,
// 76.9% of the copy, no faster than fused_classifier_block_per_row (4.259 ms, 77.4%; loss only 2.319 vs
// 2.201 ms), which fused_classifier ships.
// FP8 OUT (fused_classifier_fp8): row r's gradient goes to out8 + r * out8_pitch bytes (in place: the
// logits themselves, pitch 2 Vp: inside the row's own bf16 bytes, which are in shared memory by
// then), and block 0 sets fp8_meta's scale and scale_inv for the matmuls that read it.
template <ClassifierOut OUT = ClassifierOut::FLOATX>
static __global__ void __launch_bounds__(CLASSIFIER_BLOCK, 1)
    fused_classifier_rows_in_smem(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                                  bool write_dlogits, uint8_t* out8 = nullptr, int64_t out8_pitch = 0,
                                  float fp8_scale = 1.0f, Fp8Meta* fp8_meta = nullptr) {
#if LLMC_HAS_BULK_COPY
    extern __shared__ __align__(16) unsigned char classifier_smem[];  // (2, Vp) floatX
    __shared__ __align__(8) uint64_t loaded[2];                        // one mbarrier a buffer
    floatX* buf = reinterpret_cast<floatX*>(classifier_smem);
    const uint32_t row_bytes = (uint32_t)Vp * sizeof(floatX);
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(&loaded[0]);
    auto bar = [&](int b) { return bar0 + (uint32_t)(b * sizeof(uint64_t)); };
    auto load_row = [&](int row, int b) {
        mbar_expect_tx(bar(b), row_bytes);
        bulk_load((uint32_t)__cvta_generic_to_shared(buf + (size_t)b * Vp), logits + (int64_t)row * Vp, row_bytes,
                  bar(b));
    };
    if (OUT != ClassifierOut::FLOATX && blockIdx.x == 0 && threadIdx.x == 0) {
        fp8_meta->scale = fp8_scale;
        fp8_meta->scale_inv = 1.0f / fp8_scale;  // exact: a power of two
    }
    if (threadIdx.x == 0) {
        mbar_init(bar(0), 1);
        mbar_init(bar(1), 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine
        if (blockIdx.x < N) load_row(blockIdx.x, 0);
    }
    __syncthreads();
    int i = 0;
    for (int row = blockIdx.x; row < N; row += gridDim.x, i++) {
        const int b = i & 1;
        // the other buffer held row i - 1, done by every thread (the barrier at the end of the loop)
        if (threadIdx.x == 0 && row + (int)gridDim.x < N) load_row(row + gridDim.x, b ^ 1);
        mbar_wait(bar(b), (i >> 1) & 1);  // buffer b's (i / 2)-th load
        void* out = OUT == ClassifierOut::FLOATX ? (void*)(logits + (int64_t)row * Vp) : (void*)(out8 + row * out8_pitch);
        classifier_row<OUT>(out, losses + row, buf + (size_t)b * Vp, targets[row], dloss, V, Vp, write_dlogits,
                            fp8_scale);
        __syncthreads();  // buffer b is refilled at the next iteration
    }
#else
    __trap();
#endif
}

// One block per row straight from global memory (where two rows do not fit in shared memory: the
// FP32 build, vocabularies past ~58K; and below sm_90). Pass 2 re-reads the row (100 KB in bf16 at
// Vp = 50304: still in L2). DRAM: ~2 * N * Vp * sizeof(floatX) bytes; H200, bf16, B*T = 65536: 4.26 ms,
// 77% of the copy.
static __global__ void fused_classifier_block_per_row(floatX* logits, float* losses, const int* targets, float dloss,
                                                      int V, int Vp, bool write_dlogits) {
    floatX* x = logits + (int64_t)blockIdx.x * Vp;
    classifier_row(x, losses + blockIdx.x, x, targets[blockIdx.x], dloss, V, Vp, write_dlogits);
}

// Shared memory for fused_classifier_rows_in_smem, and whether it fits this device (sm_90 and the
// opt-in limit per block, 227 KB on the H200, less the kernel's own few hundred bytes).
inline size_t classifier_smem_bytes(int Vp) { return 2 * (size_t)Vp * sizeof(floatX); }
inline bool classifier_rows_fit_smem(int Vp) {
    static const int optin = [] {
        int dev = 0, major = 0, bytes = 0;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        cudaCheck(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        return major >= 9 ? bytes : 0;
    }();
    return classifier_smem_bytes(Vp) + 1024 <= (size_t)optin;
}

// Raises the shared-memory kernel's opt-in to a row of Vp logits, once per output kind and size. The
// trainer calls it for the FP8 kinds before any graph capture (gpt2_build); the launchers call it too.
template <ClassifierOut OUT>
inline void classifier_smem_optin(int Vp) {
    static size_t smem_set = 0;  // the kernel's opt-in, raised once to the largest row seen
    const size_t smem = classifier_smem_bytes(Vp);
    if (smem > smem_set) {
        cudaCheck(cudaFuncSetAttribute(fused_classifier_rows_in_smem<OUT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem));
        smem_set = smem;
    }
}

inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                             bool write_dlogits, cudaStream_t stream) {
    if (Vp % x128::size != 0) fail("fused_classifier: padded vocab %d is not a multiple of %d", Vp, x128::size);
    fused_classifier_block_per_row<<<N, CLASSIFIER_BLOCK, 0, stream>>>(logits, losses, targets, dloss, V, Vp,
                                                                       write_dlogits);
    cudaCheckLaunch();
}

// fused_classifier through fused_classifier_rows_in_smem (the lab's variant 1; the caller checks
// classifier_rows_fit_smem).
inline void fused_classifier_rows_in_smem_forward(floatX* logits, float* losses, const int* targets, float dloss,
                                                  int N, int V, int Vp, bool write_dlogits, cudaStream_t stream) {
    classifier_smem_optin<ClassifierOut::FLOATX>(Vp);
    static const int sms = current_sm_count();
    fused_classifier_rows_in_smem<ClassifierOut::FLOATX><<<std::min(N, sms), CLASSIFIER_BLOCK,
                                                           classifier_smem_bytes(Vp), stream>>>(
        logits, losses, targets, dloss, N, V, Vp, write_dlogits);
    cudaCheckLaunch();
}

// The losses as fused_classifier, and the gradient as FP8 in place (see the top): row r's Vp FP8
// values at byte r * Vp * sizeof(floatX) of the logits; fp8(floatX(gradient) * scale) with scale =
// cpu::fp8_pow2_scale(dloss, format), which block 0 also stores into meta (scale, scale_inv).
// Only the shared-memory kernel (sm_90, rows up to ~58K in bf16): the block-per-row kernel re-reads
// the row from global memory in its second pass, where the FP8 bytes would land under it.
// DRAM: N * Vp * (2 read + 1 written) bytes, against 2 + 2 for the bf16 gradient: 9.9 GB at
// B*T = 65536, Vp 50304, against 13.2.
inline void fused_classifier_fp8(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                                 Fp8Format format, Fp8Meta* meta, cudaStream_t stream) {
    if (Vp % x128::size != 0) fail("fused_classifier_fp8: padded vocab %d is not a multiple of %d", Vp, x128::size);
    if (!classifier_rows_fit_smem(Vp))
        fail("fused_classifier_fp8: two rows of %d logits do not fit in this GPU's shared memory (--fp8-head 1 needs "
             "sm_90)", Vp);
    const size_t smem = classifier_smem_bytes(Vp);
    const float scale = cpu::fp8_pow2_scale(dloss, fp8_cpu_format(format));
    static const int sms = current_sm_count();
    const int grid = std::min(N, sms);
    uint8_t* out8 = reinterpret_cast<uint8_t*>(logits);
    const int64_t pitch = (int64_t)Vp * sizeof(floatX);  // bytes: the floatX row's
    if (format == Fp8Format::E4M3) {
        classifier_smem_optin<ClassifierOut::E4M3>(Vp);
        fused_classifier_rows_in_smem<ClassifierOut::E4M3><<<grid, CLASSIFIER_BLOCK, smem, stream>>>(
            logits, losses, targets, dloss, N, V, Vp, true, out8, pitch, scale, meta);
    } else {
        classifier_smem_optin<ClassifierOut::E5M2>(Vp);
        fused_classifier_rows_in_smem<ClassifierOut::E5M2><<<grid, CLASSIFIER_BLOCK, smem, stream>>>(
            logits, losses, targets, dloss, N, V, Vp, true, out8, pitch, scale, meta);
    }
    cudaCheckLaunch();
}
