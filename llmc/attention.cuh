// attention.cuh: causal multi-head self-attention (GQA and an optional sliding window) for the GPU
// trainer, forward and backward, FlashAttention style: the (T, T) score matrix never exists in memory.
//
// Shapes (row-major, straight from / into the matmuls around attention):
//   qkv  (B, T, (NH + 2*NKV) * HD)  per token: NH query heads, then NKV key heads, then NKV value heads
//   out  (B, T, NH * HD)            ready for the attention projection
//   lse  (B, NH, T) fp32            log-sum-exp of each query's scaled scores (natural log), saved by
//                                   the forward for the backward: P = exp(scale * q.k - lse)
//   dqkv (B, T, (NH + 2*NKV) * HD)  written with `=` (every element, dK/dV summed over the NH/NKV query
//                                   heads that share a key/value head)
// Query head h reads key/value head h / (NH / NKV). Scale 1/sqrt(HD). Causal: query t sees keys <= t;
// with window W > 0 only keys t-W+1..t (the convention of Mistral's sliding window).
// Precision: floatX operands (bf16 or fp32), every sum and the softmax in fp32.
//
// Two implementations, HD 64 or 128 (other head sizes are an error naming HD):
//   * attention_*_simple: scalar fp32 math, four threads per query (or key) row; ~12 TFLOP/s. The
//     FP32 build's path (tensor cores take no fp32), and the baseline in dev/cuda.
//   * attention_*_flash: bf16 tensor cores (mma.sync m16n8k16 fed by ldmatrix), FlashAttention-2
//     style; the bf16 build's path. Tile budget and measured speed in the comment above the kernels.
// attention_forward / attention_backward (at the end) pick the one for the build's floatX. Both are
// deterministic by construction: no atomics, every output element summed by one thread in a fixed
// order (not measured run against run).
#pragma once
#include <cmath>
#include <type_traits>
#include "cuda_common.cuh"
#include "utils.h"

