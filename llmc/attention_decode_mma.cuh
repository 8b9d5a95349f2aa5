// attention_decode_mma.cuh: the decode attention on tensor cores, bf16 only (mma.sync takes no fp32
// operands: the FP32 build has none of it). The shapes and result of attention_decode
// (attention_decode.cuh: qkv, caches (B, NKV, S, HD), pos on the device, out (B, NH * HD) written (=),
// windows, idle sequences), HD 64 or 128, groups G = NH / NKV of up to 16 query heads. It reads the
// caches only: this step's K/V must already be in them (kv_cache_append). attention_decode routes the
// batched decode here (decode_mma_route says where and why); the lab (dev/cuda/attention_decode.cu)
// times and checks it; at B 64 it reaches the copy ceiling (docs/perf.md, "Decode attention").
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include "llmc/attention_mma.cuh"
#include "llmc/kv_cache.cuh"

#if !defined(PRECISION_FP32)
namespace attention_detail {

// The G query heads of a KV head are the 16 rows of an m16n8k16 A tile (rows >= G: zero queries, their
// outputs never written), so S = Q K^T and O += P V run on the tensor cores (the CUDA-core kernel is
// issue-bound at G 4; the Triton twin is dev/triton/attention_decode.py).
// Mapping: grid (splits, B * NKV); a block of 4 warps owns (sequence b, KV head kvh, split) and keys
// [lo, hi) of the span, in 64-key tiles staged in shared memory by cp.async (3 stages, 2 in flight).
// Warp w takes keys 16w .. 16w + 15 of each tile with its own online softmax (m, l, O for the 16 rows),
// so the loop needs no exchange between warps; their partials merge once, in shared memory, at the end.
// Per tile and warp: HD/8 mma for S and HD/8 for P V.
// Numerics: q and K in bf16 as stored, S in fp32, scaled by log2(e)/sqrt(HD) in fp32; softmax in base 2;
// P rounded to bf16 for the P V mma and l summed from the same rounded p (numerator and denominator weigh
// each key alike; ~2^-9 of a short sequence's output, within the lab's check).
// Splits: ~2 blocks an SM over B * NKV, chunks of >= 128 keys of the capacity; each sequence's chunk
// follows its own length on the device (decode_mma_chunk), so the launch depends on the shapes only. A
// sequence of one chunk is written by its block; the others' fp32 partials (o, m, l) are combined by
// decode_mma_merge_kernel.
// Shared memory (DecodeMmaSmem): q 16 x HD + 3 stages of K and V 64 x HD, bf16: 100 KB at HD 128 (2
// blocks an SM), 50 KB at HD 64 (4); the K stages hold the warps' fp32 O for the final merge.
// Registers (ptxas -v, sm_90a, no spills): 214 at HD 128, 120 at HD 64.
constexpr int DECODE_MMA_ROWS = 16;       // query rows of the tile: groups of up to 16 heads
constexpr int DECODE_MMA_TILE = 64;       // keys a stage
constexpr int DECODE_MMA_WARPS = 4;       // 16 keys of each tile a warp
constexpr int DECODE_MMA_THREADS = DECODE_MMA_WARPS * WARP_SIZE;
constexpr int DECODE_MMA_STAGES = 3;
constexpr int DECODE_MMA_MIN_CHUNK = 128; // below it a block's fixed costs (q, the merges) outweigh its keys
constexpr int DECODE_MMA_BLOCKS_PER_SM = 2;
static_assert(DECODE_MMA_TILE == 16 * DECODE_MMA_WARPS, "each warp takes one 16-key k-step of a tile");
static_assert(DECODE_MMA_MIN_CHUNK % DECODE_MMA_TILE == 0, "chunks are whole tiles");

template <int HD>
struct DecodeMmaSmem {
    attention_detail::bf16 q[DECODE_MMA_ROWS * HD];                     // swizzled (attention_mma.cuh's swz)
    attention_detail::bf16 k[DECODE_MMA_STAGES][DECODE_MMA_TILE * HD];  // swizzled; after the loop: o below
    attention_detail::bf16 v[DECODE_MMA_STAGES][DECODE_MMA_TILE * HD];  // swizzled
    float m[DECODE_MMA_WARPS][DECODE_MMA_ROWS], l[DECODE_MMA_WARPS][DECODE_MMA_ROWS];  // each warp's row stats
    float f[DECODE_MMA_WARPS][DECODE_MMA_ROWS];  // each warp's factor exp2(m_w - M)
    float M[DECODE_MMA_ROWS], L[DECODE_MMA_ROWS];  // the block's row max and sum
    // the warps' unnormalised O (WARPS, ROWS, HD) fp32, in the K stages once the loop is done
    __device__ float* o() { return reinterpret_cast<float*>(&k[0][0]); }
    static_assert(sizeof(k) >= sizeof(float) * DECODE_MMA_WARPS * DECODE_MMA_ROWS * HD, "O must fit in the K stages");
};

// Keys one split of a sequence of n keys takes (whole tiles, >= DECODE_MMA_MIN_CHUNK), and the splits
// the sequence uses (1 for an idle one: its first block writes the zeros).
__host__ __device__ inline int decode_mma_chunk(int n, int splits) {
    const int c = ceil_div(ceil_div(n > 0 ? n : 1, splits), DECODE_MMA_TILE) * DECODE_MMA_TILE;
    return c > DECODE_MMA_MIN_CHUNK ? c : DECODE_MMA_MIN_CHUNK;
}
__host__ __device__ inline int decode_mma_used_splits(int n, int splits) {
    return n > 0 ? ceil_div(n, decode_mma_chunk(n, splits)) : 1;
}
// Splits of the grid: DECODE_MMA_BLOCKS_PER_SM blocks an SM over the B * NKV heads, no more than
// chunks of DECODE_MMA_MIN_CHUNK keys of the capacity need.
inline int decode_mma_splits(int B, int NKV, int S, int window, int num_sms) {
    const int max_keys = window > 0 && window < S ? window : S;
    const int want = ceil_div(DECODE_MMA_BLOCKS_PER_SM * num_sms, B * NKV);
    return std::max(1, std::min(want, ceil_div(max_keys, DECODE_MMA_MIN_CHUNK)));
}

// Keys j0 .. j0 + TILE - 1 of the span (slot (first + j) % S of the head's K and V rows) into a stage;
// keys >= hi are zero-filled (cp.async src-size 0), so p = 0 times them stays 0.
template <int HD>
__device__ __forceinline__ void decode_mma_load_tile(attention_detail::bf16* ks, attention_detail::bf16* vs,
                                                     const attention_detail::bf16* k_head,
                                                     const attention_detail::bf16* v_head, int first, int S, int j0,
                                                     int hi) {
    using namespace attention_detail;
    constexpr int CHUNKS = HD / 8;  // 16-byte chunks a row
    static_assert(DECODE_MMA_TILE * CHUNKS % DECODE_MMA_THREADS == 0, "a tile splits evenly over the threads");
#pragma unroll
    for (int i = 0; i < DECODE_MMA_TILE * CHUNKS / DECODE_MMA_THREADS; i++) {
        const int idx = i * DECODE_MMA_THREADS + threadIdx.x, r = idx / CHUNKS, c = (idx % CHUNKS) * 8;
        const int j = j0 + r;
        const bool valid = j < hi;
        int slot = first + (valid ? j : 0);  // < 2S: first < S, j < n <= S
        if (slot >= S) slot -= S;
        const size_t off = (size_t)slot * HD + c;
        cp_async16(ks + swz<HD>(r, c), k_head + off, valid);
        cp_async16(vs + swz<HD>(r, c), v_head + off, valid);
    }
}

// Fragments of m16n8k16 (bf16, fp32 accumulate) this kernel relies on, lane = 4 * gr + t4:
//   A (16 x 16, row-major): a0 (row gr, cols 2t4, 2t4+1), a1 (row gr+8, same cols), a2 (row gr, cols
//     8+2t4, 8+2t4+1), a3 (row gr+8, those cols); here rows are query heads, cols head dims (Q) or keys (P).
//   B (16 x 8, "col"): b0 (k rows 2t4, 2t4+1, col gr), b1 (k rows 8+2t4, 8+2t4+1, col gr); for S the k
//     rows are head dims and the cols keys (K's rows, ldmatrix of the [key][dim] tile), for P V the k
//     rows are keys and the cols dims (ldmatrix.trans of the [key][dim] V tile).
//   C (16 x 8): c0, c1 (row gr, cols 2t4, 2t4+1), c2, c3 (row gr+8, same cols).
// So a thread's scores are rows gr and gr+8 (index r = e / 2 of c_e) of keys 16w + 8nb + 2t4 + (e & 1),
// a row's max and sum are over the 4 lanes of a quad, and the two C n-blocks of S are, converted to
// bf16, the A fragment of P (mma_p_regs_b_kn: a0 = c0,c1 of nb 0, a1 = c2,c3 of nb 0, a2/a3 of nb 1).
template <int HD>
static __global__ void __launch_bounds__(DECODE_MMA_THREADS)
    decode_mma_split_kernel(attention_detail::bf16* out, float* part_o, float* part_ml,
                            const attention_detail::bf16* qkv, const attention_detail::bf16* k_cache,
                            const attention_detail::bf16* v_cache, const int* pos, QKVLayout L, int S, int window,
                            int splits) {
    using namespace attention_detail;
    extern __shared__ __align__(16) unsigned char decode_mma_smem_raw[];
    DecodeMmaSmem<HD>& sm = *reinterpret_cast<DecodeMmaSmem<HD>*>(decode_mma_smem_raw);
    const int split = blockIdx.x, bk = blockIdx.y, b = bk / L.NKV, kvh = bk % L.NKV, G = L.NH / L.NKV;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, gr = lane / 4, t4 = lane % 4;

    const attention_detail::DecodeSpan span = attention_detail::decode_span(pos[b], S, window);
    const int chunk = decode_mma_chunk(span.n, splits), used = decode_mma_used_splits(span.n, splits);
    if (split >= used) return;  // block-uniform, before any barrier
    const int lo = split * chunk, hi = min(span.n, lo + chunk);
    const int tiles = hi > lo ? ceil_div(hi - lo, DECODE_MMA_TILE) : 0;
    const size_t head = (size_t)bk * S * HD;  // (b, kvh) of the (B, NKV, S, HD) caches
    const bf16* k_head = k_cache + head;
    const bf16* v_head = v_cache + head;

    // The first STAGES - 1 tiles in flight (one commit group each, empty past the last tile, so the
    // group count stays uniform), then q: 16 rows of HD, rows >= G zero.
#pragma unroll
    for (int s = 0; s < DECODE_MMA_STAGES - 1; s++) {
        if (s < tiles)
            decode_mma_load_tile<HD>(sm.k[s], sm.v[s], k_head, v_head, span.first, S, lo + s * DECODE_MMA_TILE, hi);
        cp_async_commit();
    }
    const bf16* q_row = qkv + (size_t)b * L.row() + L.q_col(kvh * G);
    for (int idx = threadIdx.x; idx < DECODE_MMA_ROWS * HD / 8; idx += DECODE_MMA_THREADS) {
        const int r = idx / (HD / 8), c = (idx % (HD / 8)) * 8;
        int4 v = make_int4(0, 0, 0, 0);
        if (r < G) v = *reinterpret_cast<const int4*>(q_row + (size_t)r * HD + c);
        *reinterpret_cast<int4*>(sm.q + swz<HD>(r, c)) = v;
    }
    __syncthreads();
    uint32_t qf[1][HD / 16][4];  // Q's A fragments, every warp all 16 rows
    load_a_frags<HD, HD>(qf[0], sm.q, 0);

    const float scale = LOG2E * rsqrtf((float)HD);  // scores in log2 units
    float o[1][HD / 8][4] = {};
    // rows gr and gr + 8 (r = 0, 1): running max (finite: a warp whose keys so far were all masked keeps
    // exp2(m - m_new) = 1 and p = exp2(-inf) = 0, never inf - inf) and this thread's part of the sum
    float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.0f, 0.0f};
    for (int t = 0; t < tiles; t++) {
        const int stage = t % DECODE_MMA_STAGES;
        cp_async_wait<DECODE_MMA_STAGES - 2>();  // this thread's copies of tile t have landed...
        __syncthreads();  // ...everyone's, and every warp is done with tile t - 1, whose stage is reused next
        const int next = t + DECODE_MMA_STAGES - 1;
        if (next < tiles) {
            const int ns = next % DECODE_MMA_STAGES;
            decode_mma_load_tile<HD>(sm.k[ns], sm.v[ns], k_head, v_head, span.first, S, lo + next * DECODE_MMA_TILE,
                                     hi);
        }
        cp_async_commit();

        float s[1][2][4] = {};  // S for this warp's 16 keys: 2 n-blocks of 8
        mma_a_regs_b_nk<HD, 16, HD>(s, qf, sm.k[stage], 16 * warp);
        const int key0 = lo + t * DECODE_MMA_TILE + 16 * warp + 2 * t4;
#pragma unroll
        for (int nb = 0; nb < 2; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[0][nb][e] = key0 + 8 * nb + (e & 1) < hi ? s[0][nb][e] * scale : -INFINITY;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = fmaxf(fmaxf(s[0][0][2 * r], s[0][0][2 * r + 1]), fmaxf(s[0][1][2 * r], s[0][1][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[r], mx), corr = exp2f(m[r] - m_new);
            m[r] = m_new;
            l[r] *= corr;
#pragma unroll
            for (int nd = 0; nd < HD / 8; nd++) {
                o[0][nd][2 * r] *= corr;
                o[0][nd][2 * r + 1] *= corr;
            }
#pragma unroll
            for (int nb = 0; nb < 2; nb++)
#pragma unroll
                for (int e = 2 * r; e < 2 * r + 2; e++) {
                    // p as the P V mma will see it (bf16), so l sums the same weights
                    const float p = __bfloat162float(__float2bfloat16_rn(exp2f(s[0][nb][e] - m_new)));
                    s[0][nb][e] = p;
                    l[r] += p;
                }
        }
        mma_p_regs_b_kn<HD, 16>(o, s, sm.v[stage], 16 * warp);
    }
    cp_async_wait<0>();  // only empty groups can be pending here; the K stages become O below
    __syncthreads();

    // Merge the 4 warps: the row sums over each quad, then per row the block max M, each warp's factor
    // and the block's sum; every thread then sums the warps' O for its output elements.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    float* so = sm.o();  // (WARPS, ROWS, HD)
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = gr + 8 * r;
        if (t4 == 0) {
            sm.m[warp][row] = m[r];
            sm.l[warp][row] = l[r];
        }
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++)
            *reinterpret_cast<float2*>(so + ((size_t)warp * DECODE_MMA_ROWS + row) * HD + nd * 8 + 2 * t4) =
                make_float2(o[0][nd][2 * r], o[0][nd][2 * r + 1]);
    }
    __syncthreads();
    if (threadIdx.x < DECODE_MMA_ROWS) {
        const int row = threadIdx.x;
        float M = -FLT_MAX, sum = 0.0f;
        for (int w = 0; w < DECODE_MMA_WARPS; w++) M = fmaxf(M, sm.m[w][row]);
        for (int w = 0; w < DECODE_MMA_WARPS; w++) {
            sm.f[w][row] = exp2f(sm.m[w][row] - M);  // a warp without keys: exp2(-FLT_MAX - M) = 0, or 1 if none has
            sum += sm.f[w][row] * sm.l[w][row];
        }
        sm.M[row] = M;
        sm.L[row] = sum;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += DECODE_MMA_THREADS) {
        const int g = idx / HD, d = idx % HD;
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < DECODE_MMA_WARPS; w++) acc += sm.f[w][g] * so[((size_t)w * DECODE_MMA_ROWS + g) * HD + d];
        if (used == 1) {  // sum = 0 only for an idle sequence (no keys): zeros
            const float sum = sm.L[g];
            out[((size_t)b * L.NH + kvh * G + g) * HD + d] = from_float<bf16>(sum > 0.0f ? acc / sum : 0.0f);
        } else {  // partial `split` of head kvh * G + g, in the layout decode_merge_splits reads
            const size_t p = ((size_t)bk * G + g) * splits + split;  // bk * G = b * NH + kvh * G
            part_o[p * HD + d] = acc;
            if (d == 0) {
                part_ml[2 * p] = sm.M[g];
                part_ml[2 * p + 1] = sm.L[g];
            }
        }
    }
}

