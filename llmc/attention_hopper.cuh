// attention_hopper.cuh: the attention forward for Hopper (sm_90a): FlashAttention on wgmma, K/V tiles
// brought in by the TMA copy engine, a producer warp and two or three consumer warpgroups (FA3's
// structure). Same function as attention_forward_flash (llmc/attention.cuh): causal, GQA, optional
// sliding window, HD 64 or 128, any T; bf16 operands, fp32 accumulation and softmax.
//
// Shapes (those of attention.cuh):
//   qkv (B, T, (NH + 2*NKV) * HD)   read through one 3-D TMA tensor map (columns, T, B): rows past T
//                                   of a sequence (and before 0) come in as zeros, so no tile ever
//                                   reads the next one
//   out (B, T, NH * HD)             rows outside 0..T-1 are never stored
//   lse (B, NH, T) fp32             natural-log log-sum-exp of the scaled scores
//
// Tile budget (work item = a BQ-query tile of one head, BQ = 64 x consumer warpgroups, tiles aligned
// to the end of the sequence; one CTA an SM; items in head groups whose K/V fit in 32 MB of L2, each
// group its longest query tiles first, the heads of one GQA group side by side: HopperItem):
//   warps 0-3    producer warpgroup, 24 registers (setmaxnreg.dec): one thread issues every TMA
//   consumers    HD 64: three warpgroups (BQ 192), 160 registers; HD 128: two (BQ 128), 240 registers
//                (setmaxnreg.inc); 64 query rows each, and only the K/V tiles those rows see:
//                S (64 x BKV fp32, BKV/2 registers) = Q K^T by wgmma m64nBKVk16, both from smem;
//                softmax in registers (base 2); O (64 x HD fp32, HD/2 registers) += P V by wgmma
//                m64nHDk16 with P from registers (the S accumulators repacked to bf16 in place of
//                an A fragment) and V from smem through the transposed (MN-major) descriptor.
//                HD 64 at 160: S 64 + O 32 + P 32 registers live across an issue step, no spills.
//   smem         2 x Q (BQ x HD) + STAGES x (K, V) of (BKV x HD), every tile as HD/64 panels of
//                64 columns (128-byte rows, the 128B swizzle that the TMA writes and wgmma reads);
//                mbarriers: full/empty per stage for K and for V (separate, so a K stage is refilled
//                as soon as its S is done), full/empty for each Q buffer. Q is double-buffered so a
//                persistent CTA loads its next query tile while it finishes this one; the output
//                is staged in the warp's own rows of the Q buffer. BKV 128, 2 stages:
//                HD 64: 2 x 24 + 2 x 32 KB = 112 KB; HD 128: 2 x 32 + 2 x 64 KB = 192 KB.
// Schedule as shipped: persistent grid (one CTA an SM striding over the items), FA3's intra-warpgroup
// overlap (S_{n+1} = Q K_{n+1} issued before O += P_n V_n) and ping-pong (the consumer warpgroups
// take turns, round robin, to issue their wgmma, so one's softmax hides under the others' matmuls).
// Measured (H200, dev/cuda/attention_hopper.cu, TFLOP/s, cuDNN 9 side by side in the same run; the
// first version of this kernel in brackets, same run):
//   gpt2 (B 64, NH 12, T 1024, HD 64)        351.9 vs cuDNN 320.9 (1.10x)  [298.7]
//   gqa  (NH 12 / NKV 4, otherwise gpt2)      353.8 vs 320.0 (1.11x)        [317.4]
//   long (B 16, NH 16, T 4096, HD 128)       520.9 vs 549.2 (0.95x)        [456.3]  (noisy: +-7%)
//   window 256 (long's shape)                308.1 vs 305.1 (1.01x)        [278.9]  0.205x the time of long
//   odd (B 3, NH 6/2, T 777, HD 128)         138.0 vs 135.2                [141.6]
//   odd-w (B 5, NH 4, T 1000, HD 64, W 100)   36.2 vs 28.7                 [31.4]  (tiny, launch-bound)
// What each feature bought: wgmma + TMA alone (no overlap, one CTA a query tile) 250 / 428 at gpt2 /
// long against the mma.sync kernel's 235 / 270; the persistent grid with its Q double buffer +30% at
// T 1024 (the per-tile prologue had been exposed); ping-pong +2..7%; head groups +13% at long, +10% at
// the window (before them every query tile of a head read its K/V from HBM again: 132 CTAs on 132
// heads of 2 MB of K/V each); three consumer warpgroups with their own K/V ranges and end-aligned
// tiles +13% at HD 64. The lab file has the variants, the runs and what was tried and dropped.
// Internal part of llmc/attention.cuh, included from there only (it uses QKVLayout, check_attention_sizes,
// the mma helpers and the Hopper building blocks of attention_hopper_common.cuh); include llmc/attention.cuh.
#pragma once

