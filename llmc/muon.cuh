// muon.cuh: torch.optim.Muon on the GPU, the step of llmc/cpu/muon.h (its comment has the formulas:
// Nesterov momentum as torch's lerps, quintic Newton-Schulz with torch's (a, b, c) and Frobenius
// normalisation, decoupled weight decay, --muon-adjust-lr) on every model_param_muon block
// (cpu::muon_row_blocks: Q, K, V, attproj, fc or SwiGLU's gate and up, fcproj), AdamW on the rest.
// Precision: the momentum buffer is fp32 (Model::m_memory's slice of each Muon tensor, as the CPU keeps
// it; v stays zero there); the Newton-Schulz iteration runs in floatX as torch runs it on a GPU: bf16
// operands and results with fp32 accumulation in the bf16 build (torch casts to bf16 first), plain fp32
// (no TF32) in the FP32 build, which then computes what the CPU's fp32 iteration does up to the GEMMs'
// summation order. The update w = w (1 - lr wd) - adjusted_lr O is applied in fp32 to the master
// weights, and the floatX parameters are rounded from them as adamw_fused rounds (stochastic, same hash).
//
// Blocks of one (rows, cols) shape form a group (GPT-2: Q, K, V and attproj are one group of 4L
// (C, C) matrices); a group's matrices go through the iteration together, as strided-batched cuBLASLt
// GEMMs on a scratch copy, `chunk` matrices a launch (the scratch stays under MUON_SCRATCH_BYTES).
// One chunk: muon_momentum (buf and the update U, each block's partial sum of squares), muon_norm (the
// Frobenius norm of each matrix), muon_normalize (X = U / norm), ns_steps x 3 GEMMs, muon_apply. No
// atomics (every sum has a fixed order), no host wait and no allocation after muon_build, the GEMMs'
// algorithms fixed at muon_build: bit-reproducible, and capturable in the step's CUDA graph
// (llmc/model_graph.cuh). The step's scalars (MuonArgs) live in device memory, as AdamW's do.
// Cost: per (m, n) matrix, m = min(rows, cols), ns_steps (4 m^2 n + 2 m^3) FLOPs in the GEMMs and
// ~5 passes over its elements (timed against that floor by dev/cuda/muon.cu).
#pragma once
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>
#include "llmc/adamw.cuh"
#include "llmc/cpu/muon.h"
#include "llmc/cuda_common.cuh"
#include "llmc/model.cuh"
#include "llmc/model_config.h"

constexpr int MUON_MAX_SEGMENTS = 7;        // blocks of one layer: Q, K, V, attproj, gate, up, fcproj
constexpr int MUON_NORM_BLOCKS = 64;        // muon_momentum's blocks per matrix (its partial sums)
constexpr int MUON_THREADS = 256;
constexpr int64_t MUON_PAD = 128;           // scratch matrices start 256-byte aligned (bf16)
constexpr size_t MUON_SCRATCH_BYTES = 512u << 20;
constexpr float MUON_EPS = 1e-7f;           // torch.optim.Muon's eps (the norm's floor)

// The step's scalars, in device memory (the host stages them in pinned memory: muon_set_args).
struct MuonArgs {
    float buf_weight;  // 1 - momentum, rounded from Python's double as lerp_'s weight
    float momentum;
    float decay;       // 1 - lr * wd, the unadjusted lr
    float alpha[MUON_MAX_SEGMENTS];  // each group's -adjusted_lr (cpu::muon_adjusted_lr)
};

// Where a launch's matrices live in the parameter buffer: the group's matrix g (g = first + the
// launch's index) is segment g / layers's block of layer g % layers, elems values (rows, cols).
struct MuonMatrices {
    int64_t base[MUON_MAX_SEGMENTS];          // element offset of the segment's layer-0 block
    int64_t layer_stride[MUON_MAX_SEGMENTS];  // elements of one layer of the segment's tensor
    int layers = 0, first = 0;
    int64_t elems = 0;   // rows * cols
    int64_t stride = 0;  // scratch elements from one matrix to the next (elems padded to MUON_PAD)
    __host__ __device__ int64_t offset(int j) const {
        const int g = first + j, s = g / layers;
        return base[s] + (int64_t)(g % layers) * layer_stride[s];
    }
};

// One of a group's three GEMMs, D = alpha op(A) op(B) + beta C, strided-batched, its algorithm fixed.
struct MuonGemm {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;  // C has D's layout
    cublasLtMatmulAlgo_t algo;
    float alpha = 1.0f, beta = 0.0f;
};

