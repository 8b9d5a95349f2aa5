// fused_classifier.cu: softmax + cross-entropy + its gradient in one pass per row, written in place
// over the logits (llmc/fused_classifier.cuh), against cpu::softmax_crossentropy_forward and
// cpu::crossentropy_softmax_backward (llmc/cpu/crossentropy.h); then the FP8 head's classifier
// (fused_classifier_fp8, --fp8-head 1: the gradient cast to FP8 in place) against the same gradient
// rounded to bf16 and cast by llmc/cpu/fp8.h.
//   ./fused_classifier [variant ...] [--check-only] [--reps N] [--fp8 e4m3|e5m2|both]
// (--fp8: only the FP8 classifier, in those formats; without it, every op and both formats)
// Shapes: GPT-2 124M, N = B*T = 65536 rows of Vp = 50304 (V = 50257 real), and the awkward N = 651,
// V = 1003, Vp = 1008. The logits are 6.6 GB, so the check compares 16 sampled rows (first and last
// included) of the gradient and of the losses; the written and guard checks cover every element.
// Bytes: the logits read once and the gradient written once (N*Vp each), targets and losses.
// FLOPs: ~6 per element (max, subtract, exp counted as 1, sum, scale, subtract).
//
// Variants of fused_classifier (H200, bf16, N=65536 Vp=50304; % of the 4.0 TB/s copy):
//   0 shipped: fused_classifier_block_per_row, 1024 threads per row, two passes over global memory
//     (the second from L2), 2026-12-02:                                            4.26 ms, 77%
//     loss only (write_dlogits false, validation):                                 2.20 ms, 75%
//     2026-12-04: short paths for full packs and bf16x2 conversions (the FP8 kernel's passes, the
//     same bits), two blocks a SM by __launch_bounds__: not timed separately yet (the FP8 runs of
//     2026-12-04 did not include the bf16 op).
//   1 fused_classifier_rows_in_smem (below; shipped 2026-12-03, branch s7/membound, then taken back
//     for the bf16 gradient, and the FP8 head's classifier until 2026-12-04): one persistent block a
//     SM, each row brought into shared memory by one bulk copy while the block works on the previous
//     row, read from DRAM once; sm_90 and two rows within the opt-in shared memory (bf16 up to
//     Vp ~ 58K), else skipped. 2026-12-03, beside variant 0 (4.2592 ms, 77.4%; loss only 2.2006,
//     74.8%):                                                     4.2891 ms, 76.9%; loss only 2.3188 ms, 71.0%
//     Reading DRAM once bought nothing: variant 0's second pass already comes from L2.
// Rejected (2026-12-02): variant 0 with 512 threads per row 4.75 ms, 69%; with 256, 4.77 ms, 69%
// (more rows in flight than L2 holds between the two passes). At the awkward N=651, Vp=1008 the
// small blocks won, 0.007 vs 0.011 ms: irrelevant in training.
//
// Variants of fused_classifier_fp8 (e4m3 and e5m2 gradients; bytes: the logits read once, the FP8
// gradient written once, N*Vp*3):
//   0 shipped: fused_classifier_fp8 = fused_classifier_fp8_rows_in_smem where a row fits (sm_90a
//     build, two rows a SM: bf16 Vp up to ~57K), one row buffer a block and two blocks a SM (each
//     block's next row loads by bulk copy while the other block computes), the block-per-row kernels'
//     passes. H200, 2026-12-04, as the lab's variant 2 before it shipped (e4m3, N=65536 V=50257):
//                                                                     3.4861 ms (0.918x variant 2's time)
//     Its losses and FP8 bytes are checked bit for bit against variant 2's (FAIL otherwise), and its
//     losses against the bf16 classifier's.
//   1 fused_classifier_rows_in_smem with an FP8 output, exactly as shipped until 2026-12-04 (one
//     persistent block a SM, rows by bulk copy, bounds tests on every column, one bf16 conversion a
//     value): 4.92 ms a step in the trainer's profile (dev/cuda/build/profile_gpt2 --fp8 1
//     --fp8-head 1). Its bytes and losses are compared with variant 0's (23 of 3.3e9 bytes and 93
//     losses differ: its own per-value code, not the bf16 classifier's).
//   2 fused_classifier_fp8_block_per_row (shipped 2026-12-04 until variant 0 replaced it; the
//     launcher's fallback for wider rows): one 1024-thread block per row from global memory, two
//     blocks a SM, the row's first half kept in shared memory for pass 2 (its FP8 stores land there),
//     the second half re-read from L2; bf16 rounding two values a conversion; both passes with a
//     short path for packs of 8 real columns (no bounds tests; in pass 2 no target test where the
//     target is elsewhere), the same operations on every value. H200, 2026-12-04 (e4m3; e5m2 the same
//     within 0.1%), N=65536 V=50257:                                  3.7966 ms; 3.94 ms in the step's profile
//     Its losses are bit for bit the bf16 classifier's (variant 1's differ in 89-93 of 65,536 rows).
//   3 variant 2 with the bf16 rounding on the integer pipe instead of cvt.rn.bf16x2 (if the
//     conversion pipe, shared with ex2, bounds pass 2).                    3.9766 ms (1.047x variant 2's)
//   4 variant 2 with pass 1 loading two packs a thread before summing either (twice the bytes in
//     flight a warp; the same order of the sums).                         3.5163 ms (0.926x variant 2's)
// Checks of each FP8 variant, on fresh logits at a trained model's scale (normal, sd 2, with a few
// large logits a row, +10 .. +16: softmax values from ~1e-12 to ~0.5, so the FP8 gradient spans
// zero, subnormals and normals): the losses poisoned first, then all of them written, the sampled
// rows' against the CPU (fp32 tolerance), and (variant 0; the others' reported) every loss bit for
// bit the bf16 classifier's (the same pass 1); the scale and scale_inv in the meta exactly
// cpu::fp8_pow2_scale(dloss); the FP8 bytes of the sampled rows (padded columns included) against
// cpu::fp8_cast of the CPU gradient rounded to bf16 at that scale: equal or one code apart (the CPU
// sums in double, the GPU in fp32 with ex2.approx: a bf16 rounding may land one step away), the
// count of exactly equal bytes printed; the second half of every row (bytes Vp .. 2 Vp) and the
// guard after the buffer untouched. The FP8 bytes are written over the kernel's own input, so they
// cannot be poisoned beforehand; instead every FP8 byte of every row is compared with variant 1's
// (the kernel it replaces), and the count of differing bytes and loss bits printed ("bytes vs rows
// in smem, variant 0: equal").
#include <memory>