#if defined(LLMC_SM90A)
namespace attention_hopper_detail {
using namespace attention_detail;

// ============================================================================ the kernel
// HD columns; BKV keys a K/V tile; STAGES K/V tiles in flight; OVERLAP: FA3's intra-warpgroup
// pipelining (S of the next tile on the tensor cores during this tile's softmax); PINGPONG: the
// consumer warpgroups take turns (round robin) to issue their wgmma (named barriers), so one's softmax
// runs while another's matmuls do; NWG consumer warpgroups of 64 query rows (BQ = 64 NWG); PERWG:
// each warpgroup computes only the K/V tiles its own 64 rows see (causal diagonal, window edge),
// the producer loads the union of them; HINTS: L2 eviction priorities on the loads and stores (K/V
// tiles, read again by the other query tiles of their head, evict last; Q and out evict first);
// Q_REGS: Q K^T with Q from registers (loaded once an item by ldmatrix), so the S wgmma reads only K
// from smem.
template <int HD_, int BKV_, int STAGES_, bool OVERLAP_, bool PINGPONG_, int NWG_ = 2, bool PERWG_ = false,
          bool HINTS_ = false, bool Q_REGS_ = false>
struct HopperCfg {
    static constexpr int HD = HD_, NWG = NWG_, BQ = 64 * NWG, BKV = BKV_, STAGES = STAGES_, THREADS = 128 * (NWG + 1);
    static constexpr bool OVERLAP = OVERLAP_, PINGPONG = PINGPONG_, PERWG = PERWG_;
    static constexpr bool HINTS = HINTS_, Q_REGS = Q_REGS_;
    // registers a thread after setmaxnreg: the producer gives its share to the consumers
    static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = NWG == 2 ? 240 : 160;
    static constexpr int Q_BYTES = BQ * HD * 2, KV_BYTES = BKV * HD * 2;
    static constexpr int BARS = 2 * Q_BYTES + 2 * STAGES * KV_BYTES;  // byte offset of the mbarriers
    static constexpr int SMEM = 1024 + BARS + (4 * STAGES + 4) * 8;  // + slack to align the base to 1024
    static_assert(HD == 64 || HD == 128, "HD 64 or 128: whole 64-column panels");
    static_assert(BKV == 64 || BKV == 128, "BKV is the n of the S wgmma");
    static_assert(NWG == 2 || NWG == 3, "2 or 3 consumer warpgroups");
    static_assert(NWG == 2 || HD == 64, "3 consumer warpgroups (160 registers) hold O and S only at HD 64");
    static_assert((PRODUCER_REGS + NWG * CONSUMER_REGS) * 128 <= 65536, "the SM's register file");
    static_assert(OVERLAP || !PINGPONG, "ping-pong is scheduled on the overlapped loop's issue steps");
    static_assert(OVERLAP || !PERWG, "per-warpgroup ranges are scheduled on the overlapped loop");
    static_assert(SMEM <= 227 * 1024, "one CTA's smem");
};

// L2 eviction priorities (the HINTS option; new primitives, kept here rather than in
// attention_hopper_common.cuh): a createpolicy cache policy, a TMA box load and a 16-byte store that
// carry one.
__device__ __forceinline__ uint64_t l2_evict_last() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
__device__ __forceinline__ uint64_t l2_evict_first() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
__device__ __forceinline__ void tma_load_hint(uint32_t dst, const CUtensorMap* map, int col, int row, int seq,
                                              uint32_t bar, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
        "l"(map), "r"(col), "r"(row), "r"(seq), "r"(bar), "l"(policy)
        : "memory");
}
// tma_tile (attention_hopper_common.cuh) with a cache policy, or without one when HINTS is false.
template <int R, int HD, bool HINTS>
__device__ __forceinline__ void tma_tile_policy(uint32_t dst, const CUtensorMap* map, int col, int t0, int b,
                                                uint32_t bar, uint64_t policy) {
    if constexpr (!HINTS) tma_tile<R, HD>(dst, map, col, t0, b, bar);
    else
#pragma unroll
        for (int p = 0; p < HD / 64; p++)
#pragma unroll
            for (int rb = 0; rb < R / 64; rb++)
                tma_load_hint(dst + (p * R + rb * 64) * 128, map, col + p * 64, t0 + rb * 64, b, bar, policy);
}
template <bool HINTS>
__device__ __forceinline__ void store16(void* dst, int4 v, uint64_t policy) {
    if constexpr (!HINTS) *reinterpret_cast<int4*>(dst) = v;
    else
        asm volatile("st.global.L2::cache_hint.v4.b32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(dst), "r"(v.x), "r"(v.y),
                     "r"(v.z), "r"(v.w), "l"(policy)
                     : "memory");
}


