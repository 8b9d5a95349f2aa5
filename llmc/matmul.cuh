// matmul.cuh: the linear layers, y = x W^T + b, through cuBLASLt with the bias and the GELU fused
// into the GEMM epilogue. Row-major shapes: inp (N, C), weight (OC, C) ("out x in"), bias (OC),
// out (N, OC). fp32 accumulation always; the FP32 build uses plain fp32 (no TF32) so it can be
// tested at ~1e-5.
//   matmul_forward   out = inp W^T + b; with gelu_pre: gelu_pre = inp W^T + b and out = GELU(gelu_pre)
//                    (tanh approximation, cuBLASLt's GELU epilogue)                              (=)
//   matmul_backward  dinp = dout W (=); with gelu_pre (the forward's pre-activation of inp), the
//                    dGELU epilogue turns it into the gradient w.r.t. that pre-activation        (=)
//                    dweight += dout^T inp; dbias += column sums of dout                         (+=)
// cuBLAS is column-major: a row-major (R, K) matrix is a column-major (K, R) one, so the row-major
// products above are computed as their transposes, e.g. out^T (OC, N) = W (OC, C) . inp^T (C, N).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

// The element types of one matmul_cublaslt call and, for FP8 operands (llmc/matmul_fp8.cuh), their
// scales and the accumulation mode; the defaults are the floatX GEMMs of this file.
struct MatmulTypes {
    cudaDataType_t a = CUBLAS_FLOATX, b = CUBLAS_FLOATX, d = CUBLAS_FLOATX, bias = CUBLAS_FLOATX;
    const float* a_scale = nullptr;  // device pointers: op(A) is read as A * *a_scale (FP8 only)
    const float* b_scale = nullptr;
    bool fast_accum = false;         // FP8 only: CUBLASLT_MATMUL_DESC_FAST_ACCUM (matmul_fp8.cuh)
    // FP8 only: a_scale (m) / b_scale (n) per row of op(A) / column of op(B), D(i, j) *= a_scale[i] *
    // b_scale[j] (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, Hopper only in CUDA 13; --fp8-scaling rowwise)
    bool outer_vec_scales = false;
};
inline bool cuda_type_is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

// ---------------------------------------------------------------- algorithm choice
// cuBLASLt's heuristic names one algorithm per call, tuned for large GEMMs; at a decode step's few
// rows (generate at B > GEMV_MAX_M) its first pick can take twice the time of another it lists.
// MatmulAlgoCache (--matmul-autotune 1, through CudaContext::matmul_algos; else the heuristic's first
// pick runs) remembers one algorithm per distinct matmul. While `tune` is on, a matmul not in it yet
// (and not inside a CUDA graph capture) is tuned: up to MATMUL_TUNE_HEURISTIC of the heuristic's
// algorithms plus split-K versions (2, 4, 8 splits, fp32 partials) of its first
// MATMUL_TUNE_SPLIT_BASES, each run MATMUL_TUNE_REPS times on the call's own operands with L2 flushed
// before each run (the step reads its weights cold); the median's fastest wins. Its output is compared
// once with the first pick's (MATMUL_TUNE_TOL of the largest |output|; split K only reorders the fp32
// sums): on a mismatch the first pick is kept, with a warning. floatX and FP8 GEMMs with a floatX
// output are tuned.
constexpr int MATMUL_TUNE_HEURISTIC = 16;
constexpr int MATMUL_TUNE_SPLIT_BASES = 4;
constexpr int MATMUL_TUNE_REPS = 7;
constexpr double MATMUL_TUNE_TOL = sizeof(floatX) == 2 ? 1e-2 : 1e-4;

struct MatmulKey {
    int m, n, k, lda, ldb, ldd;
    bool trans_a, trans_b, bias, aux, accumulate;
    cublasLtEpilogue_t epilogue;
    cudaDataType_t a, b, d;
    bool operator==(const MatmulKey& o) const {
        return m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb && ldd == o.ldd &&
               trans_a == o.trans_a && trans_b == o.trans_b && bias == o.bias && aux == o.aux &&
               accumulate == o.accumulate && epilogue == o.epilogue && a == o.a && b == o.b && d == o.d;
    }
};