#include "dev/cuda/harness.cuh"
#include "llmc/cpu/crossentropy.h"
#include "llmc/cpu/fp8.h"
#include "llmc/fused_classifier.cuh"

constexpr int SAMPLES = 16;

// ---------------------------------------------------------------- variant 1: rows in shared memory
// What the gradient is written as: floatX (the bf16 trainer's dlogits), or FP8 at a given scale.
enum class ClassifierOut { FLOATX, E4M3, E5M2 };

// Pass 1 as it shipped until 2026-12-04 (llmc's classifier_row_stats since adds a short path for full
// packs, the same operations in the same order): variant 1 keeps it, so that comparing its bytes and
// losses with the shipped kernel's checks that the short paths changed no bit.
__device__ inline void classifier_row_stats_as_shipped(float* loss, float* row_max, float* inv_sum, const floatX* x,
                                                       int target, int V) {
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
    const float mx = block_reduce_max(m);
    const float sum = block_reduce_sum(m == -INFINITY ? 0.0f : s * expf(m - mx));
    if (threadIdx.x == 0) *loss = logf(sum) + mx - target_logit;
    *row_max = mx;
    *inv_sum = 1.0f / sum;
}

// Rows through shared memory, read from DRAM once. Two rows must fit in shared memory: bf16 up to
// Vp ~ 58K; sm_90. A persistent grid of one block of CLASSIFIER_BLOCK threads a SM, block b takes rows
// b, b + grid, ...; two row buffers: while the block works on row i from one, the copy engine brings
// row i + grid into the other (one cp.async.bulk of Vp * sizeof(floatX) bytes, 100.6 KB at Vp 50304,
// completing on an mbarrier). Both passes read shared memory; the gradient goes back to the row in
// global memory (FP8: row r's to out8 + r * out8_pitch bytes, in place at pitch 2 Vp; block 0 sets
// fp8_meta). Both passes as they shipped (one bf16 conversion a value, bounds tests on every column).
// Lab option: BUFS 1, one row buffer a block and two blocks a SM (one block's row loads while the
// other computes; its next row's load starts only once it is done with the row). The FP8 kernel
// shipped since (llmc's fused_classifier_fp8_rows_in_smem) is BUFS 1 with the block-per-row kernels'
// passes (short paths for full packs, bf16x2 conversions).
template <ClassifierOut OUT, int BUFS = 2>
static __global__ void __launch_bounds__(CLASSIFIER_BLOCK, sm_blocks(CLASSIFIER_BLOCK, BUFS == 1 ? 2 : 1))
    fused_classifier_rows_in_smem(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                                  bool write_dlogits, uint8_t* out8 = nullptr, int64_t out8_pitch = 0,
                                  float fp8_scale = 1.0f, Fp8Meta* fp8_meta = nullptr) {
#if LLMC_HAS_BULK_COPY
    static_assert(BUFS == 1 || BUFS == 2, "one row buffer (two blocks a SM) or two (one block a SM)");
    constexpr Fp8Format FP8 = OUT == ClassifierOut::E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;  // where OUT is FP8
    extern __shared__ __align__(16) unsigned char classifier_smem[];  // (BUFS, Vp) floatX
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
        fp8_meta->scale_inv = 1.0f / fp8_scale;
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
        const int b = BUFS == 2 ? i & 1 : 0;
        // the other buffer held row i - 1, done by every thread (the barrier at the end of the loop)
        if (BUFS == 2 && threadIdx.x == 0 && row + (int)gridDim.x < N) load_row(row + gridDim.x, b ^ 1);
        mbar_wait(bar(b), BUFS == 2 ? (i >> 1) & 1 : i & 1);  // buffer b's (i / BUFS)-th load
        const floatX* x = buf + (size_t)b * Vp;
        const int target = targets[row];
        float row_max, inv_sum;
        classifier_row_stats_as_shipped(losses + row, &row_max, &inv_sum, x, target, V);
        if (write_dlogits) {
            for (int c = threadIdx.x * x128::size; c < Vp; c += blockDim.x * x128::size) {
                x128 v = load128(x + c);
                for (int k = 0; k < x128::size; k++) {
                    const int col = c + k;
                    float g = 0.0f;
                    if (col < V) g = dloss * (expf(to_float(v[k]) - row_max) * inv_sum - (col == target ? 1.0f : 0.0f));
                    v[k] = from_float<floatX>(g);
                }
                if constexpr (OUT == ClassifierOut::FLOATX) store128(logits + (int64_t)row * Vp + c, v);
                else
                    *reinterpret_cast<Fp8Pack*>(out8 + row * out8_pitch + c) =
                        classifier_fp8_pack<FP8>(v, fp8_scale);
            }
        }
        __syncthreads();  // buffer b is refilled at the next iteration (BUFS 2), or now (BUFS 1)
        if (BUFS == 1 && threadIdx.x == 0 && row + (int)gridDim.x < N) load_row(row + gridDim.x, 0);
    }
