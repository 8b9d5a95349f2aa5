// attention_mma_forward.cuh: the tensor-core (mma.sync) attention forward kernels (tiles, band) and
// their launchers; design and tile budget in attention_mma.cuh. Part of llmc/attention.cuh.
#pragma once
#include "llmc/attention_mma.cuh"

namespace attention_detail {

// The forward kernels' epilogue: normalises a warp's MT m16 output tiles, writes lse (natural log) of
// the rows < T, stages the rows in the warp's own rows of sQ and stores them as 16-byte chunks. row_g:
// this thread's first query (row of (mt, r) = row_g + 16 mt + 8 r); m, l: running max and partial sums.
template <int HD, int MT, int WR>
__device__ __forceinline__ void finish_forward_rows(bf16* out, float* lse, bf16* sQ, float (*o)[HD / 8][4],
                                                    const float (*m)[2], const float (*l)[2], int row_g, int q0,
                                                    int T, QKVLayout L, int b, int h, float sl2) {
    const int warp = threadIdx.x / WARP_SIZE, t4 = threadIdx.x % 4;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lt = l[mt][r];
            lt += __shfl_xor_sync(0xffffffffu, lt, 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            inv[r] = 1.0f / lt;
            const int row = row_g + 16 * mt + 8 * r;
            if (t4 == 0 && row < T) lse[((size_t)b * L.NH + h) * T + row] = m[mt][r] * (sl2 / LOG2E) + logf(lt);
        }
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++)
            o[mt][nd][0] *= inv[0], o[mt][nd][1] *= inv[0], o[mt][nd][2] *= inv[1], o[mt][nd][3] *= inv[1];
        acc_to_tile<HD>(sQ, warp * WR + mt * 16, o[mt], 1.0f);
    }
    __syncwarp();
    store_warp_rows<HD, WR>(out + ((size_t)b * T + q0) * L.NH * HD + h * HD, L.NH * HD, sQ, warp * WR, T - q0);
}

// One online-softmax step of a warp's MT m16 query tiles over NB 8-key blocks of scores s (C fragments;
// the thread's rows g and g + 8 are r = 0, 1): m takes the new maxima (score units), s becomes
// exp2(s * sl2 - max), l (this thread's part of the row sums) and o are rescaled, l adds the new terms.
template <int HD, int NB, int MT>
__device__ __forceinline__ void online_softmax_tiles(float (*s)[NB][4], float (*m)[2], float (*l)[2],
                                                     float (*o)[HD / 8][4], float sl2) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = m[mt][r];
