// attention_mma_backward.cuh: the tensor-core (mma.sync) attention backward kernels (dQ; dK/dV) and
// their launcher.
// Internal part of llmc/attention.cuh, included from there only (it uses QKVLayout, attends and the
// common includes defined there); include llmc/attention.cuh instead.
#pragma once

namespace attention_detail {

// dQ = scale * dS K with dS = P * (dP - D), P = exp(scale * Q K^T - lse), dP = dO V^T.
// grid (ceil(T / ROWS), NH, B), THREADS threads, smem_bytes(2). Queries are the resident rows.
// 3 matmuls (S, dP, dS K): 6 * HD FLOPs per visible pair.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    attention_backward_dq_mma(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse, int T,
                              QKVLayout L, int window) {
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
    const int kv_first = window > 0 ? max(0, q0 - window + 1) / BKV : 0, kv_last = q_last / BKV;
    load_tile_async<BQ, HD, NT>(sQ, seq + (size_t)q0 * stride + L.q_col(h), stride, T - q0);
    load_tile_async<BQ, HD, NT>(sdO, dout + ((size_t)b * T + q0) * C + h * HD, C, T - q0);
    load_tile_async<BKV, HD, NT>(sK, seq + (size_t)kv_first * BKV * stride + L.k_col(kvh), stride, T - kv_first * BKV);
    load_tile_async<BKV, HD, NT>(sV, seq + (size_t)kv_first * BKV * stride + L.v_col(kvh), stride, T - kv_first * BKV);
    cp_async_commit();

    uint32_t qf[HD / 16][4], dof[HD / 16][4];
    float dq[HD / 8][4] = {};
    float rowD[2], rowL[2];  // D and lse (base 2) of rows g, g + 8
    const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
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
        const bool edge = kv0 + BKV - 1 > q0 || (window > 0 && q0 + BQ - 1 - kv0 >= window);
#pragma unroll
        for (int nb = 0; nb < BKV / 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                float p = exp2f(fmaf(s[nb][e], sl2, -rowL[r]));
                if (edge && !attends(row[r], kv0 + nb * 8 + 2 * t4 + (e & 1), window)) p = 0.0f;
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
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    attention_backward_dkdv_mma(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                                int T, QKVLayout L, int window) {
    constexpr int HD = Cfg::HD, BKV = Cfg::ROWS, BQ = Cfg::TILE, NT = Cfg::THREADS;
    static_assert(Cfg::MT == 1, "the backward kernels keep one m16 tile a warp");
    extern __shared__ __align__(16) bf16 smem[];
    bf16* sK = smem;               // (BKV, HD), later the dK staging tile
    bf16* sV = sK + BKV * HD;      // (BKV, HD), later the dV staging tile
    bf16* sQ = sV + BKV * HD;      // 2 x (BQ, HD)
    bf16* sdO = sQ + 2 * BQ * HD;  // 2 x (BQ, HD)
    __shared__ float sD[BQ], sLse[BQ];
    const int tile = blockIdx.x;  // the first key tiles see the most queries: launched first
    const int kvh = blockIdx.y, b = blockIdx.z, group = L.NH / L.NKV;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t4 = lane & 3;
    const int stride = L.row(), C = L.NH * HD;
    const bf16* seq = qkv + (size_t)b * T * stride;
    const float scale = rsqrtf((float)HD), sl2 = scale * LOG2E;

    const int kv0 = tile * BKV, kv_last = min(kv0 + BKV, T) - 1;
    const int q_begin = kv0 / BQ * BQ, q_end = window > 0 ? min(T, kv_last + window) : T;
    const int n_qt = ceil_div(q_end - q_begin, BQ), n_it = group * n_qt;  // (head, query tile) pairs
    auto issue = [&](int it, int stage) {
        const int h = kvh * group + it / n_qt, i0 = q_begin + (it % n_qt) * BQ;
        load_tile_async<BQ, HD, NT>(sQ + stage * BQ * HD, seq + (size_t)i0 * stride + L.q_col(h), stride, T - i0);
        load_tile_async<BQ, HD, NT>(sdO + stage * BQ * HD, dout + ((size_t)b * T + i0) * C + h * HD, C, T - i0);
    };
    load_tile_async<BKV, HD, NT>(sK, seq + (size_t)kv0 * stride + L.k_col(kvh), stride, T - kv0);
    load_tile_async<BKV, HD, NT>(sV, seq + (size_t)kv0 * stride + L.v_col(kvh), stride, T - kv0);
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
        __syncthreads();
        float st[BQ / 8][4] = {}, dpt[BQ / 8][4] = {};
        mma_a_smem_b_nk<HD, BQ, HD>(st, sK, warp * 16, q_tile, 0);
        mma_a_smem_b_nk<HD, BQ, HD>(dpt, sV, warp * 16, do_tile, 0);
        const bool edge = i0 < kv0 + BKV - 1 || (window > 0 && i0 + BQ - 1 - kv0 >= window);
#pragma unroll
        for (int nb = 0; nb < BQ / 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = nb * 8 + 2 * t4 + (e & 1);
                float p = exp2f(fmaf(st[nb][e], sl2, -sLse[qi] * LOG2E));
                if (edge && !attends(i0 + qi, key[e >> 1], window)) p = 0.0f;
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

template <class CfgDQ, class CfgDKV>
inline void backward_flash(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse, int B,
                           int T, QKVLayout L, int window, cudaStream_t stream) {
    constexpr int smem_dq = CfgDQ::smem_bytes(2), smem_dkv = CfgDKV::smem_bytes(2);
    static const bool once = (allow_smem(attention_backward_dq_mma<CfgDQ>, smem_dq),
                              allow_smem(attention_backward_dkdv_mma<CfgDKV>, smem_dkv), true);
    (void)once;
    attention_backward_dkdv_mma<CfgDKV><<<dim3(ceil_div(T, CfgDKV::ROWS), L.NKV, B), CfgDKV::THREADS, smem_dkv, stream>>>(
        dqkv, dout, qkv, out, lse, T, L, window);
    cudaCheckLaunch();
    attention_backward_dq_mma<CfgDQ><<<dim3(ceil_div(T, CfgDQ::ROWS), L.NH, B), CfgDQ::THREADS, smem_dq, stream>>>(
        dqkv, dout, qkv, out, lse, T, L, window);
    cudaCheckLaunch();
}

// The shipped configuration, the fastest of dev/cuda's variants on the H200 (docs/perf.md):
//   HD 64: capped at 168 registers, 3 blocks/SM (variant 2: 166 TFLOP/s against 144 uncapped);
//   HD 128: uncapped (the cap spills: 145 against 169).
template <int HD>
using DQCfg = std::conditional_t<HD == 64, FlashCfg<64, 4, 64, 3>, FlashCfg<HD, 4, 32>>;
template <int HD>
using DKVCfg = std::conditional_t<HD == 64, FlashCfg<64, 4, 64, 3>, FlashCfg<HD, 4, 32>>;
}  // namespace attention_detail