namespace attention_detail {

// Token-row stride of qkv/dqkv and the column where each head starts inside a token row.
struct QKVLayout {
    int NH, NKV, HD;
    __host__ __device__ int row() const { return (NH + 2 * NKV) * HD; }
    __host__ __device__ int q_col(int h) const { return h * HD; }
    __host__ __device__ int k_col(int kvh) const { return (NH + kvh) * HD; }
    __host__ __device__ int v_col(int kvh) const { return (NH + NKV + kvh) * HD; }
};

// Whether query i may look at key j (both absolute positions).
__device__ __forceinline__ bool attends(int i, int j, int window) {
    return j <= i && (window == 0 || i - j < window);
}

// ============================================================================ simple kernels
// Mapping: SIMPLE_TPR threads own one query row (forward, dQ) or one key row (dK/dV); thread `part`
// holds dims part, part+4, part+8, ... so the four threads of a row read four consecutive smem words
// (no bank conflict) and a dot product is HD/4 FMAs a thread plus two shuffles. The other operand
// streams through shared memory SIMPLE_TILE rows at a time, one smem load per FMA: bound by the
// load/store pipe at ~12 TFLOP/s forward, ~10 backward on the H200 (fp32 peak 67); fine for the FP32
// build, 20x below the tensor-core kernels.
constexpr int SIMPLE_TPR = 4;
constexpr int SIMPLE_ROWS = 64;  // rows owned per block: 256 threads
constexpr int SIMPLE_TILE = 32;  // rows of the streamed operand per smem tile
constexpr int SIMPLE_THREADS = SIMPLE_ROWS * SIMPLE_TPR;

__device__ __forceinline__ float sum_over_row_threads(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

// Copies rows [row0, row0 + SIMPLE_TILE) of one head (HD columns at `col`) into fp32 smem, zeros past T.
template <int HD>
__device__ void simple_load_tile(float (*dst)[HD], const floatX* src, int row0, int T, int stride, int col) {
    for (int idx = threadIdx.x; idx < SIMPLE_TILE * HD; idx += blockDim.x) {
        int r = idx / HD, d = idx % HD, row = row0 + r;
        dst[r][d] = row < T ? to_float(src[(size_t)row * stride + col + d]) : 0.0f;
    }
}

// grid (ceil(T / SIMPLE_ROWS), NH, B), SIMPLE_THREADS threads.
template <int HD>
__global__ void __launch_bounds__(SIMPLE_THREADS) attention_forward_simple(floatX* out, float* lse, const floatX* qkv,
                                                                         int T, QKVLayout L, int window) {
    constexpr int DPT = HD / SIMPLE_TPR;
    __shared__ float sK[SIMPLE_TILE][HD], sV[SIMPLE_TILE][HD];
    const int tile = gridDim.x - 1 - blockIdx.x;  // longest rows first: the causal work is a triangle
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (L.NH / L.NKV);
    const int part = threadIdx.x % SIMPLE_TPR;
    const int i = tile * SIMPLE_ROWS + threadIdx.x / SIMPLE_TPR;  // this row's query
    const int stride = L.row();
    const floatX* seq = qkv + (size_t)b * T * stride;
    const float scale = rsqrtf((float)HD);

    float q[DPT], o[DPT];
    const floatX* qrow = seq + (size_t)min(i, T - 1) * stride + L.q_col(h);
    for (int d = 0; d < DPT; d++) q[d] = to_float(qrow[part + SIMPLE_TPR * d]) * scale, o[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;  // running max and sum of exp(score - m)

    const int first = tile * SIMPLE_ROWS, last = min(first + SIMPLE_ROWS, T) - 1;
    const int k_begin = window > 0 ? max(0, first - window + 1) / SIMPLE_TILE * SIMPLE_TILE : 0;
    for (int k0 = k_begin; k0 <= last; k0 += SIMPLE_TILE) {
        __syncthreads();  // the previous tile is consumed
        simple_load_tile<HD>(sK, seq, k0, T, stride, L.k_col(kvh));
        simple_load_tile<HD>(sV, seq, k0, T, stride, L.v_col(kvh));
        __syncthreads();
        float s[SIMPLE_TILE], m_new = m;
#pragma unroll
        for (int j = 0; j < SIMPLE_TILE; j++) {
            float dot = 0.0f;
            for (int d = 0; d < DPT; d++) dot += q[d] * sK[j][part + SIMPLE_TPR * d];
            dot = sum_over_row_threads(dot);
            s[j] = attends(i, k0 + j, window) ? dot : -INFINITY;
            m_new = fmaxf(m_new, s[j]);
        }
        if (m_new == -INFINITY) continue;  // nothing visible yet in this tile for this row
        const float corr = expf(m - m_new);  // 0 on the first visible tile (m = -inf)
        l *= corr;
        for (int d = 0; d < DPT; d++) o[d] *= corr;
#pragma unroll
        for (int j = 0; j < SIMPLE_TILE; j++) {
            const float p = expf(s[j] - m_new);
            l += p;
            for (int d = 0; d < DPT; d++) o[d] += p * sV[j][part + SIMPLE_TPR * d];
        }
        m = m_new;
    }
    if (i >= T) return;
    floatX* orow = out + ((size_t)b * T + i) * L.NH * HD + h * HD;
    for (int d = 0; d < DPT; d++) orow[part + SIMPLE_TPR * d] = from_float<floatX>(o[d] / l);
    if (part == 0) lse[((size_t)b * L.NH + h) * T + i] = m + logf(l);
}

// dQ for one query row: dQ_i = scale * sum_j P_ij (dP_ij - D_i) k_j with dP_ij = dO_i . v_j and
// D_i = dO_i . O_i. grid (ceil(T / SIMPLE_ROWS), NH, B), SIMPLE_THREADS threads.
template <int HD>
__global__ void __launch_bounds__(SIMPLE_THREADS)
    attention_backward_dq_simple(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                 const float* lse, int T, QKVLayout L, int window) {
    constexpr int DPT = HD / SIMPLE_TPR;
    __shared__ float sK[SIMPLE_TILE][HD], sV[SIMPLE_TILE][HD];
    const int tile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (L.NH / L.NKV);
    const int part = threadIdx.x % SIMPLE_TPR;
    const int i = tile * SIMPLE_ROWS + threadIdx.x / SIMPLE_TPR, ic = min(i, T - 1);
    const int stride = L.row(), C = L.NH * HD;
    const floatX* seq = qkv + (size_t)b * T * stride;
    const float scale = rsqrtf((float)HD);

    float q[DPT], dO[DPT], dq[DPT], D = 0.0f;
    const floatX* qrow = seq + (size_t)ic * stride + L.q_col(h);
    const floatX* dorow = dout + ((size_t)b * T + ic) * C + h * HD;
    const floatX* orow = out + ((size_t)b * T + ic) * C + h * HD;
    for (int d = 0; d < DPT; d++) {
        const int c = part + SIMPLE_TPR * d;
        q[d] = to_float(qrow[c]) * scale, dO[d] = to_float(dorow[c]), dq[d] = 0.0f;
        D += dO[d] * to_float(orow[c]);
    }
    D = sum_over_row_threads(D);
    const float row_lse = lse[((size_t)b * L.NH + h) * T + ic];

    const int first = tile * SIMPLE_ROWS, last = min(first + SIMPLE_ROWS, T) - 1;
    const int k_begin = window > 0 ? max(0, first - window + 1) / SIMPLE_TILE * SIMPLE_TILE : 0;
    for (int k0 = k_begin; k0 <= last; k0 += SIMPLE_TILE) {
        __syncthreads();
        simple_load_tile<HD>(sK, seq, k0, T, stride, L.k_col(kvh));
        simple_load_tile<HD>(sV, seq, k0, T, stride, L.v_col(kvh));
        __syncthreads();
        for (int j = 0; j < SIMPLE_TILE; j++) {
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < DPT; d++) {
                s += q[d] * sK[j][part + SIMPLE_TPR * d];
                dp += dO[d] * sV[j][part + SIMPLE_TPR * d];
            }
            s = sum_over_row_threads(s);
            dp = sum_over_row_threads(dp);
            if (!attends(i, k0 + j, window)) continue;
            const float ds = expf(s - row_lse) * (dp - D);
            for (int d = 0; d < DPT; d++) dq[d] += ds * sK[j][part + SIMPLE_TPR * d];
        }
    }
    if (i >= T) return;
    floatX* dqrow = dqkv + ((size_t)b * T + i) * stride + L.q_col(h);
    for (int d = 0; d < DPT; d++) dqrow[part + SIMPLE_TPR * d] = from_float<floatX>(dq[d] * scale);
}

// dK, dV for one key row, summed over the query heads of its group (no atomics, deterministic):
// dV_j = sum_i P_ij dO_i, dK_j = scale * sum_i P_ij (dP_ij - D_i) q_i.
// grid (ceil(T / SIMPLE_ROWS), NKV, B), SIMPLE_THREADS threads.
template <int HD>
__global__ void __launch_bounds__(SIMPLE_THREADS)
    attention_backward_dkdv_simple(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                   const float* lse, int T, QKVLayout L, int window) {
    constexpr int DPT = HD / SIMPLE_TPR;
    __shared__ float sQ[SIMPLE_TILE][HD], sdO[SIMPLE_TILE][HD];
    __shared__ float sLse[SIMPLE_TILE], sD[SIMPLE_TILE];
    const int tile = blockIdx.x;  // the first key tiles see the most queries: launch them first
    const int kvh = blockIdx.y, b = blockIdx.z, group = L.NH / L.NKV;
    const int part = threadIdx.x % SIMPLE_TPR;
    const int j = tile * SIMPLE_ROWS + threadIdx.x / SIMPLE_TPR, jc = min(j, T - 1);
    const int stride = L.row(), C = L.NH * HD;
    const floatX* seq = qkv + (size_t)b * T * stride;
    const float scale = rsqrtf((float)HD);

    float k[DPT], v[DPT], dk[DPT], dv[DPT];
    for (int d = 0; d < DPT; d++) {
        const int c = part + SIMPLE_TPR * d;
        k[d] = to_float(seq[(size_t)jc * stride + L.k_col(kvh) + c]) * scale;
        v[d] = to_float(seq[(size_t)jc * stride + L.v_col(kvh) + c]);
        dk[d] = 0.0f, dv[d] = 0.0f;
    }
    const int first = tile * SIMPLE_ROWS, last = min(first + SIMPLE_ROWS, T) - 1;
    const int q_end = window > 0 ? min(T, last + window) : T;  // queries past this see none of our keys
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        for (int q0 = first / SIMPLE_TILE * SIMPLE_TILE; q0 < q_end; q0 += SIMPLE_TILE) {
            __syncthreads();
            simple_load_tile<HD>(sQ, seq, q0, T, stride, L.q_col(h));
            simple_load_tile<HD>(sdO, dout + (size_t)b * T * C, q0, T, C, h * HD);
            __syncthreads();
            // D_i = dO_i . O_i, eight threads per row (SIMPLE_THREADS / SIMPLE_TILE)
            {
                constexpr int TPQ = SIMPLE_THREADS / SIMPLE_TILE;
                const int r = threadIdx.x / TPQ, sub = threadIdx.x % TPQ, row = min(q0 + r, T - 1);
                const floatX* orow = out + ((size_t)b * T + row) * C + h * HD;
                float D = 0.0f;
                for (int d = sub; d < HD; d += TPQ) D += sdO[r][d] * to_float(orow[d]);
                for (int o = TPQ / 2; o > 0; o >>= 1) D += __shfl_xor_sync(0xffffffffu, D, o);
                if (sub == 0) {
                    sD[r] = D;
                    // rows past T get lse = +inf, so P = 0 for them
                    sLse[r] = q0 + r < T ? lse[((size_t)b * L.NH + h) * T + q0 + r] : INFINITY;
                }
            }
            __syncthreads();
            for (int r = 0; r < SIMPLE_TILE; r++) {
                float s = 0.0f, dp = 0.0f;
                for (int d = 0; d < DPT; d++) {
                    s += k[d] * sQ[r][part + SIMPLE_TPR * d];
                    dp += v[d] * sdO[r][part + SIMPLE_TPR * d];
                }
                s = sum_over_row_threads(s);
                dp = sum_over_row_threads(dp);
                if (!attends(q0 + r, j, window)) continue;
                const float p = expf(s - sLse[r]), ds = p * (dp - sD[r]);
                for (int d = 0; d < DPT; d++) {
                    dv[d] += p * sdO[r][part + SIMPLE_TPR * d];
                    dk[d] += ds * sQ[r][part + SIMPLE_TPR * d];
                }
            }
        }
    }
    if (j >= T) return;
    floatX* row = dqkv + ((size_t)b * T + j) * stride;
    for (int d = 0; d < DPT; d++) {
        const int c = part + SIMPLE_TPR * d;
        row[L.k_col(kvh) + c] = from_float<floatX>(dk[d] * scale);
        row[L.v_col(kvh) + c] = from_float<floatX>(dv[d]);
    }
}

// ============================================================================ tensor-core kernels
// FlashAttention-2 on mma.sync.m16n8k16 (bf16 in, fp32 accumulate), operands staged in shared memory
// by cp.async and read into fragments by ldmatrix. Every warp owns 16 (or 32) rows of the tile it
// keeps in registers (queries in the forward and dQ kernels, keys in the dK/dV kernel) and sweeps the
// other operand's tiles, which the whole block shares. Tile budget as shipped (4 warps, 128 threads):
//   forward HD 64   BQ 128 (32 a warp) x BKV 64; smem Q + 2 stages of K,V = 48 KB; 250 registers
//                   (Q fragments 32, S 64, O 64): 2 blocks/SM.
//   forward HD 128  BQ 64 x BKV 64; smem 80 KB; 250 registers (Q 32, S 32, O 64): 2 blocks/SM.
//   dQ              BQ 64 x BKV 64 (HD 64, capped at 168 registers: 3 blocks/SM) or 32 (HD 128, 240
//                   registers for Q, dO, dQ, S and dP); smem Q, dO + 2 stages of K,V = 48 / 64 KB.
//   dK/dV           BKV 64 x BQ 64 (HD 64, 168 registers) or 32 (HD 128, 252); smem K, V + 2 stages
//                   of Q, dO = 48 / 64 KB.
// Measured (H200, docs/perf.md "Attention"), TFLOP/s with cuDNN 9 side by side: at GPT-2's shape
// (B 64, NH 12, T 1024, HD 64) forward 237 vs 322, backward 166 vs 246, the pair ~182 vs 262; at
// T 4096 HD 128 forward 270 vs 556, backward 169 vs 455. Roughly 0.7x and 0.4x of cuDNN.
// Why these choices, and what each bought:
//   * m16n8k16 mma fed by ldmatrix.x4: each x4 (512 B of smem) feeds 2 mma a m16 tile; with one
//     m16 tile a warp that is 256 B a mma against a budget of 128 (128 B/clk of smem against one
//     mma/clk/SM), so the tensor pipe can be at most half busy. Two tiles a warp (MT = 2) halve the
//     traffic: +14% at HD 64 (208 -> 237); at HD 128 the registers spill and it loses (270 -> 265).
//     What remains is wgmma's job (operands straight from smem, 64-row warpgroup tiles): not done.
//   * Rows of 64/128 bf16 are 128/256 bytes, so the 8 rows one ldmatrix phase reads would all hit the
//     same banks: 16-byte chunks are XOR-swizzled by (row % 8) (swz below), conflict-free for both
//     the cp.async stores and every ldmatrix (plain and .trans).
//   * Double-buffered cp.async: the next tile's load overlaps this tile's math.
//   * The softmax runs in base 2 (one FFMA + ex2.approx a score); lse is stored in natural log.
//   * The backward is two kernels, no atomics, no scratch: dK/dV (one block per key tile and KV head,
//     looping over the queries of every head in its GQA group, so the group sum happens in registers)
//     and dQ (one block per query tile). The dQ pass recomputes S and dP: 7 matmuls instead of FA2's
//     5, bought for determinism (bit-identical runs) and for needing no fp32 dQ buffer outside the
//     interface. D = rowsum(dO * O) is recomputed by both from dO (in smem) and O (from global).
//   * Register caps: 3 blocks/SM for the HD 64 backward (+15%); 8-warp blocks lost everywhere
//     (backward 127 vs 144, windowed forward 148 vs 188); 128-key forward tiles gained nothing.
//   * Causal: blocks start with the longest rows; tiles wholly in the future (or wholly outside the
//     sliding window) are never visited; only tiles that cross the diagonal or the window edge mask.
// Rows past T are zero-filled on load (cp.async src-size 0) and never stored; their lse is +inf in
// the backward so their probabilities are 0.
// One kernel configuration: WARPS warps own MT m16 tiles (16 * MT rows) each of the register-resident
// operand (ROWS a block); the streamed operand comes TILE rows a smem stage; MIN_BLOCKS is
// __launch_bounds__'s register cap. MT = 2 makes every ldmatrix of the streamed operand feed two
// mma (half the smem traffic per FLOP) at twice the accumulator registers: forward only.
// The shipped choices are in the launchers at the end; dev/cuda times others.
template <int HD_, int WARPS_, int TILE_, int MIN_BLOCKS_ = 1, int MT_ = 1>
struct FlashCfg {
    static constexpr int HD = HD_, WARPS = WARPS_, THREADS = WARPS_ * WARP_SIZE, MT = MT_, WROWS = 16 * MT_,
                         ROWS = WROWS * WARPS_, TILE = TILE_, MIN_BLOCKS = MIN_BLOCKS_;
    // every kernel holds two ROWS-row tiles or one, and two stages of two TILE-row tiles
    static constexpr int smem_bytes(int resident_tiles) { return (resident_tiles * ROWS + 4 * TILE) * HD * 2; }
    static_assert(HD % 16 == 0 && TILE % 16 == 0, "mma steps are 16 wide");
};
constexpr float LOG2E = 1.4426950408889634f;
typedef __nv_bfloat16 bf16;

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16-byte async copy global -> shared; zero-fills when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
// c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col)
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats as a bf16 pair, the first in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Element (r, c) of a swizzled (rows, HD) bf16 tile: 16-byte chunk c/8 of row r sits at chunk (c/8) ^ (r%8).
template <int HD>
__device__ __forceinline__ int swz(int r, int c) {
    return r * HD + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7);
}