#pragma unroll
            for (int nb = 0; nb < NB; nb++) mx = fmaxf(mx, fmaxf(s[mt][nb][2 * r], s[mt][nb][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float base = mx == -INFINITY ? 0.0f : mx * sl2;  // a row with nothing visible yet stays 0
            const float corr = exp2f(m[mt][r] * sl2 - base);
            m[mt][r] = mx;
            l[mt][r] *= corr;
#pragma unroll
            for (int nd = 0; nd < HD / 8; nd++) o[mt][nd][2 * r] *= corr, o[mt][nd][2 * r + 1] *= corr;
#pragma unroll
            for (int nb = 0; nb < NB; nb++) {
                s[mt][nb][2 * r] = exp2f(fmaf(s[mt][nb][2 * r], sl2, -base));
                s[mt][nb][2 * r + 1] = exp2f(fmaf(s[mt][nb][2 * r + 1], sl2, -base));
                l[mt][r] += s[mt][nb][2 * r] + s[mt][nb][2 * r + 1];
            }
        }
}

// grid (ceil(T / ROWS), NH, B), THREADS threads, smem_bytes(1). Queries are the resident rows.
// FLOPs 4 * HD per visible (query, key) pair; bytes ~ (2 + T / ROWS) * T * HD * 2 per head (K/V
// re-read by every query tile, mostly from L2): compute-bound.
template <class Cfg, bool DOC = false>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    attention_forward_mma(bf16* out, float* lse, const bf16* qkv, const int* doc_start, int T, QKVLayout L,
                          int window) {
    constexpr int HD = Cfg::HD, BQ = Cfg::ROWS, BKV = Cfg::TILE, NT = Cfg::THREADS, MT = Cfg::MT, WR = Cfg::WROWS;
    extern __shared__ __align__(16) bf16 smem[];
    bf16* sQ = smem;                     // (BQ, HD), later the output staging tile
    bf16* sK = sQ + BQ * HD;             // 2 x (BKV, HD)
    bf16* sV = sK + 2 * BKV * HD;        // 2 x (BKV, HD)
    const int tile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (L.NH / L.NKV);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t4 = lane & 3;
    const int stride = L.row();
    const bf16* seq = qkv + (size_t)b * T * stride;
    const float sl2 = rsqrtf((float)HD) * LOG2E;  // scores -> base-2 exponent

    const int q0 = tile * BQ, q_last = min(q0 + BQ, T) - 1;
    int kv_first = window > 0 ? max(0, q0 - window + 1) / BKV : 0;
    const int kv_last = q_last / BKV;
    // DOC: the tile's lowest document start is its first query's (doc_start is nondecreasing); key tiles
    // wholly below it are skipped, and tiles below its last query's start mask per element.
    const int* row_start = DOC ? doc_start + (size_t)b * T : nullptr;
    const int doc_hi = DOC ? row_start[q_last] : 0;
    if (DOC) kv_first = max(kv_first, row_start[q0] / BKV);
    load_tile_async<BQ, HD, NT>(sQ, seq + (size_t)q0 * stride + L.q_col(h), stride, T - q0);
    load_tile_async<BKV, HD, NT>(sK, seq + (size_t)kv_first * BKV * stride + L.k_col(kvh), stride, T - kv_first * BKV);
    load_tile_async<BKV, HD, NT>(sV, seq + (size_t)kv_first * BKV * stride + L.v_col(kvh), stride, T - kv_first * BKV);
    cp_async_commit();

    // Thread state per m16 tile mt: rows g and g + 8 (index r); l is this thread's part of the sum.
    uint32_t qf[MT][HD / 16][4];
    float o[MT][HD / 8][4] = {};
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
    const int row0 = q0 + warp * WR + g;  // query of (mt, r) = row0 + 16 * mt + 8 * r
    int ds[MT][2];                         // DOC: the document start of query (mt, r)
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) ds[mt][r] = DOC ? row_start[min(row0 + 16 * mt + 8 * r, T - 1)] : 0;
    for (int kt = kv_first; kt <= kv_last; kt++) {
        const int stage = (kt - kv_first) & 1, kv0 = kt * BKV;
        if (kt < kv_last) {  // prefetch the next tile into the other stage (freed by the last barrier)
            const int nxt = kv0 + BKV;
            load_tile_async<BKV, HD, NT>(sK + (stage ^ 1) * BKV * HD, seq + (size_t)nxt * stride + L.k_col(kvh), stride, T - nxt);
            load_tile_async<BKV, HD, NT>(sV + (stage ^ 1) * BKV * HD, seq + (size_t)nxt * stride + L.v_col(kvh), stride, T - nxt);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (kt == kv_first)
#pragma unroll
            for (int mt = 0; mt < MT; mt++) load_a_frags<HD, HD>(qf[mt], sQ, warp * WR + mt * 16);
        const bf16* k_tile = sK + stage * BKV * HD;
        const bf16* v_tile = sV + stage * BKV * HD;

        float s[MT][BKV / 8][4] = {};
        mma_a_regs_b_nk<HD, BKV, HD, MT>(s, qf, k_tile, 0);
        const bool edge = kv0 + BKV - 1 > q0 || (window > 0 && q0 + BQ - 1 - kv0 >= window) || (DOC && kv0 < doc_hi);
        if (edge) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nb = 0; nb < BKV / 8; nb++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = kv0 + nb * 8 + 2 * t4 + (e & 1);
                        if (!attends(row0 + 16 * mt + 8 * (e >> 1), key, window) || (DOC && key < ds[mt][e >> 1]))
                            s[mt][nb][e] = -INFINITY;
                    }
        }
        online_softmax_tiles<HD, BKV / 8, MT>(s, m, l, o, sl2);
        mma_p_regs_b_kn<HD, BKV, MT>(o, s, v_tile, 0);
        __syncthreads();  // this stage is free for the prefetch two tiles on
    }

    finish_forward_rows<HD, MT, WR>(out, lse, sQ, o, m, l, row0, q0, T, L, b, h, sl2);
}

