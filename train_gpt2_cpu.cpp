// train_gpt2_cpu.cpp: the CPU reference trainer. fp32 GPT-2 forward, backward and AdamW with
// OpenMP, built from the layer ops in llmc/cpu/ (the same ones the GPU tests and the kernel lab
// use as their reference). Semantics are PyTorch's (docs/design.md): mean cross-entropy, gradient
// accumulation over total_batch / (B*T) micro-batches, global-norm clipping, AdamW with decay on
// matrices and embeddings only, warmup + cosine / linear / constant / wsd learning rate.
// Sections: config, params, activations, forward, backward, update, checkpoints, sampling,
// training loop. test_gpt2_cpu.cpp includes this file with TESTING defined to reuse the model.
//
//   make build/train_gpt2_cpu
//   OMP_NUM_THREADS=2 build/train_gpt2_cpu --train "data/tinyshakespeare/*_train.bin"
//       --val "data/tinyshakespeare/*_val.bin" --tokenizer data/gpt2_tokenizer.bin --init d4 --steps 200
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>
#include "llmc/cpu/adamw.h"
#include "llmc/cpu/attention.h"
#include "llmc/cpu/crossentropy.h"
#include "llmc/cpu/encoder.h"
#include "llmc/cpu/gelu.h"
#include "llmc/cpu/global_norm.h"
#include "llmc/cpu/layernorm.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/residual.h"
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/formats.h"
#include "llmc/gpt2_config.h"
#include "llmc/rand.h"
#include "llmc/sampler.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"
#include "llmc/train_config.h"
#include "llmc/utils.h"

// ------------------------------------------------------------------------------------------------
// config: the model's shape is a GPT2Config (llmc/gpt2_config.h), read from a checkpoint or made
// from a dN descriptor; the run's settings are a TrainConfig (llmc/train_config.h).

// ------------------------------------------------------------------------------------------------
// params: the 16 tensors of docs/design.md, views into one contiguous buffer. Gradients and the
// AdamW moments are buffers of the same length and layout, so one offset table serves them all.
struct ParamTensors {
    float* wte;       // (Vp, C)
    float* wpe;       // (maxT, C)
    float* ln1w;      // (L, C)
    float* ln1b;      // (L, C)
    float* qkvw;      // (L, QKV, C), QKV = (NH + 2*NKV) * HD
    float* qkvb;      // (L, QKV)
    float* attprojw;  // (L, C, C)
    float* attprojb;  // (L, C)
    float* ln2w;      // (L, C)
    float* ln2b;      // (L, C)
    float* fcw;       // (L, 4C, C)
    float* fcb;       // (L, 4C)
    float* fcprojw;   // (L, C, 4C)
    float* fcprojb;   // (L, C)
    float* lnfw;      // (C)
    float* lnfb;      // (C)
};
static_assert(sizeof(ParamTensors) == NUM_PARAM_TENSORS * sizeof(float*), "one pointer per parameter tensor");

ParamTensors point_param_tensors(float* base, const GPT2Config& c) {
    size_t off[NUM_PARAM_TENSORS];
    gpt2_param_offsets(c, off);
    ParamTensors t;
    float** slots[NUM_PARAM_TENSORS] = {&t.wte,  &t.wpe,      &t.ln1w,     &t.ln1b,    &t.qkvw,    &t.qkvb,
                                        &t.attprojw, &t.attprojb, &t.ln2w,  &t.ln2b,    &t.fcw,     &t.fcb,
                                        &t.fcprojw,  &t.fcprojb,  &t.lnfw,  &t.lnfb};
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) *slots[i] = base + off[i];
    return t;
}

