// llmc/model.cuh: the model's forward layer on the GPU, for both families (the knobs of ModelConfig:
// LayerNorm | RMSNorm, learned positions | RoPE, GELU | SwiGLU, biases, tied | untied head): what a
// program that only runs the model needs, and what the training layer (llmc/model_train.cuh) and the
// inference layer (llmc/model_infer.cuh) build on. floatX (bf16, or fp32 with PRECISION_FP32)
// parameters and activations. Holds: the attention forward the build uses (ours or cuDNN's), buffer
// planning (one cudaMalloc carved into aligned buffers), the GPU's limits on a config, RoPE's tables,
// and the forward ops every layer is made of (the norms, the MLP's activation). No backward, no
// optimizer, no FP8 training, no checkpoint or file code: a program that includes only this layer and
// llmc/model_infer.cuh compiles none of them.
#pragma once
#include <algorithm>
#include <type_traits>
#include <vector>
#include "llmc/cuda_common.cuh"
#include "llmc/attention_forward.cuh"
#include "llmc/encoder.cuh"
#include "llmc/gelu.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/matmul.cuh"
#include "llmc/rmsnorm.cuh"
#include "llmc/rope.cuh"
#include "llmc/swiglu.cuh"
#include "llmc/model_config.h"
#include "llmc/cpu/rope.h"  // rope_tables_for: the one copy of RoPE's frequencies, shared with the CPU model

constexpr bool HAS_MASTER = !std::is_same<floatX, float>::value;  // bf16 build: separate fp32 master weights

// Attention: llmc/attention.cuh's forward (the FP8 copies of its output where available).
inline void model_attention_forward(floatX* out, float* lse, const floatX* qkv, const AttnShape& s,
                                    const CudaContext& ctx, const AttnFp8Out* f8 = nullptr) {
    attention_forward(out, lse, qkv, s, ctx, f8);
}
// The attention shape of the config's layers at (B, T).
inline AttnShape model_attn_shape(const ModelConfig& c, int B, int T) {
    return AttnShape{B, T, c.num_heads, c.num_kv_heads, model_head_dim(c), c.window};
}

// One entry per buffer: where its pointer goes, how many elements, how big each is.
struct BufferSpec {
    void** ptr;
    size_t count, elem;
};

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

// What the GPU kernels need of a (valid) config beyond what any model needs: 16-byte rows for the
// vector loads, and a head size the attention kernels are built for. Checked with one line from
// model_build and, before the device starts, from the trainer.
inline void model_check_gpu_support(const ModelConfig& c, const char* what) {
    const int HD = model_head_dim(c);
    if (c.channels % 8 != 0) fail("%s: channels %d must be a multiple of 8 (16-byte vector loads)", what, c.channels);
    if (c.padded_vocab_size % 8 != 0) fail("%s: padded vocab %d must be a multiple of 8", what, c.padded_vocab_size);
    if (model_mlp_hidden(c) % 8 != 0)
        fail("%s: MLP hidden width %d must be a multiple of 8 (16-byte vector loads)", what, model_mlp_hidden(c));
    if (HD != 64 && HD != 128) fail("%s: head size %d (channels / heads) must be 64 or 128 for the GPU attention", what, HD);
}

// Copies a floatX device buffer to fp32 host values (exact: every bf16 is an fp32).
inline std::vector<float> device_to_float(const floatX* src, size_t n) {
    std::vector<floatX> x(n);
    cudaCheck(cudaMemcpy(x.data(), src, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; i++) out[i] = to_float(x[i]);
    return out;
}

// RoPE's cos and sin tables, (positions, HD/2) each, into the device buffers cos_dev and sin_dev: the
// CPU model's values (cpu::rope_tables_for), so the GPU rotates by the factors the CPU does, bit for bit.
inline void rope_tables_upload(float* cos_dev, float* sin_dev, const ModelConfig& c, int positions) {
    const size_t n = (size_t)positions * model_head_dim(c) / 2;
    std::vector<float> cos(n), sin(n);
    cpu::rope_tables_for(c, cos.data(), sin.data(), positions);
    cudaCheck(cudaMemcpy(cos_dev, cos.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(sin_dev, sin.data(), n * sizeof(float), cudaMemcpyHostToDevice));
}

namespace model_detail {
// The norm of the config: LayerNorm (weight, bias; saves mean and rstd) or RMSNorm (weight; rstd).
inline void norm_forward(const ModelConfig& c, floatX* out, float* mean, float* rstd, const floatX* inp,
                         const floatX* weight, const floatX* bias, int N, cudaStream_t s) {
    if (c.norm == NORM_RMSNORM) rmsnorm_forward(out, rstd, inp, weight, N, c.channels, (float)c.norm_eps, s);
    else layernorm_forward(out, mean, rstd, inp, weight, bias, N, c.channels, s);
}

// residual = inp1 + inp2, then out = norm(residual): the step between two blocks, one kernel.
inline void residual_norm_forward(const ModelConfig& c, floatX* residual, floatX* out, float* mean, float* rstd,
                                  const floatX* inp1, const floatX* inp2, const floatX* weight, const floatX* bias,
                                  int N, cudaStream_t s) {
    if (c.norm == NORM_RMSNORM)
        fused_residual_rmsnorm_forward(residual, out, rstd, inp1, inp2, weight, N, c.channels, (float)c.norm_eps, s);
    else fused_residual_layernorm_forward(residual, out, mean, rstd, inp1, inp2, weight, bias, N, c.channels, s);
}

// The MLP's activation: act (N, H) from fch (N, FC) (the GELU path fuses it into the fc matmul in
// the forward; this is the recompute's copy).
inline void mlp_activation_forward(const ModelConfig& c, floatX* act, const floatX* fch, int N, cudaStream_t s) {
    const int H = model_mlp_hidden(c);
    if (c.mlp == MLP_SWIGLU) swiglu_forward(act, fch, N, H, s);
    else gelu_forward(act, fch, (int64_t)N * H, s);
}
}  // namespace model_detail
