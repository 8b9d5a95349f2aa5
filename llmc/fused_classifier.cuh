// fused_classifier.cuh: the classifier head's loss and its gradient in one pass per row, never
// materializing the probabilities. logits (N, Vp) floatX, only the first V columns are real.
//   losses[r] = logsumexp(logits[r, :V]) - logits[r, targets[r]]                          (=)
//   if write_dlogits: logits[r, c] is overwritten by dloss * (softmax(logits[r, :V])[c] - [c == target])
//   for c < V and by 0 for the padded columns V <= c < Vp                                  (=)
// dloss is the loss gradient of each position: 1 / (B * T * grad_accum) for a mean over the batch;
// row_dloss (N), where given, replaces it row by row (a loss mask: mask / (counted * grad_accum), 0 at
// masked rows, whose dlogits become 0). With write_dlogits false (validation) the logits stay untouched.
// FP8 dlogits (fused_classifier_fp8; --fp8-head, llmc/model_fp8.cuh): the same gradient (dloss on every
// row, no row_dloss), rounded to floatX as above, then cast to FP8 at a fixed power-of-two scale
// (|dlogits| <= dloss, so the scale is known before the kernel runs: cpu::fp8_pow2_scale(dloss)),
// written in place: row r's Vp bytes at the start of the logits' row r (a row pitch of 2 Vp bytes),
// the rest of each row left as it was.
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/fp8.cuh"
#include "llmc/utils.h"

constexpr int CLASSIFIER_BLOCK = 1024;

// One pack's step of a thread's running (max, sum of exp) in pass 1: the pack's max, one rescale of
// the sum, then the pack's exps added in column order. FULL: all 8 columns are real (every pack but
// the last of a row): no per-column bounds test, the same operations in the same order.
template <bool FULL>
__device__ inline void classifier_stats_pack(float& m, float& s, const x128& v, int c, int V) {
    float pack_max = -INFINITY;
    for (int k = 0; k < x128::size && (FULL || c + k < V); k++) pack_max = fmaxf(pack_max, to_float(v[k]));
    const float new_m = fmaxf(m, pack_max);
    s *= expf(m - new_m);
    for (int k = 0; k < x128::size && (FULL || c + k < V); k++) s += expf(to_float(v[k]) - new_m);
    m = new_m;
}

// A row's first pass by a block of CLASSIFIER_BLOCK threads, x in global or shared memory: thread i
// keeps a running (max, sum of exp) over packs i, i + 1024, ..., merged across the block; thread 0
// writes the loss. Every read of x happens before the reductions' barriers, so the block may overwrite
// x once this returns. The order of the fp32 max and sum is part of the contract: the FP8 and the bf16
// classifiers give the same loss bits and gradient (tests/gpu/test_fp8.cu). With `held`, packs p <
// held_packs are also copied to held[p] (shared memory) by the thread that reads them back in pass 2.
// LOADS packs a thread are loaded before any is summed (the sums keep their order).
template <int LOADS = 1>
__device__ inline void classifier_row_stats(float* loss, float* row_max, float* inv_sum, const floatX* x, int target,
                                            int V, x128* held = nullptr, int held_packs = 0) {
    float m = -INFINITY, s = 0.0f;
    const int stride = blockDim.x * x128::size;
    auto step = [&](const x128& v, int c) {
        if (c / x128::size < held_packs) held[c / x128::size] = v;
        if (c + x128::size <= V) classifier_stats_pack<true>(m, s, v, c, V);
        else classifier_stats_pack<false>(m, s, v, c, V);
    };
    int c = threadIdx.x * x128::size;
    for (; LOADS > 1 && c + (LOADS - 1) * stride < V; c += LOADS * stride) {
        x128 v[LOADS];
        for (int u = 0; u < LOADS; u++) v[u] = load128(x + c + u * stride);
        for (int u = 0; u < LOADS; u++) step(v[u], c + u * stride);
    }
    for (; c < V; c += stride) step(load128(x + c), c);
    const float target_logit = threadIdx.x == 0 ? to_float(x[target]) : 0.0f;
    const float mx = block_reduce_max(m);
    const float sum = block_reduce_sum(m == -INFINITY ? 0.0f : s * expf(m - mx));
    if (threadIdx.x == 0) *loss = logf(sum) + mx - target_logit;
    *row_max = mx;
    *inv_sum = 1.0f / sum;
}