struct MuonGroup {
    int rows = 0, cols = 0, segments = 0;
    int m = 0, n = 0;            // the iteration's (min, max)(rows, cols)
    int count = 0, chunk = 0;    // matrices (segments * layers), and per launch (divides count)
    MuonMatrices mats;
    MuonGemm gram, update, iterate;  // A = X X^T; B = b A + c A A; Y = a X + B X
};

struct Muon {
    std::vector<MuonGroup> groups;
    std::vector<int64_t> adamw_begin, adamw_end;  // the other tensors' element ranges, for AdamW
    floatX *x = nullptr, *y = nullptr, *a = nullptr, *b = nullptr;  // (chunk, stride) each, the largest group's
    double* partials = nullptr;  // (chunk, MUON_NORM_BLOCKS)
    float* norms = nullptr;      // (chunk) each matrix's divisor
    MuonArgs* args = nullptr;    // (1) device
    MuonArgs* host_args = nullptr;  // (1) pinned
    int ns_steps = 5;               // the run's Newton-Schulz iterations (muon_set_args; fixed once captured)
    void* allocation = nullptr;
    size_t allocated_bytes = 0;
};

namespace muon_detail {
// Sum of a block's values in a fixed order (warp shuffles, then the warps in order); thread 0's is valid.
__device__ inline double block_sum(double v) {
    __shared__ double warp_sums[MUON_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    double total = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < MUON_THREADS / 32; w++) total += warp_sums[w];
    return total;
}

// A thread's elements of a matrix: a grid-stride loop over the blocks along x.
__device__ inline int64_t first() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ inline int64_t step() { return (int64_t)gridDim.x * blockDim.x; }

// torch.lerp, branch for branch (cpu::detail::torch_lerp), in IEEE round-to-nearest operations.
__device__ inline float torch_lerp(float start, float end, float weight) {
    const float diff = __fsub_rn(end, start);
    return fabsf(weight) < 0.5f ? __fadd_rn(start, __fmul_rn(weight, diff))
                                : __fsub_rn(end, __fmul_rn(diff, __fsub_rn(1.0f, weight)));
}
}  // namespace muon_detail

// Steps 1-2, matrix blockIdx.y of the launch, a fixed grid-stride share of its elements per thread:
// g = grads * grad_scale; buf = lerp(buf, g, 1 - mu); u = lerp(g, buf, mu) (Nesterov), stored in
// floatX (the iteration's input, torch's .bfloat16()); partials[matrix, blockIdx.x] = the sum of the
// stored u's squares. Reads grads (floatX) and buf, writes buf and u: memory-bound.
static __global__ void muon_momentum(floatX* u, double* partials, float* buf, const floatX* grads, MuonMatrices mats,
                                     const AdamWArgs* __restrict__ adamw, const MuonArgs* __restrict__ args) {
    const int64_t at = mats.offset(blockIdx.y);
    const float scale = adamw->grad_scale, weight = args->buf_weight, mu = args->momentum;
    floatX* out = u + blockIdx.y * mats.stride;
    double sq = 0.0;
    for (int64_t e = muon_detail::first(); e < mats.elems; e += muon_detail::step()) {
        const float g = __fmul_rn(to_float(grads[at + e]), scale);
        const float b = muon_detail::torch_lerp(buf[at + e], g, weight);
        buf[at + e] = b;
        const floatX x = from_float<floatX>(muon_detail::torch_lerp(g, b, mu));
        out[e] = x;
        sq += (double)to_float(x) * to_float(x);
    }
    sq = muon_detail::block_sum(sq);
    if (threadIdx.x == 0) partials[blockIdx.y * gridDim.x + blockIdx.x] = sq;
}

// Step 3's divisor of matrix blockIdx.x from its partials, one warp: max(||U||_F, eps), in the bf16
// build rounded to bf16 first as torch's norm of a bf16 tensor is.
static __global__ void muon_norm(float* norms, const double* partials) {
    double sq = 0.0;
    for (int i = threadIdx.x; i < MUON_NORM_BLOCKS; i += 32) sq += partials[blockIdx.x * MUON_NORM_BLOCKS + i];
    for (int o = 16; o > 0; o >>= 1) sq += __shfl_down_sync(0xffffffffu, sq, o);
    if (threadIdx.x != 0) return;
    const float norm = to_float(from_float<floatX>((float)sqrt(sq)));
    norms[blockIdx.x] = fmaxf(norm, to_float(from_float<floatX>(MUON_EPS)));
}