struct MatmulAlgoCache {
    bool tune = false;     // tune matmuls not in the cache (outside captures); off: look up, else the heuristic
    bool verbose = true;   // one line a tuned matmul on stderr
    struct Entry {
        MatmulKey key;
        cublasLtMatmulAlgo_t algo;
    };
    std::vector<Entry> entries;
    const Entry* find(const MatmulKey& key) const {
        for (const Entry& e : entries)
            if (e.key == key) return &e;
        return nullptr;
    }
};

namespace matmul_detail {

inline MatmulKey make_key(int m, int n, int k, bool trans_a, bool trans_b, int lda, int ldb, int ldd, float beta,
                          cublasLtEpilogue_t epilogue, const void* bias, const void* aux, const MatmulTypes& t) {
    MatmulKey key;
    key.m = m; key.n = n; key.k = k; key.lda = lda; key.ldb = ldb; key.ldd = ldd;
    key.trans_a = trans_a; key.trans_b = trans_b; key.bias = bias != nullptr; key.aux = aux != nullptr;
    key.accumulate = beta != 0.0f;
    key.epilogue = epilogue;
    key.a = t.a; key.b = t.b; key.d = t.d;
    return key;
}

// One matmul D = op(A) op(B) (+ epilogue) with `algo`; the status instead of an exit (a candidate the
// library refuses at run time is skipped).
inline cublasStatus_t run(const CudaContext& ctx, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                          cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld, const void* a, const void* b, void* d,
                          float beta, const cublasLtMatmulAlgo_t& algo) {
    const float alpha = 1.0f;
    return cublasLtMatmul(ctx.cublaslt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &algo, ctx.cublaslt_workspace,
                          ctx.cublaslt_workspace_size, ctx.stream);
}

inline float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// The candidates: the heuristic's list (index 0 = its pick, `first`), then split-K versions of its
// first few that support a split and pass cublasLtMatmulAlgoCheck within the workspace.
inline std::vector<cublasLtMatmulAlgo_t> candidates(const CudaContext& ctx, cublasLtMatmulDesc_t desc,
                                                    cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                                                    cublasLtMatrixLayout_t ld, cublasLtMatmulPreference_t pref) {
    cublasLtMatmulHeuristicResult_t heur[MATMUL_TUNE_HEURISTIC];
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt, desc, la, lb, ld, ld, pref, MATMUL_TUNE_HEURISTIC, heur,
                                               &found));
    std::vector<cublasLtMatmulAlgo_t> out;
    for (int i = 0; i < found; i++)
        if (heur[i].state == CUBLAS_STATUS_SUCCESS) out.push_back(heur[i].algo);
    const int bases = std::min<int>((int)out.size(), MATMUL_TUNE_SPLIT_BASES);
    for (int i = 0; i < bases; i++) {
        int32_t split_ok = 0;
        uint32_t schemes = 0;
        size_t written = 0;
        if (cublasLtMatmulAlgoCapGetAttribute(&out[i], CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &split_ok, sizeof split_ok,
                                              &written) != CUBLAS_STATUS_SUCCESS || !split_ok)
            continue;
        cublasLtMatmulAlgoCapGetAttribute(&out[i], CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes,
                                          &written);
        // fp32 partials in the workspace only: the in-place and output-type schemes would round every
        // split's partial sum to bf16
        const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        if (!(schemes & scheme)) continue;
        for (int32_t splits : {2, 4, 8}) {
            cublasLtMatmulAlgo_t a = out[i];
            const cublasStatus_t set_splits =
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits);
            const cublasStatus_t set_scheme =
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme);
            if (set_splits != CUBLAS_STATUS_SUCCESS || set_scheme != CUBLAS_STATUS_SUCCESS) continue;
            cublasLtMatmulHeuristicResult_t check;
            if (cublasLtMatmulAlgoCheck(ctx.cublaslt, desc, la, lb, ld, ld, &a, &check) == CUBLAS_STATUS_SUCCESS &&
                check.workspaceSize <= ctx.cublaslt_workspace_size)
                out.push_back(a);
        }
    }
    return out;
}