// ------------------------------------------------------------------------------------------------
// activations: everything the backward pass reads, for the B, T the model was sized for. Per-layer
// buffers are (L, ...) with layer l at offset l * (one layer's size).
struct Activations {
    std::vector<float> encoded;    // (B, T, C)
    std::vector<float> ln1;        // (L, B, T, C)
    std::vector<float> ln1_mean;   // (L, B, T)
    std::vector<float> ln1_rstd;   // (L, B, T)
    std::vector<float> qkv;        // (L, B, T, QKV)
    std::vector<float> atty;       // (L, B, T, C)
    std::vector<float> att_lse;    // (L, B, NH, T)
    std::vector<float> attproj;    // (L, B, T, C)
    std::vector<float> residual2;  // (L, B, T, C)
    std::vector<float> ln2;        // (L, B, T, C)
    std::vector<float> ln2_mean;   // (L, B, T)
    std::vector<float> ln2_rstd;   // (L, B, T)
    std::vector<float> fch;        // (L, B, T, 4C)
    std::vector<float> fch_gelu;   // (L, B, T, 4C)
    std::vector<float> fcproj;     // (L, B, T, C)
    std::vector<float> residual3;  // (L, B, T, C)
    std::vector<float> lnf;        // (B, T, C)
    std::vector<float> lnf_mean;   // (B, T)
    std::vector<float> lnf_rstd;   // (B, T)
    std::vector<float> logits;     // (B, T, Vp)
    std::vector<float> probs;      // (B, T, Vp); the backward overwrites it with dlogits
    std::vector<float> losses;     // (B, T)
};

// Gradients of one layer's activations: the backward walks the layers in reverse and reuses
// these, so their size does not grow with L. dresidual carries the residual stream's gradient.
struct ActivationGrads {
    std::vector<float> dresidual;  // (B, T, C)
    std::vector<float> dlnf;       // (B, T, C), also dln1 / dln2 of the current layer
    std::vector<float> dqkv;       // (B, T, QKV)
    std::vector<float> datty;      // (B, T, C)
    std::vector<float> dfch;       // (B, T, 4C)
    std::vector<float> dfch_gelu;  // (B, T, 4C)
};

struct GPT2 {
    GPT2Config config;
    size_t num_params = 0;
    std::vector<float> params_memory, grads_memory, m_memory, v_memory;  // (num_params) each
    ParamTensors params, grads;
    int B = 0, T = 0;         // the shape the activations were allocated for
    int cur_B = 0, cur_T = 0; // the shape of the last forward
    Activations acts;
    ActivationGrads dacts;
};

void gpt2_allocate_params(GPT2& m, const GPT2Config& c) {
    m.config = c;
    m.num_params = gpt2_num_params(c);
    m.params_memory.assign(m.num_params, 0.0f);
    m.grads_memory.assign(m.num_params, 0.0f);
    m.m_memory.assign(m.num_params, 0.0f);
    m.v_memory.assign(m.num_params, 0.0f);
    m.params = point_param_tensors(m.params_memory.data(), c);
    m.grads = point_param_tensors(m.grads_memory.data(), c);
}

// `init` is a model checkpoint path (any file, or a name ending in .bin) or a dN descriptor;
// `cfg` supplies --kv-heads and --window (a fresh model's shape, a file's values to confirm).
void gpt2_init(GPT2& m, const std::string& init, const TrainConfig& cfg) {
    if (file_exists(init.c_str()) || (init.size() > 4 && init.compare(init.size() - 4, 4, ".bin") == 0)) {
        ModelFileInfo info = model_read_info(init.c_str());
        apply_attention_flags(info.config, cfg, false, init.c_str());
        gpt2_allocate_params(m, info.config);
        model_read_fp32(init.c_str(), m.params_memory.data());
    } else {
        GPT2Config c = gpt2_config_from_descriptor(init.c_str());
        apply_attention_flags(c, cfg, true, init.c_str());
        gpt2_allocate_params(m, c);
        gpt2_init_params(m.params_memory.data(), m.config, cfg.seed);
    }
}

