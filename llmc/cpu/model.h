// llmc/cpu/model.h: the CPU reference model, GPT-2 or Llama-style (the knobs of ModelConfig: LayerNorm
// or RMSNorm, learned positions or RoPE, GELU or SwiGLU, biases or none, tied or untied head): fp32
// parameters, activations, forward, loss, backward and the update (AdamW, or Muon on the blocks'
// matrices and AdamW on the rest) with OpenMP, built from the layer ops in llmc/cpu/ (the same ones
// the GPU tests and the kernel lab use as their reference), plus checkpoints. The trainer samples
// through the KV cache of llmc/cpu/model_infer.h (model_infer_sample), as the GPU trainer does.
// Semantics are PyTorch's (docs/design.md). Same sections, in the same order and with the same
// function names, as the GPU model in llmc/gpt2.cuh: model (parameters, activations), forward,
// backward, update, checkpoints.
//
// One step: model_zero_grads, then per micro-batch model_forward (logits), model_loss (mean
// cross-entropy), model_backward (+= into the gradients), then model_update. model_forward's
// DocMasking makes each row a pack of documents (docs/training.md, "Document masking"); the backward
// follows the last forward's.
#pragma once
#include <algorithm>
#include <functional>
#include <string>
#include <vector>
#include "llmc/checkpoint.h"
#include "llmc/cpu/adamw.h"
#include "llmc/cpu/attention.h"
#include "llmc/cpu/crossentropy.h"
#include "llmc/cpu/encoder.h"
#include "llmc/cpu/gelu.h"
#include "llmc/cpu/global_norm.h"
#include "llmc/cpu/layernorm.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/muon.h"
#include "llmc/cpu/residual.h"
#include "llmc/cpu/rmsnorm.h"
#include "llmc/cpu/rope.h"
#include "llmc/cpu/swiglu.h"
#include "llmc/formats.h"
#include "llmc/model_config.h"
#include "llmc/utils.h"

// ============================================================================ model
// Activations: everything the backward pass reads, for the B, T the model was sized for. Per-layer
// buffers are (L, ...) with layer l at offset l * (one layer's size). FC = the fc rows (H, or 2H
// for SwiGLU's [gate | up]), H = the MLP's hidden width (llmc/model_config.h). With RMSNorm the
// *_mean buffers are unused; with RoPE qkv holds the rotated Q and K (what attention read).
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
    std::vector<float> fch;        // (L, B, T, FC)
    std::vector<float> fch_act;    // (L, B, T, H) GELU(fch) or SwiGLU(fch)
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
    std::vector<float> dfch;       // (B, T, FC)
    std::vector<float> dfch_act;   // (B, T, H)
};

// Documents packed in a row (docs/training.md, "Document masking"): with token >= 0, a document starts
// at each position holding `token`, and a token attends only within its own document (and window);
// restart_positions: positions (wpe row, RoPE angle) count from each document's start. token -1: each
// row is one sequence.
struct DocMasking {
    int token = -1;
    bool restart_positions = false;
};

// The parameters are the tensors of MODEL_PARAMETER_TABLE (llmc/model_config.h), named views into
// one contiguous buffer. Gradients and the AdamW moments are buffers of the same length and
// layout, so one offset table serves them all.
struct Model {
    ModelConfig config{};
    size_t num_params = 0;
    std::vector<float> params_memory, grads_memory, m_memory, v_memory;  // (num_params) each (data parallel: see below)
    ModelTensors<float> params{}, grads{};  // named views of params_memory and grads_memory
    std::vector<float> rope_cos, rope_sin;  // (maxT, HD/2) each, with RoPE (llmc/cpu/rope.h)
    int B = 0, T = 0;          // the shape the activations were allocated for
    int cur_B = 0, cur_T = 0;  // the shape of the last forward
    DocMasking docs;           // the last forward's
    std::vector<int> doc_start;  // (B, T): the last forward's document starts (llmc/cpu/attention.h), with docs.token >= 0
    int64_t step = 0;          // optimizer steps done
    Activations acts;
    ActivationGrads dacts;
    // data parallel (llmc/cpu/data_parallel.h): m_memory and v_memory hold a ZeRO shard's state; at
    // ZeRO-2 grads_memory holds the shard's gradients only, and the backward asks grads_of(l) where
    // to write layer l's gradients (-1: the tensors outside the layers, at its start) and calls
    // after_layer_backward(l) once layer l's are complete (-1: at its end, after the embedding's).
    // Unset: the whole buffer, grads.
    std::function<ModelTensors<float>(int)> grads_of;
    std::function<void(int)> after_layer_backward;
};