// Issues cp.async for rows [0, ROWS) of a tile whose row 0 is at `src` (row stride `stride` elements);
// rows >= valid_rows are zero-filled. All NT threads of the block take part.
template <int ROWS, int HD, int NT>
__device__ __forceinline__ void load_tile_async(bf16* dst, const bf16* src, int stride, int valid_rows) {
    constexpr int CHUNKS = HD / 8;
    static_assert((ROWS * CHUNKS) % NT == 0, "a tile must split evenly over the block's threads");
#pragma unroll
    for (int i = 0; i < ROWS * CHUNKS / NT; i++) {
        const int idx = i * NT + threadIdx.x, r = idx / CHUNKS, c = (idx % CHUNKS) * 8;
        const bool valid = r < valid_rows;
        cp_async16(dst + swz<HD>(r, c), src + (size_t)(valid ? r : 0) * stride + c, valid);
    }
}

// Copies this warp's WR rows [row0, row0 + WR) of a swizzled smem tile to global rows < valid_rows.
template <int HD, int WR = 16>
__device__ __forceinline__ void store_warp_rows(bf16* dst, int stride, const bf16* tile, int row0, int valid_rows) {
    constexpr int CHUNKS = HD / 8;
    const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int i = 0; i < WR * CHUNKS / WARP_SIZE; i++) {
        const int idx = i * WARP_SIZE + lane, r = row0 + idx / CHUNKS, c = (idx % CHUNKS) * 8;
        if (r < valid_rows)
            *reinterpret_cast<int4*>(dst + (size_t)r * stride + c) = *reinterpret_cast<const int4*>(tile + swz<HD>(r, c));
    }
}

