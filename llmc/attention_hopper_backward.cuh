// attention_hopper_backward.cuh: the attention backward for Hopper (sm_90a): FlashAttention-3's
// structure on wgmma, Q/dO tiles brought in by the TMA copy engine, a producer warp and two consumer
// warpgroups. Same function as attention_backward_flash with a scratch buffer (llmc/attention.cuh):
// causal, GQA, optional sliding window and document mask (the DOC instantiation: each key tile's query
// tiles end where its documents do, edge tiles masked per element from the query tile's doc_start in
// smem), HD 64 or 128, any T; bf16 operands, fp32 accumulation.
//
// Shapes (those of attention.cuh):
//   qkv, dqkv (B, T, (NH + 2*NKV) * HD)  qkv read through one 3-D TMA tensor map (columns, T, B): rows
//                                        past T come in as zeros; dqkv written with `=`
//   dout (B, T, NH * HD)                 read through a second tensor map of the same kind
//   scratch                              attention_backward_scratch_floats(shape) floats in the layout
//                                        of attention_mma_backward.cuh's single pass; with the split
//                                        schedule then dkv_accum (B, T, 2 * NKV * HD): dK's, then dV's columns
// Three launches, as backward_flash_atomic: attention_backward_prologue, the wgmma kernel below,
// attention_backward_dq_store (skipped with keep_dq: attention_backward). dK and dV are summed over the
// GQA group in registers (deterministic); dQ by fp32 TMA reductions into dq_accum (not bit-reproducible).
// The split schedule (small shapes, BwdTileScheduler) zeroes dkv_accum first, sums dK and dV there by
// fp32 reductions too, and ends with attention_backward_dqkv_store.
//
// The kernel by role (each a named function below; __forceinline__, the per-tile steps lambdas, for
// the machine code's sake as in attention_hopper.cuh):
//   bwd_producer        warp 0 (setmaxnreg.dec): one thread issues the TMA of K, V (once a unit) and,
//                       per query tile, of Q, dO and the tile's D and lse2
//   bwd_mainloop        each consumer warpgroup (64 of the unit's 128 keys) over its query tiles of
//                       every head of the GQA group: S^T, dP^T (wgmma from smem), P^T and dS^T in
//                       registers, dV += P^T dO and dK += dS^T Q held in registers for the whole unit,
//                       dQ = dS K (dS^T through smem) reduced into dq_accum by the TMA; the order of
//                       the tiles' steps is one of two schedules:
//   bwd_schedule_lockstep   both warpgroups meet at one named barrier a tile, then dQ
//   bwd_schedule_late_dq    dQ of tile n issued after tile n + 1's dV/dK
//   bwd_epilogue        dK = scale * dS^T Q, dV: bf16 pairs from the accumulators into dqkv
//   BwdTileScheduler    a persistent grid over (128-key tile, kv head, sequence) units; the split
//                       schedule where whole units would leave SMs idle
// Budget as shipped (HopperBwdShipped; ptxas -v):
//   HD 64   BQ 128, late dQ; producer 24 registers, consumers 240 (168 at launch); 8 bytes of spill
//           stores, 24 of spill loads. smem K, V 32 KB + 2 x (Q, dO) 64 KB + 2 dS^T 64 KB + dQ boxes
//           32 KB + D, lse2 2 KB = 194 KB + barriers
//   HD 128  BQ 64, lockstep, skip_masked off; producer 40 registers, consumers 232; no spills. smem K,
//           V 64 KB + 2 x (Q, dO) 64 KB + 2 dS^T 32 KB + dQ boxes 32 KB + D, lse2 1 KB = 193 KB + barriers
// FLOPs: 5 matmuls, 10 * HD per visible pair (plus the masked parts of diagonal and window-edge tiles);
// bytes: K, V once, Q and dO once per key tile (from L2 with the work order above), BQ * HD * 4 bytes
// of dQ reductions per (key tile, query tile). Issue- and latency-bound. Measured: docs/perf.md
// "Attention, ours against cuDNN"; other configurations and dropped designs: dev/cuda/attention_backward.cu.
// Part of llmc/attention.cuh; builds on attention_mma_backward.cuh (prologue, dq_store, scratch layout)
// and attention_hopper_common.cuh.
#pragma once
#include "llmc/attention_mma_backward.cuh"
#include "llmc/attention_hopper_common.cuh"

#if defined(LLMC_SM90A)
namespace attention_hopper_detail {
using namespace attention_detail;

// ============================================================================ configuration
// A backward configuration is a struct with these named fields (the shipped ones at the end of this
// file, the lab's in dev/cuda/attention_backward.cu):
//   head_dim     HD, 64 or 128
//   q_tile       BQ queries a tile: 128 (HD 64 only: registers) splits dQ by query rows between the
//                consumer warpgroups, 64 by columns
//   stages       query tiles (Q, dO, D, lse2) in flight
//   late_dq      dQ of tile n issued after tile n + 1's dV/dK, not in lockstep
//   skip_masked  lockstep only: a warpgroup whose 64 keys see none of a tile's queries skips its S^T,
//                dP^T, dV, dK wgmmas and writes zeros as its dS^T rows
// SPLIT (not a field: the launcher instantiates both): the split schedule, a compile-time flag so that
// the whole-item kernel carries none of its registers. DOC (not a field either): document masking, the
// query tile's doc_start beside its D and lse2; whole items only (a key tile's query tiles then depend
// on its sequence, which the split schedule's unit count does not know).
template <class Config, bool SPLIT_ = false, bool DOC_ = false>
struct HopperBwd {
    static constexpr bool SPLIT = SPLIT_, DOC = DOC_;
    static_assert(!(SPLIT && DOC), "document masking on whole items only");
    static constexpr int HD = Config::head_dim, BKV = 128, BQ = Config::q_tile, STAGES = Config::stages;
    static constexpr int THREADS = 384;
    static constexpr bool LATE_DQ = Config::late_dq, DQ_ROWS = BQ == 128, SKIP_MASKED = Config::skip_masked;
    static_assert(!(SKIP_MASKED && LATE_DQ), "skip_masked: in the lockstep schedule only");
    // setmaxnreg within the 168 x 384 registers the CTA got at launch (an inc past that pool hangs).
    // BQ 128 and the late dQ need 240 (232 spilled); the producer's loop spills at 24, so 40 elsewhere.
    static constexpr bool BIG_CONSUMERS = BQ == 128 || LATE_DQ;
    static constexpr int PRODUCER_REGS = BIG_CONSUMERS ? 24 : 40, CONSUMER_REGS = BIG_CONSUMERS ? 240 : 232;
    static constexpr int DQ_N = DQ_ROWS ? HD : HD / 2;  // dQ columns a consumer warpgroup computes
    static constexpr int KV_BYTES = BKV * HD * 2, Q_BYTES = BQ * HD * 2, DS_BYTES = BKV * BQ * 2;
    // D + lse2 (+ DOC: doc_start) of a tile; a dQ box
    static constexpr int ROWS_BYTES = (DOC ? 3 : 2) * BQ * 4, DQ_BOX_BYTES = 64 * 32 * 4;
    static_assert(HD == 64 || HD == 128, "HD 64 or 128: whole 64-column panels");
    static_assert(BQ == 64 || (BQ == 128 && HD == 64), "BQ 128 only at HD 64 (registers)");
    static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 168 * THREADS, "setmaxnreg: the CTA's registers");
};

