// matmul.cuh: the linear layers, y = x W^T + b, through cuBLASLt with the bias and the GELU fused
// into the GEMM epilogue. Row-major shapes: inp (N, C), weight (OC, C) ("out x in"), bias (OC),
// out (N, OC). fp32 accumulation always; the FP32 build uses plain fp32 (no TF32) so it can be
// tested at ~1e-5.
//   matmul_forward   out = inp W^T + b; with gelu_pre: gelu_pre = inp W^T + b and out = GELU(gelu_pre)
//                    (tanh approximation, cuBLASLt's GELU epilogue)                              (=)
//   matmul_backward  dinp = dout W (=); with gelu_pre (the forward's pre-activation of inp), the
//                    dGELU epilogue turns it into the gradient w.r.t. that pre-activation        (=)
//                    dweight += dout^T inp; dbias += column sums of dout                         (+=)
//                    with dpre_bias (--bias-grad dgelu|fused|epilogue, with gelu_pre): dpre_bias += column
//                    sums of dinp, the gradient of the bias that produced gelu_pre (fc's)        (+=)
// cuBLAS is column-major: a row-major (R, K) matrix is a column-major (K, R) one, so the row-major
// products above are computed as their transposes, e.g. out^T (OC, N) = W (OC, C) . inp^T (C, N).
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

// fp32 accumulation in both builds; in the FP32 build this also rules out TF32 inputs.
constexpr cublasComputeType_t MATMUL_COMPUTE = CUBLAS_COMPUTE_32F;

// The element types of one matmul_cublaslt call and, for FP8 operands (llmc/matmul_fp8.cuh), their
// scales and the accumulation mode; the defaults are the floatX GEMMs of this file.
struct MatmulTypes {
    cudaDataType_t a = CUBLAS_FLOATX, b = CUBLAS_FLOATX, d = CUBLAS_FLOATX, bias = CUBLAS_FLOATX;
    const float* a_scale = nullptr;  // device pointers: op(A) is read as A * *a_scale (FP8 only)
    const float* b_scale = nullptr;
    bool fast_accum = false;         // FP8 only: CUBLASLT_MATMUL_DESC_FAST_ACCUM (matmul_fp8.cuh)
};
inline bool cuda_type_is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

// D (m, n) = alpha * op(A) op(B) + beta * D, all column-major with leading dims lda/ldb/ldd; the
// epilogue adds `bias` (m) and applies GELU / dGELU with `aux` (m, n), leading dim ldd. Element
// types from `types` (C, the beta input, is D itself).
static void matmul_cublaslt(const CudaContext& ctx, void* d, const void* a, const void* b, int m, int n, int k,
                            bool trans_a, bool trans_b, int lda, int ldb, int ldd, float beta,
                            cublasLtEpilogue_t epilogue, const void* bias, void* aux,
                            const MatmulTypes& types = MatmulTypes()) {
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, MATMUL_COMPUTE, CUDA_R_32F));
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias) {
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        const cudaDataType_t bias_type = types.bias;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    if (aux) {
        const int64_t ld_aux = ldd;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof(ld_aux)));
    }
    if (types.a_scale)
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &types.a_scale,
                                                   sizeof(types.a_scale)));
    if (types.b_scale)
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &types.b_scale,
                                                   sizeof(types.b_scale)));
    if (cuda_type_is_fp8(types.a)) {
        const int8_t fast = types.fast_accum ? 1 : 0;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, types.a, trans_a ? k : m, trans_a ? m : k, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, types.b, trans_b ? n : k, trans_b ? k : n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, types.d, m, n, ldd));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &ctx.cublaslt_workspace_size, sizeof(ctx.cublaslt_workspace_size)));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt, desc, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found == 0)
        fail("cuBLASLt has no algorithm for m=%d n=%d k=%d trans_a=%d trans_b=%d epilogue=%d types a=%d b=%d d=%d", m, n,
             k, (int)trans_a, (int)trans_b, (int)epilogue, (int)types.a, (int)types.b, (int)types.d);
    const float alpha = 1.0f;
    cublasCheck(cublasLtMatmul(ctx.cublaslt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &heur.algo,
                               ctx.cublaslt_workspace, ctx.cublaslt_workspace_size, ctx.stream));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