// Writes a warp's 16 x HD fp32 accumulator (C-fragment layout, times `mul`) into its rows of a tile.
template <int HD>
__device__ __forceinline__ void acc_to_tile(bf16* tile, int row0, const float (*acc)[4], float mul) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int nb = 0; nb < HD / 8; nb++) {
        const int c = nb * 8 + 2 * t4;
        *reinterpret_cast<uint32_t*>(tile + swz<HD>(row0 + g, c)) = pack_bf16(acc[nb][0] * mul, acc[nb][1] * mul);
        *reinterpret_cast<uint32_t*>(tile + swz<HD>(row0 + g + 8, c)) = pack_bf16(acc[nb][2] * mul, acc[nb][3] * mul);
    }
}

// ldmatrix addressing (lane -> the row it points at), for a 16x16 step at (row0, col0) of a tile:
//   A operand from a row-major [m][k] tile: registers a0..a3.
template <int HD>
__device__ __forceinline__ const bf16* frag_a(const bf16* tile, int row0, int col0) {
    const int lane = threadIdx.x % WARP_SIZE;
    return tile + swz<HD>(row0 + (lane & 15), col0 + (lane >> 4) * 8);
}
//   B operand for two n-blocks from a row-major [n][k] tile (x4: b0,b1 of n-block 0, b0,b1 of n-block 1).
template <int HD>
__device__ __forceinline__ const bf16* frag_b_nk(const bf16* tile, int row0, int col0) {
    const int lane = threadIdx.x % WARP_SIZE;
    return tile + swz<HD>(row0 + (lane & 7) + ((lane >> 4) << 3), col0 + ((lane >> 3) & 1) * 8);
}
//   B operand for two n-blocks from a row-major [k][n] tile, read with .trans (same register order).
template <int HD>
__device__ __forceinline__ const bf16* frag_b_kn(const bf16* tile, int row0, int col0) {
    const int lane = threadIdx.x % WARP_SIZE;
    return tile + swz<HD>(row0 + (lane & 7) + ((lane >> 3) & 1) * 8, col0 + (lane >> 4) * 8);
}

