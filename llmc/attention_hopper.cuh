// attention_hopper.cuh: the attention forward for Hopper (sm_90a): FlashAttention on wgmma, tiles
// brought in by the TMA copy engine, a producer warp and two or three consumer warpgroups (FA3's
// structure). Same function as attention_forward_flash (llmc/attention.cuh): causal, GQA, optional
// sliding window and document mask (the DOC instantiation: key tiles below the query tile's first
// document start skipped, edge tiles masked per element like the window's), HD 64 or 128, any T; bf16
// operands, fp32 accumulation and softmax.
//
// Shapes (those of attention.cuh):
//   qkv (B, T, (NH + 2*NKV) * HD)   read through one 3-D TMA tensor map (columns, T, B): rows past T
//                                   of a sequence (and before 0) come in as zeros
//   out (B, T, NH * HD)             rows outside 0..T-1 are never stored
//   lse (B, NH, T) fp32             natural-log log-sum-exp of the scaled scores
//
// The kernel by role (each a named function below):
//   fwd_producer        warps 0-3 at 24 registers (setmaxnreg.dec); one thread issues every TMA: the
//                       item's Q tile (double-buffered), then its K and V tiles through a ring of stages
//   fwd_mainloop        each consumer warpgroup (64 query rows) over the K/V tiles its rows see: S = Q K^T
//                       by wgmma from smem, the online softmax in registers (base 2), O += P V with P
//                       from registers; FA3's intra-warpgroup overlap (S_{n+1} issued before O += P_n V_n)
//                       and ping-pong (the warpgroups take turns to issue their wgmma)
//   fwd_epilogue        lse, O / l, staged through the warp's own rows of the Q buffer, 16-byte stores;
//                       with AttnFp8Out also the e4m3 copy and its transpose (--fp8's attproj X)
//   FwdTileScheduler    a persistent grid (one CTA an SM) over BQ-query tiles of one head, in head
//                       groups whose K/V fit in 32 MB of L2
// The role functions are __forceinline__, the helpers inside the main loop lambdas, and the small
// accessors plain inline: the order in which the compiler inlines them decides ptxas's output (making
// the lambdas functions, or hoisting the Q address or the own-range computation, changes the SASS).
// Budget as shipped (HopperFwdShipped):
//   HD 64   3 consumer warpgroups (BQ 192) at 160 registers, each only its own K/V tiles; BKV 128, 2
//           stages; smem 2 x Q 24 KB + 2 x (K, V) 16 KB = 112 KB + barriers; 128 registers at launch,
//           no spills (ptxas -v)
//   HD 128  2 consumer warpgroups (BQ 128) at 240 registers; BKV 128, 2 stages; smem 2 x Q 32 KB +
//           2 x (K, V) 32 KB = 192 KB + barriers; 168 registers at launch, no spills
// FLOPs 4 * HD per visible (query, key) pair (plus the masked parts of diagonal tiles); bytes: K/V
// re-read by every query tile of a head, from L2 thanks to the head groups: compute-bound.
// Measured: docs/perf.md "Attention, ours against cuDNN"; other configurations and dropped designs:
// dev/cuda/attention_hopper.cu. Part of llmc/attention.cuh (included from attention_forward.cuh).
#pragma once
#include "llmc/attention_hopper_common.cuh"
#include "llmc/fp8.cuh"