// The CTA's shared memory, every tile 1024-byte aligned (the 128B swizzle's period): sizeof + 1024.
template <class K>
struct BwdSmem {
    uint8_t k[K::KV_BYTES], v[K::KV_BYTES];        // (BKV, HD) bf16, resident for the item
    uint8_t q[K::STAGES][K::Q_BYTES];              // (BQ, HD) bf16
    uint8_t dout[K::STAGES][K::Q_BYTES];           // (BQ, HD) bf16
    uint8_t ds[2][K::DS_BYTES];                    // dS^T (BKV, BQ) bf16, alternating tiles
    uint8_t dq[K::BQ * K::HD * 4];                 // dQ (BQ, HD) fp32 as boxes of 64 x 32, 128B swizzle
    float rows[K::STAGES][K::ROWS_BYTES / 4];      // D, then lse2 (then DOC: doc_start), of a query tile
    uint64_t full[K::STAGES], empty[K::STAGES];    // a stage landed (expect_tx) / released (8 warps)
    uint64_t kv_full, kv_empty;                    // K, V landed / released
};
// DOC: one int after the struct, the unit's query tiles a head (BwdSmemAddr::unit_qt).
template <class K>
constexpr int bwd_smem_bytes() {
    using S = BwdSmem<K>;
    static_assert(offsetof(S, v) % 1024 == 0 && offsetof(S, q) % 1024 == 0 && offsetof(S, dout) % 1024 == 0 &&
                      offsetof(S, ds) % 1024 == 0 && offsetof(S, dq) % 1024 == 0 && offsetof(S, rows) % 1024 == 0,
                  "tiles 1024-byte aligned");
    return 1024 + (int)sizeof(S) + (K::DOC ? 16 : 0);
}
// Shared-space addresses of BwdSmem's fields from the 1024-aligned base.
template <class K>
struct BwdSmemAddr {
    using S = BwdSmem<K>;
    static constexpr int OFF_Q = offsetof(S, q), OFF_DO = offsetof(S, dout), OFF_DS = offsetof(S, ds),
                         OFF_DQ = offsetof(S, dq), OFF_ROWS = offsetof(S, rows);
    uint32_t base, sK, sV, bars, kv_full, kv_empty;
    __device__ explicit BwdSmemAddr(uint32_t base_)
        : base(base_), sK(base_ + (uint32_t)offsetof(S, k)), sV(base_ + (uint32_t)offsetof(S, v)),
          bars(base_ + (uint32_t)offsetof(S, full)), kv_full(bars + 8 * 2 * K::STAGES), kv_empty(kv_full + 8) {}
    __device__ uint32_t q(int s) const { return base + OFF_Q + s * K::Q_BYTES; }
    __device__ uint32_t dout(int s) const { return base + OFF_DO + s * K::Q_BYTES; }
    // D[BQ], then lse2[BQ], then (DOC) the int32 doc_start[BQ]
    __device__ uint32_t rows(int s) const { return base + OFF_ROWS + s * K::ROWS_BYTES; }
    // DOC: the unit's query tiles a head, written by the producer before its K, V arrival
    static constexpr int OFF_UNIT_QT = sizeof(S);
    __device__ uint32_t unit_qt() const { return base + OFF_UNIT_QT; }
    __device__ uint32_t full(int s) const { return bars + 8 * s; }
    __device__ uint32_t empty(int s) const { return bars + 8 * (K::STAGES + s); }
};

// Named barriers (0 is __syncthreads).
enum BwdNamedBarrier : int {
    BWD_BAR_DS_READY = 1,    // lockstep: both warpgroups' dS^T of the tile are in smem; 256 threads
    BWD_BAR_DQ_BOXES = 2,    // + wg: warpgroup wg's dQ boxes are written; its 128 threads
    BWD_BAR_DS_WRITTEN = 4,  // + 2 wg + tile parity (late dQ): warpgroup wg's dS^T of a tile is written;
                             // 256 threads (wg arrives, the other syncs)
};

// Byte offset of element (r, c) of a (64 rows x 32 fp32 columns) box in smem with the 128B swizzle.
__device__ __forceinline__ uint32_t dq_box_offset(int r, int c) { return r * 128 + (((c >> 2) ^ (r & 7)) << 4) + (c & 3) * 4; }

// ============================================================================ tile scheduler
// Query tiles of BQ from kv0 up to the last query that sees a key of the BKV-key tile at kv0.
template <int BKV, int BQ>
__host__ __device__ __forceinline__ int bwd_query_tiles(int kv0, int T, int window) {
    const int kv_last = (kv0 + BKV < T ? kv0 + BKV : T) - 1;
    const int q_end = window > 0 && kv_last + window < T ? kv_last + window : T;
    return (q_end - kv0 + BQ - 1) / BQ;
}
// Units of one (kv head, sequence) when each key tile's group * query_tiles tiles are cut into pieces
// of at most `chunk`.
template <int BKV, int BQ>
__host__ __device__ inline int bwd_split_units(int T, int window, int group, int chunk) {
    int units = 0;
    for (int kv0 = 0; kv0 < T; kv0 += BKV) units += ceil_div(group * bwd_query_tiles<BKV, BQ>(kv0, T, window), chunk);
    return units;
}

