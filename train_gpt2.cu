// train_gpt2.cu: the GPU trainer. GPT-2 on one GPU in mixed precision: floatX (bf16) parameters,
// activations and gradients, fp32 master weights and AdamW moments, stochastic rounding when the
// updated parameters are written back to bf16. The same code built with PRECISION_FP32 (make
// builds it as build/train_gpt2cu_fp32) runs in plain fp32 (floatX = float, no master copy); the
// tests hold that build to PyTorch at fp32 tolerances.
//
// Sections, in the order of train_gpt2_cpu.cpp: model (parameters, activations, memory plan),
// forward, backward, update, checkpoints, sampling, training loop. test_gpt2.cu includes this file
// with TESTING defined to reuse everything but main().
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <string>
#include <vector>
#include "llmc/cuda_common.cuh"
#include "llmc/adamw.cuh"
#include "llmc/attention.cuh"
#include "llmc/encoder.cuh"
#include "llmc/fused_classifier.cuh"
#include "llmc/gelu.cuh"
#include "llmc/global_norm.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/matmul.cuh"
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/formats.h"
#include "llmc/gpt2_config.h"
#include "llmc/rand.h"
#include "llmc/sampler.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"
#include "llmc/train_config.h"
#include "llmc/cpu/global_norm.h"  // grad_clip_scale: the one copy of torch's clipping rule

constexpr bool HAS_MASTER = !std::is_same<floatX, float>::value;  // bf16 build: separate fp32 master weights

// Attention: llmc/attention.cuh, or with USE_CUDNN=1 (bf16 builds only; the FP32 twins keep ours)
// cuDNN's fused SDPA through llmc/cudnn_attention.cuh, same signatures, for side-by-side timing.
#if defined(USE_CUDNN) && !defined(PRECISION_FP32)
#include "llmc/cudnn_attention.cuh"
#define ATTENTION_NAME "cudnn"
#define BENCH_NAME "ours_cudnn"
inline void model_attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int NKV, int HD,
                                    int window, cudaStream_t stream) {
    cudnn_attention_forward(out, lse, qkv, B, T, NH, NKV, HD, stream, window);
}
inline void model_attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                     const float* lse, int B, int T, int NH, int NKV, int HD, int window,
                                     float* /*scratch: ours only*/, cudaStream_t stream) {
    cudnn_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, stream, window);
}
#else
#define ATTENTION_NAME "llmc/attention.cuh"
#define BENCH_NAME "ours"
inline void model_attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int NKV, int HD,
                                    int window, cudaStream_t stream) {
    attention_forward(out, lse, qkv, B, T, NH, NKV, HD, stream, window);
}
inline void model_attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                     const float* lse, int B, int T, int NH, int NKV, int HD, int window,
                                     float* scratch, cudaStream_t stream) {
    attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, stream, window, scratch);
}
#endif

// ============================================================================ model
// Activations of one forward pass at (B, T), N = B*T. Per-layer buffers hold L slices; with
// --recompute the three marked "recomputed" hold one slice, rebuilt layer by layer in the backward
// pass (two LayerNorms and a GELU, all memory-bound): (L - 1) * N * 6C fewer values. Measured on an
// H200, d12 at B=64 T=1024: activations 25.3 -> 19.1 GiB, 119.4 -> 124.4 ms per step.
struct Activations {
    floatX* encoded;    // (N, C) token + position embedding: the first residual
    floatX* ln1;        // (L or 1, N, C) recomputed
    float* ln1_mean;    // (L, N)
    float* ln1_rstd;    // (L, N)
    floatX* qkv;        // (L, N, QKV), QKV = (NH + 2*NKV) * HD (3C for multi-head attention)
    floatX* atty;       // (L, N, C) attention output, before the projection
    float* lse;         // (L, B, NH, T) softmax statistics for the attention backward
    floatX* residual2;  // (L, N, C) residual after the attention block
    floatX* ln2;        // (L or 1, N, C) recomputed
    float* ln2_mean;    // (L, N)
    float* ln2_rstd;    // (L, N)
    floatX* fch;        // (L, N, 4C) pre-GELU
    floatX* fch_gelu;   // (L or 1, N, 4C) recomputed
    floatX* residual3;  // (L, N, C) residual after the MLP block = input of the next layer
    floatX* lnf;        // (N, C)
    float* lnf_mean;    // (N)
    float* lnf_rstd;    // (N)
    floatX* logits;     // (N, Vp); the classifier overwrites it with dlogits
    floatX* proj;       // (N, C) output of attproj / fcproj before its residual add
    float* losses;      // (N) per-position cross-entropy
    int* inputs;        // (N)
    int* targets;       // (N)
    // backward scratch, one layer at a time
    floatX* dresidual;  // (N, C) gradient of the residual stream
    floatX* dbuf;       // (N, C) gradient of a LayerNorm output or of atty
    floatX* dqkv;       // (N, QKV)
    floatX* dfch;       // (N, 4C); between layers' MLP backwards it is free and doubles as the attention
                        // backward's fp32 scratch (attention_scratch)
    float* colsum;      // (COLUMN_MAX_CHUNKS, 4C) partial column sums (bias / LayerNorm grads)
    float* norm;        // (GLOBAL_NORM_BLOCKS + 1) partials, then the squared norm
};

// One entry per buffer: where its pointer goes, how many elements, how big each is.
struct BufferSpec {
    void** ptr;
    size_t count, elem;
};