// grid (B * NKV), 128 threads: the partials of the sequences of more than one split, merged by
// decode_merge_splits (kv_cache.cuh). Every used split holds >= 1 key: its m is finite, the sum > 0.
static __global__ void decode_mma_merge_kernel(attention_detail::bf16* out, const float* part_o, const float* part_ml,
                                               const int* pos, QKVLayout L, int S, int window, int splits) {
    const int bk = blockIdx.x, b = bk / L.NKV, kvh = bk % L.NKV, G = L.NH / L.NKV;
    const int used = decode_mma_used_splits(attention_detail::decode_span(pos[b], S, window).n, splits);
    if (used <= 1) return;
    for (int g = 0; g < G; g++)
        attention_detail::decode_merge_splits(out, part_o, part_ml, b, kvh * G + g, L.NH, L.HD, used, splits,
                                              threadIdx.x, blockDim.x);
}

// scratch: decode_mma_scratch_floats(...) floats (none for one split).
inline size_t decode_mma_scratch_floats(int B, int NH, int HD, int splits) {
    return splits > 1 ? (size_t)B * NH * splits * (HD + 2) : 0;
}
// Whether the current device gives a block the split kernel's shared memory at this head size (the
// H100/H200: 227 KB; sm_86/sm_89 GPUs: 99 KB, short of HD 128's 101 KB).
inline bool decode_mma_smem_fits(int HD) {
    int dev = 0, optin = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return optin >= (HD == 64 ? (int)sizeof(DecodeMmaSmem<64>) : (int)sizeof(DecodeMmaSmem<128>));
}
template <int HD>
inline void decode_mma_launch(floatX* out, float* scratch, const floatX* qkv, const floatX* k_cache,
                              const floatX* v_cache, const int* pos, int B, int NH, int NKV, int S, int window,
                              int splits, const CudaContext& ctx) {
    constexpr int smem = (int)sizeof(DecodeMmaSmem<HD>);
    ctx.allow_smem(decode_mma_split_kernel<HD>, smem);  // past the default 48 KB at both head sizes
    const QKVLayout L{NH, NKV, HD};
    float* part_o = splits > 1 ? scratch : nullptr;
    float* part_ml = splits > 1 ? scratch + (size_t)B * NH * splits * HD : nullptr;
    decode_mma_split_kernel<HD><<<dim3(splits, B * NKV), DECODE_MMA_THREADS, smem, ctx.stream>>>(
        out, part_o, part_ml, qkv, k_cache, v_cache, pos, L, S, window, splits);
    cudaCheckLaunch();
    if (splits > 1) {
        decode_mma_merge_kernel<<<B * NKV, 128, 0, ctx.stream>>>(out, part_o, part_ml, pos, L, S, window, splits);
        cudaCheckLaunch();
    }
}
// out (B, NH * HD) as attention_decode, the caches already holding this step's K/V; plain launches on
// ctx.stream. splits: decode_mma_splits for the shipped plan; scratch: decode_mma_scratch_floats(B, NH,
// HD, splits) floats, 16-byte aligned (nullptr when 0). The first call of a head size raises the
// kernel's shared-memory limit (ctx.allow_smem): make it outside a graph capture (model_infer_warmup).
inline void decode_mma(floatX* out, float* scratch, const floatX* qkv, const floatX* k_cache, const floatX* v_cache,
                      const int* pos, int B, int NH, int NKV, int HD, int S, int window, int splits,
                      const CudaContext& ctx) {
    if (NH / NKV > DECODE_MMA_ROWS)
        fail("decode_mma: a group of %d query heads (at most %d)", NH / NKV, DECODE_MMA_ROWS);
    if ((long long)B * NKV > 65535) fail("decode_mma: B * NKV = %lld blocks exceed the grid's 65535", (long long)B * NKV);
    if (HD == 64)
        decode_mma_launch<64>(out, scratch, qkv, k_cache, v_cache, pos, B, NH, NKV, S, window, splits, ctx);
    else if (HD == 128)
        decode_mma_launch<128>(out, scratch, qkv, k_cache, v_cache, pos, B, NH, NKV, S, window, splits, ctx);
    else
        fail("decode_mma: HD=%d (64 or 128)", HD);
}

}  // namespace attention_detail
#endif  // !PRECISION_FP32