#if defined(LLMC_SM90A)
namespace attention_hopper_detail {
using namespace attention_detail;

// ============================================================================ configuration
// A forward configuration is a struct with these named fields (the shipped ones at the end of this
// file, the lab's in dev/cuda/attention_hopper.cu), from which HopperFwd derives the rest:
//   head_dim             HD, 64 or 128 (whole 64-column panels)
//   kv_tile              BKV keys a K/V tile: the n of the S wgmma, 64 or 128
//   stages               K/V tiles in flight
//   consumers            consumer warpgroups of 64 query rows: BQ = 64 * consumers
//   own_kv_ranges        each warpgroup computes only the K/V tiles its own 64 rows see; the producer
//                        loads the union of them
template <class Config>
struct HopperFwd {
    static constexpr int HD = Config::head_dim, BKV = Config::kv_tile, STAGES = Config::stages;
    static constexpr int NWG = Config::consumers, BQ = 64 * NWG, THREADS = 128 * (NWG + 1);
    static constexpr bool OWN_RANGES = Config::own_kv_ranges;
    // registers a thread after setmaxnreg: the producer gives its share to the consumers
    static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = NWG == 2 ? 240 : 160;
    static constexpr int Q_BYTES = BQ * HD * 2, KV_BYTES = BKV * HD * 2;
    static_assert(HD == 64 || HD == 128, "HD 64 or 128: whole 64-column panels");
    static_assert(BKV == 64 || BKV == 128, "BKV is the n of the S wgmma");
    static_assert(NWG == 2 || NWG == 3, "2 or 3 consumer warpgroups");
    static_assert(NWG == 2 || HD == 64, "3 consumer warpgroups (160 registers) hold O and S only at HD 64");
    static_assert((PRODUCER_REGS + NWG * CONSUMER_REGS) * 128 <= 65536, "the SM's register file");
};

// The CTA's shared memory, every tile 1024-byte aligned (the 128B swizzle's period): sizeof + 1024. Q
// is double-buffered so a persistent CTA loads its next query tile while it finishes this one; K and V
// have separate barriers, so a K stage is refilled as soon as its S is done.
template <class K>
struct FwdSmem {
    uint8_t q[2][K::Q_BYTES];             // (BQ, HD) bf16, then the output tile
    uint8_t k[K::STAGES][K::KV_BYTES];    // (BKV, HD) bf16
    uint8_t v[K::STAGES][K::KV_BYTES];    // (BKV, HD) bf16
    uint64_t full_k[K::STAGES], full_v[K::STAGES];    // the TMA's bytes landed (one expect_tx arrival)
    uint64_t empty_k[K::STAGES], empty_v[K::STAGES];  // one arrival a consumer warp
    uint64_t q_full[2], q_empty[2];
};
// The dynamic smem a CTA asks for.
template <class K>
constexpr int fwd_smem_bytes() {
    static_assert(offsetof(FwdSmem<K>, k) % 1024 == 0 && offsetof(FwdSmem<K>, v) % 1024 == 0 &&
                      offsetof(FwdSmem<K>, full_k) % 1024 == 0,
                  "tiles 1024-byte aligned (the 128B swizzle's period)");
    return 1024 + (int)sizeof(FwdSmem<K>);
}
// Shared-space addresses of FwdSmem's fields from the 1024-aligned base.
template <class K>
struct FwdSmemAddr {
    using S = FwdSmem<K>;
    uint32_t base, sK, sV, bars;  // the struct, the K and V rings, the first mbarrier
    __device__ explicit FwdSmemAddr(uint32_t base_)
        : base(base_), sK(base_ + (uint32_t)offsetof(S, k)), sV(base_ + (uint32_t)offsetof(S, v)),
          bars(base_ + (uint32_t)offsetof(S, full_k)) {}
    __device__ uint32_t q(int qb) const { return base + qb * K::Q_BYTES; }
    __device__ uint32_t k(int s) const { return sK + s * K::KV_BYTES; }
    __device__ uint32_t v(int s) const { return sV + s * K::KV_BYTES; }
    // the mbarriers: 8 bytes each from full_k[0]
#define FWD_BAR_INDEX(field) (int)((offsetof(S, field) - offsetof(S, full_k)) / 8)
    __device__ uint32_t full_k(int s) const { return bars + 8 * (FWD_BAR_INDEX(full_k) + s); }
    __device__ uint32_t full_v(int s) const { return bars + 8 * (FWD_BAR_INDEX(full_v) + s); }
    __device__ uint32_t empty_k(int s) const { return bars + 8 * (FWD_BAR_INDEX(empty_k) + s); }
    __device__ uint32_t empty_v(int s) const { return bars + 8 * (FWD_BAR_INDEX(empty_v) + s); }
    __device__ uint32_t q_full(int qb) const { return bars + 8 * (FWD_BAR_INDEX(q_full) + qb); }
    __device__ uint32_t q_empty(int qb) const { return bars + 8 * (FWD_BAR_INDEX(q_empty) + qb); }
#undef FWD_BAR_INDEX
};
// Named barriers (0 is __syncthreads).
enum FwdNamedBarrier : int {
    FWD_BAR_TURN = 1,  // + wg (1..consumers): consumer warpgroup wg's turn to issue its wgmma; 256 threads
};

// ============================================================================ tile scheduler
// Work item i: one BQ-query tile of one head. Query tiles are aligned to the end of the sequence (tile
// k holds the rows [T - (k+1) BQ, T - k BQ)), so the partial tile is the shortest item, its rows below 0
// read as zeros and never stored. (head, sequence) pairs hb = b * NH + h are taken in groups of `group`,
// each group's longest query tiles first, its heads side by side, so the CTAs running at one time
// share the group's K/V in L2. A CTA takes items blockIdx.x, blockIdx.x + gridDim.x, ...
struct FwdWork {
    int h, b, q0;
};
struct FwdTileScheduler {
    int NH, B, T, BQ, group, n_qtiles, n_items;
    __device__ __forceinline__ FwdTileScheduler(int NH_, int B_, int T_, int BQ_, int group_)
        : NH(NH_), B(B_), T(T_), BQ(BQ_), group(group_), n_qtiles(ceil_div(T_, BQ_)), n_items(NH_ * B_ * n_qtiles) {}
    __device__ FwdWork work(int i) const {
        const int g0 = i / (group * n_qtiles) * group, size = min(group, NH * B - g0), r = i - g0 * n_qtiles;
        const int hb = g0 + r % size;
        return {hb % NH, hb / NH, T - (r / size + 1) * BQ};
    }
};

// K/V tiles seen by the query rows [r0, r1] (0 <= r0, r1 < T): the count, and the first in kv_first.
// DOC: none below the tile holding r0's document start (row_start: the sequence's doc_start row; the
// smallest of the rows', doc_start being nondecreasing). The producer's loads and the consumers' loop
// counts both come from here.
template <int BKV, bool DOC = false>
__device__ inline int fwd_kv_tiles(int r0, int r1, int window, const int* row_start, int& kv_first) {
    kv_first = window > 0 ? max(0, r0 - window + 1) / BKV : 0;
    if constexpr (DOC) kv_first = max(kv_first, row_start[r0] / BKV);
    return r1 / BKV - kv_first + 1;
}

// ============================================================================ producer
// One thread: for each of the CTA's items, the Q tile into buffer j % 2, then its K/V tiles into the
// ring (stage and phase continue across items).
template <class K, bool DOC>
__device__ __forceinline__ void fwd_producer(const FwdSmemAddr<K>& sm, const CUtensorMap* map,
                                             const FwdTileScheduler& sched, const QKVLayout& L, int window,
                                             const int* doc_start) {
    int it = 0, j = 0;  // K/V tiles and items so far: ring stage and phase
    for (int i = blockIdx.x; i < sched.n_items; i += gridDim.x, j++) {
        const FwdWork w = sched.work(i);
        const int kvh = w.h / (L.NH / L.NKV), qb = j & 1;
        mbar_wait(sm.q_empty(qb), ((j >> 1) & 1) ^ 1);
        mbar_expect_tx(sm.q_full(qb), K::Q_BYTES);
        tma_tile<K::BQ, K::HD>(sm.q(qb), map, L.q_col(w.h), w.q0, w.b, sm.q_full(qb));
        int kv_first;
        const int n_tiles = fwd_kv_tiles<K::BKV, DOC>(max(w.q0, 0), w.q0 + K::BQ - 1, window,
                                                      DOC ? doc_start + (size_t)w.b * sched.T : nullptr, kv_first);
        for (int n = 0; n < n_tiles; n++, it++) {
            const int s = it % K::STAGES, kv0 = (kv_first + n) * K::BKV;
            const uint32_t free_parity = ((it / K::STAGES) & 1) ^ 1;
            mbar_wait(sm.empty_k(s), free_parity);
            mbar_expect_tx(sm.full_k(s), K::KV_BYTES);
            tma_tile<K::BKV, K::HD>(sm.k(s), map, L.k_col(kvh), kv0, w.b, sm.full_k(s));
            mbar_wait(sm.empty_v(s), free_parity);
            mbar_expect_tx(sm.full_v(s), K::KV_BYTES);
            tma_tile<K::BKV, K::HD>(sm.v(s), map, L.v_col(kvh), kv0, w.b, sm.full_v(s));
        }
    }
}

// ============================================================================ consumers
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

// A consumer thread's place: warpgroup wg, warp w of it, lane (g = lane / 4, t4 = lane % 4 in the
// wgmma accumulator layout); its rows of a tile are wrow + g and + 8.
struct FwdThread {
    int wg, w, lane, g, t4, wrow;
    float sl2;  // scores -> base-2 exponent
};
// One item as a consumer warpgroup sees it: rows q0.. of head h of sequence b (this thread's first
// row0), Q in buffer qb (the item's j % 2), the item's K/V tiles kv_first.. (n_tiles of them).
struct FwdTile {
    int q0, h, b, qb, row0, kv_first, n_tiles;
    uint32_t sQ;     // the Q buffer's shared-space address
    bool last_item;  // the CTA's last item: its last ping-pong hand-over is skipped
};
// DOC: the item's sequence row of doc_start, the document starts of this thread's two rows (0 for rows
// below 0) and the highest of its warp's 16 rows (a key tile from there on needs no document mask).
struct FwdDocRows {
    const int* row_start;
    int ds[2], hi;
};

// The consumer main loop of one item (item j of the CTA), issue steps n = 0..n_tiles: S_n = Q K_n
// (n < n_tiles) and O += P_{n-1} V_{n-1} (n > 0), each only where this warpgroup sees the tile (its
// own tiles a..z). A tile it does not see is still waited for and released: the producer counts every
// consumer warp. Ping-pong: every issue step is "wait for my turn, issue, hand the turn to the next";
// the very last hand-over of the last warpgroup is skipped so that arrivals match syncs on each barrier.
// DOC: keys before a row's document start are masked like the window's (docs: FwdDocRows).
template <class K, bool DOC>
__device__ __forceinline__ void fwd_mainloop(const FwdSmemAddr<K>& sm, const FwdThread& th, const FwdTile& tile,
                                             const FwdDocRows& docs, int j, int it, int window, float (&o)[K::HD / 2],
                                             uint32_t (&p)[K::BKV / 16][4], float (&m)[2], float (&l)[2],
                                             float (&corr)[2]) {
    constexpr int HD = K::HD, BQ = K::BQ, BKV = K::BKV, STAGES = K::STAGES, NWG = K::NWG;
    // (locals, not the structs, in the lambdas: what a lambda captures stays in memory until inlined)
    const int wg = th.wg, lane = th.lane, t4 = th.t4, wrow = th.wrow;
    const float sl2 = th.sl2;
    const int q0 = tile.q0, row0 = tile.row0, kv_first = tile.kv_first, n_tiles = tile.n_tiles;
    const bool last_item = tile.last_item;
    // this warpgroup's own tiles [a, z] of the item's 0..n_tiles-1 (none if its rows are all below 0,
    // in the partial tile)
    int a = 0, z = n_tiles - 1;
    if constexpr (K::OWN_RANGES) {
        const int r0 = q0 + wg * 64;
        if (r0 + 63 < 0) a = n_tiles, z = n_tiles - 1;
        else {
            int first;
            const int cnt = fwd_kv_tiles<BKV, DOC>(max(r0, 0), r0 + 63, window, docs.row_start, first);
            a = first - kv_first, z = a + cnt - 1;
        }
    }
    const uint32_t sQ = tile.sQ, sK = sm.sK, sV = sm.sV;
    mbar_wait(sm.q_full(tile.qb), (j >> 1) & 1);  // this item's Q (item j of the CTA)
    auto turn_begin = [&] { named_sync(FWD_BAR_TURN + wg); };
    auto turn_end = [&](bool very_last) {
        if (!(very_last && wg == NWG - 1)) named_arrive(FWD_BAR_TURN + (wg + 1) % NWG);
    };
    // S = Q K^T for ring stage s: HD/16 wgmma k-steps, 32 bytes apart inside a panel.
    auto issue_qk = [&](float (&sacc)[BKV / 2], int s) {
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            const uint32_t koff = (kk % 4) * 32;
            const uint64_t db = smem_desc(sK + s * K::KV_BYTES + (kk / 4) * BKV * 128 + koff, 16, 1024);
            const uint64_t da = smem_desc(sQ + (kk / 4) * BQ * 128 + wg * 64 * 128 + koff, 16, 1024);
            wgmma_ss<BKV>(sacc, da, db, kk > 0);
        }
    };
    // O += P V for stage s: BKV/16 k-steps of 16 keys (2 KB apart); V's panels BKV * 128 bytes apart.
    auto issue_pv = [&](int s) {
#pragma unroll
        for (int kk = 0; kk < BKV / 16; kk++)
            wgmma_rs<HD>(o, p[kk], smem_desc(sV + s * K::KV_BYTES + kk * 16 * 128, BKV * 128, 1024));
    };
    const int ds0 = DOC ? docs.ds[0] : 0, ds1 = DOC ? docs.ds[1] : 0, doc_hi = DOC ? docs.hi : 0;
    // Masks the scores of keys this thread's rows may not see (only on tiles crossing the diagonal, the
    // window's edge or, DOC, a document start of this warp's 16 rows).
    auto mask = [&](float (&sacc)[BKV / 2], int n) {
        const int kv0 = (kv_first + n) * BKV, first = q0 + wrow, last = first + 15;
        if (kv0 + BKV - 1 > first || (window > 0 && last - kv0 >= window) || (DOC && kv0 < doc_hi)) {
#pragma unroll
            for (int nb = 0; nb < BKV / 8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = kv0 + nb * 8 + 2 * t4 + (e & 1);
                    if (!attends(row0 + 8 * (e >> 1), key, window) || (DOC && key < ((e >> 1) ? ds1 : ds0)))
                        sacc[nb * 4 + e] = -INFINITY;
                }
        }
    };
    // One instantiation per pair of matmuls issued, so no wgmma pipeline stage spans a branch (ptxas
    // would serialise the wgmma) and the main loop has none.
    auto step = [&](auto with_qk, auto with_pv, int n) {
        constexpr bool QK = decltype(with_qk)::value, PV = decltype(with_pv)::value;
        const int s = (it + n) % STAGES, sp = (it + n + STAGES - 1) % STAGES;
        const bool has_k = QK || n < n_tiles, has_v = PV || n > 0;
        if (has_k) mbar_wait(sm.full_k(s), ((it + n) / STAGES) & 1);
        if (has_v) mbar_wait(sm.full_v(sp), ((it + n - 1) / STAGES) & 1);
        float sacc[BKV / 2];
        turn_begin();
        if constexpr (QK || PV) wgmma_fence();
        if constexpr (QK) {
            issue_qk(sacc, s);
            wgmma_commit();
        }
        if constexpr (PV) {
            issue_pv(sp);
            wgmma_commit();
        }
        turn_end(last_item && n == n_tiles);
        if constexpr (QK) {
            if constexpr (PV) wgmma_wait<1>();  // S_n done, P_{n-1} V_{n-1} may still run
            else wgmma_wait<0>();
            fence_regs(sacc);
        }
        if (has_k && lane == 0) mbar_arrive(sm.empty_k(s));
        if constexpr (QK) {
            mask(sacc, n);
            online_softmax<BKV>(sacc, m, l, corr, sl2);
        }
        if constexpr (PV) {
            wgmma_wait<0>();
            fence_regs(o);
            fence_regs(p);
        }
        if (has_v && lane == 0) mbar_arrive(sm.empty_v(sp));
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

// The epilogue of one item: lse, normalise, stage this warp's 16 rows in its own rows of the Q buffer
// (every wgmma that read them has completed), 16-byte stores of the rows in 0..T-1, then hand the
// buffer back to the producer (after a proxy fence: the TMA refills it).
// FP8 (AttnFp8Out): each row's values also go to f8.x as e4m3 at *f8.scale, and the warp's 16 rows to
// f8.xt transposed, lane taking columns lane, lane + 32, ... (T a multiple of 16, so a warp's 16 rows
// are all stored or all below 0); amax raised over the values in f8_amax.
template <class K, bool FP8>
__device__ __forceinline__ void fwd_epilogue(const FwdSmemAddr<K>& sm, uint8_t* smem_gen, const FwdThread& th,
                                             const FwdTile& tile, const float (&o)[K::HD / 2], const float (&m)[2],
                                             const float (&l)[2], bf16* out, float* lse, int T, const QKVLayout& L,
                                             const AttnFp8Out& f8, float f8_scale, unsigned int& f8_amax) {
    constexpr int HD = K::HD, BQ = K::BQ;
    const int b = tile.b, h = tile.h, lane = th.lane, g = th.g, t4 = th.t4, wrow = th.wrow;
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lt = l[r];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        inv[r] = 1.0f / lt;
        const int row = tile.row0 + 8 * r;
        if (t4 == 0 && row >= 0) lse[((size_t)b * L.NH + h) * T + row] = m[r] * (th.sl2 / LOG2E) + logf(lt);
    }
    uint8_t* stage = smem_gen + tile.qb * K::Q_BYTES;
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++) {
        const int c = nd * 8 + 2 * t4;
        *reinterpret_cast<uint32_t*>(stage + panel_offset<BQ>(wrow + g, c)) =
            pack_bf16(o[nd * 4 + 0] * inv[0], o[nd * 4 + 1] * inv[0]);
        *reinterpret_cast<uint32_t*>(stage + panel_offset<BQ>(wrow + g + 8, c)) =
            pack_bf16(o[nd * 4 + 2] * inv[1], o[nd * 4 + 3] * inv[1]);
    }
    __syncwarp();
    constexpr int CHUNKS = HD / 8;
#pragma unroll
    for (int k = 0; k < 16 * CHUNKS / WARP_SIZE; k++) {
        const int idx = k * WARP_SIZE + lane, r = wrow + idx / CHUNKS, c = (idx % CHUNKS) * 8, row = tile.q0 + r;
        if (row >= 0) {
            bf16* dst = out + (((size_t)b * T + row) * L.NH + h) * HD + c;
            const int4 v = *reinterpret_cast<const int4*>(stage + panel_offset<BQ>(r, c));
            *reinterpret_cast<int4*>(dst) = v;
            if constexpr (FP8) {
                const bf16* vb = reinterpret_cast<const bf16*>(&v);
                uint2 q;
                uint16_t* qh = reinterpret_cast<uint16_t*>(&q);
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    const float x0 = __bfloat162float(vb[e]), x1 = __bfloat162float(vb[e + 1]);
                    f8_amax = max(f8_amax, max(abs_bits(x0), abs_bits(x1)));
                    qh[e / 2] = fp8x2_from_float2<Fp8Format::E4M3>(x0 * f8_scale, x1 * f8_scale);
                }
                *reinterpret_cast<uint2*>(f8.x + (((size_t)b * T + row) * L.NH + h) * HD + c) = q;
            }
        }
    }
    if constexpr (FP8) {
        if (tile.q0 + wrow >= 0) {
            const size_t col0 = (size_t)b * T + tile.q0 + wrow;  // xt column of the warp's first row
#pragma unroll
            for (int k = 0; k < HD / WARP_SIZE; k++) {
                const int c = k * WARP_SIZE + lane;
                uint4 q;
                uint16_t* qh = reinterpret_cast<uint16_t*>(&q);
#pragma unroll
                for (int r = 0; r < 16; r += 2) {
                    const float x0 = __bfloat162float(*reinterpret_cast<const bf16*>(stage + panel_offset<BQ>(wrow + r, c)));
                    const float x1 = __bfloat162float(*reinterpret_cast<const bf16*>(stage + panel_offset<BQ>(wrow + r + 1, c)));
                    qh[r / 2] = fp8x2_from_float2<Fp8Format::E4M3>(x0 * f8_scale, x1 * f8_scale);
                }
                *reinterpret_cast<uint4*>(f8.xt + (size_t)(h * HD + c) * f8.rows + col0) = q;
            }
        }
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncwarp();
    if (lane == 0) mbar_arrive(sm.q_empty(tile.qb));
}