inline std::vector<BufferSpec> activation_specs(Activations& a, const GPT2Config& c, int B, int T, bool recompute) {
    const size_t N = (size_t)B * T, C = c.channels, L = c.num_layers, Vp = c.padded_vocab_size;
    const size_t QKV = gpt2_qkv_channels(c), Lr = recompute ? 1 : L;
    const size_t X = sizeof(floatX), F = sizeof(float);
    return {
        {(void**)&a.encoded, N * C, X},          {(void**)&a.ln1, Lr * N * C, X},
        {(void**)&a.ln1_mean, L * N, F},         {(void**)&a.ln1_rstd, L * N, F},
        {(void**)&a.qkv, L * N * QKV, X},        {(void**)&a.atty, L * N * C, X},
        {(void**)&a.lse, L * B * c.num_heads * T, F},
        {(void**)&a.residual2, L * N * C, X},    {(void**)&a.ln2, Lr * N * C, X},
        {(void**)&a.ln2_mean, L * N, F},         {(void**)&a.ln2_rstd, L * N, F},
        {(void**)&a.fch, L * N * 4 * C, X},      {(void**)&a.fch_gelu, Lr * N * 4 * C, X},
        {(void**)&a.residual3, L * N * C, X},    {(void**)&a.lnf, N * C, X},
        {(void**)&a.lnf_mean, N, F},             {(void**)&a.lnf_rstd, N, F},
        {(void**)&a.logits, N * Vp, X},          {(void**)&a.proj, N * C, X},
        {(void**)&a.losses, N, F},               {(void**)&a.inputs, N, sizeof(int)},
        {(void**)&a.targets, N, sizeof(int)},    {(void**)&a.dresidual, N * C, X},
        {(void**)&a.dbuf, N * C, X},             {(void**)&a.dqkv, N * QKV, X},
        {(void**)&a.dfch, N * 4 * C, X},         {(void**)&a.colsum, (size_t)COLUMN_MAX_CHUNKS * 4 * C, F},
        {(void**)&a.norm, GLOBAL_NORM_BLOCKS + 1, F},
    };
}

constexpr size_t BUFFER_ALIGN = 256;  // every buffer starts on a 256-byte boundary (16 B needed by Packed128)
inline size_t aligned_size(size_t bytes) { return ceil_div(bytes, BUFFER_ALIGN) * BUFFER_ALIGN; }
inline size_t specs_bytes(const std::vector<BufferSpec>& specs) {
    size_t total = 0;
    for (const BufferSpec& s : specs) total += aligned_size(s.count * s.elem);
    return total;
}
// Carves one allocation into the buffers of `specs`.
inline void* specs_allocate(const std::vector<BufferSpec>& specs, const char* what) {
    char* base = nullptr;
    const size_t bytes = specs_bytes(specs);
    cudaError_t err = cudaMalloc(&base, bytes);
    if (err != cudaSuccess) fail("cudaMalloc of %.2f GiB for %s failed: %s", bytes / 1073741824.0, what, cudaGetErrorString(err));
    char* p = base;
    for (const BufferSpec& s : specs) {
        *s.ptr = p;
        p += aligned_size(s.count * s.elem);
    }
    return base;
}

struct GPT2 {
    GPT2Config config{};
    size_t num_params = 0;
    size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    int B = 0, T = 0;         // the shape the activations were sized for
    bool recompute = false;
    bool deterministic = false;  // --deterministic: bit-reproducible attention backward (no dQ atomics)
    // one contiguous buffer each, tensors in the GPT2_PARAM_NAMES order
    floatX* params = nullptr;  // (num_params) what the forward pass reads
    floatX* grads = nullptr;   // (num_params)
    float* master = nullptr;   // (num_params) fp32 master weights; aliases params in the FP32 build
    float* m = nullptr;        // (num_params) AdamW first moment
    float* v = nullptr;        // (num_params) AdamW second moment
    void* param_memory = nullptr;
    Activations acts{};
    void* act_memory = nullptr;
    size_t allocated_bytes = 0;  // everything this model cudaMalloc'ed (the bench's peak_gib)
    EncoderBuckets buckets;
    int* host_io = nullptr;      // pinned (2N): inputs then targets, staged for the upload
    cudaEvent_t io_uploaded = nullptr;
    float* host_losses = nullptr;  // pinned (N)
    DecayRanges decay;
    uint64_t sr_seed = 0;        // stochastic-rounding seed (saved in state.bin)
    int64_t step = 0;            // optimizer steps done

    floatX* param(int i) const { return params + offsets[i]; }
    floatX* grad(int i) const { return grads + offsets[i]; }
};

// Bytes the model needs on the GPU for training at (B, T): params, grads, master, m, v,
// activations, cuBLASLt workspace. Used both to allocate and to refuse early when it cannot fit.
inline size_t gpt2_param_bytes(size_t n) {
    return aligned_size(n * sizeof(floatX)) * 2 + aligned_size(n * sizeof(float)) * (HAS_MASTER ? 3 : 2);
}

