// attention_hopper.cu: the Hopper (sm_90a) attention forward lab: wgmma + TMA (llmc/attention_hopper.cuh)
// side by side with cuDNN. Every variant runs on fresh random inputs with poisoned outputs and is
// checked against the CPU reference (llmc/cpu/attention.h, fp32, on the first sequences of each batch)
// before it is timed by the shared harness.
//   0  shipped attention_forward (llmc/attention.cuh; sm_90a builds: HopperFwdShipped; the mma.sync
//      kernel, FlashAttention-2 style, is variant 5 of attention_forward.cu)
// The path to it, each a configuration of the shipped kernel (the first shipped version: 2 consumer
// warpgroups, 128 queries a CTA x 128 keys a tile, 2 TMA stages, FA3's intra-warpgroup overlap and
// ping-pong):
//   1  the first shipped version, one CTA per query tile, items in the first order (every head of the
//      batch side by side)
//   2  1 on a persistent grid (one CTA an SM striding over the query tiles, Q double-buffered)
//   3  2 + head groups: the items of a group of heads whose K/V fit in 32 MB of L2 run together
//   4  3 + each warpgroup only its own K/V tiles; HD 64: 3 consumer warpgroups (192 queries, 160
//      registers each): the shipped HD 64 kernel
//   5  4 + HD 64: 3 stages; HD 128: 64 keys a tile (the window's masked tiles halve)
//   6  cuDNN fused attention (dev/cuda/cudnn_attention.cuh)                 (bf16 with USE_CUDNN=1)
// Query tiles are aligned to the end of the sequence (the partial tile is the shortest item). FLOPs:
// 4 * HD per visible (query, key) pair; causal counts half the square, 2*B*NH*T^2*HD (the convention
// of docs/h200.md); a window W counts its visible pairs (~T*W). Bytes: qkv read once, out and lse
// written once.
//
// Then the document-masked shapes (attention_common.cuh's DOC_SHAPES, --small: DOC_SMALL_SHAPES): every
// configuration in its DOC instantiation (forward_hopper picks it from AttnShape::doc_start), TFLOP/s
// over the visible pairs, 0 and 6 also as a time ratio to the one-document twin.
//
// Build: make -C dev/cuda [USE_CUDNN=1] (GPU_ARCH=90a, the default: the wgmma variants need sm_90a)
// Run:   dev/cuda/build/attention_hopper [variant ...] [--check-only] [--reps N] [--small] [--shape NAME]
//        --small: only three tiny awkward shapes (for compute-sanitizer --tool racecheck);
//        --shape NAME: only that shape (gpt2, long, ...: attention_common.cuh).
//
// Latest table: one H200, 2026-12-02, bf16, TFLOP/s (median, L2 flushed), one run, every variant passed
// its checks (out nmse 3.7e-6..4.1e-6, cuDNN alike; lse nmse <= 4.3e-14); racecheck on --small: 0
// hazards. Columns in this file's numbering (the run's own numbers: docs/perf.md's history):
//   shape (B NH/NKV T HD W)        1     2     3     4     5     0 ship  6 cuDNN  0/6
//   gpt2  64 12/12 1024  64      251.2 298.7 308.4 349.0 350.4 351.9   320.9    1.10
//   gqa   64 12/4  1024  64      257.6 317.4 315.2 355.0 354.1 353.8   320.0    1.11
//   long  16 16/16 4096 128      439.9 456.3 517.2 523.5 453.4 520.9   549.2    0.95
//   window 16 16/16 4096 128 256 239.9 278.9 306.8 302.7 298.2 308.1   305.1    1.01
//   odd    3  6/2   777 128      141.8 141.6 138.4 144.9 132.1 138.0   135.2    1.02
//   odd-w  5  4/4  1000  64 100   28.6  31.4  32.5  34.8  35.9  36.2    28.7    1.26
// The long shape is noisy: identical kernels differ by up to 8% within one run.
//
// Dropped designs (same run unless said; the code is in git at 416785a):
//   no overlap (S, softmax, P V one after the other in a warpgroup): gpt2 250.3, long 427.8
//   overlap without ping-pong: gpt2 233.9, long 422.6; persistent without ping-pong: 296.3 / 434.4
//   L2 eviction priorities (K/V evict last, Q and out evict first): gpt2 350.5, long 521.9 (equal
//     to 0; +12% in a second, noisy pass: 589.7 vs 526.6): not promoted on that evidence
//   HD 128 Q from registers (only K read from smem by the S wgmma): long 521.1 (second pass 591.9);
//     with the eviction priorities 523.9 / 532.7: not promoted
//   exponentials on the FMA pipe (FA4's degree-3 polynomial on 1/4 or 3/8 of S): gpt2 331 vs 351
//   releasing V before the softmax (wait for P V first): gpt2 344.6 vs 351.9, long 511 vs 521
//   HD 64 with 2 consumer warpgroups, 64 keys a tile, 3 stages: gpt2 253
//   the issue steps as one loop with run-time branches around the wgmma: ptxas serialised them
//     (C7515), gpt2 293
//   Q from registers with 3 warpgroups at HD 64: does not fit 160 registers (spills), not built
//   64-key tiles per warpgroup for the window: 453 / 298 at long / window (5's HD 128 column)
#include "attention_common.cuh"

