// attention_mma.cuh: what the tensor-core attention kernels share: the swizzled smem tile layout, the
// fragment loaders and the kernel configuration, on llmc/cuda_common.cuh's mma.sync/ldmatrix/cp.async.
#pragma once
#include "llmc/attention_layout.cuh"

namespace attention_detail {

// ============================================================================ tensor-core kernels
// FlashAttention-2 on mma.sync.m16n8k16 (bf16 in, fp32 accumulate), operands staged in shared memory
// by cp.async (double-buffered: the next tile's load overlaps this tile's math) and read into fragments
// by ldmatrix. Every warp owns 16 (or 32) rows of the tile it keeps in registers (queries in the
// forward and dQ kernels, keys in the dK/dV kernel) and sweeps the other operand's tiles, which the
// whole block shares. Tile budget as shipped (4 warps, 128 threads):
//   forward HD 64   BQ 128 (32 a warp) x BKV 64; smem Q + 2 stages of K,V = 48 KB; 250 registers
//                   (Q fragments 32, S 64, O 64): 2 blocks/SM.
//   forward HD 128  BQ 64 x BKV 64; smem 80 KB; 250 registers (Q 32, S 32, O 64): 2 blocks/SM.
//   dQ              BQ 64 x BKV 64 (HD 64, capped at 168 registers: 3 blocks/SM) or 32 (HD 128, 240
//                   registers for Q, dO, dQ, S and dP); smem Q, dO + 2 stages of K,V = 48 / 64 KB.
//   dK/dV           BKV 64 x BQ 64 (HD 64, 168 registers) or 32 (HD 128, 252); smem K, V + 2 stages
//                   of Q, dO = 48 / 64 KB.
// Roughly 0.7x (forward) and 0.4x (backward) of cuDNN; measurements and the dropped designs in
// dev/cuda/attention_forward.cu and attention_backward.cu. Why these choices:
//   * Each ldmatrix.x4 (512 B of smem) feeds 2 mma a m16 tile: with one m16 tile a warp that is 256 B
//     a mma against a budget of 128 (128 B/clk of smem, one mma/clk/SM), so the tensor pipe is at most
//     half busy; two tiles a warp (MT = 2) halve the traffic where the registers allow (forward HD 64).
//     The rest is wgmma's job (operands straight from smem): the Hopper kernels on sm_90a.
//   * Rows of 64/128 bf16 are 128/256 bytes, so the 8 rows one ldmatrix phase reads would all hit the
//     same banks: 16-byte chunks are XOR-swizzled by (row % 8) (swz below), conflict-free for both
//     the cp.async stores and every ldmatrix (plain and .trans).
//   * The softmax runs in base 2 (one FFMA + ex2.approx a score); lse is stored in natural log.
//   * The deterministic backward is two kernels, no atomics, no scratch: dK/dV (one block per key tile
//     and KV head, over the queries of every head in its GQA group: the group sum in registers) and dQ
//     (one block per query tile), which recomputes S and dP: 7 matmuls instead of FA2's 5.
//   * Causal: blocks start with the longest rows; tiles wholly in the future (or outside the window)
//     are never visited; only tiles that cross the diagonal or the window edge mask.
// Rows past T are zero-filled on load (cp.async src-size 0) and never stored; their lse is +inf in
// the backward so their probabilities are 0.
// One kernel configuration: WARPS warps own MT m16 tiles (16 * MT rows) each of the register-resident
// operand (ROWS a block); the streamed operand comes TILE rows a stage; MIN_BLOCKS: __launch_bounds__'s.
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

// cp.async of the K and V tiles of kv head kvh, ROWS keys from k0 (rows past T zero-filled), into sK
// and sV; seq: the sequence's first token row of qkv. No commit.
template <int ROWS, int HD, int NT>
__device__ __forceinline__ void load_kv_async(bf16* sK, bf16* sV, const bf16* seq, int k0, int T, const QKVLayout& L,
                                              int kvh) {
    const int stride = L.row();
    load_tile_async<ROWS, HD, NT>(sK, seq + (size_t)k0 * stride + L.k_col(kvh), stride, T - k0);
    load_tile_async<ROWS, HD, NT>(sV, seq + (size_t)k0 * stride + L.v_col(kvh), stride, T - k0);
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
// As mma_a_regs_b_nk, with A read from rows a_row0 + 16 mt.. of a smem tile one 16-column step at a
// time (keeps only 4 A registers live per m16 tile: the dK/dV kernels' accumulators need the rest).
template <int HD, int N, int K, int MT = 1>
__device__ __forceinline__ void mma_a_smem_b_nk(float (*acc)[N / 8][4], const bf16* a_tile, int a_row0,
                                                const bf16* tile, int n0) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) ldmatrix_x4(a[mt], frag_a<HD>(a_tile, a_row0 + mt * 16, kk * 16));
#pragma unroll
        for (int nb = 0; nb < N / 16; nb++) {
            uint32_t b[4];
            ldmatrix_x4(b, frag_b_nk<HD>(tile, n0 + nb * 16, kk * 16));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816(acc[mt][2 * nb], a[mt], b[0], b[1]);
                mma_16816(acc[mt][2 * nb + 1], a[mt], b[2], b[3]);
            }
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

}  // namespace attention_detail
