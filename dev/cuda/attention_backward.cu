// attention_backward.cu: the attention backward lab (causal, GQA, sliding window).
// O and lse come from the shipped forward (attention_forward.cu checks it); dout and qkv are fresh
// random values. Each variant starts from a poisoned dqkv (it is written with `=`), is checked
// against the CPU reference (llmc/cpu/attention.h) on the first sequences of the batch, dQ, dK and
// dV each against their own scale, then timed by the shared harness.
//   0  shipped attention_backward with a scratch buffer (the trainer's default, dQ by fp32
//      reductions, not bit-reproducible): the Hopper kernel (llmc/attention_hopper_backward.cuh,
//      HopperBwdShipped) in sm_90a builds, the single pass of 7 elsewhere; the FP32 build's simple
//      kernels
//   1  shipped attention_backward without scratch (deterministic: the mma.sync pair in the bf16
//      build, the simple kernels in the FP32 build); runs twice more and must give bitwise-identical
//      dqkv
//   2  attention_backward_simple: scalar fp32, a dQ pass and a dK/dV pass
//   3  naive: one thread a query (dQ) or key (dK/dV), operands from global memory, no smem, fp32
//      math (dev/cuda/attention_naive.cuh); T <= 1024 only
//   4  mma.sync kernels capped at 168 registers (3 blocks/SM; spills at HD 128)     (bf16 only)
//   5  mma.sync kernels, no register cap                                            (bf16 only)
//   6  mma.sync kernels with 8 warps (128 resident rows a block)                    (bf16 only)
//   7  single pass, dQ by fp32 reductions into a scratch buffer (backward_flash_atomic with the
//      shipped AtomicBwdCfg; not bit-reproducible in dQ)                            (bf16 only)
//   8  single pass, 64 keys x 64 queries, per-warp skip                             (bf16 only)
//   9  single pass, HD 64: 2 m16 key tiles a warp (128 x 32); HD 128: 64 x 32; skip (bf16 only)
//   10 as 9 without the per-warp skip                                               (bf16 only)
//   Hopper configurations (HopperBwd's named fields; bf16, sm_90a builds), dQ by TMA reductions:
//   11 query tiles of 64, lockstep (the two consumer warpgroups meet at one barrier a tile)
//   12 HD 64: query tiles of 128 (dQ split by rows), lockstep; HD 128: as 11
//   13 late dQ (dQ of tile n after tile n + 1's dV/dK): HD 64 with query tiles of 128 (the shipped
//      HD 64 kernel), HD 128 with 64
//   14 late dQ, query tiles of 64 (HD 128: as 13)
//   15 cuDNN (dev/cuda/cudnn_attention.cuh)                                   (bf16 with USE_CUDNN=1)
//   16 the shipped Hopper kernel as it was before the split schedule and skip_masked (HD 64: 13's
//      kernel, HD 128: 11's), held to whole items (one CTA a 128-key tile, dK and dV summed over the
//      GQA group in registers)
//   17 the Hopper kernel held to whole items, HD 128 with skip_masked (a warpgroup skips the tiles its
//      64 keys cannot see; not shipped: +2% with a window, -3% at T 4096 without), HD 64 as 16; 0
//      differs from 16 only where the items are fewer than the SMs (odd; small, small-w, small-3 on --small)
// A second op, attention_fwd+bwd, times forward then backward (0, 1, 7 and 15), the figure
// docs/h200.md quotes for cuDNN and PyTorch.
// Document-masked shapes (attention_common.cuh's DOC_SHAPES, --small: DOC_SMALL_SHAPES): 0 and 1 are the
// shipped DOC path (0: the Hopper DOC kernel in sm_90a builds on an sm_90 GPU, elsewhere the
// deterministic pair, which takes no scratch; 1: the deterministic pair), 2, 3, 4..6 and the Hopper
// kernels (11..17, whole items) take the mask, the single pass (7..10) takes none and skips, 15 is cuDNN
// on the documents as packed ragged sequences reading our lse through its padded stats; 0 and 15 (and
// fwd+bwd's) print their time over the one-document twin's.
// FLOPs: the forward's (4 * HD per visible pair, 2*B*NH*T^2*HD causal) times 2.5 for the backward
// (5 matmuls to the forward's 2: the convention; the two-kernel path does 7, the single pass 5),
// times 3.5 for forward + backward. Bytes: qkv, out, dout, lse read once, dqkv written once (the
// passes with scratch also move it: ~12 bytes per dQ element; not counted).
//
// Build: make -C dev/cuda [USE_CUDNN=1 CUDNN_FRONTEND_PATH=$PWD/build/cudnn_frontend/include]
// Run:   dev/cuda/build/attention_backward [variant ...] [--check-only] [--reps N] [--small] [--shape NAME]
//        --small: only three tiny awkward shapes (for compute-sanitizer --tool racecheck);
//        --shape NAME: only that shape (gpt2, long, ...: attention_common.cuh).
//
// Latest tables (one H200, 2026-12-02, bf16, TFLOP/s = 2.5x the forward's FLOPs, median; every variant
// passed its checks; columns in this file's numbering, the runs' own numbers in docs/perf.md's history).
// Hopper, `--reps 10`, one process (12 was then the shipped HD 64 kernel); racecheck on --small: 0
// hazards; memcheck 0 errors:
//   shape     11 BQ64  12 BQ128  13 late  14 late BQ64  15 cuDNN  13/12  13/15
//   gpt2      188.0    221.5     233.0    210.4         244.3     1.05   0.95
//   gqa       202.2    243.7     265.8    232.6         228.3     1.09   1.16
//   long      411.3    411.4     417.4    418.7         473.8     1.01   0.88
//   window    159.7    159.7     159.0    158.9         191.0     1.00   0.83
//   odd        50.0     50.3      53.0     52.7         105.7     1.05   0.50
//   odd-w      25.0     27.1      27.4     26.9          28.7     1.01   0.95
// Variant 0 since (commit 7e71c02): gpt2 233.6, gqa 266.3, long 409.7 vs cuDNN 244.7 / 229.6 / 468.9.
// The split schedule (variant 0 at odd and the --small shapes; 16 is the kernel without it): odd had
// 42 work items for 132 SMs, the first key tile's CTA 39 query tiles, the last's 3 (about 6x the
// mean load of an SM on the critical path); split, 132 CTAs of at most 8 tiles. Not yet timed on the
// H200: dev/bench/attention_backward.sh prints 0 beside 16 at every shape. The split kernel is a
// compile-time flag, so the whole-item kernel's registers are unchanged (split: HD 64 36 / 44 bytes of
// spill stores / loads, HD 128 none).
// At HD 128, 11 and 12 are one kernel, and 13 and 14 another: their spread is the noise.
// mma.sync, `--reps 20` (fwd+bwd: the shipped forward then the backward); variant 1 bitwise identical
// run against run on all shapes:
//   shape (B NH/NKV T HD W)       1 det  7      8 64x64  9      10     15 cuDNN | fwd+bwd: 1   15
//   gpt2  64 12/12 1024  64       165.1  177.1  153.4    154.7  177.1  244.2    | 181.0  262.9
//   gqa   64 12/4  1024  64       162.2  173.0  148.7    148.0  173.0  229.9    | 178.0  252.2
//   long  16 16/16 4096 128       169.1  187.4  187.4    180.9  181.6  458.5    | 190.4  480.0
//   window 16 16/16 4096 128 256  116.8  124.8  124.8    122.7  118.6  190.9    | 131.2  214.5
//   odd    3  6/2   777 128        34.9   33.9   33.9     32.7   34.3  104.6    |  43.2  116.7
//   odd-w  5  4/4  1000  64 100    36.6   27.8   34.0     27.3   27.8   27.7    |  36.8   29.4
// Earlier: 2 simple 10.4 / 8.0 / 6.3 at gpt2 / long / window; 6 (8 warps) 127.3 at gpt2, 167.3 at long.
// Errors: dq, dk, dv nmse 4.9e-6..5.7e-6 for every tensor-core variant and cuDNN, 2.7e-6 for the
// fp32-math simple kernels. odd-w (T 1000, W 100) is launch- and prologue-bound: the deterministic
// pair (1) wins there.
//
// Dropped designs (the code is in git at 416785a; figures TFLOP/s, side by side in their run):
//   Hopper dQ by red.global.add.v2.f32 from registers: BQ 64 gpt2 194.0 vs 187.8 by TMA, long 338.3
//     vs 410.2; BQ 128 gpt2 207.6 vs 221.1 by TMA
//   Hopper dQ issued under the next tile's softmax (before its dV/dK): gpt2 209.4 vs 210.4 (14), and
//     264..580 bytes of spills with serialised wgmma at BQ 128 or HD 128
//   Hopper dQ split by keys (no barrier, twice the reductions): gpt2 184.1 vs 192.9, long 250.9 vs 311.5
//   Hopper K/V double-buffered across items: gpt2 207.6 vs 208.3, long 337.1 vs 336.7 (red.add then)
//   Hopper red.add.v4 (a shuffle to pair columns): gpt2 205.9 vs 207.6
//   Hopper 3 query-tile stages: gpt2 197.0 vs 197.8, long 292.3 vs 292.4
//   Hopper S^T, dP^T of the next tile issued before this tile's dQ (FA3's intra-warpgroup overlap): a
//     wgmma in flight across the back edge serialises every wgmma (C7514): gpt2 169.6 vs 192.9
//   Hopper producer at 24 registers with BQ 64 and lockstep: its loop spills (40 / 232 costs nothing)
//   Hopper late dQ at HD 128 (variant 13/14's HD 128 kernel): long 417.4 vs 411.4, within noise, and
//     60 bytes of spills: HD 128 ships the lockstep
//   mma.sync 8-warp blocks: -12%; the 168-register cap at HD 128: spills, -14% (145 vs 169); uncapped at
//     HD 64: 144 vs 166
//   single pass with 8 warps (128 x 64): gpt2 133.5; 64 x 32 capped at 168 registers 150.9; 64 x 64
//     uncapped 142.7
//   a per-warp skip of invisible tiles in the deterministic pair: 139.5 vs 165
#include "attention_common.cuh"
#include "attention_naive.cuh"

