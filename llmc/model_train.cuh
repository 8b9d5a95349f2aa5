// llmc/model_train.cuh: the training layer of the GPU model, GPT-2 or Llama-style (the knobs of
// ModelConfig: LayerNorm | RMSNorm, learned positions | RoPE, GELU | SwiGLU, biases, tied | untied
// head), on the forward layer llmc/model.cuh, in mixed precision: floatX (bf16) parameters,
// activations and gradients, fp32 master weights and AdamW moments, stochastic rounding when the
// updated parameters are written back to bf16. Built with PRECISION_FP32 it runs in plain fp32
// (floatX = float, no master copy). Included by train_gpt2.cu, test_gpt2.cu and
// dev/cuda/profile_gpt2.cu; generate.cu includes only the forward layer.
// Same sections, in the same order and with the same function names, as the CPU model in
// llmc/cpu/model.h: model (parameters, activations, memory plan), forward, backward, update,
// checkpoints. Sampling goes through the KV cache (llmc/model_infer.cuh).
//
// One step: model_zero_grads, then per micro-batch model_upload_batch, model_forward (logits),
// model_loss or model_classifier (cross-entropy, dlogits in place), model_backward (+= into the
// gradients), then model_update. Everything is enqueued on ctx.stream; model_loss and model_update
// wait for it. llmc/model_graph.cuh captures the whole step as one CUDA graph.
#pragma once
#include <algorithm>
#include <cinttypes>
#include <functional>
#include <string>
#include <vector>
#include "llmc/model.cuh"
#include "llmc/adamw.cuh"
#include "llmc/attention.cuh"
#include "llmc/encoder.cuh"
#include "llmc/fused_classifier.cuh"
#include "llmc/gelu.cuh"
#include "llmc/model_fp8.cuh"
#include "llmc/global_norm.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/matmul.cuh"
#include "llmc/muon.cuh"
#include "llmc/rmsnorm.cuh"
#include "llmc/rope.cuh"
#include "llmc/swiglu.cuh"
#include "llmc/checkpoint.h"
#include "llmc/formats.h"
#include "llmc/model_config.h"

// ============================================================================ model
// Activations of one forward pass at (B, T), N = B*T. Per-layer buffers hold L slices; the three
// marked "recomputed" hold one, (L - 1) * N * (2C + H) fewer values: with --recompute, rebuilt layer
// by layer in the backward (two norms and the MLP activation, memory-bound; H200, d12 B=64 T=1024:
// 25.3 -> 19.1 GiB, 119.4 -> 124.4 ms a step), and with --fp8 1 where fp8_keeps_no_bf16_inputs (its
// backward reads the X^T copies the forward kept, never these; 6.2 GiB at d12 B=64 T=1024).
// H is the MLP's hidden width (4C for GPT-2), FC the fc rows (H, or 2H for SwiGLU's
// [gate | up]). The norm's mean is LayerNorm's only (RMSNorm saves rstd alone).
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
    floatX* fch;        // (L, N, FC) fc output: pre-GELU, or SwiGLU's [gate | up]
    floatX* fch_gelu;   // (L or 1, N, H) recomputed: the activation, GELU(fch) or SwiGLU(fch)
    floatX* residual3;  // (L, N, C) residual after the MLP block = input of the next layer
    floatX* lnf;        // (N, C)
    float* lnf_mean;    // (N)
    float* lnf_rstd;    // (N)
    floatX* logits;     // (N, Vp); the classifier overwrites it with dlogits
    floatX* proj;       // (N, C) output of attproj / fcproj before its residual add
    float* losses;      // (N) per-position cross-entropy
    int* inputs;        // (N)
    int* doc_start;     // (N) with document masking (Model::doc_token >= 0): doc_starts_forward's, from inputs
    int* targets;       // (N)
    float* dloss_rows;  // (N) Model::masked_loss only: row r's loss gradient (fused_classifier's row_dloss)
    // backward scratch, one layer at a time
    floatX* dresidual;  // (N, C) gradient of the residual stream
    floatX* dbuf;       // (N, C) gradient of a LayerNorm output or of atty
    floatX* dqkv;       // (N, QKV)
    floatX* dfch;       // (N, FC); between layers' MLP backwards it is free and doubles as the attention
                        // backward's fp32 scratch (attention_scratch)
    floatX* dfch_act;   // (N, H) SwiGLU only: the gradient of the activation (GELU's is fused into the matmul)
    float* colsum;      // (COLUMN_MAX_CHUNKS, max(C, QKV, FC)) partial column sums (bias / norm weight grads)
    float* norm;        // (GLOBAL_NORM_BLOCKS + 1) partials, then the squared norm
    AdamWArgs* adamw;   // (1) the step's AdamW scalars, read by adamw_fused (llmc/adamw.cuh)
    float* rope_cos;    // (maxT, HD/2) RoPE only: cpu::rope_tables_for's values, uploaded once
    float* rope_sin;    // (maxT, HD/2)
};


// one_slice: ln1, ln2 and fch_gelu sized for one layer (Model::one_slice).
// masked_loss: dloss_rows sized N (else none).
inline std::vector<BufferSpec> activation_specs(Activations& a, const ModelConfig& c, int B, int T, bool one_slice,
                                                bool masked_loss) {
    const size_t N = (size_t)B * T, C = c.channels, L = c.num_layers, Vp = c.padded_vocab_size;
    const size_t QKV = model_qkv_channels(c), Lr = one_slice ? 1 : L;
    const size_t H = model_mlp_hidden(c), FC = model_fc_channels(c), swiglu = c.mlp == MLP_SWIGLU;
    const size_t cols = std::max(std::max(C, QKV), FC);
    const size_t rope = c.position == POS_ROPE ? (size_t)c.max_seq_len * model_head_dim(c) / 2 : 0;
    const size_t X = sizeof(floatX), F = sizeof(float);
    return {
        {(void**)&a.encoded, N * C, X},          {(void**)&a.ln1, Lr * N * C, X},
        {(void**)&a.ln1_mean, L * N, F},         {(void**)&a.ln1_rstd, L * N, F},
        {(void**)&a.qkv, L * N * QKV, X},        {(void**)&a.atty, L * N * C, X},
        {(void**)&a.lse, L * B * c.num_heads * T, F},
        {(void**)&a.residual2, L * N * C, X},    {(void**)&a.ln2, Lr * N * C, X},
        {(void**)&a.ln2_mean, L * N, F},         {(void**)&a.ln2_rstd, L * N, F},
        {(void**)&a.fch, L * N * FC, X},         {(void**)&a.fch_gelu, Lr * N * H, X},
        {(void**)&a.residual3, L * N * C, X},    {(void**)&a.lnf, N * C, X},
        {(void**)&a.lnf_mean, N, F},             {(void**)&a.lnf_rstd, N, F},
        {(void**)&a.logits, N * Vp, X},          {(void**)&a.proj, N * C, X},
        {(void**)&a.losses, N, F},               {(void**)&a.inputs, N, sizeof(int)},
        {(void**)&a.targets, N, sizeof(int)},    {(void**)&a.doc_start, N, sizeof(int)},
        {(void**)&a.dloss_rows, masked_loss * N, F},
        {(void**)&a.dresidual, N * C, X},
        {(void**)&a.dbuf, N * C, X},             {(void**)&a.dqkv, N * QKV, X},
        {(void**)&a.dfch, N * FC, X},            {(void**)&a.dfch_act, swiglu * N * H, X},
        {(void**)&a.colsum, (size_t)COLUMN_MAX_CHUNKS * cols, F},
        {(void**)&a.norm, GLOBAL_NORM_BLOCKS + 1, F},
        {(void**)&a.adamw, 1, sizeof(AdamWArgs)},
        {(void**)&a.rope_cos, rope, F},          {(void**)&a.rope_sin, rope, F},
    };
}