// A CTA takes units blockIdx.x, blockIdx.x + gridDim.x, ...; a unit is a key tile (kv0, kv head,
// sequence) and a range [it_begin, it_end) of its group * n_qt query tiles (BwdUnit). Two schedules:
//   whole items (chunk 0): item i is key tile i % n_kt of (kv head, sequence) i / n_kt, so the CTAs
//     running at one time share Q, dO and dq_accum rows in L2; the key tiles reversed in odd rounds of
//     the grid, so each CTA pairs a long causal key tile with a short one.
//   split (chunk > 0; where whole items would leave SMs idle): each key tile's tiles cut into
//     ceil(n_it / chunk) even ranges, one CTA each, the longest key tiles first; the CTAs of a key
//     tile sum dK, dV by fp32 reductions into dkv_accum.
// DOC (whole items): a key tile's query tiles also end at doc_query_end of its last key
// (doc_query_tiles). Only the producer searches doc_start (B, T), while the consumers work on the
// previous unit; it hands the count over in smem (BwdSmemAddr::unit_qt) with K and V, so both sides
// run the same tiles. The pointer sits in a base that is empty without DOC (the unmasked scheduler's
// layout unchanged).
template <bool DOC>
struct BwdDocStart {
    __device__ explicit BwdDocStart(const int*) {}
};
template <>
struct BwdDocStart<true> {
    const int* doc_start;
    __device__ explicit BwdDocStart(const int* p) : doc_start(p) {}
};
template <class K>
struct BwdTileScheduler : BwdDocStart<K::DOC> {
    int group, T, NKV, window, n_kt, chunk, units_hb, n_items;  // group: query heads a kv head
    __device__ __forceinline__ BwdTileScheduler(int B, int T_, const QKVLayout& L, int window_, int chunk_,
                                                const int* doc_start_)
        : BwdDocStart<K::DOC>(doc_start_), group(L.NH / L.NKV), T(T_), NKV(L.NKV), window(window_),
          n_kt(ceil_div(T_, K::BKV)), chunk(chunk_),
          units_hb(K::SPLIT ? bwd_split_units<K::BKV, K::BQ>(T_, window_, L.NH / L.NKV, chunk_) : n_kt),
          n_items(units_hb * L.NKV * B) {}
    __device__ int query_tiles(int kv0) const { return bwd_query_tiles<K::BKV, K::BQ>(kv0, T, window); }
    // unit i: its key tile kv0, kv head, sequence, query tiles per head n_qt and range [it_begin, it_end)
    __device__ void decode(int i, int& kv0, int& kvh, int& b, int& n_qt, int& it_begin, int& it_end) const {
        const int hb = i / units_hb;
        kvh = hb % NKV, b = hb / NKV;
        if constexpr (!K::SPLIT) {
            const int kt = i % n_kt;
            kv0 = ((i / (int)gridDim.x) & 1 ? n_kt - 1 - kt : kt) * K::BKV;
            n_qt = query_tiles(kv0), it_begin = 0, it_end = group * n_qt;
            return;
        }
        int r = i % units_hb;  // the split schedule
        for (kv0 = 0;; kv0 += K::BKV) {
            n_qt = query_tiles(kv0);
            const int ns = ceil_div(group * n_qt, chunk);
            if (r < ns) {
                it_begin = r * group * n_qt / ns, it_end = (r + 1) * group * n_qt / ns;
                return;
            }
            r -= ns;
        }
    }
    // DOC: decode's n_qt cut where the key tile's documents end (doc_query_end of its last key; >= 1,
    // that end being past the tile's first key)
    __device__ int doc_query_tiles(int kv0, int b, int n_qt) const {
        const int q_end = doc_query_end_wide<8>(this->doc_start + (size_t)b * T, min(kv0 + K::BKV, T) - 1, T);
        return min(n_qt, ceil_div(q_end - kv0, K::BQ));
    }
};

// ============================================================================ producer
// One thread: the waits and the copies (the other lanes have nothing to do).
template <class K>
__device__ __forceinline__ void bwd_producer(const BwdSmemAddr<K>& sm, const BwdTileScheduler<K>& sched,
                                             const CUtensorMap* qkv_map, const CUtensorMap* dout_map,
                                             const CUtensorMap* rows_map, const CUtensorMap* doc_map,
                                             const QKVLayout& L) {
    constexpr int HD = K::HD, BQ = K::BQ, BKV = K::BKV, STAGES = K::STAGES;
    const int group = sched.group;
    int cnt = 0, j = 0;  // query tiles and items so far: ring stage and phase
    for (int i = blockIdx.x; i < sched.n_items; i += gridDim.x, j++) {
        int kv0, kvh, b, n_qt, it_begin, it_end;
        sched.decode(i, kv0, kvh, b, n_qt, it_begin, it_end);
        if constexpr (K::DOC) it_end = group * (n_qt = sched.doc_query_tiles(kv0, b, n_qt));
        mbar_wait(sm.kv_empty, (j & 1) ^ 1);
        if constexpr (K::DOC)  // released to the consumers by the arrival below
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(sm.unit_qt()), "r"(n_qt) : "memory");
        mbar_expect_tx(sm.kv_full, 2 * K::KV_BYTES);
        tma_tile<BKV, HD>(sm.sK, qkv_map, L.k_col(kvh), kv0, b, sm.kv_full);
        tma_tile<BKV, HD>(sm.sV, qkv_map, L.v_col(kvh), kv0, b, sm.kv_full);
        for (int it = it_begin; it < it_end; it++, cnt++) {
            const int s = cnt % STAGES, h = kvh * group + it / n_qt, i0 = kv0 + (it % n_qt) * BQ;
            mbar_wait(sm.empty(s), ((cnt / STAGES) & 1) ^ 1);
            mbar_expect_tx(sm.full(s), 2 * K::Q_BYTES + K::ROWS_BYTES);  // (DOC: with the doc_start box)
            tma_tile<BQ, HD>(sm.q(s), qkv_map, L.q_col(h), i0, b, sm.full(s));
            tma_tile<BQ, HD>(sm.dout(s), dout_map, h * HD, i0, b, sm.full(s));
            // D and lse2 of the tile: one box of rows_map (racecheck tracks a tensor-map copy's smem
            // writes like Q's; plain bulk copies showed as hazards, although the mbarriers order them)
            tma_load(sm.rows(s), rows_map, i0, b * L.NH + h, 0, sm.full(s));
            if constexpr (K::DOC) tma_load_1d(sm.rows(s) + 2 * BQ * 4, doc_map, b * sched.T + i0, sm.full(s));
        }
    }
}

// ============================================================================ consumers
// A consumer thread's place: warpgroup wg (0 or 1: keys kv0 + 64 wg ..), warp w of it, lane (g = lane
// / 4, t4 = lane % 4 in the wgmma accumulator layout).
struct BwdThread {
    int wg, w, lane, g, t4;
    float scale, sl2;  // 1/sqrt(HD); scale * log2(e)
    int r0, c0;        // this warpgroup's dQ: rows r0 + [0, 64) of a query tile, columns c0 + [0, DQ_N)
    bool dq_issuer;    // issues its warpgroup's TMA reductions
};

// A unit of work as the consumers' schedules see it (BwdTileScheduler::decode): 128 keys kv0.. of kv
// head kvh, sequence b; query tiles [it_begin, it_end) of the key tile's group * n_qt (tile it: head
// kvh * group + it / n_qt, queries kv0 + (it % n_qt) * BQ).
struct BwdUnit {
    int kv0, kvh, b, group, n_qt, it_begin, it_end;
};

