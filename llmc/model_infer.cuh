// model_infer.cuh: inference on the GPU with a KV cache, for both model families (the config's norm,
// position, MLP, bias and head knobs), the model half of generate.cu and the GPU twin of
// llmc/cpu/model_infer.h (same steps, same cache layout). RoPE turns q and k after the QKV matmul at each
// token's own position, before k enters the cache. Only inference memory: the floatX weights, one
// layer's activations for a prefill's rows (reused by every layer), the cache, the generation state.
// The layer ops are the training forward's (llmc/model.cuh); llmc/model_reference.cuh runs them over a
// whole sequence as the reference of --check-full.
// The cache (docs/design.md, "KV cache and decode attention"): per layer k and v, (B, NKV, S, HD)
// floatX, position p of sequence b in slot p % S; S = max_seq, or a ring of S = W slots for a window W.
//
// One batch of B prompts (fewer run with the rest idle):
//   model_infer_prefill: tokens (B, T) right-padded with their lengths and which rows are real; every
//       layer over the B*T rows (causal flash attention: the padding never reaches a prompt position),
//       kv_cache_fill per layer, then the logits (B, Vp) of each prompt's last position; resets the
//       generation state.
//   model_infer_step: one token per sequence: sample from the logits (B, Vp) on the GPU, book-keep
//       (end-of-text, --max-new, the context end, teacher forcing), then the forward of the new tokens
//       at M = B rows, which leaves the next logits. Everything that changes from token to token lives
//       in device buffers, so the step is captured once as a CUDA graph (model_infer_step_graph).
//   step_out (B): the token each sequence produced this step (-1: none), copied out by the caller.
// A step's kernels (GPT-2 124M at B = 1: ~2.5 us of weights each) are bound by launch and dependency
// latency, not bandwidth. decode_step_plan picks them (the lab, dev/cuda/decode_step.cu, overrides it):
// the fused step at B <= GEMV_MAX_M (5 kernels a layer, decode_layers_fused; lm_head's GEMV and the
// prefill also leave the greedy argmax in `pending`, so a greedy step without teacher forcing starts
// with advance_and_encode instead of the sampler and the encoder), cuBLASLt above it (kv_cache_append
// folded into attention_decode). Every kernel of ours after the step's first is a programmatic
// dependent of the one before (llmc/cuda_common.cuh): the next GEMV loads its weights meanwhile.
#pragma once
#include <vector>
#include "llmc/attention_decode.cuh"
#include "llmc/formats.h"  // float_to_bf16: the host parameters' rounding to bf16
#include "llmc/gemv.cuh"
#include "llmc/kv_cache.cuh"
#include "llmc/model.cuh"
#include "llmc/rmsnorm.cuh"
#include "llmc/rope.cuh"
#include "llmc/sampler.cuh"
#include "llmc/swiglu.cuh"

struct GenerateLimits {
    SamplingParams sampling;
    int eot;        // stop token, -1 = none
    int max_new;    // tokens a sequence produces at most
    int force_len;  // teacher forcing: tokens in ModelInfer::force (0 = off); a sequence stops after them
};

// The decode step's kernel choices for one batch size (decode_step_plan; the lab overrides fields).
struct DecodeStepPlan {
    bool gemv = true;                 // matmuls of at most GEMV_MAX_M rows through gemv.cuh (else cuBLASLt)
    bool fused = true;                // the fused step: 5 kernels a layer (decode_layers_fused)
    bool append_in_attention = true;  // (not fused) kv_cache_append folded into attention_decode
    bool pdl = true;                  // every kernel after the step's first as a programmatic dependent
    bool fold_argmax = true;          // (fused) lm_head's GEMV also takes the greedy argmax into `pending`
    bool decode_mma = true;           // (not fused) attention_decode on the tensor cores (decode_mma_route)
    bool gemv_mma = true;             // (fused) the GEMVs on the tensor cores where GemvPolicy::tensor_cores
};

// The policy: the fused step with the folded argmax where B <= GEMV_MAX_M and the norm prologue fits a
// GEMV block's shared memory; above it, cuBLASLt, the append in attention_decode and its tensor-core
// kernels where decode_mma_route takes them. PDL on all of our kernels.
inline DecodeStepPlan decode_step_plan(const ModelConfig& c, int B, int S, int window, int num_sms, bool clusters) {
    using namespace attention_detail;
    DecodeStepPlan p;
    p.fused = B <= GEMV_MAX_M && gemv_norm_smem(B, c.channels) <= (size_t)GEMV_NORM_MAX_SMEM;
    p.fold_argmax = p.fused;
    const int NH = c.num_heads, NKV = c.num_kv_heads, HD = model_head_dim(c);
    p.decode_mma = !p.fused &&
                   decode_mma_route(B, NH, NKV, HD, decode_plan(B, NH, NKV, S, window, num_sms, clusters), num_sms);
    return p;
}