struct Model {
    ModelConfig config{};
    size_t num_params = 0;
    int B = 0, T = 0;         // the shape the activations were sized for
    bool recompute = false;
    bool one_slice = false;   // ln1, ln2 and the MLP activation hold one slice: --recompute, or fp8_keeps_no_bf16_inputs
    bool deterministic = false;  // --deterministic: bit-reproducible attention backward (no dQ atomics)
    bool stochastic_rounding = true;  // --stochastic-rounding: the bf16 parameters written back by AdamW
    bool masked_loss = false;     // set before model_build: each training row brings its loss gradient (a loss mask)
    // --doc-mask 1 (docs/training.md, "Document masking"): doc_token >= 0 starts a document; attention stays
    // inside each document and, with doc_restart, positions count from its start. -1: one sequence a row.
    int doc_token = -1;
    bool doc_restart = false;
    int optimizer = OPTIMIZER_ADAMW;  // set before model_build; OPTIMIZER_MUON: `muon` (llmc/muon.cuh), whole buffers only
    Muon muon;                    // --optimizer muon: its groups, GEMM plans and scratch (empty otherwise)
    ModelFp8 fp8;                 // --fp8: the FP8 linear layers (llmc/model_fp8.cuh); fp8.set before model_build
    void* fp8_allocation = nullptr;  // its buffers' one cudaMalloc
    // one contiguous buffer each, in the layout of MODEL_PARAMETER_TABLE (llmc/model_config.h)
    floatX* params_memory = nullptr;  // (num_params) what the forward pass reads
    floatX* grads_memory = nullptr;   // (grad_end - grad_begin): all num_params, or a ZeRO-2 shard's
    float* master_memory = nullptr;   // (num_params) fp32 master weights; aliases params_memory in the FP32 build
    float* m_memory = nullptr;        // (num_params) AdamW first moment; Muon's momentum on its tensors
    float* v_memory = nullptr;        // (num_params) AdamW second moment
    ModelTensors<floatX> params{}, grads{};  // named views of params_memory and grads_memory (when whole)
    void* param_allocation = nullptr;  // the one cudaMalloc the parameter-sized buffers come from
    Activations acts{};
    void* act_allocation = nullptr;    // the one cudaMalloc the activations come from
    size_t allocated_bytes = 0;  // everything this model cudaMalloc'ed (the bench's peak_gib)
    EncoderBuckets buckets;
    int* host_io = nullptr;      // pinned (2N, masked_loss: 3N): inputs, targets, dloss_rows, staged for the upload
    cudaEvent_t io_uploaded = nullptr;
    float* host_losses = nullptr;  // pinned (N)
    AdamWArgs* host_adamw = nullptr;  // pinned (1): the step's AdamW scalars, staged for the copy to acts.adamw
    float* host_norm_sq = nullptr;    // pinned (1): the last update's squared gradient norm
    DecayRanges decay;
    uint64_t sr_seed = 0;        // stochastic-rounding seed (saved in state.bin)
    int64_t step = 0;            // optimizer steps done
    // data parallel (llmc/model_dist.cuh), set before model_build: m, v and master hold parameters
    // [opt_begin, opt_end) (a ZeRO shard; -1 = all), grads_memory [grad_begin, grad_end) (ZeRO-2: the
    // shard; -1 = all). Hooks the passes call on the host as they enqueue: before layer l (-1: the
    // embedding) reads its parameters; grads_of(l), where layer l's gradients go (-1: outside the
    // layers; unset: grads); after layer l's gradient kernels (-1: the embedding's, the backward's end)
    int64_t opt_begin = 0, opt_end = -1, grad_begin = 0, grad_end = -1;
    std::function<void(int)> before_layer_forward, after_layer_backward;
    std::function<ModelTensors<floatX>(int)> grads_of;
};

// --fp8 1 for a model of config c trained at N rows: fails in the FP32 build and on shapes the FP8
// casts cannot take. Touches no device (the trainer checks it before starting one).
inline void model_check_fp8_support(ModelFp8& f, const ModelConfig& c, int N) {
    if (!HAS_MASTER) fail("--fp8 1: the FP8 matmuls write bf16; this is the " PRECISION_NAME " build (use build/train_gpt2cu)");
    fp8_plan(f, c, N);
}

// The FP8 buffers of --fp8 (llmc/model_fp8.cuh) at N rows: none without it.
inline std::vector<BufferSpec> fp8_specs(Model& model, const ModelConfig& c, int N) {
    ModelFp8& f = model.fp8;
    if (!f.set.enabled) return {};
    model_check_fp8_support(f, c, N);
    const size_t L = f.L, rows = N, rw = f.set.scaling == Fp8Scaling::ROWWISE, F = sizeof(float);
    return {{(void**)&f.weights, L * f.w_layer_bytes, 1},  {(void**)&f.xt, L * f.xt_layer_bytes, 1},
            {(void**)&f.x, rows * f.max_cin, 1},           {(void**)&f.dy, rows * f.max_oc, 1},
            {(void**)&f.dyt, f.set.wgrad_bf16 ? 0 : rows * f.max_oc, 1},
            {(void**)&f.metas, (size_t)FP8_ROLES * L * FP8_LINEARS, sizeof(Fp8Meta)},
            {(void**)&f.rs, rw * L * f.rs_layer_floats, F},    {(void**)&f.rs_x, rw * rows, F},
            {(void**)&f.rs_dy, rw * rows, F},                  {(void**)&f.rs_dyt, rw * f.max_oc, F},
            {(void**)&f.rs_scratch, rw * 2 * std::max(f.max_cin, f.max_oc), F},
            {(void**)&f.head_w, f.set.head ? 2 * (size_t)f.Vp * f.C : 0, 1},
            {(void**)&f.head_xt, f.set.head ? rows * f.C : 0, 1},
            {(void**)&f.head_metas, f.set.head ? (size_t)FP8_ROLES : 0, sizeof(Fp8Meta)}};
}


