// attention_hopper_backward.cuh: the attention backward for Hopper (sm_90a): FlashAttention-3's
// structure on wgmma, Q/dO tiles brought in by the TMA copy engine, a producer warp and two consumer
// warpgroups. Same function as attention_backward_flash with a scratch buffer (llmc/attention.cuh):
// causal, GQA, optional sliding window, HD 64 or 128, any T; bf16 operands, fp32 accumulation.
//
// Shapes (those of attention.cuh):
//   qkv, dqkv (B, T, (NH + 2*NKV) * HD)  qkv read through one 3-D TMA tensor map (columns, T, B): rows
//                                        past T come in as zeros; dqkv written with `=`
//   dout (B, T, NH * HD)                 read through a second tensor map of the same kind
//   scratch                              attention_backward_scratch_floats(B, T, NH, HD) floats, the
//                                        single-pass mma backward's layout: dq_accum (B, T, NH, HD),
//                                        D (B, NH, Tp), lse2 = lse * log2(e) (B, NH, Tp), Tp = T
//                                        rounded up to 64 (zeros past T)
// Three launches, as backward_flash_atomic: attention_backward_prologue (D, lse2, zeroed dq_accum),
// the wgmma kernel below, attention_backward_dq_store (dQ = scale * dq_accum into dqkv). dK and dV are
// summed over the GQA group in registers (deterministic); dQ by fp32 reductions (not bit-reproducible).
//
// Tile budget (work item = a 128-key tile of one kv head of one sequence; one CTA an SM striding over
// the items, the key tiles of one (kv head, sequence) side by side so that the CTAs running at one
// time share Q, dO and dq_accum rows in L2, a long causal key tile paired with a short one per CTA):
//   warp 0       producer (setmaxnreg.dec to 40 registers, 24 at HD 64): one thread issues the TMA of K,
//                V (once an item) and of Q, dO, and the tile's D and lse2 (one box of BQ x 2 floats
//                through a tensor map over their 64-padded rows in the scratch; zeros past T) per query
//                tile of BQ = 128 queries at HD 64, 64 at HD 128.
//   warps 4-11   two consumer warpgroups (232 registers, 240 at HD 64; no spills), 64 keys each; per
//                query tile: S^T = K Q^T and dP^T = V dO^T (wgmma m64nBQk16, both from smem, K-major),
//                P^T = exp2(S^T * scale * log2 e - lse2), dS^T = P^T (dP^T - D) in registers;
//                dV += P^T dO and dK += dS^T Q (wgmma m64nHDk16, A = P^T / dS^T repacked to bf16 A
//                fragments in registers, B = dO / Q through the MN-major descriptor): dK, dV (HD/2 + HD/2
//                fp32 a thread) stay in registers for the whole item; dS^T also goes to smem (bf16,
//                swizzled like a TMA tile) for dQ = dS K (A = dS^T read MN-major, B = K read MN-major)
//                over all 128 keys after one named barrier (both halves of dS^T written): at HD 64 each
//                warpgroup its own 64 query rows (m64n64), at HD 128 HD/2 columns of all 64 (m64n64);
//                dQ is staged in smem and added into dq_accum by the TMA (cp.reduce.async.bulk.tensor;
//                red.global.add.v2.f32 from registers is the configurable alternative).
//   smem         K, V (128 x HD, resident for the item), 2 stages of Q, dO (BQ x HD) and of D, lse2 (BQ
//                floats), two dS^T tiles (128 x BQ bf16, alternating so one barrier a tile suffices), the
//                dQ boxes (BQ x HD fp32): HD 64: 32 + 64 + 64 + 32 KB + 2 KB = 194 KB; HD 128: 64 + 64 +
//                32 + 32 KB + 1 KB = 193 KB.
// FLOPs: 5 matmuls, 10 * HD per visible pair (plus the masked parts of diagonal and window-edge tiles);
// bytes: K, V once, Q and dO once per key tile (from L2 with the work order above), BQ * HD * 4 bytes
// of dQ reductions per (key tile, query tile). Issue- and latency-bound as it stands: the two consumer
// warpgroups meet at the dS^T barrier every tile, so their softmax phases coincide and the tensor cores
// idle meanwhile (ncu at gpt2 before the L2 order: 32% issue slots busy, 0.44 eligible warps a scheduler).
// Measured (H200, dev/cuda/attention_backward.cu variant 11 = this kernel as shipped, TFLOP/s, cuDNN 9
// in the same run, uncommitted change on 21d76fb): gpt2 221.1 vs 243.0 (0.91x), gqa 243.0 vs 227.4
// (1.07x), long 410.3 vs 502.2 (0.82x), window 159.3 vs 189.8; the previous HD 64 configuration (BQ
// 64, red.add; lab variant 12) 194.0 / 207.5 at gpt2 / gqa in that run; the mma.sync backward 164..176.
// Shipped since at HD 64 (DELAY_DQ 2 below, lab variant 16; same run as the BQ 128 kernel alone at
// 221.5 / 243.7 / 411.4): dQ one query tile late, the warpgroups no longer in lockstep: gpt2 233.0
// (0.95x cuDNN), gqa 265.8 (1.16x); at HD 128 417.4, within noise, so HD 128 keeps the lockstep.
// What each step bought, what was dropped, and racecheck: that file's header.
// Internal part of llmc/attention.cuh, included from there only (it uses QKVLayout, the single-pass mma
// backward's prologue, dq_store, scratch layout and helpers, and the Hopper building blocks of
// attention_hopper_common.cuh); include llmc/attention.cuh.
#pragma once