struct ModelInfer {
    ModelConfig config{};
    DecodeStepPlan plan;  // decode_step_plan's, set by model_infer_build
    int B = 0;        // sequences at once
    int Tmax = 0;     // prompt tokens per sequence a prefill may have
    int max_seq = 0;  // positions a sequence may use
    int S = 0, window = 0;  // cache slots per (sequence, KV head); the window attention_decode applies
    floatX* params_memory = nullptr;  // (num_params) MODEL_PARAMETER_TABLE order
    ModelTensors<floatX> params{};
    floatX* k_cache = nullptr;  // (L, B, NKV, S, HD)
    floatX* v_cache = nullptr;  // (L, B, NKV, S, HD)
    float* decode_scratch = nullptr;  // attention_decode's split partials and counters (zeroed once)
    float* sample_scratch = nullptr;  // greedy argmax: (B, P) maxima, (B, P) int indices, (B) int counters (zeroed once)
    float* argmax_scratch = nullptr;  // gemv_argmax_scratch_floats(B, SMs): lm_head's folded argmax (zeroed once)
    int* pending = nullptr;           // (B) the folded argmax: each sequence's greedy token from the last logits
    // one layer's activations over R = B * Tmax rows (a decode step uses the first B)
    floatX* res1;      // (R, C) the residual stream entering a layer
    floatX* res2;      // (R, C) after the attention block
    floatX* ln;        // (R, C) a LayerNorm's output (the last one: lnf)
    float* mean;       // (R) LayerNorm only
    float* rstd;       // (R)
    floatX* qkv;       // (R, QKV)
    floatX* atty;      // (R, C)
    float* lse;        // (B, NH, Tmax) the prefill attention's statistics (unused after)
    floatX* proj;      // (R, C) output of attproj / fcproj
    floatX* fch;       // (R, FC) pre-GELU (the matmul's GELU epilogue writes it), or SwiGLU's [gate | up] (R, 2H)
    floatX* fch_gelu;  // (R, H) the MLP's activation: GELU, or SwiGLU of fch
    floatX* last;      // (B, C) lnf of each prompt's last position
    floatX* logits;    // (B, Vp)
    float* rope_cos;   // (max_seq, HD/2) with RoPE: cpu::rope_tables_for, uploaded once
    float* rope_sin;   // (max_seq, HD/2)
    // generation state, device
    int* prompt;       // (B, Tmax) right-padded prompts
    int* lengths;      // (B) prompt lengths
    int* active;       // (B) 1 while a sequence generates
    int* tokens;       // (B) the token each sequence feeds next
    int* pos;          // (B) its position, -1 when idle
    int* produced;     // (B) tokens produced so far
    int* step_out;     // (B) this step's token, -1 = none
    int* force;        // (max_force) teacher forcing tokens
    uint64_t* rng;     // (B) splitmix64 states
    int max_force = 0;
    void* allocation = nullptr;
    size_t allocated_bytes = 0;
    cudaGraphExec_t graph = nullptr;  // the captured step (for the limits it was captured with)
    GenerateLimits graph_limits{};
};

// What the GPU inference runs (the training model's kernels); a host check, callable before the device starts.
inline void model_infer_check_config(const ModelConfig& c, const char* what) {
    model_validate_config(c, what);
    model_check_gpu_support(c, what);
}