void gpt2_allocate_activations(GPT2& m, int B, int T) {
    const GPT2Config& c = m.config;
    if (T > c.max_seq_len) fail("--seq: %d is longer than the model's max_seq_len %d", T, c.max_seq_len);
    const size_t L = c.num_layers, C = c.channels, NH = c.num_heads, Vp = c.padded_vocab_size;
    const size_t BT = (size_t)B * T, QKV = gpt2_qkv_channels(c);
    Activations& a = m.acts;
    a.encoded.resize(BT * C);
    a.ln1.resize(L * BT * C);
    a.ln1_mean.resize(L * BT);
    a.ln1_rstd.resize(L * BT);
    a.qkv.resize(L * BT * QKV);
    a.atty.resize(L * BT * C);
    a.att_lse.resize(L * BT * NH);
    a.attproj.resize(L * BT * C);
    a.residual2.resize(L * BT * C);
    a.ln2.resize(L * BT * C);
    a.ln2_mean.resize(L * BT);
    a.ln2_rstd.resize(L * BT);
    a.fch.resize(L * BT * 4 * C);
    a.fch_gelu.resize(L * BT * 4 * C);
    a.fcproj.resize(L * BT * C);
    a.residual3.resize(L * BT * C);
    a.lnf.resize(BT * C);
    a.lnf_mean.resize(BT);
    a.lnf_rstd.resize(BT);
    a.logits.resize(BT * Vp);
    a.probs.resize(BT * Vp);
    a.losses.resize(BT);
    ActivationGrads& d = m.dacts;
    d.dresidual.resize(BT * C);
    d.dlnf.resize(BT * C);
    d.dqkv.resize(BT * QKV);
    d.datty.resize(BT * C);
    d.dfch.resize(BT * 4 * C);
    d.dfch_gelu.resize(BT * 4 * C);
    m.B = B;
    m.T = T;
}

// ------------------------------------------------------------------------------------------------
// forward: inputs, targets (B, T) ids < V; targets may be nullptr (sampling: logits and probs
// only). B, T may be smaller than the allocated shape. Returns the mean loss (0 without targets).
float gpt2_forward(GPT2& m, const int* inputs, const int* targets, int B, int T) {
    const GPT2Config& c = m.config;
    if (B > m.B || T > m.T) fail("internal: forward with B=%d T=%d exceeds the allocated B=%d T=%d", B, T, m.B, m.T);
    const int L = c.num_layers, C = c.channels, NH = c.num_heads, NKV = c.num_kv_heads, HD = gpt2_head_dim(c);
    const int V = c.vocab_size, Vp = c.padded_vocab_size, QKV = gpt2_qkv_channels(c);
    const size_t BT = (size_t)B * T;
    for (size_t i = 0; i < BT; i++)
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            fail("token id out of range [0, %d) at position %zu of the batch", V, i);
    const ParamTensors& p = m.params;
    Activations& a = m.acts;
    cpu::encoder_forward(a.encoded.data(), inputs, p.wte, p.wpe, B, T, C);
    for (int l = 0; l < L; l++) {
        const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * BT * C;
        float* ln1 = a.ln1.data() + l * BT * C;
        float* ln1_mean = a.ln1_mean.data() + l * BT;
        float* ln1_rstd = a.ln1_rstd.data() + l * BT;
        float* qkv = a.qkv.data() + l * BT * QKV;
        float* atty = a.atty.data() + l * BT * C;
        float* att_lse = a.att_lse.data() + l * BT * NH;
        float* attproj = a.attproj.data() + l * BT * C;
        float* residual2 = a.residual2.data() + l * BT * C;
        float* ln2 = a.ln2.data() + l * BT * C;
        float* ln2_mean = a.ln2_mean.data() + l * BT;
        float* ln2_rstd = a.ln2_rstd.data() + l * BT;
        float* fch = a.fch.data() + l * BT * 4 * C;
        float* fch_gelu = a.fch_gelu.data() + l * BT * 4 * C;
        float* fcproj = a.fcproj.data() + l * BT * C;
        float* residual3 = a.residual3.data() + l * BT * C;
        cpu::layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p.ln1w + l * C, p.ln1b + l * C, B, T, C);
        cpu::matmul_forward(qkv, ln1, p.qkvw + (size_t)l * QKV * C, p.qkvb + l * QKV, B, T, C, QKV);
        cpu::attention_forward(atty, att_lse, qkv, B, T, NH, NKV, HD, c.window);
        cpu::matmul_forward(attproj, atty, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, B, T, C, C);
        cpu::residual_forward(residual2, residual, attproj, BT * C);
        cpu::layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p.ln2w + l * C, p.ln2b + l * C, B, T, C);
        cpu::matmul_forward(fch, ln2, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, B, T, C, 4 * C);
        cpu::gelu_forward(fch_gelu, fch, BT * 4 * C);
        cpu::matmul_forward(fcproj, fch_gelu, p.fcprojw + (size_t)l * C * 4 * C, p.fcprojb + l * C, B, T, 4 * C, C);
        cpu::residual_forward(residual3, residual2, fcproj, BT * C);
    }
    const float* last = L > 0 ? a.residual3.data() + (L - 1) * BT * C : a.encoded.data();
    cpu::layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), last, p.lnfw, p.lnfb, B, T, C);
    cpu::matmul_forward(a.logits.data(), a.lnf.data(), p.wte, nullptr, B, T, C, Vp);
    m.cur_B = B;
    m.cur_T = T;
    return cpu::softmax_crossentropy_forward(a.probs.data(), a.losses.data(), a.logits.data(), targets, B, T, V, Vp);
}

