// gemv.cuh: the linear layers of a decode step, y = x W^T (+ b), at the few rows M a step has
// (M = batch <= GEMV_MAX_M), where cuBLAS's tiled GEMMs leave most of the weight bandwidth unused.
// Row-major as matmul.cuh: inp (M, K), weight (N, K) ("out x in"), bias (N) or nullptr, out (M, N).
//   gemv_forward  out = epilogue(inp W^T + b)                                                   (=)
//     GEMV_PLAIN   out (M, N) = inp W^T + b
//     GEMV_GELU    out (M, N) = gelu_tanh(inp W^T + b) (the pre-activation is not kept: inference)
//     GEMV_SWIGLU  W is SwiGLU's fused [gate (H) | up (H)], N = 2H: out (M, H) = silu(g) * u, with
//                  g, u the fp32 sums of rows j and H + j (swiglu.cuh's formula, no floatX round
//                  trip of the (M, 2H) pre-activation)
// Each weight element is read once from DRAM with 16-byte streaming loads (ld.global.cs), so the
// kernel runs near the copy bandwidth once the matrix is a few MB: a decode step reads all of the
// model's weights once (GPT-2 124M: ~250 MB of bf16, ~62 us at 4 TB/s). The inputs (M*K*2 bytes,
// 48 KB at most) come from L1/L2.
// Work split: one warp computes R consecutive output rows (SwiGLU: the row pair j, H + j) for all M
// inputs; lane i walks the 16-byte packs i, i + 32, ... of the K axis, U packs per row in flight
// (U*R 16-byte loads issued before any math), then each of the R*M sums is reduced across the warp.
// R trades the L1 traffic of the inputs (M packs per R weight packs) against the number of warps:
// R = 1 below M = 4, R = 2 from there (gemv_rows_per_warp; the lab, dev/cuda/gemv.cu, times 1/2/4).
// Programmatic dependent launch (pdl): the kernel may start while the kernel before it in the stream
// (or CUDA graph) is finishing; it prefetches its first weight packs into L2 (they never depend on
// the previous kernel), then waits (griddepcontrol.wait) before it reads `inp`. A no-op wait when
// launched without the attribute. sm_90+; older architectures compile the wait and prefetch away.
// fp32 accumulation; K a multiple of x128::size. The CPU reference is cpu::matmul_forward (and
// cpu::gelu_forward / cpu::swiglu_forward on its fp32 output).
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/gelu.cuh"
#include "llmc/swiglu.cuh"
#include "llmc/utils.h"

constexpr int GEMV_MAX_M = 8;    // rows of inp the kernels are instantiated for (1..8)
constexpr int GEMV_THREADS = 128;  // 4 warps a block
constexpr int GEMV_UNROLL = 4;   // 16-byte packs per weight row a lane loads before its math

enum GemvEpilogue : int { GEMV_PLAIN = 0, GEMV_GELU = 1, GEMV_SWIGLU = 2 };

namespace gemv_detail {

// Waits until the grid this one depends on (programmatic dependent launch) has finished and its
// writes are visible; returns at once for a plain launch.
__device__ inline void wait_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ inline void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// acc[r][m] += dot(weight pack of row r, input pack of row m) for the packs `kp` of one lane.
template <int M, int R>
__device__ inline void gemv_packs(float (&acc)[R][M], const x128 (&w)[R], const floatX* inp, int K, int k) {
    float wf[R][x128::size];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int e = 0; e < x128::size; e++) wf[r][e] = to_float(w[r][e]);
#pragma unroll
    for (int m = 0; m < M; m++) {
        const x128 x = load128(inp + (int64_t)m * K + k);
#pragma unroll
        for (int e = 0; e < x128::size; e++) {
            const float xf = to_float(x[e]);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r][m] = fmaf(wf[r][e], xf, acc[r][m]);
        }
    }
}

