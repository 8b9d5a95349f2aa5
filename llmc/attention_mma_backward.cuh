// attention_mma_backward.cuh: the tensor-core (mma.sync) attention backward kernels (the deterministic
// dQ and dK/dV pair, the single pass) and their launchers; design and tile budget in attention_mma.cuh.
// Part of llmc/attention.cuh.
#pragma once
#include "llmc/attention_mma.cuh"

namespace attention_detail {

// dQ = scale * dS K with dS = P * (dP - D), P = exp(scale * Q K^T - lse), dP = dO V^T.
// grid (ceil(T / ROWS), NH, B), THREADS threads, smem_bytes(2). Queries are the resident rows.
// 3 matmuls (S, dP, dS K): 6 * HD FLOPs per visible pair.
// DOC: doc_start (B, T) masks keys before each query's document, bounds as in attention_forward_mma.
template <class Cfg, bool DOC = false>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    attention_backward_dq_mma(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                              const int* doc_start, int T, QKVLayout L, int window) {
    constexpr int HD = Cfg::HD, BQ = Cfg::ROWS, BKV = Cfg::TILE, NT = Cfg::THREADS;
    static_assert(Cfg::MT == 1, "the backward kernels keep one m16 tile a warp");
    extern __shared__ __align__(16) bf16 smem[];
    bf16* sQ = smem;               // (BQ, HD), later the dQ staging tile
    bf16* sdO = sQ + BQ * HD;      // (BQ, HD)
    bf16* sK = sdO + BQ * HD;      // 2 x (BKV, HD)
    bf16* sV = sK + 2 * BKV * HD;  // 2 x (BKV, HD)
    __shared__ float sD[BQ], sLse[BQ];
    const int tile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (L.NH / L.NKV);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t4 = lane & 3;
    const int stride = L.row(), C = L.NH * HD;
    const bf16* seq = qkv + (size_t)b * T * stride;
    const float scale = rsqrtf((float)HD), sl2 = scale * LOG2E;

    const int q0 = tile * BQ, q_last = min(q0 + BQ, T) - 1;
    int kv_first = window > 0 ? max(0, q0 - window + 1) / BKV : 0;
    const int kv_last = q_last / BKV;
    const int* row_start = DOC ? doc_start + (size_t)b * T : nullptr;
    const int doc_hi = DOC ? row_start[q_last] : 0;  // the tile's highest document start (nondecreasing)
    if (DOC) kv_first = max(kv_first, row_start[q0] / BKV);
    load_tile_async<BQ, HD, NT>(sQ, seq + (size_t)q0 * stride + L.q_col(h), stride, T - q0);
    load_tile_async<BQ, HD, NT>(sdO, dout + ((size_t)b * T + q0) * C + h * HD, C, T - q0);
    load_tile_async<BKV, HD, NT>(sK, seq + (size_t)kv_first * BKV * stride + L.k_col(kvh), stride, T - kv_first * BKV);
    load_tile_async<BKV, HD, NT>(sV, seq + (size_t)kv_first * BKV * stride + L.v_col(kvh), stride, T - kv_first * BKV);
    cp_async_commit();

    uint32_t qf[HD / 16][4], dof[HD / 16][4];
    float dq[HD / 8][4] = {};
    float rowD[2], rowL[2];  // D and lse (base 2) of rows g, g + 8
    const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    const int ds[2] = {DOC ? row_start[min(row[0], T - 1)] : 0, DOC ? row_start[min(row[1], T - 1)] : 0};
    for (int kt = kv_first; kt <= kv_last; kt++) {
        const int stage = (kt - kv_first) & 1, kv0 = kt * BKV;
        if (kt < kv_last) {
            const int nxt = kv0 + BKV;
            load_tile_async<BKV, HD, NT>(sK + (stage ^ 1) * BKV * HD, seq + (size_t)nxt * stride + L.k_col(kvh), stride, T - nxt);
            load_tile_async<BKV, HD, NT>(sV + (stage ^ 1) * BKV * HD, seq + (size_t)nxt * stride + L.v_col(kvh), stride, T - nxt);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (kt == kv_first) {  // block-uniform
            rows_d_lse<BQ, HD, NT>(sD, sLse, sdO, out + ((size_t)b * T + q0) * C + h * HD, C,
                               lse + ((size_t)b * L.NH + h) * T + q0, T - q0);
            __syncthreads();
            load_a_frags<HD, HD>(qf, sQ, warp * 16);
            load_a_frags<HD, HD>(dof, sdO, warp * 16);
            for (int r = 0; r < 2; r++) rowD[r] = sD[warp * 16 + g + 8 * r], rowL[r] = sLse[warp * 16 + g + 8 * r] * LOG2E;
        }
        const bf16* k_tile = sK + stage * BKV * HD;
        const bf16* v_tile = sV + stage * BKV * HD;
        float s[BKV / 8][4] = {}, dp[BKV / 8][4] = {};
        mma_a_regs_b_nk<HD, BKV, HD>(&s, &qf, k_tile, 0);
        mma_a_regs_b_nk<HD, BKV, HD>(&dp, &dof, v_tile, 0);
        const bool edge = kv0 + BKV - 1 > q0 || (window > 0 && q0 + BQ - 1 - kv0 >= window) || (DOC && kv0 < doc_hi);
#pragma unroll
        for (int nb = 0; nb < BKV / 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, key = kv0 + nb * 8 + 2 * t4 + (e & 1);
                float p = exp2f(fmaf(s[nb][e], sl2, -rowL[r]));
                if (edge && (!attends(row[r], key, window) || (DOC && key < ds[r]))) p = 0.0f;
                s[nb][e] = p * (dp[nb][e] - rowD[r]);  // dS
            }
        mma_p_regs_b_kn<HD, BKV>(&dq, &s, k_tile, 0);
        __syncthreads();
    }
    acc_to_tile<HD>(sQ, warp * 16, dq, scale);
    __syncwarp();
    store_warp_rows<HD>(dqkv + ((size_t)b * T + q0) * stride + L.q_col(h), stride, sQ, warp * 16, T - q0);
}

// dV = P^T dO and dK = scale * dS^T Q for one key tile, summed over every query head of the GQA group.
// Works on transposed scores: S^T = K Q^T (keys are the warp's rows), so P^T and dS^T come out as
// C fragments that feed the next mma as A operands without a trip through smem.
// grid (ceil(T / ROWS), NKV, B), THREADS threads, smem_bytes(2). Keys are the resident rows.
// 4 matmuls (S, dP, dV, dK): 8 * HD FLOPs per visible pair.
// DOC: the queries end where the documents of the tile's keys end (doc_query_end), and a query tile
// whose last query's document starts after kv0 masks per element.
template <class Cfg, bool DOC = false>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    attention_backward_dkdv_mma(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                                const int* doc_start, int T, QKVLayout L, int window) {
    constexpr int HD = Cfg::HD, BKV = Cfg::ROWS, BQ = Cfg::TILE, NT = Cfg::THREADS;
    static_assert(Cfg::MT == 1, "the backward kernels keep one m16 tile a warp");
    extern __shared__ __align__(16) bf16 smem[];
    bf16* sK = smem;               // (BKV, HD), later the dK staging tile
    bf16* sV = sK + BKV * HD;      // (BKV, HD), later the dV staging tile
    bf16* sQ = sV + BKV * HD;      // 2 x (BQ, HD)
    bf16* sdO = sQ + 2 * BQ * HD;  // 2 x (BQ, HD)
    __shared__ float sD[BQ], sLse[BQ];
    __shared__ int sDs[DOC ? BQ : 1];  // DOC: the query tile's document starts
    const int tile = blockIdx.x;  // the first key tiles see the most queries: launched first
    const int kvh = blockIdx.y, b = blockIdx.z, group = L.NH / L.NKV;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t4 = lane & 3;
    const int stride = L.row(), C = L.NH * HD;
    const bf16* seq = qkv + (size_t)b * T * stride;
    const float scale = rsqrtf((float)HD), sl2 = scale * LOG2E;

    const int kv0 = tile * BKV, kv_last = min(kv0 + BKV, T) - 1;
    int q_end = window > 0 ? min(T, kv_last + window) : T;
    const int* row_start = DOC ? doc_start + (size_t)b * T : nullptr;
    if (DOC) q_end = min(q_end, doc_query_end(row_start, kv_last, T));
    const int q_begin = kv0 / BQ * BQ;
    const int n_qt = ceil_div(q_end - q_begin, BQ), n_it = group * n_qt;  // (head, query tile) pairs
    auto issue = [&](int it, int stage) {
        const int h = kvh * group + it / n_qt, i0 = q_begin + (it % n_qt) * BQ;
        load_tile_async<BQ, HD, NT>(sQ + stage * BQ * HD, seq + (size_t)i0 * stride + L.q_col(h), stride, T - i0);
        load_tile_async<BQ, HD, NT>(sdO + stage * BQ * HD, dout + ((size_t)b * T + i0) * C + h * HD, C, T - i0);
    };
    load_kv_async<BKV, HD, NT>(sK, sV, seq, kv0, T, L, kvh);
    issue(0, 0);
    cp_async_commit();

    float dk[HD / 8][4] = {}, dv[HD / 8][4] = {};
    const int key[2] = {kv0 + warp * 16 + g, kv0 + warp * 16 + g + 8};
    for (int it = 0; it < n_it; it++) {
        const int stage = it & 1, h = kvh * group + it / n_qt, i0 = q_begin + (it % n_qt) * BQ;
        if (it + 1 < n_it) {
            issue(it + 1, stage ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* q_tile = sQ + stage * BQ * HD;
        const bf16* do_tile = sdO + stage * BQ * HD;
        rows_d_lse<BQ, HD, NT>(sD, sLse, do_tile, out + ((size_t)b * T + i0) * C + h * HD, C,
                           lse + ((size_t)b * L.NH + h) * T + i0, T - i0);
        if (DOC)
            for (int r = threadIdx.x; r < BQ; r += NT) sDs[r] = row_start[min(i0 + r, T - 1)];
        __syncthreads();
        float st[BQ / 8][4] = {}, dpt[BQ / 8][4] = {};
        mma_a_smem_b_nk<HD, BQ, HD>(&st, sK, warp * 16, q_tile, 0);
        mma_a_smem_b_nk<HD, BQ, HD>(&dpt, sV, warp * 16, do_tile, 0);
        const bool edge = i0 < kv0 + BKV - 1 || (window > 0 && i0 + BQ - 1 - kv0 >= window) ||
                          (DOC && sDs[BQ - 1] > kv0);  // the tile's highest document start
#pragma unroll
        for (int nb = 0; nb < BQ / 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = nb * 8 + 2 * t4 + (e & 1);
                float p = exp2f(fmaf(st[nb][e], sl2, -sLse[qi] * LOG2E));
                if (edge && (!attends(i0 + qi, key[e >> 1], window) || (DOC && key[e >> 1] < sDs[qi]))) p = 0.0f;
                st[nb][e] = p;                         // P^T
                dpt[nb][e] = p * (dpt[nb][e] - sD[qi]);  // dS^T
            }
        mma_p_regs_b_kn<HD, BQ>(&dv, &st, do_tile, 0);
        mma_p_regs_b_kn<HD, BQ>(&dk, &dpt, q_tile, 0);
        __syncthreads();  // this stage, sD and sLse are free
    }
    acc_to_tile<HD>(sK, warp * 16, dk, scale);
    acc_to_tile<HD>(sV, warp * 16, dv, 1.0f);
    __syncwarp();
    bf16* dst = dqkv + ((size_t)b * T + kv0) * stride;
    store_warp_rows<HD>(dst + L.k_col(kvh), stride, sK, warp * 16, T - kv0);
    store_warp_rows<HD>(dst + L.v_col(kvh), stride, sV, warp * 16, T - kv0);
}

template <class CfgDQ, class CfgDKV, bool DOC>
inline void backward_flash_pair(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                                const AttnShape& s, const CudaContext& ctx) {
    constexpr int smem_dq = CfgDQ::smem_bytes(2), smem_dkv = CfgDKV::smem_bytes(2);
    ctx.allow_smem(attention_backward_dq_mma<CfgDQ, DOC>, smem_dq);
    ctx.allow_smem(attention_backward_dkdv_mma<CfgDKV, DOC>, smem_dkv);
    const QKVLayout L = qkv_layout(s);
    attention_backward_dkdv_mma<CfgDKV, DOC><<<dim3(ceil_div(s.T, CfgDKV::ROWS), s.NKV, s.B), CfgDKV::THREADS,
                                               smem_dkv, ctx.stream>>>(dqkv, dout, qkv, out, lse, s.doc_start, s.T,
                                                                       L, s.window);
    cudaCheckLaunch();
    attention_backward_dq_mma<CfgDQ, DOC><<<dim3(ceil_div(s.T, CfgDQ::ROWS), s.NH, s.B), CfgDQ::THREADS, smem_dq,
                                            ctx.stream>>>(dqkv, dout, qkv, out, lse, s.doc_start, s.T, L, s.window);
    cudaCheckLaunch();
}

// The deterministic pair; with document masking (s.doc_start) its DOC instantiation.
template <class CfgDQ, class CfgDKV>
inline void backward_flash(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                           const AttnShape& s, const CudaContext& ctx) {
    if (s.doc_start) backward_flash_pair<CfgDQ, CfgDKV, true>(dqkv, dout, qkv, out, lse, s, ctx);
    else backward_flash_pair<CfgDQ, CfgDKV, false>(dqkv, dout, qkv, out, lse, s, ctx);
}

// ============================================================================ single pass, dQ by atomics
// FlashAttention-2's backward: one kernel per key tile does all 5 matmuls (S, dP, dV, dK and dQ) and
// adds its share of dQ into an fp32 buffer with vector reductions (red.global.add.v2.f32); the sum
// order over key tiles varies from run to run, so dQ is not bit-reproducible (dK and dV still are).
// Three launches: a prologue (D, lse in base 2, zeroed dQ accumulator), the single-pass kernel and a
// pass that scales dQ and rounds it into dqkv. Scratch, fp32, one allocation:
//   dq_accum (B, T, NH, HD)   then   D (B, NH, Tp)   then   lse2 = lse * log2(e) (B, NH, Tp)
// with rows padded to Tp = a multiple of 64 (zeros past T): every 64-query tile of D or lse2 is one
// 16-byte aligned 256-byte block. attention_backward_scratch_floats (after the namespace) sizes it.
__host__ __device__ inline int attention_padded_T(int T) { return (T + 63) / 64 * 64; }

// Tile configuration of the single-pass kernel: WARPS warps own MT m16 tiles of keys each (BKV keys a
// block, resident with their values); query tiles of BQ rows stream through two smem stages together
// with their dO, D and lse. In the dQ step the BQ x HD product dS K is split over the warps: BQ / 16
// row groups times WARPS / (BQ / 16) column groups of DQC columns.
template <int HD_, int WARPS_, int MT_, int BQ_, int MIN_BLOCKS_, bool SKIP_ = true>
struct AtomicCfg {
    // SKIP: warps skip query tiles their keys cannot see (the diagonal, the window edge), and the dQ
    // step skips invisible 16 x 16 blocks.
    static constexpr bool SKIP = SKIP_;
    static constexpr int HD = HD_, WARPS = WARPS_, THREADS = WARPS_ * WARP_SIZE, MT = MT_, WROWS = 16 * MT_,
                         BKV = WROWS * WARPS_, BQ = BQ_, MIN_BLOCKS = MIN_BLOCKS_;
    static constexpr int ROW_GROUPS = BQ / 16, COL_GROUPS = WARPS / ROW_GROUPS, DQC = HD / COL_GROUPS;
    // K, V; 2 stages of Q, dO; 2 stages of the dS^T tile (BKV, BQ)
    static constexpr int smem_bytes() { return (2 * BKV * HD + 4 * BQ * HD + 2 * BKV * BQ) * 2; }
    static_assert(BQ == 32 || BQ == 64 || BQ == 128, "dS^T rows are 64, 128 or 256 bytes (see swz_ds)");
    static_assert(WARPS % ROW_GROUPS == 0 && DQC % 16 == 0, "the dQ step splits BQ x HD evenly over the warps");
    static_assert(THREADS >= 2 * BQ, "one thread a row loads D and one lse");
};

// Whether any pair (query i in [q_lo, q_hi], key j in [k_lo, k_hi]) is visible: i - j spans
// [q_lo - k_hi, q_hi - k_lo], which must meet [0, window - 1] (or [0, inf) without a window).
__device__ __forceinline__ bool any_visible(int q_lo, int q_hi, int k_lo, int k_hi, int window) {
    return q_hi >= k_lo && (window == 0 || q_lo - k_hi < window);
}
// Element (r, c) of a swizzled dS^T tile with rows of BQ bf16. 128- and 256-byte rows: as swz. 64-byte
// rows: two rows share a 128-byte bank line, so chunk c/8 is XORed with (r / 2) % 4, which keeps the 8
// rows of an ldmatrix phase (and of the packed stores) on distinct banks.
template <int BQ>
__device__ __forceinline__ int swz_ds(int r, int c) {
    if constexpr (BQ >= 64) return swz<BQ>(r, c);
    else return r * BQ + ((((c >> 3) ^ ((r >> 1) & 3))) << 3) + (c & 7);
}
// Prologue: D = rowsum(dO * O) and lse2 = lse * log2(e) into the scratch (zeros in the rows' padding),
// and the dQ accumulator zeroed. One thread per 8 elements of dO / O, the HD / 8 threads of a row
// summing by shuffles. Memory-bound: reads 2 * B*T*NH*HD bf16, writes 4 * B*T*NH*HD bytes.
template <int HD>
__global__ void __launch_bounds__(256) attention_backward_prologue(float* scratch, const bf16* dout, const bf16* out,
                                                                   const float* lse, int B, int T, int NH) {
    constexpr int TPR = HD / 8;  // threads a row
    const size_t n = (size_t)B * T * NH * TPR, idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool valid = idx < n;
    float D = 0.0f;
    if (valid) {
        const Packed128<bf16> o = load128cs(out + idx * 8), d = load128cs(dout + idx * 8);
#pragma unroll
        for (int k = 0; k < 8; k++) D += to_float(o[k]) * to_float(d[k]);
        store128(scratch + idx * 8, f128::constant(0.0f));
        store128(scratch + idx * 8 + 4, f128::constant(0.0f));
    }
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) D += __shfl_xor_sync(0xffffffffu, D, off);
    if (valid && idx % TPR == 0) {
        const size_t row = idx / TPR;  // (b * T + t) * NH + h
        const int h = (int)(row % NH), t = (int)(row / NH % T), b = (int)(row / NH / T);
        const int Tp = attention_padded_T(T);
        const size_t bht = ((size_t)b * NH + h) * Tp + t, n_bht = (size_t)B * NH * Tp;
        float* Dg = scratch + (size_t)B * T * NH * HD;
        Dg[bht] = D;
        Dg[n_bht + bht] = lse[((size_t)b * NH + h) * T + t] * LOG2E;
        if (t == T - 1)  // the row's padding: D = lse2 = 0 (their Q and dO are zeros, so P^T dO = dS = 0)
            for (int k = 1; k < Tp - T + 1; k++) Dg[bht + k] = 0.0f, Dg[n_bht + bht + k] = 0.0f;
    }
}

// Epilogue: dQ = scale * dq_accum, rounded into the query columns of dqkv (dq_from_accum). One thread
// per 8 values. Reads 4 * B*T*NH*HD bytes, writes half that (78 us at GPT-2 124M's B 64 T 1024, H200;
// the FP8 trainer skips it where it can: attention_backward's keep_dq).
template <int HD>
__global__ void __launch_bounds__(256) attention_backward_dq_store(bf16* dqkv, const float* dq_accum, int B, int T,
                                                                   QKVLayout L) {
    const int per_row = L.NH * HD / 8;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * per_row) return;
    const size_t bt = idx / per_row;
    const int c = (int)(idx % per_row) * 8;
    const f128 lo = load128cs(dq_accum + idx * 8), hi = load128cs(dq_accum + idx * 8 + 4);
    Packed128<bf16> r;
#pragma unroll
    for (int k = 0; k < 4; k++) r[k] = dq_from_accum<HD>(lo[k]), r[k + 4] = dq_from_accum<HD>(hi[k]);
    store128(dqkv + bt * L.row() + L.q_col(0) + c, r);
}
// Its launch (HD 64 or 128).
inline void dq_store(bf16* dqkv, const float* dq_accum, int B, int T, const QKVLayout& L, cudaStream_t stream) {
    const size_t threads = (size_t)B * T * L.NH * L.HD / 8;
    const unsigned grid = (unsigned)ceil_div<size_t>(threads, 256);
    if (L.HD == 64) attention_backward_dq_store<64><<<grid, 256, 0, stream>>>(dqkv, dq_accum, B, T, L);
    else attention_backward_dq_store<128><<<grid, 256, 0, stream>>>(dqkv, dq_accum, B, T, L);
    cudaCheckLaunch();
}

// dV = P^T dO, dK = scale * dS^T Q (summed over the GQA group in registers, as the two-kernel path)
// and dQ += dS K (into dq_accum, unscaled) for one key tile: 5 matmuls, 10 * HD FLOPs per visible pair.
// grid (ceil(T / BKV), NKV, B), THREADS threads, smem_bytes(). Keys are the resident rows.
// Per query tile: S^T and dP^T (A = K, V from smem), P^T and dS^T in registers, dS^T also stored as
// bf16 into one of two smem tiles; dV and dK from registers; then, one tile later (after the next
// barrier, so one barrier serves both), every warp takes a (16 queries x DQC) block of dS K, A read
// from the dS^T tile with ldmatrix.trans, and reduces it into dq_accum. With Cfg::SKIP the dQ step
// skips 16x16 dS blocks with no visible pair, so skipping warps' stale dS^T rows are never read.
// Registers (ptxas, sm_90a): 255 and no spills at HD 64 MT 2 without the skip (16-40 bytes of spills
// with it). Bytes: K, V once; Q, dO once per key tile (from L2); 4 * BQ * HD bytes of dq_accum
// reductions per (key tile, query tile): compute-bound, with the L2 reductions as the risk.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    attention_backward_single_pass_mma(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, int B, int T,
                                       QKVLayout L, int window) {
    constexpr int HD = Cfg::HD, BKV = Cfg::BKV, BQ = Cfg::BQ, NT = Cfg::THREADS, MT = Cfg::MT, WR = Cfg::WROWS;
    constexpr int RG = Cfg::ROW_GROUPS, DQC = Cfg::DQC;
    extern __shared__ __align__(16) bf16 smem[];
    bf16* sK = smem;               // (BKV, HD), later the dK staging tile
    bf16* sV = sK + BKV * HD;      // (BKV, HD), later the dV staging tile
    bf16* sQ = sV + BKV * HD;      // 2 x (BQ, HD)
    bf16* sdO = sQ + 2 * BQ * HD;  // 2 x (BQ, HD)
    bf16* sdS = sdO + 2 * BQ * HD;  // 2 x (BKV, BQ): dS^T, swz_ds
    __shared__ __align__(16) float sD[2][BQ], sL[2][BQ];  // D and lse2 of each stage's queries
    const int tile = blockIdx.x;  // the first key tiles see the most queries: launched first
    const int kvh = blockIdx.y, b = blockIdx.z, group = L.NH / L.NKV;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t4 = lane & 3;
    const int stride = L.row(), C = L.NH * HD;
    const bf16* seq = qkv + (size_t)b * T * stride;
    const float scale = rsqrtf((float)HD), sl2 = scale * LOG2E;
    float* dq_accum = scratch + (size_t)b * T * C;                      // this sequence's (T, NH, HD)
    const int Tp = attention_padded_T(T);
    const float* Dg = scratch + (size_t)B * T * C + (size_t)b * L.NH * Tp;  // (NH, Tp)
    const float* L2g = Dg + (size_t)B * L.NH * Tp;

    const int kv0 = tile * BKV, kv_last = min(kv0 + BKV, T) - 1;
    const int q_begin = kv0 / BQ * BQ, q_end = window > 0 ? min(T, kv_last + window) : T;
    const int n_qt = ceil_div(q_end - q_begin, BQ), n_it = group * n_qt;  // (head, query tile) pairs
    auto head_of = [&](int it) { return kvh * group + it / n_qt; };
    auto row_of = [&](int it) { return q_begin + (it % n_qt) * BQ; };
    auto issue = [&](int it, int stage) {
        const int h = head_of(it), i0 = row_of(it);
        load_tile_async<BQ, HD, NT>(sQ + stage * BQ * HD, seq + (size_t)i0 * stride + L.q_col(h), stride, T - i0);
        load_tile_async<BQ, HD, NT>(sdO + stage * BQ * HD, dout + ((size_t)b * T + i0) * C + h * HD, C, T - i0);
        if (threadIdx.x < 2 * BQ) {  // rows past T: D = lse2 = 0; their Q and dO are 0, so P^T dO = dS = 0
            const int r = threadIdx.x % BQ;
            const float* src = (threadIdx.x < BQ ? Dg : L2g) + (size_t)h * Tp + min(i0 + r, T - 1);
            cp_async4(threadIdx.x < BQ ? &sD[stage][r] : &sL[stage][r], src, i0 + r < T);
        }
    };
    // dQ block of this warp for query tile `it`, whose dS^T is in ds_tile.
    auto dq_step = [&](int it, const bf16* ds_tile) {
        const int h = head_of(it), i0 = row_of(it), qr = (warp % RG) * 16, c0 = (warp / RG) * DQC;
        float acc[DQC / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < BKV / 16; kk++) {
            if (Cfg::SKIP && !any_visible(i0 + qr, i0 + qr + 15, kv0 + kk * 16, kv0 + kk * 16 + 15, window)) continue;
            uint32_t a[4];  // dS (queries x keys) = the transpose of the stored tile
            ldmatrix_x4_trans(a, ds_tile + swz_ds<BQ>(kk * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                      qr + ((lane >> 3) & 1) * 8));
#pragma unroll
            for (int nd = 0; nd < DQC / 16; nd++) {
                uint32_t bk[4];
                ldmatrix_x4_trans(bk, frag_b_kn<HD>(sK, kk * 16, c0 + nd * 16));
                mma_16816(acc[2 * nd], a, bk[0], bk[1]);
                mma_16816(acc[2 * nd + 1], a, bk[2], bk[3]);
            }
        }
        float* dst = dq_accum + (size_t)h * HD + c0;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int i = i0 + qr + g + 8 * r;
            if (i >= T) continue;
#pragma unroll
            for (int nb = 0; nb < DQC / 8; nb++)
                red_add_v2(dst + (size_t)i * C + nb * 8 + 2 * t4, acc[nb][2 * r], acc[nb][2 * r + 1]);
        }
    };
    load_kv_async<BKV, HD, NT>(sK, sV, seq, kv0, T, L, kvh);
    issue(0, 0);
    cp_async_commit();