// out^T (OC, N) = W (OC, C) . inp^T (C, N): A = weight stored column-major (C, OC), transposed.
// 2*N*C*OC FLOPs; at GPT-2 shapes cuBLAS reaches ~600-690 TFLOP/s on an H200 (docs/h200.md).
inline void matmul_forward(floatX* out, floatX* gelu_pre, const floatX* inp, const floatX* weight, const floatX* bias,
                           int N, int C, int OC, const CudaContext& ctx) {
    if (C % 8 != 0 || OC % 8 != 0) fail("matmul_forward: C = %d and OC = %d must be multiples of 8", C, OC);
    cublasLtEpilogue_t epi;
    if (gelu_pre) epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    matmul_cublaslt(ctx, out, weight, inp, OC, N, C, true, false, C, C, OC, 0.0f, epi, bias, gelu_pre);
}

// How matmul_backward sums bias gradients (the trainer's --bias-grad):
//   KERNEL    a fixed-order column-sum kernel re-reads dout (bias_backward below): the default.
//   DGELU     as KERNEL, except the bias in front of a GELU (fc's): the dinp GEMM of the layer after
//             it (fcproj), which reads that bias's gradient anyway, sums it in cuBLASLt's
//             DGELU_BGRAD epilogue (dGELU applied to the GEMM's output, then its row sums over the
//             N columns of the column-major (C, N) result: fc's dbias). Saves re-reading dfch, the
//             largest dout (N, 4C), at the price of what the epilogue does to the GEMM's kernel choice.
//   FUSED     DGELU, and attproj's bias from ln2's backward, which writes attproj's dY (the residual
//             gradient) and sums its columns on the way (llmc/layernorm.cuh, DRES; the model decides,
//             gpt2.cuh attproj_bias_in_ln2): qkv's and fcproj's by KERNEL.
//   EPILOGUE  DGELU, and every other bias through the BGRADB epilogue of the dweight GEMM (the sums
//             of op(B) = dout over the GEMM's k = N). Measured before (docs/perf.md, f6491a4) to make
//             cuBLASLt pick slower dweight kernels; kept to measure again next to DGELU.
// cuBLASLt writes a bias gradient (=) in the output's type (cublasLt.h: CUBLASLT_MATMUL_DESC_BIAS_POINTER),
// so the epilogues write into `scratch` and bias_grad_add adds it (+=, gradient accumulation): in the
// bf16 build that is a bf16-rounded sum added to a bf16 gradient (two roundings; the kernel rounds once).
// Determinism: the cuBLAS guide ("Results reproducibility") promises bit-identical results run to run
// for one toolkit, one architecture, one SM count and one stream, for all its routines; it says nothing
// specific about the epilogues' reductions. The heuristic's pick depends on the shapes, types and
// pointer alignments, which repeat every step. Checked, not assumed: test_gpt2cu's resume check
// (bit-identical losses and parameters) runs in the mode it is given, and tests/bias_grad_gpu.sh
// compares two training runs.
enum class BiasGrad { KERNEL, DGELU, FUSED, EPILOGUE };
inline const char* bias_grad_name(BiasGrad m) {
    return m == BiasGrad::KERNEL ? "kernel" : m == BiasGrad::DGELU ? "dgelu" : m == BiasGrad::FUSED ? "fused" : "epilogue";
}
// The --bias-grad flag of the programs that run the backward (train_gpt2cu, test_gpt2cu, profile_gpt2):
// its help text, and "kernel" | "dgelu" | "fused" | "epilogue" -> the mode ("" on success, else what is wrong).
constexpr const char* BIAS_GRAD_HELP =
    "how the bf16 linear layers sum their bias gradients: kernel (a fixed-order column-sum kernel re-reads each "
    "dY), dgelu (fc's bias in the dGELU epilogue of fcproj's input-gradient GEMM, the rest by the kernel), fused "
    "(dgelu, and attproj's bias summed by ln2's backward, which writes its dY; bf16 GPT-2) or epilogue (dgelu, and "
    "the other biases in the bias-gradient epilogue of their weight-gradient GEMM); llmc/matmul.cuh (default kernel)";
inline std::string parse_bias_grad(const char* s, BiasGrad* m) {
    for (BiasGrad v : {BiasGrad::KERNEL, BiasGrad::DGELU, BiasGrad::FUSED, BiasGrad::EPILOGUE})
        if (strcmp(s, bias_grad_name(v)) == 0) {
            *m = v;
            return "";
        }
    return std::string("unknown mode '") + s + "' (kernel, dgelu, fused, epilogue)";
}