#if defined(LLMC_SM90A) && !defined(PRECISION_FP32)
namespace lab_configs {
// HopperFwd configurations (named fields: see llmc/attention_hopper.cuh)
template <int HD, int CONSUMERS, bool OWN_RANGES, int KV_TILE = 128, int STAGES = 2>
struct Fwd {
    static constexpr int head_dim = HD, kv_tile = KV_TILE, stages = STAGES, consumers = CONSUMERS;
    static constexpr bool own_kv_ranges = OWN_RANGES;
};
using First64 = Fwd<64, 2, false>;  // the first shipped version
using First128 = Fwd<128, 2, false>;
using Own64 = Fwd<64, 3, true>;  // 3 consumer warpgroups, own ranges
using Own128 = Fwd<128, 2, true>;
using Stages64 = Fwd<64, 3, true, 128, 3>;
using Keys128 = Fwd<128, 2, true, 64>;
}  // namespace lab_configs
#endif

static void run_shape(lab::Lab& lab, const Shape& shape, uint64_t seed) {
    const DocMask dm(shape);  // doc_start on the device for a document-masked shape
    Shape s = shape;
    s.a = dm.a;
    run_forward_shape(lab, s, seed, 6, [&](auto& variant, lab::DevBuf<floatX>& out, lab::DevBuf<float>& lse,
                                           lab::DevBuf<floatX>& qkv) {
#if defined(LLMC_SM90A) && !defined(PRECISION_FP32)
        using namespace attention_hopper_detail;
        using namespace lab_configs;
        const AttnShape& a = s.a;
        const CudaContext& ctx = lab.ctx;
        // a configuration for each HD, then persistent or one CTA per item, then the L2 budget of a head
        // group (0: one group, the first version's order)
        constexpr size_t MB = 1 << 20;
        auto hopper = [&](int v, const char* what, auto cfg64, auto cfg128, bool persistent, size_t l2) {
            if (!attention_hopper_available(ctx)) return;  // a fat build on another GPU
            variant(v, what, [&] {
                if (a.HD == 64) forward_hopper<decltype(cfg64)>(out, lse, qkv, a, ctx, persistent, l2);
                else forward_hopper<decltype(cfg128)>(out, lse, qkv, a, ctx, persistent, l2);
            });
        };
        hopper(1, "first shipped, one CTA per item", First64{}, First128{}, false, 0);
        hopper(2, "first shipped, persistent", First64{}, First128{}, true, 0);
        hopper(3, "2 + head groups in 32 MB of L2", First64{}, First128{}, true, 32 * MB);
        hopper(4, "3 + own ranges; HD 64: 3 consumer warpgroups", Own64{}, Own128{}, true, 32 * MB);
        hopper(5, "4 + HD 64: 3 stages, HD 128: 64 keys a tile", Stages64{}, Keys128{}, true, 32 * MB);
#else
        (void)lab, (void)variant, (void)out, (void)lse, (void)qkv;
#endif
    });
}

int main(int argc, char** argv) {
    return attention_lab_main(argc, argv, "attention_hopper.cu", 1234, run_shape, DOC_SHAPES, DOC_SMALL_SHAPES);
}