// Splits the first `rows` token rows of a dqkv-shaped (rows, (NH + 2*NKV) * HD) array into dQ, dK, dV.
static void split_dqkv(const std::vector<float>& a, size_t rows, int NH, int NKV, int HD, std::vector<float> parts[3]) {
    const size_t row = (size_t)(NH + 2 * NKV) * HD, widths[3] = {(size_t)NH * HD, (size_t)NKV * HD, (size_t)NKV * HD};
    for (int p = 0; p < 3; p++) parts[p].clear();
    for (size_t r = 0; r < rows; r++) {
        size_t col = 0;
        for (int p = 0; p < 3; p++) {
            parts[p].insert(parts[p].end(), a.begin() + r * row + col, a.begin() + r * row + col + widths[p]);
            col += widths[p];
        }
    }
}

static int determinism_failures = 0;  // checks outside the harness's variants (exit status)

#if defined(LLMC_SM90A) && !defined(PRECISION_FP32)
namespace lab_configs {
// HopperBwd configurations (named fields: see llmc/attention_hopper_backward.cuh)
template <int HD, int Q_TILE, bool LATE_DQ, bool SKIP_MASKED = false>
struct Bwd {
    static constexpr int head_dim = HD, q_tile = Q_TILE, stages = 2;
    static constexpr bool late_dq = LATE_DQ, skip_masked = SKIP_MASKED;
};
}  // namespace lab_configs
#endif