inline void model_build(Model& model, const ModelConfig& config, int B, int T, bool recompute, const CudaContext& ctx) {
    model_validate_config(config, "model");
    model_check_gpu_support(config, "model");
    if (T > config.max_seq_len) fail("--seq %d exceeds the model's max_seq_len %d", T, config.max_seq_len);
    model.config = config;
    model.B = B;
    model.T = T;
    model.recompute = recompute;
    model.one_slice = recompute || fp8_keeps_no_bf16_inputs(model.fp8.set);
    model.num_params = model_num_params(config);
    size_t offsets[NUM_PARAM_TENSORS];
    model_param_offsets(config, offsets);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        if (offsets[i] % 8 != 0) fail("model: tensor %s does not start on a 16-byte boundary", MODEL_PARAM_NAMES[i]);
    model.decay = model_decay_ranges(config);
    if (model.opt_end < 0) model.opt_begin = 0, model.opt_end = (int64_t)model.num_params;
    if (model.grad_end < 0) model.grad_begin = 0, model.grad_end = (int64_t)model.num_params;
    const size_t no = (size_t)(model.opt_end - model.opt_begin);  // elements of optimizer state
    const size_t ng = (size_t)(model.grad_end - model.grad_begin);  // elements of gradients

    // the bytes needed, to allocate and to refuse early what cannot fit
    const size_t n = model.num_params;
    std::vector<BufferSpec> params = {{(void**)&model.params_memory, n, sizeof(floatX)},
                                      {(void**)&model.grads_memory, ng, sizeof(floatX)},
                                      {(void**)&model.m_memory, no, sizeof(float)},
                                      {(void**)&model.v_memory, no, sizeof(float)}};
    if (HAS_MASTER) params.push_back({(void**)&model.master_memory, no, sizeof(float)});
    std::vector<BufferSpec> acts = activation_specs(model.acts, config, B, T, model.one_slice, model.masked_loss);
    std::vector<BufferSpec> fp8 = fp8_specs(model, config, B * T);
    const size_t act_bytes = specs_bytes(acts), param_bytes = specs_bytes(params);
    const size_t fp8_bytes = fp8.empty() ? 0 : specs_bytes(fp8);
    const size_t need = act_bytes + param_bytes + fp8_bytes;
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    const double GiB = 1073741824.0;
    printf("memory: parameters+grads+optimizer %.2f GiB, activations %.2f GiB (B=%d T=%d recompute=%d%s), free %.2f GiB\n",
           param_bytes / GiB, act_bytes / GiB, B, T, (int)recompute,
           model.one_slice && !recompute ? "; --fp8: one slice of the norm outputs and MLP activation" : "",
           free_bytes / GiB);
    if (fp8_bytes > 0) {
        const ModelFp8& f = model.fp8;
        const size_t head = f.set.head ? 2 * (size_t)f.Vp * f.C + (size_t)B * T * f.C : 0;  // W, W^T, X^T
        printf("memory: fp8 %.2f GiB (kept X^T %.2f, weight copies %.2f, scratch and scales %.2f", fp8_bytes / GiB,
               f.L * f.xt_layer_bytes / GiB, f.L * f.w_layer_bytes / GiB,
               (fp8_bytes - f.L * (f.xt_layer_bytes + f.w_layer_bytes) - head) / GiB);
        if (f.set.head) printf("; head W, W^T and X^T %.2f", head / GiB);
        printf(")\n");
    }
    if (param_bytes + (256u << 20) > free_bytes)
        fail("model needs %.2f GiB for parameters, gradients and optimizer state alone, but only %.2f GiB are free: "
             "choose a smaller model", param_bytes / GiB, free_bytes / GiB);
    if (need + (256u << 20) > free_bytes)
        fail("model needs %.2f GiB of GPU memory (+0.25 GiB headroom) but only %.2f GiB are free: lower --batch%s",
             need / GiB, free_bytes / GiB, recompute ? "" : " or pass --recompute 1");

    model.param_allocation = specs_allocate(params, "parameters, gradients and optimizer state");
    if (!HAS_MASTER) model.master_memory = (float*)model.params_memory + model.opt_begin;
    model.params = model_point_tensors(model.params_memory, config);
    if (ng == n) model.grads = model_point_tensors(model.grads_memory, config);  // else the data-parallel hooks
    model.act_allocation = specs_allocate(acts, "activations");
    if (!fp8.empty()) {
        model.fp8_allocation = specs_allocate(fp8, "the FP8 buffers (--fp8)");
        fp8_init_metas(model.fp8, ctx);
    }
    model.allocated_bytes = need + ctx.cublaslt_workspace_size;
    if (model.optimizer == OPTIMIZER_MUON) {
        if (no != n || ng != n) fail("internal: --optimizer muon needs the whole optimizer state and gradients (ZeRO 0)");
        muon_build(model.muon, config, ctx);
        model.allocated_bytes += model.muon.allocated_bytes;
    }
    cudaCheck(cudaMemset(model.m_memory, 0, no * sizeof(float)));
    cudaCheck(cudaMemset(model.v_memory, 0, no * sizeof(float)));
    cudaCheck(cudaMemset(model.grads_memory, 0, ng * sizeof(floatX)));
    if (config.position == POS_ROPE)
        rope_tables_upload(model.acts.rope_cos, model.acts.rope_sin, config, config.max_seq_len);
    // the norm backward's shared-memory opt-in for rows wider than 1024 (before any graph capture)
    if (config.norm == NORM_RMSNORM) rmsnorm_backward_prepare(config.channels, ctx);
    else layernorm_backward_prepare(config.channels, ctx);
    const int N = B * T;
    model.buckets.init(N, config.padded_vocab_size);
    cudaCheck(cudaMallocHost(&model.host_io, (model.masked_loss ? 3 : 2) * sizeof(int) * N));
    cudaCheck(cudaMallocHost(&model.host_losses, sizeof(float) * N));
    cudaCheck(cudaMallocHost(&model.host_adamw, sizeof(AdamWArgs)));
    cudaCheck(cudaMallocHost(&model.host_norm_sq, sizeof(float)));
    cudaCheck(cudaEventCreateWithFlags(&model.io_uploaded, cudaEventDisableTiming));
}

inline void model_free(Model& model) {
    cudaCheck(cudaFree(model.param_allocation));
    cudaCheck(cudaFree(model.act_allocation));
    cudaCheck(cudaFree(model.fp8_allocation));
    model.buckets.destroy();
    cudaCheck(cudaFreeHost(model.host_io));
    cudaCheck(cudaFreeHost(model.host_losses));
    cudaCheck(cudaFreeHost(model.host_adamw));
    cudaCheck(cudaFreeHost(model.host_norm_sq));
    cudaCheck(cudaEventDestroy(model.io_uploaded));
    if (model.optimizer == OPTIMIZER_MUON) muon_free(model.muon);
    model = Model();
}