inline int32_t algo_splits(const cublasLtMatmulAlgo_t& algo) {
    int32_t s = 1;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &s, sizeof s, &written);
    return s;
}

// Tunes one matmul and returns the algorithm to keep: the caller's descriptors, A, B and bias; D and aux
// the caller's where beta = 0 (the call that follows writes them again), else scratch (an accumulating
// matmul, timed as it runs, reading D). The first pick's and the chosen one's outputs are compared from
// a zeroed D over the first MATMUL_TUNE_CHECK_COLS columns. Synchronizes the stream (not in a capture).
constexpr int MATMUL_TUNE_CHECK_COLS = 512;
inline cublasLtMatmulAlgo_t tune(const CudaContext& ctx, const MatmulKey& key, cublasLtMatmulDesc_t desc,
                                 cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                                 cublasLtMatmulPreference_t pref, const void* a, const void* b, void* d_call,
                                 void* aux_call, const cublasLtMatmulAlgo_t& first, float beta) {
    const size_t d_elems = (size_t)key.ldd * key.n;
    const size_t check_elems = (size_t)key.ldd * std::min(key.n, MATMUL_TUNE_CHECK_COLS);
    const size_t flush_bytes = 2 * (size_t)std::max(ctx.props.l2CacheSize, 1 << 20);
    const bool scratch = beta != 0.0f;
    void *d = d_call, *aux = aux_call, *flush = nullptr;
    cudaCheck(cudaMalloc(&flush, flush_bytes));
    if (scratch) {
        cudaCheck(cudaMalloc(&d, d_elems * sizeof(floatX)));
        if (key.aux) {  // the epilogue's aux output goes to scratch too (same shape as D)
            cudaCheck(cudaMalloc(&aux, d_elems * sizeof(floatX)));
            cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        }
    }
    auto output_of = [&](const cublasLtMatmulAlgo_t& algo, std::vector<floatX>& out) {  // from D = 0
        cudaCheck(cudaMemsetAsync(d, 0, d_elems * sizeof(floatX), ctx.stream));
        if (run(ctx, desc, la, lb, ld, a, b, d, beta, algo) != CUBLAS_STATUS_SUCCESS)
            fail("matmul autotune: a timed algorithm failed when launched again");
        cudaCheck(cudaMemcpy(out.data(), d, check_elems * sizeof(floatX), cudaMemcpyDeviceToHost));
    };
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0));
    cudaCheck(cudaEventCreate(&e1));
    const std::vector<cublasLtMatmulAlgo_t> cand = candidates(ctx, desc, la, lb, ld, pref);
    std::vector<float> ms_of(cand.size(), INFINITY);
    std::vector<floatX> want(check_elems), got(check_elems);
    for (size_t i = 0; i < cand.size(); i++) {
        if (run(ctx, desc, la, lb, ld, a, b, d, beta, cand[i]) != CUBLAS_STATUS_SUCCESS) {  // also a warm-up
            (void)cudaGetLastError();  // a refused candidate leaves no launch error behind for the next
            continue;
        }
        cudaCheck(cudaStreamSynchronize(ctx.stream));
        std::vector<float> reps;
        bool ok = true;
        for (int r = 0; r < MATMUL_TUNE_REPS && ok; r++) {
            cudaCheck(cudaMemsetAsync(flush, r, flush_bytes, ctx.stream));
            cudaCheck(cudaEventRecord(e0, ctx.stream));
            ok = run(ctx, desc, la, lb, ld, a, b, d, beta, cand[i]) == CUBLAS_STATUS_SUCCESS;
            if (!ok) (void)cudaGetLastError();
            cudaCheck(cudaEventRecord(e1, ctx.stream));
            cudaCheck(cudaEventSynchronize(e1));
            float ms = 0;
            cudaCheck(cudaEventElapsedTime(&ms, e0, e1));
            reps.push_back(ms);
        }
        if (ok) ms_of[i] = median(reps);
        if (i == 0 && ok) output_of(cand[0], want);
    }
    cudaCheck(cudaGetLastError());  // no CUDA error pending after the candidates
    const size_t best = std::min_element(ms_of.begin(), ms_of.end()) - ms_of.begin();
    cublasLtMatmulAlgo_t keep = cand.empty() || !std::isfinite(ms_of[best]) ? first : cand[best];
    double diff = 0.0, scale = 1e-30;
    if (!cand.empty() && std::isfinite(ms_of[best]) && best != 0) {
        output_of(keep, got);
        for (int c = 0; c < std::min(key.n, MATMUL_TUNE_CHECK_COLS); c++)
            for (int r = 0; r < key.m; r++) {
                const double w = to_float(want[(size_t)c * key.ldd + r]), g = to_float(got[(size_t)c * key.ldd + r]);
                diff = std::max(diff, std::fabs(w - g));
                scale = std::max(scale, std::fabs(w));
            }
        if (!(diff <= MATMUL_TUNE_TOL * scale)) {
            fprintf(stderr, "warning: matmul autotune m=%d n=%d k=%d: the fastest algorithm's output differs from the "
                    "heuristic's by %.3g of max %.3g; keeping the heuristic's\n", key.m, key.n, key.k, diff, scale);
            keep = first;
        }
    }
    if (ctx.matmul_algos->verbose && !cand.empty())
        fprintf(stderr, "matmul autotune m=%d n=%d k=%d epilogue=%d: %zu candidates, heuristic's pick %.2f us, "
                "chosen #%zu (split-K %d) %.2f us, max |diff| %.3g of %.3g\n", key.m, key.n, key.k, (int)key.epilogue,
                cand.size(), 1e3 * ms_of[0], best, (int)algo_splits(keep), 1e3 * ms_of[best], diff, scale);
    cudaCheck(cudaEventDestroy(e0));
    cudaCheck(cudaEventDestroy(e1));
    cudaCheck(cudaFree(flush));
    if (scratch) {
        cudaCheck(cudaFree(d));
        if (aux) cudaCheck(cudaFree(aux));
    }
    return keep;
}

}  // namespace matmul_detail