// Online softmax of one S tile for a thread's two rows (g and g + 8 of its warp): on return s holds
// exp2(s * sl2 - max), l the updated sums, corr the factor the old O must be scaled by.
template <int BKV>
__device__ __forceinline__ void online_softmax(float (&s)[BKV / 2], float (&m)[2], float (&l)[2], float (&corr)[2],
                                               float sl2) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = m[r];
#pragma unroll
        for (int nb = 0; nb < BKV / 8; nb++) mx = fmaxf(mx, fmaxf(s[nb * 4 + 2 * r], s[nb * 4 + 2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -INFINITY ? 0.0f : mx * sl2;  // a row with nothing visible yet stays 0
        corr[r] = exp2f(m[r] * sl2 - base);
        m[r] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int nb = 0; nb < BKV / 8; nb++) {
            s[nb * 4 + 2 * r] = exp2f(fmaf(s[nb * 4 + 2 * r], sl2, -base));
            s[nb * 4 + 2 * r + 1] = exp2f(fmaf(s[nb * 4 + 2 * r + 1], sl2, -base));
            sum += s[nb * 4 + 2 * r] + s[nb * 4 + 2 * r + 1];
        }
        l[r] = l[r] * corr[r] + sum;
    }
}
template <int HD>
__device__ __forceinline__ void scale_o(float (&o)[HD / 2], const float (&corr)[2]) {
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++) o[nd * 4 + 0] *= corr[0], o[nd * 4 + 1] *= corr[0], o[nd * 4 + 2] *= corr[1],
                                        o[nd * 4 + 3] *= corr[1];
}
// Work item i (one BQ-query tile of one head). Query tiles are aligned to the end of the sequence:
// tile k holds the rows [T - (k+1) BQ, T - k BQ), so where BQ does not divide T the partial tile is the
// first (the shortest item), its rows below 0 read as zeros by the TMA and never stored (aligned to the
// start, the partial tile was the longest: at T 1024 and BQ 192, 8 K/V tiles for one busy warpgroup of
// three). (head, sequence) pairs hb = b * NH + h are taken in groups of `group` (the heads of a GQA
// group adjacent); a group's items are its longest query tiles first, its heads side by side. The
// CTAs running at one time then share the K/V of a group's heads in L2: the launcher sizes a group so
// that its K/V fit there (with every head of the batch in one group, as in the first version, each
// tile's K/V came from HBM again at T 4096).
struct HopperItem {
    int h, b, q0;
    __device__ HopperItem(int i, int NH, int B, int T, int n_qtiles, int BQ, int group) {
        const int g0 = i / (group * n_qtiles) * group, size = min(group, NH * B - g0), r = i - g0 * n_qtiles;
        const int hb = g0 + r % size;
        h = hb % NH, b = hb / NH, q0 = T - (r / size + 1) * BQ;
    }
};