    float dk[MT][HD / 8][4] = {}, dv[MT][HD / 8][4] = {};
    const int kw0 = kv0 + warp * WR;  // this warp's first key; key of (mt, r) = kw0 + 16 mt + g + 8 r
    for (int it = 0; it < n_it; it++) {
        const int stage = it & 1, i0 = row_of(it);
        if (it + 1 < n_it) {
            issue(it + 1, stage ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // tile it landed; every warp is past tile it - 1's dS^T stores
        if (it > 0) dq_step(it - 1, sdS + (stage ^ 1) * BKV * BQ);
        if (!Cfg::SKIP || any_visible(i0, i0 + BQ - 1, kw0, kw0 + WR - 1, window)) {  // warp-uniform
            const bf16* q_tile = sQ + stage * BQ * HD;
            const bf16* do_tile = sdO + stage * BQ * HD;
            bf16* ds_tile = sdS + stage * BKV * BQ;
            float st[MT][BQ / 8][4] = {}, dpt[MT][BQ / 8][4] = {};
            mma_a_smem_b_nk<HD, BQ, HD, MT>(st, sK, warp * WR, q_tile, 0);
            mma_a_smem_b_nk<HD, BQ, HD, MT>(dpt, sV, warp * WR, do_tile, 0);
            const bool edge = i0 < kw0 + WR - 1 || (window > 0 && i0 + BQ - 1 - kw0 >= window);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nb = 0; nb < BQ / 8; nb++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int qi = nb * 8 + 2 * t4 + (e & 1), key = kw0 + mt * 16 + g + 8 * (e >> 1);
                        float p = exp2f(fmaf(st[mt][nb][e], sl2, -sL[stage][qi]));
                        if (edge && !attends(i0 + qi, key, window)) p = 0.0f;
                        st[mt][nb][e] = p;                                   // P^T
                        dpt[mt][nb][e] = p * (dpt[mt][nb][e] - sD[stage][qi]);  // dS^T
                    }
                    const int r0 = warp * WR + mt * 16 + g, c = nb * 8 + 2 * t4;
                    *reinterpret_cast<uint32_t*>(ds_tile + swz_ds<BQ>(r0, c)) = pack_bf16(dpt[mt][nb][0], dpt[mt][nb][1]);
                    *reinterpret_cast<uint32_t*>(ds_tile + swz_ds<BQ>(r0 + 8, c)) = pack_bf16(dpt[mt][nb][2], dpt[mt][nb][3]);
                }
            mma_p_regs_b_kn<HD, BQ, MT>(&dv[0], &st[0], do_tile, 0);
            mma_p_regs_b_kn<HD, BQ, MT>(&dk[0], &dpt[0], q_tile, 0);
        }
        __syncthreads();  // this stage of Q, dO, D, lse is free
    }
    dq_step(n_it - 1, sdS + ((n_it - 1) & 1) * BKV * BQ);
    __syncthreads();  // sK is read by the dQ step before it stages dK
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        acc_to_tile<HD>(sK, warp * WR + mt * 16, dk[mt], scale);
        acc_to_tile<HD>(sV, warp * WR + mt * 16, dv[mt], 1.0f);
    }
    __syncwarp();
    bf16* dst = dqkv + ((size_t)b * T + kv0) * stride;
    store_warp_rows<HD, WR>(dst + L.k_col(kvh), stride, sK, warp * WR, T - kv0);
    store_warp_rows<HD, WR>(dst + L.v_col(kvh), stride, sV, warp * WR, T - kv0);
}