// Sizes the model for training at (B, T): parameters, gradients and AdamW moments (all zero; set
// the parameters with model_set_params), and the activations.
inline void model_build(Model& m, const ModelConfig& c, int B, int T) {
    model_validate_config(c, "model");
    if (T > c.max_seq_len) fail("--seq: %d is longer than the model's max_seq_len %d", T, c.max_seq_len);
    m.config = c;
    m.num_params = model_num_params(c);
    m.params_memory.assign(m.num_params, 0.0f);
    m.grads_memory.assign(m.num_params, 0.0f);
    m.m_memory.assign(m.num_params, 0.0f);
    m.v_memory.assign(m.num_params, 0.0f);
    m.params = model_point_tensors(m.params_memory.data(), c);
    m.grads = model_point_tensors(m.grads_memory.data(), c);
    m.step = 0;
    if (c.position == POS_ROPE) {
        const int HD = model_head_dim(c);
        m.rope_cos.resize((size_t)c.max_seq_len * HD / 2);
        m.rope_sin.resize((size_t)c.max_seq_len * HD / 2);
        cpu::rope_tables_for(c, m.rope_cos.data(), m.rope_sin.data(), c.max_seq_len);
    }

    const size_t L = c.num_layers, C = c.channels, NH = c.num_heads, Vp = c.padded_vocab_size;
    const size_t BT = (size_t)B * T, QKV = model_qkv_channels(c), FC = model_fc_channels(c), H = model_mlp_hidden(c);
    // the floats of the buffers below: per layer, outside the layers, and the one-layer gradients
    const size_t act_floats = L * BT * (7 * C + QKV + NH + FC + H + 4) + BT * (2 * C + 2 * Vp + 3) +
                              BT * (3 * C + QKV + FC + H);
    char what[96];
    snprintf(what, sizeof what, "the model with its activations for --batch %d --seq %d", B, T);
    check_host_memory((act_floats + 4 * m.num_params) * sizeof(float), what, "lower --batch or --seq");
    Activations& a = m.acts;
    ActivationGrads& d = m.dacts;
    for (std::vector<float>* v : {&a.ln1, &a.atty, &a.attproj, &a.residual2, &a.ln2, &a.fcproj, &a.residual3})
        v->resize(L * BT * C);
    for (std::vector<float>* v : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) v->resize(L * BT);
    a.qkv.resize(L * BT * QKV);
    a.att_lse.resize(L * BT * NH);
    a.fch.resize(L * BT * FC);
    a.fch_act.resize(L * BT * H);
    for (std::vector<float>* v : {&a.encoded, &a.lnf, &d.dresidual, &d.dlnf, &d.datty}) v->resize(BT * C);
    for (std::vector<float>* v : {&a.lnf_mean, &a.lnf_rstd, &a.losses}) v->resize(BT);
    a.logits.resize(BT * Vp);
    a.probs.resize(BT * Vp);
    d.dqkv.resize(BT * QKV);
    d.dfch.resize(BT * FC);
    d.dfch_act.resize(BT * H);
    m.doc_start.resize(BT);
    m.B = B;
    m.T = T;
}

inline void model_free(Model& m) { m = Model(); }

// Sets the parameters from fp32 host values (a model file's or model_init_params').
inline void model_set_params(Model& m, const float* host) {
    std::copy(host, host + m.num_params, m.params_memory.begin());
}

namespace detail {

// The norm of the config: LayerNorm (weight, bias; saves mean and rstd) or RMSNorm (weight; rstd).
inline void norm_forward(const ModelConfig& c, float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int B, int T) {
    if (c.norm == NORM_RMSNORM) cpu::rmsnorm_forward(out, rstd, inp, weight, B, T, c.channels, (float)c.norm_eps);
    else cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, B, T, c.channels);
}