#if defined(LLMC_SM90A)
namespace attention_hopper_detail {
using namespace attention_detail;

// HD columns; STAGES query tiles (Q, dO, lse2, D) in flight; DQ_TMA: dQ goes through smem (fp32,
// 32-column boxes, 128B swizzle) and the TMA adds it into dq_accum (cp.reduce.async.bulk.tensor)
// instead of red.global.add.v2.f32 from registers; BQ queries a tile (128 only at HD 64: S^T and dP^T
// take 64 + 64 accumulators beside dK, dV's 32 + 32); BQ 128 splits dQ by query rows (each consumer
// warpgroup its own 64 rows, all HD columns: wgmma m64nHD) where BQ 64 splits it by columns (HD/2 of
// all 64 rows: m64n(HD/2)).
// DELAY_DQ (lab): dQ of query tile n is issued in tile n + 1 and the two warpgroups hand dS^T over
// through split arrive / sync named barriers (4..7) instead of meeting at one barrier a tile (see the
// kernel): 1 issues it after tile n + 1's S^T, dP^T, so it runs under that tile's softmax (its
// accumulators live beside S^T, dP^T, dK, dV: spills at BQ 128 and HD 128); 2 after tile n + 1's
// dV/dK (beside dK, dV and the bf16 P^T, dS^T only, as today's dQ).
template <int HD_, int STAGES_, bool DQ_TMA_, int BQ_ = 64, int DELAY_DQ_ = 0>
struct HopperBwdCfg {
    static constexpr int HD = HD_, BKV = 128, BQ = BQ_, STAGES = STAGES_, THREADS = 384;
    static constexpr bool DQ_TMA = DQ_TMA_, DQ_ROWS = BQ == 128;
    static constexpr int DELAY_DQ = DELAY_DQ_;
    // setmaxnreg: the producer warpgroup gives registers to the consumers, within the 168 x 384 the CTA
    // got at launch (an inc past that pool waits forever: 32 / 240 hung). BQ 128 spills one value at
    // 232, so 24 / 240 there (the one-thread producer no longer spills at 24).
    // DELAY_DQ (lab): 24 / 240 too (dQ's accumulators beside dV/dK's in flight).
    static constexpr bool BIG_CONSUMERS = BQ == 128 || DELAY_DQ_ != 0;
    static constexpr int PRODUCER_REGS = BIG_CONSUMERS ? 24 : 40, CONSUMER_REGS = BIG_CONSUMERS ? 240 : 232;
    static constexpr int DQ_N = DQ_ROWS ? HD : HD / 2;  // dQ columns a consumer warpgroup computes
    static constexpr int KV_BYTES = BKV * HD * 2, Q_BYTES = BQ * HD * 2, DS_BYTES = BKV * BQ * 2;
    static constexpr int ROWS_BYTES = 2 * BQ * 4, DQ_BOX_BYTES = 64 * 32 * 4;  // D + lse2 of a tile; a dQ box
    // byte offsets from the 1024-aligned base; every tile 1024-aligned (the 128B swizzle's period)
    static constexpr int OFF_K = 0, OFF_V = KV_BYTES, OFF_Q = 2 * KV_BYTES, OFF_DO = OFF_Q + STAGES * Q_BYTES,
                         OFF_DS = OFF_DO + STAGES * Q_BYTES, OFF_DQ = OFF_DS + 2 * DS_BYTES,
                         OFF_ROWS = OFF_DQ + (DQ_TMA ? BQ * HD * 4 : 0), OFF_BARS = OFF_ROWS + STAGES * ROWS_BYTES;
    static constexpr int SMEM = 1024 + OFF_BARS + (2 * STAGES + 2) * 8;  // + slack to align the base
    static_assert(HD == 64 || HD == 128, "HD 64 or 128: whole 64-column panels");
    static_assert(BQ == 64 || (BQ == 128 && HD == 64), "BQ 128 only at HD 64 (registers)");
    static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 168 * THREADS, "setmaxnreg: the CTA's registers");
    static_assert(SMEM <= 227 * 1024, "one CTA's smem");
};