// The two schedules of bwd_mainloop's query tiles, on its per-tile helpers (lambdas, passed in):
// tile_grads (S^T .. the dV/dK wgmmas), store_ds, issue_dq, reduce_dq (and ds_ready for the lockstep).
// cnt counts the CTA's query tiles (ring stage and phase), continued across units; dk, dv accumulate.
template <class K, class TileGrads, class StoreDs, class IssueDq, class ReduceDq>
__device__ __forceinline__ void bwd_schedule_late_dq(const BwdSmemAddr<K>& sm, uint8_t* smem_gen, const BwdThread& th,
                                                     const BwdUnit& u, int& cnt, float (&dk)[K::HD / 2],
                                                     float (&dv)[K::HD / 2], TileGrads& tile_grads, StoreDs& store_ds,
                                                     IssueDq& issue_dq, ReduceDq& reduce_dq) {
    constexpr int BQ = K::BQ, STAGES = K::STAGES, N = K::DQ_N;
    const int wg = th.wg, lane = th.lane;
    const bool dq_issuer = th.dq_issuer;
    const uint32_t base = sm.base;
    const int kv0 = u.kv0, kvh = u.kvh, b = u.b, group = u.group, n_qt = u.n_qt, it_begin = u.it_begin,
              it_end = u.it_end;
    // dQ one query tile late, dS^T in two buffers (n % 2). A warpgroup arrives on "my dS^T(n) written"
    // after its dQ(n-1), the last reader of buffer (n+1) % 2, has completed, and stores dS^T(n) after
    // its sync on the other's dS^T(n-1), written after the other's dQ(n-2), the last reader of buffer
    // n % 2: one arrive per barrier id between two syncs of it. A tail step issues the unit's last dQ
    // before K is released; nothing is in flight across the loop's back edge.
    // the zeros of dK, dV opaque here: the peeled first step would otherwise materialise them
    // between its wgmma_fence and the dV/dK wgmma (ptxas C7519, then C7512)
    fence_regs(dk), fence_regs(dv);
    auto ds_buf = [&](int c) { return base + sm.OFF_DS + (c & 1) * K::DS_BYTES; };
    auto mine = [&](int c) { return BWD_BAR_DS_WRITTEN + 2 * wg + (c & 1); };
    auto other = [&](int c) { return BWD_BAR_DS_WRITTEN + 2 - 2 * wg + (c & 1); };
    auto tile_h = [&](int it) { return kvh * group + it / n_qt; };
    auto tile_i0 = [&](int it) { return kv0 + (it % n_qt) * BQ; };
    auto dq_ready = [&](int c) {  // the other's dS^T(c) rows are in smem (and our boxes read)
        if (dq_issuer) bulk_wait_read<0>();
        named_sync(other(c));
    };
    auto step = [&](auto prev_tag, int it) {
        constexpr bool PREV = decltype(prev_tag)::value;  // dQ of the previous tile to do
        const int s = cnt % STAGES, i0 = tile_i0(it);
        const float* rows = reinterpret_cast<const float*>(smem_gen + (sm.rows(s) - base));
        float st[BQ / 2], dpt[BQ / 2], dq[N / 2];
        uint32_t pf[BQ / 16][4], dsf[BQ / 16][4];
        mbar_wait(sm.full(s), (cnt / STAGES) & 1);
        tile_grads(st, dpt, pf, dsf, s, rows, i0);
        if constexpr (PREV) {  // dS^T(n) stored before dQ's accumulators are taken (registers)
            dq_ready(cnt - 1);
            store_ds(dsf, ds_buf(cnt));
            wgmma_fence();
            issue_dq(dq, ds_buf(cnt - 1));
        } else {
            store_ds(dsf, ds_buf(cnt));
        }
        wgmma_wait<0>();
        fence_regs(dv), fence_regs(dk), fence_regs(pf), fence_regs(dsf);
        named_arrive(mine(cnt));
        __syncwarp();                             // every lane's reads of lse2, D before the release
        if (lane == 0) mbar_arrive(sm.empty(s));  // Q, dO, lse2, D of this stage are free
        if constexpr (PREV) {
            fence_regs(dq);
            reduce_dq(dq, tile_h(it - 1), tile_i0(it - 1), b);
        }
    };
    step(std::integral_constant<bool, false>{}, it_begin);
    cnt++;
    for (int it = it_begin + 1; it < it_end; it++, cnt++) step(std::integral_constant<bool, true>{}, it);
    {  // tail: dQ of the item's last tile
        float dq[N / 2];
        dq_ready(cnt - 1);
        wgmma_fence();
        issue_dq(dq, ds_buf(cnt - 1));
        wgmma_wait<0>();
        fence_regs(dq);
        reduce_dq(dq, tile_h(it_end - 1), tile_i0(it_end - 1), b);
    }
}

template <class K, class TileGrads, class StoreDs, class DsReady, class IssueDq, class ReduceDq>
__device__ __forceinline__ void bwd_schedule_lockstep(const BwdSmemAddr<K>& sm, uint8_t* smem_gen, const BwdThread& th,
                                                      const BwdUnit& u, int& cnt, float (&dk)[K::HD / 2],
                                                      float (&dv)[K::HD / 2], int window, TileGrads& tile_grads,
                                                      StoreDs& store_ds, DsReady& ds_ready, IssueDq& issue_dq,
                                                      ReduceDq& reduce_dq) {
    constexpr int BQ = K::BQ, STAGES = K::STAGES, N = K::DQ_N;
    const int lane = th.lane, kw0 = u.kv0 + th.wg * 64;  // this warpgroup's first key
    const uint32_t base = sm.base;
    const int kv0 = u.kv0, kvh = u.kvh, b = u.b, group = u.group, n_qt = u.n_qt, it_begin = u.it_begin,
              it_end = u.it_end;
    // Both warpgroups meet at one barrier a tile (dS^T written), then dQ.
    for (int it = it_begin; it < it_end; it++, cnt++) {
        const int s = cnt % STAGES, h = kvh * group + it / n_qt, i0 = kv0 + (it % n_qt) * BQ;
        const uint32_t sdS = base + sm.OFF_DS + (cnt & 1) * K::DS_BYTES;
        const float* rows = reinterpret_cast<const float*>(smem_gen + (sm.rows(s) - base));
        float st[BQ / 2], dpt[BQ / 2], dq[N / 2];
        uint32_t pf[BQ / 16][4], dsf[BQ / 16][4];
        // skip_masked: none of this warpgroup's keys kw0 .. kw0 + 63 visible to the tile's queries
        const bool live = !K::SKIP_MASKED || any_visible(i0, i0 + BQ - 1, kw0, kw0 + 63, window);
        mbar_wait(sm.full(s), (cnt / STAGES) & 1);
        if (live) {
            tile_grads(st, dpt, pf, dsf, s, rows, i0);
        } else {
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++)
#pragma unroll
                for (int e = 0; e < 4; e++) pf[kk][e] = 0u, dsf[kk][e] = 0u;
        }
        store_ds(dsf, sdS);
        ds_ready();
        wgmma_fence();
        issue_dq(dq, sdS);
        wgmma_wait<0>();
        fence_regs(dq), fence_regs(dv), fence_regs(dk), fence_regs(pf), fence_regs(dsf);
        __syncwarp();                             // every lane's reads of lse2, D before the release
        if (lane == 0) mbar_arrive(sm.empty(s));  // Q, dO, lse2, D of this stage are free
        reduce_dq(dq, h, i0, b);
    }
}