// residual = inp1 + inp2, then out = norm(residual): the step between two blocks.
inline void residual_norm_forward(const ModelConfig& c, float* residual, float* out, float* mean, float* rstd,
                                  const float* inp1, const float* inp2, const float* weight, const float* bias, int B,
                                  int T) {
    if (c.norm == NORM_RMSNORM) {
        cpu::fused_residual_rmsnorm_forward(residual, out, rstd, inp1, inp2, weight, B, T, c.channels,
                                            (float)c.norm_eps);
    } else {
        cpu::residual_forward(residual, inp1, inp2, (size_t)B * T * c.channels);
        cpu::layernorm_forward(out, mean, rstd, residual, weight, bias, B, T, c.channels);
    }
}

// dresidual += d(norm input), dweight (and dbias) +=. dresidual is the residual stream's running
// gradient wherever a norm sits, so for RMSNorm this is the fused op's backward: the residual add
// passes the gradient on unchanged.
inline void norm_backward(const ModelConfig& c, float* dresidual, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean, const float* rstd, int B, int T) {
    if (c.norm == NORM_RMSNORM)
        cpu::fused_residual_rmsnorm_backward(dresidual, dweight, dout, inp, weight, rstd, B, T, c.channels);
    else
        cpu::layernorm_backward(dresidual, dweight, dbias, dout, inp, weight, mean, rstd, B, T, c.channels);
}
}  // namespace detail

// ============================================================================ forward
// inputs (B, T) ids < V, through the logits (B, T, Vp). B, T may be smaller than the built shape.
// docs: the rows' documents (default: each row one sequence).
// The layer structure is the GPU's: the first norm runs on the embedding, and every residual add is
// followed by the next norm (the next layer's ln1, or lnf), fused for RMSNorm.
inline void model_forward(Model& m, const int* inputs, int B, int T, const DocMasking& docs = DocMasking()) {
    const ModelConfig& c = m.config;
    if (B > m.B || T > m.T) fail("internal: forward with B=%d T=%d exceeds the allocated B=%d T=%d", B, T, m.B, m.T);
    const int L = c.num_layers, C = c.channels, NH = c.num_heads, NKV = c.num_kv_heads, HD = model_head_dim(c);
    const int V = c.vocab_size, Vp = c.padded_vocab_size, QKV = model_qkv_channels(c);
    const int FC = model_fc_channels(c), H = model_mlp_hidden(c);
    const size_t BT = (size_t)B * T;
    for (size_t i = 0; i < BT; i++)
        if (inputs[i] < 0 || inputs[i] >= V)
            fail("token id out of range [0, %d) at position %zu of the batch", V, i);
    if (docs.token >= V) fail("document token %d: out of range [0, %d)", docs.token, V);
    m.docs = docs;
    if (docs.token >= 0) cpu::doc_starts(m.doc_start.data(), inputs, B, T, docs.token);
    const int* doc_start = docs.token >= 0 ? m.doc_start.data() : nullptr;  // the attention mask
    const int* pos_start = docs.restart_positions ? doc_start : nullptr;     // the positions' origin
    const ModelTensors<float>& p = m.params;
    Activations& a = m.acts;
    cpu::encoder_forward(a.encoded.data(), inputs, p.wte, p.wpe, B, T, C, pos_start);  // wpe nullptr with RoPE
    detail::norm_forward(c, a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), a.encoded.data(), p.ln1w, p.ln1b, B, T);
    for (int l = 0; l < L; l++) {
        const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * BT * C;
        float* ln1 = a.ln1.data() + l * BT * C;
        float* qkv = a.qkv.data() + l * BT * QKV;
        float* atty = a.atty.data() + l * BT * C;
        float* att_lse = a.att_lse.data() + l * BT * NH;
        float* attproj = a.attproj.data() + l * BT * C;
        float* residual2 = a.residual2.data() + l * BT * C;
        float* ln2 = a.ln2.data() + l * BT * C;
        float* fch = a.fch.data() + l * BT * FC;
        float* fch_act = a.fch_act.data() + l * BT * H;
        float* fcproj = a.fcproj.data() + l * BT * C;
        float* residual3 = a.residual3.data() + l * BT * C;
        cpu::matmul_forward(qkv, ln1, p.qkvw + (size_t)l * QKV * C, tensor_at(p.qkvb, (size_t)l * QKV), B, T, C, QKV);
        if (c.position == POS_ROPE)
            cpu::rope_forward(qkv, m.rope_cos.data(), m.rope_sin.data(), B, T, NH, NKV, HD, 0, pos_start);
        cpu::attention_forward(atty, att_lse, qkv, B, T, NH, NKV, HD, c.window, doc_start);
        cpu::matmul_forward(attproj, atty, p.attprojw + (size_t)l * C * C, tensor_at(p.attprojb, (size_t)l * C), B, T, C, C);
        detail::residual_norm_forward(c, residual2, ln2, a.ln2_mean.data() + l * BT, a.ln2_rstd.data() + l * BT,
                                      residual, attproj, p.ln2w + l * C, tensor_at(p.ln2b, (size_t)l * C), B, T);
        cpu::matmul_forward(fch, ln2, p.fcw + (size_t)l * FC * C, tensor_at(p.fcb, (size_t)l * FC), B, T, C, FC);
        if (c.mlp == MLP_SWIGLU) cpu::swiglu_forward(fch_act, fch, (int)BT, H);
        else cpu::gelu_forward(fch_act, fch, BT * H);
        cpu::matmul_forward(fcproj, fch_act, p.fcprojw + (size_t)l * C * H, tensor_at(p.fcprojb, (size_t)l * C), B, T, H, C);
        if (l + 1 < L)  // the next layer's ln1
            detail::residual_norm_forward(c, residual3, a.ln1.data() + (l + 1) * BT * C,
                                          a.ln1_mean.data() + (l + 1) * BT, a.ln1_rstd.data() + (l + 1) * BT, residual2,
                                          fcproj, p.ln1w + (l + 1) * C, tensor_at(p.ln1b, (size_t)(l + 1) * C), B, T);
        else
            detail::residual_norm_forward(c, residual3, a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), residual2,
                                          fcproj, p.lnfw, p.lnfb, B, T);
    }
    const float* head = c.tied_head ? p.wte : p.lm_head;
    cpu::matmul_forward(a.logits.data(), a.lnf.data(), head, nullptr, B, T, C, Vp);
    m.cur_B = B;
    m.cur_T = T;
}