// A consumer warpgroup over the CTA's items: the item's tile, the main loop, the epilogue.
// DOC: every row still sees itself (doc_start[t] <= t), so no row's sum l is 0 and lse stays finite.
template <class K, bool FP8, bool DOC>
__device__ __forceinline__ void fwd_consumer(const FwdSmemAddr<K>& sm, uint8_t* smem_gen, const FwdTileScheduler& sched,
                                             int warp, int lane, bf16* out, float* lse, int T, const QKVLayout& L,
                                             int window, const AttnFp8Out& f8, const int* doc_start) {
    constexpr int HD = K::HD, BQ = K::BQ, BKV = K::BKV, NWG = K::NWG;
    // warpgroup index through a shuffle from lane 0: provably warp-uniform to the compiler (a branch
    // it thinks divergent around wgmma makes ptxas serialise them, warning C7520)
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0) - 1, w = warp % 4;
    const FwdThread th{wg, w, lane, lane >> 2, lane & 3, wg * 64 + w * 16, rsqrtf((float)HD) * LOG2E};

    if (wg == NWG - 1) named_arrive(FWD_BAR_TURN);  // warpgroup 0 takes the first turn

    int it = 0, j = 0;
    const float f8_scale = FP8 ? *f8.scale : 0.0f;
    unsigned int f8_amax = 0;
    for (int i = blockIdx.x; i < sched.n_items; i += gridDim.x, j++) {
        const FwdWork item = sched.work(i);
        FwdTile tile;
        tile.q0 = item.q0, tile.h = item.h, tile.b = item.b, tile.qb = j & 1, tile.row0 = item.q0 + th.wrow + th.g;
        tile.last_item = i + (int)gridDim.x >= sched.n_items;
        FwdDocRows docs{};
        if constexpr (DOC) {  // this thread's rows < T (the tiles end at T - 1)
            docs.row_start = doc_start + (size_t)item.b * T;
            for (int r = 0; r < 2; r++) docs.ds[r] = tile.row0 + 8 * r >= 0 ? docs.row_start[tile.row0 + 8 * r] : 0;
            docs.hi = __reduce_max_sync(0xffffffffu, docs.ds[1]);
        }
        tile.n_tiles = fwd_kv_tiles<BKV, DOC>(max(tile.q0, 0), tile.q0 + BQ - 1, window, docs.row_start, tile.kv_first);
        tile.sQ = sm.q(tile.qb);

        float o[HD / 2];
#pragma unroll
        for (int k = 0; k < HD / 2; k++) o[k] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2];
        uint32_t p[BKV / 16][4];
        fwd_mainloop<K, DOC>(sm, th, tile, docs, j, it, window, o, p, m, l, corr);
        it += tile.n_tiles;
        fwd_epilogue<K, FP8>(sm, smem_gen, th, tile, o, m, l, out, lse, T, L, f8, f8_scale, f8_amax);
    }
    if constexpr (FP8) {  // one atomic a warp for all its items
        f8_amax = __reduce_max_sync(0xffffffffu, f8_amax);
        if (lane == 0 && f8_amax > *(volatile unsigned int*)f8.amax_bits) atomicMax(f8.amax_bits, f8_amax);
    }
}