// For each of MT m16 tiles: acc[mt] (16 x N, N/8 C-fragments) += A[mt] (16 x K, fragments in
// registers, K/16 of them) * B, B from a [n][k] tile (so acc = A * tile^T), rows n0.. of the tile.
// Each B fragment loaded feeds MT tiles.
template <int HD, int N, int K, int MT = 1>
__device__ __forceinline__ void mma_a_regs_b_nk(float (*acc)[N / 8][4], const uint32_t (*a)[K / 16][4], const bf16* tile,
                                                int n0) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++)
#pragma unroll
        for (int nb = 0; nb < N / 16; nb++) {
            uint32_t b[4];
            ldmatrix_x4(b, frag_b_nk<HD>(tile, n0 + nb * 16, kk * 16));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816(acc[mt][2 * nb], a[mt][kk], b[0], b[1]);
                mma_16816(acc[mt][2 * nb + 1], a[mt][kk], b[2], b[3]);
            }
        }
}
// For each of MT m16 tiles: acc[mt] (16 x HD) += P[mt] (16 x K as C-fragments, K/8 of them,
// converted to bf16 A fragments) * tile, the tile [k][n] with rows k0.. (P V in the forward, P^T dO
// and dS^T Q in dK/dV, dS K in dQ).
template <int HD, int K, int MT = 1>
__device__ __forceinline__ void mma_p_regs_b_kn(float (*acc)[HD / 8][4], const float (*p)[K / 8][4], const bf16* tile,
                                                int k0) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            a[mt][0] = pack_bf16(p[mt][2 * kk][0], p[mt][2 * kk][1]);
            a[mt][1] = pack_bf16(p[mt][2 * kk][2], p[mt][2 * kk][3]);
            a[mt][2] = pack_bf16(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
            a[mt][3] = pack_bf16(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int nd = 0; nd < HD / 16; nd++) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, frag_b_kn<HD>(tile, k0 + kk * 16, nd * 16));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816(acc[mt][2 * nd], a[mt], b[0], b[1]);
                mma_16816(acc[mt][2 * nd + 1], a[mt], b[2], b[3]);
            }
        }
    }
}
// As mma_a_regs_b_nk, with A read from rows a_row0.. of a smem tile one 16-column step at a time
// (keeps only 4 A registers live: the dK/dV kernel's accumulators need the rest).
template <int HD, int N, int K>
__device__ __forceinline__ void mma_a_smem_b_nk(float (*acc)[4], const bf16* a_tile, int a_row0, const bf16* tile,
                                                int n0) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t a[4];
        ldmatrix_x4(a, frag_a<HD>(a_tile, a_row0, kk * 16));
