// adamw.cuh: torch.optim.AdamW over all parameters in one launch (one contiguous buffer).
// fp32 master weights and moments; grads floatX. Per element, with g = grads * grad_scale (the
// clip factor) and t = step (1-based), in torch's exact formulation (as llmc/cpu/adamw.h):
//   p *= 1 - lr * wd            (only inside the decayed ranges: embeddings and weight matrices)
//   m = lerp(m, g, 1 - b1);  v = b2 v + (1 - b2) g^2
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// master, m, v updated in place (=); params = master rounded to floatX. In the bf16 build the
// rounding is stochastic (unbiased: small updates are not lost to round-to-nearest), driven by a
// hash of (seed, index) so it is reproducible and a resumed run rounds the same way; with
// stochastic = false (a lab comparison) to nearest. In the FP32 build master aliases params.
// The step's scalars (AdamWArgs) live in device memory and the kernel reads them there, so a
// captured CUDA graph (llmc/model_graph.cuh) replays the update with each step's values, and the
// clip factor is computed on the device from the gradient norm (adamw_clip_scale): no host wait.
#pragma once
#include <cmath>
#include <type_traits>
#include "llmc/cuda_common.cuh"
#include "llmc/model_config.h"

struct AdamWArgs {
    float step_size;  // lr / (1 - b1^t); the bias corrections are computed in double, as PyTorch does
    float bc2_sqrt;   // sqrt(1 - b2^t)
    float decay;      // 1 - lr * wd
    float beta1, beta2, eps;
    float grad_scale;  // min(1, clip / (norm + 1e-6)), or 1; adamw_clip_scale writes it on the device
    uint64_t seed;     // stochastic-rounding seed of this step
    bool stochastic = true;  // bf16 build: false = params rounded to nearest instead
};

inline AdamWArgs adamw_args(float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                            int64_t step, uint64_t seed) {
    const double bc1 = 1.0 - std::pow((double)beta1, (double)step), bc2 = 1.0 - std::pow((double)beta2, (double)step);
    return AdamWArgs{(float)(lr / bc1), (float)std::sqrt(bc2), (float)(1.0 - (double)lr * weight_decay), beta1, beta2,
                     eps, grad_scale, seed};
}

// Half-open element ranges [begin, end) that get weight decay, one per decayed tensor.
struct DecayRanges {
    int count = 0;
    int64_t begin[NUM_PARAM_TENSORS], end[NUM_PARAM_TENSORS];
};

__device__ inline uint32_t hash_index(uint64_t seed, uint64_t i) {  // splitmix64 finalizer
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}

// Rounds fp32 to bf16 up or down with probability proportional to the distance: adds 16 random
// bits below the bf16 mantissa and truncates.
__device__ inline __nv_bfloat16 stochastic_round_bf16(float x, uint32_t rnd) {
    const uint32_t bits = __float_as_uint(x) + (rnd & 0xFFFFu);
    __nv_bfloat16_raw r;
    r.x = (unsigned short)(bits >> 16);
    return __nv_bfloat16(r);
}