// Sets the parameters from fp32 host values: master = values (of the optimizer's slice), params =
// values rounded to nearest.
inline void model_set_params(Model& model, const float* host) {
    const size_t n = model.num_params;
    model.fp8.weights_step = -1;  // new weights: the next forward recasts them
    if (HAS_MASTER) {
        cudaCheck(cudaMemcpy(model.master_memory, host + model.opt_begin, (model.opt_end - model.opt_begin) * sizeof(float),
                             cudaMemcpyHostToDevice));
        std::vector<uint16_t> bf(n);
        for (size_t i = 0; i < n; i++) bf[i] = float_to_bf16(host[i]);
        cudaCheck(cudaMemcpy(model.params_memory, bf.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    } else {
        cudaCheck(cudaMemcpy(model.params_memory, host, n * sizeof(float), cudaMemcpyHostToDevice));
    }
}

// ============================================================================ forward
// A batch of B x T tokens (targets may be null) fits the model and every id is in [0, vocab).
inline void model_check_batch(const Model& model, const int* inputs, const int* targets, int B, int T) {
    const int N = B * T;
    if (B > model.B || T > model.T || N > model.B * model.T)
        fail("batch %dx%d exceeds the %dx%d the model was built for", B, T, model.B, model.T);
    const int V = model.config.vocab_size;
    for (int i = 0; i < N; i++)
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            fail("token id out of range [0, %d) at position %d of the batch", V, i);
}

// Uploads a batch (inputs; targets may be null) through the pinned staging buffer. With
// `for_backward`, also buckets the inputs for the deterministic embedding backward. dloss_rows (N,
// loss_mask_dloss's): each row's loss gradient, for a training batch of a masked_loss model.
inline void model_upload_batch(Model& model, const int* inputs, const int* targets, int B, int T, bool for_backward,
                              const CudaContext& ctx, const float* dloss_rows = nullptr) {
    const int N = B * T;
    model_check_batch(model, inputs, targets, B, T);
    if (dloss_rows && !model.masked_loss) fail("internal: dloss_rows for a model built without masked_loss");
    cudaCheck(cudaEventSynchronize(model.io_uploaded));  // the previous upload has left the staging buffer
    memcpy(model.host_io, inputs, sizeof(int) * N);
    if (targets) memcpy(model.host_io + N, targets, sizeof(int) * N);
    if (dloss_rows) memcpy(model.host_io + 2 * N, dloss_rows, sizeof(float) * N);
    cudaCheck(cudaMemcpyAsync(model.acts.inputs, model.host_io, sizeof(int) * N, cudaMemcpyHostToDevice, ctx.stream));
    if (targets)
        cudaCheck(cudaMemcpyAsync(model.acts.targets, model.host_io + N, sizeof(int) * N, cudaMemcpyHostToDevice, ctx.stream));
    if (dloss_rows)
        cudaCheck(cudaMemcpyAsync(model.acts.dloss_rows, model.host_io + 2 * N, sizeof(float) * N,
                                  cudaMemcpyHostToDevice, ctx.stream));
    cudaCheck(cudaEventRecord(model.io_uploaded, ctx.stream));
    if (for_backward) model.buckets.build(inputs, N, ctx.stream);
}

// The attention backward's fp32 scratch (dQ by atomics) for a pass at (B, T): all of dfch, free at
// that point (the Hopper backward may use all of it, attention.cuh). The N*C + 2*B*NH*Tp floats it
// needs (Tp = T rounded up to 64) fit the model's N*FC floatX for any T > 1 when FC >= 4C (GPT-2;
// SwiGLU at H >= 2C); none (the deterministic backward) with --deterministic 1 or where they do not.
inline AttnScratch attention_scratch(const Model& model, int B, int T) {
    const ModelConfig& c = model.config;
    const size_t have = (size_t)model.B * model.T * model_fc_channels(c) * sizeof(floatX) / sizeof(float);
    if (model.deterministic || attention_backward_scratch_floats(model_attn_shape(c, B, T)) > have) return AttnScratch{};
    return AttnScratch{reinterpret_cast<float*>(model.acts.dfch), have};
}

// Per-layer slices of the activations (a recomputed buffer has one slice).
struct LayerActs {
    floatX *res_in, *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3;
    float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
};
inline LayerActs layer_acts(const Model& model, int l, int B, int T) {
    const Activations& a = model.acts;
    const size_t N = (size_t)B * T, C = model.config.channels, QKV = model_qkv_channels(model.config);
    const size_t H = model_mlp_hidden(model.config), FC = model_fc_channels(model.config);
    const size_t lr = model.one_slice ? 0 : l;
    LayerActs s;
    s.res_in = l == 0 ? a.encoded : a.residual3 + (l - 1) * N * C;
    s.ln1 = a.ln1 + lr * N * C;
    s.qkv = a.qkv + l * N * QKV;
    s.atty = a.atty + l * N * C;
    s.residual2 = a.residual2 + l * N * C;
    s.ln2 = a.ln2 + lr * N * C;
    s.fch = a.fch + l * N * FC;
    s.fch_gelu = a.fch_gelu + lr * N * H;
    s.residual3 = a.residual3 + l * N * C;
    s.ln1_mean = a.ln1_mean + l * N;
    s.ln1_rstd = a.ln1_rstd + l * N;
    s.lse = a.lse + l * N * model.config.num_heads;
    s.ln2_mean = a.ln2_mean + l * N;
    s.ln2_rstd = a.ln2_rstd + l * N;
    return s;
}

namespace model_detail {
// dresidual += d(norm input), dweight (and dbias) +=; scratch: the column-sum partials. dresidual is
// the residual stream's running gradient wherever a norm sits (the residual add passes it on).
inline void norm_backward(const ModelConfig& c, floatX* dresidual, floatX* dweight, floatX* dbias, float* scratch,
                          const floatX* dout, const floatX* inp, const floatX* weight, const float* mean,
                          const float* rstd, int N, const CudaContext& ctx) {
    if (c.norm == NORM_RMSNORM) rmsnorm_backward(dresidual, dweight, scratch, dout, inp, weight, rstd, N, c.channels, ctx);
    else layernorm_backward(dresidual, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, c.channels, ctx);
}

// The norm before linear k of block l (ln1: qkv, ln2: fc): norm_forward (inp2 null) or
// residual_norm_forward into `out`, or, in an FP8 pass where fp8_norm_fused, the LayerNorm writes the
// linear's FP8 X and X^T instead of `out` (llmc/model_fp8.cuh).
inline void norm_before_linear(Model& m, bool fp8, int l, int k, floatX* residual, floatX* out, float* mean, float* rstd,
                               const floatX* inp1, const floatX* inp2, const floatX* weight, const floatX* bias, int N,
                               const CudaContext& ctx) {
    cudaStream_t s = ctx.stream;
    if (fp8 && fp8_norm_fused(m.fp8, l, k))
        fp8_norm_forward(m.fp8, l, k, residual, mean, rstd, inp1, inp2, weight, bias, N, ctx);
    else if (inp2) residual_norm_forward(m.config, residual, out, mean, rstd, inp1, inp2, weight, bias, N, s);
    else norm_forward(m.config, out, mean, rstd, inp1, weight, bias, N, s);
}

// Whether a pass of N rows runs the block's linear layers in FP8: --fp8, and a row count the FP8
// buffers take (the trained B*T, or a smaller multiple of the cast tile; other forwards run bf16).
inline bool fp8_pass(const Model& m, int N) { return m.fp8.set.enabled && N <= m.fp8.N && N % FP8_T_TILE == 0; }
// Whether its output head runs in FP8 too (--fp8-head 1; llmc/model_fp8.cuh, fp8_head_*).
inline bool fp8_head_pass(const Model& m, int N) { return fp8_pass(m, N) && m.fp8.set.head; }

// Linear k (Fp8Linear) of layer l, the signatures of matmul_forward / matmul_backward: through FP8
// (llmc/model_fp8.cuh) in an FP8 pass (`fp8`) where fp8_linear_on, else bf16. cast_weight: the FP8
// weight copies are stale; x_cast: the FP8 X and X^T are already written (attproj's, by the attention).
inline void linear_forward(Model& m, bool fp8, bool cast_weight, int l, int k, floatX* out, floatX* gelu_pre,
                           const floatX* inp, const floatX* weight, const floatX* bias, int N, int C, int OC,
                           const CudaContext& ctx, bool x_cast = false) {
    if (fp8 && fp8_linear_on(m.fp8, l, k))
        fp8_linear_forward(m.fp8, l, k, out, gelu_pre, inp, weight, bias, N, cast_weight, ctx, x_cast);
    else matmul_forward(out, gelu_pre, inp, weight, bias, N, C, OC, ctx);
}
// dout_gelu_pre (FP8 fc only, where fp8_gelu_fused): dout is d(GELU output) of this pre-activation.
// dq (FP8 qkv only, where fp8_dq_fused): dout's dQ columns are in dq.accum (fp8_linear_backward).
inline void linear_backward(Model& m, bool fp8, int l, int k, floatX* dinp, floatX* dweight, floatX* dbias,
                            float* scratch, const floatX* dout, const floatX* inp, const floatX* weight, floatX* gelu_pre,
                            int N, int C, int OC, const CudaContext& ctx, const floatX* dout_gelu_pre = nullptr,
                            const Fp8DqAccum& dq = {}) {
    if (fp8 && fp8_linear_on(m.fp8, l, k))
        fp8_linear_backward(m.fp8, l, k, dinp, dweight, dbias, scratch, dout, inp, gelu_pre, N, ctx, dout_gelu_pre, dq);
    else matmul_backward(dinp, dweight, dbias, scratch, dout, inp, weight, gelu_pre, N, C, OC, ctx);
}


// doc_start (B, T) from the inputs (llmc/attention_layout.cuh's contract, cpu::doc_starts): one warp a
// row, a running max of the positions holding doc_token, 32 tokens a pass (a warp max-scan per pass).
// Reads and writes B*T ints: negligible. Inside model_forward, so a captured step recomputes it.
static __global__ void doc_starts_kernel(int* doc_start, const int* inputs, int B, int T, int doc_token) {
    const int b = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (b >= B) return;
    const int* in = inputs + (size_t)b * T;
    int* out = doc_start + (size_t)b * T;
    int carry = 0;
    for (int t0 = 0; t0 < T; t0 += WARP_SIZE) {
        const int t = t0 + lane;
        int v = t < T && in[t] == doc_token ? t : carry;
        for (int o = 1; o < WARP_SIZE; o <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v = max(v, u);
        }
        if (t < T) out[t] = v;
        carry = __shfl_sync(0xffffffffu, v, WARP_SIZE - 1);
    }
}
inline void doc_starts_forward(int* doc_start, const int* inputs, int B, int T, int doc_token, cudaStream_t s) {
    constexpr int warps = 4;
    doc_starts_kernel<<<ceil_div(B, warps), warps * WARP_SIZE, 0, s>>>(doc_start, inputs, B, T, doc_token);
    cudaCheckLaunch();
}
}  // namespace model_detail

// The attention shape of a pass, with the document mask where the model has one.
inline AttnShape model_pass_attn_shape(const Model& model, int B, int T) {
    AttnShape s = model_attn_shape(model.config, B, T);
    if (model.doc_token >= 0) s.doc_start = model.acts.doc_start;
    return s;
}

// Forward pass on the uploaded inputs, through the logits (N, Vp). The layer structure: the first
// norm runs on the embedding, and every residual add is fused with the norm after it (the next
// layer's ln1, or lnf), as on the CPU (llmc/cpu/model.h).
inline void model_forward(Model& model, int B, int T, const CudaContext& ctx) {
    const ModelConfig& c = model.config;
    const int N = B * T, C = c.channels, L = c.num_layers, NH = c.num_heads, NKV = c.num_kv_heads;
    const int HD = model_head_dim(c), QKV = model_qkv_channels(c), H = model_mlp_hidden(c), FC = model_fc_channels(c);
    const AttnShape attn = model_pass_attn_shape(model, B, T);
    const ModelTensors<floatX>& p = model.params;
    Activations& a = model.acts;
    cudaStream_t s = ctx.stream;
    if (model.doc_token >= 0) model_detail::doc_starts_forward(a.doc_start, a.inputs, B, T, model.doc_token, s);
    const int* pos_start = model.doc_token >= 0 && model.doc_restart ? a.doc_start : nullptr;  // positions' origin
    const bool fp8_pass = model_detail::fp8_pass(model, N);
    const bool cast_w = fp8_pass && model.fp8.weights_step != model.step;  // once per step, after the update
    using model_detail::linear_forward;
    if (model.before_layer_forward) model.before_layer_forward(-1);
    // the blocks' FP8 weight copies: all at once here, or each layer's in its first linear_forward
    // (under ZeRO the layers' weights arrive one by one: before_layer_forward)
    const bool cast_all = cast_w && !model.before_layer_forward && fp8_weights_batched(model.fp8);
    if (cast_all) fp8_cast_weights(model.fp8, {p.qkvw, p.attprojw, p.fcw, p.fcprojw}, ctx);
    const bool cast_layer = cast_w && !cast_all;
    encoder_forward(a.encoded, a.inputs, p.wte, p.wpe, B, T, C, s, pos_start);  // wpe nullptr with RoPE
    LayerActs first = layer_acts(model, 0, B, T);
    model_detail::norm_before_linear(model, fp8_pass, 0, FP8_QKV, nullptr, first.ln1, first.ln1_mean, first.ln1_rstd,
                                    a.encoded, nullptr, p.ln1w, p.ln1b, N, ctx);
    for (int l = 0; l < L; l++) {
        if (model.before_layer_forward) model.before_layer_forward(l);
        LayerActs la = layer_acts(model, l, B, T);
        const size_t c1 = (size_t)l * C;
        linear_forward(model, fp8_pass, cast_layer, l, FP8_QKV, la.qkv, nullptr, la.ln1, p.qkvw + (size_t)l * QKV * C,
                       tensor_at(p.qkvb, (size_t)l * QKV), N, C, QKV, ctx);
        if (c.position == POS_ROPE) rope_forward(la.qkv, a.rope_cos, a.rope_sin, B, T, NH, NKV, HD, 0, s, pos_start);
        // in an FP8 pass with fused casts the attention also writes attproj's X and X^T (fp8_attention_x)
        const bool attn_x = fp8_pass && fp8_attention_x_fused(model.fp8, l) && attention_forward_fp8_available(attn, ctx);
        const AttnFp8Out f8 = attn_x ? fp8_attention_x(model.fp8, l, N) : AttnFp8Out{};
        model_attention_forward(la.atty, la.lse, la.qkv, attn, ctx, attn_x ? &f8 : nullptr);
        linear_forward(model, fp8_pass, cast_layer, l, FP8_ATTPROJ, a.proj, nullptr, la.atty, p.attprojw + (size_t)l * C * C,
                       tensor_at(p.attprojb, c1), N, C, C, ctx, attn_x);
        model_detail::norm_before_linear(model, fp8_pass, l, FP8_FC, la.residual2, la.ln2, la.ln2_mean, la.ln2_rstd,
                                        la.res_in, a.proj, p.ln2w + c1, tensor_at(p.ln2b, c1), N, ctx);
        const floatX* fcw = p.fcw + (size_t)l * FC * C;
        const floatX* fcb = tensor_at(p.fcb, (size_t)l * FC);
        if (c.mlp == MLP_SWIGLU) {
            linear_forward(model, fp8_pass, cast_layer, l, FP8_FC, la.fch, nullptr, la.ln2, fcw, fcb, N, C, FC, ctx);
            swiglu_forward(la.fch_gelu, la.fch, N, H, s);
        } else {  // GELU in the bf16 epilogue; the FP8 path runs it after the matmul, or inside fcproj's X cast
            linear_forward(model, fp8_pass, cast_layer, l, FP8_FC, la.fch_gelu, la.fch, la.ln2, fcw, fcb, N, C, FC, ctx);
        }
        linear_forward(model, fp8_pass, cast_layer, l, FP8_FCPROJ, a.proj, nullptr, la.fch_gelu, p.fcprojw + (size_t)l * C * H,
                       tensor_at(p.fcprojb, c1), N, H, C, ctx);
        if (l + 1 < L) {
            LayerActs next = layer_acts(model, l + 1, B, T);
            model_detail::norm_before_linear(model, fp8_pass, l + 1, FP8_QKV, la.residual3, next.ln1, next.ln1_mean,
                                            next.ln1_rstd, la.residual2, a.proj, p.ln1w + c1 + C, tensor_at(p.ln1b, c1 + C),
                                            N, ctx);
        } else {
            model_detail::residual_norm_forward(c, la.residual3, a.lnf, a.lnf_mean, a.lnf_rstd, la.residual2, a.proj,
                                               p.lnfw, p.lnfb, N, s);
        }
    }
    // the head: bf16, or with --fp8-head 1 FP8 (docs/numerics.md)
    if (model_detail::fp8_head_pass(model, N))
        fp8_head_forward(model.fp8, a.logits, a.lnf, c.tied_head ? p.wte : p.lm_head, N, cast_w, ctx);
    else
        matmul_forward(a.logits, nullptr, a.lnf, c.tied_head ? p.wte : p.lm_head, nullptr, N, C, c.padded_vocab_size, ctx);
    if (cast_w) model.fp8.weights_step = model.step;
}

// Cross-entropy of the logits against the uploaded targets, enqueued: the N per-position losses
// (every position's, masked or not) are copied to `host_losses` (pinned) without a wait; read them
// after the next synchronization. With write_dlogits the logits become dloss * (softmax - onehot) for
// the backward, a masked_loss model's with the uploaded dloss_rows in place of dloss (with --fp8-head 1
// in FP8, in place: fp8_head_classifier; not with masked_loss).
inline void model_classifier(Model& model, int B, int T, float dloss, bool write_dlogits, float* host_losses,
                            const CudaContext& ctx) {
    const int N = B * T;
    Activations& a = model.acts;
    if (write_dlogits && model_detail::fp8_head_pass(model, N))
        fp8_head_classifier(model.fp8, a.logits, a.losses, a.targets, dloss, N, ctx);
    else
        fused_classifier(a.logits, a.losses, a.targets, dloss, N, model.config.vocab_size,
                         model.config.padded_vocab_size, write_dlogits, ctx.stream,
                         model.masked_loss ? a.dloss_rows : nullptr);
    cudaCheck(cudaMemcpyAsync(host_losses, a.losses, sizeof(float) * N, cudaMemcpyDeviceToHost, ctx.stream));
}

inline double mean_of(const float* x, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    return sum / n;
}

// The mean of losses (n) over the positions where mask (n) is 1, summed in double; 0 where none is;
// mask nullptr: mean_of (every position).
inline double masked_mean(const float* losses, const int* mask, int64_t n) {
    if (!mask) return mean_of(losses, n);
    double sum = 0.0;
    int64_t counted = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!mask[i]) continue;
        sum += losses[i];
        counted++;
    }
    return counted ? sum / counted : 0.0;
}