// The consumer main loop of one unit u (item j of the CTA; cnt counts the CTA's query tiles): the
// per-tile helpers, then the tiles on the configuration's schedule between K and V's wait and release.
// dk, dv accumulate.
template <class K>
__device__ __forceinline__ void bwd_mainloop(const BwdSmemAddr<K>& sm, uint8_t* smem_gen, const BwdThread& th,
                                             const CUtensorMap* dq_map, int j, const BwdUnit& u, int& cnt,
                                             float (&dk)[K::HD / 2], float (&dv)[K::HD / 2], int T, const QKVLayout& L,
                                             int window) {
    constexpr int HD = K::HD, BQ = K::BQ, BKV = K::BKV;
    const int wg = th.wg, w = th.w, lane = th.lane, g = th.g, t4 = th.t4;
    const float sl2 = th.sl2;
    const uint32_t base = sm.base, sK = sm.sK, sV = sm.sV;
    constexpr int N = K::DQ_N;
    const int r0 = th.r0, c0 = th.c0;
    const bool dq_issuer = th.dq_issuer;
    const int kw0 = u.kv0 + wg * 64;                 // this warpgroup's first key
    const int key0 = kw0 + w * 16 + g;               // the thread's keys: key0 and key0 + 8

    // S^T = K Q^T, dP^T = V dO^T for stage s, two commit groups: HD/16 k-steps, 32 bytes apart inside
    // a 64-column panel.
    auto issue_kt = [&](float (&acc)[BQ / 2], uint32_t a, uint32_t bt) {  // acc = A (this wg's 64 rows) B^T
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            const uint32_t aoff = (kk / 4) * BKV * 128 + wg * 64 * 128 + (kk % 4) * 32, boff = (kk / 4) * BQ * 128 + (kk % 4) * 32;
            wgmma_ss<BQ>(acc, smem_desc(a + aoff, 16, 1024), smem_desc(bt + boff, 16, 1024), kk > 0);
        }
        wgmma_commit();
    };
    auto issue_s_dp = [&](float (&st)[BQ / 2], float (&dpt)[BQ / 2], int s) {
        issue_kt(st, sK, sm.q(s));
        issue_kt(dpt, sV, sm.dout(s));
    };
    // P^T = exp2(S^T * scale * log2 e - lse2) in place; only tiles crossing the diagonal, the window's
    // edge for this warpgroup's 64 keys, or T mask.
    auto probabilities = [&](float (&st)[BQ / 2], const float* rows, int i0, int kw0, int key0) {
        const bool edge = i0 < kw0 + 63 || (window > 0 && i0 + BQ - 1 - kw0 >= window) || i0 + BQ > T;
#pragma unroll
        for (int nb = 0; nb < BQ / 8; nb++) {
            const float2 l2 = *reinterpret_cast<const float2*>(rows + BQ + nb * 8 + 2 * t4);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(fmaf(st[nb * 4 + e], sl2, -((e & 1) ? l2.y : l2.x)));
                const int q = i0 + nb * 8 + 2 * t4 + (e & 1);
                if (edge && (q >= T || !attends(q, key0 + 8 * (e >> 1), window))) p = 0.0f;
                st[nb * 4 + e] = p;
            }
        }
    };
    // DOC: P^T = 0 where a key lies before its query's document start; only tiles where some query's
    // start passes this warpgroup's first key (the tile's doc_start from smem, its last row below T
    // the highest; rows past T hold another sequence's starts or zeros, and probabilities zeroed them).
    // A pass of its own, so that the unmasked kernel's probabilities stay as they are.
    auto doc_mask = [&](float (&st)[BQ / 2], const float* rows, int i0, int kw0, int key0) {
        const int* docs = reinterpret_cast<const int*>(rows + 2 * BQ);
        if (docs[min(BQ, T - i0) - 1] <= kw0) return;
#pragma unroll
        for (int nb = 0; nb < BQ / 8; nb++) {
            const int2 d2 = *reinterpret_cast<const int2*>(docs + nb * 8 + 2 * t4);
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (key0 + 8 * (e >> 1) < ((e & 1) ? d2.y : d2.x)) st[nb * 4 + e] = 0.0f;
        }
    };
    // dS^T = P^T (dP^T - D) in place of dP^T.
    auto dscores = [&](float (&dpt)[BQ / 2], const float (&st)[BQ / 2], const float* rows) {
#pragma unroll
        for (int nb = 0; nb < BQ / 8; nb++) {
            const float2 d2 = *reinterpret_cast<const float2*>(rows + nb * 8 + 2 * t4);
#pragma unroll
            for (int e = 0; e < 4; e++) dpt[nb * 4 + e] = st[nb * 4 + e] * (dpt[nb * 4 + e] - ((e & 1) ? d2.y : d2.x));
        }
    };
    // dV += P^T dO, dK += dS^T Q (one commit group): BQ/16 k-steps of 16 queries (2 KB apart); the
    // B operands' panels BQ * 128 bytes apart.
    auto issue_dv_dk = [&](float (&dv)[HD / 2], float (&dk)[HD / 2], const uint32_t (&pf)[BQ / 16][4],
                           const uint32_t (&dsf)[BQ / 16][4], int s) {
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_rs<HD>(dv, pf[kk], smem_desc(sm.dout(s) + kk * 16 * 128, BQ * 128, 1024));
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_rs<HD>(dk, dsf[kk], smem_desc(sm.q(s) + kk * 16 * 128, BQ * 128, 1024));
        wgmma_commit();
    };
    // dS^T (keys x queries, bf16) into smem, the A fragments' four pieces; then the proxy fence (the
    // dQ wgmma reads it through the async proxy).
    auto store_ds = [&](const uint32_t (&dsf)[BQ / 16][4], uint32_t sdS) {
        uint8_t* ds = smem_gen + (sdS - base);
        const int r = wg * 64 + w * 16 + g;
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            const int c = kk * 16 + 2 * t4;
            *reinterpret_cast<uint32_t*>(ds + panel_offset<BKV>(r, c)) = dsf[kk][0];
            *reinterpret_cast<uint32_t*>(ds + panel_offset<BKV>(r + 8, c)) = dsf[kk][1];
            *reinterpret_cast<uint32_t*>(ds + panel_offset<BKV>(r, c + 8)) = dsf[kk][2];
            *reinterpret_cast<uint32_t*>(ds + panel_offset<BKV>(r + 8, c + 8)) = dsf[kk][3];
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    };
    // This warpgroup's dQ (64 rows x N columns) = dS K over all BKV keys (one commit group): A = dS^T
    // read MN-major (k-steps of 16 keys, 2 KB apart; BQ 128: this warpgroup's queries are panel wg),
    // B = K read MN-major (64-column panels BKV * 128 bytes apart; at BQ 64, HD 64 the N = 32 columns
    // of warpgroup 1 start 64 bytes into the panel's rows).
    auto issue_dq = [&](float (&dq)[N / 2], uint32_t sdS) {
        const uint32_t arow = sdS + (r0 / 64) * BKV * 128, kcol = sK + (c0 / 64) * BKV * 128 + (c0 % 64) * 2;
#pragma unroll
        for (int kk = 0; kk < BKV / 16; kk++)
            wgmma_ss<N, 1, 1>(dq, smem_desc(arow + kk * 16 * 128, BKV * 128, 1024),
                              smem_desc(kcol + kk * 16 * 128, BKV * 128, 1024), kk > 0);
        wgmma_commit();
    };
    // dq into dq_accum rows i0.. < T of head h: through this warpgroup's smem boxes and the TMA.
    auto reduce_dq = [&](const float (&dq)[N / 2], int h, int i0, int b) {
        uint8_t* boxes = smem_gen + sm.OFF_DQ + wg * (N / 32) * K::DQ_BOX_BYTES;  // N/32 boxes of 64 x 32
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int nb = 0; nb < N / 8; nb++)
                *reinterpret_cast<float2*>(boxes + (nb / 4) * K::DQ_BOX_BYTES +
                                           dq_box_offset(w * 16 + g + 8 * r, (nb % 4) * 8 + 2 * t4)) =
                    make_float2(dq[nb * 4 + 2 * r], dq[nb * 4 + 2 * r + 1]);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_sync_warpgroup(BWD_BAR_DQ_BOXES + wg);  // the warpgroup's boxes are written
        if (dq_issuer) {
#pragma unroll
            for (int bx = 0; bx < N / 32; bx++)
                tma_reduce_add(dq_map, base + sm.OFF_DQ + (wg * (N / 32) + bx) * K::DQ_BOX_BYTES,
                               h * HD + c0 + bx * 32, i0 + r0, b);
            bulk_commit();
        }
    };
    // Both warpgroups' dS^T rows are in smem, and the last reduction has read the boxes this warpgroup
    // will overwrite.
    auto ds_ready = [&] {
        if (dq_issuer) bulk_wait_read<0>();
        named_sync(BWD_BAR_DS_READY);
    };

    // One query tile's gradients (stage s, queries i0.., its D and lse2 at rows) up to the dV/dK wgmmas,
    // issued and not waited for; P^T while dP^T is still on the tensor cores.
    auto tile_grads = [&](float (&st)[BQ / 2], float (&dpt)[BQ / 2], uint32_t (&pf)[BQ / 16][4],
                          uint32_t (&dsf)[BQ / 16][4], int s, const float* rows, int i0) {
        wgmma_fence();
        issue_s_dp(st, dpt, s);
        wgmma_wait<1>();  // S^T done
        fence_regs(st);
        probabilities(st, rows, i0, kw0, key0);
        if constexpr (K::DOC) doc_mask(st, rows, i0, kw0, key0);
        wgmma_wait<0>();
        fence_regs(dpt);
        dscores(dpt, st, rows);
        pack_p<BQ>(pf, st);
        pack_p<BQ>(dsf, dpt);
        wgmma_fence();
        issue_dv_dk(dv, dk, pf, dsf, s);
    };

    mbar_wait(sm.kv_full, j & 1);
    if constexpr (K::LATE_DQ)
        bwd_schedule_late_dq<K>(sm, smem_gen, th, u, cnt, dk, dv, tile_grads, store_ds, issue_dq, reduce_dq);
    else bwd_schedule_lockstep<K>(sm, smem_gen, th, u, cnt, dk, dv, window, tile_grads, store_ds, ds_ready, issue_dq,
                                  reduce_dq);
    if (lane == 0) mbar_arrive(sm.kv_empty);  // every wgmma reading K, V has completed
}