#pragma unroll
        for (int nb = 0; nb < N / 16; nb++) {
            uint32_t b[4];
            ldmatrix_x4(b, frag_b_nk<HD>(tile, n0 + nb * 16, kk * 16));
            mma_16816(acc[2 * nb], a, b[0], b[1]);
            mma_16816(acc[2 * nb + 1], a, b[2], b[3]);
        }
    }
}
// Loads the A fragments of a warp's 16 rows (row0..) of a tile: K/16 steps over the columns.
template <int HD, int K>
__device__ __forceinline__ void load_a_frags(uint32_t (*a)[4], const bf16* tile, int row0) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) ldmatrix_x4(a[kk], frag_a<HD>(tile, row0, kk * 16));
}

// D_r = dO_r . O_r and lse_r for rows [0, ROWS) of a tile (dO in swizzled smem, O in global); rows
// >= valid_rows get D = 0, lse = +inf. NT / ROWS consecutive threads share a row.
template <int ROWS, int HD, int NT>
__device__ __forceinline__ void rows_d_lse(float* sD, float* sLse, const bf16* sdO, const bf16* O, int o_stride,
                                           const float* lse_rows, int valid_rows) {
    constexpr int TPR = NT / ROWS, CPT = HD / 8 / TPR;  // threads a row, chunks a thread
    static_assert(NT % ROWS == 0 && (HD / 8) % TPR == 0 && TPR <= WARP_SIZE, "row split");
    const int r = threadIdx.x / TPR, sub = threadIdx.x % TPR;
    const bool valid = r < valid_rows;
    float D = 0.0f;
    if (valid) {
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            const int c = (sub * CPT + i) * 8;
            const Packed128<bf16> o = load128(O + (size_t)r * o_stride + c), d = load128(sdO + swz<HD>(r, c));
#pragma unroll
            for (int k = 0; k < 8; k++) D += to_float(o[k]) * to_float(d[k]);
        }
    }
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) D += __shfl_xor_sync(0xffffffffu, D, off);
    if (sub == 0) {
        sD[r] = D;
        sLse[r] = valid ? lse_rows[r] : INFINITY;
    }
}

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