// The loss gradient of one position of a mean over `counted` positions, in a step of grad_accum
// micro-batches on each of world ranks: 1 / (counted * grad_accum * world), in this order in fp32.
inline float mean_dloss(int64_t counted, int grad_accum, int world) {
    return 1.0f / ((float)counted * grad_accum * world);
}

// A masked micro-batch's dloss_rows (n): mean_dloss(counted) where mask (n) is 1, 0 where it is 0
// (counted: its ones; none: all 0). All ones give the unmasked dloss, mean_dloss(n), bit for bit.
inline void loss_mask_dloss(float* dloss_rows, const int* mask, int n, int grad_accum, int world) {
    int64_t counted = 0;
    for (int i = 0; i < n; i++) counted += mask[i] != 0;
    const float d = counted ? mean_dloss(counted, grad_accum, world) : 0.0f;
    for (int i = 0; i < n; i++) dloss_rows[i] = mask[i] ? d : 0.0f;
}

// The classifier, then a wait: returns the mean loss over the N positions, or over those where mask
// (N) is 1 (masked_mean).
inline float model_loss(Model& model, int B, int T, float dloss, bool write_dlogits, const CudaContext& ctx,
                        const int* mask = nullptr) {
    model_classifier(model, B, T, dloss, write_dlogits, model.host_losses, ctx);
    cudaCheck(cudaStreamSynchronize(ctx.stream));
    return (float)masked_mean(model.host_losses, mask, (int64_t)B * T);
}
// ============================================================================ backward
// Accumulates (+=) into model.grads (or where model.grads_of points) from the dlogits left by
// model_loss(write_dlogits = true).
inline void model_backward(Model& model, int B, int T, const CudaContext& ctx) {
    const ModelConfig& c = model.config;
    const int N = B * T, C = c.channels, L = c.num_layers, NH = c.num_heads, NKV = c.num_kv_heads;
    const int HD = model_head_dim(c), QKV = model_qkv_channels(c), Vp = c.padded_vocab_size;
    const int H = model_mlp_hidden(c), FC = model_fc_channels(c);
    const AttnShape attn = model_pass_attn_shape(model, B, T);  // doc_start: the last forward's
    const int* pos_start = model.doc_token >= 0 && model.doc_restart ? model.acts.doc_start : nullptr;
    const ModelTensors<floatX>& p = model.params;
    const ModelTensors<floatX> g = model.grads_of ? model.grads_of(-1) : model.grads;  // outside the layers
    Activations& a = model.acts;
    cudaStream_t s = ctx.stream;
    const bool fp8_pass = model_detail::fp8_pass(model, N);
    if (model.fp8.set.enabled && !fp8_pass) fail("--fp8: a backward of %d rows; the FP8 buffers take multiples of %d up to %d", N,
                                            FP8_T_TILE, model.fp8.N);
    using model_detail::linear_backward;
    cudaCheck(cudaMemsetAsync(a.dresidual, 0, sizeof(floatX) * N * C, s));
    // logits = lnf head^T: dlnf (in dbuf) = dlogits head, dhead += dlogits^T lnf (head: wte or lm_head)
    if (model_detail::fp8_head_pass(model, N))
        fp8_head_backward(model.fp8, a.dbuf, c.tied_head ? g.wte : g.lm_head, a.logits, N, ctx);
    else
        matmul_backward(a.dbuf, c.tied_head ? g.wte : g.lm_head, nullptr, a.colsum, a.logits, a.lnf,
                        c.tied_head ? p.wte : p.lm_head, nullptr, N, C, Vp, ctx);
    LayerActs last = layer_acts(model, L - 1, B, T);
    model_detail::norm_backward(c, a.dresidual, g.lnfw, g.lnfb, a.colsum, a.dbuf, last.residual3, p.lnfw, a.lnf_mean,
                               a.lnf_rstd, N, ctx);
    for (int l = L - 1; l >= 0; l--) {
        LayerActs la = layer_acts(model, l, B, T);
        // this layer's slice of each per-layer tensor starts at l * (one layer's elements)
        const size_t qkvw = (size_t)l * QKV * C, cc = (size_t)l * C * C, c1 = (size_t)l * C;
        const size_t fcw = (size_t)l * FC * C, fcprojw = (size_t)l * C * H;
        const ModelTensors<floatX> gl = model.grads_of ? model.grads_of(l) : model_layer_slices(model.grads, c, l);
        if (model.recompute) {  // rebuild the three single-slice buffers for this layer
            model_detail::norm_forward(c, la.ln1, la.ln1_mean, la.ln1_rstd, la.res_in, p.ln1w + c1, tensor_at(p.ln1b, c1), N, s);
            model_detail::norm_forward(c, la.ln2, la.ln2_mean, la.ln2_rstd, la.residual2, p.ln2w + c1, tensor_at(p.ln2b, c1), N,
                                      s);
            model_detail::mlp_activation_forward(c, la.fch_gelu, la.fch, N, s);
        }
        // dresidual holds d(residual3). MLP: fcproj, the activation (GELU's fused into the matmul), fc, ln2.
        if (c.mlp == MLP_SWIGLU) {
            linear_backward(model, fp8_pass, l, FP8_FCPROJ, a.dfch_act, gl.fcprojw, gl.fcprojb, a.colsum, a.dresidual,
                            la.fch_gelu, p.fcprojw + fcprojw, nullptr, N, H, C, ctx);
            swiglu_backward(a.dfch, a.dfch_act, la.fch, N, H, s);
        } else {  // FP8 with fused casts (fp8_gelu_fused): dfch = d(GELU output), dGELU inside fc's dY cast
            linear_backward(model, fp8_pass, l, FP8_FCPROJ, a.dfch, gl.fcprojw, gl.fcprojb, a.colsum, a.dresidual, la.fch_gelu,
                            p.fcprojw + fcprojw, la.fch, N, H, C, ctx);
        }
        const bool gelu_in_cast = c.mlp != MLP_SWIGLU && fp8_pass && fp8_gelu_fused(model.fp8, l);
        linear_backward(model, fp8_pass, l, FP8_FC, a.dbuf, gl.fcw, gl.fcb, a.colsum, a.dfch, la.ln2, p.fcw + fcw, nullptr, N,
                        C, FC, ctx, gelu_in_cast ? la.fch : nullptr);
        model_detail::norm_backward(c, a.dresidual, gl.ln2w, gl.ln2b, a.colsum, a.dbuf, la.residual2, p.ln2w + c1,
                                   la.ln2_mean, la.ln2_rstd, N, ctx);
        // dresidual now holds d(residual2). Attention: attproj, attention, RoPE, qkv, then ln1.
        linear_backward(model, fp8_pass, l, FP8_ATTPROJ, a.dbuf, gl.attprojw, gl.attprojb, a.colsum, a.dresidual, la.atty,
                        p.attprojw + cc, nullptr, N, C, C, ctx);
        // FP8 with fused casts (fp8_dq_fused: no RoPE): the attention backward may leave dQ as fp32 sums in
        // its scratch (dfch: nothing writes it before the next layer's MLP backward) and skip the dQ
        // store; qkv's dY cast then reads them there (DQ_ACCUM). dq_accum: nullptr where dqkv is whole.
        const bool dq_in_cast = fp8_pass && fp8_dq_fused(model.fp8, l);
        const float* dq_accum = attention_backward(a.dqkv, a.dbuf, la.qkv, la.atty, la.lse, attn, ctx,
                                                   attention_scratch(model, B, T), dq_in_cast);
        if (c.position == POS_ROPE)  // d(rotated qkv) -> d(qkv), in place
            rope_backward(a.dqkv, a.rope_cos, a.rope_sin, B, T, NH, NKV, HD, 0, s, pos_start);
        Fp8DqAccum dq;
        if (dq_accum) dq.accum = dq_accum, dq.q_cols = NH * HD, dq.head_dim = HD;
        linear_backward(model, fp8_pass, l, FP8_QKV, a.dbuf, gl.qkvw, gl.qkvb, a.colsum, a.dqkv, la.ln1, p.qkvw + qkvw, nullptr,
                        N, C, QKV, ctx, nullptr, dq);
        model_detail::norm_backward(c, a.dresidual, gl.ln1w, gl.ln1b, a.colsum, a.dbuf, la.res_in, p.ln1w + c1,
                                   la.ln1_mean, la.ln1_rstd, N, ctx);
        if (model.after_layer_backward) model.after_layer_backward(l);
    }
    encoder_backward(g.wte, g.wpe, a.dresidual, model.buckets, B, T, C, s, pos_start);  // g.wpe nullptr with RoPE
    if (fp8_pass) fp8_after_backward(model.fp8, s);
    if (model.after_layer_backward) model.after_layer_backward(-1);
}