// The epilogue of one unit: dK = scale * dS^T Q, dV as bf16 pairs from the accumulators into dqkv (the
// thread's keys < T); under the split schedule added into dkv_accum by red.global.add.v2.f32 instead.
template <class K>
__device__ __forceinline__ void bwd_epilogue(bf16* dqkv, float* dkv_accum, const BwdThread& th, int kv0, int kvh,
                                             int b, const float (&dk)[K::HD / 2], const float (&dv)[K::HD / 2],
                                             int T, const QKVLayout& L) {
    constexpr int HD = K::HD;
    const int key0 = kv0 + th.wg * 64 + th.w * 16 + th.g, t4 = th.t4;
    const float scale = th.scale;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + 8 * r;
        if (key >= T) continue;
        if constexpr (K::SPLIT) {
            const int kv_cols = L.NKV * HD;
            float* dst = dkv_accum + ((size_t)b * T + key) * 2 * kv_cols + kvh * HD + 2 * t4;
#pragma unroll
            for (int nd = 0; nd < HD / 8; nd++) {
                red_add_v2(dst + nd * 8, dk[nd * 4 + 2 * r] * scale, dk[nd * 4 + 2 * r + 1] * scale);
                red_add_v2(dst + kv_cols + nd * 8, dv[nd * 4 + 2 * r], dv[nd * 4 + 2 * r + 1]);
            }
        } else {
            bf16* dst = dqkv + ((size_t)b * T + key) * L.row();
#pragma unroll
            for (int nd = 0; nd < HD / 8; nd++) {
                const int c = nd * 8 + 2 * t4;
                *reinterpret_cast<uint32_t*>(dst + L.k_col(kvh) + c) =
                    pack_bf16(dk[nd * 4 + 2 * r] * scale, dk[nd * 4 + 2 * r + 1] * scale);
                *reinterpret_cast<uint32_t*>(dst + L.v_col(kvh) + c) = pack_bf16(dv[nd * 4 + 2 * r], dv[nd * 4 + 2 * r + 1]);
            }
        }
    }
}

// A consumer warpgroup over the CTA's items: the main loop, the epilogue.
template <class K>
__device__ __forceinline__ void bwd_consumer(const BwdSmemAddr<K>& sm, uint8_t* smem_gen, const BwdTileScheduler<K>& sched,
                                             int warp, int lane, bf16* dqkv, float* dkv_accum, const CUtensorMap* dq_map,
                                             int T, const QKVLayout& L, int window) {
    constexpr int HD = K::HD;
    // warpgroup index through a shuffle from lane 0: provably warp-uniform (see attention_hopper.cuh)
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0) - 1, w = warp % 4;
    const float scale = rsqrtf((float)HD);
    constexpr int N = K::DQ_N;
    const BwdThread th{wg,       w, lane, lane >> 2, lane & 3, scale, scale * LOG2E, K::DQ_ROWS ? wg * 64 : 0,
                       K::DQ_ROWS ? 0 : wg * N, threadIdx.x % 128 == 0};
    const int group = sched.group;

    int cnt = 0, j = 0;
    for (int i = blockIdx.x; i < sched.n_items; i += gridDim.x, j++) {
        int kv0, kvh, b, n_qt, it_begin, it_end;
        sched.decode(i, kv0, kvh, b, n_qt, it_begin, it_end);
        if constexpr (K::DOC) {  // the producer's count (doc_query_tiles), with this unit's K and V
            mbar_wait(sm.kv_full, j & 1);
            n_qt = *reinterpret_cast<volatile const int*>(smem_gen + BwdSmemAddr<K>::OFF_UNIT_QT);
            it_end = group * n_qt;
        }
        float dk[HD / 2], dv[HD / 2];
#pragma unroll
        for (int k = 0; k < HD / 2; k++) dk[k] = 0.0f, dv[k] = 0.0f;
        bwd_mainloop<K>(sm, smem_gen, th, dq_map, j, BwdUnit{kv0, kvh, b, group, n_qt, it_begin, it_end}, cnt, dk, dv, T,
                        L, window);
        bwd_epilogue<K>(dqkv, dkv_accum, th, kv0, kvh, b, dk, dv, T, L);
    }
    if (th.dq_issuer) bulk_wait<0>();  // the smem boxes stay until the last reduction has completed
}