// Checks the sizes every implementation needs; a bad one is a caller bug, reported in one line.
inline void check_attention_sizes(const char* what, int B, int T, int NH, int NKV, int HD, int window) {
    if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0 || HD <= 0 || window < 0)
        fail("%s: sizes must be positive (B=%d T=%d NH=%d NKV=%d HD=%d window=%d)", what, B, T, NH, NKV, HD, window);
    if (NH % NKV != 0) fail("%s: NKV=%d must divide NH=%d", what, NKV, NH);
    if (HD != 64 && HD != 128) fail("%s: head size HD=%d is not supported (64 or 128)", what, HD);
}

}  // namespace attention_detail

// The simple kernels on their own: the FP32 build's path, and a baseline in dev/cuda.
inline void attention_forward_simple(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int NKV, int HD,
                                     cudaStream_t stream, int window = 0) {
    using namespace attention_detail;
    check_attention_sizes("attention_forward", B, T, NH, NKV, HD, window);
    const QKVLayout L{NH, NKV, HD};
    const dim3 grid(ceil_div(T, SIMPLE_ROWS), NH, B);
    if (HD == 64) attention_forward_simple<64><<<grid, SIMPLE_THREADS, 0, stream>>>(out, lse, qkv, T, L, window);
    else attention_forward_simple<128><<<grid, SIMPLE_THREADS, 0, stream>>>(out, lse, qkv, T, L, window);
    cudaCheckLaunch();
}