inline void gpt2_build(GPT2& model, const GPT2Config& config, int B, int T, bool recompute, const CudaContext& ctx) {
    gpt2_validate_config(config, "model");
    const int C = config.channels, HD = gpt2_head_dim(config);
    if (C % 8 != 0) fail("model: channels %d must be a multiple of 8 (16-byte vector loads)", C);
    if (config.padded_vocab_size % 8 != 0) fail("model: padded vocab %d must be a multiple of 8", config.padded_vocab_size);
    if (HD != 64 && HD != 128) fail("model: head size %d (channels / heads) must be 64 or 128 for the GPU attention", HD);
    if (T > config.max_seq_len) fail("--seq %d exceeds the model's max_seq_len %d", T, config.max_seq_len);
    model.config = config;
    model.B = B;
    model.T = T;
    model.recompute = recompute;
    gpt2_param_sizes(config, model.sizes);
    gpt2_param_offsets(config, model.offsets);
    model.num_params = gpt2_num_params(config);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        if (model.offsets[i] % 8 != 0) fail("model: tensor %s does not start on a 16-byte boundary", GPT2_PARAM_NAMES[i]);
    model.decay = gpt2_decay_ranges(config);

    std::vector<BufferSpec> acts = activation_specs(model.acts, config, B, T, recompute);
    const size_t act_bytes = specs_bytes(acts), param_bytes = gpt2_param_bytes(model.num_params);
    const size_t need = act_bytes + param_bytes;
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    const double GiB = 1073741824.0;
    printf("memory: parameters+grads+optimizer %.2f GiB, activations %.2f GiB (B=%d T=%d recompute=%d), free %.2f GiB\n",
           param_bytes / GiB, act_bytes / GiB, B, T, (int)recompute, free_bytes / GiB);
    if (param_bytes + (256u << 20) > free_bytes)
        fail("model needs %.2f GiB for parameters, gradients and optimizer state alone, but only %.2f GiB are free: "
             "choose a smaller model", param_bytes / GiB, free_bytes / GiB);
    if (need + (256u << 20) > free_bytes)
        fail("model needs %.2f GiB of GPU memory (+0.25 GiB headroom) but only %.2f GiB are free: lower --batch%s",
             need / GiB, free_bytes / GiB, recompute ? "" : " or pass --recompute 1");

    const size_t n = model.num_params;
    std::vector<BufferSpec> params = {{(void**)&model.params, n, sizeof(floatX)},
                                      {(void**)&model.grads, n, sizeof(floatX)},
                                      {(void**)&model.m, n, sizeof(float)},
                                      {(void**)&model.v, n, sizeof(float)}};
    if (HAS_MASTER) params.push_back({(void**)&model.master, n, sizeof(float)});
    model.param_memory = specs_allocate(params, "parameters, gradients and optimizer state");
    if (!HAS_MASTER) model.master = (float*)model.params;
    model.act_memory = specs_allocate(acts, "activations");
    model.allocated_bytes = need + ctx.cublaslt_workspace_size;
    cudaCheck(cudaMemset(model.m, 0, n * sizeof(float)));
    cudaCheck(cudaMemset(model.v, 0, n * sizeof(float)));
    cudaCheck(cudaMemset(model.grads, 0, n * sizeof(floatX)));
    const int N = B * T;
    model.buckets.init(N, config.padded_vocab_size);
    cudaCheck(cudaMallocHost(&model.host_io, 2 * sizeof(int) * N));
    cudaCheck(cudaMallocHost(&model.host_losses, sizeof(float) * N));
    cudaCheck(cudaEventCreateWithFlags(&model.io_uploaded, cudaEventDisableTiming));
}

inline void gpt2_free(GPT2& model) {
    cudaCheck(cudaFree(model.param_memory));
    cudaCheck(cudaFree(model.act_memory));
    model.buckets.destroy();
    cudaCheck(cudaFreeHost(model.host_io));
    cudaCheck(cudaFreeHost(model.host_losses));
    cudaCheck(cudaEventDestroy(model.io_uploaded));
    model = GPT2();
}