// D (m, n) = alpha * op(A) op(B) + beta * D, all column-major with leading dims lda/ldb/ldd; the
// epilogue adds `bias` (m) and applies GELU / dGELU with `aux` (m, n), leading dim ldd. Element
// types from `types` (C, the beta input, is D itself). The algorithm: ctx.matmul_algos' (tuned
// there while it tunes), else the heuristic's first.
static void matmul_cublaslt(const CudaContext& ctx, void* d, const void* a, const void* b, int m, int n, int k,
                            bool trans_a, bool trans_b, int lda, int ldb, int ldd, float beta,
                            cublasLtEpilogue_t epilogue, const void* bias, void* aux,
                            const MatmulTypes& types = MatmulTypes()) {
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));  // fp32, never TF32
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias) {
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        const cudaDataType_t bias_type = types.bias;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    auto set_aux = [&] {
        const int64_t ld_aux = ldd;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof(ld_aux)));
    };
    if (aux) set_aux();
    if (types.a_scale)
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &types.a_scale,
                                                   sizeof(types.a_scale)));
    if (types.b_scale)
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &types.b_scale,
                                                   sizeof(types.b_scale)));
    if (types.outer_vec_scales) {
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
    }
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
    // outer-vector scales are a feature some GPUs and cuBLASLt versions lack: say which flag asked for them
    const char* rowwise = types.outer_vec_scales ? " with per-row (outer-vector) FP8 scales, as --fp8-scaling rowwise "
                                                   "asks (cuBLASLt has them on Hopper, sm_90, only)" : "";
    MatmulAlgoCache* cache = ctx.matmul_algos;
    const MatmulKey key = matmul_detail::make_key(m, n, k, trans_a, trans_b, lda, ldb, ldd, beta, epilogue, bias, aux,
                                                  types);
    const MatmulAlgoCache::Entry* hit = cache ? cache->find(key) : nullptr;
    cublasLtMatmulAlgo_t algo;
    if (hit) {
        algo = hit->algo;
    } else {
        cublasLtMatmulHeuristicResult_t heur;
        int found = 0;
        cublasCheck(cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt, desc, la, lb, ld, ld, pref, 1, &heur, &found));
        if (found == 0)
            fail("cuBLASLt has no algorithm for m=%d n=%d k=%d trans_a=%d trans_b=%d epilogue=%d types a=%d b=%d d=%d%s",
                 m, n, k, (int)trans_a, (int)trans_b, (int)epilogue, (int)types.a, (int)types.b, (int)types.d, rowwise);
        algo = heur.algo;
        const auto capturing = [&] {  // asked only where a tune could follow (not on the trainer's every call)
            cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
            cudaCheck(cudaStreamIsCapturing(ctx.stream, &st));
            return st != cudaStreamCaptureStatusNone;
        };
        const auto tunable = [](cudaDataType_t t) { return t == CUBLAS_FLOATX || cuda_type_is_fp8(t); };
        if (cache && cache->tune && tunable(types.a) && tunable(types.b) && types.d == CUBLAS_FLOATX && !capturing()) {
            algo = matmul_detail::tune(ctx, key, desc, la, lb, ld, pref, a, b, d, aux, heur.algo, beta);
            cache->entries.push_back({key, algo});
            if (aux) set_aux();  // tuning may have pointed it at its scratch
        }
    }
    const cublasStatus_t st = matmul_detail::run(ctx, desc, la, lb, ld, a, b, d, beta, algo);
    if (st != CUBLAS_STATUS_SUCCESS && types.outer_vec_scales)
        fail("cublasLtMatmul: status %d (%s) for m=%d n=%d k=%d epilogue=%d%s", (int)st, cublasGetStatusString(st), m, n,
             k, (int)epilogue, rowwise);
    cublasCheck(st);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