// X = U / norm in place, rounded to floatX (torch's div_ on the bf16 copy). Memory-bound.
static __global__ void muon_normalize(floatX* x, const float* norms, MuonMatrices mats) {
    floatX* m = x + blockIdx.y * mats.stride;
    const float d = norms[blockIdx.y];
    for (int64_t e = muon_detail::first(); e < mats.elems; e += muon_detail::step())
        m[e] = from_float<floatX>(__fdiv_rn(to_float(m[e]), d));
}

// Steps 4-5 on matrix blockIdx.y: master = master * decay + alpha * O (O in the rows, cols layout of the
// parameter), then params = master rounded as adamw_fused rounds it (the parameter's index in the hash).
// In the FP32 build master is params. Memory-bound.
static __global__ void muon_apply(floatX* params, float* master, const floatX* o, MuonMatrices mats, int group,
                                  const AdamWArgs* __restrict__ adamw, const MuonArgs* __restrict__ args) {
    const int64_t at = mats.offset(blockIdx.y);
    const float decay = args->decay, alpha = args->alpha[group];
    const floatX* om = o + blockIdx.y * mats.stride;
    for (int64_t e = muon_detail::first(); e < mats.elems; e += muon_detail::step()) {
        const int64_t k = at + e;
        const float p = __fadd_rn(__fmul_rn(master[k], decay), __fmul_rn(alpha, to_float(om[e])));
        if constexpr (std::is_same<floatX, float>::value) {
            params[k] = p;
        } else {
            master[k] = p;
            if (adamw->stochastic) params[k] = stochastic_round_bf16(p, hash_index(adamw->seed, (uint64_t)k));
            else params[k] = from_float<floatX>(p);
        }
    }
}

namespace muon_detail {
inline cublasLtMatrixLayout_t layout(uint64_t rows, uint64_t cols, int64_t ld, int count, int64_t stride) {
    cublasLtMatrixLayout_t l;
    cublasCheck(cublasLtMatrixLayoutCreate(&l, CUBLAS_FLOATX, rows, cols, ld));
    cublasCheck(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    cublasCheck(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                 sizeof(stride)));
    return l;
}

// A GEMM of column-major layouts a, b, d (which it owns), its algorithm the heuristic's first pick.
inline MuonGemm plan_gemm(const CudaContext& ctx, bool trans_a, bool trans_b, cublasLtMatrixLayout_t a,
                          cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, float alpha, float beta) {
    MuonGemm g;
    g.a = a, g.b = b, g.d = d, g.alpha = alpha, g.beta = beta;
    cublasCheck(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));  // fp32 accumulation, never TF32
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    const size_t workspace = ctx.cublaslt_workspace_size;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                     sizeof(workspace)));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt, g.desc, a, b, d, d, pref, 1, &heur, &found));
    if (found == 0) fail("cuBLASLt has no algorithm for a Muon Newton-Schulz GEMM");
    g.algo = heur.algo;
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    return g;
}

inline void run_gemm(const MuonGemm& g, void* d, const void* a, const void* b, const void* c, const CudaContext& ctx) {
    cublasCheck(cublasLtMatmul(ctx.cublaslt, g.desc, &g.alpha, a, g.a, b, g.b, &g.beta, c, g.d, d, g.d, &g.algo,
                               ctx.cublaslt_workspace, ctx.cublaslt_workspace_size, ctx.stream));
}

inline void free_gemm(MuonGemm& g) {
    cublasCheck(cublasLtMatmulDescDestroy(g.desc));
    cublasCheck(cublasLtMatrixLayoutDestroy(g.a));
    cublasCheck(cublasLtMatrixLayoutDestroy(g.b));
    cublasCheck(cublasLtMatrixLayoutDestroy(g.d));
}