#else
    __trap();
#endif
}

// Shared memory of fused_classifier_rows_in_smem, and whether it fits this device (its code here
// compiled for sm_90 or newer, and the opt-in limit per block, 227 KB on the H200, less the kernel's
// own few hundred bytes).
static size_t rows_in_smem_bytes(int Vp, int bufs = 2) { return bufs * (size_t)Vp * sizeof(floatX); }
static bool rows_in_smem_fit(int Vp, int bufs = 2) {
    int dev = 0, bytes = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return kernel_code_arch(fused_classifier_rows_in_smem<ClassifierOut::FLOATX>) >= 90 &&
           rows_in_smem_bytes(Vp, bufs) + 1024 <= (size_t)bytes;
}
// N rows, the gradient as floatX in place, or (out8) as FP8 at scale in place (pitch 2 Vp bytes).
template <ClassifierOut OUT, int BUFS = 2>
static void rows_in_smem_launch(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                                bool write_dlogits, float scale, Fp8Meta* meta, cudaStream_t stream) {
    auto kernel = fused_classifier_rows_in_smem<OUT, BUFS>;
    const size_t smem = rows_in_smem_bytes(Vp, BUFS);
    static size_t smem_set = 0;  // the opt-in, raised once to the largest row seen
    if (smem > smem_set) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set = smem;
    }
    static const int sms = current_sm_count();
    kernel<<<std::min(N, sms * (BUFS == 1 ? 2 : 1)), CLASSIFIER_BLOCK, smem, stream>>>(
        logits, losses, targets, dloss, N, V, Vp, write_dlogits, reinterpret_cast<uint8_t*>(logits),
        (int64_t)Vp * sizeof(floatX), scale, meta);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------- FP8 variant 3: bf16 rounding by integer ops