// The three launches of the single-pass backward. scratch: attention_backward_scratch_floats(s) floats,
// any contents (the prologue zeroes what must start at zero). keep_dq: the dQ store is skipped, dQ left
// unscaled in scratch's dq_accum (dqkv's query columns unwritten).
template <class Cfg>
inline void backward_flash_atomic(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                                  const float* lse, const AttnShape& s, const CudaContext& ctx, bool keep_dq = false) {
    constexpr int HD = Cfg::HD, smem = Cfg::smem_bytes();
    ctx.allow_smem(attention_backward_single_pass_mma<Cfg>, smem);
    const int B = s.B, T = s.T;
    const QKVLayout L = qkv_layout(s);
    const size_t threads = (size_t)B * T * L.NH * HD / 8;
    attention_backward_prologue<HD><<<(unsigned)ceil_div<size_t>(threads, 256), 256, 0, ctx.stream>>>(scratch, dout, out,
                                                                                                     lse, B, T, L.NH);
    cudaCheckLaunch();
    attention_backward_single_pass_mma<Cfg><<<dim3(ceil_div(T, Cfg::BKV), L.NKV, B), Cfg::THREADS, smem, ctx.stream>>>(
        dqkv, scratch, dout, qkv, B, T, L, s.window);
    cudaCheckLaunch();
    if (!keep_dq) dq_store(dqkv, scratch, B, T, L, ctx.stream);
}

