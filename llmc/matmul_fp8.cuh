// matmul_fp8.cuh: the three matmuls of a linear layer with FP8 operands, through cuBLASLt, from
// the per-tensor scaled casts of llmc/fp8.cuh (docs/numerics.md). Output bf16, fp32
// compute (CUBLAS_COMPUTE_32F), fp32 scales read from device memory (the Fp8Meta's scale_inv, so a
// scale updated on the device needs no host round trip and the calls can sit in a CUDA graph).
// The cuBLASLt plumbing is matmul_cublaslt's (llmc/matmul.cuh), with MatmulTypes for the FP8 operands.
//
// The one product here:  D (R, M) row-major = scale_inv_p * scale_inv_q * P (R, K) . Q (M, K)^T
// with P and Q row-major and K contiguous in both. That is the only layout cuBLASLt's FP8 kernels
// take on Hopper ("TN": in its column-major terms A transposed, B not, both K-major): row-major D
// is column-major (M, R) = Q (M, K) . P^T (K, R), so A = Q, stored column-major (K, M), with op T,
// and B = P, stored column-major (K, R), with op N.
// Shapes: R, M, K multiples of 16 (cuBLASLt's FP8 alignment), pointers 16-byte aligned.
//
// A linear layer, row-major X (N, C), W (OC, C), Y (N, OC), dY (N, OC):
//   forward          Y  = X . W^T  (+ bias)   P = X  (N, C)   e4m3   Q = W   (OC, C) e4m3   K = C
//                    no transposed copies: both are stored K-major already.
//   input gradient   dX = dY . W              P = dY (N, OC)  e5m2*  Q = W^T (C, OC) e4m3   K = OC
//                    needs the weight's transposed FP8 copy W^T (fp8_cast_transpose of W, once per
//                    step after the update).
//   weight gradient  dW = dY^T . X  (+= into the bf16 dW: beta 1)
//                                             P = dY^T (OC, N) e5m2*  Q = X^T (C, N) e4m3   K = N
//                    needs both transposed: dY^T (fp8_cast_transpose of dY, which writes the straight
//                    dY for the input gradient from the same read) and X^T (written by the forward's
//                    cast of X, kept for the backward, N*C bytes a layer).
//   * e5m2 by default (gradients need the range), or e4m3. cuBLASLt takes any mix but e5m2 x e5m2.
// Rowwise scaling (--fp8-scaling rowwise): every operand above is stored K-major with one scale per
// row (a token row of X or dY, an output row of W, an input channel of W^T, X^T, an output channel of
// dY^T), so each matmul takes cuBLASLt's outer-vector scales: D(i, j) *= sp[i] * sq[j] (CUDA 13:
// compute capability 9.0 only; bias and beta = 1 with them are checked by tests/gpu/test_fp8.cu).
// Fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM): the whole K in the FP8 tensor cores' narrower-
// than-fp32 accumulator (faster, an error that grows with K: the weight gradient's K = B*T is the
// worst) instead of partial sums promoted to fp32 every few k-steps. The forward's is a setting (fast
// by default); the two gradients never (dev/cuda/matmul_fp8.cu measures both).
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/fp8.cuh"
#include "llmc/matmul.cuh"
#include "llmc/utils.h"

// How an FP8 operand's scale pointer is read: one scale_inv for the tensor (&Fp8Meta::scale_inv,
// per-tensor scaling), or one per row of the operand as stored (--fp8-scaling rowwise: the scale_inv
// vectors of fp8_cast_rowwise and fp8_cast_transpose_colwise; cuBLASLt's outer-vector scales).
enum class Fp8Scales { TENSOR, ROWS };