// Sizes everything for B sequences of prompts up to Tmax tokens and max_seq positions, uploads the
// fp32 host parameters `host` (model_num_params(c) values) as floatX.
inline void model_infer_build(ModelInfer& m, const ModelConfig& c, const float* host, int B, int Tmax, int max_seq,
                             int max_force, const CudaContext& ctx) {
    model_infer_check_config(c, "model");
    const int C = c.channels, HD = model_head_dim(c), NKV = c.num_kv_heads, L = c.num_layers;
    if (max_seq < 1 || max_seq > c.max_seq_len)
        fail("--max-seq %d: must be in [1, %d] (the model's max_seq_len)", max_seq, c.max_seq_len);
    if (B < 1 || Tmax < 1 || Tmax > max_seq) fail("internal: model_infer_build with B=%d Tmax=%d", B, Tmax);
    m.config = c;
    m.B = B;
    m.Tmax = Tmax;
    m.max_seq = max_seq;
    const bool ring = c.window > 0 && c.window < max_seq;
    m.S = ring ? c.window : max_seq;
    m.window = ring ? c.window : 0;  // W >= max_seq never hides a position: full causal
    m.max_force = std::max(1, max_force);
    size_t offsets[NUM_PARAM_TENSORS];
    model_param_offsets(c, offsets);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        if (offsets[i] % 8 != 0) fail("model: tensor %s does not start on a 16-byte boundary", MODEL_PARAM_NAMES[i]);

    const size_t n = model_num_params(c), R = (size_t)B * Tmax, QKV = model_qkv_channels(c), X = sizeof(floatX);
    const size_t F = sizeof(float), I = sizeof(int), cache = (size_t)L * B * NKV * m.S * HD;
    const size_t FC = model_fc_channels(c), H = model_mlp_hidden(c);
    const size_t rope = c.position == POS_ROPE ? (size_t)max_seq * HD / 2 : 0;
    const size_t scratch = attention_decode_scratch_floats(B, c.num_heads, NKV, HD, m.S, m.window, ctx);
    const int sms = ctx.sm_count;
    m.plan = decode_step_plan(c, B, m.S, m.window, sms, attention_detail::decode_clusters_available(ctx));
    std::vector<BufferSpec> specs = {
        {(void**)&m.params_memory, n, X},    {(void**)&m.k_cache, cache, X},      {(void**)&m.v_cache, cache, X},
        {(void**)&m.decode_scratch, std::max<size_t>(scratch, 1), F},
        {(void**)&m.sample_scratch, (size_t)B * (2 * sample_greedy_blocks(c.vocab_size) + 1), F},
        {(void**)&m.argmax_scratch, gemv_argmax_scratch_floats(std::min(B, GEMV_MAX_M), sms), F},
        {(void**)&m.pending, (size_t)B, I},
        {(void**)&m.res1, R * C, X},         {(void**)&m.res2, R * C, X},         {(void**)&m.ln, R * C, X},
        {(void**)&m.mean, R, F},             {(void**)&m.rstd, R, F},             {(void**)&m.qkv, R * QKV, X},
        {(void**)&m.atty, R * C, X},         {(void**)&m.lse, R * c.num_heads, F}, {(void**)&m.proj, R * C, X},
        {(void**)&m.fch, R * FC, X},         {(void**)&m.fch_gelu, R * H, X},     {(void**)&m.last, (size_t)B * C, X},
        {(void**)&m.logits, (size_t)B * c.padded_vocab_size, X},
        {(void**)&m.rope_cos, std::max<size_t>(rope, 1), F}, {(void**)&m.rope_sin, std::max<size_t>(rope, 1), F},
        {(void**)&m.prompt, R, I},           {(void**)&m.lengths, (size_t)B, I},  {(void**)&m.active, (size_t)B, I},
        {(void**)&m.tokens, (size_t)B, I},   {(void**)&m.pos, (size_t)B, I},      {(void**)&m.produced, (size_t)B, I},
        {(void**)&m.step_out, (size_t)B, I}, {(void**)&m.force, (size_t)m.max_force, I},
        {(void**)&m.rng, (size_t)B, sizeof(uint64_t)},
    };
    m.allocated_bytes = specs_bytes(specs);
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    const double GiB = 1073741824.0;
    if (m.allocated_bytes + (256u << 20) > free_bytes)
        fail("generate needs %.2f GiB of GPU memory (KV cache %.2f GiB) but only %.2f GiB are free: lower --batch or "
             "--max-seq", m.allocated_bytes / GiB, 2.0 * cache * X / GiB, free_bytes / GiB);
    m.allocation = specs_allocate(specs, "the inference model, activations and KV cache");
    m.params = model_point_tensors(m.params_memory, c);
    cudaCheck(cudaMemset(m.allocation, 0, m.allocated_bytes));  // the scratches' counters start at zero
    if (host == nullptr) {
        // the caller copies floatX parameters in (model_infer_sample: the training model's)
    } else if (HAS_MASTER) {
        std::vector<uint16_t> bf(n);
        for (size_t i = 0; i < n; i++) bf[i] = float_to_bf16(host[i]);
        cudaCheck(cudaMemcpy(m.params_memory, bf.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    } else {
        cudaCheck(cudaMemcpy(m.params_memory, host, n * sizeof(float), cudaMemcpyHostToDevice));
    }
    if (rope) rope_tables_upload(m.rope_cos, m.rope_sin, c, max_seq);  // the CPU twin's tables, bit for bit
}

inline void model_infer_free(ModelInfer& m) {
    if (m.graph) cudaCheck(cudaGraphExecDestroy(m.graph));
    cudaCheck(cudaFree(m.allocation));
    m = ModelInfer();
}

namespace infer_detail {

// out (M, N) (SwiGLU: (M, N/2)) = epi(inp (M, K) W^T + b): gemv_forward at M <= GEMV_MAX_M (plan.gemv),
// else cuBLASLt, whose GELU also writes `pre` and whose SwiGLU goes through `pre` (M, N).
inline void linear(ModelInfer& m, floatX* out, floatX* pre, const floatX* inp, const floatX* w,
                   const floatX* b, int M, int K, int N, GemvEpilogue epi, const CudaContext& ctx) {
    if (m.plan.gemv && gemv_supported(M, K, N, epi)) {
        gemv_forward(out, inp, w, b, M, K, N, epi, ctx, m.plan.pdl);
    } else if (epi == GEMV_SWIGLU) {
        matmul_forward(pre, nullptr, inp, w, b, M, K, N, ctx);
        swiglu_forward(out, pre, M, N / 2, ctx.stream);
    } else {
        matmul_forward(out, epi == GEMV_GELU ? pre : nullptr, inp, w, b, M, K, N, ctx);
    }
}

// How the norms launch (llmc/cuda_common.cuh): a block per row up to NORM_ROW_MAX_M rows, PDL with plan.pdl.
inline NormLaunch norm_launch(const ModelInfer& m) { return {true, m.plan.pdl}; }

// residual = inp1 + inp2, out = norm(residual), over M rows.
inline void residual_norm(ModelInfer& m, floatX* residual, floatX* out, const floatX* inp1, const floatX* inp2,
                          const floatX* w, const floatX* b, int M, cudaStream_t s) {
    const ModelConfig& c = m.config;
    if (c.norm == NORM_RMSNORM)
        fused_residual_rmsnorm_forward(residual, out, m.rstd, inp1, inp2, w, M, c.channels, (float)c.norm_eps, s,
                                       norm_launch(m));
    else fused_residual_layernorm_forward(residual, out, m.mean, m.rstd, inp1, inp2, w, b, M, c.channels, s,
                                          norm_launch(m));
}

// The transformer blocks over M rows of res1 (the embeddings), leaving the final norm of every row
// in `ln`. attend(l) fills atty from qkv for layer l (RoPE first, and that layer's K/V into the cache).
template <typename Attend>
inline void layers(ModelInfer& m, int M, const CudaContext& ctx, Attend&& attend) {
    const ModelConfig& c = m.config;
    const int C = c.channels, L = c.num_layers, QKV = model_qkv_channels(c), FC = model_fc_channels(c);
    const int H = model_mlp_hidden(c);
    const ModelTensors<floatX>& p = m.params;
    cudaStream_t s = ctx.stream;
    if (c.norm == NORM_RMSNORM)
        rmsnorm_forward(m.ln, m.rstd, m.res1, p.ln1w, M, C, (float)c.norm_eps, s, norm_launch(m));
    else layernorm_forward(m.ln, m.mean, m.rstd, m.res1, p.ln1w, p.ln1b, M, C, s, norm_launch(m));
    const GemvEpilogue act = c.mlp == MLP_SWIGLU ? GEMV_SWIGLU : GEMV_GELU;
    for (int l = 0; l < L; l++) {
        const size_t c1 = (size_t)l * C;
        linear(m, m.qkv, nullptr, m.ln, p.qkvw + (size_t)l * QKV * C, tensor_at(p.qkvb, (size_t)l * QKV), M, C, QKV,
               GEMV_PLAIN, ctx);
        attend(l);
        linear(m, m.proj, nullptr, m.atty, p.attprojw + c1 * C, tensor_at(p.attprojb, c1), M, C, C, GEMV_PLAIN,
               ctx);
        residual_norm(m, m.res2, m.ln, m.res1, m.proj, p.ln2w + c1, tensor_at(p.ln2b, c1), M, s);
        linear(m, m.fch_gelu, m.fch, m.ln, p.fcw + (size_t)l * FC * C, tensor_at(p.fcb, (size_t)l * FC), M, C, FC, act,
               ctx);
        linear(m, m.proj, nullptr, m.fch_gelu, p.fcprojw + c1 * H, tensor_at(p.fcprojb, c1), M, H, C, GEMV_PLAIN,
               ctx);
        const bool next = l + 1 < L;
        residual_norm(m, m.res1, m.ln, m.res2, m.proj, next ? p.ln1w + c1 + C : p.lnfw,
                      next ? tensor_at(p.ln1b, c1 + C) : p.lnfb, M, s);
    }
}

// The classifier's weight: wte (tied) or lm_head.
inline const floatX* head(const ModelInfer& m) { return m.config.tied_head ? m.params.wte : m.params.lm_head; }

inline size_t layer_cache_offset(const ModelInfer& m, int l) {
    return (size_t)l * m.B * m.config.num_kv_heads * m.S * model_head_dim(m.config);
}

// last (B, C) = ln row (b, lengths[b] - 1) of ln (B, T, C): one thread per 16-byte pack.
static __global__ void gather_last_rows(floatX* last, const floatX* ln, const int* lengths, int B, int T, int C) {
    const int packs = C / x128::size, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * packs) return;
    const int b = idx / packs, c = (idx % packs) * x128::size;
    store128(last + (size_t)b * C + c, load128(ln + ((size_t)b * T + lengths[b] - 1) * C + c));
}

// The CPU loop's book-keeping (generate_cpu.cpp) after sequence b produced token `id` as its n-th: output
// it; stop at end-of-text, after max_new or the forced tokens, or at the context end (output, never fed).
__device__ inline void advance(int b, int id, int n, int* step_out, int* tokens, int* pos, int* produced, int* active,
                               const int* lengths, const GenerateLimits& lim, int max_seq) {
    const int at = lengths[b] + n;  // the new token's position
    step_out[b] = id;
    produced[b] = n + 1;
    const bool done = id == lim.eot || n + 1 == lim.max_new || n + 1 == lim.force_len || at >= max_seq;
    if (done) {
        active[b] = 0;
        pos[b] = -1;
    } else {
        tokens[b] = id;
        pos[b] = at;
    }
}

// One block per sequence: the next token from its logits (any sampling, teacher forcing), then advance.
static __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_and_advance(int* step_out, int* tokens, int* pos, int* produced, int* active, uint64_t* rng,
                   const floatX* logits, const int* lengths, const int* force, GenerateLimits lim, int V, int Vp,
                   int max_seq) {
    pdl_wait();  // (no-ops in its plain launch; they keep every kernel of the step chain-safe if it is not)
    pdl_launch_dependents();  // the encoder (a programmatic dependent) may start
    const int b = blockIdx.x;
    if (!active[b]) {
        if (threadIdx.x == 0) step_out[b] = -1;
        return;
    }
    const int n = produced[b];
    const int id = lim.force_len > 0 ? force[n]
                                     : sampler_detail::block_sample(logits + (size_t)b * Vp, V, lim.sampling, rng + b);
    if (threadIdx.x == 0) advance(b, id, n, step_out, tokens, pos, produced, active, lengths, lim, max_seq);
}

// A greedy step without teacher forcing (not folded): grid (P = sample_greedy_blocks(V), B); block (p, b)
// puts the first largest of logits[b][p * CHUNK, (p + 1) * CHUNK) in the scratch, the last block of b
// merges the P candidates (ties to the lower index) and advances (llmc/sampler.cuh, the top). Blocks
// read active[b] before counting in; the last writes it after all have, and resets the counter.
static __global__ void __launch_bounds__(SAMPLE_GREEDY_THREADS)
sample_greedy_and_advance(int* step_out, int* tokens, int* pos, int* produced, int* active, float* scratch,
                          const floatX* logits, const int* lengths, GenerateLimits lim, int V, int Vp, int max_seq) {
    __shared__ float sh_v[32];
    __shared__ int sh_i[32];
    __shared__ bool sh_last;
    pdl_wait();
    pdl_launch_dependents();
    const int b = blockIdx.y, P = gridDim.x, B = gridDim.y;
    float* part_v = scratch;                                    // (B, P)
    int* part_i = reinterpret_cast<int*>(scratch + (size_t)B * P);  // (B, P)
    int* counter = part_i + (size_t)B * P + b;                  // (B)
    if (!active[b]) {
        if (blockIdx.x == 0 && threadIdx.x == 0) step_out[b] = -1;
        return;
    }
    const int lo = blockIdx.x * SAMPLE_GREEDY_CHUNK, hi = min(V, lo + SAMPLE_GREEDY_CHUNK);
    const sampler_detail::ArgMax a =
        sampler_detail::block_argmax_range(logits + (size_t)b * Vp, lo, hi, V, sh_v, sh_i);
    if (threadIdx.x == 0) {
        part_v[(size_t)b * P + blockIdx.x] = a.v;
        part_i[(size_t)b * P + blockIdx.x] = a.i;
        __threadfence();
        sh_last = atomicAdd(counter, 1) == P - 1;
        if (sh_last) *counter = 0;
    }
    __syncthreads();
    if (!sh_last) return;
    __threadfence();
    sampler_detail::ArgMax best{-INFINITY, V};
    for (int i = threadIdx.x; i < P; i += blockDim.x)
        sampler_detail::argmax_merge(best, {__ldcg(part_v + (size_t)b * P + i), __ldcg(part_i + (size_t)b * P + i)});
    best = sampler_detail::block_argmax_merge(best, sh_v, sh_i, V);
    if (threadIdx.x == 0)
        advance(b, best.i < V ? best.i : 0, produced[b], step_out, tokens, pos, produced, active, lengths, lim, max_seq);
}

// Whether a step runs decode_layers_fused (plan.fused, on the GEMV kernels).
inline bool fused_step(const ModelInfer& m) { return m.plan.fused && m.plan.gemv; }
// Whether lm_head folds the greedy argmax into `pending` (every fused step, whatever the sampling: it
// always belongs to the latest logits), and whether this step starts from it.
inline bool fold_argmax(const ModelInfer& m) { return m.plan.fold_argmax && fused_step(m); }
inline bool fold_step(const ModelInfer& m, const GenerateLimits& lim) {
    return fold_argmax(m) && lim.sampling.temperature == 0.0f && lim.force_len == 0;
}

// The first kernel of a folded greedy step: sequence b's token is pending[b]; thread 0 advances, then
// the block embeds the token fed next (encoder_forward_at's row: an idle or finished sequence embeds
// token 0 at position 0). Grid (B), a thread per 16-byte pack of C (rounded up to a warp); a plain launch.
static __global__ void advance_and_encode(floatX* out, int* step_out, int* tokens, int* pos, int* produced,
                                          int* active, const int* pending, const floatX* wte, const floatX* wpe,
                                          const int* lengths, GenerateLimits lim, int max_seq, int C) {
    __shared__ int sh_tok, sh_pos;
    pdl_wait();  // (no-ops in its plain launch, as the sampler's)
    pdl_launch_dependents();
    const int b = blockIdx.x;
    if (threadIdx.x == 0) {
        int p = -1, tok = 0;
        if (active[b]) {
            advance(b, pending[b], produced[b], step_out, tokens, pos, produced, active, lengths, lim, max_seq);
            p = pos[b];
            tok = tokens[b];
        } else {
            step_out[b] = -1;
        }
        sh_tok = tok;
        sh_pos = p;
    }
    __syncthreads();
    for (int c = threadIdx.x * x128::size; c < C; c += blockDim.x * x128::size)
        encode_pack(out, wte, wpe, b, c, sh_tok, sh_pos, C);
}

// pending (B) = the first largest of each row of logits (B, Vp) over V (0 if all NaN): the prefill's
// folded argmax. Grid (B), SAMPLE_THREADS.
static __global__ void __launch_bounds__(SAMPLE_THREADS)
argmax_rows(int* pending, const floatX* logits, int V, int Vp) {
    __shared__ float sh_v[32];
    __shared__ int sh_i[32];
    const int id = sampler_detail::block_argmax(logits + (size_t)blockIdx.x * Vp, V, sh_v, sh_i);
    if (threadIdx.x == 0) pending[blockIdx.x] = id;
}

// The fused GEMV's prologue of the model's norm with weight w and bias b (RMSNorm: none).
inline GemvFusion norm_fusion(const ModelConfig& c, const floatX* w, const floatX* b) {
    const bool rms = c.norm == NORM_RMSNORM;
    GemvFusion f;
    f.norm = rms ? GEMV_NORM_RMS : GEMV_NORM_LAYER;
    f.norm_w = w;
    f.norm_b = rms ? nullptr : b;
    f.eps = (float)c.norm_eps;
    return f;
}

// The layers and the classifier of a step at M = B <= GEMV_MAX_M rows, from the embeddings in res1, as
// 5 kernels a layer (gemv.cuh's fused kernels):
//   norm+qkv+kv     qkv = ln1(res1) Wqkv^T + b, RoPE on q and k (Llama), K and V into cache slot pos[b] % S
//   attention_decode  atty
//   attproj+residual  res2 = res1 + atty Wproj^T + b
//   norm+fc+gelu    fch_gelu = gelu(ln2(res2) Wfc^T + b) (Llama: norm+fc+swiglu, SwiGLU of [gate | up])
//   fcproj+residual res1 = res2 + fch_gelu Wfcproj^T + b
// (then decode_head_fused). Residual ping-pong: no kernel writes a buffer its own inputs come from.
// `ln`, `proj`, `mean` and `rstd` are not written.
inline void decode_layers_fused(ModelInfer& m, const CudaContext& ctx) {
    const ModelConfig& c = m.config;
    const int B = m.B, C = c.channels, L = c.num_layers, QKV = model_qkv_channels(c), FC = model_fc_channels(c);
    const int H = model_mlp_hidden(c), NH = c.num_heads, NKV = c.num_kv_heads, HD = model_head_dim(c);
    const ModelTensors<floatX>& p = m.params;
    const bool rope = c.position == POS_ROPE, swiglu = c.mlp == MLP_SWIGLU;
    for (int l = 0; l < L; l++) {
        const size_t c1 = (size_t)l * C, off = layer_cache_offset(m, l);
        GemvFusion fq = norm_fusion(c, p.ln1w + c1, tensor_at(p.ln1b, c1));
        fq.k_cache = m.k_cache + off;
        fq.v_cache = m.v_cache + off;
        fq.pos = m.pos;
        fq.rope_cos = rope ? m.rope_cos : nullptr;
        fq.rope_sin = rope ? m.rope_sin : nullptr;
        fq.NH = NH;
        fq.NKV = NKV;
        fq.HD = HD;
        fq.S = m.S;
        const bool pdl = m.plan.pdl, mma = m.plan.gemv_mma;
        gemv_fused_forward(m.qkv, m.res1, p.qkvw + (size_t)l * QKV * C, tensor_at(p.qkvb, (size_t)l * QKV), B, C, QKV,
                           GEMV_QKV, fq, ctx, pdl, mma);
        // early loads: started by PDL while the QKV GEMV runs (no tensor-core route: it has none)
        attention_decode(m.atty, m.qkv, m.k_cache + off, m.v_cache + off, m.pos, B, NH, NKV, HD, m.S, ctx, m.window,
                         m.decode_scratch, pdl, false, pdl, false);
        GemvFusion fr;
        fr.residual = m.res1;
        gemv_fused_forward(m.res2, m.atty, p.attprojw + c1 * C, tensor_at(p.attprojb, c1), B, C, C, GEMV_RESIDUAL, fr,
                           ctx, pdl, mma);
        const GemvFusion ff = norm_fusion(c, p.ln2w + c1, tensor_at(p.ln2b, c1));
        gemv_fused_forward(m.fch_gelu, m.res2, p.fcw + (size_t)l * FC * C, tensor_at(p.fcb, (size_t)l * FC), B, C, FC,
                           swiglu ? GEMV_SWIGLU : GEMV_GELU, ff, ctx, pdl, mma);
        fr.residual = m.res2;
        gemv_fused_forward(m.res1, m.fch_gelu, p.fcprojw + c1 * H, tensor_at(p.fcprojb, c1), B, H, C, GEMV_RESIDUAL, fr,
                           ctx, pdl, mma);
    }
}

// The fused step's norm+lm_head GEMV (with the folded argmax), after the layers left res1.
inline void decode_head_fused(ModelInfer& m, const CudaContext& ctx) {
    const ModelConfig& c = m.config;
    const ModelTensors<floatX>& p = m.params;
    GemvFusion fl = norm_fusion(c, p.lnfw, p.lnfb);
    if (fold_argmax(m)) {
        fl.argmax = m.pending;
        fl.argmax_scratch = m.argmax_scratch;
        fl.argmax_cols = c.vocab_size;
    }
    gemv_fused_forward(m.logits, m.res1, head(m), nullptr, m.B, c.channels, c.padded_vocab_size, GEMV_PLAIN, fl, ctx,
                       m.plan.pdl, m.plan.gemv_mma);
}

}  // namespace infer_detail

// tokens (B, T) host, right-padded; lengths (B) in [1, T]; active (B): 1 = a real prompt (0 = a
// padding row, idle from the start); rng (B) the sampling states. Fills the cache and leaves the
// logits (B, Vp) of each prompt's last position; resets the generation state.
inline void model_infer_prefill(ModelInfer& m, const int* tokens, const int* lengths, const int* active,
                               const uint64_t* rng, int T, const CudaContext& ctx) {
    const ModelConfig& c = m.config;
    const int B = m.B, C = c.channels, NH = c.num_heads, NKV = c.num_kv_heads, HD = model_head_dim(c);
    if (T < 1 || T > m.Tmax) fail("internal: prefill of T=%d, built for %d", T, m.Tmax);
    for (int b = 0; b < B; b++)
        if (lengths[b] < 1 || lengths[b] > T) fail("internal: prefill length %d of sequence %d", lengths[b], b);
    cudaStream_t s = ctx.stream;
    std::vector<int> neg(B, -1), zero(B, 0);
    cudaCheck(cudaMemcpyAsync(m.prompt, tokens, sizeof(int) * B * T, cudaMemcpyHostToDevice, s));
    cudaCheck(cudaMemcpyAsync(m.lengths, lengths, sizeof(int) * B, cudaMemcpyHostToDevice, s));
    cudaCheck(cudaMemcpyAsync(m.active, active, sizeof(int) * B, cudaMemcpyHostToDevice, s));
    cudaCheck(cudaMemcpyAsync(m.rng, rng, sizeof(uint64_t) * B, cudaMemcpyHostToDevice, s));
    cudaCheck(cudaMemcpyAsync(m.pos, neg.data(), sizeof(int) * B, cudaMemcpyHostToDevice, s));
    cudaCheck(cudaMemcpyAsync(m.produced, zero.data(), sizeof(int) * B, cudaMemcpyHostToDevice, s));
    cudaCheck(cudaMemcpyAsync(m.tokens, zero.data(), sizeof(int) * B, cudaMemcpyHostToDevice, s));
    encoder_forward(m.res1, m.prompt, m.params.wte, m.params.wpe, B, T, C, s);  // wpe nullptr with RoPE
    infer_detail::layers(m, B * T, ctx, [&](int l) {
        const size_t off = infer_detail::layer_cache_offset(m, l);
        if (c.position == POS_ROPE) rope_forward(m.qkv, m.rope_cos, m.rope_sin, B, T, NH, NKV, HD, 0, s);
        model_attention_forward(m.atty, m.lse, m.qkv, model_attn_shape(c, B, T), ctx);
        kv_cache_fill(m.k_cache + off, m.v_cache + off, m.qkv, m.lengths, B, T, NH, NKV, HD, m.S, s);
    });
    infer_detail::gather_last_rows<<<ceil_div(B * C / x128::size, 256), 256, 0, s>>>(m.last, m.ln, m.lengths, B, T, C);
    cudaCheckLaunch();
    infer_detail::linear(m, m.logits, nullptr, m.last, infer_detail::head(m), nullptr, B, C,
                         c.padded_vocab_size, GEMV_PLAIN, ctx);
    if (infer_detail::fold_argmax(m)) {  // the first folded step's tokens
        infer_detail::argmax_rows<<<B, SAMPLE_THREADS, 0, s>>>(m.pending, m.logits, c.vocab_size, c.padded_vocab_size);
        cudaCheckLaunch();
    }
    cudaCheck(cudaStreamSynchronize(s));  // the host vectors above leave scope
}

// The forward of one new token per sequence (tokens, pos on the device) into logits (B, Vp).
// With `encoded`, the step's first kernel was advance_and_encode, which left the embeddings in res1.
inline void model_infer_decode_forward(ModelInfer& m, const CudaContext& ctx, bool encoded = false) {
    const ModelConfig& c = m.config;
    const int B = m.B, C = c.channels, NH = c.num_heads, NKV = c.num_kv_heads, HD = model_head_dim(c);
    cudaStream_t s = ctx.stream;
    const DecodeStepPlan& plan = m.plan;
    if (!encoded) encoder_forward_at(m.res1, m.tokens, m.pos, m.params.wte, m.params.wpe, B, C, s, plan.pdl);
    if (infer_detail::fused_step(m)) {
        infer_detail::decode_layers_fused(m, ctx);
        infer_detail::decode_head_fused(m, ctx);
        return;
    }
    // one op a kernel (cuBLASLt's are plain launches; ours programmatic dependents with plan.pdl)
    infer_detail::layers(m, B, ctx, [&](int l) {
        const size_t off = infer_detail::layer_cache_offset(m, l);
        if (c.position == POS_ROPE) rope_forward_at(m.qkv, m.rope_cos, m.rope_sin, m.pos, B, NH, NKV, HD, s);
        if (!plan.append_in_attention)
            kv_cache_append(m.k_cache + off, m.v_cache + off, m.qkv, m.pos, B, NH, NKV, HD, m.S, s);
        attention_decode(m.atty, m.qkv, m.k_cache + off, m.v_cache + off, m.pos, B, NH, NKV, HD, m.S, ctx, m.window,
                         m.decode_scratch, plan.pdl, plan.append_in_attention, false, plan.decode_mma);
    });
    infer_detail::linear(m, m.logits, nullptr, m.ln, infer_detail::head(m), nullptr, B, C,
                         c.padded_vocab_size, GEMV_PLAIN, ctx);
}

// One generation step, enqueued: sample + book-keeping, then the forward of the new tokens.
inline void model_infer_step(ModelInfer& m, const GenerateLimits& lim, const CudaContext& ctx) {
    const ModelConfig& c = m.config;
    if (infer_detail::fold_step(m, lim)) {  // the sampler's pick came with the last logits: advance, embed
        const int threads = std::min(1024, norm_block_per_row_threads(c.channels));
        launch_kernel(infer_detail::advance_and_encode, dim3(m.B), dim3(threads), 0, ctx.stream, false, m.res1,
                      m.step_out, m.tokens, m.pos, m.produced, m.active, m.pending, m.params.wte, m.params.wpe,
                      m.lengths, lim, m.max_seq, c.channels);
        cudaCheckLaunch();
        model_infer_decode_forward(m, ctx, true);
        return;
    }
    // a plain launch: the first node of the captured step (PDL has no edge to the previous replay)
    if (lim.sampling.temperature == 0.0f && lim.force_len == 0)
        launch_kernel(infer_detail::sample_greedy_and_advance, dim3(sample_greedy_blocks(c.vocab_size), m.B),
                      dim3(SAMPLE_GREEDY_THREADS), 0, ctx.stream, false, m.step_out, m.tokens, m.pos, m.produced,
                      m.active, m.sample_scratch, m.logits, m.lengths, lim, c.vocab_size, c.padded_vocab_size,
                      m.max_seq);
    else
        launch_kernel(infer_detail::sample_and_advance, dim3(m.B), dim3(SAMPLE_THREADS), 0, ctx.stream, false,
                      m.step_out, m.tokens, m.pos, m.produced, m.active, m.rng, m.logits, m.lengths, m.force, lim,
                      c.vocab_size, c.padded_vocab_size, m.max_seq);
    cudaCheckLaunch();
    model_infer_decode_forward(m, ctx);
}

// One step with every sequence idle, not captured (the forward writes only rows nobody reads, no cache
// slot): it loads every kernel of the step and does their one-time setup (CudaContext::allow_smem,
// the GEMV's occupancy query) before any capture, and leaves the generation state idle. Call it after
// model_infer_build, before the first prefill.
inline void model_infer_warmup(ModelInfer& m, const GenerateLimits& lim, const CudaContext& ctx) {
    const std::vector<int> neg(m.B, -1);
    cudaCheck(cudaMemcpy(m.pos, neg.data(), sizeof(int) * m.B, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(m.active, 0, sizeof(int) * m.B));
    model_infer_step(m, lim, ctx);
    cudaCheck(cudaStreamSynchronize(ctx.stream));
}

// The same step as one CUDA graph, captured at the first call (and again if the limits change),
// then replayed: one launch per token instead of ~12 per layer.
inline void model_infer_step_graph(ModelInfer& m, const GenerateLimits& lim, const CudaContext& ctx) {
    if (m.graph && memcmp(&lim, &m.graph_limits, sizeof lim) != 0) {
        cudaCheck(cudaGraphExecDestroy(m.graph));
        m.graph = nullptr;
    }
    if (!m.graph) {
        cudaGraph_t g;
        cudaCheck(cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal));
        model_infer_step(m, lim, ctx);
        cudaCheck(cudaStreamEndCapture(ctx.stream, &g));
        cudaCheck(cudaGraphInstantiate(&m.graph, g, 0));
        cudaCheck(cudaGraphDestroy(g));
        m.graph_limits = lim;
    }
    cudaCheck(cudaGraphLaunch(m.graph, ctx.stream));
}

// ============================================================================ the trainer's samples
// `gen_tokens` tokens after one end-of-text token, drawn at `temperature` from `rng` (advanced as
// sample_token on the host would), through the cache: a one-token prefill, then a decode step per token.
// `params`: the training model's floatX parameters on the device, copied in first. Build `m` with B = 1,
// Tmax = 1 and host = nullptr. A sample ends at the context end (max_seq tokens); the trainer checks
// --gen-tokens against it.
inline std::vector<int> model_infer_sample(ModelInfer& m, const floatX* params, int eot, int gen_tokens,
                                          float temperature, Rng& rng, const CudaContext& ctx) {
    if (m.B != 1) fail("internal: model_infer_sample needs a model built for one sequence (B = %d)", m.B);
    const size_t n = model_num_params(m.config);
    cudaCheck(cudaMemcpyAsync(m.params_memory, params, n * sizeof(floatX), cudaMemcpyDeviceToDevice, ctx.stream));
    const int len = 1, active = 1;
    const uint64_t state = rng.state;
    model_infer_prefill(m, &eot, &len, &active, &state, 1, ctx);
    GenerateLimits lim{};
    lim.sampling = SamplingParams{temperature, 0, 1.0f};
    lim.eot = -1;  // the trainers' samples run their full length
    lim.max_new = gen_tokens;
    lim.force_len = 0;
    std::vector<int> out;
    int id = 0;
    while ((int)out.size() < gen_tokens) {
        model_infer_step(m, lim, ctx);
        cudaCheck(cudaMemcpyAsync(&id, m.step_out, sizeof(int), cudaMemcpyDeviceToHost, ctx.stream));
        cudaCheck(cudaStreamSynchronize(ctx.stream));
        if (id < 0) break;  // the context end
        out.push_back(id);
    }
    cudaCheck(cudaMemcpy(&rng.state, m.rng, sizeof(uint64_t), cudaMemcpyDeviceToHost));
    return out;
}