// Mean cross-entropy of the last forward's logits against targets (cur_B, cur_T) ids < V over the
// positions where mask (cur_B, cur_T) is 1 (nullptr: all; none counted: 0); leaves the probabilities
// for model_backward, which takes the same mask.
inline float model_loss(Model& m, const int* targets, const int* mask = nullptr) {
    const int B = m.cur_B, T = m.cur_T, V = m.config.vocab_size, Vp = m.config.padded_vocab_size;
    for (size_t i = 0; i < (size_t)B * T; i++)
        if (targets[i] < 0 || targets[i] >= V) fail("token id out of range [0, %d) at position %zu of the batch", V, i);
    Activations& a = m.acts;
    return cpu::softmax_crossentropy_forward(a.probs.data(), a.losses.data(), a.logits.data(), targets, B, T, V, Vp,
                                             mask);
}

// ============================================================================ backward
// Accumulates (+=) into m.grads (or where m.grads_of points) the gradient of grad_scale * (mean
// loss of the last model_loss, under the same mask). Call model_zero_grads before the first micro-batch.
inline void model_zero_grads(Model& m) { std::fill(m.grads_memory.begin(), m.grads_memory.end(), 0.0f); }

inline void model_backward(Model& m, const int* inputs, const int* targets, float grad_scale,
                           const int* mask = nullptr) {
    const ModelConfig& c = m.config;
    const int B = m.cur_B, T = m.cur_T;
    const int L = c.num_layers, C = c.channels, NH = c.num_heads, NKV = c.num_kv_heads, HD = model_head_dim(c);
    const int V = c.vocab_size, Vp = c.padded_vocab_size, QKV = model_qkv_channels(c);
    const int FC = model_fc_channels(c), H = model_mlp_hidden(c);
    const size_t BT = (size_t)B * T;
    const ModelTensors<float>& p = m.params;
    const ModelTensors<float> g = m.grads_of ? m.grads_of(-1) : m.grads;  // outside the layers
    Activations& a = m.acts;
    ActivationGrads& d = m.dacts;
    const int* doc_start = m.docs.token >= 0 ? m.doc_start.data() : nullptr;  // the last forward's
    const int* pos_start = m.docs.restart_positions ? doc_start : nullptr;
    auto zero = [](std::vector<float>& v, size_t n) { std::fill(v.begin(), v.begin() + n, 0.0f); };

    float* dlogits = a.probs.data();  // in place: the probabilities are not needed afterwards
    cpu::crossentropy_softmax_backward(dlogits, a.probs.data(), targets, B, T, V, Vp, grad_scale, mask);
    zero(d.dlnf, BT * C);
    cpu::matmul_backward(d.dlnf.data(), c.tied_head ? g.wte : g.lm_head, nullptr, dlogits, a.lnf.data(),
                         c.tied_head ? p.wte : p.lm_head, B, T, C, Vp);
    zero(d.dresidual, BT * C);
    const float* last = L > 0 ? a.residual3.data() + (L - 1) * BT * C : a.encoded.data();
    detail::norm_backward(c, d.dresidual.data(), g.lnfw, g.lnfb, d.dlnf.data(), last, p.lnfw, a.lnf_mean.data(),
                          a.lnf_rstd.data(), B, T);
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
        const float* fch = a.fch.data() + l * BT * FC;
        const float* fch_act = a.fch_act.data() + l * BT * H;
        const ModelTensors<float> gl = m.grads_of ? m.grads_of(l) : model_layer_slices(m.grads, c, l);  // layer l's
        // MLP branch: residual3 = residual2 + fcproj(act(fc(ln2(residual2))))
        zero(d.dfch_act, BT * H);
        cpu::matmul_backward(d.dfch_act.data(), gl.fcprojw, gl.fcprojb, dresidual, fch_act, p.fcprojw + (size_t)l * C * H, B,
                             T, H, C);
        zero(d.dfch, BT * FC);
        if (c.mlp == MLP_SWIGLU) cpu::swiglu_backward(d.dfch.data(), d.dfch_act.data(), fch, (int)BT, H);
        else cpu::gelu_backward(d.dfch.data(), fch, d.dfch_act.data(), BT * H);
        zero(d.dlnf, BT * C);
        cpu::matmul_backward(dln, gl.fcw, gl.fcb, d.dfch.data(), ln2, p.fcw + (size_t)l * FC * C, B, T, C, FC);
        detail::norm_backward(c, dresidual, gl.ln2w, gl.ln2b, dln, residual2, p.ln2w + l * C,
                              a.ln2_mean.data() + l * BT, a.ln2_rstd.data() + l * BT, B, T);
        // attention branch: residual2 = residual + attproj(attention(rope(qkv(ln1(residual)))))
        zero(d.datty, BT * C);
        cpu::matmul_backward(d.datty.data(), gl.attprojw, gl.attprojb, dresidual, atty, p.attprojw + (size_t)l * C * C, B,
                             T, C, C);
        cpu::attention_backward(d.dqkv.data(), d.datty.data(), qkv, atty, att_lse, B, T, NH, NKV, HD, c.window,
                                doc_start);
        if (c.position == POS_ROPE)  // d(rotated qkv) -> d(qkv), in place
            cpu::rope_backward(d.dqkv.data(), m.rope_cos.data(), m.rope_sin.data(), B, T, NH, NKV, HD, 0, pos_start);
        zero(d.dlnf, BT * C);
        cpu::matmul_backward(dln, gl.qkvw, gl.qkvb, d.dqkv.data(), ln1, p.qkvw + (size_t)l * QKV * C, B, T, C, QKV);
        detail::norm_backward(c, dresidual, gl.ln1w, gl.ln1b, dln, residual, p.ln1w + l * C,
                              a.ln1_mean.data() + l * BT, a.ln1_rstd.data() + l * BT, B, T);
        if (m.after_layer_backward) m.after_layer_backward(l);
    }
    cpu::encoder_backward(g.wte, g.wpe, dresidual, inputs, B, T, C, pos_start);  // g.wpe nullptr with RoPE
    if (m.after_layer_backward) m.after_layer_backward(-1);
}

