// decode_step.cu: generate's whole decode step (llmc/model_infer.cuh), the shipped policy against the
// kernel choices it does not make. Each variant overrides decode_step_plan's DecodeStepPlan (or, for
// the persistent kernel, replaces the layers), is captured as one CUDA graph (a token = one replay, as
// generate runs it), checked, then timed one step a launch by the harness.
//   0  shipped: decode_step_plan's pick (the fused step at B <= 8, cuBLASLt above)
//   1  no programmatic dependent launch (plan.pdl = false): each kernel waits for the last one to end
//   2  one op a kernel at B <= 8 (plan.fused = false): GEMVs, norms, RoPE, kv_cache_append and
//      attention_decode as separate kernels; at B > 8 the cache append as its own kernel
//      (plan.append_in_attention = false)
//   3  cuBLASLt for every matmul at B <= 8 (plan.gemv = false)
//   4  the sampler kernel instead of the argmax folded into lm_head (plan.fold_argmax = false)
//   5  the decode attention on the CUDA cores where the shipped step takes the tensor cores
//      (plan.decode_mma = false)
//   6  the step's layers as one persistent kernel (decode_persistent.cuh; GPT-2-style blocks, B <= 8)
//   7  the shipped step as plain launches (no graph)
//  11  the fused GEMVs on the CUDA cores where the shipped step takes the tensor cores (plan.gemv_mma =
//      false; B = 8, llmc/gemv_mma.cuh)
// Phases of the fused step (B <= 8), each timed alone as plain launches (pos does not move):
//   8  the layers (decode_layers_fused, 5 kernels a layer)
//   9  the head (norm+lm_head GEMV with the folded argmax)
//  10  the persistent kernel's layers alone, then block 0's clock per phase (the kernel's trace)
// A variant that equals the shipped plan at a shape (e.g. 3 at B = 64) is skipped.
// Shapes: d12 (GPT-2 124M) and the Llama 114M shape (llama:L12,C768,H12,KV4,F2048), random weights
// (the trainer's init), B = 1, 8, 64, 64-token random prompts, greedy, a 1024-position cache; the
// timed steps continue from the prompt (positions 64..~170).
// Checks: after a fresh prefill, one step's logits (B, V) against variant 0's (bf16: 5e-2 of the rms
// plus 5e-2 relative, as generate --check-full's bound; fp32: 1e-3), and every logit finite; the
// shipped path itself is checked against the CPU twin by tests/gpu/test_generate.sh. Phase variants:
// their outputs finite. Bytes: the weights once and the cache at the prompt length; FLOPs 2 * params
// * B: memory-bound (% of the H200's copy bandwidth).
// Rejected designs, measured on the H200 (GPT-2 124M, B = 1, 64-token prompt, 256 new greedy tokens,
// us a token; docs/perf.md, "Generation"):
// - the persistent kernel (variant 6): 365 against the fused step's 241; its phases are each still a
//   chain of L2 round trips, and the barrier between them costs what a kernel boundary does;
// - counters in place of griddepcontrol.wait (each kernel waits on a count of the previous kernel's
//   finished blocks, optionally triggering its dependents before the wait): 286 against 251. Its
//   protocol and the kernels' counter arguments were removed; git history holds them.
#include <cmath>
#include <functional>
#include <memory>
#include <vector>
#include "dev/cuda/decode_persistent.cuh"
#include "dev/cuda/harness.cuh"
#include "llmc/model_infer.cuh"