// ------------------------------------------------------------------------------------------------
// backward: accumulates (+=) into m.grads the gradient of grad_scale * (mean loss of the last
// forward), which must have had targets. Call gpt2_zero_grad before the first micro-batch.
void gpt2_zero_grad(GPT2& m) { std::fill(m.grads_memory.begin(), m.grads_memory.end(), 0.0f); }

void gpt2_backward(GPT2& m, const int* inputs, const int* targets, float grad_scale) {
    const GPT2Config& c = m.config;
    const int B = m.cur_B, T = m.cur_T;
    const int L = c.num_layers, C = c.channels, NH = c.num_heads, NKV = c.num_kv_heads, HD = gpt2_head_dim(c);
    const int V = c.vocab_size, Vp = c.padded_vocab_size, QKV = gpt2_qkv_channels(c);
    const size_t BT = (size_t)B * T;
    const ParamTensors& p = m.params;
    const ParamTensors& g = m.grads;
    Activations& a = m.acts;
    ActivationGrads& d = m.dacts;
    auto zero = [](std::vector<float>& v, size_t n) { std::fill(v.begin(), v.begin() + n, 0.0f); };

    float* dlogits = a.probs.data();  // in place: the probabilities are not needed afterwards
    cpu::crossentropy_softmax_backward(dlogits, a.probs.data(), targets, B, T, V, Vp, grad_scale);
    zero(d.dlnf, BT * C);
    cpu::matmul_backward(d.dlnf.data(), g.wte, nullptr, dlogits, a.lnf.data(), p.wte, B, T, C, Vp);
    zero(d.dresidual, BT * C);
    const float* last = L > 0 ? a.residual3.data() + (L - 1) * BT * C : a.encoded.data();
    cpu::layernorm_backward(d.dresidual.data(), g.lnfw, g.lnfb, d.dlnf.data(), last, p.lnfw, a.lnf_mean.data(),
                            a.lnf_rstd.data(), B, T, C);
    // dresidual holds d(loss)/d(residual3 of layer l); a residual add passes it on unchanged, so
    // each layer's two branches add their input gradients into it in place.
    float* dresidual = d.dresidual.data();
    float* dln = d.dlnf.data();
    for (int l = L - 1; l >= 0; l--) {
        const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * BT * C;
        const float* ln1 = a.ln1.data() + l * BT * C;
        const float* qkv = a.qkv.data() + l * BT * QKV;
        const float* atty = a.atty.data() + l * BT * C;
        const float* att_lse = a.att_lse.data() + l * BT * NH;
        const float* residual2 = a.residual2.data() + l * BT * C;
        const float* ln2 = a.ln2.data() + l * BT * C;
        const float* fch = a.fch.data() + l * BT * 4 * C;
        const float* fch_gelu = a.fch_gelu.data() + l * BT * 4 * C;
        // MLP branch: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2))))
        zero(d.dfch_gelu, BT * 4 * C);
        cpu::matmul_backward(d.dfch_gelu.data(), g.fcprojw + (size_t)l * C * 4 * C, g.fcprojb + l * C, dresidual,
                             fch_gelu, p.fcprojw + (size_t)l * C * 4 * C, B, T, 4 * C, C);
        zero(d.dfch, BT * 4 * C);
        cpu::gelu_backward(d.dfch.data(), fch, d.dfch_gelu.data(), BT * 4 * C);
        zero(d.dlnf, BT * C);
        cpu::matmul_backward(dln, g.fcw + (size_t)l * 4 * C * C, g.fcb + l * 4 * C, d.dfch.data(), ln2,
                             p.fcw + (size_t)l * 4 * C * C, B, T, C, 4 * C);
        cpu::layernorm_backward(dresidual, g.ln2w + l * C, g.ln2b + l * C, dln, residual2, p.ln2w + l * C,
                                a.ln2_mean.data() + l * BT, a.ln2_rstd.data() + l * BT, B, T, C);
        // attention branch: residual2 = residual + attproj(attention(qkv(ln1(residual))))
        zero(d.datty, BT * C);
        cpu::matmul_backward(d.datty.data(), g.attprojw + (size_t)l * C * C, g.attprojb + l * C, dresidual, atty,
                             p.attprojw + (size_t)l * C * C, B, T, C, C);
        cpu::attention_backward(d.dqkv.data(), d.datty.data(), qkv, atty, att_lse, B, T, NH, NKV, HD, c.window);
        zero(d.dlnf, BT * C);
        cpu::matmul_backward(dln, g.qkvw + (size_t)l * QKV * C, g.qkvb + l * QKV, d.dqkv.data(), ln1,
                             p.qkvw + (size_t)l * QKV * C, B, T, C, QKV);
        cpu::layernorm_backward(dresidual, g.ln1w + l * C, g.ln1b + l * C, dln, residual, p.ln1w + l * C,
                                a.ln1_mean.data() + l * BT, a.ln1_rstd.data() + l * BT, B, T, C);
    }
    cpu::encoder_backward(g.wte, g.wpe, dresidual, inputs, B, T, C);
}

