// llmc/model_reference.cuh: the model's full forward over one sequence, without a cache: the reference
// generate --check-full compares the cached decode with. The kernels of the training model's bf16
// forward (model_forward without FP8, which test_gpt2 checks against PyTorch) in the same order, so
// the decode path is what is tested. One layer's activations are kept: no backward can follow.
#pragma once
#include <vector>
#include "llmc/model.cuh"

struct ModelReference {
    ModelConfig config{};
    int T = 0;                       // positions the buffers hold
    floatX* params_memory = nullptr; // (num_params) MODEL_PARAMETER_TABLE order
    ModelTensors<floatX> params{};
    int* inputs;                     // (T)
    floatX *res1, *res2, *ln;        // (T, C) each: the residual entering a layer, after its attention; a norm's output
    float *mean, *rstd;              // (T) each; mean: LayerNorm only
    floatX *qkv, *atty, *proj;       // (T, QKV), (T, C), (T, C): the output of attproj / fcproj
    float* lse;                      // (NH, T)
    floatX *fch, *fch_act;           // (T, FC) pre-GELU or SwiGLU's [gate | up]; (T, H) the MLP's activation
    floatX* logits;                  // (T, Vp)
    float *rope_cos, *rope_sin;      // (T, HD/2) each, RoPE only
    void* allocation = nullptr;
};

// Buffers for sequences of up to T tokens; the parameters are copied from `params` (num_params
// floatX on the device, e.g. the inference model's).
inline void model_reference_build(ModelReference& r, const ModelConfig& c, int T, const floatX* params) {
    if (T < 1 || T > c.max_seq_len) fail("internal: model_reference_build with T=%d (max_seq_len %d)", T, c.max_seq_len);
    r.config = c;
    r.T = T;
    const size_t n = model_num_params(c), N = (size_t)T, C = c.channels, QKV = model_qkv_channels(c);
    const size_t FC = model_fc_channels(c), H = model_mlp_hidden(c), Vp = c.padded_vocab_size;
    const size_t rope = c.position == POS_ROPE ? N * model_head_dim(c) / 2 : 0;
    const size_t X = sizeof(floatX), F = sizeof(float);
    const std::vector<BufferSpec> specs = {
        {(void**)&r.params_memory, n, X}, {(void**)&r.inputs, N, sizeof(int)},
        {(void**)&r.res1, N * C, X},      {(void**)&r.res2, N * C, X},       {(void**)&r.ln, N * C, X},
        {(void**)&r.mean, N, F},          {(void**)&r.rstd, N, F},           {(void**)&r.qkv, N * QKV, X},
        {(void**)&r.atty, N * C, X},      {(void**)&r.lse, N * c.num_heads, F},
        {(void**)&r.proj, N * C, X},      {(void**)&r.fch, N * FC, X},       {(void**)&r.fch_act, N * H, X},
        {(void**)&r.logits, N * Vp, X},   {(void**)&r.rope_cos, rope, F},    {(void**)&r.rope_sin, rope, F},
    };
    r.allocation = specs_allocate(specs, "the --check-full reference model");
    r.params = model_point_tensors(r.params_memory, c);
    cudaCheck(cudaMemcpy(r.params_memory, params, n * X, cudaMemcpyDeviceToDevice));
    if (rope) rope_tables_upload(r.rope_cos, r.rope_sin, c, T);
}

inline void model_reference_free(ModelReference& r) {
    cudaCheck(cudaFree(r.allocation));
    r = ModelReference();
}

// logits (T, Vp) of the tokens tokens[0..T), T <= r.T: encoder, the blocks (the first norm on the
// embedding, every residual add fused with the norm after it), the head; enqueued on ctx.stream.
inline void model_reference_forward(ModelReference& r, const int* tokens, int T, const CudaContext& ctx) {
    const ModelConfig& c = r.config;
    if (T < 1 || T > r.T) fail("internal: model_reference_forward of %d tokens (built for %d)", T, r.T);
    const int C = c.channels, L = c.num_layers, NH = c.num_heads, NKV = c.num_kv_heads, HD = model_head_dim(c);
    const int QKV = model_qkv_channels(c), H = model_mlp_hidden(c), FC = model_fc_channels(c);
    const ModelTensors<floatX>& p = r.params;
    cudaStream_t s = ctx.stream;
    cudaCheck(cudaMemcpyAsync(r.inputs, tokens, sizeof(int) * T, cudaMemcpyHostToDevice, s));
    encoder_forward(r.res1, r.inputs, p.wte, p.wpe, 1, T, C, s);// wpe nullptr with RoPE
    model_detail::norm_forward(c, r.ln, r.mean, r.rstd, r.res1, p.ln1w, p.ln1b, T, s);
    for (int l = 0; l < L; l++) {
        const size_t c1 = (size_t)l * C;
        matmul_forward(r.qkv, nullptr, r.ln, p.qkvw + (size_t)l * QKV * C, tensor_at(p.qkvb, (size_t)l * QKV), T, C, QKV,
                       ctx);
        if (c.position == POS_ROPE) rope_forward(r.qkv, r.rope_cos, r.rope_sin, 1, T, NH, NKV, HD, 0, s);
        model_attention_forward(r.atty, r.lse, r.qkv, model_attn_shape(c, 1, T), ctx);
        matmul_forward(r.proj, nullptr, r.atty, p.attprojw + c1 * C, tensor_at(p.attprojb, c1), T, C, C, ctx);
        model_detail::residual_norm_forward(c, r.res2, r.ln, r.mean, r.rstd, r.res1, r.proj, p.ln2w + c1,
                                           tensor_at(p.ln2b, c1), T, s);
        const floatX* fcw = p.fcw + (size_t)l * FC * C;
        const floatX* fcb = tensor_at(p.fcb, (size_t)l * FC);
        if (c.mlp == MLP_SWIGLU) {
            matmul_forward(r.fch, nullptr, r.ln, fcw, fcb, T, C, FC, ctx);
            swiglu_forward(r.fch_act, r.fch, T, H, s);
        } else {  // GELU in the matmul's epilogue, fch keeps the pre-activation
            matmul_forward(r.fch_act, r.fch, r.ln, fcw, fcb, T, C, FC, ctx);
        }
        matmul_forward(r.proj, nullptr, r.fch_act, p.fcprojw + c1 * H, tensor_at(p.fcprojb, c1), T, H, C, ctx);
        const bool next = l + 1 < L;  // the next layer's ln1, or lnf after the last
        model_detail::residual_norm_forward(c, r.res1, r.ln, r.mean, r.rstd, r.res2, r.proj, next ? p.ln1w + c1 + C : p.lnfw,
                                           next ? tensor_at(p.ln1b, c1 + C) : p.lnfb, T, s);
    }
    matmul_forward(r.logits, nullptr, r.ln, c.tied_head ? p.wte : p.lm_head, nullptr, T, C, c.padded_vocab_size, ctx);
}