// out^T (OC, N) = W (OC, C) . inp^T (C, N): A = weight stored column-major (C, OC), transposed.
// 2*N*C*OC FLOPs; compute-bound. Measured: docs/perf.md, "Where the bf16 step goes".
inline void matmul_forward(floatX* out, floatX* gelu_pre, const floatX* inp, const floatX* weight, const floatX* bias,
                           int N, int C, int OC, const CudaContext& ctx) {
    if (C % 8 != 0 || OC % 8 != 0) fail("matmul_forward: C = %d and OC = %d must be multiples of 8", C, OC);
    cublasLtEpilogue_t epi;
    if (gelu_pre) epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    matmul_cublaslt(ctx, out, weight, inp, OC, N, C, true, false, C, C, OC, 0.0f, epi, bias, gelu_pre);
}

// ---------------------------------------------------------------- bias gradient (column sums of dout)
// One kernel: blocks of 32 x LANES threads (32 column packs, LANES row lanes), each over one column
// tile (BIAS_TILE_COLS columns: 256 bf16, 128 fp32) and one chunk of consecutive rows. Thread (x, y)
// sums rows y, y + LANES, ... of the chunk for its pack, UNROLL 16-byte streaming loads in flight;
// the block adds its lanes in lane order into one fp32 partial per column, (chunks, OC) in scratch.
// The tile's last block to finish (a counter per tile) folds its chunk partials in chunk order into
// dbias: no second launch, every sum in a fixed order (the same bits whichever block comes last).
// Grid: tiles x chunks ~ one wave of resident blocks on the H200's 132 SMs (1024 threads a SM, <= 64
// registers); chunks from N and OC only, so the bits do not depend on the GPU. Shipped (BiasShipped):
// LANES 16, UNROLL 8: at OC 768, 88 chunks of 745 rows, 2 blocks of 512 threads a SM, 128 KB in flight.
// Bytes: N * OC * sizeof(floatX) read once; memory-bound. Measured: docs/perf.md, "Memory-bound kernels".
constexpr int BIAS_TILE_PACKS = 32, BIAS_TILE_COLS = BIAS_TILE_PACKS * x128::size;
constexpr int BIAS_SM_THREADS = 1024, BIAS_SMS = 132;  // resident threads a SM (64 registers each), H200 SMs
constexpr int BIAS_MAX_TILES = 1024;                   // OC up to 262144 (bf16): the counters below
template <int LANES, int UNROLL>
struct BiasTiles {
    static constexpr int block = BIAS_TILE_PACKS * LANES, unroll = UNROLL, lanes = LANES;
    static constexpr int resident_blocks = BIAS_SMS * (BIAS_SM_THREADS / block);
    static constexpr int fold_groups = BIAS_TILE_COLS / 4, fold_lanes = block / fold_groups;  // float4s of a tile
    static_assert(BIAS_TILE_COLS <= block, "one thread per column of a tile for the in-block sum");
    static_assert(block % fold_groups == 0 && BIAS_SM_THREADS % block == 0, "the fold's lanes split the block evenly");
    static_assert(x128::size >= 4, "the fold's float4s fit in the lane sums' shared memory");
};
using BiasShipped = BiasTiles<16, 8>;
// Blocks of each tile done so far; the last one sets its tile's counter back to 0 for the next call.
// Zero at module load. One bias_backward at a time per device (the trainer's one stream).
static __device__ unsigned int bias_backward_done[BIAS_MAX_TILES];