// The three GEMMs of group r on its scratch matrices, column-major (cuBLAS): with rows <= cols X is
// row-major (m, n), i.e. column-major (n, m), and A = X X^T is op(T, N); with rows > cols the (rows,
// cols) row-major update is column-major (cols, rows) = X (m, n) itself, so no transpose is ever
// materialised and Y lands in the parameter's layout either way. A and B are symmetric (m, m).
inline void plan_group_gemms(MuonGroup& r, const CudaContext& ctx) {
    const int m = r.m, n = r.n, c = r.chunk;
    const int64_t sx = r.mats.stride, sa = ((int64_t)m * m + MUON_PAD - 1) / MUON_PAD * MUON_PAD;
    const bool t = r.rows > r.cols;
    auto lx = [&] { return t ? layout(m, n, m, c, sx) : layout(n, m, n, c, sx); };
    auto la = [&] { return layout(m, m, m, c, sa); };
    r.gram = plan_gemm(ctx, !t, t, lx(), lx(), la(), 1.0f, 0.0f);
    r.update = plan_gemm(ctx, false, false, la(), la(), la(), cpu::MUON_NS_C, cpu::MUON_NS_B);
    r.iterate = t ? plan_gemm(ctx, false, false, la(), lx(), lx(), 1.0f, cpu::MUON_NS_A)
                  : plan_gemm(ctx, false, false, lx(), la(), lx(), 1.0f, cpu::MUON_NS_A);
}

inline int64_t padded(int64_t elems) { return (elems + MUON_PAD - 1) / MUON_PAD * MUON_PAD; }
}  // namespace muon_detail

// The groups of config c's Muon blocks, their chunks and GEMMs, the AdamW ranges, the scratch and the
// args (one allocation, muon.allocated_bytes). Outside any graph capture; before the first step.
inline void muon_build(Muon& mu, const ModelConfig& c, const CudaContext& ctx) {
    using namespace muon_detail;
    const int L = c.num_layers;
    size_t sizes[NUM_PARAM_TENSORS], off[NUM_PARAM_TENSORS];
    model_param_sizes(c, sizes);
    model_param_offsets(c, off);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (model_param_muon(i) || sizes[i] == 0) continue;
        if (!mu.adamw_end.empty() && mu.adamw_end.back() == (int64_t)off[i]) mu.adamw_end.back() += (int64_t)sizes[i];
        else mu.adamw_begin.push_back((int64_t)off[i]), mu.adamw_end.push_back((int64_t)(off[i] + sizes[i]));
    }
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (!model_param_muon(i)) continue;
        int block_rows[cpu::MUON_MAX_ROW_BLOCKS], cols;
        const int blocks = cpu::muon_row_blocks(c, i, block_rows, &cols);
        int64_t at = (int64_t)off[i];
        for (int k = 0; k < blocks; k++) {
            const int rows = block_rows[k];
            auto same = [&](const MuonGroup& g) { return g.rows == rows && g.cols == cols; };
            auto it = std::find_if(mu.groups.begin(), mu.groups.end(), same);
            if (it == mu.groups.end()) {
                MuonGroup g;
                g.rows = rows, g.cols = cols, g.m = std::min(rows, cols), g.n = std::max(rows, cols);
                mu.groups.push_back(g);
                it = mu.groups.end() - 1;
            }
            it->mats.base[it->segments] = at;
            it->mats.layer_stride[it->segments] = (int64_t)(sizes[i] / L);
            it->segments++;
            at += (int64_t)rows * cols;
        }
    }
    int64_t xs = 0, as = 0, chunks = 0;
    for (MuonGroup& g : mu.groups) {
        g.count = g.segments * L;
        g.mats.layers = L;
        g.mats.elems = (int64_t)g.rows * g.cols;
        g.mats.stride = padded(g.mats.elems);
        const int64_t per = 2 * (g.mats.stride + padded((int64_t)g.m * g.m)) * (int64_t)sizeof(floatX);
        g.chunk = 1;  // the most matrices a launch that divide the group and fit the scratch budget
        for (int k = 1; k <= g.count; k++)
            if (g.count % k == 0 && k * per <= (int64_t)MUON_SCRATCH_BYTES) g.chunk = k;
        xs = std::max(xs, g.chunk * g.mats.stride);
        as = std::max(as, g.chunk * padded((int64_t)g.m * g.m));
        chunks = std::max<int64_t>(chunks, g.chunk);
    }
    const size_t X = sizeof(floatX);
    std::vector<BufferSpec> specs = {{(void**)&mu.x, (size_t)xs, X}, {(void**)&mu.y, (size_t)xs, X},
                                     {(void**)&mu.a, (size_t)as, X}, {(void**)&mu.b, (size_t)as, X},
                                     {(void**)&mu.partials, (size_t)chunks * MUON_NORM_BLOCKS, sizeof(double)},
                                     {(void**)&mu.norms, (size_t)chunks, sizeof(float)},
                                     {(void**)&mu.args, 1, sizeof(MuonArgs)}};
    mu.allocation = specs_allocate(specs, "the Muon scratch (--optimizer muon)");
    mu.allocated_bytes = specs_bytes(specs);
    cudaCheck(cudaMallocHost(&mu.host_args, sizeof(MuonArgs)));
    for (MuonGroup& g : mu.groups) plan_group_gemms(g, ctx);
    printf("muon: %zu groups of matrices (Newton-Schulz in %s, batched GEMMs), scratch %.1f MiB\n", mu.groups.size(),
           PRECISION_NAME, mu.allocated_bytes / 1048576.0);
}

