// attention_hopper.cuh: the attention forward for Hopper (sm_90a): FlashAttention on wgmma, K/V tiles
// brought in by the TMA copy engine, a producer warp and two consumer warpgroups (FA3's structure).
// Same function as attention_forward_flash (llmc/attention.cuh): causal, GQA, optional sliding window,
// HD 64 or 128, any T; bf16 operands, fp32 accumulation and softmax.
//
// Shapes (those of attention.cuh):
//   qkv (B, T, (NH + 2*NKV) * HD)   read through one 3-D TMA tensor map (columns, T, B): rows past T
//                                   of a sequence come in as zeros, so no tile ever reads the next one
//   out (B, T, NH * HD)             rows past T are never stored
//   lse (B, NH, T) fp32             natural-log log-sum-exp of the scaled scores
//
// Tile budget (work item = a 128-query tile of one head; items ordered the longest query tiles first,
// the heads of one GQA group side by side so their K/V tiles meet in L2; one CTA an SM):
//   warps 0-3    producer warpgroup, 24 registers (setmaxnreg.dec): one thread issues every TMA
//   warps 4-11   two consumer warpgroups, 240 registers (setmaxnreg.inc), 64 query rows each:
//                S (64 x BKV fp32, BKV/2 registers) = Q K^T by wgmma m64nBKVk16, both from smem;
//                softmax in registers (base 2); O (64 x HD fp32, HD/2 registers) += P V by wgmma
//                m64nHDk16 with P from registers (the S accumulators repacked to bf16 in place of
//                an A fragment) and V from smem through the transposed (MN-major) descriptor.
//   smem         2 x Q (128 x HD) + STAGES x (K, V) of (BKV x HD), every tile as HD/64 panels of
//                64 columns (128-byte rows, the 128B swizzle that the TMA writes and wgmma reads);
//                mbarriers: full/empty per stage for K and for V (separate, so a K stage is refilled
//                as soon as its S is done), full/empty for each Q buffer. Q is double-buffered so a
//                persistent CTA loads its next query tile while it finishes this one; the output
//                is staged in the warp's own rows of the Q buffer. BKV 128, 2 stages:
//                HD 64: 2 x 16 + 2 x 32 KB = 96 KB; HD 128: 2 x 32 + 2 x 64 KB = 192 KB.
// Schedule as shipped: persistent grid (one CTA an SM striding over the query tiles), FA3's
// intra-warpgroup overlap (S_{n+1} = Q K_{n+1} issued before O += P_n V_n) and ping-pong (the two
// consumer warpgroups take turns to issue their wgmma, so one's softmax hides under the other's).
// Measured (H200, dev/cuda/attention_hopper.cu, TFLOP/s, cuDNN 9 side by side in the same run):
//   gpt2 (B 64, NH 12, T 1024, HD 64)   321.6 vs cuDNN 321.8 (1.00x); mma.sync kernel 234.9 (1.37x)
//   gqa  (NH 12 / NKV 4, otherwise gpt2) 339.3 vs 322.9 (1.05x);     mma.sync 235.7
//   long (B 16, NH 16, T 4096, HD 128)  467.3 vs 550.4 (0.85x);      mma.sync 270.4 (1.73x)
//   window 256 (long's shape)           279.9 vs 303.2 (0.92x);      mma.sync 190.5 (1.47x)
//   odd (B 3, NH 6/2, T 777, HD 128)    146.4 vs 135.2;              mma.sync 87.6
//   odd-w (B 5, NH 4, T 1000, HD 64, W 100)  32.0 vs 26.5;           mma.sync 33.1 (tiny, launch-bound)
// What each Hopper feature bought (same run): wgmma + TMA alone (no overlap, one CTA a query tile)
// 250 / 428 at gpt2 / long against mma.sync's 235 / 270; the persistent grid with its Q double
// buffer +30% at T 1024 (the per-tile prologue had been exposed: one CTA an SM); ping-pong +2..7%.
// Internal part of llmc/attention.cuh, included from there only (it uses QKVLayout, check_attention_sizes,
// the mma helpers and the Hopper building blocks of attention_hopper_common.cuh); include llmc/attention.cuh.
#pragma once

