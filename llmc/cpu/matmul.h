// matmul.h: the fully connected layer on the CPU, out = inp W^T + bias, and its backward.
// Shapes: inp (B*T, C), weight (OC, C) stored "out x in", bias (OC) or nullptr, out (B*T, OC).
// matmul_forward writes (=) out; matmul_backward accumulates (+=) into dinp, dweight and dbias
// (any of the three may be nullptr when that gradient is not wanted).
// fp32 throughout. Each output element is owned by one thread and summed in a fixed order, so
// results are bitwise identical for any OMP_NUM_THREADS.
// All three products go through one packed, blocked kernel, gemm_accumulate (C += A B, any strides
// for A and B): a KB-deep slab of A is copied into MR-row panels and one of B into NR-column strips,
// so the micro-kernel streams both from contiguous memory with an MR x NR block of C in registers:
//   MR x NR = 8 x 32 with AVX-512 (16 zmm accumulators + 2 for B of 32 registers), 6 x 16 with AVX2
//   (12 ymm + 2 of 16), 6 x 8 otherwise (12 xmm/q + 2).
//   KB = 256: a B strip is KB*NR*4 = 32 KB (AVX-512), within a 48 KB L1; an A slab MB x KB is
//   MB*KB*4 = 128 KB and a B slab KB x NB is 256 KB, both within a 1-2 MB L2.
// Measured: docs/perf.md, "CPU reference trainer".
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include "llmc/utils.h"
#include "llmc/cpu/isa_check.h"  // NATIVE=0 builds: refuse a CPU without AVX2/FMA before main

namespace cpu {

namespace detail {
// The micro-kernel is written on GCC/Clang vector types of the widest vector the build targets, so
// that its shape does not depend on the auto-vectorizer (which split the AVX2 block written as scalar
// loops into 128-bit shuffles).
#if defined(__AVX512F__)
constexpr int GEMM_VEC = 16, GEMM_MR = 8;  // zmm
#elif defined(__AVX__)
constexpr int GEMM_VEC = 8, GEMM_MR = 6;   // ymm
#else
constexpr int GEMM_VEC = 4, GEMM_MR = 6;   // xmm / NEON q registers
#endif
constexpr int GEMM_NR = 2 * GEMM_VEC;      // two vectors of B per k
constexpr int GEMM_MB = GEMM_MR * 16;  // rows of C per thread task
constexpr int GEMM_NB = 256;           // columns of C per thread task
constexpr int GEMM_KB = 256;           // depth of one packed slab
static_assert(GEMM_NB % GEMM_NR == 0, "a B slab is a whole number of NR-wide strips");
typedef float gemm_vec __attribute__((vector_size(GEMM_VEC * sizeof(float))));

// C[0:MR, 0:NR] (valid part mr x nr) += Ap (kc, MR) times Bp (kc, NR), both packed contiguously.
// acc[r][v] holds C's row r, columns v*VEC.. of the block: MR x 2 vector accumulators, summed over k
// in order (each element's sum has the same order in every build).
inline void gemm_micro_kernel(float* C, ptrdiff_t ldc, const float* __restrict__ Ap, const float* __restrict__ Bp,
                              int kc, int mr, int nr) {
    gemm_vec acc[GEMM_MR][2] = {};
    for (int k = 0; k < kc; k++) {
        gemm_vec b0, b1;
        memcpy(&b0, Bp + (size_t)k * GEMM_NR, sizeof(b0));
        memcpy(&b1, Bp + (size_t)k * GEMM_NR + GEMM_VEC, sizeof(b1));
        const float* a = Ap + (size_t)k * GEMM_MR;
        for (int r = 0; r < GEMM_MR; r++) {
            const gemm_vec ar = a[r] - gemm_vec{};  // broadcast
            acc[r][0] += ar * b0;
            acc[r][1] += ar * b1;
        }
    }
    float out[GEMM_MR][GEMM_NR];
    memcpy(out, acc, sizeof(out));
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) C[r * ldc + j] += out[r][j];
}

// C (M, N) row-major with leading dimension ldc  +=  A (M, K) * B (K, N), where element (m, k) of A
// is A[m*a_rs + k*a_cs] and element (k, n) of B is B[k*b_rs + n*b_cs]; strides express transposes.
inline void gemm_accumulate(float* C, ptrdiff_t ldc, const float* A, ptrdiff_t a_rs, ptrdiff_t a_cs, const float* B,
                            ptrdiff_t b_rs, ptrdiff_t b_cs, int M, int N, int K) {
    const int m_tiles = (M + GEMM_MB - 1) / GEMM_MB, n_tiles = (N + GEMM_NB - 1) / GEMM_NB;
#pragma omp parallel
    {
        // per-thread packing buffers; panels are zero-padded so the micro-kernel never branches
        float* Ap = (float*)aligned_alloc(64, sizeof(float) * GEMM_MB * GEMM_KB);
        float* Bp = (float*)aligned_alloc(64, sizeof(float) * GEMM_KB * GEMM_NB);
        if (!Ap || !Bp) fail("out of host memory for matmul packing buffers");
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int nt = 0; nt < n_tiles; nt++) {
            for (int mt = 0; mt < m_tiles; mt++) {
                const int m0 = mt * GEMM_MB, n0 = nt * GEMM_NB;
                const int mb = M - m0 < GEMM_MB ? M - m0 : GEMM_MB;
                const int nb = N - n0 < GEMM_NB ? N - n0 : GEMM_NB;
                for (int k0 = 0; k0 < K; k0 += GEMM_KB) {
                    const int kc = K - k0 < GEMM_KB ? K - k0 : GEMM_KB;
                    // pack A: panel p holds rows m0+p*MR.. as (kc, MR)
                    for (int p = 0; p < mb; p += GEMM_MR) {
                        float* dst = Ap + (size_t)p * kc;
                        for (int r = 0; r < GEMM_MR; r++) {
                            const bool valid = p + r < mb;
                            const float* src = A + (ptrdiff_t)(m0 + p + r) * a_rs + (ptrdiff_t)k0 * a_cs;
                            for (int k = 0; k < kc; k++) dst[k * GEMM_MR + r] = valid ? src[k * a_cs] : 0.0f;
                        }
                    }
                    // pack B: strip s holds columns n0+s.. as (kc, NR)
                    for (int s = 0; s < nb; s += GEMM_NR) {
                        float* dst = Bp + (size_t)s * kc;
                        if (b_cs == 1 && s + GEMM_NR <= nb) {
                            for (int k = 0; k < kc; k++)
                                memcpy(dst + k * GEMM_NR, B + (ptrdiff_t)(k0 + k) * b_rs + n0 + s, sizeof(float) * GEMM_NR);
                        } else {
                            for (int j = 0; j < GEMM_NR; j++) {
                                const bool valid = s + j < nb;
                                const float* src = B + (ptrdiff_t)k0 * b_rs + (ptrdiff_t)(n0 + s + j) * b_cs;
                                for (int k = 0; k < kc; k++) dst[k * GEMM_NR + j] = valid ? src[k * b_rs] : 0.0f;
                            }
                        }
                    }
                    for (int s = 0; s < nb; s += GEMM_NR)
                        for (int p = 0; p < mb; p += GEMM_MR)
                            gemm_micro_kernel(C + (ptrdiff_t)(m0 + p) * ldc + n0 + s, ldc, Ap + (size_t)p * kc,
                                              Bp + (size_t)s * kc, kc, mb - p < GEMM_MR ? mb - p : GEMM_MR,
                                              nb - s < GEMM_NR ? nb - s : GEMM_NR);
                }
            }
        }
        free(Ap);
        free(Bp);
    }
}
}  // namespace detail