// Byte offset of element (r, c) of a (64 rows x 32 fp32 columns) box in smem with the 128B swizzle.
__device__ __forceinline__ uint32_t dq_box_offset(int r, int c) { return r * 128 + (((c >> 2) ^ (r & 7)) << 4) + (c & 3) * 4; }

// grid: min(work items, SMs) CTAs (a multiple of the key tiles where it can be) striding over the
// items; THREADS threads; Cfg::SMEM bytes of smem.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    attention_backward_wgmma(bf16* dqkv, float* dq_accum_all, const __grid_constant__ CUtensorMap qkv_map,
                             const __grid_constant__ CUtensorMap dout_map, const __grid_constant__ CUtensorMap dq_map,
                             const __grid_constant__ CUtensorMap rows_map, int B, int T, QKVLayout L, int window) {
    constexpr int HD = Cfg::HD, BQ = Cfg::BQ, BKV = Cfg::BKV, STAGES = Cfg::STAGES;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
    uint8_t* smem_gen = smem_raw + (base - raw);  // generic pointer to `base`
    const uint32_t sK = base + Cfg::OFF_K, sV = base + Cfg::OFF_V, bars = base + Cfg::OFF_BARS;
    auto s_q = [&](int s) { return base + Cfg::OFF_Q + s * Cfg::Q_BYTES; };
    auto s_do = [&](int s) { return base + Cfg::OFF_DO + s * Cfg::Q_BYTES; };
    auto s_rows = [&](int s) { return base + Cfg::OFF_ROWS + s * Cfg::ROWS_BYTES; };  // D[BQ], then lse2[BQ]
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (STAGES + s); };
    const uint32_t kv_full = bars + 8 * 2 * STAGES, kv_empty = kv_full + 8;

    const int group = L.NH / L.NKV, C = L.NH * HD, n_kt = ceil_div(T, BKV), n_items = n_kt * L.NKV * B;
    // Item i: (kv head, sequence) i / n_kt, so the CTAs running at one time share their queries' Q, dO
    // and dq_accum rows in L2 (the grid is a multiple of n_kt where it can be); key tile i % n_kt,
    // reversed in odd rounds of the grid so that each CTA's consecutive items pair a long causal key
    // tile with a short one.
    auto decode = [&](int i, int& kv0, int& kvh, int& b) {
        const int hb = i / n_kt, kt = i % n_kt;
        kv0 = ((i / (int)gridDim.x) & 1 ? n_kt - 1 - kt : kt) * BKV, kvh = hb % L.NKV, b = hb / L.NKV;
    };
    auto query_tiles = [&](int kv0) {  // query tiles from kv0 up to the last query that sees a key of the tile
        const int kv_last = min(kv0 + BKV, T) - 1, q_end = window > 0 ? min(T, kv_last + window) : T;
        return ceil_div(q_end - kv0, BQ);
    };
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            // the producer's expect_tx (Q, dO, D, lse2 all by the copy engine); one arrival a consumer warp
            mbar_init(full(s), 1), mbar_init(empty(s), 8);
        }
        mbar_init(kv_full, 1), mbar_init(kv_empty, 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp < 4) {  // ------------------------------------------------ producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Cfg::PRODUCER_REGS));
        if (threadIdx.x == 0) {  // one thread: the waits and the copies (the other lanes have nothing to do)
            int cnt = 0, j = 0;  // query tiles and items so far: ring stage and phase
            for (int i = blockIdx.x; i < n_items; i += gridDim.x, j++) {
                int kv0, kvh, b;
                decode(i, kv0, kvh, b);
                const int n_qt = query_tiles(kv0), n_it = group * n_qt;
                mbar_wait(kv_empty, (j & 1) ^ 1);
                mbar_expect_tx(kv_full, 2 * Cfg::KV_BYTES);
                tma_tile<BKV, HD>(sK, &qkv_map, L.k_col(kvh), kv0, b, kv_full);
                tma_tile<BKV, HD>(sV, &qkv_map, L.v_col(kvh), kv0, b, kv_full);
                for (int it = 0; it < n_it; it++, cnt++) {
                    const int s = cnt % STAGES, h = kvh * group + it / n_qt, i0 = kv0 + (it % n_qt) * BQ;
                    mbar_wait(empty(s), ((cnt / STAGES) & 1) ^ 1);
                    mbar_expect_tx(full(s), 2 * Cfg::Q_BYTES + Cfg::ROWS_BYTES);
                    tma_tile<BQ, HD>(s_q(s), &qkv_map, L.q_col(h), i0, b, full(s));
                    tma_tile<BQ, HD>(s_do(s), &dout_map, h * HD, i0, b, full(s));
                    // D and lse2 of the tile: one box (64 of a padded row, both arrays) of rows_map. Plain
                    // bulk copies did the same, but racecheck reported their smem writes against the
                    // consumers' reads (16 hazards, ordered by the mbarriers); the tensor-map copy's are
                    // tracked like those of Q and dO.
                    tma_load(s_rows(s), &rows_map, i0, b * L.NH + h, 0, full(s));
                }
            }
        }
        return;
    }
    // ------------------------------------------------------------------ consumer warpgroups
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Cfg::CONSUMER_REGS));
    // warpgroup index through a shuffle from lane 0: provably warp-uniform (see attention_hopper.cuh)
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0) - 1, w = warp % 4, g = lane >> 2, t4 = lane & 3;
    const float scale = rsqrtf((float)HD), sl2 = scale * LOG2E;
    // this warpgroup's dQ: rows r0 + [0, 64) of the tile, columns c0 + [0, N)
    constexpr int N = Cfg::DQ_N;
    const int r0 = Cfg::DQ_ROWS ? wg * 64 : 0, c0 = Cfg::DQ_ROWS ? 0 : wg * N;
    const bool dq_issuer = Cfg::DQ_TMA && threadIdx.x % 128 == 0;  // issues its warpgroup's TMA reductions

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
        issue_kt(st, sK, s_q(s));
        issue_kt(dpt, sV, s_do(s));
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
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_rs<HD>(dv, pf[kk], smem_desc(s_do(s) + kk * 16 * 128, BQ * 128, 1024));
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_rs<HD>(dk, dsf[kk], smem_desc(s_q(s) + kk * 16 * 128, BQ * 128, 1024));
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
    // dq into dq_accum rows i0.. < T of head h: through smem boxes and the TMA, or red.global.add.
    auto reduce_dq = [&](const float (&dq)[N / 2], int h, int i0, int b) {
        if constexpr (Cfg::DQ_TMA) {
            uint8_t* boxes = smem_gen + Cfg::OFF_DQ + wg * (N / 32) * Cfg::DQ_BOX_BYTES;  // N/32 boxes of 64 x 32
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int nb = 0; nb < N / 8; nb++)
                    *reinterpret_cast<float2*>(boxes + (nb / 4) * Cfg::DQ_BOX_BYTES +
                                               dq_box_offset(w * 16 + g + 8 * r, (nb % 4) * 8 + 2 * t4)) =
                        make_float2(dq[nb * 4 + 2 * r], dq[nb * 4 + 2 * r + 1]);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");  // the warpgroup's boxes are written
            if (dq_issuer) {
#pragma unroll
                for (int bx = 0; bx < N / 32; bx++)
                    tma_reduce_add(&dq_map, base + Cfg::OFF_DQ + (wg * (N / 32) + bx) * Cfg::DQ_BOX_BYTES,
                                   h * HD + c0 + bx * 32, i0 + r0, b);
                bulk_commit();
            }
        } else {
            float* dst = dq_accum_all + (size_t)b * T * C + (size_t)h * HD + c0;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int q = i0 + r0 + w * 16 + g + 8 * r;
#pragma unroll
                for (int nb = 0; nb < N / 8; nb++)  // predicated, not branched: no divergence near wgmma
                    asm volatile("{\n .reg .pred p;\n setp.lt.s32 p, %3, %4;\n @p red.global.add.v2.f32 [%0], {%1, %2};\n}\n" ::"l"(
                                     dst + (size_t)min(q, T - 1) * C + nb * 8 + 2 * t4),
                                 "f"(dq[nb * 4 + 2 * r]), "f"(dq[nb * 4 + 2 * r + 1]), "r"(q), "r"(T)
                                 : "memory");
            }
        }
    };
    // Both warpgroups' dS^T rows are in smem; and, with the TMA, the last reduction has read the boxes
    // this warpgroup will overwrite.
    auto ds_ready = [&] {
        if (dq_issuer) bulk_wait_read<0>();
        named_sync(1);
    };

    int cnt = 0, j = 0;
    for (int i = blockIdx.x; i < n_items; i += gridDim.x, j++) {
        int kv0, kvh, b;
        decode(i, kv0, kvh, b);
        const int n_qt = query_tiles(kv0), n_it = group * n_qt;
        const int kw0 = kv0 + wg * 64;      // this warpgroup's first key
        const int key0 = kw0 + w * 16 + g;  // the thread's keys: key0 and key0 + 8
        float dk[HD / 2], dv[HD / 2];
#pragma unroll
        for (int k = 0; k < HD / 2; k++) dk[k] = 0.0f, dv[k] = 0.0f;
        mbar_wait(kv_full, j & 1);

        if constexpr (Cfg::DELAY_DQ != 0) {
            // dQ one query tile late. Tile n (cnt, continuous over items) of a warpgroup: issue S^T(n),
            // dP^T(n); [1: sync on the other warpgroup's "dS^T(n-1) written" barrier, issue dQ(n-1)
            // (dS^T buffer (n-1)%2, K); groups complete in commit order: S^T, dP^T, dQ(n-1), so P^T(n)
            // runs beside dQ(n-1)]; P^T, dS^T(n); issue dV/dK(n); [2: the sync, dS^T(n) into buffer
            // n%2, issue dQ(n-1); 1: dS^T(n) into buffer n%2]; wait for all; arrive on "my dS^T(n)
            // written" (id 4 + 2 wg + n%2, 256: this warpgroup arrives, the other syncs); release the
            // stage; reduce dQ(n-1). The arrive comes after the wait, so the other warpgroup, once synced,
            // knows this one's dQ(n-1) (the last reader of buffer (n+1)%2) has completed; its own
            // store of dS^T(n) came after its sync on dS^T(n-1), written after the other's dQ(n-2),
            // the last reader of buffer n%2. So two buffers, and one arrive per barrier id between
            // two syncs of it. The first tile of an item has no dQ(n-1); a tail step after the last
            // issues dQ(last) before K is released. Nothing in flight across the loop's back edge;
            // compile-time flags, not run-time branches, pick the step's shape.
            // the zeros of dK, dV opaque here: the peeled first step would otherwise materialise
            // them between its wgmma_fence and the dV/dK wgmma (ptxas C7519, then C7512)
            fence_regs(dk), fence_regs(dv);
            auto ds_buf = [&](int c) { return base + Cfg::OFF_DS + (c & 1) * Cfg::DS_BYTES; };
            auto mine = [&](int c) { return 4 + 2 * wg + (c & 1); };
            auto other = [&](int c) { return 6 - 2 * wg + (c & 1); };
            auto tile_h = [&](int it) { return kvh * group + it / n_qt; };
            auto tile_i0 = [&](int it) { return kv0 + (it % n_qt) * BQ; };
            auto dq_ready = [&](int c) {  // the other's dS^T(c) rows are in smem (and our boxes read)
                if (dq_issuer) bulk_wait_read<0>();
                named_sync(other(c));
            };
            auto step = [&](auto prev_tag, int it) {
                constexpr bool PREV = decltype(prev_tag)::value;  // dQ of the previous tile to do
                constexpr bool EARLY = PREV && Cfg::DELAY_DQ == 1, LATE = PREV && Cfg::DELAY_DQ == 2;
                const int s = cnt % STAGES, i0 = tile_i0(it);
                const float* rows = reinterpret_cast<const float*>(smem_gen + (s_rows(s) - base));
                float st[BQ / 2], dpt[BQ / 2], dq[N / 2];
                uint32_t pf[BQ / 16][4], dsf[BQ / 16][4];
                mbar_wait(full(s), (cnt / STAGES) & 1);
                wgmma_fence();
                issue_s_dp(st, dpt, s);
                if constexpr (EARLY) {
                    dq_ready(cnt - 1);
                    wgmma_fence();
                    issue_dq(dq, ds_buf(cnt - 1));
                    wgmma_wait<2>();
                } else {
                    wgmma_wait<1>();
                }
                fence_regs(st);
                probabilities(st, rows, i0, kw0, key0);
                if constexpr (EARLY) wgmma_wait<1>();
                else wgmma_wait<0>();
                fence_regs(dpt);
                dscores(dpt, st, rows);
                pack_p<BQ>(pf, st);
                pack_p<BQ>(dsf, dpt);
                wgmma_fence();
                issue_dv_dk(dv, dk, pf, dsf, s);
                if constexpr (LATE) {  // dS^T(n) stored before dQ's accumulators are taken (registers)
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
                __syncwarp();                          // every lane's reads of lse2, D before the release
                if (lane == 0) mbar_arrive(empty(s));  // Q, dO, lse2, D of this stage are free
                if constexpr (PREV) {
                    fence_regs(dq);
                    reduce_dq(dq, tile_h(it - 1), tile_i0(it - 1), b);
                }
            };
            step(std::integral_constant<bool, false>{}, 0);
            cnt++;
            for (int it = 1; it < n_it; it++, cnt++) step(std::integral_constant<bool, true>{}, it);
            {  // tail: dQ of the item's last tile
                float dq[N / 2];
                dq_ready(cnt - 1);
                wgmma_fence();
                issue_dq(dq, ds_buf(cnt - 1));
                wgmma_wait<0>();
                fence_regs(dq);
                reduce_dq(dq, tile_h(n_it - 1), tile_i0(n_it - 1), b);
            }
        } else
        for (int it = 0; it < n_it; it++, cnt++) {
            const int s = cnt % STAGES, h = kvh * group + it / n_qt, i0 = kv0 + (it % n_qt) * BQ;
            const uint32_t sdS = base + Cfg::OFF_DS + (cnt & 1) * Cfg::DS_BYTES;
            const float* rows = reinterpret_cast<const float*>(smem_gen + (s_rows(s) - base));
            float st[BQ / 2], dpt[BQ / 2], dq[N / 2];
            uint32_t pf[BQ / 16][4], dsf[BQ / 16][4];
            mbar_wait(full(s), (cnt / STAGES) & 1);
            wgmma_fence();
            issue_s_dp(st, dpt, s);
            wgmma_wait<1>();  // S^T done; P^T while dP^T is still on the tensor cores
            fence_regs(st);
            probabilities(st, rows, i0, kw0, key0);
            wgmma_wait<0>();
            fence_regs(dpt);
            dscores(dpt, st, rows);
            pack_p<BQ>(pf, st);
            pack_p<BQ>(dsf, dpt);
            wgmma_fence();
            issue_dv_dk(dv, dk, pf, dsf, s);
            store_ds(dsf, sdS);
            ds_ready();
            wgmma_fence();
            issue_dq(dq, sdS);
            wgmma_wait<0>();
            fence_regs(dq), fence_regs(dv), fence_regs(dk), fence_regs(pf), fence_regs(dsf);
            __syncwarp();                          // every lane's reads of lse2, D before the release
            if (lane == 0) mbar_arrive(empty(s));  // Q, dO, lse2, D of this stage are free
            reduce_dq(dq, h, i0, b);
        }
        if (lane == 0) mbar_arrive(kv_empty);  // every wgmma reading K, V has completed

        // dK = scale * dS^T Q, dV: bf16 pairs straight from the accumulators into dqkv, rows < T.
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int key = key0 + 8 * r;
            if (key >= T) continue;
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
    if (dq_issuer) bulk_wait<0>();  // the smem boxes stay until the last reduction has completed
}

// dq_accum (B, T, NH * HD) fp32, reduced into in boxes of 32 columns x 64 rows (128 bytes a row, the
// 128B swizzle); rows past T are out of bounds, so never written.
inline CUtensorMap dq_accum_map(const float* ptr, int B, int T, int row) {
    const cuuint64_t dims[3] = {(cuuint64_t)row, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t strides[2] = {(cuuint64_t)row * 4, (cuuint64_t)T * row * 4};
    const cuuint32_t box[3] = {32, 64, 1};
    return encode_tensor_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, ptr, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

// D and lse2 in the scratch as one tensor (Tp, B * NH, 2): row (b * NH + h) of D, then of lse2, in boxes
// of BQ x 1 x 2 (a query tile's D, then its lse2); Tp a multiple of 64, so a box of 64 never leaves the
// rows; one of 128 may, and its elements past Tp come in as zeros (queries past T, masked anyway).
inline CUtensorMap rows_map(const float* scratch, int B, int T, int NH, int HD, int BQ) {
    const int Tp = attention_padded_T(T);
    const cuuint64_t dims[3] = {(cuuint64_t)Tp, (cuuint64_t)B * NH, 2};
    const cuuint64_t strides[2] = {(cuuint64_t)Tp * 4, (cuuint64_t)B * NH * Tp * 4};
    const cuuint32_t box[3] = {(cuuint32_t)BQ, 1, 2};
    return encode_tensor_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, scratch + (size_t)B * T * NH * HD, dims, strides, box,
                             CU_TENSOR_MAP_SWIZZLE_NONE);
}

// The three launches (prologue, wgmma kernel, dQ store). scratch: attention_backward_scratch_floats(B,
// T, NH, HD) floats, any contents.
template <class Cfg>
inline void backward_hopper(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                            const float* lse, int B, int T, QKVLayout L, int window, cudaStream_t stream) {
    constexpr int HD = Cfg::HD;
    static const bool once = (allow_smem(attention_backward_wgmma<Cfg>, Cfg::SMEM), true);
    (void)once;
    const CUtensorMap qkv_map = token_rows_map(qkv, B, T, L.row()), dout_map = token_rows_map(dout, B, T, L.NH * HD);
    const CUtensorMap dq_map = Cfg::DQ_TMA ? dq_accum_map(scratch, B, T, L.NH * HD) : CUtensorMap{};
    const CUtensorMap r_map = rows_map(scratch, B, T, L.NH, HD, Cfg::BQ);
    const size_t threads = (size_t)B * T * L.NH * HD / 8;
    attention_backward_prologue<HD><<<(unsigned)ceil_div<size_t>(threads, 256), 256, 0, stream>>>(scratch, dout, out,
                                                                                                 lse, B, T, L.NH);
    cudaCheckLaunch();
    // one CTA an SM, the grid a multiple of the key tiles where it can be (see decode in the kernel)
    const int n_kt = ceil_div(T, Cfg::BKV), items = n_kt * L.NKV * B, sms = sm_count();
    const int grid = items <= sms ? items : n_kt <= sms ? sms / n_kt * n_kt : sms;
    attention_backward_wgmma<Cfg><<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(
        dqkv, scratch, qkv_map, dout_map, dq_map, r_map, B, T, L, window);
    cudaCheckLaunch();
    attention_backward_dq_store<HD><<<(unsigned)ceil_div<size_t>(threads, 256), 256, 0, stream>>>(dqkv, scratch, B, T,
                                                                                                 L);
    cudaCheckLaunch();
}

// The shipped configuration: dQ by TMA reductions; HD 64 with query tiles of 128 (+14% at gpt2, +17%
// at gqa over the BQ 64 red.add configuration that shipped before, lab variant 12, same run) and dQ a
// tile late after dV/dK (DELAY_DQ 2, lab variant 16: +5% at gpt2, +9% at gqa over BQ 128 alone). HD
// 128 keeps the lockstep schedule: the late dQ measured within noise there and spills 60 bytes.
template <int HD>
using HopperBwdShippedCfg = HopperBwdCfg<HD, 2, true, HD == 64 ? 128 : 64, HD == 64 ? 2 : 0>;
}  // namespace attention_hopper_detail
#endif  // LLMC_SM90A

// FlashAttention backward on wgmma + TMA (dQ by fp32 reductions into scratch: not bit-reproducible);
// bf16, HD 64 or 128, every pointer 16-byte aligned; scratch holds attention_detail::
// attention_backward_scratch_floats(B, T, NH, HD) floats. Only in sm_90a builds
// (attention_hopper_available()); elsewhere calling it is an error.
inline void attention_backward_hopper(__nv_bfloat16* dqkv, float* scratch, const __nv_bfloat16* dout,
                                      const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse, int B,
                                      int T, int NH, int NKV, int HD, cudaStream_t stream, int window = 0) {
    using namespace attention_detail;
    check_attention_sizes("attention_backward_hopper", B, T, NH, NKV, HD, window);
#if defined(LLMC_SM90A)
    using namespace attention_hopper_detail;
    if (!scratch) fail("attention_backward_hopper: needs a scratch buffer (attention_backward_scratch_floats)");
    if (!aligned16(dqkv) || !aligned16(dout) || !aligned16(qkv) || !aligned16(out) || !aligned16(scratch))
        fail("attention_backward_hopper: dqkv, dout, qkv, out and scratch must be 16-byte aligned");
    const QKVLayout L{NH, NKV, HD};
    if (HD == 64) backward_hopper<HopperBwdShippedCfg<64>>(dqkv, scratch, dout, qkv, out, lse, B, T, L, window, stream);
    else backward_hopper<HopperBwdShippedCfg<128>>(dqkv, scratch, dout, qkv, out, lse, B, T, L, window, stream);
#else
    (void)dqkv, (void)scratch, (void)dout, (void)qkv, (void)out, (void)lse, (void)stream;
    fail("attention_backward_hopper: this build has no sm_90a kernels (GPU_ARCH=90a defines LLMC_SM90A)");
#endif
}
