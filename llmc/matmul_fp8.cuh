// matmul_fp8.cuh: the three matmuls of a linear layer with FP8 operands, through cuBLASLt, from
// the per-tensor scaled casts of llmc/fp8.cuh (issue 18; docs/numerics.md). Output bf16, fp32
// compute (CUBLAS_COMPUTE_32F), fp32 scales read from device memory (the Fp8Meta's scale_inv, so a
// scale updated on the device needs no host round trip and the calls can sit in a CUDA graph).
// One copy of the cuBLASLt plumbing: matmul_cublaslt of llmc/matmul.cuh, with MatmulTypes saying
// FP8 operands, their scale pointers and the accumulation mode; its handle and workspace are the
// CudaContext's.
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
//   * e5m2 by default (gradients need the range); e4m3 gradients are the other choice (the lab
//     measures both). cuBLASLt takes any mix but e5m2 x e5m2, which no matmul here asks for.
// Fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM): Hopper's FP8 tensor cores accumulate a
// product in a narrower-than-fp32 register; without fast accumulation cuBLASLt adds the partial sums
// into fp32 every few k-steps (slower, exact to fp32 accumulation), with it the whole K runs in
// the tensor core's accumulator (faster, larger error that grows with K: the weight gradient's
// K = B*T = 65536 is the worst). The common recipe, and our default: fast for the forward, not for
// the two gradients. dev/cuda/matmul_fp8.cu measures both for all three.
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/fp8.cuh"
#include "llmc/matmul.cuh"
#include "llmc/utils.h"

// D (R, M) = sp * sq * P (R, K) . Q (M, K)^T + beta * D (+ bias (M), bf16), D bf16; sp, sq device
// pointers to the scale_inv of P's and Q's casts.
inline void matmul_fp8(__nv_bfloat16* d, const uint8_t* p, Fp8Format p_format, const float* sp, const uint8_t* q,
                       Fp8Format q_format, const float* sq, int R, int M, int K, const __nv_bfloat16* bias, float beta,
                       bool fast_accum, const CudaContext& ctx) {
    if (R % 16 != 0 || M % 16 != 0 || K % 16 != 0)
        fail("matmul_fp8: R = %d, M = %d, K = %d must be multiples of 16", R, M, K);
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
    t.a_scale = sq;
    t.b_scale = sp;
    t.fast_accum = fast_accum;
    matmul_cublaslt(ctx, d, q, p, M, R, K, true, false, K, K, M, beta,
                    bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, nullptr, t);
}

// The accumulation mode of each matmul: the default recipe above (the lab can override each).
struct Fp8Accum {
    bool forward = true, input_grad = false, weight_grad = false;
};

// out (N, OC) = X . W^T + bias: inp = X's e4m3 cast (N, C), weight = W's e4m3 cast (OC, C).
inline void matmul_fp8_forward(__nv_bfloat16* out, const uint8_t* inp, const Fp8Meta* inp_meta, const uint8_t* weight,
                               const Fp8Meta* weight_meta, const __nv_bfloat16* bias, int N, int C, int OC,
                               const CudaContext& ctx, Fp8Accum acc = Fp8Accum()) {
    matmul_fp8(out, inp, Fp8Format::E4M3, &inp_meta->scale_inv, weight, Fp8Format::E4M3, &weight_meta->scale_inv, N,
               OC, C, bias, 0.0f, acc.forward, ctx);
}

// dinp (N, C) = dY . W (=): dout = dY's cast (N, OC) in dout_format, weight_t = W^T's e4m3 cast (C, OC).
inline void matmul_fp8_backward_input(__nv_bfloat16* dinp, const uint8_t* dout, Fp8Format dout_format,
                                      const Fp8Meta* dout_meta, const uint8_t* weight_t, const Fp8Meta* weight_meta,
                                      int N, int C, int OC, const CudaContext& ctx, Fp8Accum acc = Fp8Accum()) {
    matmul_fp8(dinp, dout, dout_format, &dout_meta->scale_inv, weight_t, Fp8Format::E4M3, &weight_meta->scale_inv, N, C,
               OC, nullptr, 0.0f, acc.input_grad, ctx);
}

// dweight (OC, C) = dY^T . X + beta * dweight (beta 1: +=): dout_t = dY^T's cast (OC, N) in
// dout_format, inp_t = X^T's e4m3 cast (C, N).
inline void matmul_fp8_backward_weight(__nv_bfloat16* dweight, const uint8_t* dout_t, Fp8Format dout_format,
                                       const Fp8Meta* dout_meta, const uint8_t* inp_t, const Fp8Meta* inp_meta, int N,
                                       int C, int OC, float beta, const CudaContext& ctx, Fp8Accum acc = Fp8Accum()) {
    matmul_fp8(dweight, dout_t, dout_format, &dout_meta->scale_inv, inp_t, Fp8Format::E4M3, &inp_meta->scale_inv, OC, C,
               N, nullptr, beta, acc.weight_grad, ctx);
}