// Sets the parameters from fp32 host values: master = values, params = values rounded to nearest.
inline void gpt2_set_params(GPT2& model, const float* host) {
    const size_t n = model.num_params;
    if (HAS_MASTER) {
        cudaCheck(cudaMemcpy(model.master, host, n * sizeof(float), cudaMemcpyHostToDevice));
        std::vector<uint16_t> bf(n);
        for (size_t i = 0; i < n; i++) bf[i] = float_to_bf16(host[i]);
        cudaCheck(cudaMemcpy(model.params, bf.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    } else {
        cudaCheck(cudaMemcpy(model.params, host, n * sizeof(float), cudaMemcpyHostToDevice));
    }
}

// Copies a floatX device buffer to fp32 host values.
inline std::vector<float> device_to_float(const floatX* src, size_t n) {
    std::vector<float> out(n);
    if (HAS_MASTER) {
        std::vector<uint16_t> bf(n);
        cudaCheck(cudaMemcpy(bf.data(), src, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) out[i] = bf16_to_float(bf[i]);
    } else {
        cudaCheck(cudaMemcpy(out.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return out;
}

// ============================================================================ forward
// Uploads a batch (inputs; targets may be null) through the pinned staging buffer. With
// `for_backward`, also buckets the inputs for the deterministic embedding backward.
inline void gpt2_upload_batch(GPT2& model, const int* inputs, const int* targets, int B, int T, bool for_backward,
                              const CudaContext& ctx) {
    const int N = B * T;
    if (B > model.B || T > model.T || N > model.B * model.T)
        fail("batch %dx%d exceeds the %dx%d the model was built for", B, T, model.B, model.T);
    const int V = model.config.vocab_size;
    for (int i = 0; i < N; i++)
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            fail("token id out of range [0, %d) at position %d of the batch", V, i);
    cudaCheck(cudaEventSynchronize(model.io_uploaded));  // the previous upload has left the staging buffer
    memcpy(model.host_io, inputs, sizeof(int) * N);
    if (targets) memcpy(model.host_io + N, targets, sizeof(int) * N);
    cudaCheck(cudaMemcpyAsync(model.acts.inputs, model.host_io, sizeof(int) * N, cudaMemcpyHostToDevice, ctx.stream));
    if (targets)
        cudaCheck(cudaMemcpyAsync(model.acts.targets, model.host_io + N, sizeof(int) * N, cudaMemcpyHostToDevice, ctx.stream));
    cudaCheck(cudaEventRecord(model.io_uploaded, ctx.stream));
    if (for_backward) model.buckets.build(inputs, N, ctx.stream);
}

// The attention backward's fp32 scratch (dQ by atomics): dfch, free at that point. It holds
// N*C + 2*B*NH*Tp floats (Tp = T rounded up to 64) within the model's N*4C floatX for any T > 1;
// nullptr (the deterministic backward) with --deterministic 1 or where it does not fit.
// (B, T): this pass's shape.
inline float* attention_scratch(const GPT2& model, int B, int T) {
    const GPT2Config& c = model.config;
    const size_t need =
        attention_detail::attention_backward_scratch_floats(B, T, c.num_heads, gpt2_head_dim(c)) * sizeof(float);
    const size_t have = (size_t)model.B * model.T * 4 * c.channels * sizeof(floatX);
    return model.deterministic || need > have ? nullptr : reinterpret_cast<float*>(model.acts.dfch);
}

// Per-layer slices of the activations (a recomputed buffer has one slice).
struct LayerActs {
    floatX *res_in, *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3;
    float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
};
inline LayerActs layer_acts(const GPT2& model, int l, int B, int T) {
    const Activations& a = model.acts;
    const size_t N = (size_t)B * T, C = model.config.channels, QKV = gpt2_qkv_channels(model.config);
    const size_t lr = model.recompute ? 0 : l;
    LayerActs s;
    s.res_in = l == 0 ? a.encoded : a.residual3 + (l - 1) * N * C;
    s.ln1 = a.ln1 + lr * N * C;
    s.qkv = a.qkv + l * N * QKV;
    s.atty = a.atty + l * N * C;
    s.residual2 = a.residual2 + l * N * C;
    s.ln2 = a.ln2 + lr * N * C;
    s.fch = a.fch + l * N * 4 * C;
    s.fch_gelu = a.fch_gelu + lr * N * 4 * C;
    s.residual3 = a.residual3 + l * N * C;
    s.ln1_mean = a.ln1_mean + l * N;
    s.ln1_rstd = a.ln1_rstd + l * N;
    s.lse = a.lse + l * N * model.config.num_heads;
    s.ln2_mean = a.ln2_mean + l * N;
    s.ln2_rstd = a.ln2_rstd + l * N;
    return s;
}

// Forward pass on the uploaded inputs, through the logits (N, Vp).
inline void gpt2_forward(GPT2& model, int B, int T, const CudaContext& ctx) {
    const GPT2Config& c = model.config;
    const int N = B * T, C = c.channels, L = c.num_layers, NH = c.num_heads, NKV = c.num_kv_heads;
    const int HD = gpt2_head_dim(c), QKV = gpt2_qkv_channels(c);
    Activations& a = model.acts;
    cudaStream_t s = ctx.stream;
    encoder_forward(a.encoded, a.inputs, model.param(0), model.param(1), B, T, C, s);
    LayerActs first = layer_acts(model, 0, B, T);
    layernorm_forward(first.ln1, first.ln1_mean, first.ln1_rstd, a.encoded, model.param(2), model.param(3), N, C, s);
    for (int l = 0; l < L; l++) {
        LayerActs la = layer_acts(model, l, B, T);
        floatX* qkvw = model.param(4) + (size_t)l * QKV * C;
        floatX* qkvb = model.param(5) + (size_t)l * QKV;
        floatX* attprojw = model.param(6) + (size_t)l * C * C;
        floatX* attprojb = model.param(7) + (size_t)l * C;
        floatX* ln2w = model.param(8) + (size_t)l * C;
        floatX* ln2b = model.param(9) + (size_t)l * C;
        floatX* fcw = model.param(10) + (size_t)l * 4 * C * C;
        floatX* fcb = model.param(11) + (size_t)l * 4 * C;
        floatX* fcprojw = model.param(12) + (size_t)l * C * 4 * C;
        floatX* fcprojb = model.param(13) + (size_t)l * C;
        matmul_forward(la.qkv, nullptr, la.ln1, qkvw, qkvb, N, C, QKV, ctx);
        model_attention_forward(la.atty, la.lse, la.qkv, B, T, NH, NKV, HD, c.window, s);
        matmul_forward(a.proj, nullptr, la.atty, attprojw, attprojb, N, C, C, ctx);
        fused_residual_layernorm_forward(la.residual2, la.ln2, la.ln2_mean, la.ln2_rstd, la.res_in, a.proj, ln2w, ln2b,
                                         N, C, s);
        matmul_forward(la.fch_gelu, la.fch, la.ln2, fcw, fcb, N, C, 4 * C, ctx);
        matmul_forward(a.proj, nullptr, la.fch_gelu, fcprojw, fcprojb, N, 4 * C, C, ctx);
        if (l + 1 < L) {
            LayerActs next = layer_acts(model, l + 1, B, T);
            fused_residual_layernorm_forward(la.residual3, next.ln1, next.ln1_mean, next.ln1_rstd, la.residual2, a.proj,
                                             model.param(2) + (size_t)(l + 1) * C, model.param(3) + (size_t)(l + 1) * C,
                                             N, C, s);
        } else {
            fused_residual_layernorm_forward(la.residual3, a.lnf, a.lnf_mean, a.lnf_rstd, la.residual2, a.proj,
                                             model.param(14), model.param(15), N, C, s);
        }
    }
    matmul_forward(a.logits, nullptr, a.lnf, model.param(0), nullptr, N, C, c.padded_vocab_size, ctx);
}

// Cross-entropy of the logits against the uploaded targets, enqueued: the N per-position losses
// are copied to `host_losses` (pinned) without waiting, so the host can enqueue the backward and
// prepare the next batch while the GPU works; read them after the next synchronization. With
// write_dlogits the logits become dloss * (softmax - onehot) for the backward.
inline void gpt2_classifier(GPT2& model, int B, int T, float dloss, bool write_dlogits, float* host_losses,
                            const CudaContext& ctx) {
    const int N = B * T;
    fused_classifier(model.acts.logits, model.acts.losses, model.acts.targets, dloss, N, model.config.vocab_size,
                     model.config.padded_vocab_size, write_dlogits, ctx.stream);
    cudaCheck(cudaMemcpyAsync(host_losses, model.acts.losses, sizeof(float) * N, cudaMemcpyDeviceToHost, ctx.stream));
}

inline double mean_of(const float* x, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    return sum / n;
}

// The classifier, then a wait: returns the mean loss over the N positions.
inline float gpt2_loss(GPT2& model, int B, int T, float dloss, bool write_dlogits, const CudaContext& ctx) {
    gpt2_classifier(model, B, T, dloss, write_dlogits, model.host_losses, ctx);
    cudaCheck(cudaStreamSynchronize(ctx.stream));
    return (float)mean_of(model.host_losses, (int64_t)B * T);
}

// ============================================================================ backward
// Accumulates (+=) into model.grads from the dlogits left by gpt2_loss(write_dlogits = true).
inline void gpt2_backward(GPT2& model, int B, int T, const CudaContext& ctx) {
    const GPT2Config& c = model.config;
    const int N = B * T, C = c.channels, L = c.num_layers, NH = c.num_heads, NKV = c.num_kv_heads;
    const int HD = gpt2_head_dim(c), QKV = gpt2_qkv_channels(c), Vp = c.padded_vocab_size;
    Activations& a = model.acts;
    cudaStream_t s = ctx.stream;
    cudaCheck(cudaMemsetAsync(a.dresidual, 0, sizeof(floatX) * N * C, s));
    // logits = lnf wte^T: dlnf (in dbuf) = dlogits wte, dwte += dlogits^T lnf
    matmul_backward(a.dbuf, model.grad(0), nullptr, a.colsum, a.logits, a.lnf, model.param(0), nullptr, N, C, Vp, ctx);
    LayerActs last = layer_acts(model, L - 1, B, T);
    layernorm_backward(a.dresidual, model.grad(14), model.grad(15), a.colsum, a.dbuf, last.residual3, model.param(14),
                       a.lnf_mean, a.lnf_rstd, N, C, s);
    for (int l = L - 1; l >= 0; l--) {
        LayerActs la = layer_acts(model, l, B, T);
        const size_t qkvw = (size_t)l * QKV * C, qkvb = (size_t)l * QKV, cc = (size_t)l * C * C, c1 = (size_t)l * C;
        const size_t fcw = (size_t)l * 4 * C * C, fcb = (size_t)l * 4 * C;
        if (model.recompute) {  // rebuild the three single-slice buffers for this layer
            layernorm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, la.res_in, model.param(2) + c1, model.param(3) + c1, N,
                              C, s);
            layernorm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.residual2, model.param(8) + c1, model.param(9) + c1,
                              N, C, s);
            gelu_forward(la.fch_gelu, la.fch, (int64_t)N * 4 * C, s);
        }
        // dresidual holds d(residual3). MLP: fcproj, then (dGELU fused) fc, then ln2.
        matmul_backward(a.dfch, model.grad(12) + fcw, model.grad(13) + c1, a.colsum, a.dresidual, la.fch_gelu,
                        model.param(12) + fcw, la.fch, N, 4 * C, C, ctx);
        matmul_backward(a.dbuf, model.grad(10) + fcw, model.grad(11) + fcb, a.colsum, a.dfch, la.ln2,
                        model.param(10) + fcw, nullptr, N, C, 4 * C, ctx);
        layernorm_backward(a.dresidual, model.grad(8) + c1, model.grad(9) + c1, a.colsum, a.dbuf, la.residual2,
                           model.param(8) + c1, la.ln2_mean, la.ln2_rstd, N, C, s);
        // dresidual now holds d(residual2). Attention: attproj, attention, qkv, then ln1.
        matmul_backward(a.dbuf, model.grad(6) + cc, model.grad(7) + c1, a.colsum, a.dresidual, la.atty,
                        model.param(6) + cc, nullptr, N, C, C, ctx);
        model_attention_backward(a.dqkv, a.dbuf, la.qkv, la.atty, la.lse, B, T, NH, NKV, HD, c.window,
                                 attention_scratch(model, B, T), s);
        matmul_backward(a.dbuf, model.grad(4) + qkvw, model.grad(5) + qkvb, a.colsum, a.dqkv, la.ln1,
                        model.param(4) + qkvw, nullptr, N, C, QKV, ctx);
        layernorm_backward(a.dresidual, model.grad(2) + c1, model.grad(3) + c1, a.colsum, a.dbuf, la.res_in,
                           model.param(2) + c1, la.ln1_mean, la.ln1_rstd, N, C, s);
    }
    encoder_backward(model.grad(0), model.grad(1), a.dresidual, model.buckets, B, T, C, s);
}

// ============================================================================ update
// Global norm, clipping and one AdamW step (step numbering continues from model.step). Returns
// the gradient norm before clipping.
inline float gpt2_update(GPT2& model, const OptimizerSettings& o, const CudaContext& ctx) {
    float* norm_out = model.acts.norm + GLOBAL_NORM_BLOCKS;
    global_norm_squared(norm_out, model.acts.norm, model.grads, (int64_t)model.num_params, ctx.stream);
    float norm_sq = 0.0f;
    cudaCheck(cudaMemcpyAsync(&norm_sq, norm_out, sizeof(float), cudaMemcpyDeviceToHost, ctx.stream));
    cudaCheck(cudaStreamSynchronize(ctx.stream));
    const float norm = std::sqrt(norm_sq);
    model.step++;
    const uint64_t seed = model.sr_seed ^ ((uint64_t)model.step * 0xD1B54A32D192ED03ull);  // fresh rounding per step
    const AdamWArgs args = adamw_args(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay,
                                      cpu::grad_clip_scale(norm, o.grad_clip), model.step, seed);
    adamw_update(model.params, model.master, model.grads, model.m, model.v, (int64_t)model.num_params, args,
                 model.decay, ctx.stream);
    return norm;
}

inline void gpt2_zero_grads(GPT2& model, const CudaContext& ctx) {
    cudaCheck(cudaMemsetAsync(model.grads, 0, model.num_params * sizeof(floatX), ctx.stream));
}

// ============================================================================ checkpoints
// DIR/step_NNNNNNNN/{model.bin, state.bin, DONE}: the model in floatX (bf16 build: exactly the
// bf16 parameters the forward pass reads), the state with m, v and, in the bf16 build, the fp32
// master weights; DONE is written last, so a directory without it is ignored on resume.
inline void gpt2_save_checkpoint(const GPT2& model, const std::string& out_dir, const int64_t loader_state[16],
                                 uint64_t rng_state) {
    const std::string dir = checkpoint_begin(out_dir, model.step);
    const size_t n = model.num_params;
    cudaCheck(cudaDeviceSynchronize());
    if (HAS_MASTER) {
        std::vector<uint16_t> bf(n);
        cudaCheck(cudaMemcpy(bf.data(), model.params, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
        model_write_bf16((dir + "/model.bin").c_str(), model.config, bf.data());
    } else {
        std::vector<float> p(n);
        cudaCheck(cudaMemcpy(p.data(), model.params, n * sizeof(float), cudaMemcpyDeviceToHost));
        model_write_fp32((dir + "/model.bin").c_str(), model.config, p.data());
    }
    std::vector<float> m(n), v(n), master(HAS_MASTER ? n : 0);
    cudaCheck(cudaMemcpy(m.data(), model.m, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(v.data(), model.v, n * sizeof(float), cudaMemcpyDeviceToHost));
    if (HAS_MASTER) cudaCheck(cudaMemcpy(master.data(), model.master, n * sizeof(float), cudaMemcpyDeviceToHost));
    TrainState st;
    st.step = model.step;
    st.num_params = (int64_t)n;
    st.rng_state = rng_state;
    st.sr_seed = model.sr_seed;
    for (int i = 0; i < 16; i++) st.loader[i] = loader_state[i];
    state_write((dir + "/state.bin").c_str(), st, m.data(), v.data(), HAS_MASTER ? master.data() : nullptr);
    checkpoint_finish(dir);
}

// Reads the model of `dir` into an already built model of the same config, and its training
// state; returns the state (step, loader position, RNG).
inline TrainState gpt2_load_checkpoint(GPT2& model, const std::string& dir) {
    const std::string model_path = dir + "/model.bin", state_path = dir + "/state.bin";
    ModelFileInfo info = model_read_info(model_path.c_str());
    if (memcmp(&info.config, &model.config, sizeof(GPT2Config)) != 0)
        fail("%s: the checkpoint's model shape differs from this run's", model_path.c_str());
    const size_t n = model.num_params;
    std::vector<float> host(n), m(n), v(n), master(n);
    model_read_fp32(model_path.c_str(), host.data());
    TrainState st = state_read(state_path.c_str(), (int64_t)n, m.data(), v.data(), master.data());
    gpt2_set_params(model, host.data());  // bf16 file: the exact bf16 parameters; master = those values
    if (HAS_MASTER && st.has_master)
        cudaCheck(cudaMemcpy(model.master, master.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model.m, m.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model.v, v.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    model.step = st.step;
    model.sr_seed = st.sr_seed;
    return st;
}

// ============================================================================ sampling
// Generates `gen_tokens` tokens after an end-of-text token: each step runs the forward pass on
// one row of T tokens (causal, so the padding after the prefix does not matter) and samples from
// the softmax of the last real position's logits at `temperature`, on the host.
inline std::vector<int> gpt2_sample(GPT2& model, int eot, int gen_tokens, float temperature, Rng& rng,
                                    const CudaContext& ctx) {
    const int T = model.T, V = model.config.vocab_size, Vp = model.config.padded_vocab_size;
    std::vector<int> tokens(T, eot);
    std::vector<int> out;
    for (int t = 1; t < T && (int)out.size() < gen_tokens; t++) {
        gpt2_upload_batch(model, tokens.data(), nullptr, 1, T, false, ctx);
        gpt2_forward(model, 1, T, ctx);
        std::vector<float> logits = device_to_float(model.acts.logits + (size_t)(t - 1) * Vp, V);
        const int next = sample_token(logits.data(), V, temperature, rng);
        tokens[t] = next;
        out.push_back(next);
    }
    return out;
}

// ============================================================================ training loop
struct GpuFlags {
    int recompute = 0;         // --recompute 0|1
    int deterministic = 0;     // --deterministic 0|1
    int random_data = 0;       // --random-data 0|1
    float peak_tflops = 0.0f;  // --peak-tflops (0: from the device name)
};

// bf16 dense peak of the device for MFU, by name; 0 if unknown.
inline float device_peak_tflops(const cudaDeviceProp& p) {
    const std::string name = p.name;
    if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989.0f;
    return 0.0f;
}

// FLOPs of one token through forward + backward: 6 per parameter plus attention's 6*L*C*T
// (causal: half the square), the convention of docs/H200.md.
inline double flops_per_token(const GPT2Config& c, int T) {
    return 6.0 * (double)gpt2_num_params(c) + 6.0 * c.num_layers * c.channels * (double)T;
}

#ifndef TESTING
static void format_eta(char* buf, size_t size, double seconds) {
    const long s = (long)seconds;
    snprintf(buf, size, "%ldh%02ldm%02lds", s / 3600, (s / 60) % 60, s % 60);
}

int main(int argc, char** argv) {
    TrainConfig cfg;
    GpuFlags gpu;
    FlagParser parser("train_gpt2cu", "Trains GPT-2 on one GPU (" PRECISION_NAME " build). Example:\n"
                      "  build/train_gpt2cu --train \"data/tinyshakespeare/*_train.bin\" --val \"data/tinyshakespeare/*_val.bin\" --init d12");
    add_train_flags(parser, cfg);
    parser.add_int("--recompute", &gpu.recompute, {0, 1}, "1 = keep only what the backward cannot cheaply rebuild "
                   "(LayerNorm and GELU outputs are rebuilt in the backward): less memory, a little slower");
    parser.add_int("--deterministic", &gpu.deterministic, {0, 1}, "1 = bit-reproducible runs: the attention backward "
                   "sums dQ in a fixed order (slower) instead of by fp32 atomics");
    parser.add_int("--random-data", &gpu.random_data, {0, 1}, "1 = train on random tokens, no files (benchmarks)");
    parser.add_float("--peak-tflops", &gpu.peak_tflops, {0, 1e6}, "bf16 dense peak for MFU (0 = by device name: H100/H200 989)");
    parser.parse(argc, argv);
    if (gpu.random_data && cfg.train_pattern.empty()) cfg.train_pattern = "(random)";  // no files needed
    validate_train_config(cfg);

    // the model: a checkpoint to resume, a model file, or a fresh init from a descriptor (before the
    // device starts, so a model this trainer cannot run fails at once)
    std::string resume_dir = cfg.resume_dir.empty() ? "" : checkpoint_find(cfg.resume_dir);
    std::string init_path = !resume_dir.empty() ? resume_dir + "/model.bin" : cfg.init;
    const bool from_file = !resume_dir.empty() || file_exists(init_path.c_str());
    GPT2Config config = from_file ? model_read_info(init_path.c_str()).config : gpt2_config_from_descriptor(cfg.init.c_str());
    const std::string source = from_file ? init_path : "--init " + cfg.init;
    apply_attention_flags(config, cfg, !from_file, init_path.c_str());

    CudaContext ctx;
    ctx.init(0);
    printf("device: %s, %d SMs, %.1f GiB; precision %s, attention %s\n", ctx.props.name, ctx.props.multiProcessorCount,
           ctx.props.totalGlobalMem / 1073741824.0, PRECISION_NAME, ATTENTION_NAME);
    gpt2_print_config(config);
    GPT2 model;
    gpt2_build(model, config, cfg.B, cfg.T, gpu.recompute != 0, ctx);
    model.deterministic = gpu.deterministic != 0;
    Rng seeds(cfg.seed ^ 0x5EEDull);
    model.sr_seed = seeds.next_u64();
    Rng sample_rng(seeds.next_u64());
    {
        std::vector<float> host(model.num_params);
        if (from_file) model_read_fp32(init_path.c_str(), host.data());
        else gpt2_init_params(host.data(), config, cfg.seed);
        gpt2_set_params(model, host.data());
    }

    // data
    const int B = cfg.B, T = cfg.T, N = B * T, V = config.vocab_size;
    DataLoader* train_loader = nullptr;
    DataLoader* val_loader = nullptr;
    if (!gpu.random_data) {
        train_loader = new DataLoader(cfg.train_pattern.c_str(), B, T, 0, 1, V, cfg.seed, true);
        if (!cfg.val_pattern.empty()) val_loader = new DataLoader(cfg.val_pattern.c_str(), B, T, 0, 1, V, cfg.seed, false);
    }
    Rng data_rng(cfg.seed ^ 0xDA7Aull);
    std::vector<int> rand_inputs(N), rand_targets(N);
    Tokenizer* tokenizer = cfg.tokenizer_path.empty() ? nullptr : new Tokenizer(cfg.tokenizer_path.c_str());
    const int eot = tokenizer && tokenizer->eot_token() >= 0 ? tokenizer->eot_token() : (V > 50256 ? 50256 : 0);

    if (!resume_dir.empty()) {
        TrainState st = gpt2_load_checkpoint(model, resume_dir);
        if (train_loader) train_loader->load_state(st.loader);
        else data_rng.state = (uint64_t)st.loader[0];
        sample_rng.state = st.rng_state;
        printf("resumed from %s at step %lld\n", resume_dir.c_str(), (long long)st.step);
    }
    const std::string out_dir = !cfg.out_dir.empty() ? cfg.out_dir : cfg.resume_dir;

    int total_steps = cfg.steps;
    if (total_steps < 0) {
        if (!train_loader) fail("--steps: needed with --random-data (there is no epoch to count)");
        total_steps = (int)std::max<int64_t>(1, train_loader->num_windows() / cfg.grad_accum);
    }
    cfg.schedule.total_steps = total_steps;
    const float peak = gpu.peak_tflops > 0 ? gpu.peak_tflops : device_peak_tflops(ctx.props);
    const double tokens_per_step = (double)cfg.total_batch, flops_step = flops_per_token(config, T) * tokens_per_step;
    printf("batch: B=%d T=%d, %d micro-steps, %lld tokens per step; %d steps; peak %.0f TFLOP/s\n", B, T, cfg.grad_accum,
           (long long)cfg.total_batch, total_steps, peak);
    FILE* log = cfg.log_path.empty() ? nullptr : fopen_or_fail(cfg.log_path.c_str(), "a");
    const OptimizerSettings opt_base{0.0f, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.grad_clip};
    const float dloss = 1.0f / ((float)N * cfg.grad_accum);

    auto validate = [&](int64_t step) {
        if (!val_loader) return;
        val_loader->reset();
        double sum = 0.0;
        for (int i = 0; i < cfg.val_steps; i++) {
            val_loader->next_batch();
            gpt2_upload_batch(model, val_loader->inputs(), val_loader->targets(), B, T, false, ctx);
            gpt2_forward(model, B, T, ctx);
            sum += gpt2_loss(model, B, T, dloss, false, ctx);
        }
        const float val = (float)(sum / cfg.val_steps);
        printf("step %lld val_loss %.6f\n", (long long)step, val);
        if (log) { fprintf(log, "step %lld val_loss %.6f\n", (long long)step, val); fflush(log); }
    };
    auto sample = [&](int64_t step) {
        std::vector<int> toks = gpt2_sample(model, eot, cfg.gen_tokens, cfg.temperature, sample_rng, ctx);
        printf("step %lld sample: ", (long long)step);
        for (int t : toks) {
            if (tokenizer) tokenizer->print_token(t);
            else printf("%d ", t);
        }
        printf("\n");
    };
    // The host fetches batch k+1 while the GPU runs batch k, and the losses are read once per step,
    // so the GPU only waits at step boundaries (the gradient norm). A checkpoint stores the data
    // position from before the batch fetched ahead, so a resumed run fetches that batch again.
    std::vector<int> next_inputs(N), next_targets(N);
    int64_t next_position[16] = {};  // data position from which next_inputs/next_targets came
    auto fetch_batch = [&]() {
        if (train_loader) {
            train_loader->save_state(next_position);
            train_loader->next_batch();
            memcpy(next_inputs.data(), train_loader->inputs(), sizeof(int) * N);
            memcpy(next_targets.data(), train_loader->targets(), sizeof(int) * N);
        } else {
            next_position[0] = (int64_t)data_rng.state;
            for (int i = 0; i < N; i++) {
                next_inputs[i] = (int)data_rng.below(V);
                next_targets[i] = (int)data_rng.below(V);
            }
        }
    };
    auto save = [&]() { gpt2_save_checkpoint(model, out_dir, next_position, sample_rng.state); };
    float* step_losses = nullptr;  // pinned (grad_accum, N)
    cudaCheck(cudaMallocHost(&step_losses, sizeof(float) * N * cfg.grad_accum));
    fetch_batch();

    std::vector<double> step_ms;
    double total_ms = 0.0;
    for (int64_t step = model.step; step < total_steps; step++) {
        if (cfg.val_every > 0 && step % cfg.val_every == 0) validate(step);
        if (cfg.sample_every > 0 && step > 0 && step % cfg.sample_every == 0) sample(step);
        auto t0 = std::chrono::steady_clock::now();
        gpt2_zero_grads(model, ctx);
        for (int micro = 0; micro < cfg.grad_accum; micro++) {
            gpt2_upload_batch(model, next_inputs.data(), next_targets.data(), B, T, true, ctx);
            gpt2_forward(model, B, T, ctx);
            gpt2_classifier(model, B, T, dloss, true, step_losses + (size_t)micro * N, ctx);
            gpt2_backward(model, B, T, ctx);
            fetch_batch();
        }
        OptimizerSettings opt = opt_base;
        opt.lr = lr_at_step(cfg.schedule, (int)step);
        const float norm = gpt2_update(model, opt, ctx);
        cudaCheck(cudaStreamSynchronize(ctx.stream));
        const double loss = mean_of(step_losses, (int64_t)N * cfg.grad_accum);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        step_ms.push_back(ms);
        total_ms += ms;
        const double tok_s = tokens_per_step / (ms / 1000.0);
        const double mfu = peak > 0 ? 100.0 * flops_step / (ms / 1000.0) / (peak * 1e12) : 0.0;
        char eta[32];
        format_eta(eta, sizeof eta, (total_ms / step_ms.size()) * (total_steps - step - 1) / 1000.0);
        printf("step %5lld/%d | loss %.6f | norm %.4f | lr %.3e | %.2f ms | %.0f tok/s | MFU %.1f%% | ETA %s\n",
               (long long)(step + 1), total_steps, loss, norm, opt.lr, ms, tok_s, mfu, eta);
        if (log) {
            fprintf(log, "step %lld train_loss %.6f lr %.6e grad_norm %.6f ms %.3f tok_s %.1f\n", (long long)(step + 1),
                    loss, opt.lr, norm, ms, tok_s);
            fflush(log);
        }
        const bool last = step + 1 == total_steps;
        if (!out_dir.empty() && (last || (cfg.ckpt_every > 0 && (step + 1) % cfg.ckpt_every == 0))) save();
    }
    if (cfg.val_every > 0) validate(total_steps);
    if (cfg.sample_every > 0) sample(total_steps);
    if (!step_ms.empty()) {
        // median after warm-up: the first steps pay cuBLAS heuristics and allocator first touches
        const size_t warm = std::min<size_t>(step_ms.size() / 2, 3);
        std::vector<double> timed(step_ms.begin() + warm, step_ms.end());
        std::sort(timed.begin(), timed.end());
        const double median = timed[timed.size() / 2];
        printf("BENCH name=" BENCH_NAME " ms=%.2f tok_s=%.0f peak_gib=%.2f\n", median, tokens_per_step / (median / 1000.0),
               model.allocated_bytes / 1073741824.0);
    }
    if (log) fclose(log);
    cudaCheck(cudaFreeHost(step_losses));
    delete train_loader;
    delete val_loader;
    delete tokenizer;
    gpt2_free(model);
    ctx.destroy();
    return 0;
}
#endif
