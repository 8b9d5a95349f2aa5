// model_fp8.cuh: the FP8 linear layers of --fp8 (docs/numerics.md, "FP8 in the trainer": the recipes,
// the bytes each fused cast saves, memory, the measurements). Inside every block the four linear
// layers (qkv, attproj, fc, fcproj; for Llama fc is SwiGLU's [gate | up]) run their three matmuls
// through llmc/matmul_fp8.cuh:
//   forward          Y  = X . W^T + b      X e4m3 (N, Cin), W e4m3 (OC, Cin)          fast accumulation
//   input gradient   dX = dY . W           dY e5m2 (or e4m3) (N, OC), W^T e4m3 (Cin, OC)
//   weight gradient  dW += dY^T . X        dY^T (OC, N), X^T e4m3 (Cin, N)
//                    or, with --fp8-wgrad bf16, the bf16 path's matmul on the bf16 dY and X (no X^T
//                    kept, no dY^T cast)
// Everything else stays bf16 (master weights, gradients, AdamW fp32), the output head too unless
// --fp8-head 1 (fp8_head_* at the end of this file).
// Casts: W once per step at current scaling, W (OC, Cin) and W^T (Cin, OC) from one read
// (fp8_cast_weights, or per layer), its scale the one its copies were cast with until the next cast;
// X in the forward (X (N, Cin) into a one-layer scratch, X^T (Cin, N) kept per layer); dY in the
// backward (dY (N, OC) and dY^T (OC, N), one-layer scratch). With fused casts (fp8_fused,
// llmc/fp8_fused.cuh) X's producer writes X and X^T, and dY's cast sums the bias gradient; where:
// fp8_norm_fused, fp8_gelu_fused, fp8_attention_x_fused, fp8_dq_fused. Scaling: Fp8Scaling.
// Memory (d12, N = B*T = 65536): kept X^T L * N * (3C + H) bytes = 3.94 GiB (none with --fp8-wgrad
// bf16); weight copies 2 bytes per linear parameter (~162 MiB); scratch N * (max Cin + 2 max OC)
// bytes = 0.56 GiB (dY^T's third none with bf16 wgrad); rowwise scales 4 * (L * sum(OC + 2 Cin) + 2N
// + 3 max(Cin, OC)) bytes (< 1 MiB). With the FP8 weight gradient everywhere the model keeps one
// slice of ln1, ln2 and the MLP activation (fp8_keeps_no_bf16_inputs; 6.2 GiB at d12).
// Shapes: N, C, H, QKV and FC multiples of 64 (the transposed cast's tile; covers cuBLASLt's 16).
// A forward of another row count (a HellaSwag batch) runs the bf16 matmuls, as the head does.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include "llmc/attention_layout.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/formats.h"
#include "llmc/fp8.cuh"
#include "llmc/fp8_fused.cuh"
#include "llmc/fused_classifier.cuh"
#include "llmc/gelu.cuh"
#include "llmc/model_config.h"
#include "llmc/matmul.cuh"
#include "llmc/matmul_fp8.cuh"
#include "llmc/utils.h"

// The scales of X and dY (--fp8-scaling), every one on the device (no host synchronization):
//   DELAYED  (default) the scale of the last --fp8-history steps' amaxes, the cast recording this one;
//            all updated in one launch after each backward (fp8_after_backward). A run's first step is
//            current (an empty history has no scale). The recipe that lets the casts fuse (fp8_fused).
//   CURRENT  fp8_amax pass, fp8_update_scales(history 1), cast: always separate passes.
//   ROWWISE  one scale per row along the dimension each matmul does not reduce over, from that row's
//            own amax, through cuBLASLt's outer-vector scales. --fp8-wgrad defaults to bf16 here: dW's
//            scales are per channel over all tokens, so one outlier token sets a whole channel's.
enum class Fp8Scaling { CURRENT, DELAYED, ROWWISE };
struct Fp8Settings {
    bool enabled = false;                  // --fp8
    Fp8Scaling scaling = Fp8Scaling::DELAYED;  // --fp8-scaling
    bool wgrad_bf16 = false;               // --fp8-wgrad bf16: the weight gradient's matmul in bf16
    Fp8Format grad = Fp8Format::E5M2;      // --fp8-grad
    int history = 16;                      // --fp8-history (delayed scaling's window, steps)
    int bf16_layers = 0;                   // --fp8-bf16-layers: the first and the last this many blocks stay bf16
    bool fast_accum = true;                // --fp8-fast-accum: the forward matmul's accumulation (the gradients' never)
    int linears = (1 << 4) - 1;            // --fp8-linears: bit k = Fp8Linear k in FP8
    bool fused = true;                     // --fp8-fused: under delayed scaling, the casts fused into their producers
    bool head = false;                     // --fp8-head: the output head's three matmuls in FP8 (fp8_head_*)
};