inline void muon_free(Muon& mu) {
    for (MuonGroup& g : mu.groups)
        for (MuonGemm* gemm : {&g.gram, &g.update, &g.iterate}) muon_detail::free_gemm(*gemm);
    if (mu.allocation) cudaCheck(cudaFree(mu.allocation));
    if (mu.host_args) cudaCheck(cudaFreeHost(mu.host_args));
    mu = Muon();
}

// Host: the step's scalars into the pinned host_args (after the previous step's copy has run), as
// torch computes them: Python-double products rounded to float (cpu::muon_update's).
inline void muon_set_args(Muon& mu, const OptimizerSettings& o) {
    MuonArgs& a = *mu.host_args;
    mu.ns_steps = o.muon_ns_steps;
    a.buf_weight = (float)(1.0 - (double)o.muon_momentum);
    a.momentum = o.muon_momentum;
    a.decay = (float)(1.0 - (double)o.muon_lr * o.muon_weight_decay);
    const cpu::MuonAdjustLr adjust =
        o.muon_match_rms_adamw ? cpu::MuonAdjustLr::MATCH_RMS_ADAMW : cpu::MuonAdjustLr::ORIGINAL;
    for (size_t g = 0; g < mu.groups.size(); g++)
        a.alpha[g] = (float)-cpu::muon_adjusted_lr(o.muon_lr, mu.groups[g].rows, mu.groups[g].cols, adjust);
}

// Device, enqueued on ctx.stream: one Muon step on every Muon block of the whole buffers (params,
// master, grads, buf = the momentum in m's layout), the clip factor and rounding seed from adamw
// (device), the scalars from the host_args copied here.
inline void muon_update(floatX* params, float* master, const floatX* grads, float* buf, Muon& mu,
                        const AdamWArgs* adamw, const CudaContext& ctx) {
    using muon_detail::run_gemm;
    cudaStream_t s = ctx.stream;
    cudaCheck(cudaMemcpyAsync(mu.args, mu.host_args, sizeof(MuonArgs), cudaMemcpyHostToDevice, s));
    for (size_t gi = 0; gi < mu.groups.size(); gi++) {
        const MuonGroup& g = mu.groups[gi];
        const int64_t per_block = (int64_t)MUON_THREADS * 4;
        const unsigned bx = (unsigned)std::min<int64_t>(MUON_NORM_BLOCKS, (g.mats.elems + per_block - 1) / per_block);
        for (int first = 0; first < g.count; first += g.chunk) {
            MuonMatrices mats = g.mats;
            mats.first = first;
            muon_momentum<<<dim3(MUON_NORM_BLOCKS, g.chunk), MUON_THREADS, 0, s>>>(mu.x, mu.partials, buf, grads, mats,
                                                                                  adamw, mu.args);
            cudaCheckLaunch();
            muon_norm<<<g.chunk, 32, 0, s>>>(mu.norms, mu.partials);
            cudaCheckLaunch();
            muon_normalize<<<dim3(bx, g.chunk), MUON_THREADS, 0, s>>>(mu.x, mu.norms, mats);
            cudaCheckLaunch();
            floatX *x = mu.x, *y = mu.y;
            for (int step = 0; step < mu.ns_steps; step++) {
                run_gemm(g.gram, mu.a, x, x, mu.a, ctx);
                run_gemm(g.update, mu.b, mu.a, mu.a, mu.a, ctx);
                if (g.rows > g.cols) run_gemm(g.iterate, y, mu.b, x, x, ctx);
                else run_gemm(g.iterate, y, x, mu.b, x, ctx);
                std::swap(x, y);
            }
            muon_apply<<<dim3(bx, g.chunk), MUON_THREADS, 0, s>>>(params, master, x, mats, (int)gi, adamw, mu.args);
            cudaCheckLaunch();
        }
    }
}
