// attention_hopper.cu: the Hopper (sm_90a) attention forward lab: wgmma + TMA (llmc/attention_hopper.cuh)
// side by side with the shipped mma.sync kernel and cuDNN. Every variant runs on fresh random inputs
// with poisoned outputs and is checked against the CPU reference (llmc/cpu/attention.h, fp32, on the
// first sequences of each batch) before it is timed by the shared harness.
//   0  shipped attention_forward (llmc/attention.cuh): variant 5 since it was promoted (sm_90a
//      builds); the mma.sync kernel (FlashAttention-2 style) is variant 4 of attention_forward.cu
// wgmma variants: 128 queries a CTA (2 consumer warpgroups) x 128 keys a tile, 2 TMA stages:
//   1  no overlap: S, softmax, P V one after the other in each warpgroup; one CTA per query tile
//   2  FA3's intra-warpgroup overlap (S of tile n+1 issued before P V of tile n)
//   3  2 + ping-pong: the two warpgroups take turns to issue their matmuls (named barriers)
//   4  2 + persistent grid (one CTA an SM striding over the query tiles, Q double-buffered)
//   5  2 + ping-pong + persistent: attention_forward_hopper as shipped
//   9  cuDNN fused attention (llmc/cudnn_attention.cuh)                 (bf16 with USE_CUDNN=1)
// FLOPs: 4 * HD per visible (query, key) pair; causal counts half the square, 2*B*NH*T^2*HD (the
// convention of ../shared/H200.md); a window W counts its visible pairs (~T*W). Bytes: qkv read
// once, out and lse written once.
//
// Build: make -C dev/cuda [USE_CUDNN=1] (GPU_ARCH=90a, the default: the wgmma variants need sm_90a)
// Run:   dev/cuda/build/attention_hopper [variant ...] [--check-only] [--reps N] [--small]
//        --small: only two tiny awkward shapes (for compute-sanitizer --tool racecheck).
//
// Measured on one H200, 2026-12-02, bf16, TFLOP/s (median, L2 flushed), one run, every variant passed
// its checks (out nmse 3.8e-6..4.1e-6 like variant 0 and cuDNN; lse ~5e-15); racecheck on --small:
// 0 hazards (variants 1, 5, and the dropped 6, 7):
//   (column 0 was measured before the promotion, when variant 0 was the mma.sync kernel)
//   shape (B NH/NKV T HD W)        0 mma   1      2      3      4      5 ship  9 cuDNN   5 / 9
//   gpt2  64 12/12 1024  64        234.9   250.3  245.1  262.0  319.2  321.6   321.8    1.00
//   gqa   64 12/4  1024  64        235.7   255.2  253.5  271.7  339.5  339.3   322.9    1.05
//   long  16 16/16 4096 128        270.4   427.7  425.4  445.1  443.9  467.3   550.4    0.85
//   window 16 16/16 4096 128 256   190.5   227.8  238.2  243.7  276.1  279.9   303.2    0.92
//   odd    3  6/2   777 128         87.6   133.8  122.6  145.9  123.0  146.4   135.2    1.08
//   odd-w  5  4/4  1000  64 100     33.1    28.5   28.0   29.3   30.8   32.0    26.5    1.21
// (odd has 126 query tiles, fewer than the SMs: 4 and 5 launch exactly as 2 and 3.) An earlier run of
// the same code gave 5 at 317.2 / 459.7 / 337.2 / 279.8 (gpt2 / long / gqa / window), cuDNN 317.5 /
// 550.1 / 322.3 / 303.6: the spread between runs is ~2%.
// Tried and dropped: a "half diagonal tile" (warpgroup 0's S on the diagonal tile as a wgmma n = 64,
// its upper 64 keys being in its rows' future, and half its P V skipped): the branch between wgmma
// shapes cost far more than it saved (gpt2 243 vs 322, long 346 vs 467); with 3 K/V stages (HD 64)
// no better (242). The persistent grid is the largest single gain at T 1024 (2 -> 4: +30%), ping-pong
// at T 4096 (+2..5%); the intra-warpgroup overlap alone loses at HD 64 (1 -> 2: -2%).
#include "attention_common.cuh"
#include "llmc/attention.cuh"
#include "llmc/cpu/attention.h"
#if defined(USE_CUDNN)
#include "llmc/cudnn_attention.cuh"
#endif

static void run_shape(lab::Lab& lab, const Shape& s, uint64_t seed) {
    const int B = s.B, T = s.T, NH = s.NH, NKV = s.NKV, HD = s.HD, W = s.window;
    cudaStream_t st = lab.stream();
    run_forward_shape(lab, s, seed, [&](auto& variant, lab::DevBuf<floatX>& out, lab::DevBuf<float>& lse,
                                        lab::DevBuf<floatX>& qkv) {
        variant(0, "shipped", [&] { attention_forward(out, lse, qkv, B, T, NH, NKV, HD, st, W); });
#if defined(LLMC_SM90A) && !defined(PRECISION_FP32)
        using namespace attention_hopper_detail;
        const QKVLayout L{NH, NKV, HD};
        // HopperCfg<HD, keys a tile, stages, overlap, ping-pong>, then persistent or one CTA per item
        auto hopper = [&](int v, const char* what, auto cfg64, auto cfg128, bool persistent) {
            variant(v, what, [&] {
                if (HD == 64) forward_hopper<decltype(cfg64)>(out, lse, qkv, B, T, L, W, st, persistent);
                else forward_hopper<decltype(cfg128)>(out, lse, qkv, B, T, L, W, st, persistent);
            });
        };
        hopper(1, "wgmma, no overlap", HopperCfg<64, 128, 2, false, false>{}, HopperCfg<128, 128, 2, false, false>{}, false);
        hopper(2, "wgmma, overlap", HopperCfg<64, 128, 2, true, false>{}, HopperCfg<128, 128, 2, true, false>{}, false);
        hopper(3, "wgmma, overlap, ping-pong", HopperCfg<64, 128, 2, true, true>{}, HopperCfg<128, 128, 2, true, true>{},
               false);
        hopper(4, "wgmma, overlap, persistent", HopperCfg<64, 128, 2, true, false>{}, HopperCfg<128, 128, 2, true, false>{},
               true);
        variant(5, "wgmma, overlap, ping-pong, persistent (shipped hopper)",
                [&] { attention_forward_hopper(out, lse, qkv, B, T, NH, NKV, HD, st, W); });
#endif
#if defined(USE_CUDNN)
        if (lab.selected(9) && cudnn_attention_supported(false, B, T, NH, NKV, HD, W))
            variant(9, "cuDNN", [&] { cudnn_attention_forward(out, lse, qkv, B, T, NH, NKV, HD, st, W); });
#endif
    });
}

int main(int argc, char** argv) {
    std::vector<char*> args;
    const bool small = take_small_flag(argc, argv, args);
    lab::Lab lab((int)args.size(), args.data(), "attention_hopper.cu");
    if (!attention_hopper_available()) printf("# built without sm_90a: only variants 0 and 9 run\n");
    uint64_t seed = 1234;
    if (small)
        for (const Shape& s : SMALL_SHAPES) run_shape(lab, s, seed++);
    else
        for (const Shape& s : FULL_SHAPES) run_shape(lab, s, seed++);
    return lab.finish();
}