static void run_shape(lab::Lab& lab, const Shape& shape, uint64_t seed) {
    const DocMask dm(shape);  // doc_start on the device for a document-masked shape
    Shape s = shape;
    s.a = dm.a;
    const AttnShape& a = s.a;
    const bool doc = s.docs != 0;  // variants without a document mask (single pass, Hopper) skip such shapes
    const CudaContext& ctx = lab.ctx;
    const int B = a.B, T = a.T, NH = a.NH, NKV = a.NKV, HD = a.HD, W = a.window, RB = s.ref_batches;
    const size_t row = (size_t)(NH + 2 * NKV) * HD;
    const size_t n_qkv = (size_t)B * T * row, n_out = (size_t)B * T * NH * HD, n_lse = (size_t)B * NH * T;
    const std::vector<float> qkv_h = lab::rand_uniform(n_qkv, seed, -2.0f, 2.0f);  // score std 4/3
    const std::vector<float> dout_h = lab::rand_uniform(n_out, seed ^ 0xD0D0D0D0ull);
    cudaStream_t st = lab.stream();
    lab::DevBuf<floatX> qkv(n_qkv, "qkv"), dout(n_out, "dout"), out(n_out, "out"), dqkv(n_qkv, "dqkv");
    lab::DevBuf<float> lse(n_lse, "lse");
    qkv.upload(qkv_h);
    dout.upload(dout_h);
    attention_forward(out, lse, qkv, a, ctx);
    cudaCheck(cudaStreamSynchronize(st));

    // Reference from the very O and lse the kernels read.
    const std::vector<float> out_h = out.download(0, (size_t)RB * T * NH * HD), lse_h = lse.download(0, (size_t)RB * NH * T);
    std::vector<float> dqkv_ref((size_t)RB * T * row), ref_parts[3];
    cpu::attention_backward(dqkv_ref.data(), dout_h.data(), qkv_h.data(), out_h.data(), lse_h.data(), RB, T, NH, NKV,
                            HD, W, doc ? dm.host.data() : nullptr);
    split_dqkv(dqkv_ref, (size_t)RB * T, NH, NKV, HD, ref_parts);

    auto reset = [&] { dqkv.poison(st); };
    auto check = [&] {
        cudaCheck(cudaDeviceSynchronize());
        bool ok = true;
        if (size_t n = dqkv.count_unwritten()) {
            printf("    dqkv       FAIL: %zu of %zu elements never written\n", n, dqkv.size());
            ok = false;
        }
        if (!dqkv.guard_intact()) {
            printf("    dqkv       FAIL: the kernel wrote into the guard region after the output\n");
            ok = false;
        }
        std::vector<float> got_parts[3];
        split_dqkv(dqkv.download(0, (size_t)RB * T * row), (size_t)RB * T, NH, NKV, HD, got_parts);
        const char* names[3] = {"dq", "dk", "dv"};
        for (int p = 0; p < 3; p++) ok &= compare_attention(lab, names[p], got_parts[p], ref_parts[p]);
        return ok;
    };
    const double fwd_flops = 4.0 * HD * NH * visible_pairs(s, dm.host);
    const double bytes = (double)(2 * n_qkv + 2 * n_out) * sizeof(floatX) + n_lse * sizeof(float);
    const std::string op = shape_row("attention_backward", s), op2 = shape_row("attention_fwd+bwd", s);
    auto variant = [&](int v, const char* what, const std::function<void()>& launch) {
        lab.run(op, v, what, bytes, 2.5 * fwd_flops, lab::Bound::Compute, reset, launch, check);
    };

    // the size that lets the Hopper kernel split small shapes (a larger buffer than the other variants need)
    const size_t scratch_n = attention_backward_scratch_floats_split(a, ctx);
    lab::DevBuf<float> scratch(scratch_n, "scratch");
    const AttnScratch with_scratch{scratch, scratch_n};
    variant(0, "shipped, dQ by reductions (scratch)", [&] { attention_backward(dqkv, dout, qkv, out, lse, a, ctx, with_scratch); });
    twin_ratio(lab, "attention_backward", 0, s);
    variant(1, "shipped, deterministic", [&] { attention_backward(dqkv, dout, qkv, out, lse, a, ctx); });
    if (lab.selected(1)) {  // the deterministic path must be bit-reproducible: two runs, every byte of dqkv
        std::vector<float> first;
        for (int run = 0; run < 2; run++) {
            dqkv.poison(st);
            attention_backward(dqkv, dout, qkv, out, lse, a, ctx);
            cudaCheckLaunch();
            std::vector<float> got = dqkv.download();
            if (run == 0) first = std::move(got);
            else if (memcmp(first.data(), got.data(), got.size() * sizeof(float)) != 0) {
                printf("FAIL determinism: two runs of variant 1 differ\n");
                determinism_failures++;
            } else printf("    determinism: two runs of variant 1 give bitwise-identical dqkv\n");
        }
    }
    variant(2, "simple fp32", [&] { attention_backward_simple(dqkv, dout, qkv, out, lse, a, ctx); });
    if (T <= 1024) variant(3, "naive", [&] { attention_backward_naive(dqkv, dout, qkv, out, lse, a, ctx); });
#if !defined(PRECISION_FP32)
    using namespace attention_detail;
    // the mma.sync pair (dQ; dK/dV), one configuration for both kernels, by HD
    auto pair = [&](int v, const char* what, auto cfg64, auto cfg128) {
        variant(v, what, [&] {
            using C64 = decltype(cfg64);
            using C128 = decltype(cfg128);
            if (HD == 64) backward_flash<C64, C64>(dqkv, dout, qkv, out, lse, a, ctx);
            else backward_flash<C128, C128>(dqkv, dout, qkv, out, lse, a, ctx);
        });
    };
    pair(4, "mma, 168 registers", FlashCfg<64, 4, 64, 3>{}, FlashCfg<128, 4, 32, 3>{});
    pair(5, "mma, no register cap", FlashCfg<64, 4, 64, 1>{}, FlashCfg<128, 4, 32, 1>{});
    pair(6, "mma, 8 warps", FlashCfg<64, 8, 64, 1>{}, FlashCfg<128, 8, 32, 1>{});
    // single pass, dQ by fp32 reductions (not bit-reproducible): configurations by HD
    auto single_pass = [&](auto cfg64, auto cfg128) {
        if (HD == 64) backward_flash_atomic<decltype(cfg64)>(dqkv, scratch, dout, qkv, out, lse, a, ctx);
        else backward_flash_atomic<decltype(cfg128)>(dqkv, scratch, dout, qkv, out, lse, a, ctx);
    };
    auto atomic = [&](int v, const char* what, auto cfg64, auto cfg128) {
        if (!doc) variant(v, what, [&] { single_pass(cfg64, cfg128); });
    };
    atomic(7, "single pass (AtomicBwdCfg)", AtomicBwdCfg<64>{}, AtomicBwdCfg<128>{});
    atomic(8, "single pass, 64 keys x 64 queries", AtomicCfg<64, 4, 1, 64, 3>{}, AtomicCfg<128, 4, 1, 64, 2>{});
    atomic(9, "single pass, 2 m16 tiles a warp (HD 64) / 64 x 32 (HD 128)", AtomicCfg<64, 4, 2, 32, 2>{},
           AtomicCfg<128, 4, 1, 32, 2>{});
    atomic(10, "single pass as 9, no per-warp skip", AtomicCfg<64, 4, 2, 32, 2, false>{},
           AtomicCfg<128, 4, 1, 32, 2, false>{});
#if defined(LLMC_SM90A)
    // Hopper configurations by HD, on whole items (the scratch's size is not passed: no split schedule)
    auto hopper = [&](int v, const char* what, auto cfg64, auto cfg128) {
        // a fat build on another GPU; a document-masked shape the wgmma backward does not take
        if (!attention_hopper_available(ctx) || !attention_hopper_backward_takes(a)) return;
        variant(v, what, [&] {
            using namespace attention_hopper_detail;
            if (HD == 64) backward_hopper<decltype(cfg64)>(dqkv, scratch, dout, qkv, out, lse, a, ctx);
            else backward_hopper<decltype(cfg128)>(dqkv, scratch, dout, qkv, out, lse, a, ctx);
        });
    };
    using lab_configs::Bwd;
    hopper(11, "Hopper, BQ 64, lockstep", Bwd<64, 64, false>{}, Bwd<128, 64, false>{});
    hopper(12, "Hopper, HD 64: BQ 128, lockstep (HD 128: as 11)", Bwd<64, 128, false>{}, Bwd<128, 64, false>{});
    hopper(13, "Hopper, late dQ: HD 64 BQ 128 (shipped), HD 128 BQ 64", Bwd<64, 128, true>{}, Bwd<128, 64, true>{});
    hopper(14, "Hopper, late dQ, BQ 64 (HD 128: as 13)", Bwd<64, 64, true>{}, Bwd<128, 64, true>{});
    // the shipped kernel before the split schedule and the skip (HD 64: 13's kernel; HD 128: 11's), then
    // the shipped kernel held to whole items, HD 128 with skip_masked
    hopper(16, "Hopper, as shipped before the split schedule and the skip", Bwd<64, 128, true>{}, Bwd<128, 64, false>{});
    hopper(17, "Hopper, HD 128 with skip_masked, whole items only", attention_hopper_detail::HopperBwdShipped<64>{},
           Bwd<128, 64, false, true>{});
#endif
#endif
#if defined(USE_CUDNN)
    // document-masked: the documents as packed sequences, reading our lse through cuDNN's padded stats
    std::unique_ptr<CudnnDocs> docs;
    std::unique_ptr<lab::DevBuf<float>> stats;
    if (doc) {
        docs = std::make_unique<CudnnDocs>(dm.host, a);
        stats = std::make_unique<lab::DevBuf<float>>(docs->stats_size(a), "stats");
        std::vector<float> stats_h(stats->size(), 0.0f);
        docs->scatter_stats(stats_h, lse.download(), a);
        stats->upload(stats_h);
    }
    auto cudnn_runs = [&](bool backward) {
        return doc ? cudnn_attention_docs_supported(backward, a, *docs) : cudnn_attention_supported(backward, a);
    };
    auto cudnn_backward = [&](const floatX* o, const float* l) {
        if (doc) cudnn_attention_backward_docs(dqkv, dout, qkv, o, l, a, *docs, ctx);
        else cudnn_attention_backward(dqkv, dout, qkv, o, l, a, ctx);
    };
    const bool cudnn = lab.selected(15) && cudnn_runs(false) && cudnn_runs(true);
    if (cudnn) {
        variant(15, doc ? "cuDNN, documents as sequences" : "cuDNN", [&] { cudnn_backward(out, doc ? *stats : lse); });
        twin_ratio(lab, "attention_backward", 15, s);
    }
#endif

    // forward + backward, as training runs them
    auto fwd_bwd = [&](int v, const char* what, const std::function<void()>& backward) {
        lab.run(op2, v, what, bytes, 3.5 * fwd_flops, lab::Bound::Compute, reset, [&] {
            attention_forward(out, lse, qkv, a, ctx);
            backward();
        }, check);
    };
    fwd_bwd(0, "shipped, dQ by reductions", [&] { attention_backward(dqkv, dout, qkv, out, lse, a, ctx, with_scratch); });
    twin_ratio(lab, "attention_fwd+bwd", 0, s);
    fwd_bwd(1, "shipped, deterministic", [&] { attention_backward(dqkv, dout, qkv, out, lse, a, ctx); });
#if !defined(PRECISION_FP32)
    if (!doc) fwd_bwd(7, "single pass", [&] { single_pass(AtomicBwdCfg<64>{}, AtomicBwdCfg<128>{}); });
#endif
#if defined(USE_CUDNN)
    if (cudnn) {
        // cuDNN's own O and lse go to separate buffers, so the reference above stays the one for ours
        lab::DevBuf<floatX> out2(n_out, "out2");
        lab::DevBuf<float> lse2(doc ? docs->stats_size(a) : n_lse, "lse2");
        lab.run(op2, 15, doc ? "cuDNN, documents as sequences" : "cuDNN", bytes, 3.5 * fwd_flops, lab::Bound::Compute,
                reset, [&] {
                    if (doc) cudnn_attention_forward_docs(out2, lse2, qkv, a, *docs, ctx);
                    else cudnn_attention_forward(out2, lse2, qkv, a, ctx);
                    cudnn_backward(out2, lse2);
                }, check);
        twin_ratio(lab, "attention_fwd+bwd", 15, s);
    }
#endif
}

int main(int argc, char** argv) {
    const int status = attention_lab_main(argc, argv, "attention_backward.cu", 4321, run_shape, DOC_SHAPES, DOC_SMALL_SHAPES);
    if (determinism_failures) printf("# %d determinism check(s) failed\n", determinism_failures);
    return status || determinism_failures ? 1 : 0;
}