// Variant 2's kernel with the bf16 rounding of the gradient done on the integer pipe (round to nearest
// even on the float's bits: add 0x7FFF plus the kept part's lowest bit, clear the low 16 bits; exact
// for every finite value, denormals included, as cvt.rn.bf16.f32) instead of cvt.rn.bf16x2.f32: three
// ALU operations a value in place of half a conversion and the unpacking, if the conversion pipe that
// expf's ex2 shares is what bounds pass 2.
__device__ inline float bf16_round_bits(float g) {
    const unsigned u = __float_as_uint(g);
    return __uint_as_float((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
}
template <Fp8Format F>
static __global__ void __launch_bounds__(CLASSIFIER_BLOCK, sm_blocks(CLASSIFIER_BLOCK, 2))
    fused_classifier_fp8_int_round(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp,
                                   float fp8_scale, Fp8Meta* fp8_meta) {
    extern __shared__ x128 classifier_held[];
    const int held_packs = ceil_div(Vp / 2, x128::size);
    floatX* x = logits + (int64_t)blockIdx.x * Vp;
    uint8_t* out = reinterpret_cast<uint8_t*>(x);
    const int target = targets[blockIdx.x];
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        fp8_meta->scale = fp8_scale;
        fp8_meta->scale_inv = 1.0f / fp8_scale;
    }
    float row_max, inv_sum;
    classifier_row_stats(losses + blockIdx.x, &row_max, &inv_sum, x, target, V, classifier_held, held_packs);
    for (int c = threadIdx.x * x128::size; c < Vp; c += blockDim.x * x128::size) {
        const int p = c / x128::size;
        const x128 v = p < held_packs ? (c < V ? classifier_held[p] : x128::constant(from_float<floatX>(0.0f)))
                                      : load128(x + c);
        float g[x128::size];
        classifier_grad_values(g, v, c, target, row_max, inv_sum, dloss, V);
#if !defined(PRECISION_FP32)
        for (int k = 0; k < x128::size; k++) g[k] = bf16_round_bits(g[k]);
#endif
        Fp8Pack o;
        for (int k = 0; k < x128::size; k += 2)
            o.h[k / 2] = fp8x2_from_float2<F>(g[k] * fp8_scale, g[k + 1] * fp8_scale);
        *reinterpret_cast<Fp8Pack*>(out + c) = o;
    }
}
// Variants 2, 3 and 4 (4: variant 2's kernel with pass 1's loads two packs at a time): a block-per-row FP8
// kernel with its shared memory opted in once per kernel, one block a row.
template <auto KERNEL>
static void fp8_block_per_row_launch(floatX* logits, float* losses, const int* targets, float dloss, int N, int V,
                                     int Vp, float scale, Fp8Meta* meta, cudaStream_t stream) {
    const size_t smem = classifier_fp8_smem_bytes(Vp);
    static size_t smem_set = 0;
    if (smem > smem_set) {
        cudaCheck(cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set = smem;
    }
    KERNEL<<<N, CLASSIFIER_BLOCK, smem, stream>>>(logits, losses, targets, dloss, V, Vp, scale, meta);
    cudaCheckLaunch();
}

// Bytes [lo, hi) of each of `rows` rows of pitch bytes where a and b differ.
static size_t count_diff_bytes(const void* a, const void* b, int rows, int64_t pitch, int lo, int hi) {
    return (size_t)lab::diff_bytes(a, b, rows, pitch, lo, hi).count;
}

// ---------------------------------------------------------------- fused_classifier (floatX gradient)
static void run_shape(lab::Lab& L, int N, int V, int Vp) {
    const std::string shape = lab::Lab::strprintf(" N=%d V=%d Vp=%d", N, V, Vp);
    const size_t NV = (size_t)N * Vp;
    const float dloss = 1.0f / N;  // mean over the batch, no accumulation
    lab::DevBuf<floatX> d_logits0(NV, "logits0"), d_logits(NV, "dlogits");
    lab::DevBuf<float> d_losses(N, "losses");
    lab::DevBuf<int> d_targets(N, "targets");
    d_logits0.fill_uniform(61, -5.0f, 5.0f);  // (N, Vp); the padded columns hold junk too: it must be ignored
    const std::vector<int> targets = lab::rand_ints(N, 62, V);
    d_targets.upload(targets);

    const std::vector<int> rows = lab::sample_rows(N, SAMPLES, 63);
    const int k = (int)rows.size();
    std::vector<int> row_targets(k);
    for (int i = 0; i < k; i++) row_targets[i] = targets[rows[i]];
    const std::vector<float> logits_rows = d_logits0.download_rows(rows, Vp);
    std::vector<float> probs((size_t)k * Vp), ref_losses(k), ref_dlogits((size_t)k * Vp);
    cpu::softmax_crossentropy_forward(probs.data(), ref_losses.data(), logits_rows.data(), row_targets.data(), 1, k, V,
                                      Vp);
    // the reference divides by its own row count k; scaling by k * dloss gives dloss per row
    cpu::crossentropy_softmax_backward(ref_dlogits.data(), probs.data(), row_targets.data(), 1, k, V, Vp, k * dloss);

    auto reset = [&] {
        cudaCheck(cudaMemcpyAsync(d_logits, d_logits0, NV * sizeof(floatX), cudaMemcpyDeviceToDevice, L.stream()));
        d_losses.poison(L.stream());
    };
    // fp32 losses from the same bf16 logits: only the order of the sums differs
    const lab::Tol loss_tol = {1e-4, 1e-4};
    // Every row's loss, besides the sampled rows' against the CPU: the shipped kernel's losses over all
    // N rows (its loss-only run, checked against the CPU below), as a GPU reference for the others
    reset();
    fused_classifier(d_logits, d_losses, d_targets, dloss, N, V, Vp, false, L.stream());
    const std::vector<float> all_losses = d_losses.download();
    auto check_losses = [&] {
        bool ok = L.check(d_losses, ref_losses, loss_tol, rows, 1);
        return L.compare("all losses", d_losses.download(), all_losses, lab::Tol{1e-5, 1e-6}) && ok;
    };
    const double bytes = 2.0 * NV * sizeof(floatX) + 8.0 * N, flops = 6.0 * N * V;
    const std::string op = "fused_classifier" + shape;
    // variant 1 only where two rows fit in shared memory (sm_90, bf16 up to Vp ~ 58K)
    const int variants = rows_in_smem_fit(Vp) ? 2 : 1;
    auto launch_into = [&](int variant, floatX* logits, float* losses, bool write_dlogits) {
        if (variant == 0) fused_classifier(logits, losses, d_targets, dloss, N, V, Vp, write_dlogits, L.stream());
        else rows_in_smem_launch<ClassifierOut::FLOATX>(logits, losses, d_targets, dloss, N, V, Vp, write_dlogits,
                                                         1.0f, nullptr, L.stream());
    };
    auto launch = [&](int variant, bool write_dlogits) { launch_into(variant, d_logits, d_losses, write_dlogits); };
    // variant 1 (the per-value code as it shipped until 2026-12-04) once, for a byte comparison of the
    // whole gradient and every loss with variant 0's
    std::unique_ptr<lab::DevBuf<floatX>> d_old;
    std::vector<float> old_losses;
    if (variants == 2) {
        d_old = std::make_unique<lab::DevBuf<floatX>>(NV, "rows in smem's");
        lab::DevBuf<float> d_old_losses(N, "losses");
        cudaCheck(cudaMemcpy(d_old->get(), d_logits0, NV * sizeof(floatX), cudaMemcpyDeviceToDevice));
        launch_into(1, d_old->get(), d_old_losses, true);
        cudaCheck(cudaStreamSynchronize(L.stream()));
        old_losses = d_old_losses.download();
    }
    auto check = [&](int variant) {
        bool ok = check_losses();
        ok = L.check(d_logits, ref_dlogits, lab::default_tol(), rows, Vp) && ok;
        if (d_old && variant != 1) {
            const size_t diff = count_diff_bytes(d_logits, d_old->get(), N, (int64_t)Vp * sizeof(floatX), 0,
                                                 Vp * (int)sizeof(floatX));
            const std::vector<float> losses = d_losses.download();
            size_t bits = 0;
            for (int i = 0; i < N; i++) bits += memcmp(&losses[i], &old_losses[i], sizeof(float)) != 0;
            printf("    bytes vs rows in smem, variant %d: %s (%zu of %zu gradient bytes differ, %zu of %d losses' "
                   "bits)\n", variant, diff == 0 && bits == 0 ? "equal" : "DIFFER", diff, NV * sizeof(floatX), bits, N);
        }
        return ok;
    };
    const char* names[] = {"shipped (block per row)", "rows in smem"};
    if (variants < 2 && L.selected(1))
        printf("  %s | 1 %s: skipped, two rows of %zu bytes do not fit in this device's shared memory\n", op.c_str(),
               names[1], rows_in_smem_bytes(Vp) / 2);
    for (int variant = 0; variant < variants; variant++)
        L.run(op, variant, names[variant], bytes, flops, lab::Bound::Memory, reset, [&] { launch(variant, true); },
              [&] { return check(variant); });
    // validation: losses only, the logits must stay as they were
    const std::vector<float> logits_as_read = logits_rows;
    for (int variant = 0; variant < variants; variant++)
        L.run("fused_classifier(loss only)" + shape, variant, names[variant], (double)N * V * sizeof(floatX) + 8.0 * N,
              4.0 * N * V, lab::Bound::Memory, reset, [&] { launch(variant, false); },
              [&] {
                  const bool ok = check_losses();
                  return L.check(d_logits, logits_as_read, lab::Tol{0, 0}, rows, Vp) && ok;
              });
}

// ---------------------------------------------------------------- fused_classifier_fp8 (FP8 gradient)
// Logits at a trained model's scale, on the device (3.3G values; element i from a hash of (seed, i)):
// normal-ish (a sum of four uniforms) with sd 2, and about one in 16K raised by 10 .. 16.
static __global__ void fill_logits_kernel(floatX* x, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (seed + i) * 0x9E3779B97F4A7C15ull;  // splitmix64's finalizer
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
        h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
        h ^= h >> 31;
        float u = 0.0f;
        for (int k = 0; k < 4; k++) u += (float)((h >> (12 * k)) & 0xFFF) * (1.0f / 4096.0f);
        float v = (u - 2.0f) * (2.0f / 0.57735f);
        if (((h >> 48) & 0x3FFF) == 0) v += 10.0f + (float)((h >> 62) & 3) * 2.0f;
        x[i] = from_float<floatX>(v);
    }
}
// FP8 codes one step apart or equal (sign-magnitude: +0 and -0 are both next to the smallest subnormals)
static bool fp8_adjacent(uint8_t a, uint8_t b) {
    auto ordered = [](uint8_t x) { return (x & 0x80) ? -(int)(x & 0x7F) : (int)(x & 0x7F); };
    return std::abs(ordered(a) - ordered(b)) <= 1;
}

static void run_fp8(lab::Lab& L, int N, int V, int Vp, Fp8Format format, uint64_t seed) {
    const cpu::Fp8Format cf = fp8_cpu_format(format);
    const std::string shape = lab::Lab::strprintf(" %s N=%d V=%d Vp=%d", fp8_format_name(format), N, V, Vp);
    const size_t NV = (size_t)N * Vp;
    const int64_t pitch = (int64_t)Vp * sizeof(floatX);
    const float dloss = 1.0f / (3.0f * N);  // not a power of two: the scale rounds down to one
    const float scale = cpu::fp8_pow2_scale(dloss, cf);
    lab::DevBuf<floatX> d_logits0(NV, "logits0"), d_logits(NV, "fp8 dlogits"), d_old(NV, "rows in smem's");
    lab::DevBuf<float> d_losses(N, "losses"), d_losses_bf16(N, "bf16 losses");
    lab::DevBuf<int> d_targets(N, "targets");
    lab::DevBuf<Fp8Meta> d_meta(1, "meta");
    fill_logits_kernel<<<1024, 256>>>(d_logits0, NV, seed);  // the padded columns hold junk too
    cudaCheckLaunch();
    const std::vector<int> targets = lab::rand_ints(N, seed + 1, V);
    d_targets.upload(targets);

    // the CPU reference of the sampled rows: losses and the gradient in double, rounded to floatX,
    // then cpu::fp8_cast at the scale
    const std::vector<int> rows = lab::sample_rows(N, SAMPLES, seed + 2);
    const int k = (int)rows.size();
    const std::vector<float> logits_rows = d_logits0.download_rows(rows, Vp);
    std::vector<float> ref_losses(k);
    std::vector<uint8_t> ref_bytes((size_t)k * Vp);
    for (int i = 0; i < k; i++) {
        const float* l = &logits_rows[(size_t)i * Vp];
        const int t = targets[rows[i]];
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++) mx = std::max(mx, (double)l[v]);
        for (int v = 0; v < V; v++) sum += std::exp(l[v] - mx);
        ref_losses[i] = (float)(std::log(sum) + mx - l[t]);
        for (int v = 0; v < Vp; v++) {
            const double g = v < V ? dloss * (std::exp(l[v] - mx) / sum - (v == t ? 1.0 : 0.0)) : 0.0;
            ref_bytes[(size_t)i * Vp + v] = cpu::fp8_cast(to_float(from_float<floatX>((float)g)), scale, cf);
        }
    }
    // the bf16 classifier's losses (same reduction order: must be equal bit for bit)
    cudaCheck(cudaMemcpy(d_logits, d_logits0, NV * sizeof(floatX), cudaMemcpyDeviceToDevice));
    fused_classifier(d_logits, d_losses_bf16, d_targets, dloss, N, V, Vp, false, L.stream());
    cudaCheck(cudaStreamSynchronize(L.stream()));
    const std::vector<float> bf16_losses = d_losses_bf16.download();

    // variant 1, once, for the byte comparison (where it runs: two rows in shared memory)
    const bool old_runs = rows_in_smem_fit(Vp);
    // every variant in both formats: F is E4M3 or E5M2, O the matching ClassifierOut
    auto launch_f = [&](auto f, int variant, floatX* logits, float* losses) {
        constexpr Fp8Format F = decltype(f)::value;
        constexpr ClassifierOut O = F == Fp8Format::E4M3 ? ClassifierOut::E4M3 : ClassifierOut::E5M2;
        cudaStream_t st = L.stream();
        switch (variant) {
        case 0: fused_classifier_fp8(logits, losses, d_targets, dloss, N, V, Vp, F, d_meta, L.ctx); break;
        case 1: rows_in_smem_launch<O>(logits, losses, d_targets, dloss, N, V, Vp, true, scale, d_meta, st); break;
        case 2:
            fp8_block_per_row_launch<fused_classifier_fp8_block_per_row<F>>(logits, losses, d_targets, dloss, N, V, Vp,
                                                                            scale, d_meta, st);
            break;
        case 3:
            fp8_block_per_row_launch<fused_classifier_fp8_int_round<F>>(logits, losses, d_targets, dloss, N, V, Vp, scale,
                                                                        d_meta, st);
            break;
        default:
            fp8_block_per_row_launch<fused_classifier_fp8_block_per_row<F, 2>>(logits, losses, d_targets, dloss, N, V, Vp,
                                                                               scale, d_meta, st);
        }
    };
    auto launch = [&](int variant, floatX* logits, float* losses) {
        if (format == Fp8Format::E4M3)
            launch_f(std::integral_constant<Fp8Format, Fp8Format::E4M3>{}, variant, logits, losses);
        else launch_f(std::integral_constant<Fp8Format, Fp8Format::E5M2>{}, variant, logits, losses);
    };
    std::vector<float> old_losses;
    if (old_runs) {
        cudaCheck(cudaMemcpy(d_old, d_logits0, NV * sizeof(floatX), cudaMemcpyDeviceToDevice));
        d_losses.poison(L.stream());
        launch(1, d_old, d_losses);
        cudaCheck(cudaStreamSynchronize(L.stream()));
        old_losses = d_losses.download();
    }

    // variant 2 (the block-per-row kernel, the launcher's fallback for wide rows), once: the shipped
    // kernel's FP8 bytes and losses must be its bits exactly
    lab::DevBuf<floatX> d_bpr(NV, "block per row's");
    cudaCheck(cudaMemcpy(d_bpr, d_logits0, NV * sizeof(floatX), cudaMemcpyDeviceToDevice));
    d_losses.poison(L.stream());
    launch(2, d_bpr, d_losses);
    cudaCheck(cudaStreamSynchronize(L.stream()));
    const std::vector<float> bpr_losses = d_losses.download();
    auto reset = [&] {
        cudaCheck(cudaMemcpyAsync(d_logits, d_logits0, NV * sizeof(floatX), cudaMemcpyDeviceToDevice, L.stream()));
        d_losses.poison(L.stream());
        d_meta.poison(L.stream());
    };
    auto count_bits_differ = [](const std::vector<float>& a, const std::vector<float>& b) {
        size_t n = 0;
        for (size_t i = 0; i < a.size(); i++) n += memcmp(&a[i], &b[i], sizeof(float)) != 0;
        return n;
    };
    auto check = [&](int variant) {
        cudaCheck(cudaDeviceSynchronize());
        bool ok = L.check(d_losses, ref_losses, lab::Tol{1e-4, 1e-4}, rows, 1);
        const std::vector<float> losses = d_losses.download();
        // the shipped kernel shares pass 1 with the bf16 classifier: its losses must be the same bits
        // (tests/gpu/test_fp8.cu relies on it); the other variants' are only reported
        const size_t loss_bits = count_bits_differ(losses, bf16_losses);
        printf("    %-10s %zu of %d differ from the bf16 classifier's bit for bit  %s\n", "all losses", loss_bits, N,
               loss_bits == 0 ? "ok" : variant == 0 ? "FAIL" : "(reported only)");
        ok &= loss_bits == 0 || variant != 0;
        Fp8Meta m;
        cudaCheck(cudaMemcpy(&m, d_meta.get(), sizeof(m), cudaMemcpyDeviceToHost));
        const bool meta_ok = m.scale == scale && m.scale_inv == 1.0f / scale;
        printf("    %-10s scale %g scale_inv %g (cpu %g)  %s\n", "meta", m.scale, m.scale_inv, scale,
               meta_ok ? "ok" : "FAIL");
        ok &= meta_ok;
        // the sampled rows' FP8 bytes against the CPU
        size_t equal = 0, far = 0;
        std::vector<uint8_t> got(Vp);
        for (int i = 0; i < k; i++) {
            cudaCheck(cudaMemcpy(got.data(), reinterpret_cast<const uint8_t*>(d_logits.get()) + rows[i] * pitch, Vp,
                                 cudaMemcpyDeviceToHost));
            for (int v = 0; v < Vp; v++) {
                const uint8_t want = ref_bytes[(size_t)i * Vp + v];
                equal += got[v] == want;
                if (!fp8_adjacent(got[v], want) || (v >= V && got[v] != 0)) {
                    if (far++ == 0) {
                        printf("    first bad: row %d col %d got 0x%02x want 0x%02x\n", rows[i], v, got[v], want);
                    }
                }
            }
        }
        printf("    %-10s %zu of %zu equal to the CPU's, %zu more than one code away  %s\n", "fp8 bytes", equal,
               ref_bytes.size(), far, far ? "FAIL" : "ok");
        ok &= far == 0;
        // bytes Vp .. 2 Vp of every row untouched, and the guard
        const size_t second = count_diff_bytes(d_logits, d_logits0, N, pitch, Vp, (int)pitch);
        printf("    %-10s %zu bytes of the rows' second halves changed  %s\n", "untouched", second,
               second ? "FAIL" : "ok");
        ok &= second == 0;
        if (!d_logits.guard_intact()) {
            printf("    %-10s FAIL: the kernel wrote into the guard region after the logits\n", "guard");
            ok = false;
        }
        if (old_runs && variant != 1) {
            const size_t bytes = count_diff_bytes(d_logits, d_old, N, pitch, 0, Vp);
            const size_t bits = count_bits_differ(losses, old_losses);
            printf("    bytes vs rows in smem, variant %d: %s (%zu of %zu FP8 bytes differ, %zu of %d losses' bits)\n",
                   variant, bytes == 0 && bits == 0 ? "equal" : "DIFFER", bytes, NV, bits, N);
        }
        if (variant != 2) {
            const size_t bytes = count_diff_bytes(d_logits, d_bpr, N, pitch, 0, Vp);
            const size_t bits = count_bits_differ(losses, bpr_losses);
            const bool same = bytes == 0 && bits == 0;
            printf("    bytes vs block per row, variant %d: %s (%zu of %zu FP8 bytes differ, %zu of %d losses' bits)  %s\n",
                   variant, same ? "equal" : "DIFFER", bytes, NV, bits, N,
                   same ? "ok" : variant == 0 ? "FAIL" : "(reported only)");
            ok &= same || variant != 0;
        }
        return ok;
    };
    const double bytes = 3.0 * NV + 8.0 * N, flops = 6.0 * N * V;
    const std::string op = "fused_classifier_fp8" + shape;
    const char* names[] = {classifier_fp8_rows_fit(Vp, L.ctx) ? "shipped (rows in smem, 1 buffer, 2 blocks/SM)"
                                                       : "shipped (here: its block-per-row fallback)",
                           "rows in smem (until 2026-12-04)", "block per row, half row in smem (the fallback)",
                           "block per row, bf16 rounding by ALU", "block per row, pass 1 loads 2 packs at a time"};
    const bool runs[] = {true, old_runs, true, true, true};
    constexpr int VARIANTS = 5;
    std::vector<double> ms(VARIANTS, -1.0);
    for (int variant = 0; variant < VARIANTS; variant++) {
        if (!runs[variant]) {
            if (L.selected(variant))
                printf("  %s | %d %s: skipped, its rows do not fit in this device's shared memory\n", op.c_str(),
                       variant, names[variant]);
            continue;
        }
        // timed on the buffer the check left: the first halves hold FP8 bytes then, not logits (the
        // speed of exp and the conversions does not depend on the values)
        L.run(op, variant, names[variant], bytes, flops, lab::Bound::Memory, reset,
              [&] { launch(variant, d_logits, d_losses); }, [&] { return check(variant); });
        ms[variant] = L.last_ms();
    }
    for (int variant = 1; variant < VARIANTS; variant++)
        if (ms[0] > 0 && ms[variant] > 0)
            printf("  %s: shipped %.4f ms, %d %s %.4f ms: shipped %.3fx faster\n", op.c_str(), ms[0], variant,
                   names[variant], ms[variant], ms[variant] / ms[0]);
}