// out (B*T, OC) = inp (B*T, C) weight^T + bias. FLOPs: 2*B*T*C*OC.
inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int B, int T, int C,
                           int OC) {
    const int BT = B * T;
#pragma omp parallel for
    for (int i = 0; i < BT; i++)
        for (int o = 0; o < OC; o++) out[(size_t)i * OC + o] = bias ? bias[o] : 0.0f;
    detail::gemm_accumulate(out, OC, inp, C, 1, weight, 1, C, BT, OC, C);
}

// dinp (B*T, C) += dout weight; dweight (OC, C) += dout^T inp; dbias (OC) += column sums of dout.
// FLOPs: 4*B*T*C*OC.
inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int B, int T, int C, int OC) {
    const int BT = B * T;
    if (dinp) detail::gemm_accumulate(dinp, C, dout, OC, 1, weight, C, 1, BT, C, OC);
    if (dweight) detail::gemm_accumulate(dweight, C, dout, 1, OC, inp, C, 1, OC, C, BT);
    if (dbias) {
        constexpr int OB = 64;  // columns per task: rows of dout are read contiguously
#pragma omp parallel for
        for (int o0 = 0; o0 < OC; o0 += OB) {
            const int ob = OC - o0 < OB ? OC - o0 : OB;
            float sum[OB] = {};
            for (int i = 0; i < BT; i++)
                for (int j = 0; j < ob; j++) sum[j] += dout[(size_t)i * OC + o0 + j];
            for (int j = 0; j < ob; j++) dbias[o0 + j] += sum[j];
        }
    }
}

}  // namespace cpu