// ------------------------------------------------------------------------------------------------
// update: clip by the global gradient norm, then one AdamW step (t = step, 1-based).
// Returns the gradient norm before clipping.
struct OptimizerSettings {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
};

float gpt2_update(GPT2& m, const OptimizerSettings& o, int64_t step) {
    const float norm = cpu::global_norm(m.grads_memory.data(), m.num_params);
    const float scale = cpu::grad_clip_scale(norm, o.grad_clip);
    cpu::adamw_update_gpt2(m.params_memory.data(), m.m_memory.data(), m.v_memory.data(), m.grads_memory.data(),
                           m.config, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, scale, step);
    return norm;
}

#ifndef TESTING
// ------------------------------------------------------------------------------------------------
// checkpoints (llmc/checkpoint.h): fp32 model, then m and v, then DONE
void save_checkpoint(const std::string& out_dir, const GPT2& m, const TrainState& s) {
    const std::string dir = checkpoint_begin(out_dir, s.step);
    model_write_fp32((dir + "/model.bin").c_str(), m.config, m.params_memory.data());
    state_write((dir + "/state.bin").c_str(), s, m.m_memory.data(), m.v_memory.data(), nullptr);
    checkpoint_finish(dir);
}

// ------------------------------------------------------------------------------------------------
// sampling: generate from the end-of-text token, one token at a time, with a multinomial draw at
// `temperature` from the shared RNG; the context slides once it reaches T. Each forward sees the
// last min(len, T) tokens at positions 0.., as in training. With an attention window W the whole
// context is still fed, not just W tokens: layer l reaches l*(W-1) tokens further back.
void sample_and_print(GPT2& m, const Tokenizer* tok, Rng& rng, int gen_tokens, float temperature) {
    const int V = m.config.vocab_size, Vp = m.config.padded_vocab_size, T = m.T;
    const int eot = tok && tok->eot_token() >= 0 ? tok->eot_token() : (V > 50256 ? 50256 : 0);
    std::vector<int> ctx{eot};
    printf("sample: ");
    for (int i = 0; i < gen_tokens; i++) {
        const int n = (int)ctx.size() < T ? (int)ctx.size() : T;
        gpt2_forward(m, ctx.data() + ctx.size() - n, nullptr, 1, n);
        const int next = sample_token(m.acts.logits.data() + (size_t)(n - 1) * Vp, V, temperature, rng);
        ctx.push_back(next);
        if (tok) tok->print_token(next);
        else printf("%d ", next);
    }
    printf("\n");
}