template <typename Cfg>
static __global__ void __launch_bounds__(Cfg::block, BIAS_SM_THREADS / Cfg::block)
    bias_backward_column_tiles(floatX* dbias, float* partials, const floatX* dout, int N, int OC, int rows_per_chunk) {
    constexpr int LANES = Cfg::lanes, UNROLL = Cfg::unroll;
    __shared__ alignas(16) float lane_sum[LANES][BIAS_TILE_COLS];  // 16 KB at 16 lanes, bf16; reused by the fold
    __shared__ bool last;
    const int x = threadIdx.x % BIAS_TILE_PACKS, y = threadIdx.x / BIAS_TILE_PACKS, tile = blockIdx.x;
    const int chunk = blockIdx.y, chunks = gridDim.y;
    const int c = tile * BIAS_TILE_COLS + x * x128::size;
    const int r0 = chunk * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float acc[x128::size] = {};
    if (c < OC) {
        const floatX* col = dout + c;
        int r = r0 + y;
        for (; r + (UNROLL - 1) * LANES < r1; r += UNROLL * LANES) {
            x128 d[UNROLL];
#pragma unroll
            for (int i = 0; i < UNROLL; i++) d[i] = load128cs(col + (int64_t)(r + i * LANES) * OC);
#pragma unroll
            for (int i = 0; i < UNROLL; i++)
#pragma unroll
                for (int k = 0; k < x128::size; k++) acc[k] += to_float(d[i][k]);
        }
        for (; r < r1; r += LANES) {
            const x128 d = load128cs(col + (int64_t)r * OC);
#pragma unroll
            for (int k = 0; k < x128::size; k++) acc[k] += to_float(d[k]);
        }
    }
    // 16-byte stores: a quarter warp covers 32 consecutive banks (no conflicts)
#pragma unroll
    for (int k = 0; k < x128::size; k += 4)
        *reinterpret_cast<float4*>(&lane_sum[y][x * x128::size + k]) = make_float4(acc[k], acc[k + 1], acc[k + 2], acc[k + 3]);
    __syncthreads();
    const int t = threadIdx.x, tcol = tile * BIAS_TILE_COLS + t;
    if (t < BIAS_TILE_COLS && tcol < OC) {
        float sum = 0.0f;
#pragma unroll
        for (int v = 0; v < LANES; v++) sum += lane_sum[v][t];
        partials[(int64_t)chunk * OC + tcol] = sum;
    }
    // the classic last-block pattern: publish the partials, then count this block in
    __threadfence();
    __syncthreads();
    if (t == 0) last = atomicAdd(&bias_backward_done[tile], 1u) == (unsigned)chunks - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Fold: thread = (group of 4 columns g, fold lane l); lane l sums chunks l, l + fold_lanes, ... in
    // order (L2 reads past L1: other blocks wrote them), then the lanes are added in lane order.
    const int g = t % Cfg::fold_groups, l = t / Cfg::fold_groups, gcol = tile * BIAS_TILE_COLS + g * 4;
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (gcol < OC)
        for (int k = l; k < chunks; k += Cfg::fold_lanes) {
            const float4 p = __ldcg(reinterpret_cast<const float4*>(partials + (int64_t)k * OC + gcol));
            s.x += p.x; s.y += p.y; s.z += p.z; s.w += p.w;
        }
    float4* fold = reinterpret_cast<float4*>(&lane_sum[0][0]);  // (fold_lanes, fold_groups)
    fold[l * Cfg::fold_groups + g] = s;
    __syncthreads();
    if (t == 0) bias_backward_done[tile] = 0;
    if (l != 0 || gcol >= OC) return;
    float total[4] = {};
    for (int v = 0; v < Cfg::fold_lanes; v++) {
        const float4 p = fold[v * Cfg::fold_groups + g];
        total[0] += p.x; total[1] += p.y; total[2] += p.z; total[3] += p.w;
    }
    for (int k = 0; k < 4; k++) dbias[gcol + k] = from_float<floatX>(to_float(dbias[gcol + k]) + total[k]);
}