// grid: one CTA per work item, or fewer CTAs that stride over them (persistent); THREADS threads,
// Cfg::SMEM bytes of dynamic smem. Q is double-buffered so a CTA's next item loads during this one.
// FLOPs 4 * HD per visible (query, key) pair (plus the masked parts of diagonal tiles); bytes: K/V
// re-read by every query tile of a head, from L2 when the item order keeps a head group's K/V there:
// compute-bound.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    attention_forward_wgmma(bf16* out, float* lse, const __grid_constant__ CUtensorMap map, int B, int T, QKVLayout L,
                            int window, int group) {
    constexpr int HD = Cfg::HD, BQ = Cfg::BQ, BKV = Cfg::BKV, STAGES = Cfg::STAGES, NWG = Cfg::NWG;
    constexpr int CWARPS = 4 * NWG;  // consumer warps: one arrival each on the empty barriers
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
    const uint32_t sK = base + 2 * Cfg::Q_BYTES, sV = sK + STAGES * Cfg::KV_BYTES, bars = base + Cfg::BARS;
    auto s_q = [&](int qb) { return base + qb * Cfg::Q_BYTES; };
    auto full_k = [&](int s) { return bars + 8 * s; };
    auto full_v = [&](int s) { return bars + 8 * (STAGES + s); };
    auto empty_k = [&](int s) { return bars + 8 * (2 * STAGES + s); };
    auto empty_v = [&](int s) { return bars + 8 * (3 * STAGES + s); };
    auto q_full = [&](int qb) { return bars + 8 * (4 * STAGES + qb); };
    auto q_empty = [&](int qb) { return bars + 8 * (4 * STAGES + 2 + qb); };

    const int n_qtiles = ceil_div(T, BQ), n_items = L.NH * B * n_qtiles;
    // K/V tiles seen by the query rows [r0, r1] (r1 < T): the first, and the count
    auto kv_range = [&](int r0, int r1, int& kv_first) {
        kv_first = window > 0 ? max(0, r0 - window + 1) / BKV : 0;
        return r1 / BKV - kv_first + 1;
    };
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full_k(s), 1), mbar_init(full_v(s), 1);
            mbar_init(empty_k(s), CWARPS), mbar_init(empty_v(s), CWARPS);
        }
        for (int qb = 0; qb < 2; qb++) mbar_init(q_full(qb), 1), mbar_init(q_empty(qb), CWARPS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp < 4) {  // ------------------------------------------------ producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Cfg::PRODUCER_REGS));
        if (threadIdx.x == 0) {
            const uint64_t keep = Cfg::HINTS ? l2_evict_last() : 0, once = Cfg::HINTS ? l2_evict_first() : 0;
            int it = 0, j = 0;  // K/V tiles and items so far: ring stage and phase
            for (int i = blockIdx.x; i < n_items; i += gridDim.x, j++) {
                const HopperItem w(i, L.NH, B, T, n_qtiles, BQ, group);
                const int kvh = w.h / (L.NH / L.NKV), qb = j & 1;
                mbar_wait(q_empty(qb), ((j >> 1) & 1) ^ 1);
                mbar_expect_tx(q_full(qb), Cfg::Q_BYTES);
                tma_tile_policy<BQ, HD, Cfg::HINTS>(s_q(qb), &map, L.q_col(w.h), w.q0, w.b, q_full(qb), once);
                int kv_first;
                const int n_tiles = kv_range(max(w.q0, 0), w.q0 + BQ - 1, kv_first);
                for (int n = 0; n < n_tiles; n++, it++) {
                    const int s = it % STAGES, kv0 = (kv_first + n) * BKV;
                    const uint32_t free_parity = ((it / STAGES) & 1) ^ 1;
                    mbar_wait(empty_k(s), free_parity);
                    mbar_expect_tx(full_k(s), Cfg::KV_BYTES);
                    tma_tile_policy<BKV, HD, Cfg::HINTS>(sK + s * Cfg::KV_BYTES, &map, L.k_col(kvh), kv0, w.b,
                                                         full_k(s), keep);
                    mbar_wait(empty_v(s), free_parity);
                    mbar_expect_tx(full_v(s), Cfg::KV_BYTES);
                    tma_tile_policy<BKV, HD, Cfg::HINTS>(sV + s * Cfg::KV_BYTES, &map, L.v_col(kvh), kv0, w.b,
                                                         full_v(s), keep);
                }
            }
        }
        return;
    }
    // ------------------------------------------------------------------ consumer warpgroups
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Cfg::CONSUMER_REGS));
    // warpgroup index through a shuffle from lane 0: provably warp-uniform to the compiler (a branch
    // it thinks divergent around wgmma makes ptxas serialise them, warning C7520)
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0) - 1, w = warp % 4, g = lane >> 2, t4 = lane & 3;
    const int wrow = wg * 64 + w * 16;  // this warp's first row in the tile; the thread has wrow + g (+ 8)
    const float sl2 = rsqrtf((float)HD) * LOG2E;  // scores -> base-2 exponent
    uint8_t* smem_gen = smem_raw + (base - raw);    // generic pointer to `base`
    const uint64_t out_policy = Cfg::HINTS ? l2_evict_first() : 0;

    // Ping-pong turns, round robin over the warpgroups (named barrier 1 + wg is warpgroup wg's turn):
    // the last warpgroup lets warpgroup 0 go first; every issue step is "wait for my turn, issue, hand
    // the turn to the next". The very last hand-over of the last warpgroup is skipped so that the
    // arrivals on each barrier match its syncs.
    if (Cfg::PINGPONG && wg == NWG - 1) named_arrive(1);
    auto turn_begin = [&] {
        if constexpr (Cfg::PINGPONG) named_sync(1 + wg);
    };
    auto turn_end = [&](bool very_last) {
        if constexpr (Cfg::PINGPONG)
            if (!(very_last && wg == NWG - 1)) named_arrive(1 + (wg + 1) % NWG);
    };

    int it = 0, j = 0;
    for (int i = blockIdx.x; i < n_items; i += gridDim.x, j++) {
        const HopperItem item(i, L.NH, B, T, n_qtiles, BQ, group);
        const int q0 = item.q0, h = item.h, b = item.b, qb = j & 1, row0 = q0 + wrow + g;
        const bool last_item = i + (int)gridDim.x >= n_items;
        int kv_first;
        const int n_tiles = kv_range(max(q0, 0), q0 + BQ - 1, kv_first);
        // this warpgroup's own tiles [a, z] of the item's 0..n_tiles-1 (PERWG; none if its rows are all
        // below 0, in the partial tile)
        int a = 0, z = n_tiles - 1;
        if constexpr (Cfg::PERWG) {
            const int r0 = q0 + wg * 64;
            if (r0 + 63 < 0) a = n_tiles, z = n_tiles - 1;
            else {
                int first;
                const int cnt = kv_range(max(r0, 0), r0 + 63, first);
                a = first - kv_first, z = a + cnt - 1;
            }
        }
        const uint32_t sQ = s_q(qb);

        // Q_REGS: this warp's 16 rows of Q as HD/16 A fragments (ldmatrix.x4 from the swizzled panels:
        // matrices rows 0-7 / 8-15 x columns 0-7 / 8-15 of each 16-column step).
        uint32_t qf[Cfg::Q_REGS ? HD / 16 : 1][4];
        auto load_q = [&] {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                const int r = wrow + (lane & 15), c = kk * 16 + (lane >> 4) * 8;
                const uint8_t* src = smem_gen + qb * Cfg::Q_BYTES + panel_offset<BQ>(r, c);
                ldmatrix_x4(qf[kk], reinterpret_cast<const bf16*>(src));
            }
        };
        // S = Q K^T for ring stage s: HD/16 wgmma k-steps, 32 bytes apart inside a panel.
        auto issue_qk = [&](float (&sacc)[BKV / 2], int s) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                const uint32_t koff = (kk % 4) * 32;
                const uint64_t db = smem_desc(sK + s * Cfg::KV_BYTES + (kk / 4) * BKV * 128 + koff, 16, 1024);
                if constexpr (Cfg::Q_REGS) {
                    wgmma_rs<BKV, 0>(sacc, qf[Cfg::Q_REGS ? kk : 0], db, kk > 0);
                } else {
                    const uint64_t da = smem_desc(sQ + (kk / 4) * BQ * 128 + wg * 64 * 128 + koff, 16, 1024);
                    wgmma_ss<BKV>(sacc, da, db, kk > 0);
                }
            }
        };
        // O += P V for stage s: BKV/16 k-steps of 16 keys (2 KB apart); V's panels BKV * 128 bytes apart.
        auto issue_pv = [&](float (&o)[HD / 2], const uint32_t (&p)[BKV / 16][4], int s) {
#pragma unroll
            for (int kk = 0; kk < BKV / 16; kk++)
                wgmma_rs<HD>(o, p[kk], smem_desc(sV + s * Cfg::KV_BYTES + kk * 16 * 128, BKV * 128, 1024));
        };
        // Masks the scores of keys this thread's rows may not see; only tiles crossing the diagonal or
        // the window's edge for this warp's 16 rows have any.
        auto mask = [&](float (&sacc)[BKV / 2], int n) {
            const int kv0 = (kv_first + n) * BKV, first = q0 + wrow, last = first + 15;
            if (kv0 + BKV - 1 > first || (window > 0 && last - kv0 >= window)) {
#pragma unroll
                for (int nb = 0; nb < BKV / 8; nb++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (!attends(row0 + 8 * (e >> 1), kv0 + nb * 8 + 2 * t4 + (e & 1), window))
                            sacc[nb * 4 + e] = -INFINITY;
            }
        };

        float o[HD / 2];
#pragma unroll
        for (int k = 0; k < HD / 2; k++) o[k] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2];
        uint32_t p[BKV / 16][4];
        mbar_wait(q_full(qb), (j >> 1) & 1);
        if constexpr (Cfg::Q_REGS) load_q();

        if constexpr (!Cfg::OVERLAP) {
            for (int n = 0; n < n_tiles; n++) {
                const int s = (it + n) % STAGES;
                const uint32_t parity = ((it + n) / STAGES) & 1;
                float sacc[BKV / 2];
                mbar_wait(full_k(s), parity);
                wgmma_fence();
                issue_qk(sacc, s);
                wgmma_commit();
                wgmma_wait<0>();
                fence_regs(sacc);
                if (lane == 0) mbar_arrive(empty_k(s));
                mask(sacc, n);
                online_softmax<BKV>(sacc, m, l, corr, sl2);
                scale_o<HD>(o, corr);
                pack_p<BKV>(p, sacc);
                mbar_wait(full_v(s), parity);
                wgmma_fence();
                issue_pv(o, p, s);
                wgmma_commit();
                wgmma_wait<0>();
                fence_regs(o);
                fence_regs(p);
                if (lane == 0) mbar_arrive(empty_v(s));
            }
        } else {
            // Issue step n (0..n_tiles): S_n = Q K_n (n < n_tiles) and O += P_{n-1} V_{n-1} (n > 0), each
            // only where this warpgroup sees the tile: its steps are none before a, S alone at a, both
            // up to z, P V alone at z + 1, none after (without PERWG a = 0, z = n_tiles - 1). A tile it
            // does not see is still waited for and released: the producer counts every consumer warp.
            // One instantiation per pair of matmuls issued, so no wgmma pipeline stage spans a branch
            // (ptxas would serialise the wgmma) and the main loop has none.
            auto step = [&](auto with_qk, auto with_pv, int n) {
                constexpr bool QK = decltype(with_qk)::value, PV = decltype(with_pv)::value;
                const int s = (it + n) % STAGES, sp = (it + n + STAGES - 1) % STAGES;
                const bool has_k = QK || n < n_tiles, has_v = PV || n > 0;
                if (has_k) mbar_wait(full_k(s), ((it + n) / STAGES) & 1);
                if (has_v) mbar_wait(full_v(sp), ((it + n - 1) / STAGES) & 1);
                float sacc[BKV / 2];
                turn_begin();
                if constexpr (QK || PV) wgmma_fence();
                if constexpr (QK) {
                    issue_qk(sacc, s);
                    wgmma_commit();
                }
                if constexpr (PV) {
                    issue_pv(o, p, sp);
                    wgmma_commit();
                }
                turn_end(last_item && n == n_tiles);
                if constexpr (QK) {
                    if constexpr (PV) wgmma_wait<1>();  // S_n done, P_{n-1} V_{n-1} may still run
                    else wgmma_wait<0>();
                    fence_regs(sacc);
                }
                if (has_k && lane == 0) mbar_arrive(empty_k(s));
                if constexpr (QK) {
                    mask(sacc, n);
                    online_softmax<BKV>(sacc, m, l, corr, sl2);
                }
                if constexpr (PV) {
                    wgmma_wait<0>();
                    fence_regs(o);
                    fence_regs(p);
                }
                if (has_v && lane == 0) mbar_arrive(empty_v(sp));
                if constexpr (QK) {
                    if constexpr (PV) scale_o<HD>(o, corr);  // (on the first tile O is still 0)
                    pack_p<BKV>(p, sacc);
                }
            };
            constexpr std::true_type yes{};
            constexpr std::false_type no{};
            if (a > z) {  // a warpgroup with no rows in this item
                for (int n = 0; n <= n_tiles; n++) step(no, no, n);
            } else {
                for (int n = 0; n < a; n++) step(no, no, n);
                step(yes, no, a);
                for (int n = a + 1; n <= z; n++) step(yes, yes, n);
                step(no, yes, z + 1);
                for (int n = z + 2; n <= n_tiles; n++) step(no, no, n);
            }
        }
        it += n_tiles;

        // Epilogue: lse, normalise, stage this warp's 16 rows in its own rows of the Q buffer (no other
        // warp reads them; every wgmma that read them has completed), 16-byte stores of the rows < T,
        // then hand the buffer back to the producer (after a proxy fence: the TMA refills it). Rows
        // below 0 (the partial tile) are not stored.
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lt = l[r];
            lt += __shfl_xor_sync(0xffffffffu, lt, 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            inv[r] = 1.0f / lt;
            const int row = row0 + 8 * r;
            if (t4 == 0 && row >= 0) lse[((size_t)b * L.NH + h) * T + row] = m[r] * (sl2 / LOG2E) + logf(lt);
        }
        uint8_t* tile = smem_gen + qb * Cfg::Q_BYTES;
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++) {
            const int c = nd * 8 + 2 * t4;
            *reinterpret_cast<uint32_t*>(tile + panel_offset<BQ>(wrow + g, c)) =
                pack_bf16(o[nd * 4 + 0] * inv[0], o[nd * 4 + 1] * inv[0]);
            *reinterpret_cast<uint32_t*>(tile + panel_offset<BQ>(wrow + g + 8, c)) =
                pack_bf16(o[nd * 4 + 2] * inv[1], o[nd * 4 + 3] * inv[1]);
        }
        __syncwarp();
        constexpr int CHUNKS = HD / 8;
