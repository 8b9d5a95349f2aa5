// attention_mma_forward.cuh: the tensor-core (mma.sync) attention forward kernel and its launcher.
// Internal part of llmc/attention.cuh, included from there only (it uses QKVLayout, attends and the
// common includes defined there); include llmc/attention.cuh instead.
#pragma once

namespace attention_detail {

// grid (ceil(T / ROWS), NH, B), THREADS threads, smem_bytes(1). Queries are the resident rows.
// FLOPs 4 * HD per visible (query, key) pair; bytes ~ (2 + T / ROWS) * T * HD * 2 per head (K/V
// re-read by every query tile, mostly from L2): compute-bound.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    attention_forward_mma(bf16* out, float* lse, const bf16* qkv, int T, QKVLayout L, int window) {
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
    const int kv_first = window > 0 ? max(0, q0 - window + 1) / BKV : 0, kv_last = q_last / BKV;
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
        const bool edge = kv0 + BKV - 1 > q0 || (window > 0 && q0 + BQ - 1 - kv0 >= window);
        if (edge) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nb = 0; nb < BKV / 8; nb++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (!attends(row0 + 16 * mt + 8 * (e >> 1), kv0 + nb * 8 + 2 * t4 + (e & 1), window))
                            s[mt][nb][e] = -INFINITY;
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = m[mt][r];
#pragma unroll
                for (int nb = 0; nb < BKV / 8; nb++) mx = fmaxf(mx, fmaxf(s[mt][nb][2 * r], s[mt][nb][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float base = mx == -INFINITY ? 0.0f : mx * sl2;  // a row with nothing visible yet stays 0
                const float corr = exp2f(m[mt][r] * sl2 - base);
                m[mt][r] = mx;
                l[mt][r] *= corr;
#pragma unroll
                for (int nd = 0; nd < HD / 8; nd++) o[mt][nd][2 * r] *= corr, o[mt][nd][2 * r + 1] *= corr;
#pragma unroll
                for (int nb = 0; nb < BKV / 8; nb++) {
                    s[mt][nb][2 * r] = exp2f(fmaf(s[mt][nb][2 * r], sl2, -base));
                    s[mt][nb][2 * r + 1] = exp2f(fmaf(s[mt][nb][2 * r + 1], sl2, -base));
                    l[mt][r] += s[mt][nb][2 * r] + s[mt][nb][2 * r + 1];
                }
            }
        mma_p_regs_b_kn<HD, BKV, MT>(o, s, v_tile, 0);
        __syncthreads();  // this stage is free for the prefetch two tiles on
    }

    // Normalise, stage this warp's rows in sQ (only this warp ever read them), store 16-byte chunks.
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lt = l[mt][r];
            lt += __shfl_xor_sync(0xffffffffu, lt, 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            inv[r] = 1.0f / lt;
            const int row = row0 + 16 * mt + 8 * r;
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

template <class Cfg>
inline void forward_flash(bf16* out, float* lse, const bf16* qkv, int B, int T, QKVLayout L, int window,
                          cudaStream_t stream) {
    constexpr int smem = Cfg::smem_bytes(1);
    static const bool once = (allow_smem(attention_forward_mma<Cfg>, smem), true);
    (void)once;
    attention_forward_mma<Cfg><<<dim3(ceil_div(T, Cfg::ROWS), L.NH, B), Cfg::THREADS, smem, stream>>>(out, lse, qkv, T,
                                                                                                     L, window);
    cudaCheckLaunch();
}

// The shipped configuration, the fastest of dev/cuda's variants on the H200 (docs/perf.md):
//   HD 64: 2 m16 tiles a warp (variant 4: 237 TFLOP/s against 208 with one, 250 registers);
//   HD 128: one m16 tile a warp, 64 keys a tile (270; 2 tiles a warp spill: 265).
template <int HD>
using FwdCfg = std::conditional_t<HD == 64, FlashCfg<64, 4, 64, 1, 2>, FlashCfg<HD, 4, 64>>;
}  // namespace attention_detail
