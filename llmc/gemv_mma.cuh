// gemv_mma.cuh: the fused decode GEMVs (gemv.cuh's gemv_fused_forward) on the tensor cores, for the
// bf16 build, where GemvPolicy::tensor_cores(M, K) takes them (M = 8). Same contract, fusions and
// outputs as gemv_kernel (gemv.cuh), up to the order of the fp32 additions of each dot product.
// Why: at M = 8 the CUDA-core kernel spends ~14 instructions a weight element (8 FMAs and the bf16
// conversions), as many issue cycles as the weight's DRAM time; mma.sync m16n8k16 takes a warp's 16
// weight rows x 8 inputs x 16 k in one instruction, so the kernel is left with the weight's loads.
// Operands: A = 16 weight rows (row-major, K contiguous), B = the M <= 8 input rows as its 8 columns
// (zeros past M), C = (16 rows, 8 inputs) fp32. The 16 A rows are 8 row groups of gemv_kernel at R = 2
// (rows_of: a SwiGLU or RoPE pair, or two consecutive rows): group j of a tile is A rows j and j + 8,
// so lane (j = lane / 4, t = lane % 4) ends holding both rows of group j for inputs 2t and 2t + 1, the
// pair store_outputs needs. k order: lane t loads the 8 consecutive k at kb + 8t of its A rows and of
// input row j, and feeds them to two mma's as the logical k (2t, 2t+1, 2t+8, 2t+9): the same
// permutation on A and B leaves every dot product unchanged.
// Work split: a block's W warps (the policy's GEMV_MMA_WARPS) share one tile of 8 groups, warp w taking
// the K slabs of 32 (4 packs) w, w + W, ..., GEMV_MMA_UNROLL slabs' loads (3 x 16 bytes a lane each)
// before their math; their sums meet in shared memory, added in warp order (deterministic), and warp 0
// stores the tile.
// The blocks loop over the tiles (a norm kernel's grid is one wave, as gemv_kernel's). PDL: the first
// round of weight loads is issued before pdl_wait.
#pragma once
#include "llmc/gemv.cuh"