// V consecutive elements per thread (V = 4: 16-byte loads and stores of m, v and master, 8-byte ones
// of the bf16 grads; V = 1 where the slice's start, length or pointers do not allow it). Reads g, m,
// v, master (14 B an element in bf16), writes m, v, master, param (14 B): ~3.5 GB per step for
// GPT-2 124M, memory-bound. Measured: docs/perf.md, "Memory-bound kernels" (V = 1: dev/cuda/adamw.cu).
// Element i of the launch is parameter `begin + i`: params is the whole buffer, grads, master, m
// and v hold the updated slice only (a ZeRO shard, llmc/zero.h); the decay ranges and the rounding
// hash use the parameter's index, so a slice rounds exactly as the whole buffer does, and every V
// rounds alike (each element is tested against the decay ranges on its own).
// `args` is in device memory (every thread reads the same 40 bytes: one L1 broadcast).
template <int V>
static __global__ void adamw_fused(floatX* params, float* master, const floatX* grads, float* m, float* v,
                                   int64_t begin, int64_t n, const AdamWArgs* __restrict__ args, DecayRanges decay) {
    static_assert(V == 1 || V == 4, "adamw_fused: 1 or 4 elements a thread");
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i >= n) return;
    const AdamWArgs a = *args;
    float g[V], p[V], mi[V], vi[V];
    if constexpr (V == 4) {
        const float4 m4 = *reinterpret_cast<const float4*>(m + i), v4 = *reinterpret_cast<const float4*>(v + i);
        const float4 p4 = *reinterpret_cast<const float4*>(master + i);
        mi[0] = m4.x, mi[1] = m4.y, mi[2] = m4.z, mi[3] = m4.w;
        vi[0] = v4.x, vi[1] = v4.y, vi[2] = v4.z, vi[3] = v4.w;
        p[0] = p4.x, p[1] = p4.y, p[2] = p4.z, p[3] = p4.w;
        floatX gx[4];
        if constexpr (sizeof(floatX) == 2) *reinterpret_cast<uint2*>(gx) = *reinterpret_cast<const uint2*>(grads + i);
        else *reinterpret_cast<float4*>(gx) = *reinterpret_cast<const float4*>(grads + i);
        for (int e = 0; e < 4; e++) g[e] = to_float(gx[e]);
    } else {
        mi[0] = m[i], vi[0] = v[i], p[0] = master[i], g[0] = to_float(grads[i]);
    }
    for (int e = 0; e < V; e++) {
        const int64_t k = begin + i + e;
        const float ge = g[e] * a.grad_scale;
        bool decays = false;
        for (int r = 0; r < decay.count; r++) decays |= (k >= decay.begin[r] && k < decay.end[r]);
        if (decays) p[e] *= a.decay;
        mi[e] = mi[e] + (1.0f - a.beta1) * (ge - mi[e]);
        vi[e] = vi[e] * a.beta2 + (1.0f - a.beta2) * ge * ge;
        p[e] -= a.step_size * (mi[e] / (sqrtf(vi[e]) / a.bc2_sqrt + a.eps));
    }
    if constexpr (V == 4) {
        *reinterpret_cast<float4*>(m + i) = make_float4(mi[0], mi[1], mi[2], mi[3]);
        *reinterpret_cast<float4*>(v + i) = make_float4(vi[0], vi[1], vi[2], vi[3]);
        *reinterpret_cast<float4*>(master + i) = make_float4(p[0], p[1], p[2], p[3]);
    } else {
        m[i] = mi[0], v[i] = vi[0], master[i] = p[0];
    }
    for (int e = 0; e < V; e++) {  // after master's store: in the fp32 build params is master
        const int64_t k = begin + i + e;
        if constexpr (std::is_same<floatX, float>::value) params[k] = p[e];
        else if (a.stochastic) params[k] = stochastic_round_bf16(p[e], hash_index(a.seed, (uint64_t)k));
        else params[k] = from_float<floatX>(p[e]);
    }
}

// torch's clip_grad_norm_ factor from the squared norm, on the device: args->grad_scale =
// min(1, clip / (sqrt(norm_sq) + 1e-6)), or 1 when clip <= 0. The rule of cpu::grad_clip_scale
// (llmc/cpu/global_norm.h) in IEEE round-to-nearest intrinsics, so that --use_fast_math's approximate
// sqrt and division do not apply and the factor has the host's exact bits. One thread.
static __global__ void adamw_clip_scale_kernel(AdamWArgs* args, const float* norm_sq, float clip) {
    const float norm = __fsqrt_rn(*norm_sq);
    const float coef = clip <= 0.0f ? 1.0f : __fdiv_rn(clip, __fadd_rn(norm, 1e-6f));
    args->grad_scale = coef < 1.0f ? coef : 1.0f;
}

inline void adamw_clip_scale(AdamWArgs* args, const float* norm_sq, float clip, cudaStream_t stream) {
    adamw_clip_scale_kernel<<<1, 1, 0, stream>>>(args, norm_sq, clip);
    cudaCheckLaunch();
}

// Updates parameters [begin, end): grads, master, m, v point at the slice's first element's; args
// (device memory) holds the step's scalars.
inline void adamw_update_range(floatX* params, float* master, const floatX* grads, float* m, float* v, int64_t begin,
                               int64_t end, const AdamWArgs* args, const DecayRanges& decay, cudaStream_t stream) {
    const int block = 512;
    const int64_t n = end - begin;
    if (n <= 0) return;
    auto aligned = [](const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; };
    if (n % 4 == 0 && aligned(master, 16) && aligned(m, 16) && aligned(v, 16) && aligned(grads, 4 * sizeof(floatX)))
        adamw_fused<4><<<(unsigned)ceil_div<int64_t>(n / 4, block), block, 0, stream>>>(params, master, grads, m, v,
                                                                                        begin, n, args, decay);
    else
        adamw_fused<1><<<(unsigned)ceil_div<int64_t>(n, block), block, 0, stream>>>(params, master, grads, m, v, begin,
                                                                                    n, args, decay);
    cudaCheckLaunch();
}

inline void adamw_update(floatX* params, float* master, const floatX* grads, float* m, float* v, int64_t n,
                         const AdamWArgs* args, const DecayRanges& decay, cudaStream_t stream) {
    adamw_update_range(params, master, grads, m, v, 0, n, args, decay, stream);
}

// The decayed ranges of the GPT-2 layout (model_param_decays), offsets in elements.
inline DecayRanges model_decay_ranges(const ModelConfig& c) {
    size_t sizes[NUM_PARAM_TENSORS], offsets[NUM_PARAM_TENSORS];
    model_param_sizes(c, sizes);
    model_param_offsets(c, offsets);
    DecayRanges r;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        if (model_param_decays(i)) {
            r.begin[r.count] = (int64_t)offsets[i];
            r.end[r.count] = (int64_t)(offsets[i] + sizes[i]);
            r.count++;
        }
    return r;
}