// The gradient of the pack v of logits at columns c .. c + 7 in fp32: dloss * (softmax - [col ==
// target]), 0 at the padded columns (col >= V). A pack of 8 real columns without the target (all but
// ~2 of a row's packs) takes the short path: no bounds or target tests, and dloss * (p - 0) as
// dloss * p, which is the same value (x - 0 = x; or, where the compiler fuses the product and the
// subtraction, fma(e, inv_sum, -0) = e * inv_sum rounded once: the same bits).
__device__ inline void classifier_grad_values(float (&g)[x128::size], const x128& v, int c, int target,
                                              float row_max, float inv_sum, float dloss, int V) {
    if (c + x128::size <= V && (unsigned)(target - c) >= (unsigned)x128::size) {
        for (int k = 0; k < x128::size; k++) g[k] = dloss * (expf(to_float(v[k]) - row_max) * inv_sum);
    } else {
        for (int k = 0; k < x128::size; k++) {
            const int col = c + k;
            g[k] = 0.0f;
            if (col < V) g[k] = dloss * (expf(to_float(v[k]) - row_max) * inv_sum - (col == target ? 1.0f : 0.0f));
        }
    }
}

// classifier_grad_values rounded to floatX. The bf16 rounding goes two values at a time (one
// cvt.rn.bf16x2.f32 for two: the same bits as two cvt.rn.bf16.f32, half the conversions on the SM's
// 16-a-clock conversion pipe).
__device__ inline x128 classifier_grad_pack(const x128& v, int c, int target, float row_max, float inv_sum,
                                            float dloss, int V) {
    float g[x128::size];
    classifier_grad_values(g, v, c, target, row_max, inv_sum, dloss, V);
    x128 out;
#if defined(PRECISION_FP32)
    for (int k = 0; k < x128::size; k++) out[k] = g[k];
#else
    for (int k = 0; k < x128::size; k += 2) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(g[k], g[k + 1]);  // .x = g[k]
        out[k] = h.x;
        out[k + 1] = h.y;
    }
#endif
    return out;
}

// The floatX gradient pack as FP8: fp8(float(g) * scale), what fp8_cast of the floatX dlogits gives.
template <Fp8Format F>
__device__ inline Fp8Pack classifier_fp8_pack(const x128& g, float scale) {
    Fp8Pack o;
    for (int k = 0; k < x128::size; k += 2)
        o.h[k / 2] = fp8x2_from_float2<F>(to_float(g[k]) * scale, to_float(g[k + 1]) * scale);
    return o;
}

// One block per row straight from global memory, the floatX gradient in place over the logits (where
// write_dlogits). Pass 2 re-reads the row (100 KB in bf16 at Vp = 50304: still in L2); each thread
// writes the bytes it read. DRAM: ~2 * N * Vp * sizeof(floatX) bytes; memory-bound. Measured (and
// rows read once through shared memory, no faster): dev/cuda/fused_classifier.cu; docs/perf.md,
// "Memory-bound kernels".
static __global__ void __launch_bounds__(CLASSIFIER_BLOCK, sm_blocks(CLASSIFIER_BLOCK, 2))
    fused_classifier_block_per_row(floatX* logits, float* losses, const int* targets, float dloss,
                                   const float* row_dloss, int V, int Vp, bool write_dlogits) {
    floatX* x = logits + (int64_t)blockIdx.x * Vp;
    const int target = targets[blockIdx.x];
    float row_max, inv_sum;
    classifier_row_stats(losses + blockIdx.x, &row_max, &inv_sum, x, target, V);
    if (!write_dlogits) return;
    const float d = row_dloss ? row_dloss[blockIdx.x] : dloss;  // uniform across the block
    for (int c = threadIdx.x * x128::size; c < Vp; c += blockDim.x * x128::size)
        store128(x + c, classifier_grad_pack(load128(x + c), c, target, row_max, inv_sum, d, V));
}