enum Fp8Linear { FP8_QKV, FP8_ATTPROJ, FP8_FC, FP8_FCPROJ, FP8_LINEARS };
// Meta blocks (role, layer, linear): X and DY adjacent so one launch updates both under delayed scaling.
enum Fp8Role { FP8_X, FP8_DY, FP8_W, FP8_ROLES };

struct ModelFp8 {
    Fp8Settings set;
    int L = 0, N = 0;                         // layers; rows the buffers were sized for (model B*T)
    bool gelu = false;                        // the MLP is fc -> GELU -> fcproj (not SwiGLU)
    bool layernorm = false;                   // the norms are LayerNorms (not RMSNorm)
    bool rope = false;                        // RoPE: its backward rewrites the bf16 dQ, dK after attention's
    int cin[FP8_LINEARS] = {}, oc[FP8_LINEARS] = {};
    size_t w_layer_bytes = 0, w_off[FP8_LINEARS] = {};   // per layer: each linear's W then W^T
    size_t xt_layer_bytes = 0, xt_off[FP8_LINEARS] = {};  // per layer: each linear's X^T (Cin, N)
    size_t max_cin = 0, max_oc = 0;
    uint8_t* weights = nullptr;  // (L, sum over linears of 2 * OC * Cin)
    uint8_t* xt = nullptr;       // (L, N * sum of Cin)
    uint8_t* x = nullptr;        // (N, max Cin) scratch: this linear's X for its forward matmul
    uint8_t* dy = nullptr;       // (N, max OC) scratch
    uint8_t* dyt = nullptr;      // (max OC, N) scratch; none with --fp8-wgrad bf16
    Fp8Meta* metas = nullptr;    // (FP8_ROLES, L, FP8_LINEARS): the per-tensor scales
    // rowwise scaling's scale_inv vectors (none under per-tensor scaling)
    size_t rs_layer_floats = 0, rs_off[FP8_LINEARS] = {};  // per layer: each linear's W (OC), W^T (Cin), X^T (Cin)
    float* rs = nullptr;          // (L, rs_layer_floats) kept: the weight copies' and X^T's
    float* rs_x = nullptr;        // (N) scratch: this linear's X rows
    float* rs_dy = nullptr;       // (N) scratch: dY rows
    float* rs_dyt = nullptr;      // (max OC) scratch: dY^T rows (dY's columns)
    float* rs_scratch = nullptr;  // (2 max(Cin, OC)) fp8_cast_transpose_colwise's column amaxes and scales
    int64_t weights_step = -1;   // model.step the weight copies were cast at (-1: none yet)
    bool warm = false;           // a backward has run: delayed scaling has amax history
    // --fp8-head (fp8_head_forward, fp8_head_classifier, fp8_head_backward below)
    int C = 0, V = 0, Vp = 0;    // channels, vocabulary, padded vocabulary
    uint8_t* head_w = nullptr;   // (Vp, C) e4m3 W, then (C, Vp) W^T: the head's weight (wte or lm_head)
    uint8_t* head_xt = nullptr;  // (C, N) e4m3 X^T, X = lnf's output (X itself goes through the f.x scratch)
    Fp8Meta* head_metas = nullptr;  // (FP8_ROLES): the head's X, dY (dlogits) and W
};

// Whether no backward reads the bf16 inputs of the FP8 linears (ln1, ln2, the MLP activation: every
// linear of every block FP8, the weight gradient from the kept X^T), so the model keeps one slice of them.
inline bool fp8_keeps_no_bf16_inputs(const Fp8Settings& s) {
    return s.enabled && !s.wgrad_bf16 && s.bf16_layers == 0 && s.linears == (1 << FP8_LINEARS) - 1;
}

// Whether linear k of block l runs in FP8 in an FP8 pass (--fp8-bf16-layers, --fp8-linears).
inline bool fp8_linear_on(const ModelFp8& f, int l, int k) {
    return l >= f.set.bf16_layers && l < f.L - f.set.bf16_layers && ((f.set.linears >> k) & 1);
}

// Whether the casts run fused into their producers (llmc/fp8_fused.cuh): they need the scale before the
// tensor exists (delayed scaling, after its first step) and the FP8 weight gradient (no bf16 X written).
inline bool fp8_fused(const ModelFp8& f) {
    return f.set.fused && f.set.scaling == Fp8Scaling::DELAYED && f.warm && !f.set.wgrad_bf16;
}
// Whether block l's GELU and GELU' run inside the FP8 casts (else gelu_forward, gelu_backward_inplace:
// the fc matmul writes the pre-activation, fcproj's input gradient d(GELU output)): fc and fcproj FP8.
inline bool fp8_gelu_fused(const ModelFp8& f, int l) {
    return f.gelu && fp8_fused(f) && fp8_linear_on(f, l, FP8_FC) && fp8_linear_on(f, l, FP8_FCPROJ);
}
// Whether the LayerNorm before linear k of block l (ln1 before qkv, ln2 before fc) writes that
// linear's e4m3 X and X^T itself (fp8_norm_forward, no bf16 output), so the linear skips its cast.
inline bool fp8_norm_fused(const ModelFp8& f, int l, int k) {
    return f.layernorm && fp8_fused(f) && (k == FP8_QKV || k == FP8_FC) && fp8_linear_on(f, l, k);
}

