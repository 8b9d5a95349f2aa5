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
// with window W > 0 only keys t-W+1..t (the convention of Mistral's sliding window); with
// AttnShape::doc_start (document masking, attention_layout.cuh) only keys >= doc_start[t] besides.
// Precision: floatX operands (bf16 or fp32), every sum and the softmax in fp32.
//
// Three implementations, HD 64 or 128 (other head sizes are an error naming HD):
//   * attention_*_simple: scalar fp32 math, four threads per query (or key) row; ~12 TFLOP/s. The
//     FP32 build's path (tensor cores take no fp32), and the baseline in dev/cuda.
//   * attention_*_flash: bf16 tensor cores (mma.sync), FlashAttention-2 style (attention_mma.cuh); the
//     bf16 build's deterministic backward, and the forward and the fast backward (a single pass, dQ by
//     fp32 atomics in a caller's scratch buffer) where the sm_90a kernels do not run.
//   * attention_forward_hopper / attention_backward_hopper: wgmma + TMA + warp specialization
//     (FlashAttention-3's structure), the bf16 forward and the fast backward of sm_90a builds
//     (attention_hopper.cuh, attention_hopper_backward.cuh).
// attention_forward / attention_backward (at the end) pick the one for the build. The forward, and the
// backward without scratch, are deterministic by construction: no atomics, every output element
// summed by one thread in a fixed order (dev/cuda/attention_backward.cu checks two runs bit for bit).
// Every entry point takes its tensors (outputs first), one AttnShape (attention_layout.cuh) and the
// CudaContext (llmc/cuda_common.cuh: stream, SM count, whether the sm_90a kernels run).
#pragma once
#include "llmc/attention_forward.cuh"  // the forward half: attention_forward and its kernels

namespace attention_detail {

// dQ for one query row: dQ_i = scale * sum_j P_ij (dP_ij - D_i) k_j with dP_ij = dO_i . v_j and
// D_i = dO_i . O_i. grid (ceil(T / SIMPLE_ROWS), NH, B), SIMPLE_THREADS threads.
template <int HD, bool DOC>
__global__ void __launch_bounds__(SIMPLE_THREADS)
    attention_backward_dq_simple(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                 const float* lse, const int* doc_start, int T, QKVLayout L, int window) {
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
    int k_begin = window > 0 ? max(0, first - window + 1) / SIMPLE_TILE * SIMPLE_TILE : 0;
    const int* row_start = DOC ? doc_start + (size_t)b * T : nullptr;
    const int ds = DOC ? row_start[ic] : 0;
    if (DOC) k_begin = max(k_begin, row_start[first] / SIMPLE_TILE * SIMPLE_TILE);
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
            if (!attends(i, k0 + j, window) || (DOC && k0 + j < ds)) continue;
            const float dsc = expf(s - row_lse) * (dp - D);
            for (int d = 0; d < DPT; d++) dq[d] += dsc * sK[j][part + SIMPLE_TPR * d];
        }
    }
    if (i >= T) return;
    floatX* dqrow = dqkv + ((size_t)b * T + i) * stride + L.q_col(h);
    for (int d = 0; d < DPT; d++) dqrow[part + SIMPLE_TPR * d] = from_float<floatX>(dq[d] * scale);
}

// dK, dV for one key row, summed over the query heads of its group (no atomics, deterministic):
// dV_j = sum_i P_ij dO_i, dK_j = scale * sum_i P_ij (dP_ij - D_i) q_i.
// grid (ceil(T / SIMPLE_ROWS), NKV, B), SIMPLE_THREADS threads.
template <int HD, bool DOC>
__global__ void __launch_bounds__(SIMPLE_THREADS)
    attention_backward_dkdv_simple(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                   const float* lse, const int* doc_start, int T, QKVLayout L, int window) {
    constexpr int DPT = HD / SIMPLE_TPR;
    __shared__ float sQ[SIMPLE_TILE][HD], sdO[SIMPLE_TILE][HD];
    __shared__ float sLse[SIMPLE_TILE], sD[SIMPLE_TILE];
    __shared__ int sDs[SIMPLE_TILE];  // DOC: the tile's queries' document starts
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
    int q_end = window > 0 ? min(T, last + window) : T;  // queries past this see none of our keys
    const int* row_start = DOC ? doc_start + (size_t)b * T : nullptr;
    if (DOC) q_end = min(q_end, doc_query_end(row_start, last, T));  // nor past the end of our keys' documents
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
                    if (DOC) sDs[r] = row_start[row];
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
                if (!attends(q0 + r, j, window) || (DOC && j < sDs[r])) continue;
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

}  // namespace attention_detail