// The FP8 gradient in place (fused_classifier_fp8, --fp8-head 1): one block of 1024 threads per row
// from global memory, two blocks a SM (32 registers a thread, 2 x 50.3 KB of shared memory at
// Vp = 50304), so one block's loads overlap the other's exp and conversions. Row r's FP8 bytes go to
// bytes [0, Vp) of its own floatX row, over logits [0, Vp / 2) that other threads may not have re-read
// yet: so pass 1 also copies that first half into shared memory (`held`, Vp bytes), the reductions'
// barriers separate every read of the row in global memory from every write, and pass 2 takes the
// first half from shared memory and the second, never written, from global memory (L2).
// Same reduction order and per-value math as fused_classifier_block_per_row: the losses and the floatX
// gradient (before the FP8 cast) are bit for bit the bf16 classifier's.
// DRAM: N * Vp * (2 read + 1 written) bytes, 9.9 GB at B*T = 65536, Vp 50304 (2.8 ms at 3.5 TB/s);
// the SM's 16-a-clock pipes: ~2.1 ex2 and 1 conversion a logit (bf16x2, fp8x2: one per two values),
// ~2.5 ms at 1.98 GHz: close to both bounds, which the two blocks a SM overlap.
template <Fp8Format F, int LOADS = 1>
static __global__ void __launch_bounds__(CLASSIFIER_BLOCK, sm_blocks(CLASSIFIER_BLOCK, 2))
    fused_classifier_fp8_block_per_row(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp,
                                       float fp8_scale, Fp8Meta* fp8_meta) {
    extern __shared__ x128 classifier_held[];  // (held_packs) x128: the row's first Vp / 2 logits
    const int held_packs = ceil_div(Vp / 2, x128::size);
    floatX* x = logits + (int64_t)blockIdx.x * Vp;
    uint8_t* out = reinterpret_cast<uint8_t*>(x);  // row r's FP8 gradient: bytes [0, Vp) of its logits
    const int target = targets[blockIdx.x];
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        fp8_meta->scale = fp8_scale;
        fp8_meta->scale_inv = 1.0f / fp8_scale;  // exact: a power of two
    }
    float row_max, inv_sum;
    classifier_row_stats<LOADS>(losses + blockIdx.x, &row_max, &inv_sum, x, target, V, classifier_held, held_packs);
    for (int c = threadIdx.x * x128::size; c < Vp; c += blockDim.x * x128::size) {
        // a held pack this thread copied in pass 1; padded packs past V were never read (their g is 0)
        const int p = c / x128::size;
        x128 v = x128::constant(from_float<floatX>(0.0f));
        if (p >= held_packs) v = load128(x + c);
        else if (c < V) v = classifier_held[p];
        *reinterpret_cast<Fp8Pack*>(out + c) =
            classifier_fp8_pack<F>(classifier_grad_pack(v, c, target, row_max, inv_sum, dloss, V), fp8_scale);
    }
}

// The FP8 gradient from rows in shared memory (fused_classifier_fp8's kernel where a row fits:
// classifier_fp8_rows_fit): a persistent grid of two blocks of CLASSIFIER_BLOCK threads a SM, block b
// taking rows b, b + grid, ...; once done with a row, a block brings its next into its one row buffer
// by one cp.async.bulk (completing on an mbarrier), overlapping the other block's two passes. The same
// passes in the same order: the losses and FP8 bytes are bit for bit the block-per-row kernel's (the
// lab compares every byte). DRAM: as that kernel's, less its second pass's L2 reads. Measured against
// it: dev/cuda/fused_classifier.cu.
template <Fp8Format F>
static __global__ void __launch_bounds__(CLASSIFIER_BLOCK, sm_blocks(CLASSIFIER_BLOCK, 2))
    fused_classifier_fp8_rows_in_smem(floatX* logits, float* losses, const int* targets, float dloss, int N, int V,
                                      int Vp, float fp8_scale, Fp8Meta* fp8_meta) {
#if LLMC_HAS_BULK_COPY
    extern __shared__ __align__(16) unsigned char classifier_row[];  // (Vp) floatX: the block's row
    __shared__ __align__(8) uint64_t loaded;                           // the row buffer's mbarrier
    const floatX* x = reinterpret_cast<const floatX*>(classifier_row);
    const uint32_t row_bytes = (uint32_t)Vp * sizeof(floatX);
    const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&loaded);
    auto load_row = [&](int row) {
        mbar_expect_tx(bar, row_bytes);
        bulk_load((uint32_t)__cvta_generic_to_shared(classifier_row), logits + (int64_t)row * Vp, row_bytes, bar);
    };
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        fp8_meta->scale = fp8_scale;
        fp8_meta->scale_inv = 1.0f / fp8_scale;  // exact: a power of two
    }
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine
        if (blockIdx.x < N) load_row(blockIdx.x);
    }
    __syncthreads();
    int i = 0;
    for (int row = blockIdx.x; row < N; row += gridDim.x, i++) {
        mbar_wait(bar, i & 1);  // the buffer's i-th load
        const int target = targets[row];
        float row_max, inv_sum;
        classifier_row_stats(losses + row, &row_max, &inv_sum, x, target, V);
        uint8_t* out = reinterpret_cast<uint8_t*>(logits + (int64_t)row * Vp);
        for (int c = threadIdx.x * x128::size; c < Vp; c += blockDim.x * x128::size)
            *reinterpret_cast<Fp8Pack*>(out + c) = classifier_fp8_pack<F>(
                classifier_grad_pack(load128(x + c), c, target, row_max, inv_sum, dloss, V), fp8_scale);
        __syncthreads();  // every thread is done with the buffer: the next row may overwrite it
        if (threadIdx.x == 0 && row + (int)gridDim.x < N) load_row(row + gridDim.x);
    }
#else
    __trap();
#endif
}