// Whether qkv's dY cast in block l may read dQ straight from the attention backward's fp32 scratch
// (DQ_ACCUM): fused casts, qkv in FP8, no RoPE (its backward rotates the bf16 dQ in place). The caller
// then asks the attention backward to keep dQ there (keep_dq; only its single-pass schedules do).
inline bool fp8_dq_fused(const ModelFp8& f, int l) { return fp8_fused(f) && !f.rope && fp8_linear_on(f, l, FP8_QKV); }

// FP8 tensor cores: compute capability 8.9 (Ada) or newer; the trainer calls it once its device is chosen.
inline void fp8_check_device(const cudaDeviceProp& p) {
    if (10 * p.major + p.minor < 89)
        fail("--fp8 1: %s is compute capability %d.%d; FP8 needs 8.9 or newer (Ada, Hopper, Blackwell)", p.name, p.major,
             p.minor);
}

// Sizes the buffers for a model of config c trained at N rows; fails on shapes the casts cannot take.
inline void fp8_plan(ModelFp8& f, const ModelConfig& c, int N) {
    const int C = c.channels, H = model_mlp_hidden(c);
    const int cin[FP8_LINEARS] = {C, C, C, H}, oc[FP8_LINEARS] = {model_qkv_channels(c), C, model_fc_channels(c), C};
    const char* names[FP8_LINEARS] = {"channels", "channels", "channels", "MLP hidden width"};
    const char* out_names[FP8_LINEARS] = {"qkv width", "channels", "fc width", "channels"};
    if (N % FP8_T_TILE != 0) fail("--fp8 1: batch * seq = %d must be a multiple of %d (the FP8 transposed casts)", N, FP8_T_TILE);
    f.L = c.num_layers;
    f.N = N;
    f.C = C;
    f.V = c.vocab_size;
    f.Vp = c.padded_vocab_size;
    if (f.set.head && f.Vp % FP8_T_TILE != 0)
        fail("--fp8-head 1: padded vocab %d must be a multiple of %d (the FP8 transposes)", f.Vp, FP8_T_TILE);
    f.gelu = c.mlp == MLP_GELU;
    f.layernorm = c.norm == NORM_LAYERNORM;
    f.rope = c.position == POS_ROPE;
    f.w_layer_bytes = f.xt_layer_bytes = f.max_cin = f.max_oc = f.rs_layer_floats = 0;
    for (int k = 0; k < FP8_LINEARS; k++) {
        if (cin[k] % FP8_T_TILE != 0) fail("--fp8 1: %s %d must be a multiple of %d", names[k], cin[k], FP8_T_TILE);
        if (oc[k] % FP8_T_TILE != 0) fail("--fp8 1: %s %d must be a multiple of %d", out_names[k], oc[k], FP8_T_TILE);
        f.cin[k] = cin[k];
        f.oc[k] = oc[k];
        f.w_off[k] = f.w_layer_bytes;
        f.w_layer_bytes += 2 * (size_t)oc[k] * cin[k];
        f.xt_off[k] = f.xt_layer_bytes;
        if (!f.set.wgrad_bf16) f.xt_layer_bytes += (size_t)N * cin[k];
        f.rs_off[k] = f.rs_layer_floats;  // multiples of 64 floats: each vector 16-byte aligned for cuBLASLt
        f.rs_layer_floats += (size_t)oc[k] + 2 * (size_t)cin[k];
        f.max_cin = std::max(f.max_cin, (size_t)cin[k]);
        f.max_oc = std::max(f.max_oc, (size_t)oc[k]);
        if (f.set.scaling == Fp8Scaling::ROWWISE && std::max(cin[k], oc[k]) > FP8_ROWWISE_MAX_C)
            fail("--fp8-scaling rowwise: %s %d is above %d, the widest row fp8_cast_rowwise holds in registers",
                 cin[k] > oc[k] ? names[k] : out_names[k], std::max(cin[k], oc[k]), FP8_ROWWISE_MAX_C);
    }
}

inline Fp8Meta* fp8_meta(const ModelFp8& f, Fp8Role r, int l, int k) { return f.metas + ((size_t)r * f.L + l) * FP8_LINEARS + k; }