// D (R, M) = sp * sq * P (R, K) . Q (M, K)^T + beta * D (+ bias (M), bf16), D bf16; sp, sq device
// pointers to the scale_inv of P's and Q's casts: scalars, or with Fp8Scales::ROWS D(i, j) gets
// sp[i] * sq[j] (R and M floats). ldp, ldq: the row pitches of P and Q in bytes (0: K, packed rows),
// multiples of 16 (the output head reads its dlogits at a pitch of 2 Vp and X^T's column slices).
inline void matmul_fp8(__nv_bfloat16* d, const uint8_t* p, Fp8Format p_format, const float* sp, const uint8_t* q,
                       Fp8Format q_format, const float* sq, int R, int M, int K, const __nv_bfloat16* bias, float beta,
                       bool fast_accum, Fp8Scales scales, const CudaContext& ctx, int64_t ldp = 0, int64_t ldq = 0) {
    if (ldp == 0) ldp = K;
    if (ldq == 0) ldq = K;
    if (R % 16 != 0 || M % 16 != 0 || K % 16 != 0)
        fail("matmul_fp8: R = %d, M = %d, K = %d must be multiples of 16", R, M, K);
    if (ldp < K || ldq < K || ldp % 16 != 0 || ldq % 16 != 0 || ldp > INT32_MAX || ldq > INT32_MAX)
        fail("matmul_fp8: row pitches %lld, %lld must be multiples of 16, at least K = %d", (long long)ldp,
             (long long)ldq, K);
    if ((uintptr_t)sp % 16 != 0 || (uintptr_t)sq % 16 != 0)
        fail("matmul_fp8: the scale pointers must be 16-byte aligned (cuBLASLt refuses others; Fp8Meta keeps "
             "scale_inv so)");
    if (p_format == Fp8Format::E5M2 && q_format == Fp8Format::E5M2)
        fail("matmul_fp8: cuBLASLt has no e5m2 x e5m2 matmul");
    MatmulTypes t;
    t.a = fp8_cuda_type(q_format);
    t.b = fp8_cuda_type(p_format);
    t.d = CUDA_R_16BF;
    t.bias = CUDA_R_16BF;
    t.a_scale = sq;  // A = Q: its M rows are op(A)'s rows
    t.b_scale = sp;  // B = P: its R rows are op(B)'s columns
    t.fast_accum = fast_accum;
    t.outer_vec_scales = scales == Fp8Scales::ROWS;
    matmul_cublaslt(ctx, d, q, p, M, R, K, true, false, (int)ldq, (int)ldp, M, beta,
                    bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, nullptr, t);
}

// The scale arguments below (x_sinv) are matmul_fp8's sp / sq: &meta->scale_inv (Fp8Scales::TENSOR),
// or the operand's per-row scale_inv vector as noted (Fp8Scales::ROWS).
// out (N, OC) = X . W^T + bias: inp = X's e4m3 cast (N, C), weight = W's e4m3 cast (OC, C); rows: (N), (OC).
inline void matmul_fp8_forward(__nv_bfloat16* out, const uint8_t* inp, const float* inp_sinv, const uint8_t* weight,
                               const float* weight_sinv, const __nv_bfloat16* bias, int N, int C, int OC,
                               Fp8Scales scales, const CudaContext& ctx, bool fast_accum = true) {
    matmul_fp8(out, inp, Fp8Format::E4M3, inp_sinv, weight, Fp8Format::E4M3, weight_sinv, N, OC, C, bias, 0.0f,
               fast_accum, scales, ctx);
}

// dinp (N, C) = dY . W (=): dout = dY's cast (N, OC) in dout_format, weight_t = W^T's e4m3 cast (C, OC);
// rows: (N), (C) (W's column scales).
inline void matmul_fp8_backward_input(__nv_bfloat16* dinp, const uint8_t* dout, Fp8Format dout_format,
                                      const float* dout_sinv, const uint8_t* weight_t, const float* weight_t_sinv,
                                      int N, int C, int OC, Fp8Scales scales, const CudaContext& ctx) {
    matmul_fp8(dinp, dout, dout_format, dout_sinv, weight_t, Fp8Format::E4M3, weight_t_sinv, N, C, OC, nullptr, 0.0f,
               false, scales, ctx);
}

// dweight (OC, C) = dY^T . X + beta * dweight (beta 1: +=): dout_t = dY^T's cast (OC, N) in
// dout_format, inp_t = X^T's e4m3 cast (C, N); rows: (OC), (C) (dY's and X's column scales over all N tokens).
inline void matmul_fp8_backward_weight(__nv_bfloat16* dweight, const uint8_t* dout_t, Fp8Format dout_format,
                                       const float* dout_t_sinv, const uint8_t* inp_t, const float* inp_t_sinv, int N,
                                       int C, int OC, float beta, Fp8Scales scales, const CudaContext& ctx) {
    matmul_fp8(dweight, dout_t, dout_format, dout_t_sinv, inp_t, Fp8Format::E4M3, inp_t_sinv, OC, C, N, nullptr, beta,
               false, scales, ctx);
}