// ============================================================================ update
// The Muon half of an OPTIMIZER_MUON step as llmc/cpu/muon.h takes it (eps and Nesterov torch's).
inline cpu::MuonSettings model_muon_settings(const OptimizerSettings& o) {
    cpu::MuonSettings s;
    s.lr = o.muon_lr;
    s.momentum = o.muon_momentum;
    s.weight_decay = o.muon_weight_decay;
    s.ns_steps = o.muon_ns_steps;
    s.adjust_lr = o.muon_match_rms_adamw ? cpu::MuonAdjustLr::MATCH_RMS_ADAMW : cpu::MuonAdjustLr::ORIGINAL;
    return s;
}

// One optimizer step on the whole buffers with the clipping factor grad_scale (t = m.step, 1-based):
// AdamW on every tensor, or with OPTIMIZER_MUON AdamW on all but the model_param_muon tensors and
// Muon on those, its momentum kept in m's slice of each (v's stays zero), so the state keeps its layout.
inline void model_step_optimizer(Model& m, const OptimizerSettings& o, float grad_scale) {
    const bool muon = o.optimizer == OPTIMIZER_MUON;
    cpu::adamw_update_model(m.params_memory.data(), m.m_memory.data(), m.v_memory.data(), m.grads_memory.data(),
                           m.config, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, grad_scale, m.step, muon);
    if (muon)
        cpu::muon_update_model(m.params_memory.data(), m.m_memory.data(), m.grads_memory.data(), m.config,
                               model_muon_settings(o), grad_scale);
}