// Scales start at 1 with empty histories; X and W in e4m3, dY in the gradient format. Also opts the
// FP8 LayerNorm in to its shared memory (outside any capture).
inline void fp8_init_metas(ModelFp8& f, const CudaContext& ctx) {
    auto init_roles = [&](Fp8Meta* m, int n) {  // metas (FP8_ROLES, n)
        fp8_meta_init(m + FP8_X * n, n, Fp8Format::E4M3, ctx.stream);
        fp8_meta_init(m + FP8_DY * n, n, f.set.grad, ctx.stream);
        fp8_meta_init(m + FP8_W * n, n, Fp8Format::E4M3, ctx.stream);
    };
    init_roles(f.metas, f.L * FP8_LINEARS);
    f.weights_step = -1;
    f.warm = false;
    if (f.layernorm && f.set.fused) layernorm_fp8_prepare(f.cin[FP8_QKV], ctx);  // before any graph capture
    if (f.set.head) {
        init_roles(f.head_metas, 1);
        fused_classifier_fp8_prepare(f.Vp, ctx);  // shared-memory opt-in before any capture (fails if it does not fit)
    }
}

// The scales in a checkpoint (llmc/formats.h, GPT8): every Fp8Meta as in device memory and the warm
// flag, so a resumed delayed-scaling run casts with the amax histories the uninterrupted run had (bit
// for bit: tests/gpu/test_fp8_parity.sh). The weight copies are recast by the first forward.
constexpr int64_t FP8_META_WORDS = sizeof(Fp8Meta) / sizeof(uint32_t);
inline int64_t fp8_meta_count(const ModelFp8& f) { return (int64_t)FP8_ROLES * f.L * FP8_LINEARS; }
inline void fp8_write_state(const ModelFp8& f, int64_t step, const std::string& path) {
    std::vector<uint32_t> words((size_t)(fp8_meta_count(f) * FP8_META_WORDS));
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(words.data(), f.metas, words.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    Fp8State st;
    st.step = step;
    st.records = fp8_meta_count(f);
    st.record_words = FP8_META_WORDS;
    st.warm = f.warm;
    fp8_state_write(path.c_str(), st, words.data());
}
// Loads a checkpoint's scales (path from fp8_state_file_to_read; "" when the checkpoint has none, as
// one of a bf16 run: then the first step uses current scaling, as a fresh run's does, and says so).
inline void fp8_read_state(ModelFp8& f, int64_t step, const std::string& path) {
    if (path.empty()) {
        if (f.set.scaling == Fp8Scaling::DELAYED)
            fprintf(stderr, "fp8: the checkpoint has no FP8 scales (a bf16 run's, or an earlier build's): the first step "
                    "uses current scaling, as a fresh run's\n");
        return;
    }
    std::vector<uint32_t> words;
    const Fp8State st = fp8_state_read(path.c_str(), fp8_meta_count(f), FP8_META_WORDS, &words);
    if (st.step != step)
        fail("%s: FP8 scales of step %lld in a checkpoint of step %lld", path.c_str(), (long long)st.step, (long long)step);
    cudaCheck(cudaDeviceSynchronize());  // fp8_init_metas ran on the model's stream
    cudaCheck(cudaMemcpy(f.metas, words.data(), words.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
    f.warm = st.warm != 0;
    f.weights_step = -1;
}

namespace fp8_detail {
// The FP8 build takes bf16 outputs; the FP32 build refuses --fp8 before anything runs (model_build),
// so these casts are never reached there.
inline __nv_bfloat16* bf16_ptr(floatX* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
inline const __nv_bfloat16* bf16_ptr(const floatX* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

inline bool rowwise(const ModelFp8& f) { return f.set.scaling == Fp8Scaling::ROWWISE; }
inline Fp8Scales scales(const ModelFp8& f) { return rowwise(f) ? Fp8Scales::ROWS : Fp8Scales::TENSOR; }
// What the matmul reads as an operand's scales: the tensor's scale_inv, or its row vector (rowwise).
inline const float* scale_inv_of(const ModelFp8& f, const Fp8Meta* meta, const float* rows) {
    return rowwise(f) ? rows : &meta->scale_inv;
}
inline bool current_scaling(const ModelFp8& f) { return f.set.scaling == Fp8Scaling::CURRENT || !f.warm; }
inline int history_len(const ModelFp8& f) { return f.set.scaling == Fp8Scaling::CURRENT ? 1 : f.set.history; }
}  // namespace fp8_detail

// The FP8 copies of in (R, C) in format `fmt`: out (R, C) for a matmul reducing over C and out_t
// (C, R) for one reducing over R (either may be null; one read writes both), under meta's scale.
// `current`: the scale is set from this tensor's amax first (history_len: 1, or delayed scaling's
// window during its first step); else the cast records its amax for the next update (delayed).
inline void fp8_cast_per_tensor(uint8_t* out_t, uint8_t* out, const floatX* in, int R, int C, Fp8Format fmt,
                                Fp8Meta* meta, bool current, int history_len, const CudaContext& ctx) {
    if (current) {
        fp8_amax(in, (size_t)R * C, meta, ctx);
        fp8_update_scales(meta, 1, history_len, 0, ctx.stream);
    }
    if (out_t) fp8_cast_transpose(out_t, out, in, R, C, fmt, meta, !current, ctx.stream);
    else fp8_cast(out, in, (size_t)R * C, fmt, meta, !current, ctx);
}
// The same under the model's scaling: rowwise, out with one scale per row (row_sinv (R) = their
// scale_invs), out_t with one per column of in (col_sinv (C)); meta, current and history_len unused.
inline void fp8_cast_scaled(const ModelFp8& f, uint8_t* out_t, uint8_t* out, const floatX* in, int R, int C,
                            Fp8Format fmt, Fp8Meta* meta, bool current, int history_len, float* row_sinv,
                            float* col_sinv, const CudaContext& ctx) {
    if (!fp8_detail::rowwise(f)) {
        fp8_cast_per_tensor(out_t, out, in, R, C, fmt, meta, current, history_len, ctx);
        return;
    }
    if (out) fp8_cast_rowwise(out, row_sinv, in, R, C, fmt, ctx.stream);
    if (out_t) fp8_cast_transpose_colwise(out_t, col_sinv, in, R, C, fmt, f.rs_scratch, ctx.stream);
}

// Linear k of layer l: its weight copies W (OC, Cin) and W^T (Cin, OC), its kept X^T (null with bf16
// wgrad), and under rowwise scaling their scale_inv vectors (null otherwise).
struct Fp8LinearBuffers {
    uint8_t *w8, *wt8, *xt8;
    float *w_rows, *wt_rows, *xt_rows;
};
inline Fp8LinearBuffers fp8_linear_buffers(const ModelFp8& f, int l, int k) {
    const int C = f.cin[k], OC = f.oc[k];
    Fp8LinearBuffers b;
    b.w8 = f.weights + (size_t)l * f.w_layer_bytes + f.w_off[k];
    b.wt8 = b.w8 + (size_t)OC * C;
    b.xt8 = f.set.wgrad_bf16 ? nullptr : f.xt + (size_t)l * f.xt_layer_bytes + f.xt_off[k];
    float* rs = fp8_detail::rowwise(f) ? f.rs + (size_t)l * f.rs_layer_floats + f.rs_off[k] : nullptr;
    b.w_rows = rs;
    b.wt_rows = rs ? rs + OC : nullptr;
    b.xt_rows = rs ? rs + OC + C : nullptr;
    return b;
}

// Every FP8 block's weight copies at the start of a step's first forward where all the weights are in
// place (not under ZeRO, whose layers fp8_linear_forward casts as they arrive) and the scaling is per
// tensor: the per-layer casts' kernels, scales and bytes in 9 launches instead of 144 at d12.
// weight[k]: linear k's weight of block 0, the blocks' OC * Cin apart.
inline bool fp8_weights_batched(const ModelFp8& f) { return f.set.scaling != Fp8Scaling::ROWWISE; }
inline void fp8_cast_weights(ModelFp8& f, const floatX* const (&weight)[FP8_LINEARS], const CudaContext& ctx) {
    cudaStream_t s = ctx.stream;
    const int lo = f.set.bf16_layers, hi = f.L - f.set.bf16_layers, n = hi - lo;
    if (n <= 0) return;
    for (int k = 0; k < FP8_LINEARS; k++) {
        if (!fp8_linear_on(f, lo, k)) continue;
        const size_t per = (size_t)f.oc[k] * f.cin[k];
        fp8_amax(weight[k] + lo * per, per, fp8_meta(f, FP8_W, lo, k), ctx, n, per, FP8_LINEARS);
    }
    // the W metas of blocks lo..hi-1 are consecutive; an unused linear's (amax 0) keeps its scale
    fp8_update_scales(fp8_meta(f, FP8_W, lo, 0), n * FP8_LINEARS, 1, 0, s);
    for (int k = 0; k < FP8_LINEARS; k++) {
        if (!fp8_linear_on(f, lo, k)) continue;
        const size_t per = (size_t)f.oc[k] * f.cin[k];
        const Fp8LinearBuffers b = fp8_linear_buffers(f, lo, k);
        const Fp8Batch batch{f.w_layer_bytes, per, FP8_LINEARS};
        fp8_cast_transpose(b.wt8, b.w8, weight[k] + lo * per, f.oc[k], f.cin[k], Fp8Format::E4M3, fp8_meta(f, FP8_W, lo, k),
                           false, s, n, batch);
    }
}

// Linear k of layer l in FP8: out (N, OC) = inp (N, Cin) W^T + bias; with gelu_pre, gelu_pre = that
// and out = GELU(gelu_pre). Casts the weight first when `cast_weight` (a new step); keeps X^T (unless
// the weight gradient is bf16). inp is not read where X and X^T are in place already: fcproj's where
// fp8_gelu_fused (fc casts its GELU output into them and does not write `out`), the norm's output
// where fp8_norm_fused (fp8_norm_forward), and with x_cast (the attention's: fp8_attention_x).
inline void fp8_linear_forward(ModelFp8& f, int l, int k, floatX* out, floatX* gelu_pre, const floatX* inp,
                               const floatX* weight, const floatX* bias, int N, bool cast_weight, const CudaContext& ctx,
                               bool x_cast = false) {
    using namespace fp8_detail;
    const int C = f.cin[k], OC = f.oc[k];
    const Fp8LinearBuffers b = fp8_linear_buffers(f, l, k);
    Fp8Meta *wm = fp8_meta(f, FP8_W, l, k), *xm = fp8_meta(f, FP8_X, l, k);
    const bool gelu_fused = fp8_gelu_fused(f, l);
    if (cast_weight)
        fp8_cast_scaled(f, b.wt8, b.w8, weight, OC, C, Fp8Format::E4M3, wm, true, 1, b.w_rows, b.wt_rows, ctx);
    if (!x_cast && !(k == FP8_FCPROJ && gelu_fused) && !fp8_norm_fused(f, l, k))  // else fc's GELU cast or the norm wrote f.x, X^T
        fp8_cast_scaled(f, b.xt8, f.x, inp, N, C, Fp8Format::E4M3, xm, current_scaling(f), history_len(f), f.rs_x,
                        b.xt_rows, ctx);
    floatX* y = gelu_pre ? gelu_pre : out;
    matmul_fp8_forward(bf16_ptr(y), f.x, scale_inv_of(f, xm, f.rs_x), b.w8, scale_inv_of(f, wm, b.w_rows),
                       bf16_ptr(bias), N, C, OC, scales(f), ctx, f.set.fast_accum);
    if (gelu_pre && k == FP8_FC && gelu_fused)  // fcproj's X from the pre-activation (f.x is free again in stream order)
        fp8_cast_transpose_fused(fp8_linear_buffers(f, l, FP8_FCPROJ).xt8, f.x, gelu_pre, nullptr, N, OC, Fp8Format::E4M3,
                                 fp8_meta(f, FP8_X, l, FP8_FCPROJ), Fp8Prologue::GELU_FORWARD, nullptr, nullptr,
                                 ctx.stream);
    else if (gelu_pre) gelu_forward(out, gelu_pre, (int64_t)N * OC, ctx.stream);
}

// The backward of fp8_linear_forward: dinp (N, Cin) = dout W (=), or with gelu_pre the gradient
// w.r.t. the pre-activation (dinp = dGELU(dout W)); dweight += dout^T X (FP8 from the kept X^T, or
// with --fp8-wgrad bf16 from the bf16 inp (N, Cin)); dbias += column sums of dout (bf16, scratch:
// column_num_chunks(N) * OC floats; with fused casts summed by dY's cast). Where fp8_gelu_fused:
// fcproj leaves dinp = d(GELU output), and fc takes it as dout with dout_gelu_pre = the
// pre-activation (its dY = dout * GELU'(pre), formed in its cast). dq (qkv only, where fp8_dq_fused,
// as attention_backward returned it): dout's dQ columns were left unwritten, the cast forms them.
inline void fp8_linear_backward(ModelFp8& f, int l, int k, floatX* dinp, floatX* dweight, floatX* dbias, float* scratch,
                                const floatX* dout, const floatX* inp, const floatX* gelu_pre, int N,
                                const CudaContext& ctx, const floatX* dout_gelu_pre = nullptr,
                                const Fp8DqAccum& dq = {}) {
    using namespace fp8_detail;
    const int C = f.cin[k], OC = f.oc[k];
    const Fp8LinearBuffers b = fp8_linear_buffers(f, l, k);
    Fp8Meta *wm = fp8_meta(f, FP8_W, l, k), *xm = fp8_meta(f, FP8_X, l, k), *dm = fp8_meta(f, FP8_DY, l, k);
    const bool wgrad_fp8 = !f.set.wgrad_bf16, fused = fp8_fused(f), gelu_fused = fp8_gelu_fused(f, l);
    if (dout_gelu_pre && !(k == FP8_FC && gelu_fused))
        fail("fp8_linear_backward: a d(GELU output) for linear %d of block %d, where the GELU is not fused", k, l);
    if (dq.accum && !(k == FP8_QKV && fp8_dq_fused(f, l)))
        fail("fp8_linear_backward: dQ sums for linear %d of block %d, where qkv's dY cast does not take them", k, l);
    if (fused)  // wgrad_fp8 here: dY and dY^T
        fp8_cast_transpose_fused(f.dyt, f.dy, dout, dout_gelu_pre, N, OC, f.set.grad, dm,
                                 dout_gelu_pre ? Fp8Prologue::GELU_BACKWARD
                                 : dq.accum    ? Fp8Prologue::DQ_ACCUM
                                               : Fp8Prologue::NONE,
                                 dbias, scratch, ctx.stream, dq);
    else
        fp8_cast_scaled(f, wgrad_fp8 ? f.dyt : nullptr, f.dy, dout, N, OC, f.set.grad, dm, current_scaling(f),
                        history_len(f), f.rs_dy, f.rs_dyt, ctx);
    matmul_fp8_backward_input(bf16_ptr(dinp), f.dy, f.set.grad, scale_inv_of(f, dm, f.rs_dy), b.wt8,
                              scale_inv_of(f, wm, b.wt_rows), N, C, OC, scales(f), ctx);
    if (gelu_pre && !(k == FP8_FCPROJ && gelu_fused)) gelu_backward_inplace(dinp, gelu_pre, (int64_t)N * C, ctx.stream);
    if (wgrad_fp8)
        matmul_fp8_backward_weight(bf16_ptr(dweight), f.dyt, f.set.grad, scale_inv_of(f, dm, f.rs_dyt), b.xt8,
                                   scale_inv_of(f, xm, b.xt_rows), N, C, OC, scales(f), ctx);
    else
        matmul_backward_weight(dweight, dout, inp, N, C, OC, ctx);
    if (dbias && !fused) bias_backward(dbias, scratch, dout, N, OC, ctx.stream);
}

// Whether block l's attention writes attproj's e4m3 X and X^T itself (AttnFp8Out, the Hopper forward's
// epilogue; the caller also checks that the attention can at this T): fused casts, attproj in FP8.
inline bool fp8_attention_x_fused(const ModelFp8& f, int l) { return fp8_fused(f) && fp8_linear_on(f, l, FP8_ATTPROJ); }
// Where: X into the f.x scratch, X^T kept, at attproj's delayed scale, its amax recorded.
inline AttnFp8Out fp8_attention_x(const ModelFp8& f, int l, int N) {
    Fp8Meta* xm = fp8_meta(f, FP8_X, l, FP8_ATTPROJ);
    AttnFp8Out o;
    o.x = f.x;
    o.xt = fp8_linear_buffers(f, l, FP8_ATTPROJ).xt8;
    o.scale = &xm->scale;
    o.amax_bits = &xm->amax_bits;
    o.rows = N;
    return o;
}

// The norm before linear k of block l where fp8_norm_fused: LayerNorm of inp1 (with inp2: of
// residual = inp1 + inp2) into the linear's e4m3 X (the f.x scratch) and kept X^T; mean, rstd (and
// residual) as the bf16 norm writes them.
inline void fp8_norm_forward(ModelFp8& f, int l, int k, floatX* residual, float* mean, float* rstd, const floatX* inp1,
                             const floatX* inp2, const floatX* weight, const floatX* bias, int N, const CudaContext& ctx) {
    layernorm_fp8_forward(fp8_linear_buffers(f, l, k).xt8, f.x, residual, mean, rstd, inp1, inp2, weight, bias, N,
                          f.cin[k], fp8_meta(f, FP8_X, l, k), ctx);
}

// After each backward: delayed scaling folds the amaxes the casts recorded into the histories (all X
// and dY tensors, one launch); the first backward ends the current-scaling warm-up.
inline void fp8_after_backward(ModelFp8& f, cudaStream_t s) {
    if (f.set.scaling == Fp8Scaling::DELAYED && f.warm)
        fp8_update_scales(fp8_meta(f, FP8_X, 0, 0), 2 * f.L * FP8_LINEARS, f.set.history, 0, s);
    f.warm = true;
}

// ============================================================================ the output head
// --fp8-head 1 (docs/numerics.md, "The output head in FP8"): logits (N, Vp) = X W^T with X = lnf's
// output (N, C) and W the head's weight (Vp, C) (wte when tied), in three FP8 matmuls:
//   forward          logits = X . W^T      X e4m3 (N, C) (f.x scratch), W e4m3 (Vp, C)               K = C
//   input gradient   dX = dlogits . W      dlogits (N, Vp) at a row pitch of 2 Vp bytes, W^T (C, Vp)  K = Vp
//   weight gradient  dW += dlogits^T . X   dlogits^T chunks (fp8_head_backward), X^T e4m3 (C, N)      K = N
// Scales per tensor under every --fp8-scaling, none kept across steps (nothing in checkpoints): W and
// X current (W once per step); dlogits (--fp8-grad's format) fixed, as |dloss * (softmax - onehot)| <=
// dloss: the largest power of two with dloss * scale <= the format's max (cpu::fp8_pow2_scale), known
// before the classifier writes the FP8 dlogits in place (fused_classifier_fp8).
// Memory: W and W^T 2 Vp C bytes (77 MB at GPT-2), X^T N C (50 MB at N = 65536); the FP8 dlogits and
// the dlogits^T chunks live in the bf16 logits buffer (N x 2 Vp bytes).

// The head's forward: logits (N, Vp) bf16 (=) from lnf (N, C) bf16 and weight (Vp, C) bf16; casts the
// weight first when cast_weight (a new step). Keeps X^T for the backward.
inline void fp8_head_forward(ModelFp8& f, floatX* logits, const floatX* lnf, const floatX* weight, int N, bool cast_weight,
                             const CudaContext& ctx) {
    using namespace fp8_detail;
    const int C = f.C, Vp = f.Vp;
    Fp8Meta *wm = f.head_metas + FP8_W, *xm = f.head_metas + FP8_X;
    uint8_t *w8 = f.head_w, *wt8 = f.head_w + (size_t)Vp * C;
    if (cast_weight) fp8_cast_per_tensor(wt8, w8, weight, Vp, C, Fp8Format::E4M3, wm, true, 1, ctx);
    fp8_cast_per_tensor(f.head_xt, f.x, lnf, N, C, Fp8Format::E4M3, xm, true, 1, ctx);
    matmul_fp8_forward(bf16_ptr(logits), f.x, &xm->scale_inv, w8, &wm->scale_inv, nullptr, N, C, Vp, Fp8Scales::TENSOR,
                       ctx, f.set.fast_accum);
}

// The classifier of an FP8 head: losses (N) as fused_classifier, the gradient as FP8 dlogits in place
// of the logits (row r's Vp bytes at byte r * 2 Vp), scale in the head's dY meta.
inline void fp8_head_classifier(ModelFp8& f, floatX* logits, float* losses, const int* targets, float dloss, int N,
                                const CudaContext& ctx) {
    fused_classifier_fp8(logits, losses, targets, dloss, N, f.V, f.Vp, f.set.grad, f.head_metas + FP8_DY, ctx);
}

// The head's backward from the FP8 dlogits fp8_head_classifier left in `logits`: dinp (N, C) = dlogits W
// (=), dweight (Vp, C) += dlogits^T X (bf16, fp32 accumulation).
// The weight gradient's operands must both be K-major (cuBLASLt's TN layout), K = N: dlogits^T (Vp, N),
// 3.3 GB at N = 65536, goes into the free second half of every 2 Vp-byte logits row (row v of a chunk
// in logits row v), so a chunk holds at most N vocabulary rows of at most Vp tokens: chunks of min(Vp,
// N) rows by ceil(N / Vp) token ranges (N = 65536, Vp 50304: all rows, 2 x 32768 tokens). Each chunk:
// fp8_transpose of its (tokens, rows) block, then dweight[rows] += chunk . X^T[:, tokens] (pitch N).
inline void fp8_head_backward(ModelFp8& f, floatX* dinp, floatX* dweight, floatX* logits, int N, const CudaContext& ctx) {
    using namespace fp8_detail;
    const int C = f.C, Vp = f.Vp;
    Fp8Meta *wm = f.head_metas + FP8_W, *xm = f.head_metas + FP8_X, *dm = f.head_metas + FP8_DY;
    uint8_t* d8 = reinterpret_cast<uint8_t*>(logits);
    const int64_t pitch = (int64_t)Vp * sizeof(floatX);  // bytes of a logits row: 2 Vp
    const uint8_t* wt8 = f.head_w + (size_t)Vp * C;
    matmul_fp8(bf16_ptr(dinp), d8, f.set.grad, &dm->scale_inv, wt8, Fp8Format::E4M3, &wm->scale_inv, N, C, Vp, nullptr,
               0.0f, false, Fp8Scales::TENSOR, ctx, pitch, 0);
    const int rows = std::min(Vp, N);                                          // vocabulary rows a chunk
    const int ranges = ceil_div(N, Vp);                                        // token ranges
    const int tokens = ceil_div(ceil_div(N, ranges), FP8_T_TILE) * FP8_T_TILE;  // <= Vp (a multiple of 64)
    uint8_t* t8 = d8 + Vp;  // the chunk (rows, tokens): row v at t8 + v * pitch
    for (int v0 = 0; v0 < Vp; v0 += rows) {
        const int vr = std::min(rows, Vp - v0);
        for (int n0 = 0; n0 < N; n0 += tokens) {
            const int nt = std::min(tokens, N - n0);
            fp8_transpose(t8, pitch, d8 + (int64_t)n0 * pitch + v0, pitch, nt, vr, ctx.stream);
            matmul_fp8(bf16_ptr(dweight + (size_t)v0 * C), t8, f.set.grad, &dm->scale_inv, f.head_xt + n0,
                       Fp8Format::E4M3, &xm->scale_inv, vr, C, nt, nullptr, 1.0f, false, Fp8Scales::TENSOR, ctx, pitch, N);
        }
    }
}