// Bias gradient, stage 1: like
// layernorm_backward_param_partials, thread = pack of columns, blockIdx.y = chunk of rows walked in
// order; partials (chunks, OC). Re-reads dout: N * OC * sizeof(floatX) bytes. nvcc unrolls the row
// loop by 4 (4 loads in flight per thread); at OC = 768 that is 512 blocks of 96 busy threads.
static __global__ void bias_backward_partials(float* partials, const floatX* dout, int N, int OC, int rows_per_chunk) {
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (c >= OC) return;
    const int chunk = blockIdx.y;
    const int r0 = chunk * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float acc[x128::size] = {};
    for (int r = r0; r < r1; r++) {
        const x128 d = load128(dout + (int64_t)r * OC + c);
        for (int k = 0; k < x128::size; k++) acc[k] += to_float(d[k]);
    }
    float* p = partials + (int64_t)chunk * OC + c;
    for (int k = 0; k < x128::size; k++) p[k] = acc[k];
}

// dbias (OC) += column sums of dout (N, OC); scratch: column_num_chunks(N) * OC floats. Nothing
// without dbias. The bias gradient re-reads dout in a fixed order (deterministic). cuBLASLt's BGRADB
// epilogue would fold it into the dweight GEMM, but it makes that GEMM pick slower kernels: in the
// lab (docs/perf.md) the four backward GEMMs of a layer took 3.10 ms with it and 2.96 ms with these
// two small kernels, ~1.7 ms a step at GPT-2 124M. The FP8 path (llmc/gpt2_fp8.cuh) calls it too.
inline void bias_backward(floatX* dbias, float* scratch, const floatX* dout, int N, int OC, cudaStream_t stream) {
    if (!dbias) return;
    const int chunks = column_num_chunks(N), rows_per_chunk = ceil_div(N, chunks);
    const int packs = OC / x128::size, threads = 128;
    bias_backward_partials<<<dim3(ceil_div(packs, threads), chunks), threads, 0, stream>>>(scratch, dout, N, OC,
                                                                                          rows_per_chunk);
    cudaCheckLaunch();
    column_partials_add(dbias, scratch, chunks, OC, OC, stream);
}

// dbias (n) += an epilogue's bias gradient (n, floatX) in scratch: column_partials_add of one chunk.
inline void bias_grad_add(floatX* dbias, const float* scratch, int n, cudaStream_t stream) {
    column_partials_add(dbias, reinterpret_cast<const floatX*>(scratch), 1, n, n, stream);
}

// scratch: column_num_chunks(N) * OC floats with dbias, C floatX with dpre_bias. dpre_bias (C): only
// with gelu_pre and a mode other than KERNEL (see BiasGrad).
inline void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                            const floatX* inp, const floatX* weight, floatX* gelu_pre, int N, int C, int OC,
                            const CudaContext& ctx, BiasGrad mode = BiasGrad::KERNEL, floatX* dpre_bias = nullptr) {
    if (C % 8 != 0 || OC % 8 != 0) fail("matmul_backward: C = %d and OC = %d must be multiples of 8", C, OC);
    if (dpre_bias && (!gelu_pre || mode == BiasGrad::KERNEL))
        fail("matmul_backward: the pre-activation's bias gradient needs gelu_pre and --bias-grad dgelu|fused|epilogue");
    // dinp^T (C, N) = W^T (C, OC) . dout^T (OC, N): weight is column-major (C, OC) as stored; with
    // dpre_bias, the row sums of the dGELU'd result (C) into scratch.
    const cublasLtEpilogue_t dinp_epi = !gelu_pre ? CUBLASLT_EPILOGUE_DEFAULT
                                        : dpre_bias ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    matmul_cublaslt(ctx, dinp, weight, dout, C, N, OC, false, false, C, OC, C, 0.0f, dinp_epi,
                    dpre_bias ? scratch : nullptr, gelu_pre);
    if (dpre_bias) bias_grad_add(dpre_bias, scratch, C, ctx.stream);
    // dweight^T (C, OC) += inp^T (C, N) . dout (N, OC): dout is column-major (OC, N), transposed; with
    // EPILOGUE, dout's column sums over k = N (BGRADB, OC) into scratch.
    const bool bgradb = dbias && mode == BiasGrad::EPILOGUE;
    matmul_cublaslt(ctx, dweight, inp, dout, C, OC, N, false, true, C, OC, C, 1.0f,
                    bgradb ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT, bgradb ? scratch : nullptr, nullptr);
    if (bgradb) bias_grad_add(dbias, scratch, OC, ctx.stream);
    else bias_backward(dbias, scratch, dout, N, OC, ctx.stream);
}