namespace {

constexpr int PROMPT = 64, MAX_SEQ = 1024;

// A step function captured once as a graph (its kernels loaded by one plain call first), replayed.
struct Graph {
    cudaGraphExec_t exec = nullptr;
    void capture(const std::function<void()>& step, cudaStream_t s) {
        step();  // loads every kernel (no lazy loading inside the capture)
        cudaCheck(cudaStreamSynchronize(s));
        cudaGraph_t g;
        cudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        step();
        cudaCheck(cudaStreamEndCapture(s, &g));
        cudaCheck(cudaGraphInstantiate(&exec, g, 0));
        cudaCheck(cudaGraphDestroy(g));
    }
    void replay(cudaStream_t s) const { cudaCheck(cudaGraphLaunch(exec, s)); }
    ~Graph() {
        if (exec) cudaGraphExecDestroy(exec);
    }
};

// The persistent kernel's plan, its buffers, and the arguments for model m.
struct Persistent {
    PersistentPlan plan;
    float* part = nullptr;
    unsigned* sync = nullptr;
    unsigned long long* trace = nullptr;
    PersistentArgs args{};
    explicit Persistent(ModelInfer& m) {
        const ModelConfig& c = m.config;
        plan = decode_persistent_plan(c, m.B, m.S, m.window);
        if (!plan.ok) return;
        cudaCheck(cudaMalloc(&part, plan.part_floats * sizeof(float)));
        cudaCheck(cudaMalloc(&sync, PERSIST_SYNC_WORDS * sizeof(unsigned)));
        cudaCheck(cudaMemset(sync, 0, PERSIST_SYNC_WORDS * sizeof(unsigned)));
        cudaCheck(cudaMalloc(&trace, (size_t)c.num_layers * PERSIST_TRACE_POINTS * sizeof(unsigned long long)));
        const ModelTensors<floatX>& p = m.params;
        PersistentArgs& a = args;
        a.ln1w = p.ln1w, a.ln1b = p.ln1b, a.qkvw = p.qkvw, a.qkvb = p.qkvb, a.attprojw = p.attprojw;
        a.attprojb = p.attprojb, a.ln2w = p.ln2w, a.ln2b = p.ln2b, a.fcw = p.fcw, a.fcb = p.fcb;
        a.fcprojw = p.fcprojw, a.fcprojb = p.fcprojb;
        a.res1 = m.res1, a.res2 = m.res2, a.qkv = m.qkv, a.fch = m.fch_gelu;
        a.k_cache = m.k_cache, a.v_cache = m.v_cache, a.cache_layer = infer_detail::layer_cache_offset(m, 1);
        a.pos = m.pos, a.part = part, a.sync = sync, a.trace = nullptr;
        a.L = c.num_layers, a.C = c.channels, a.H = model_mlp_hidden(c), a.QKV = model_qkv_channels(c);
        a.NH = c.num_heads, a.NKV = c.num_kv_heads, a.HD = model_head_dim(c), a.S = m.S, a.window = m.window;
        a.nsplit = plan.nsplit, a.slots = plan.slots, a.slot_bytes = plan.slot_bytes, a.xs_bytes = plan.xs_bytes;
    }
    ~Persistent() {
        cudaFree(part);
        cudaFree(sync);
        cudaFree(trace);
    }
    void layers(ModelInfer& m, cudaStream_t s) const {
        decode_persistent_forward(plan, args, m.B, s);
        cudaCheckLaunch();
    }
    // A folded greedy step: advance_and_encode, the persistent layers, then the shipped head.
    void step(ModelInfer& m, const GenerateLimits& lim, const CudaContext& ctx) const {
        const int C = m.config.channels, threads = std::min(1024, norm_block_per_row_threads(C));
        launch_kernel(infer_detail::advance_and_encode, dim3(m.B), dim3(threads), 0, ctx.stream, false, m.res1,
                      m.step_out, m.tokens, m.pos, m.produced, m.active, m.pending, m.params.wte, m.params.wpe,
                      m.lengths, lim, m.max_seq, C);
        cudaCheckLaunch();
        layers(m, ctx.stream);
        infer_detail::decode_head_fused(m, ctx);
    }
    // Block 0's time per phase and per barrier, averaged over the layers of the last traced run.
    void print_trace(const ModelInfer& m) const {
        const int L = m.config.num_layers, P = PERSIST_TRACE_POINTS;
        std::vector<unsigned long long> t((size_t)L * P);
        cudaCheck(cudaMemcpy(t.data(), trace, t.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        const char* phase[5] = {"qkv", "attention", "attproj", "fc", "fcproj"};
        for (int k = 0; k < 5; k++) {
            double work = 0, wait = 0;
            int waits = 0;
            for (int l = 0; l < L; l++) {
                const unsigned long long* r = &t[(size_t)l * P];
                work += (double)(r[2 * k + 1] - r[2 * k]);
                if (k < 4) wait += (double)(r[2 * k + 2] - r[2 * k + 1]), waits++;
                else if (l + 1 < L) wait += (double)(r[P] - r[2 * k + 1]), waits++;
            }
            printf("    persistent phase %-9s work %6.2f us, barrier %6.2f us (block 0, per layer)\n", phase[k],
                   1e-3 * work / L, waits ? 1e-3 * wait / waits : 0.0);
        }
    }
};

bool finite(const std::vector<float>& v, const char* what) {
    for (size_t i = 0; i < v.size(); i++)
        if (!std::isfinite(v[i])) {
            printf("    %-10s FAIL: element %zu is %g\n", what, i, v[i]);
            return false;
        }
    printf("    %-10s all %zu finite  ok\n", what, v.size());
    return true;
}

// The variants of one model at batch B.
void run_shape(lab::Lab& lab, const char* desc, int B) {
    const ModelConfig c = model_config_from_descriptor(desc);
    const int V = c.vocab_size, Vp = c.padded_vocab_size;
    std::vector<float> params(model_num_params(c));
    model_init_params(params.data(), c, 1337);
    ModelInfer m;
    model_infer_build(m, c, params.data(), B, PROMPT, MAX_SEQ, 1, lab.ctx);
    const CudaContext& ctx = lab.ctx;
    cudaStream_t s = ctx.stream;
    GenerateLimits lim{};
    lim.sampling = SamplingParams{0.0f, 0, 1.0f};
    lim.eot = -1;
    lim.max_new = MAX_SEQ;
    model_infer_warmup(m, lim, ctx);  // also leaves every sequence idle

    const std::vector<int> tokens = lab::rand_ints((size_t)B * PROMPT, 7, V), lengths(B, PROMPT), active(B, 1);
    std::vector<uint64_t> rng(B);
    for (int b = 0; b < B; b++) rng[b] = Rng::skip(7, (uint64_t)b << 32).state;
    auto prefill = [&] { model_infer_prefill(m, tokens.data(), lengths.data(), active.data(), rng.data(), PROMPT, ctx); };

    const DecodeStepPlan shipped = m.plan;
    const double X = sizeof(floatX), HD = model_head_dim(c);
    const double bytes = (double)model_num_params(c) * X + 2.0 * c.num_layers * B * c.num_kv_heads * PROMPT * HD * X;
    const double flops = 2.0 * (double)model_num_params(c) * B;
    char op[160];
    snprintf(op, sizeof op, "decode_step %s B=%d prompt=%d", model_arch_name(c), B, PROMPT);
    printf("\n# %s (%s): shipped plan fused=%d gemv=%d pdl=%d fold_argmax=%d decode_mma=%d\n", op, desc,
           shipped.fused, shipped.gemv, shipped.pdl, shipped.fold_argmax, shipped.decode_mma);

    const lab::Tol tol = HAS_MASTER ? lab::Tol{5e-2, 5e-2} : lab::Tol{1e-3, 1e-3};
    auto logits = [&] {  // (B, V) of the (B, Vp) rows
        std::vector<float> got;
        for (int b = 0; b < B; b++) {
            const std::vector<float> row = device_to_float(m.logits + (size_t)b * Vp, V);
            got.insert(got.end(), row.begin(), row.end());
        }
        return got;
    };
    std::vector<float> ref;  // variant 0's logits after one step
    auto logits_check = [&](bool is_ref) {
        const std::vector<float> got = logits();
        if (!finite(got, "logits")) return false;
        if (is_ref) {
            ref = got;
            return true;
        }
        return ref.empty() || lab.compare("logits", got, ref, tol);
    };
    auto graph_variant = [&](int id, const char* what, const std::function<void()>& step) {
        if (!lab.selected(id)) return;
        Graph g;
        g.capture(step, s);
        lab.run(op, id, what, bytes, flops, lab::Bound::Memory, prefill, [&] { g.replay(s); },
                [&] { return logits_check(id == 0); });
    };
    auto plan_variant = [&](int id, const char* what, DecodeStepPlan p) {
        const bool same = p.gemv == shipped.gemv && p.fused == shipped.fused && p.pdl == shipped.pdl &&
                          p.fold_argmax == shipped.fold_argmax && p.decode_mma == shipped.decode_mma &&
                          p.append_in_attention == shipped.append_in_attention && p.gemv_mma == shipped.gemv_mma;
        if (id != 0 && same) return;
        m.plan = p;
        graph_variant(id, what, [&] { model_infer_step(m, lim, ctx); });
        m.plan = shipped;
    };

    plan_variant(0, "shipped", shipped);
    DecodeStepPlan p = shipped;
    p.pdl = false;
    plan_variant(1, "no PDL", p);
    p = shipped;
    if (shipped.fused) p.fused = p.fold_argmax = false;
    p.append_in_attention = false;
    plan_variant(2, shipped.fused ? "one op a kernel" : "kv_cache_append apart", p);
    p = shipped;
    p.gemv = false;
    p.fused = p.fold_argmax = false;
    if (shipped.gemv && shipped.fused) plan_variant(3, "cuBLASLt matmuls", p);
    p = shipped;
    p.fold_argmax = false;
    plan_variant(4, "sampler kernel, no folded argmax", p);
    p = shipped;
    p.decode_mma = false;
    plan_variant(5, "CUDA-core decode attention", p);
    p = shipped;
    p.gemv_mma = false;
    if (shipped.fused && B == GEMV_MAX_M) plan_variant(11, "CUDA-core fused GEMVs", p);

    const bool fused = shipped.fused;
    std::unique_ptr<Persistent> pers;
    if (fused && (lab.selected(6) || lab.selected(10))) {
        pers.reset(new Persistent(m));
        if (!pers->plan.ok) printf("  %s | 6, 10 persistent: skipped (%s)\n", op, pers->plan.why);
    }
    if (pers && pers->plan.ok) graph_variant(6, "persistent layers", [&] { pers->step(m, lim, ctx); });
    if (lab.selected(7))
        lab.run(op, 7, "shipped, plain launches", bytes, flops, lab::Bound::Memory, prefill,
                [&] { model_infer_step(m, lim, ctx); }, [&] { return logits_check(false); });

    if (!fused) return;
    const double layer_bytes = bytes - (double)c.padded_vocab_size * c.channels * X;
    auto res1_finite = [&] { return finite(device_to_float(m.res1, (size_t)B * c.channels), "res1"); };
    lab.run(op, 8, "phase: layers", layer_bytes, flops, lab::Bound::Memory, prefill,
            [&] { infer_detail::decode_layers_fused(m, ctx); }, res1_finite);
    lab.run(op, 9, "phase: norm+lm_head+argmax", (double)c.padded_vocab_size * c.channels * X,
            2.0 * c.padded_vocab_size * c.channels * B, lab::Bound::Memory, prefill,
            [&] { infer_detail::decode_head_fused(m, ctx); }, [&] { return finite(logits(), "logits"); });
    if (pers && pers->plan.ok && lab.selected(10)) {
        lab.run(op, 10, "phase: persistent layers", layer_bytes, flops, lab::Bound::Memory, prefill,
                [&] { pers->layers(m, s); }, res1_finite);
        if (!lab.check_only()) {  // one traced run for the phase table
            pers->args.trace = pers->trace;
            pers->layers(m, s);
            cudaCheck(cudaStreamSynchronize(s));
            pers->args.trace = nullptr;
            pers->print_trace(m);
        }
    }
    model_infer_free(m);
}

}  // namespace

int main(int argc, char** argv) {
    lab::Lab lab(argc, argv, "decode_step.cu");
    for (const char* desc : {"d12", "llama:L12,C768,H12,KV4,F2048"})
        for (int B : {1, 8, 64}) run_shape(lab, desc, B);
    return lab.finish();
}