namespace gemv_detail {

constexpr int GEMV_MMA_UNROLL = 4;                        // K slabs of 32 a warp loads before its math
constexpr int GEMV_MMA_GROUPS = 8;                        // row groups (pairs of A rows) a tile

// acc (16 x 8) += A (16 rows, 32 k) x B (32 k, 8 inputs) for one slab: lo, hi the lane's 8 k of A rows j
// and j + 8, x the same 8 k of input row j.
__device__ __forceinline__ void gemv_mma_slab(float (&acc)[4], const x128& lo, const x128& hi, const x128& x) {
    const uint32_t* l = reinterpret_cast<const uint32_t*>(&lo);
    const uint32_t* h = reinterpret_cast<const uint32_t*>(&hi);
    const uint32_t* b = reinterpret_cast<const uint32_t*>(&x);
    const uint32_t a0[4] = {l[0], h[0], l[1], h[1]}, a1[4] = {l[2], h[2], l[3], h[3]};
    mma_16816(acc, a0, b[0], b[1]);
    mma_16816(acc, a1, b[2], b[3]);
}

// The folded argmax's hand-off to argmax_finish: lane (j, t) holds candidates c[0], c[1] of inputs 2t,
// 2t + 1 over its group j; afterwards lane m < M of the warp holds input m's over the warp's groups.
__device__ inline sampler_detail::ArgMax gemv_mma_argmax_lanes(sampler_detail::ArgMax (&c)[2], int lane) {
    for (int o = 4; o < WARP_SIZE; o *= 2)
        for (int q = 0; q < 2; q++)
            sampler_detail::argmax_merge(c[q], {__shfl_xor_sync(0xffffffffu, c[q].v, o),
                                                __shfl_xor_sync(0xffffffffu, c[q].i, o)});
    const int from = (lane / 2) % 4;  // lane m reads lane m / 2 (t = m / 2, j = 0), its candidate m % 2
    sampler_detail::ArgMax r;
    const float v0 = __shfl_sync(0xffffffffu, c[0].v, from), v1 = __shfl_sync(0xffffffffu, c[1].v, from);
    const int i0 = __shfl_sync(0xffffffffu, c[0].i, from), i1 = __shfl_sync(0xffffffffu, c[1].i, from);
    r.v = lane % 2 ? v1 : v0;
    r.i = lane % 2 ? i1 : i0;
    return r;
}

// out = epilogue(norm(inp) W^T + bias) as gemv_kernel<M, 2, EPI, NORM> (gemv.cuh), on mma.sync, W warps a
// block (the folded argmax: GEMV_MMA_WARPS, argmax_finish's block).
template <int M, int EPI, bool NORM, int W = GEMV_MMA_WARPS>
__global__ void __launch_bounds__(W * WARP_SIZE)
gemv_mma_kernel(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int K, int N, GemvFusion f) {
#if defined(PRECISION_FP32) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
    (void)out, (void)inp, (void)weight, (void)bias, (void)K, (void)N, (void)f;  // bf16 mma.sync: sm_80+
#else
    constexpr int R = 2, U = GEMV_MMA_UNROLL;
    extern __shared__ x128 gemv_smem[];             // NORM: rows (M, K), norm weight (K), norm bias (K)
    __shared__ float4 part[W][WARP_SIZE];           // each warp's accumulators of the tile
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, j = lane / 4, t = lane % 4;
    const bool pair = EPI == GEMV_SWIGLU || (EPI == GEMV_QKV && f.rope_cos != nullptr);
    const int H = N / 2, groups = pair ? H : ceil_div(N, R), half = f.HD / 2;
    const int tiles = ceil_div(groups, GEMV_MMA_GROUPS), packs = K / x128::size, slabs = ceil_div(packs, 4);
    auto rows_of = [&](int g, int (&row)[R]) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (EPI == GEMV_SWIGLU) row[r] = g + r * H;
            else if (pair) row[r] = (g / half) * f.HD + g % half + r * half;
            else row[r] = min(g * R + r, N - 1);
        }
    };
    const x128 zero = x128::constant(from_float<floatX>(0.0f));
    x128 lo[U], hi[U];  // one round of weight loads: U slabs of the lane's two A rows
    auto load_weights = [&](const int (&row)[R], int s0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int s = s0 + u * W, pk = s * 4 + t;
            const bool in = s < slabs && pk < packs;
            lo[u] = in ? load128cs(weight + (int64_t)row[0] * K + pk * x128::size) : zero;
            hi[u] = in ? load128cs(weight + (int64_t)row[1] * K + pk * x128::size) : zero;
        }
    };
    // before the wait: the first tile's first round of weights, the norm's weight and bias
    bool loaded = false;
    if ((int)blockIdx.x < tiles) {
        int row[R];
        rows_of(min((int)blockIdx.x * GEMV_MMA_GROUPS + j, groups - 1), row);
        load_weights(row, warp);
        loaded = true;
    }
    const floatX* x = wait_for_inputs<M, NORM>(reinterpret_cast<floatX*>(gemv_smem), inp, K, f);
    const floatX* x_row = x + (int64_t)min(j, M - 1) * K;
    sampler_detail::ArgMax cand[2] = {{-INFINITY, f.argmax_cols}, {-INFINITY, f.argmax_cols}};
    for (int tb = blockIdx.x; tb < tiles; tb += gridDim.x) {  // block-uniform
        const int g_raw = tb * GEMV_MMA_GROUPS + j, g = min(g_raw, groups - 1);
        int row[R];
        rows_of(g, row);
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int s0 = warp; s0 < slabs; s0 += W * U) {
            if (!loaded) load_weights(row, s0);
            loaded = false;
            x128 xv[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int s = s0 + u * W, pk = s * 4 + t;
                xv[u] = s < slabs && pk < packs && j < M ? load128(x_row + pk * x128::size) : zero;
            }
#pragma unroll
            for (int u = 0; u < U; u++) gemv_mma_slab(acc, lo[u], hi[u], xv[u]);
        }
        loaded = false;  // (a warp with no slabs: K < 32 * warp)
        part[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        __syncthreads();
        if (warp == 0) {
            float4 s = part[0][lane];
#pragma unroll
            for (int w = 1; w < W; w++) {
                const float4 o = part[w][lane];
                s.x += o.x, s.y += o.y, s.z += o.z, s.w += o.w;
            }
            const float b0 = bias ? to_float(bias[row[0]]) : 0.0f, b1 = bias ? to_float(bias[row[1]]) : 0.0f;
            const int nrows = pair ? R : min(R, N - g * R);
            const float vals[2][2] = {{s.x + b0, s.z + b1}, {s.y + b0, s.w + b1}};  // [input 2t + q][row r]
            if (g_raw < groups)
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    const int m = 2 * t + q;
                    if (m >= M) continue;
                    float v[R] = {vals[q][0], vals[q][1]}, res_v[R] = {0.0f, 0.0f};
                    if constexpr (EPI == GEMV_RESIDUAL)
#pragma unroll
                        for (int r = 0; r < R; r++) res_v[r] = to_float(f.residual[(int64_t)m * N + row[r]]);
                    store_outputs<M, R, EPI>(out, v, res_v, row, nrows, m, N, g, pair, f, cand[q]);
                }
        }
        __syncthreads();  // part is free for the next tile
    }
    if constexpr (EPI == GEMV_PLAIN && W == GEMV_MMA_WARPS)
        if (f.argmax) {
            sampler_detail::ArgMax c = gemv_mma_argmax_lanes(cand, lane);  // warps 1..3: no candidates
            argmax_finish<M>(c, f);
        }
#endif
}

// One launch of gemv_mma_kernel<M, EPI, NORM, W> (bf16 build only), with the attribute when pdl.
template <int M, int EPI, bool NORM, int W>
inline void launch_mma(bool pdl, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int K,
                       int N, const GemvFusion& f, const CudaContext& ctx) {
    const bool pair = EPI == GEMV_SWIGLU || (EPI == GEMV_QKV && f.rope_cos != nullptr);
    int blocks = ceil_div(pair ? N / 2 : ceil_div(N, 2), GEMV_MMA_GROUPS);
    const size_t smem = NORM ? gemv_norm_smem(M, K) : 0;
    if constexpr (NORM) blocks = norm_grid(gemv_mma_kernel<M, EPI, NORM, W>, blocks, smem, ctx, W * WARP_SIZE);
    if (f.argmax && (EPI != GEMV_PLAIN || !NORM || W != GEMV_MMA_WARPS))
        fail("internal: the folded argmax needs a plain GEMV with its norm (a grid of one wave), %d warps a block",
             GEMV_MMA_WARPS);
    launch_kernel(gemv_mma_kernel<M, EPI, NORM, W>, dim3(blocks), dim3(W * WARP_SIZE), smem, ctx.stream, pdl, out,
                  inp, weight, bias, K, N, f);
}

}  // namespace gemv_detail