int main(int argc, char** argv) {
    // --fp8 e4m3|e5m2|both: only the FP8 classifier, in those formats (taken out before the harness's
    // own arguments); without it, every op
    std::vector<Fp8Format> fp8 = {Fp8Format::E4M3, Fp8Format::E5M2};
    bool fp8_only = false;
    std::vector<char*> args = {argv[0]};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--fp8") != 0) {
            args.push_back(argv[i]);
            continue;
        }
        const char* f = i + 1 < argc ? argv[++i] : "";
        fp8_only = true;
        if (!strcmp(f, "e4m3")) fp8 = {Fp8Format::E4M3};
        else if (!strcmp(f, "e5m2")) fp8 = {Fp8Format::E5M2};
        else if (strcmp(f, "both") != 0) fail("fused_classifier.cu: --fp8 takes e4m3, e5m2 or both, not '%s'", f);
    }
    lab::Lab L((int)args.size(), args.data(), "fused_classifier.cu");
    if (!fp8_only) {
        run_shape(L, lab::GPT2_B * lab::GPT2_T, lab::GPT2_V, lab::GPT2_VP);
        run_shape(L, lab::ODD_B * lab::ODD_T, 1003, 1008);
    }
    for (Fp8Format f : fp8) {
        const uint64_t seed = f == Fp8Format::E4M3 ? 71 : 91;
        run_fp8(L, lab::GPT2_B * lab::GPT2_T, lab::GPT2_V, lab::GPT2_VP, f, seed);
        run_fp8(L, lab::ODD_B * lab::ODD_T, 1003, 1008, f, seed + 10);
    }
    return L.finish();
}