inline void attention_backward_simple(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                      const float* lse, const AttnShape& s, const CudaContext& ctx) {
    using namespace attention_detail;
    check_attention_sizes("attention_backward", s);
    const QKVLayout L = qkv_layout(s);
    const int T = s.T, W = s.window;
    const dim3 grid_q(ceil_div(T, SIMPLE_ROWS), s.NH, s.B), grid_kv(ceil_div(T, SIMPLE_ROWS), s.NKV, s.B);
    const bool doc = s.doc_start != nullptr;
    auto dq = doc ? (s.HD == 64 ? attention_backward_dq_simple<64, true> : attention_backward_dq_simple<128, true>)
                  : (s.HD == 64 ? attention_backward_dq_simple<64, false> : attention_backward_dq_simple<128, false>);
    auto dkdv = doc ? (s.HD == 64 ? attention_backward_dkdv_simple<64, true> : attention_backward_dkdv_simple<128, true>)
                    : (s.HD == 64 ? attention_backward_dkdv_simple<64, false> : attention_backward_dkdv_simple<128, false>);
    dq<<<grid_q, SIMPLE_THREADS, 0, ctx.stream>>>(dqkv, dout, qkv, out, lse, s.doc_start, T, L, W);
    cudaCheckLaunch();
    dkdv<<<grid_kv, SIMPLE_THREADS, 0, ctx.stream>>>(dqkv, dout, qkv, out, lse, s.doc_start, T, L, W);
    cudaCheckLaunch();
}

// ============================================================================ tensor-core kernels
#include "llmc/attention_mma_backward.cuh"
#include "llmc/attention_hopper_backward.cuh"

// The mma.sync backward: the deterministic pair without scratch, the single pass (dQ by atomics) with
// one. Document masking (s.doc_start) always takes the deterministic pair (the scratch is left unused).
// keep_dq (with scratch only): leave dQ in the scratch, as attention_backward; returns whether it did.
inline bool attention_backward_flash(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                                     const __nv_bfloat16* out, const float* lse, const AttnShape& s,
                                     const CudaContext& ctx, AttnScratch scratch = {}, bool keep_dq = false) {
    using namespace attention_detail;
    check_attention_sizes("attention_backward", s);
    if (!aligned16(dqkv) || !aligned16(dout) || !aligned16(qkv) || !aligned16(out) || !aligned16(scratch.data))
        fail("attention_backward: dqkv, dout, qkv, out and scratch must be 16-byte aligned");
    if (scratch.data && !s.doc_start) {  // one pass, dQ by fp32 atomics in scratch: faster, not bit-reproducible
        auto run = s.HD == 64 ? backward_flash_atomic<AtomicBwdCfg<64>> : backward_flash_atomic<AtomicBwdCfg<128>>;
        run(dqkv, scratch.data, dout, qkv, out, lse, s, ctx, keep_dq);
        return keep_dq;
    }
    if (s.HD == 64) backward_flash<DQCfg<64>, DKVCfg<64>>(dqkv, dout, qkv, out, lse, s, ctx);
    else backward_flash<DQCfg<128>, DKVCfg<128>>(dqkv, dout, qkv, out, lse, s, ctx);
    return false;
}

// ============================================================================ the launchers
// The policy as attention_forward's (attention_forward.cuh); the deterministic backward always on mma.sync.
// Document masking too: with scratch on sm_90a the Hopper DOC kernel (dQ by reductions, as unmasked)
// where attention_hopper_backward_takes(s); without scratch (--deterministic), for other shapes, or
// elsewhere the deterministic pair's DOC instantiation.
// dqkv (B, T, (NH + 2*NKV) * HD) written with `=` from dout, qkv, out and lse; on ctx.stream.
// scratch: none for the deterministic backward (bit-identical run to run), or a 16-byte aligned buffer
// of attention_backward_scratch_floats(s) floats for the faster single pass whose dQ sums come from
// fp32 atomics (the FP32 build ignores it). scratch.floats: the buffer's size where known; from
// attention_backward_scratch_floats_split(s, ctx) on, the Hopper kernel may split small shapes over
// more SMs (dK, dV then also summed by atomics).
// keep_dq: where the backward is a single pass that ends in the dQ store (not the split schedule),
// skip that store: dQ stays in the scratch as unscaled fp32 sums, dq_accum (B, T, NH * HD) at its
// start (dQ = dq_from_accum<HD>(sum)), and dqkv's query columns are not written. Returns dq_accum
// where it did (fp8_cast_transpose_fused's DQ_ACCUM reads it in place of those columns, until the
// scratch is reused), else nullptr. attention_dq_store writes the columns from it.
inline const float* attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                       const float* lse, const AttnShape& s, const CudaContext& ctx,
                                       AttnScratch scratch = {}, bool keep_dq = false) {
#if defined(PRECISION_FP32)
    (void)scratch, (void)keep_dq;
    attention_backward_simple(dqkv, dout, qkv, out, lse, s, ctx);
    return nullptr;
#else
    bool kept;
    if (scratch.data && attention_hopper_available(ctx) && attention_hopper_backward_takes(s))
        kept = attention_backward_hopper(dqkv, dout, qkv, out, lse, s, ctx, scratch, keep_dq);
    else kept = attention_backward_flash(dqkv, dout, qkv, out, lse, s, ctx, scratch, keep_dq);
    return kept ? scratch.data : nullptr;
#endif
}

// The store attention_backward skipped with keep_dq: dqkv's query columns = dq_from_accum<HD>(dq_accum),
// the bits the backward would have written (bf16 build; the tests and the lab's reference).
inline void attention_dq_store(__nv_bfloat16* dqkv, const float* dq_accum, const AttnShape& s, const CudaContext& ctx) {
    using namespace attention_detail;
    check_attention_sizes("attention_dq_store", s);
    if (!aligned16(dqkv) || !aligned16(dq_accum)) fail("attention_dq_store: dqkv and dq_accum must be 16-byte aligned");
    dq_store(dqkv, dq_accum, s.B, s.T, qkv_layout(s), ctx.stream);
}