template <class Cfg, bool DOC = false>
inline void forward_flash_tiles(bf16* out, float* lse, const bf16* qkv, const AttnShape& s, const CudaContext& ctx) {
    constexpr int smem = Cfg::smem_bytes(1);
    ctx.allow_smem(attention_forward_mma<Cfg, DOC>, smem);
    attention_forward_mma<Cfg, DOC><<<dim3(ceil_div(s.T, Cfg::ROWS), s.NH, s.B), Cfg::THREADS, smem, ctx.stream>>>(
        out, lse, qkv, s.doc_start, s.T, qkv_layout(s), s.window);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------- sliding window
// The band kernel: the same mma.sync pipeline as attention_forward_mma, with each warp sweeping only
// the keys its own 16-row groups can see. With window W the visible keys of a warp's rows are a band
// of W + WR - 1 keys whose start moves with the warp; square tiles waste the band's corners (a 64-query
// tile over 64-key tiles visits 320 keys for W = 256), and a warp that skipped its masked parts would
// still wait at the barrier for the warp with the most work in that tile. Here the tiles of keys start
// at the block's first key (16-aligned) and warp w starts `skew` 16-key steps later, so in every
// iteration each warp does the same number of steps: W / 16 + 1 a row group (17 for W = 256 instead
// of 20; W / 16 + 2 with WR = 32), and only the two edge steps compute a mask.
// A warp's iteration spans up to SPAN consecutive tiles: STAGES = SPAN + 1 smem stages (the extra one
// is in flight), e.g. HD 128, 64x64: 3 stages, smem 16 + 96 = 112 KB, 2 blocks/SM. Measured beside
// the tile kernel: dev/cuda/attention_forward.cu.
template <class Cfg>
struct BandPlan {
    static constexpr int STEPS = Cfg::TILE / 16;                      // 16-key steps a tile
    static constexpr int MAX_SKEW = (Cfg::WARPS - 1) * Cfg::MT;        // steps the last warp starts late
    static constexpr int SPAN = (MAX_SKEW + STEPS - 1) / STEPS + 1;    // tiles one warp iteration reads
    static constexpr int STAGES = SPAN + 1;
    static constexpr int smem_bytes = (Cfg::ROWS + 2 * STAGES * Cfg::TILE) * Cfg::HD * 2;
    static_assert((STEPS & (STEPS - 1)) == 0, "tiles of a power-of-two count of 16-key steps");
    static_assert(smem_bytes <= 227 * 1024, "over the per-block shared-memory limit");
};

// Calls f(std::integral_constant<int, n>{}) for a run-time n in [1, N]: one straight-line copy of
// f's body for each count.
template <int N, class F>
__device__ __forceinline__ void with_step_count(int n, F&& f) {
    if constexpr (N > 1) {
        if (n < N) {
            with_step_count<N - 1>(n, f);
            return;
        }
    }
    f(std::integral_constant<int, N>{});
}

// First key a 16-row group starting at query r can see, rounded down to a 16-key step.
__device__ __forceinline__ int band_first_key(int r, int window) {
    return window > 0 ? max(0, r - window + 1) & ~15 : 0;
}

// grid (ceil(T / ROWS), NH, B), THREADS threads, BandPlan<Cfg>::smem_bytes. Mapping as in
// attention_forward_mma; warp w's 16-key step c of iteration j is block step skew_w + STEPS * j + c,
// in tile (that / STEPS) at stage tile % STAGES. FLOPs done 4 * HD * (W + WR) a row, of which
// 4 * HD * W visible; K/V re-read per query tile, from L2: compute-bound.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    attention_forward_mma_band(bf16* out, float* lse, const bf16* qkv, int T, QKVLayout L, int window) {
    using Plan = BandPlan<Cfg>;
    constexpr int HD = Cfg::HD, BQ = Cfg::ROWS, BKV = Cfg::TILE, NT = Cfg::THREADS, MT = Cfg::MT, WR = Cfg::WROWS;
    constexpr int STEPS = Plan::STEPS, STAGES = Plan::STAGES;
    extern __shared__ __align__(16) bf16 smem[];
    bf16* sQ = smem;                     // (BQ, HD), later the output staging tile
    bf16* sK = sQ + BQ * HD;             // STAGES x (BKV, HD)
    bf16* sV = sK + STAGES * BKV * HD;   // STAGES x (BKV, HD)
    const int tile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (L.NH / L.NKV);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t4 = lane & 3;
    const int stride = L.row();
    const bf16* seq = qkv + (size_t)b * T * stride;
    const float sl2 = rsqrtf((float)HD) * LOG2E;

    // Keys [k_base, key_end) in tiles of BKV; warp w's steps cover [its first key, its rows' end).
    const int q0 = tile * BQ, k_base = band_first_key(q0, window);
    const int key_end = (min(q0 + BQ, T) + 15) & ~15;
    const int n_tiles = ceil_div(key_end - k_base, BKV);
    auto warp_steps = [&](int r) {  // 16-key steps of the row group at r (none past T)
        return max(0, (((min(r + WR, T) + 15) & ~15) - band_first_key(r, window)) / 16);
    };
    const int row0 = q0 + warp * WR;  // query of (mt, r) = row0 + g + 16 * mt + 8 * r
    const int skew = (band_first_key(row0, window) - k_base) / 16, steps = warp_steps(row0);
    int iters = 0;
    for (int w = 0; w < Cfg::WARPS; w++) iters = max(iters, ceil_div(warp_steps(q0 + w * WR), STEPS));

    auto load_kv = [&](int t) {
        if (t < n_tiles) {
            const int k0 = k_base + t * BKV, st = t % STAGES;
            load_tile_async<BKV, HD, NT>(sK + st * BKV * HD, seq + (size_t)k0 * stride + L.k_col(kvh), stride, T - k0);
            load_tile_async<BKV, HD, NT>(sV + st * BKV * HD, seq + (size_t)k0 * stride + L.v_col(kvh), stride, T - k0);
        }
        cp_async_commit();  // one group a tile, empty past the last, so the wait count stays fixed
    };
    load_tile_async<BQ, HD, NT>(sQ, seq + (size_t)q0 * stride + L.q_col(h), stride, T - q0);
#pragma unroll
    for (int t = 0; t < STAGES - 1; t++) load_kv(t);

    uint32_t qf[MT][HD / 16][4];
    float o[MT][HD / 8][4] = {};
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
    for (int j = 0; j < iters; j++) {
        load_kv(j + STAGES - 1);  // into the stage of tile j - 1, freed by the last barrier
        cp_async_wait<1>();       // tiles up to j + SPAN - 1 have landed
        __syncthreads();
        if (j == 0)
#pragma unroll
            for (int mt = 0; mt < MT; mt++) load_a_frags<HD, HD>(qf[mt], sQ, warp * WR + mt * 16);
        if (STEPS * j < steps) {  // warp-uniform: this warp still has steps
            // Step c: block step gs0 + c, keys [key_lo, key_lo + 16), at offset off[c] of sK and sV (a
            // 16-row offset keeps the swizzle pattern, so the lanes' ldmatrix addresses stay loop-invariant).
            const int gs0 = skew + STEPS * j, st0 = (gs0 / STEPS) % STAGES, st1 = st0 + 1 == STAGES ? 0 : st0 + 1;
            int off[STEPS], key_lo[STEPS];
            bool masked[MT][STEPS];
#pragma unroll
            for (int c = 0; c < STEPS; c++) {
                const int p = gs0 % STEPS + c;
                off[c] = ((p < STEPS ? st0 : st1) * BKV + (p % STEPS) * 16) * HD;
                key_lo[c] = k_base + 16 * (gs0 + c);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    // row - key over the 16 x 16 block spans [d - 15, d + 15]; visible is [0, W)
                    const int d = row0 + 16 * mt - key_lo[c];
                    masked[mt][c] = d - 15 < 0 || (window > 0 && d + 15 >= window);
                }
            }
            // Straight-line code for each count N of steps (a branch around every mma is 2x slower: the
            // scheduler cannot overlap them); only the last iteration has N < STEPS.
            with_step_count<STEPS>(steps - STEPS * j, [&](auto count) {
                constexpr int N = decltype(count)::value;
                float s[MT][2 * N][4] = {};
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
                    for (int c = 0; c < N; c++) {
                        uint32_t bk[4];
                        ldmatrix_x4(bk, frag_b_nk<HD>(sK + off[c], 0, kk * 16));
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma_16816(s[mt][2 * c], qf[mt][kk], bk[0], bk[1]);
                            mma_16816(s[mt][2 * c + 1], qf[mt][kk], bk[2], bk[3]);
                        }
                    }
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int c = 0; c < N; c++)
                        if (masked[mt][c])
#pragma unroll
                            for (int e = 0; e < 8; e++)
                                if (!attends(row0 + 16 * mt + g + 8 * ((e >> 1) & 1),
                                             key_lo[c] + 8 * (e >> 2) + 2 * t4 + (e & 1), window))
                                    s[mt][2 * c + (e >> 2)][e & 3] = -INFINITY;
                online_softmax_tiles<HD, 2 * N, MT>(s, m, l, o, sl2);
#pragma unroll
                for (int c = 0; c < N; c++) {
                    uint32_t a[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        a[mt][0] = pack_bf16(s[mt][2 * c][0], s[mt][2 * c][1]);
                        a[mt][1] = pack_bf16(s[mt][2 * c][2], s[mt][2 * c][3]);
                        a[mt][2] = pack_bf16(s[mt][2 * c + 1][0], s[mt][2 * c + 1][1]);
                        a[mt][3] = pack_bf16(s[mt][2 * c + 1][2], s[mt][2 * c + 1][3]);
                    }
#pragma unroll
                    for (int nd = 0; nd < HD / 16; nd++) {
                        uint32_t bv[4];
                        ldmatrix_x4_trans(bv, frag_b_kn<HD>(sV + off[c], 0, nd * 16));
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma_16816(o[mt][2 * nd], a[mt], bv[0], bv[1]);
                            mma_16816(o[mt][2 * nd + 1], a[mt], bv[2], bv[3]);
                        }
                    }
                }
            });
        }
        __syncthreads();  // stage of tile j - SPAN + 1 is free for the next prefetch
    }
    cp_async_wait<0>();  // the trailing (empty) groups

    finish_forward_rows<HD, MT, WR>(out, lse, sQ, o, m, l, row0 + g, q0, T, L, b, h, sl2);
}

