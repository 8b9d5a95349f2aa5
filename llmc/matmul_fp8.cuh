// matmul_fp8.cuh: the three matmuls of a linear layer with FP8 operands, through cuBLASLt
// (matmul_cublaslt, llmc/matmul.cuh), from the scaled casts of llmc/fp8.cuh (docs/numerics.md,
// "Layouts: what each matmul needs" and "Accumulation"). Output bf16, fp32 compute, fp32 scales read
// from device memory (no host round trip: the calls can sit in a CUDA graph).
// The one product:  D (R, M) row-major = scale_inv_p * scale_inv_q * P (R, K) . Q (M, K)^T, P and Q
// row-major with K contiguous: cuBLASLt's only FP8 layout on Hopper ("TN": row-major D is column-major
// (M, R) = Q (M, K) . P^T, so A = Q with op T, B = P with op N). R, M, K multiples of 16 (cuBLASLt's
// FP8 alignment), pointers 16-byte aligned.
// A linear layer, row-major X (N, C), W (OC, C), dY (N, OC):
//   forward          Y  = X . W^T (+ bias)   P = X    (N, C)   e4m3    Q = W   (OC, C)  e4m3   K = C
//   input gradient   dX = dY . W             P = dY   (N, OC)  e5m2*   Q = W^T (C, OC)  e4m3   K = OC
//   weight gradient  dW += dY^T . X          P = dY^T (OC, N)  e5m2*   Q = X^T (C, N)   e4m3   K = N
//   * e5m2 by default (gradients need the range), or e4m3; cuBLASLt takes any mix but e5m2 x e5m2.
//   The transposed copies: fp8_cast_transpose (llmc/model_fp8.cuh says when).
// Rowwise scaling (--fp8-scaling rowwise): one scale per row of every operand as stored, through
// cuBLASLt's outer-vector scales, D(i, j) *= sp[i] * sq[j] (CUDA 13: compute capability 9.0 only).
// Fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM: the whole K in the tensor cores' narrower
// accumulator, an error that grows with K): the forward's a setting (fast by default), the gradients' never.
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
                               Fp8Scales scales, const CudaContext& ctx, bool fast_accum) {
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

// dweight (OC, C) += dY^T . X: dout_t = dY^T's cast (OC, N) in dout_format, inp_t = X^T's e4m3 cast
// (C, N); rows: (OC), (C) (dY's and X's column scales over all N tokens).
inline void matmul_fp8_backward_weight(__nv_bfloat16* dweight, const uint8_t* dout_t, Fp8Format dout_format,
                                       const float* dout_t_sinv, const uint8_t* inp_t, const float* inp_t_sinv, int N,
                                       int C, int OC, Fp8Scales scales, const CudaContext& ctx) {
    matmul_fp8(dweight, dout_t, dout_format, dout_t_sinv, inp_t, Fp8Format::E4M3, inp_t_sinv, OC, C, N, nullptr, 1.0f,
               false, scales, ctx);
}