// ============================================================================ the kernel
// grid: min(units, SMs) CTAs striding over the units (BwdTileScheduler); THREADS threads;
// bwd_smem_bytes() of smem. Warps 0-3 the producer, 4-11 the consumers. dkv_accum: nullptr, or
// (chunk > 0) the split schedule's fp32 dK, dV sums, zeroed. DOC: doc_start (B, T), also read through
// doc_map (doc_rows_map); else both unused.
template <class Config, bool SPLIT, bool DOC = false>
__global__ void __launch_bounds__(HopperBwd<Config>::THREADS, 1)
    attention_backward_wgmma(bf16* dqkv, const __grid_constant__ CUtensorMap qkv_map,
                             const __grid_constant__ CUtensorMap dout_map, const __grid_constant__ CUtensorMap dq_map,
                             const __grid_constant__ CUtensorMap rows_map, float* dkv_accum, int B, int T, QKVLayout L,
                             int window, int chunk, const __grid_constant__ CUtensorMap doc_map, const int* doc_start) {
#if LLMC_SM90A_DEVICE
    using K = HopperBwd<Config, SPLIT, DOC>;
    constexpr int STAGES = K::STAGES;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = smem_addr(smem_raw);
    const BwdSmemAddr<K> sm((raw + 1023) & ~1023u);
    uint8_t* smem_gen = smem_raw + (sm.base - raw);  // generic pointer to the base
    const BwdTileScheduler<K> sched(B, T, L, window, chunk, doc_start);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;

    if (threadIdx.x == 0) {
        // full: the producer's expect_tx; empty: one arrival a consumer warp
        for (int s = 0; s < STAGES; s++) mbar_init(sm.full(s), 1), mbar_init(sm.empty(s), 8);
        mbar_init(sm.kv_full, 1), mbar_init(sm.kv_empty, 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp < 4) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(K::PRODUCER_REGS));
        if (threadIdx.x == 0) bwd_producer<K>(sm, sched, &qkv_map, &dout_map, &rows_map, &doc_map, L);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(K::CONSUMER_REGS));
    bwd_consumer<K>(sm, smem_gen, sched, warp, lane, dqkv, dkv_accum, &dq_map, T, L, window);
#else
    __trap();
#endif
}

// dq_accum (B, T, NH * HD) fp32, reduced into in boxes of 32 columns x 64 rows (128 bytes a row, the
// 128B swizzle); rows past T are out of bounds, so never written.
inline CUtensorMap dq_accum_map(const float* ptr, int B, int T, int row) {
    const cuuint64_t dims[3] = {(cuuint64_t)row, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t strides[2] = {(cuuint64_t)row * 4, (cuuint64_t)T * row * 4};
    const cuuint32_t box[3] = {32, 64, 1};
    return encode_tensor_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, ptr, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

// D and lse2 in the scratch as one tensor (Tp, B * NH, 2), boxes of BQ x 1 x 2 (a query tile's D, then
// its lse2); a box of 128 may pass Tp, and those elements come in as zeros (queries past T, masked).
inline CUtensorMap rows_map(const float* scratch, int B, int T, int NH, int HD, int BQ) {
    const int Tp = attention_padded_T(T);
    const cuuint64_t dims[3] = {(cuuint64_t)Tp, (cuuint64_t)B * NH, 2};
    const cuuint64_t strides[2] = {(cuuint64_t)Tp * 4, (cuuint64_t)B * NH * Tp * 4};
    const cuuint32_t box[3] = {(cuuint32_t)BQ, 1, 2};
    return encode_tensor_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, scratch + (size_t)B * T * NH * HD, dims, strides, box,
                             CU_TENSOR_MAP_SWIZZLE_NONE);
}

// doc_start (B, T) int32 as one run of B * T, boxes of BQ (a query tile's; past a sequence's end the
// next one's, past the last zeros): one dimension, so T needs no alignment.
inline CUtensorMap doc_rows_map(const int* doc_start, int B, int T, int BQ) {
    const cuuint64_t dims[1] = {(cuuint64_t)B * T}, no_strides[1] = {0};
    const cuuint32_t box[1] = {(cuuint32_t)BQ};
    return encode_tensor_map(CU_TENSOR_MAP_DATA_TYPE_INT32, 1, doc_start, dims, no_strides, box, CU_TENSOR_MAP_SWIZZLE_NONE);
}

// Epilogue of the split schedule: every column of dqkv, dQ = scale * dq_accum (B, T, NH * HD), dK and
// dV from dkv_accum (B, T, 2 * NKV * HD, dK already scaled). One thread per 8 values.
template <int HD>
__global__ void __launch_bounds__(256) attention_backward_dqkv_store(bf16* dqkv, const float* dq_accum,
                                                                     const float* dkv_accum, int B, int T, QKVLayout L) {
    const int per_row = L.row() / 8, q_cols = L.NH * HD;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * per_row) return;
    const size_t bt = idx / per_row;
    const int c = (int)(idx % per_row) * 8;
    const bool q = c < q_cols;
    const float scale = q ? rsqrtf((float)HD) : 1.0f;
    const float* src = q ? dq_accum + bt * q_cols + c : dkv_accum + bt * (L.row() - q_cols) + (c - q_cols);
    const f128 lo = load128cs(src), hi = load128cs(src + 4);
    Packed128<bf16> r;
#pragma unroll
    for (int k = 0; k < 4; k++) r[k] = from_float<bf16>(lo[k] * scale), r[k + 4] = from_float<bf16>(hi[k] * scale);
    store128(dqkv + bt * L.row() + c, r);
}

// The split schedule's chunk for a shape, 0 for whole items. Where the whole items are fewer than the
// SMs, the smallest chunk whose units fit in one wave, if it cuts the longest unit by SPLIT_MIN_GAIN
// tiles: about the cost of a unit's K, V load and its dK, dV reductions (an estimate).
constexpr int SPLIT_MIN_GAIN = 2;
template <class K>
inline int bwd_split_chunk(const AttnShape& s, int sms) {
    const int B = s.B, T = s.T, window = s.window, group = s.NH / s.NKV, n_kt = ceil_div(T, K::BKV);
    if ((long)n_kt * s.NKV * B >= sms) return 0;
    int longest = 0;
    for (int kv0 = 0; kv0 < T; kv0 += K::BKV) longest = std::max(longest, group * bwd_query_tiles<K::BKV, K::BQ>(kv0, T, window));
    int lo = 1, hi = longest;  // units at chunk `longest` are the whole items: they fit
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if ((long)bwd_split_units<K::BKV, K::BQ>(T, window, group, mid) * s.NKV * B <= sms) hi = mid;
        else lo = mid + 1;
    }
    return lo + SPLIT_MIN_GAIN <= longest ? lo : 0;
}