template <class Cfg>
inline void forward_flash_band(bf16* out, float* lse, const bf16* qkv, const AttnShape& s, const CudaContext& ctx) {
    constexpr int smem = BandPlan<Cfg>::smem_bytes;
    ctx.allow_smem(attention_forward_mma_band<Cfg>, smem);
    attention_forward_mma_band<Cfg><<<dim3(ceil_div(s.T, Cfg::ROWS), s.NH, s.B), Cfg::THREADS, smem, ctx.stream>>>(
        out, lse, qkv, s.T, qkv_layout(s), s.window);
    cudaCheckLaunch();
}

// The shipped forward: the tile kernel for causal attention, the band kernel (Cfg::Band) for a
// sliding window; with document masking the tile kernel in both cases (its bounds take the window).
template <class Cfg>
inline void forward_flash(bf16* out, float* lse, const bf16* qkv, const AttnShape& s, const CudaContext& ctx) {
    if (s.doc_start) forward_flash_tiles<Cfg, true>(out, lse, qkv, s, ctx);
    else if (s.window > 0) forward_flash_band<typename Cfg::Band>(out, lse, qkv, s, ctx);
    else forward_flash_tiles<Cfg>(out, lse, qkv, s, ctx);
}

// The shipped configuration, the fastest of dev/cuda/attention_forward.cu's variants on the H200:
//   tiles: HD 64 2 m16 tiles a warp (250 registers); HD 128 one m16 tile a warp, 64 keys a tile.
//   band (window > 0): HD 64 2 m16 tiles a warp, 32 keys, 3 blocks/SM; HD 128 as the tiles.
template <int HD>
struct FwdCfg : std::conditional_t<HD == 64, FlashCfg<64, 4, 64, 1, 2>, FlashCfg<HD, 4, 64>> {
    using Band = std::conditional_t<HD == 64, FlashCfg<64, 4, 32, 3, 2>, FlashCfg<HD, 4, 64>>;
};
}  // namespace attention_detail