// Warp g of the grid: rows g*R .. g*R+R-1 (GEMV_SWIGLU, R = 2: rows g and g + N/2). Rows past N
// (the last warp of an N not a multiple of R) read row N-1 and write nothing.
template <int M, int R, int EPI>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_kernel(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int K, int N) {
    static_assert(EPI != GEMV_SWIGLU || R == 2, "SwiGLU pairs rows j and H + j");
    const int lane = threadIdx.x % WARP_SIZE;
    const int g = blockIdx.x * (GEMV_THREADS / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const int H = N / 2, groups = EPI == GEMV_SWIGLU ? H : (N + R - 1) / R;
    if (g >= groups) return;
    int row[R];
#pragma unroll
    for (int r = 0; r < R; r++) row[r] = EPI == GEMV_SWIGLU ? g + r * H : min(g * R + r, N - 1);
    const floatX* wrow[R];
#pragma unroll
    for (int r = 0; r < R; r++) wrow[r] = weight + (int64_t)row[r] * K;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;

    const int packs = K / x128::size;
    // the first round's weight packs into L2 while the previous kernel may still run, then the wait
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
        for (int r = 0; r < R; r++)
            if (lane + u * WARP_SIZE < packs) prefetch_l2(wrow[r] + (lane + u * WARP_SIZE) * x128::size);
    wait_previous_grid();
    // rounds of U packs per row, all U*R loads issued (predicated at the end of a row) before the math
    for (int p = lane; p < packs; p += GEMV_UNROLL * WARP_SIZE) {
        x128 w[GEMV_UNROLL][R];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (p + u * WARP_SIZE < packs) w[u][r] = load128cs(wrow[r] + (p + u * WARP_SIZE) * x128::size);
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
            if (p + u * WARP_SIZE < packs) gemv_packs<M, R>(acc, w[u], inp, K, (p + u * WARP_SIZE) * x128::size);
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = warp_reduce_sum(acc[r][m]);

    // lane m writes input row m's outputs (every lane holds every sum after the reduction)
    if (lane >= M) return;
#pragma unroll
    for (int m = 0; m < M; m++) {
        if (m != lane) continue;
        if constexpr (EPI == GEMV_SWIGLU) {
            const float gt = acc[0][m] + (bias ? to_float(bias[row[0]]) : 0.0f);
            const float up = acc[1][m] + (bias ? to_float(bias[row[1]]) : 0.0f);
            out[(int64_t)m * H + g] = from_float<floatX>(gt * swiglu_sigmoid(gt) * up);
        } else {
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (g * R + r >= N) break;
                float v = acc[r][m] + (bias ? to_float(bias[row[r]]) : 0.0f);
                if constexpr (EPI == GEMV_GELU) v = gelu_tanh(v);
                out[(int64_t)m * N + row[r]] = from_float<floatX>(v);
            }
        }
    }
}

// One launch of gemv_kernel<M, R, EPI>, with the programmatic-serialization attribute when pdl.
template <int M, int R, int EPI>
inline void launch(bool pdl, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int K, int N,
                   cudaStream_t stream) {
    const int warps = GEMV_THREADS / WARP_SIZE, groups = EPI == GEMV_SWIGLU ? N / 2 : ceil_div(N, R);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(ceil_div(groups, warps));
    cfg.blockDim = dim3(GEMV_THREADS);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaCheck(cudaLaunchKernelEx(&cfg, gemv_kernel<M, R, EPI>, out, inp, weight, bias, K, N));
}

template <int M, int EPI>
inline void launch_rows(int R, bool pdl, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                        int K, int N, cudaStream_t stream) {
    if constexpr (EPI == GEMV_SWIGLU) launch<M, 2, EPI>(pdl, out, inp, weight, bias, K, N, stream);
    else if (R == 1) launch<M, 1, EPI>(pdl, out, inp, weight, bias, K, N, stream);
    else if (R == 2) launch<M, 2, EPI>(pdl, out, inp, weight, bias, K, N, stream);
    else launch<M, 4, EPI>(pdl, out, inp, weight, bias, K, N, stream);
}

template <int EPI>
inline void launch_epi(int M, int R, bool pdl, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int K,
                       int N, cudaStream_t stream) {
    switch (M) {
        case 1: launch_rows<1, EPI>(R, pdl, out, inp, weight, bias, K, N, stream); break;
        case 2: launch_rows<2, EPI>(R, pdl, out, inp, weight, bias, K, N, stream); break;
        case 3: launch_rows<3, EPI>(R, pdl, out, inp, weight, bias, K, N, stream); break;
        case 4: launch_rows<4, EPI>(R, pdl, out, inp, weight, bias, K, N, stream); break;
        case 5: launch_rows<5, EPI>(R, pdl, out, inp, weight, bias, K, N, stream); break;
        case 6: launch_rows<6, EPI>(R, pdl, out, inp, weight, bias, K, N, stream); break;
        case 7: launch_rows<7, EPI>(R, pdl, out, inp, weight, bias, K, N, stream); break;
        default: launch_rows<8, EPI>(R, pdl, out, inp, weight, bias, K, N, stream); break;
    }
}

}  // namespace gemv_detail

// The shipped choice of rows per warp for M inputs (1, 2 or 4).
inline int gemv_rows_per_warp(int M) { return M >= 4 ? 2 : 1; }

// Whether gemv_forward runs this shape.
inline bool gemv_supported(int M, int K, int N, GemvEpilogue epi) {
    return M >= 1 && M <= GEMV_MAX_M && K > 0 && K % x128::size == 0 && N > 0 && (epi != GEMV_SWIGLU || N % 2 == 0);
}

// out = epilogue(inp (M, K) W^T (N, K) + bias); out (M, N), or (M, N/2) for GEMV_SWIGLU. rows_per_warp:
// 0 = gemv_rows_per_warp(M), else 1, 2 or 4 (the lab's variants; SwiGLU always pairs 2 rows). pdl:
// launch as a programmatic dependent of the previous kernel in the stream (see the top).
inline void gemv_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int M, int K, int N,
                         GemvEpilogue epi, cudaStream_t stream, int rows_per_warp = 0, bool pdl = false) {
    if (!gemv_supported(M, K, N, epi))
        fail("gemv_forward: M = %d (1..%d), K = %d (a multiple of %d), N = %d (even for SwiGLU) not supported", M,
             GEMV_MAX_M, K, x128::size, N);
    const int R = rows_per_warp ? rows_per_warp : gemv_rows_per_warp(M);
    if (R != 1 && R != 2 && R != 4) fail("gemv_forward: rows per warp %d is not 1, 2 or 4", R);
    if (epi == GEMV_GELU) gemv_detail::launch_epi<GEMV_GELU>(M, R, pdl, out, inp, weight, bias, K, N, stream);
    else if (epi == GEMV_SWIGLU) gemv_detail::launch_epi<GEMV_SWIGLU>(M, R, pdl, out, inp, weight, bias, K, N, stream);
    else gemv_detail::launch_epi<GEMV_PLAIN>(M, R, pdl, out, inp, weight, bias, K, N, stream);
    cudaCheckLaunch();
}