// bias_backward with a given tiling (the lab times others than the shipped one). Chunks: about
// Cfg::resident_blocks blocks in all, at least COLUMN_MIN_ROWS rows each, so the partials fit
// column_num_chunks(N) * OC floats.
template <typename Cfg>
inline void bias_backward_tiles(floatX* dbias, float* scratch, const floatX* dout, int N, int OC, cudaStream_t stream) {
    if (OC % x128::size != 0) fail("bias_backward: OC = %d must be a multiple of %d", OC, x128::size);
    const int tiles = ceil_div(OC, BIAS_TILE_COLS);
    if (tiles > BIAS_MAX_TILES) fail("bias_backward: OC = %d is wider than %d columns", OC, BIAS_MAX_TILES * BIAS_TILE_COLS);
    const int max_chunks = std::min(column_num_chunks(N), std::max(1, Cfg::resident_blocks / tiles));
    const int rows_per_chunk = ceil_div(N, max_chunks), chunks = ceil_div(N, rows_per_chunk);
    bias_backward_column_tiles<Cfg><<<dim3(tiles, chunks), Cfg::block, 0, stream>>>(dbias, scratch, dout, N, OC,
                                                                                   rows_per_chunk);
    cudaCheckLaunch();
}

// dbias (OC) += column sums of dout (N, OC); scratch: column_num_chunks(N) * OC floats. Nothing
// without dbias. Re-reads dout in a fixed order (deterministic) rather than use cuBLASLt's BGRADB
// epilogue, which makes the dweight GEMM pick slower kernels (dev/cuda/matmul.cu). The FP8 path calls it too.
inline void bias_backward(floatX* dbias, float* scratch, const floatX* dout, int N, int OC, cudaStream_t stream) {
    if (dbias) bias_backward_tiles<BiasShipped>(dbias, scratch, dout, N, OC, stream);
}

// dweight (OC, C) += dout^T inp: matmul_backward's weight gradient, also the FP8 path's with
// --fp8-wgrad bf16 (llmc/model_fp8.cuh).
inline void matmul_backward_weight(floatX* dweight, const floatX* dout, const floatX* inp, int N, int C, int OC,
                                   const CudaContext& ctx) {
    // dweight^T (C, OC) += inp^T (C, N) . dout (N, OC): dout is column-major (OC, N), transposed.
    matmul_cublaslt(ctx, dweight, inp, dout, C, OC, N, false, true, C, OC, C, 1.0f, CUBLASLT_EPILOGUE_DEFAULT,
                    nullptr, nullptr);
}

// scratch: column_num_chunks(N) * OC floats when dbias is given.
inline void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                            const floatX* inp, const floatX* weight, floatX* gelu_pre, int N, int C, int OC,
                            const CudaContext& ctx) {
    if (C % 8 != 0 || OC % 8 != 0) fail("matmul_backward: C = %d and OC = %d must be multiples of 8", C, OC);
    // dinp^T (C, N) = W^T (C, OC) . dout^T (OC, N): weight is column-major (C, OC) as stored.
    matmul_cublaslt(ctx, dinp, weight, dout, C, N, OC, false, false, C, OC, C, 0.0f,
                    gelu_pre ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT, nullptr, gelu_pre);
    matmul_backward_weight(dweight, dout, inp, N, C, OC, ctx);
    bias_backward(dbias, scratch, dout, N, OC, ctx.stream);
}