#pragma unroll
        for (int k = 0; k < 16 * CHUNKS / WARP_SIZE; k++) {
            const int idx = k * WARP_SIZE + lane, r = wrow + idx / CHUNKS, c = (idx % CHUNKS) * 8, row = q0 + r;
            if (row >= 0)
                store16<Cfg::HINTS>(out + (((size_t)b * T + row) * L.NH + h) * HD + c,
                                    *reinterpret_cast<const int4*>(tile + panel_offset<BQ>(r, c)), out_policy);
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncwarp();
        if (lane == 0) mbar_arrive(q_empty(qb));
    }
}

// (head, sequence) pairs an item group holds (HopperItem) so that their K and V, 4 * T * HD bytes a
// KV head, take at most l2_bytes (0: all of them in one group, the first version's order); whole GQA
// groups, at least one.
inline int hopper_head_group(int B, int T, const QKVLayout& L, size_t l2_bytes) {
    const int per_kv = L.NH / L.NKV, all = L.NH * B;
    if (l2_bytes == 0) return all;
    const size_t kv_bytes = (size_t)4 * T * L.HD;
    const int g = (int)std::max<size_t>(1, l2_bytes / kv_bytes) * per_kv;
    return std::min(g, all);
}

// persistent: min(work items, SMs) CTAs stride over the items; otherwise one CTA per item. l2_bytes:
// the K/V budget of an item group (hopper_head_group).
template <class Cfg>
inline void forward_hopper(bf16* out, float* lse, const bf16* qkv, int B, int T, QKVLayout L, int window,
                           cudaStream_t stream, bool persistent, size_t l2_bytes) {
    static const bool once = (allow_smem(attention_forward_wgmma<Cfg>, Cfg::SMEM), true);
    (void)once;
    const CUtensorMap map = token_rows_map(qkv, B, T, L.row());
    const int items = L.NH * B * ceil_div(T, Cfg::BQ);
    attention_forward_wgmma<Cfg><<<persistent ? std::min(items, sm_count()) : items, Cfg::THREADS, Cfg::SMEM, stream>>>(
        out, lse, map, B, T, L, window, hopper_head_group(B, T, L, l2_bytes));
    cudaCheckLaunch();
}