// The shipped configurations, the fastest of dev/cuda/attention_backward.cu's variants on the H200:
// the pair capped at 168 registers (3 blocks/SM) at HD 64, uncapped at HD 128 (the cap spills).
template <int HD>
using DQCfg = std::conditional_t<HD == 64, FlashCfg<64, 4, 64, 3>, FlashCfg<HD, 4, 32>>;
template <int HD>
using DKVCfg = DQCfg<HD>;
// The single pass: HD 64 two m16 key tiles a warp (128 keys a block, 32-query tiles, 255 registers:
// 2 blocks/SM), no per-warp skip; HD 128 one m16 tile a warp, 64 keys x 64 queries, with the skip.
template <int HD>
using AtomicBwdCfg = std::conditional_t<HD == 64, AtomicCfg<64, 4, 2, 32, 2, false>, AtomicCfg<HD, 4, 1, 64, 2>>;
}  // namespace attention_detail

// The single-pass backwards' fp32 workspace (attention_backward's fast mode); no data: the
// deterministic backward. floats: its size where known (0: the minimum below).
struct AttnScratch {
    float* data = nullptr;
    size_t floats = 0;
};
// Floats of the scratch the single-pass backwards take: dq_accum, D and lse2 as above.
inline size_t attention_backward_scratch_floats(const AttnShape& s) {
    return (size_t)s.B * s.T * s.NH * s.HD + 2 * (size_t)s.B * s.NH * attention_detail::attention_padded_T(s.T);
}
// The scratch that also lets the Hopper backward take its split schedule on small shapes (fewer work
// items, 128-key tiles x kv heads x sequences, than the device's SMs; attention_hopper_backward.cuh):
// the above plus dkv_accum (B, T, 2 * NKV * HD) fp32 there, nothing more elsewhere.
inline size_t attention_backward_scratch_floats_split(const AttnShape& s, const CudaContext& ctx) {
    const bool small = (long)ceil_div(s.T, 128) * s.NKV * s.B < ctx.sm_count;
    return attention_backward_scratch_floats(s) + (small ? (size_t)s.B * s.T * 2 * s.NKV * s.HD : 0);
}