// ============================================================================ update
// Global norm, clipping and one AdamW step (step numbering continues from model.step), in two
// halves so that a CUDA graph (llmc/model_graph.cuh) can hold the device's:
//   model_update_args     host: model.step += 1, the step's scalars into the pinned host_adamw (and
//                        Muon's); only once the previous update's copy has run (after a synchronization).
//   model_update_enqueue  device, no host wait, over the slice [opt_begin, opt_end): the scalars' copy,
//                        the squared norm (sum_norm: summed over the ranks, llmc/model_dist.cuh), the
//                        clip factor, AdamW, the squared norm's copy to host_norm_sq (model_update_norm).
//                        OPTIMIZER_MUON (whole buffers): AdamW on the tensors Muon leaves, then muon_update.
// model_update does both and waits; it returns the gradient norm before clipping.
inline void model_update_args(Model& model, const OptimizerSettings& o) {
    model.step++;
    const uint64_t seed = model.sr_seed ^ ((uint64_t)model.step * 0xD1B54A32D192ED03ull);  // fresh rounding per step
    *model.host_adamw = adamw_args(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, 1.0f, model.step, seed);
    model.host_adamw->stochastic = model.stochastic_rounding;
    if (o.optimizer != model.optimizer)
        fail("internal: an %s step on a model built for %s", optimizer_name(o.optimizer), optimizer_name(model.optimizer));
    if (model.optimizer == OPTIMIZER_MUON) muon_set_args(model.muon, o);
}

