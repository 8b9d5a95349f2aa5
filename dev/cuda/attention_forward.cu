// attention_forward.cu: the attention forward lab (causal, GQA, sliding window).
// Every variant runs on fresh random inputs with poisoned outputs, is checked against the CPU
// reference (llmc/cpu/attention.h, fp32, on the first sequences of each batch: the whole batch
// would take the CPU minutes at T = 4096) and then timed by the shared harness.
//   0  shipped attention_forward (llmc/attention.cuh): the wgmma kernel (attention_hopper.cuh; its
//      own lab is attention_hopper.cu) in sm_90a bf16 builds, else the mma.sync kernels in the bf16
//      build, the simple kernel in the FP32 build
//   1  attention_forward_simple: scalar fp32, four threads a query, K/V tiles in smem
//   2  naive: one thread a query, operands from global memory, no smem, fp32 math
//      (dev/cuda/attention_naive.cuh; the first step of naive -> tiled (1) -> tensor cores (3..13)
//      -> Hopper; run only on shapes with T <= 1024: it is slow)
// Tensor-core configurations (FlashCfg<HD, warps, keys a tile, min blocks/SM, m16 tiles a warp>),
// bf16 only. 3..8: the tile kernel (attention_forward_mma: every warp sweeps the block's key tiles):
//   3  4 warps x 16 queries, 64 keys a tile, no register cap
//   4  8 warps x 16 queries (128 a block)
//   5  4 warps x 32 queries (2 m16 tiles a warp share each K/V fragment), 64 keys (HD 128: 32 keys)
//   6  4 warps x 32 queries, 32 keys, 168 registers (3 blocks/SM)                    (HD 64)
//   7  4 warps x 16 queries, 128 keys a tile (HD 128: 32 keys)
//   8  4 warps x 16 queries, 64 keys, 128 registers (4 blocks/SM)                    (HD 64)
// 9..13: the band kernel (attention_forward_mma_band: each warp sweeps only its rows' band of keys,
// skewed so every warp does the same steps; shipped for W > 0 without sm_90a; on causal shapes, W = 0,
// for reference):
//   9  4 warps x 16 queries, 64 keys a tile (3 smem stages)
//   10 4 warps x 32 queries, 64 keys (4 stages) (HD 128: 32 keys, 5 stages; spills 52 bytes)
//   11 4 warps x 16 queries, 32 keys (4 stages)
//   12 4 warps x 32 queries, 32 keys, 168 registers (3 blocks/SM) (HD 128: 8 warps x 16, 64 keys)
//   13 4 warps x 16 queries, 128 keys (3 stages)                                     (HD 64)
//   14 cuDNN fused attention (dev/cuda/cudnn_attention.cuh)                 (bf16 with USE_CUDNN=1)
// FLOPs: 4 * HD per visible (query, key) pair; causal counts half the square, 2*B*NH*T^2*HD (the
// convention of docs/h200.md); a window W counts its visible pairs (~T*W). Bytes: qkv read
// once, out and lse written once.
//
// Build: make -C dev/cuda [USE_CUDNN=1 CUDNN_FRONTEND_PATH=$PWD/build/cudnn_frontend/include]
// Run:   dev/cuda/build/attention_forward [variant ...] [--check-only] [--reps N] [--small] [--shape NAME]
//        --small: only three tiny awkward shapes (for compute-sanitizer --tool racecheck);
//        --shape NAME: only that shape (gpt2, long, ...: attention_common.cuh).
// Shapes: FULL_SHAPES (attention_common.cuh), then WINDOW_SHAPES below (HD 64 windows with their
// full-causal twins, for the window's time ratio), then DOC_SHAPES (document masking, AttnShape::doc_start
// from the lab's token stream; --small adds DOC_SMALL_SHAPES). On those: 0 is the shipped DOC path (the
// wgmma kernel's DOC instantiation in sm_90a builds on an sm_90 GPU, else the mma.sync one's), 1 and
// 2 take the mask, 3..8 run their DOC instantiation, the band kernels (9..13) take no mask and skip, 14
// is cuDNN on the documents as packed ragged sequences (cudnn_attention.cuh); TFLOP/s count visible
// pairs only (a row's sum over its documents of len * (len + 1) / 2), and variants 0 and 14 print their
// time over the one-document twin's (the target: 8 documents a row in <= 0.3x).
//
// Latest tables (one H200, 2026-12-02, bf16, TFLOP/s on visible pairs, median, L2 flushed; every check
// passed; columns in this file's numbering, the runs' own numbers in docs/perf.md's history).
// The progression, after the Hopper kernel's promotion (--reps 10):
//   shape (B NH/NKV T HD W)        2 naive  1 tiled  5 mma   0 Hopper  14 cuDNN
//   gpt2   64 12/12 1024  64        4.7      11.9     234.2   321.3     320.7
//   gqa    64 12/4  1024  64        5.0      12.1     235.4   330.8     320.6
//   long   16 16/16 4096 128        -        12.3     262.3   506.8     631.2
//   window 16 16/16 4096 128 256    -         9.7     154.9   278.2     307.8
//   odd     3  6/2   777 128        0.3       5.0      65.6   146.6     135.8
//   odd-w   5  4/4  1000  64 100    0.3       4.3      29.0    32.9      28.0
//   w-gpt2 64 12/12 1024  64 256    0.6      10.0     152.4   205.2     194.1
//   long64 16 16/16 4096  64        -        13.0     290.3   417.8     477.8
//   w-long64 16 16/16 4096 64 256   -        10.3     157.6   214.4     203.4
// The mma.sync kernels, one run before the promotion (0 was then the tile kernel for W = 0 and the
// band kernel for W > 0):
//   shape (B NH/NKV T HD W)        0      3      5 MT2  9      10     11     12     13     14 cuDNN
//   gpt2   64 12/12 1024  64       234.6  208.1  235.1  184.5  207.3  192.5  207.2  116.6  321.4
//   gqa    64 12/4  1024  64       236.1  208.9  235.8  185.4  208.1  193.3  207.4  116.8  321.1
//   long   16 16/16 4096 128       272.3  272.5  264.1  250.0  249.3  225.6  253.5  -      555.9
//   window 16 16/16 4096 128 256   192.1  186.6  154.9  190.7  181.5  174.7  182.8  -      308.4
//   odd     3  6/2   777 128        88.7   91.0   64.8   86.0   61.6   79.1   83.8  -      137.8
//   odd-w   5  4/4  1000  64 100    34.0   33.2   28.5   35.0   34.3   41.0   32.6   33.0   27.0
//   w-gpt2 64 12/12 1024  64 256   160.4  152.1  153.1  143.2  160.3  158.9  175.0  108.2  194.7
//   long64 16 16/16 4096  64       290.8  244.2  291.6  217.3  253.7  222.0  244.2  215.1  443.9
//   w-long64 16 16/16 4096 64 256  172.7  157.8  157.8  149.7  171.2  165.3  185.3  137.9  203.8
// Errors at gpt2 (out): nmse 3.8e-6 for every tensor-core variant, 3.9e-6 for cuDNN, 2.6e-6 for the
// fp32-math simple kernel (bf16 output rounding alone); lse ~1e-14.
//
// Dropped designs:
//   8-warp blocks: no gain at T 1024, -21% windowed (4: 213.7 at gpt2, 148.4 at the window)
//   two m16 tiles a warp at HD 128: spills, -2%; with 32-key tiles at HD 64 (3 blocks/SM): 213 vs 237
//   per-mma branches on the warp's active steps in the band kernel: 2x slower everywhere (the
//     scheduler cannot overlap mma across them)
// The band kernel gains less than its steps predict (T 4096, W 256: 17 steps a row group instead of
// 20, -15%): HD 128 0.693 ms against the tile kernel's 0.714 (-3%), HD 64 (4 warps x 32 queries, 32
// keys, 3 blocks/SM) 0.359 against 0.422 (-15%; -12.5% at B 64 T 1024). On causal shapes it runs 9%
// (HD 128) to 12% (HD 64) slower a step, and a window block does only 17 steps for a fixed cost (Q and
// two tiles in flight before the first step, 5 barrier rounds, the store).
#include "attention_common.cuh"
#include "attention_naive.cuh"