#if defined(LLMC_SM90A)
namespace attention_hopper_detail {
using namespace attention_detail;

// ============================================================================ the kernel
// HD columns; BKV keys a K/V tile; STAGES K/V tiles in flight; OVERLAP: FA3's intra-warpgroup
// pipelining (S of the next tile on the tensor cores during this tile's softmax); PINGPONG: the two
// consumer warpgroups take turns to issue their wgmma (named barriers), so one's softmax runs while
// the other's matmuls do.
template <int HD_, int BKV_, int STAGES_, bool OVERLAP_, bool PINGPONG_>
struct HopperCfg {
    static constexpr int HD = HD_, BQ = 128, BKV = BKV_, STAGES = STAGES_, THREADS = 384;
    static constexpr bool OVERLAP = OVERLAP_, PINGPONG = PINGPONG_;
    static constexpr int Q_BYTES = BQ * HD * 2, KV_BYTES = BKV * HD * 2;
    static constexpr int BARS = 2 * Q_BYTES + 2 * STAGES * KV_BYTES;  // byte offset of the mbarriers
    static constexpr int SMEM = 1024 + BARS + (4 * STAGES + 4) * 8;  // + slack to align the base to 1024
    static_assert(HD == 64 || HD == 128, "HD 64 or 128: whole 64-column panels");
    static_assert(BKV == 64 || BKV == 128, "BKV is the n of the S wgmma");
    static_assert(OVERLAP || !PINGPONG, "ping-pong is scheduled on the overlapped loop's issue steps");
    static_assert(SMEM <= 227 * 1024, "one CTA's smem");
};

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
// Work item i (one 128-query tile of one head): the longest tiles (the last queries) first, and in
// each tile rank every (head, sequence) side by side, the heads of a GQA group adjacent (L2 reuse).
struct HopperItem {
    int h, b, q0;
    __device__ HopperItem(int i, int NH, int B, int n_qtiles, int BQ) {
        const int hb = i % (NH * B);
        h = hb % NH, b = hb / NH, q0 = (n_qtiles - 1 - i / (NH * B)) * BQ;
    }
};

// grid: one CTA per work item, or fewer CTAs that stride over them (persistent); THREADS threads,
// Cfg::SMEM bytes of dynamic smem. Q is double-buffered so a CTA's next item loads during this one.
// FLOPs 4 * HD per visible (query, key) pair (plus the masked parts of diagonal tiles); bytes: K/V
// re-read by every query tile of a head, mostly from L2: compute-bound.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    attention_forward_wgmma(bf16* out, float* lse, const __grid_constant__ CUtensorMap map, int B, int T, QKVLayout L,
                            int window) {
    constexpr int HD = Cfg::HD, BQ = Cfg::BQ, BKV = Cfg::BKV, STAGES = Cfg::STAGES;
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
    auto kv_range = [&](int q0, int& kv_first) {  // returns the number of K/V tiles of a query tile
        kv_first = window > 0 ? max(0, q0 - window + 1) / BKV : 0;
        return (min(q0 + BQ, T) - 1) / BKV - kv_first + 1;
    };
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full_k(s), 1), mbar_init(full_v(s), 1);
            mbar_init(empty_k(s), 8), mbar_init(empty_v(s), 8);  // one arrival per consumer warp
        }
        for (int qb = 0; qb < 2; qb++) mbar_init(q_full(qb), 1), mbar_init(q_empty(qb), 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp < 4) {  // ------------------------------------------------ producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (threadIdx.x == 0) {
            int it = 0, j = 0;  // K/V tiles and items so far: ring stage and phase
            for (int i = blockIdx.x; i < n_items; i += gridDim.x, j++) {
                const HopperItem w(i, L.NH, B, n_qtiles, BQ);
                const int kvh = w.h / (L.NH / L.NKV), qb = j & 1;
                mbar_wait(q_empty(qb), ((j >> 1) & 1) ^ 1);
                mbar_expect_tx(q_full(qb), Cfg::Q_BYTES);
                tma_tile<BQ, HD>(s_q(qb), &map, L.q_col(w.h), w.q0, w.b, q_full(qb));
                int kv_first;
                const int n_tiles = kv_range(w.q0, kv_first);
                for (int n = 0; n < n_tiles; n++, it++) {
                    const int s = it % STAGES, kv0 = (kv_first + n) * BKV;
                    const uint32_t free_parity = ((it / STAGES) & 1) ^ 1;
                    mbar_wait(empty_k(s), free_parity);
                    mbar_expect_tx(full_k(s), Cfg::KV_BYTES);
                    tma_tile<BKV, HD>(sK + s * Cfg::KV_BYTES, &map, L.k_col(kvh), kv0, w.b, full_k(s));
                    mbar_wait(empty_v(s), free_parity);
                    mbar_expect_tx(full_v(s), Cfg::KV_BYTES);
                    tma_tile<BKV, HD>(sV + s * Cfg::KV_BYTES, &map, L.v_col(kvh), kv0, w.b, full_v(s));
                }
            }
        }
        return;
    }
    // ------------------------------------------------------------------ consumer warpgroups
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    // warpgroup index through a shuffle from lane 0: provably warp-uniform to the compiler (a branch
    // it thinks divergent around wgmma makes ptxas serialise them, warning C7520)
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0) - 1, w = warp % 4, g = lane >> 2, t4 = lane & 3;
    const int wrow = wg * 64 + w * 16;  // this warp's first row in the tile; the thread has wrow + g (+ 8)
    const float sl2 = rsqrtf((float)HD) * LOG2E;  // scores -> base-2 exponent
    uint8_t* smem_gen = smem_raw + (base - raw);    // generic pointer to `base`

    // Ping-pong turns: warpgroup 1 lets warpgroup 0 go first; every issue step is "wait for my turn,
    // issue, hand the turn over". The very last hand-over of warpgroup 1 is skipped so that the
    // arrivals on each barrier match its syncs.
    if (Cfg::PINGPONG && wg == 1) named_arrive(1);
    auto turn_begin = [&] {
        if constexpr (Cfg::PINGPONG) named_sync(1 + wg);
    };
    auto turn_end = [&](bool very_last) {
        if constexpr (Cfg::PINGPONG)
            if (!(very_last && wg == 1)) named_arrive(2 - wg);
    };

    int it = 0, j = 0;
    for (int i = blockIdx.x; i < n_items; i += gridDim.x, j++) {
        const HopperItem item(i, L.NH, B, n_qtiles, BQ);
        const int q0 = item.q0, h = item.h, b = item.b, qb = j & 1, row0 = q0 + wrow + g;
        const bool last_item = i + (int)gridDim.x >= n_items;
        int kv_first;
        const int n_tiles = kv_range(q0, kv_first);
        const uint32_t sQ = s_q(qb);

        // S = Q K^T for ring stage s: HD/16 wgmma k-steps, 32 bytes apart inside a panel.
        auto issue_qk = [&](float (&sacc)[BKV / 2], int s) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                const uint32_t koff = (kk % 4) * 32;
                const uint64_t da = smem_desc(sQ + (kk / 4) * BQ * 128 + wg * 64 * 128 + koff, 16, 1024);
                const uint64_t db = smem_desc(sK + s * Cfg::KV_BYTES + (kk / 4) * BKV * 128 + koff, 16, 1024);
                wgmma_ss<BKV>(sacc, da, db, kk > 0);
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
            {  // tile 0: S and its softmax (O is still zero)
                const int s = it % STAGES;
                float sacc[BKV / 2];
                mbar_wait(full_k(s), (it / STAGES) & 1);
                turn_begin();
                wgmma_fence();
                issue_qk(sacc, s);
                wgmma_commit();
                turn_end(false);
                wgmma_wait<0>();
                fence_regs(sacc);
                if (lane == 0) mbar_arrive(empty_k(s));
                mask(sacc, 0);
                online_softmax<BKV>(sacc, m, l, corr, sl2);
                pack_p<BKV>(p, sacc);
            }
            for (int n = 1; n < n_tiles; n++) {
                const int s = (it + n) % STAGES, sp = (it + n - 1) % STAGES;
                float sacc[BKV / 2];
                mbar_wait(full_k(s), ((it + n) / STAGES) & 1);
                mbar_wait(full_v(sp), ((it + n - 1) / STAGES) & 1);
                turn_begin();
                wgmma_fence();
                issue_qk(sacc, s);
                wgmma_commit();
                issue_pv(o, p, sp);
                wgmma_commit();
                turn_end(false);
                wgmma_wait<1>();  // S_n done, P_{n-1} V_{n-1} may still run
                fence_regs(sacc);
                if (lane == 0) mbar_arrive(empty_k(s));
                mask(sacc, n);
                online_softmax<BKV>(sacc, m, l, corr, sl2);
                wgmma_wait<0>();
                fence_regs(o);
                fence_regs(p);
                if (lane == 0) mbar_arrive(empty_v(sp));
                scale_o<HD>(o, corr);
                pack_p<BKV>(p, sacc);
            }
            const int s = (it + n_tiles - 1) % STAGES;
            mbar_wait(full_v(s), ((it + n_tiles - 1) / STAGES) & 1);
            turn_begin();
            wgmma_fence();
            issue_pv(o, p, s);
            wgmma_commit();
            turn_end(last_item);
            wgmma_wait<0>();
            fence_regs(o);
            fence_regs(p);
            if (lane == 0) mbar_arrive(empty_v(s));
        }
        it += n_tiles;

        // Epilogue: lse, normalise, stage this warp's 16 rows in its own rows of the Q buffer (no other
        // warp reads them; every wgmma that read them has completed), 16-byte stores of the rows < T,
        // then hand the buffer back to the producer (after a proxy fence: the TMA refills it).
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lt = l[r];
            lt += __shfl_xor_sync(0xffffffffu, lt, 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            inv[r] = 1.0f / lt;
            const int row = row0 + 8 * r;
            if (t4 == 0 && row < T) lse[((size_t)b * L.NH + h) * T + row] = m[r] * (sl2 / LOG2E) + logf(lt);
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
            if (row < T)
                *reinterpret_cast<int4*>(out + (((size_t)b * T + row) * L.NH + h) * HD + c) =
                    *reinterpret_cast<const int4*>(tile + panel_offset<BQ>(r, c));
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncwarp();
        if (lane == 0) mbar_arrive(q_empty(qb));
    }
}