// row_dloss: (N) device, or nullptr for dloss on every row (see the top).
inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                             bool write_dlogits, cudaStream_t stream, const float* row_dloss = nullptr) {
    if (Vp % x128::size != 0) fail("fused_classifier: padded vocab %d is not a multiple of %d", Vp, x128::size);
    fused_classifier_block_per_row<<<N, CLASSIFIER_BLOCK, 0, stream>>>(logits, losses, targets, dloss, row_dloss, V,
                                                                       Vp, write_dlogits);
    cudaCheckLaunch();
}

// Shared memory of fused_classifier_fp8_block_per_row: the first half of a row, Vp bytes at 16-byte packs.
inline size_t classifier_fp8_smem_bytes(int Vp) { return (size_t)ceil_div(Vp / 2, x128::size) * sizeof(x128); }
// Shared memory of fused_classifier_fp8_rows_in_smem: a whole row.
inline size_t classifier_fp8_row_smem_bytes(int Vp) { return (size_t)Vp * sizeof(floatX); }

// Whether fused_classifier_fp8 takes fused_classifier_fp8_rows_in_smem on ctx's GPU: its code was
// compiled for sm_90 or newer (the bulk copy) and two blocks of a row each (plus 1 KB reserved and a
// few bytes) fit in an SM: bf16 rows up to Vp ~ 57K on the H200. Else the block-per-row kernel.
inline bool classifier_fp8_rows_fit(int Vp, const CudaContext& ctx) {
    const size_t block = classifier_fp8_row_smem_bytes(Vp) + 1024 + 64;
    return ctx.code_arch >= 90 && 2 * block <= ctx.props.sharedMemPerMultiprocessor &&
           block <= ctx.props.sharedMemPerBlockOptin;
}

// Checks that the FP8 classifier's shared memory fits ctx's GPU (Vp up to ~230K on the H200's 227 KB a
// block) and raises the opt-in of the kernel that will run past the default 48 KB (ctx.allow_smem: once
// per kernel and size). The trainer calls it before any graph capture (fp8_init_metas); the launcher too.
inline void fused_classifier_fp8_prepare(int Vp, const CudaContext& ctx) {
    if (classifier_fp8_rows_fit(Vp, ctx)) {
        const int smem = (int)classifier_fp8_row_smem_bytes(Vp);
        ctx.allow_smem(fused_classifier_fp8_rows_in_smem<Fp8Format::E4M3>, smem);
        ctx.allow_smem(fused_classifier_fp8_rows_in_smem<Fp8Format::E5M2>, smem);
        return;
    }
    const size_t smem = classifier_fp8_smem_bytes(Vp);
    if (smem + 1024 > ctx.props.sharedMemPerBlockOptin)
        fail("fused_classifier_fp8: the first half of a row of %d logits (%zu bytes of shared memory) does not fit "
             "this GPU's %zu", Vp, smem, ctx.props.sharedMemPerBlockOptin);
    ctx.allow_smem(fused_classifier_fp8_block_per_row<Fp8Format::E4M3>, (int)smem);
    ctx.allow_smem(fused_classifier_fp8_block_per_row<Fp8Format::E5M2>, (int)smem);
}

// The losses as fused_classifier, and the gradient as FP8 in place (see the top) with scale =
// cpu::fp8_pow2_scale(dloss, format), which block 0 also stores into meta (scale, scale_inv); by
// fused_classifier_fp8_rows_in_smem where classifier_fp8_rows_fit, else block per row (the same bits).
inline void fused_classifier_fp8(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                                 Fp8Format format, Fp8Meta* meta, const CudaContext& ctx) {
    if (Vp % x128::size != 0) fail("fused_classifier_fp8: padded vocab %d is not a multiple of %d", Vp, x128::size);
    if (N <= 0) return;
    fused_classifier_fp8_prepare(Vp, ctx);
    const float scale = cpu::fp8_pow2_scale(dloss, fp8_cpu_format(format));
    auto launch = [&](auto format_constant) {
        constexpr Fp8Format F = decltype(format_constant)::value;
        if (classifier_fp8_rows_fit(Vp, ctx))
            fused_classifier_fp8_rows_in_smem<F><<<std::min(N, 2 * ctx.sm_count), CLASSIFIER_BLOCK,
                                                   classifier_fp8_row_smem_bytes(Vp), ctx.stream>>>(
                logits, losses, targets, dloss, N, V, Vp, scale, meta);
        else
            fused_classifier_fp8_block_per_row<F><<<N, CLASSIFIER_BLOCK, classifier_fp8_smem_bytes(Vp), ctx.stream>>>(
                logits, losses, targets, dloss, V, Vp, scale, meta);
    };
    if (format == Fp8Format::E4M3) launch(std::integral_constant<Fp8Format, Fp8Format::E4M3>{});
    else launch(std::integral_constant<Fp8Format, Fp8Format::E5M2>{});
    cudaCheckLaunch();
}