// The launches. scratch: attention_backward_scratch_floats(s) floats, any contents; with scratch_floats
// >= attention_backward_scratch_floats_split(s, ctx) the kernel may take the split schedule.
// keep_dq: on the whole-item schedule, the dQ store is skipped and dQ stays unscaled in scratch's
// dq_accum (dqkv's query columns unwritten); returns whether it did. s.doc_start: the DOC kernel, on
// whole items.
template <class Config>
inline bool backward_hopper(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                            const float* lse, const AttnShape& s, const CudaContext& ctx, size_t scratch_floats = 0,
                            bool keep_dq = false) {
    using K = HopperBwd<Config>;
    constexpr int HD = K::HD, smem = bwd_smem_bytes<K>();
    static_assert(smem <= 227 * 1024, "one CTA's smem");
    ctx.allow_smem(attention_backward_wgmma<Config, false>, smem);
    ctx.allow_smem(attention_backward_wgmma<Config, true>, smem);
    constexpr int smem_doc = bwd_smem_bytes<HopperBwd<Config, false, true>>();
    static_assert(smem_doc <= 227 * 1024, "one CTA's smem");
    ctx.allow_smem(attention_backward_wgmma<Config, false, true>, smem_doc);
    const int B = s.B, T = s.T, window = s.window;
    const bool doc = s.doc_start != nullptr;
    const QKVLayout L = qkv_layout(s);
    cudaStream_t stream = ctx.stream;
    const CUtensorMap qkv_map = token_rows_map(qkv, B, T, L.row()), dout_map = token_rows_map(dout, B, T, L.NH * HD);
    const CUtensorMap dq_map = dq_accum_map(scratch, B, T, L.NH * HD);
    const CUtensorMap r_map = rows_map(scratch, B, T, L.NH, HD, K::BQ);
    const size_t threads = (size_t)B * T * L.NH * HD / 8;
    const int n_kt = ceil_div(T, K::BKV), items = n_kt * L.NKV * B, sms = ctx.sm_count;
    const size_t base_floats = attention_backward_scratch_floats(s);
    // the split schedule where it helps and the scratch has dkv_accum (B, T, 2 * NKV * HD) after the rest
    const size_t dkv_floats = (size_t)B * T * 2 * L.NKV * HD;
    const int chunk = !doc && scratch_floats >= base_floats + dkv_floats ? bwd_split_chunk<K>(s, sms) : 0;
    float* dkv_accum = chunk > 0 ? scratch + base_floats : nullptr;
    if (dkv_accum) cudaCheck(cudaMemsetAsync(dkv_accum, 0, dkv_floats * sizeof(float), stream));
    attention_backward_prologue<HD><<<(unsigned)ceil_div<size_t>(threads, 256), 256, 0, stream>>>(scratch, dout, out,
                                                                                                 lse, B, T, L.NH);
    cudaCheckLaunch();
    // one CTA an SM; whole items: the grid a multiple of the key tiles where it can be; split: every
    // unit its CTA (bwd_split_chunk keeps them within the SMs)
    const int units = chunk > 0 ? bwd_split_units<K::BKV, K::BQ>(T, window, L.NH / L.NKV, chunk) * L.NKV * B : items;
    const int grid = units <= sms ? units : n_kt <= sms ? sms / n_kt * n_kt : sms;
    auto kernel = doc         ? attention_backward_wgmma<Config, false, true>
                  : chunk > 0 ? attention_backward_wgmma<Config, true>
                              : attention_backward_wgmma<Config, false>;
    const CUtensorMap doc_map = doc ? doc_rows_map(s.doc_start, B, T, K::BQ) : CUtensorMap{};
    kernel<<<grid, K::THREADS, doc ? smem_doc : smem, stream>>>(dqkv, qkv_map, dout_map, dq_map, r_map, dkv_accum, B, T,
                                                                L, window, chunk, doc_map, s.doc_start);
    cudaCheckLaunch();
    if (dkv_accum) {
        const size_t all = (size_t)B * T * L.row() / 8;
        attention_backward_dqkv_store<HD><<<(unsigned)ceil_div<size_t>(all, 256), 256, 0, stream>>>(
            dqkv, scratch, dkv_accum, B, T, L);
        cudaCheckLaunch();
        return false;
    }
    if (keep_dq) return true;
    dq_store(dqkv, scratch, B, T, L, stream);
    return false;
}

// The shipped configurations (budget in the header comment; dev/cuda/attention_backward.cu times the
// others). HD 128: the late dQ is within noise and spills; skip_masked wins with a window, loses without.
template <int HD>
struct HopperBwdShipped;
template <>
struct HopperBwdShipped<64> {
    static constexpr int head_dim = 64, q_tile = 128, stages = 2;
    static constexpr bool late_dq = true, skip_masked = false;
};
template <>
struct HopperBwdShipped<128> {
    static constexpr int head_dim = 128, q_tile = 64, stages = 2;
    static constexpr bool late_dq = false, skip_masked = false;
};
}  // namespace attention_hopper_detail
#endif  // LLMC_SM90A

// The shapes the wgmma backward takes: every unmasked one; document-masked ones (the DOC kernel) at HD 64
// with T a multiple of 4 (each query tile's doc_start box then starts 16-byte aligned in global memory).
// The policy (attention_backward) sends the other document-masked shapes to the mma.sync pair.
inline bool attention_hopper_backward_takes(const AttnShape& s) {
    return !s.doc_start || (s.HD == 64 && s.T % 4 == 0);
}

// FlashAttention backward on wgmma + TMA (dQ by fp32 reductions into scratch: not bit-reproducible);
// bf16, HD 64 or 128, every pointer 16-byte aligned, attention_hopper_backward_takes(s); scratch and
// keep_dq as attention_backward. Only in
// sm_90a builds (attention_hopper_available(ctx)); elsewhere calling it is an error.
inline bool attention_backward_hopper(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                                      const __nv_bfloat16* out, const float* lse, const AttnShape& s,
                                      const CudaContext& ctx, AttnScratch scratch, bool keep_dq = false) {
    using namespace attention_detail;
    check_attention_sizes("attention_backward_hopper", s);
#if defined(LLMC_SM90A)
    using namespace attention_hopper_detail;
    if (!scratch.data) fail("attention_backward_hopper: needs a scratch buffer (attention_backward_scratch_floats)");
    if (!aligned16(dqkv) || !aligned16(dout) || !aligned16(qkv) || !aligned16(out) || !aligned16(scratch.data) ||
        !aligned16(s.doc_start))
        fail("attention_backward_hopper: dqkv, dout, qkv, out, scratch and doc_start must be 16-byte aligned");
    if (!attention_hopper_backward_takes(s))
        fail("attention_backward_hopper: document masking needs HD 64 and T a multiple of 4 (HD %d, T %d)", s.HD, s.T);
    auto run = s.HD == 64 ? backward_hopper<HopperBwdShipped<64>> : backward_hopper<HopperBwdShipped<128>>;
    return run(dqkv, scratch.data, dout, qkv, out, lse, s, ctx, scratch.floats, keep_dq);
#else
    (void)dqkv, (void)dout, (void)qkv, (void)out, (void)lse, (void)ctx, (void)scratch, (void)keep_dq;
    fail("attention_backward_hopper: this build has no sm_90a kernels (GPU_ARCH=90a defines LLMC_SM90A)");
#endif
}