inline void model_update_enqueue(Model& model, float grad_clip, const CudaContext& ctx,
                                const std::function<void(float* norm_sq)>& sum_norm = {}) {
    const int64_t begin = model.opt_begin, end = model.opt_end;
    const floatX* grads = model.grads_memory + (begin - model.grad_begin);  // the slice's gradients
    float* norm_out = model.acts.norm + GLOBAL_NORM_BLOCKS;
    cudaCheck(cudaMemcpyAsync(model.acts.adamw, model.host_adamw, sizeof(AdamWArgs), cudaMemcpyHostToDevice, ctx.stream));
    global_norm_squared(norm_out, model.acts.norm, grads, end - begin, ctx.stream);
    if (sum_norm) sum_norm(norm_out);
    adamw_clip_scale(model.acts.adamw, norm_out, grad_clip, ctx.stream);
    if (model.optimizer == OPTIMIZER_MUON) {
        const Muon& mu = model.muon;
        for (size_t r = 0; r < mu.adamw_begin.size(); r++) {
            const int64_t b = mu.adamw_begin[r];
            adamw_update_range(model.params_memory, model.master_memory + b, grads + b, model.m_memory + b,
                               model.v_memory + b, b, mu.adamw_end[r], model.acts.adamw, model.decay, ctx.stream);
        }
        muon_update(model.params_memory, model.master_memory, grads, model.m_memory, model.muon, model.acts.adamw, ctx);
    } else {
        adamw_update_range(model.params_memory, model.master_memory, grads, model.m_memory, model.v_memory, begin, end,
                           model.acts.adamw, model.decay, ctx.stream);
    }
    cudaCheck(cudaMemcpyAsync(model.host_norm_sq, norm_out, sizeof(float), cudaMemcpyDeviceToHost, ctx.stream));
}