// ============================================================================ the kernel
// grid: min(work items, SMs) CTAs striding over the items (or one per item); THREADS threads;
// fwd_smem_bytes() of dynamic smem. Warps 0-3 the producer, the rest the consumers. DOC: doc_start
// (B, T) masks keys before each row's document (attention_layout.cuh), else unused.
template <class Config, bool FP8 = false, bool DOC = false>
__global__ void __launch_bounds__(HopperFwd<Config>::THREADS, 1)
    attention_forward_wgmma(bf16* out, float* lse, const __grid_constant__ CUtensorMap map, int B, int T, QKVLayout L,
                            int window, int group, AttnFp8Out f8, const int* doc_start) {
#if LLMC_SM90A_DEVICE
    using K = HopperFwd<Config>;
    constexpr int STAGES = K::STAGES;
    constexpr int CWARPS = 4 * K::NWG;  // consumer warps: one arrival each on the empty barriers
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = smem_addr(smem_raw);
    const FwdSmemAddr<K> sm((raw + 1023) & ~1023u);
    const FwdTileScheduler sched(L.NH, B, T, K::BQ, group);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(sm.full_k(s), 1), mbar_init(sm.full_v(s), 1);
            mbar_init(sm.empty_k(s), CWARPS), mbar_init(sm.empty_v(s), CWARPS);
        }
        for (int qb = 0; qb < 2; qb++) mbar_init(sm.q_full(qb), 1), mbar_init(sm.q_empty(qb), CWARPS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp < 4) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(K::PRODUCER_REGS));
        if (threadIdx.x == 0) fwd_producer<K, DOC>(sm, &map, sched, L, window, doc_start);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(K::CONSUMER_REGS));
    fwd_consumer<K, FP8, DOC>(sm, smem_raw + (sm.base - raw), sched, warp, lane, out, lse, T, L, window, f8, doc_start);