// persistent: min(work items, SMs) CTAs stride over the items; otherwise one CTA per item.
template <class Cfg>
inline void forward_hopper(bf16* out, float* lse, const bf16* qkv, int B, int T, QKVLayout L, int window,
                           cudaStream_t stream, bool persistent) {
    static const bool once = (allow_smem(attention_forward_wgmma<Cfg>, Cfg::SMEM), true);
    (void)once;
    const CUtensorMap map = token_rows_map(qkv, B, T, L.row());
    const int items = L.NH * B * ceil_div(T, Cfg::BQ);
    attention_forward_wgmma<Cfg><<<persistent ? std::min(items, sm_count()) : items, Cfg::THREADS, Cfg::SMEM, stream>>>(
        out, lse, map, B, T, L, window);
    cudaCheckLaunch();
}

// The shipped configuration: 128 keys a tile, two stages, intra-warpgroup overlap, ping-pong.
template <int HD>
using HopperFwdCfg = HopperCfg<HD, 128, 2, true, true>;
constexpr bool HOPPER_PERSISTENT = true;
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
    if (HD == 64) forward_hopper<HopperFwdCfg<64>>(out, lse, qkv, B, T, L, window, stream, HOPPER_PERSISTENT);
    else forward_hopper<HopperFwdCfg<128>>(out, lse, qkv, B, T, L, window, stream, HOPPER_PERSISTENT);
#else
    (void)out, (void)lse, (void)qkv, (void)stream;
    fail("attention_forward_hopper: this build has no sm_90a kernels (GPU_ARCH=90a defines LLMC_SM90A)");
#endif
}