// ------------------------------------------------------------------------------------------------
// training loop
double seconds_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

float validation_loss(GPT2& m, DataLoader& val, int steps, int B, int T) {
    val.reset();
    if (steps > val.num_windows()) steps = (int)val.num_windows();
    double sum = 0.0;
    for (int i = 0; i < steps; i++) {
        val.next_batch();
        sum += gpt2_forward(m, val.inputs(), val.targets(), B, T);
    }
    return (float)(sum / steps);
}

int main(int argc, char** argv) {
    TrainConfig cfg;
    parse_train_args(argc, argv, cfg, "train_gpt2_cpu",
                     "Trains GPT-2 in fp32 on the CPU (the reference for the GPU trainer). Example:\n"
                     "  build/train_gpt2_cpu --train \"data/tinyshakespeare/*_train.bin\" --val \"data/tinyshakespeare/*_val.bin\"\n"
                     "      --tokenizer data/gpt2_tokenizer.bin --init d4 --steps 200 --lr 2e-3 --warmup 20 --sample-every 100");
    std::string resume_from;
    if (!cfg.resume_dir.empty()) {
        resume_from = checkpoint_find(cfg.resume_dir);
        cfg.init = resume_from + "/model.bin";
        if (cfg.out_dir.empty()) {  // keep writing beside the checkpoints we resumed from
            const size_t slash = resume_from.find_last_of('/');
            cfg.out_dir = slash == std::string::npos ? "." : resume_from.substr(0, slash);
        }
    }
    GPT2 model;
    gpt2_init(model, cfg.init, cfg);
    gpt2_print_config(model.config);
    gpt2_allocate_activations(model, cfg.B, cfg.T);
    const GPT2Config& c = model.config;

    DataLoader train(cfg.train_pattern.c_str(), cfg.B, cfg.T, 0, 1, c.vocab_size, cfg.seed, true);
    std::unique_ptr<DataLoader> val;
    if (!cfg.val_pattern.empty())
        val.reset(new DataLoader(cfg.val_pattern.c_str(), cfg.B, cfg.T, 0, 1, c.vocab_size, cfg.seed, false));
    std::unique_ptr<Tokenizer> tok;
    if (!cfg.tokenizer_path.empty()) {
        tok.reset(new Tokenizer(cfg.tokenizer_path.c_str()));
        if (tok->vocab_size() < c.vocab_size)
            fail("--tokenizer %s: %d tokens, the model's vocabulary has %d", cfg.tokenizer_path.c_str(),
                 tok->vocab_size(), c.vocab_size);
    }
    if (cfg.steps < 0) {
        cfg.steps = (int)(train.num_windows() / cfg.grad_accum);
        if (cfg.steps == 0)
            fail("--train %s: %lld batches, fewer than one optimizer step of --total-batch %lld tokens",
                 cfg.train_pattern.c_str(), (long long)train.num_windows(), (long long)cfg.total_batch);
    }
    cfg.schedule.total_steps = cfg.steps;

    Rng rng(cfg.seed);
    int64_t start_step = 0;
    if (!resume_from.empty()) {
        TrainState s = state_read((resume_from + "/state.bin").c_str(), (int64_t)model.num_params,
                                  model.m_memory.data(), model.v_memory.data(), nullptr);
        start_step = s.step;
        rng.state = s.rng_state;
        train.load_state(s.loader);
        printf("resumed from %s at step %lld\n", resume_from.c_str(), (long long)start_step);
    }
    FILE* log = cfg.log_path.empty() ? nullptr : fopen_or_fail(cfg.log_path.c_str(), start_step > 0 ? "a" : "w");
    printf("batch %d x %d, %d micro-batches per step (%lld tokens), %d steps\n", cfg.B, cfg.T, cfg.grad_accum,
           (long long)cfg.total_batch, cfg.steps);

    // "step n" in the output and the log always counts completed optimizer steps: the validation
    // loss at step n is measured on the model that step n's train_loss line produced.
    const OptimizerSettings opt_base{0.0f, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.grad_clip};
    auto validate = [&](int64_t step) {
        float vl = validation_loss(model, *val, cfg.val_steps, cfg.B, cfg.T);
        printf("step %lld val_loss %.6f\n", (long long)step, vl);
        if (log) fprintf(log, "step %lld val_loss %.6f\n", (long long)step, vl);
    };
    for (int64_t step = start_step; step < cfg.steps; step++) {
        const bool last = step + 1 == cfg.steps;
        if (val && cfg.val_every > 0 && step % cfg.val_every == 0) validate(step);
        if (cfg.sample_every > 0 && step > 0 && step % cfg.sample_every == 0)
            sample_and_print(model, tok.get(), rng, cfg.gen_tokens, cfg.temperature);

        const double t0 = seconds_now();
        gpt2_zero_grad(model);
        double loss = 0.0;
        for (int micro = 0; micro < cfg.grad_accum; micro++) {
            train.next_batch();
            loss += gpt2_forward(model, train.inputs(), train.targets(), cfg.B, cfg.T);
            gpt2_backward(model, train.inputs(), train.targets(), 1.0f / cfg.grad_accum);
        }
        loss /= cfg.grad_accum;
        OptimizerSettings opt = opt_base;
        opt.lr = lr_at_step(cfg.schedule, (int)step);
        const float norm = gpt2_update(model, opt, step + 1);
        const double ms = (seconds_now() - t0) * 1e3;
        const double tok_s = cfg.total_batch / (ms / 1e3);
        printf("step %lld/%d train_loss %.6f norm %.4f lr %.3e ms %.1f tok_s %.0f\n", (long long)step + 1, cfg.steps,
               loss, norm, opt.lr, ms, tok_s);
        if (log) {
            fprintf(log, "step %lld train_loss %.6f lr %.6e ms %.3f tok_s %.1f\n", (long long)step + 1, loss, opt.lr,
                    ms, tok_s);
            fflush(log);
        }
        if (!cfg.out_dir.empty() && ((cfg.ckpt_every > 0 && (step + 1) % cfg.ckpt_every == 0) || last)) {
            TrainState s;
            s.step = step + 1;
            s.num_params = (int64_t)model.num_params;
            s.rng_state = rng.state;
            train.save_state(s.loader);
            save_checkpoint(cfg.out_dir, model, s);
        }
    }
    if (val && cfg.val_every > 0 && start_step < cfg.steps) validate(cfg.steps);
    if (cfg.sample_every > 0 && start_step < cfg.steps)
        sample_and_print(model, tok.get(), rng, cfg.gen_tokens, cfg.temperature);
    if (log) fclose_or_fail(log, cfg.log_path.c_str());
    return 0;
}
#endif