#else
    __trap();
#endif
}

// (head, sequence) pairs an item group holds (FwdTileScheduler) so that their K and V, 4 * T * HD
// bytes a KV head, take at most l2_bytes (0: all of them in one group); whole GQA groups, at least one.
inline int hopper_head_group(const AttnShape& s, size_t l2_bytes) {
    const int per_kv = s.NH / s.NKV, all = s.NH * s.B;
    if (l2_bytes == 0) return all;
    const size_t kv_bytes = (size_t)4 * s.T * s.HD;
    const int g = (int)std::max<size_t>(1, l2_bytes / kv_bytes) * per_kv;
    return std::min(g, all);
}

// persistent: min(work items, SMs) CTAs stride over the items; otherwise one CTA per item. l2_bytes:
// the K/V budget of an item group (hopper_head_group). f8: also the FP8 copies of out, else null
// (not with s.doc_start). s.doc_start: the DOC kernel.
template <class Config>
inline void forward_hopper(bf16* out, float* lse, const bf16* qkv, const AttnShape& s, const CudaContext& ctx,
                           bool persistent, size_t l2_bytes, const AttnFp8Out* f8 = nullptr) {
    using K = HopperFwd<Config>;
    constexpr int smem = fwd_smem_bytes<K>();
    static_assert(smem <= 227 * 1024, "one CTA's smem");
    ctx.allow_smem(attention_forward_wgmma<Config, false>, smem);
    ctx.allow_smem(attention_forward_wgmma<Config, true>, smem);
    ctx.allow_smem(attention_forward_wgmma<Config, false, true>, smem);
    if (f8 && s.doc_start) fail("attention_forward_hopper: no FP8 copies with document masking");
    const int B = s.B, T = s.T;
    const QKVLayout L = qkv_layout(s);
    const CUtensorMap map = token_rows_map(qkv, B, T, L.row());
    const int items = L.NH * B * ceil_div(T, K::BQ);
    const int grid = persistent ? std::min(items, ctx.sm_count) : items, group = hopper_head_group(s, l2_bytes);
    auto kernel = s.doc_start ? attention_forward_wgmma<Config, false, true>
                  : f8        ? attention_forward_wgmma<Config, true>
                              : attention_forward_wgmma<Config, false>;
    kernel<<<grid, K::THREADS, smem, ctx.stream>>>(out, lse, map, B, T, L, s.window, group, f8 ? *f8 : AttnFp8Out{},
                                                   s.doc_start);
    cudaCheckLaunch();
}