// The shipped configuration: HD 64: three consumer warpgroups (192 queries), 128 keys a tile, each
// warpgroup its own range; HD 128: two (128 queries), 128 keys; two stages, intra-warpgroup overlap,
// ping-pong; persistent, head groups whose K/V fit in 32 MB of L2.
template <int HD>
using HopperFwdCfg =
    std::conditional_t<HD == 64, HopperCfg<64, 128, 2, true, true, 3, true>, HopperCfg<128, 128, 2, true, true>>;
constexpr bool HOPPER_PERSISTENT = true;
constexpr size_t HOPPER_L2_BYTES = (size_t)32 << 20;
}  // namespace attention_hopper_detail
#endif  // LLMC_SM90A

// FlashAttention forward on wgmma + TMA; bf16, HD 64 or 128, out and qkv 16-byte aligned. Only in
// sm_90a builds (attention_hopper_available()); elsewhere calling it is an error.
inline void attention_forward_hopper(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH,
                                     int NKV, int HD, cudaStream_t stream, int window = 0) {
    using namespace attention_detail;
    check_attention_sizes("attention_forward_hopper", B, T, NH, NKV, HD, window);
#if defined(LLMC_SM90A)
    using namespace attention_hopper_detail;
    if (!aligned16(out) || !aligned16(qkv)) fail("attention_forward_hopper: out and qkv must be 16-byte aligned");
    const QKVLayout L{NH, NKV, HD};
    if (HD == 64)
        forward_hopper<HopperFwdCfg<64>>(out, lse, qkv, B, T, L, window, stream, HOPPER_PERSISTENT, HOPPER_L2_BYTES);
    else forward_hopper<HopperFwdCfg<128>>(out, lse, qkv, B, T, L, window, stream, HOPPER_PERSISTENT, HOPPER_L2_BYTES);
#else
    (void)out, (void)lse, (void)qkv, (void)stream;
    fail("attention_forward_hopper: this build has no sm_90a kernels (GPU_ARCH=90a defines LLMC_SM90A)");
#endif
}