// Windowed problems at HD 64, each beside its full-causal twin (gpt2 is the twin of w-gpt2), so the
// window's time ratio to full causal is measured in the same run.
const std::vector<Shape> WINDOW_SHAPES = [] {
    std::vector<Shape> v = {
        {"w-gpt2", {64, 1024, 12, 12, 64, 256}, 1},
        {"long64", {16, 4096, 16, 16, 64, 0}, 1},
        {"w-long64", {16, 4096, 16, 16, 64, 256}, 1},
    };
    v.insert(v.end(), DOC_SHAPES.begin(), DOC_SHAPES.end());
    return v;
}();

static void run_shape(lab::Lab& lab, const Shape& shape, uint64_t seed) {
    const DocMask dm(shape);  // doc_start on the device for a document-masked shape
    Shape s = shape;
    s.a = dm.a;
    const AttnShape& a = s.a;
    const CudaContext& ctx = lab.ctx;
    run_forward_shape(lab, s, seed, 14, [&](auto& variant, lab::DevBuf<floatX>& out, lab::DevBuf<float>& lse,
                                            lab::DevBuf<floatX>& qkv) {
        variant(1, "simple fp32", [&] { attention_forward_simple(out, lse, qkv, a, ctx); });
        if (a.T <= 1024) variant(2, "naive", [&] { attention_forward_naive(out, lse, qkv, a, ctx); });
#if !defined(PRECISION_FP32)
        using namespace attention_detail;
        // a configuration for each HD (an HD 64-only variant passes its HD 64 one twice); the DOC
        // instantiation on a document-masked shape
        auto tiles = [&](int v, const char* what, auto cfg64, auto cfg128) {
            using C64 = decltype(cfg64);
            using C128 = decltype(cfg128);
            if (a.HD == 64 || C128::HD == 128)
                variant(v, what, [&] {
                    if (a.doc_start && a.HD == 64) forward_flash_tiles<C64, true>(out, lse, qkv, a, ctx);
                    else if (a.doc_start) forward_flash_tiles<C128, true>(out, lse, qkv, a, ctx);
                    else if (a.HD == 64) forward_flash_tiles<C64>(out, lse, qkv, a, ctx);
                    else forward_flash_tiles<C128>(out, lse, qkv, a, ctx);
                });
        };
        auto band = [&](int v, const char* what, auto cfg64, auto cfg128) {  // no document mask
            if (!a.doc_start && (a.HD == 64 || decltype(cfg128)::HD == 128))
                variant(v, what, [&] {
                    if (a.HD == 64) forward_flash_band<decltype(cfg64)>(out, lse, qkv, a, ctx);
                    else forward_flash_band<decltype(cfg128)>(out, lse, qkv, a, ctx);
                });
        };
        tiles(3, "mma, no register cap", FlashCfg<64, 4, 64, 1>{}, FlashCfg<128, 4, 64, 1>{});
        tiles(4, "mma, 8 warps, 128 queries", FlashCfg<64, 8, 64, 2>{}, FlashCfg<128, 8, 64, 1>{});
        tiles(5, "mma, 32 queries a warp", FlashCfg<64, 4, 64, 1, 2>{}, FlashCfg<128, 4, 32, 1, 2>{});
        tiles(6, "mma, 32 queries a warp, 32 keys, 3 blocks/SM", FlashCfg<64, 4, 32, 3, 2>{}, FlashCfg<64, 4, 32, 3, 2>{});
        tiles(7, "mma, 128 keys a tile (HD 128: 32)", FlashCfg<64, 4, 128, 1>{}, FlashCfg<128, 4, 32, 2>{});
        tiles(8, "mma, 4 blocks/SM", FlashCfg<64, 4, 64, 4>{}, FlashCfg<64, 4, 64, 4>{});
        // The band kernel (sliding windows; also runs causal shapes, W = 0).
        band(9, "band, 4 warps x 16 queries, 64 keys", FlashCfg<64, 4, 64, 1>{}, FlashCfg<128, 4, 64, 1>{});
        band(10, "band, 4 warps x 32 queries, 64 keys (HD 128: 32)", FlashCfg<64, 4, 64, 1, 2>{},
             FlashCfg<128, 4, 32, 1, 2>{});
        band(11, "band, 4 warps x 16 queries, 32 keys", FlashCfg<64, 4, 32, 1>{}, FlashCfg<128, 4, 32, 1>{});
        band(12, "band, 4 warps x 32 queries, 32 keys, 3 blocks/SM (HD 128: 8 warps x 16, 64 keys)",
             FlashCfg<64, 4, 32, 3, 2>{}, FlashCfg<128, 8, 64, 1>{});
        band(13, "band, 4 warps x 16 queries, 128 keys", FlashCfg<64, 4, 128, 1>{}, FlashCfg<64, 4, 128, 1>{});
#endif
    });
}

int main(int argc, char** argv) {
    return attention_lab_main(argc, argv, "attention_forward.cu", 1234, run_shape, WINDOW_SHAPES, DOC_SMALL_SHAPES);
}