// The shipped configurations (budget in the header comment); persistent, K/V head groups in 32 MB of L2.
template <int HD>
struct HopperFwdShipped;
template <>
struct HopperFwdShipped<64> {
    static constexpr int head_dim = 64, kv_tile = 128, stages = 2, consumers = 3;
    static constexpr bool own_kv_ranges = true;
};
template <>
struct HopperFwdShipped<128> {
    static constexpr int head_dim = 128, kv_tile = 128, stages = 2, consumers = 2;
    static constexpr bool own_kv_ranges = false;  // 128 queries see the same 128-key tiles: nothing to skip
};
constexpr bool HOPPER_PERSISTENT = true;
constexpr size_t HOPPER_L2_BYTES = (size_t)32 << 20;
}  // namespace attention_hopper_detail
#endif  // LLMC_SM90A

// FlashAttention forward on wgmma + TMA; bf16, HD 64 or 128, out and qkv 16-byte aligned. Only in
// sm_90a builds (attention_hopper_available(ctx)); elsewhere calling it is an error. f8: the FP8
// copies of out as well (T a multiple of 16, x and xt 16-byte aligned; not with s.doc_start).
inline void attention_forward_hopper(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, const AttnShape& s,
                                     const CudaContext& ctx, const AttnFp8Out* f8 = nullptr) {
    using namespace attention_detail;
    check_attention_sizes("attention_forward_hopper", s);
#if defined(LLMC_SM90A)
    using namespace attention_hopper_detail;
    if (!aligned16(out) || !aligned16(qkv)) fail("attention_forward_hopper: out and qkv must be 16-byte aligned");
    if (f8 && (s.T % 16 != 0 || (size_t)f8->rows != (size_t)s.B * s.T || f8->rows % 16 != 0 || !aligned16(f8->x) ||
               !aligned16(f8->xt)))
        fail("attention_forward_hopper: the FP8 copies need T (%d) a multiple of 16, rows = B * T, 16-byte alignment",
             s.T);
    auto run = s.HD == 64 ? forward_hopper<HopperFwdShipped<64>> : forward_hopper<HopperFwdShipped<128>>;
    run(out, lse, qkv, s, ctx, HOPPER_PERSISTENT, HOPPER_L2_BYTES, f8);
#else
    (void)out, (void)lse, (void)qkv, (void)ctx, (void)f8;
    fail("attention_forward_hopper: this build has no sm_90a kernels (GPU_ARCH=90a defines LLMC_SM90A)");
#endif
}