inline void attention_backward_simple(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                      const float* lse, int B, int T, int NH, int NKV, int HD, cudaStream_t stream,
                                      int window = 0) {
    using namespace attention_detail;
    check_attention_sizes("attention_backward", B, T, NH, NKV, HD, window);
    const QKVLayout L{NH, NKV, HD};
    const dim3 grid_q(ceil_div(T, SIMPLE_ROWS), NH, B), grid_kv(ceil_div(T, SIMPLE_ROWS), NKV, B);
    if (HD == 64) {
        attention_backward_dq_simple<64><<<grid_q, SIMPLE_THREADS, 0, stream>>>(dqkv, dout, qkv, out, lse, T, L, window);
        cudaCheckLaunch();
        attention_backward_dkdv_simple<64><<<grid_kv, SIMPLE_THREADS, 0, stream>>>(dqkv, dout, qkv, out, lse, T, L, window);
    } else {
        attention_backward_dq_simple<128><<<grid_q, SIMPLE_THREADS, 0, stream>>>(dqkv, dout, qkv, out, lse, T, L, window);
        cudaCheckLaunch();
        attention_backward_dkdv_simple<128><<<grid_kv, SIMPLE_THREADS, 0, stream>>>(dqkv, dout, qkv, out, lse, T, L, window);
    }
    cudaCheckLaunch();
}

// The tensor-core kernels (bf16 only): what the launchers below use in the bf16 build.
namespace attention_detail {
inline bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

// Raises a kernel's dynamic smem limit once per process (the attribute outlives the call).
template <typename Kernel>
inline void allow_smem(Kernel kernel, int bytes) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
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

// The shipped configurations, the fastest of dev/cuda's variants on the H200 (docs/perf.md):
//   forward HD 64: 2 m16 tiles a warp (variant 4: 237 TFLOP/s against 208 with one, 250 registers);
//   forward HD 128: one m16 tile a warp, 64 keys a tile (270; 2 tiles a warp spill: 265);
//   backward HD 64: capped at 168 registers, 3 blocks/SM (variant 2: 166 against 144 uncapped);
//   backward HD 128: uncapped (the cap spills: 145 against 169).
template <int HD>
using FwdCfg = std::conditional_t<HD == 64, FlashCfg<64, 4, 64, 1, 2>, FlashCfg<HD, 4, 64>>;
template <int HD>
using DQCfg = std::conditional_t<HD == 64, FlashCfg<64, 4, 64, 3>, FlashCfg<HD, 4, 32>>;
template <int HD>
using DKVCfg = std::conditional_t<HD == 64, FlashCfg<64, 4, 64, 3>, FlashCfg<HD, 4, 32>>;
}  // namespace attention_detail

// FlashAttention-2 on tensor cores; bf16 tensors, HD 64 or 128, every pointer 16-byte aligned.
inline void attention_forward_flash(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH,
                                    int NKV, int HD, cudaStream_t stream, int window = 0) {
    using namespace attention_detail;
    check_attention_sizes("attention_forward", B, T, NH, NKV, HD, window);
    if (!aligned16(out) || !aligned16(qkv)) fail("attention_forward: out and qkv must be 16-byte aligned");
    const QKVLayout L{NH, NKV, HD};
    if (HD == 64) forward_flash<FwdCfg<64>>(out, lse, qkv, B, T, L, window, stream);
    else forward_flash<FwdCfg<128>>(out, lse, qkv, B, T, L, window, stream);
}

inline void attention_backward_flash(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                                     const __nv_bfloat16* out, const float* lse, int B, int T, int NH, int NKV, int HD,
                                     cudaStream_t stream, int window = 0) {
    using namespace attention_detail;
    check_attention_sizes("attention_backward", B, T, NH, NKV, HD, window);
    if (!aligned16(dqkv) || !aligned16(dout) || !aligned16(qkv) || !aligned16(out))
        fail("attention_backward: dqkv, dout, qkv and out must be 16-byte aligned");
    const QKVLayout L{NH, NKV, HD};
    if (HD == 64) backward_flash<DQCfg<64>, DKVCfg<64>>(dqkv, dout, qkv, out, lse, B, T, L, window, stream);
    else backward_flash<DQCfg<128>, DKVCfg<128>>(dqkv, dout, qkv, out, lse, B, T, L, window, stream);
}

// ============================================================================ the launchers
// bf16 build: the tensor-core kernels; FP32 build: the simple kernels (tensor cores take no fp32).
inline void attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int NKV, int HD,
                              cudaStream_t stream, int window = 0) {
#if defined(PRECISION_FP32)
    attention_forward_simple(out, lse, qkv, B, T, NH, NKV, HD, stream, window);
#else
    attention_forward_flash(out, lse, qkv, B, T, NH, NKV, HD, stream, window);
#endif
}

inline void attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                               int B, int T, int NH, int NKV, int HD, cudaStream_t stream, int window = 0) {
#if defined(PRECISION_FP32)
    attention_backward_simple(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, stream, window);
#else
    attention_backward_flash(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, stream, window);
#endif
}