inline float model_update_norm(const Model& model) { return std::sqrt(*model.host_norm_sq); }

inline float model_update(Model& model, const OptimizerSettings& o, const CudaContext& ctx) {
    model_update_args(model, o);
    model_update_enqueue(model, o.grad_clip, ctx);
    cudaCheck(cudaStreamSynchronize(ctx.stream));
    return model_update_norm(model);
}

inline void model_zero_grads(Model& model, const CudaContext& ctx) {
    cudaCheck(cudaMemsetAsync(model.grads_memory, 0, (model.grad_end - model.grad_begin) * sizeof(floatX), ctx.stream));
}

// ============================================================================ checkpoints
// DIR/step_NNNNNNNN/{model.bin, state.bin, DONE}: the model in floatX (bf16 build: exactly the
// bf16 parameters the forward pass reads), the state with m, v and, in the bf16 build, the fp32
// master weights; written into step_NNNNNNNN.tmp/ and renamed, with DONE (their checksums), by
// checkpoint_begin/checkpoint_finish (llmc/checkpoint.h).
inline void model_write_model(const Model& model, const std::string& path) {
    std::vector<floatX> p(model.num_params);
    cudaCheck(cudaMemcpy(p.data(), model.params_memory, p.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
    if (HAS_MASTER) model_write_bf16(path.c_str(), model.config, (const uint16_t*)p.data());
    else model_write_fp32(path.c_str(), model.config, (const float*)p.data());
}

// The state file of the model's slice [opt_begin, opt_end) (a ZeRO shard in a data-parallel run,
// llmc/model_dist.cuh), with the step, the data position, the RNG and the optimizer (OPTIMIZER_MUON: m
// holds Muon's momentum on its tensors, as the CPU trainer's state does).
inline void model_write_state(const Model& model, const std::string& path, const int64_t loader_state[16],
                             uint64_t rng_state) {
    const size_t k = (size_t)(model.opt_end - model.opt_begin), n = model.num_params;
    std::vector<float> m(k), v(k), master(HAS_MASTER ? k : 0);
    cudaCheck(cudaMemcpy(m.data(), model.m_memory, k * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(v.data(), model.v_memory, k * sizeof(float), cudaMemcpyDeviceToHost));
    if (HAS_MASTER) cudaCheck(cudaMemcpy(master.data(), model.master_memory, k * sizeof(float), cudaMemcpyDeviceToHost));
    TrainState st;
    st.step = model.step;
    st.num_params = (int64_t)k;
    st.rng_state = rng_state;
    st.sr_seed = model.sr_seed;
    for (int i = 0; i < 16; i++) st.loader[i] = loader_state[i];
    const bool whole = k == n;  // a whole state has shard_begin = total_params = 0
    st.shard_begin = whole ? 0 : model.opt_begin;
    st.total_params = whole ? 0 : (int64_t)n;
    st.optimizer = model.optimizer;
    state_write(path.c_str(), st, m.data(), v.data(), HAS_MASTER ? master.data() : nullptr);
}

// The other half of a resume: m, v and (when the state has them) the master weights of the model's
// slice (opt_end - opt_begin values each), and the step and rounding seed of `st`.
inline void model_set_state(Model& model, const TrainState& st, const float* m, const float* v, const float* master) {
    const size_t k = (size_t)(model.opt_end - model.opt_begin);
    if (st.optimizer != model.optimizer)
        fail("internal: a state of %s's optimizer for a model built for %s", optimizer_name((int)st.optimizer),
             optimizer_name(model.optimizer));
    if (HAS_MASTER && st.has_master)
        cudaCheck(cudaMemcpy(model.master_memory, master, k * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model.m_memory, m, k * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model.v_memory, v, k * sizeof(float), cudaMemcpyHostToDevice));
    model.step = st.step;
    model.sr_seed = st.sr_seed;
}

inline void model_save_checkpoint(const Model& model, const std::string& out_dir, const int64_t loader_state[16],
                                 uint64_t rng_state) {
    const std::string dir = checkpoint_begin(out_dir, model.step);
    cudaCheck(cudaDeviceSynchronize());
    model_write_model(model, dir + "/model.bin");
    model_write_state(model, dir + "/state.bin", loader_state, rng_state);
    if (model.fp8.metas) fp8_write_state(model.fp8, model.step, dir + "/" + fp8_state_file_name(0, 1));
    checkpoint_finish(dir);
}

// The parameters of a checkpoint's model file, whose config must be the built model's (a bf16 file:
// the exact bf16 parameters; master = those values unless the state has its own).
inline void model_load_params(Model& model, const std::string& path) {
    if (!model_same_config(model_read_info(path.c_str()).config, model.config))
        fail("%s: the checkpoint's model shape differs from this run's", path.c_str());
    std::vector<float> host(model.num_params);
    model_read_fp32(path.c_str(), host.data());
    model_set_params(model, host.data());
}

// Reads checkpoint `dir` into an already built model of the same config; returns its training
// state (step, loader position, RNG).
inline TrainState model_load_checkpoint(Model& model, const std::string& dir) {
    model_load_params(model, dir + "/model.bin");
    const size_t n = model.num_params;
    std::vector<float> m(n), v(n), master(n);
    TrainState st = state_read((dir + "/state.bin").c_str(), (int64_t)n, m.data(), v.data(), master.data());
    model_set_state(model, st, m.data(), v.data(), master.data());
    if (model.fp8.metas) fp8_read_state(model.fp8, st.step, fp8_state_file_to_read(dir, 0));
    return st;
}

// FLOPs of one token through forward + backward: 6 per parameter plus attention's 6*L*C*T
// (causal: half the square), the convention of docs/h200.md.
inline double flops_per_token(const ModelConfig& c, int T) {
    return 6.0 * (double)model_num_params(c) + 6.0 * c.num_layers * c.channels * (double)T;
}