// Clip by the global gradient norm, then one optimizer step (t = m.step after the increment,
// 1-based). Returns the gradient norm before clipping.
inline float model_update(Model& m, const OptimizerSettings& o) {
    const float norm = cpu::global_norm(m.grads_memory.data(), m.num_params);
    const float scale = cpu::grad_clip_scale(norm, o.grad_clip);
    m.step++;
    model_step_optimizer(m, o, scale);
    return norm;
}

// ============================================================================ checkpoints
// DIR/step_NNNNNNNN/{model.bin, state.bin, DONE} (llmc/checkpoint.h): the fp32 model, then the
// state with m and v; written into step_NNNNNNNN.tmp/ and renamed, with DONE (their checksums), by
// checkpoint_begin/checkpoint_finish.
inline void model_save_checkpoint(const Model& m, const std::string& out_dir, const int64_t loader_state[16],
                                 uint64_t rng_state) {
    const std::string dir = checkpoint_begin(out_dir, m.step);
    model_write_fp32((dir + "/model.bin").c_str(), m.config, m.params_memory.data());
    TrainState st;
    st.step = m.step;
    st.num_params = (int64_t)m.num_params;
    st.rng_state = rng_state;
    for (int i = 0; i < 16; i++) st.loader[i] = loader_state[i];
    state_write((dir + "/state.bin").c_str(), st, m.m_memory.data(), m.v_memory.data(), nullptr);
    checkpoint_finish(dir);
}

// Reads the model of `dir` into an already built model of the same config, and its training
// state (a GPU checkpoint's master weights are skipped); returns the state (step, loader
// position, RNG).
inline TrainState model_load_checkpoint(Model& m, const std::string& dir) {
    const std::string model_path = dir + "/model.bin", state_path = dir + "/state.bin";
    ModelFileInfo info = model_read_info(model_path.c_str());
    if (!model_same_config(info.config, m.config))
        fail("%s: the checkpoint's model shape differs from this run's", model_path.c_str());
    model_read_fp32(model_path.c_str(), m.params_memory.data());
    TrainState st = state_read(state_path.c_str(), (int64_t)m.num_params, m.m_memory.data(), m.v_memory.data(), nullptr);
    m.step = st.step;
    return st;
}
