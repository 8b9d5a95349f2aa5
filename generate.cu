// generate.cu: text generation on the GPU with a KV cache (llmc/model_infer.cuh), the twin of
// generate_cpu.cpp: the same flags, prompts, errors and output (llmc/generate_args.h).
//   make build/generate            (bf16 weights and activations; build/generate_fp32: fp32)
//   build/generate --model out/d12/ --tokenizer data/gpt2_tokenizer.bin --prompt "To be, or not"
//       --max-new 64 --temperature 0.8 --top-k 40
// A batch's prompts are prefilled at once (right-padded), then each new token is one replay of a CUDA
// graph (sampling on the GPU, the forward of the B new tokens against the cache); the host only copies
// the B new tokens back to print them (as generate_cpu.cpp). Timings go to stderr.
// Debug and speed: --graph 0 launches the step's kernels one by one; --check-full 1 compares each
// step's logits with the training model's full forward over the same tokens; --bench 1 times random
// prompts (with --init dN no file is needed) and prints one BENCH_GEN line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>
#include "llmc/model_infer.cuh"
#include "llmc/generate_args.h"
#include "llmc/model_reference.cuh"

// ------------------------------------------------------------------------------------------------
// the full-forward check (--check-full 1)
// The reference for the cached logits: the training forward's kernels over one whole sequence
// (llmc/model_reference.cuh), so the decode path (cache, decode attention, RoPE, GEMVs) is what is tested.
struct FullCheck {
    ModelReference ref;
    double tolerance = HAS_MASTER ? 5e-2 : 1e-4;  // max |diff| / max |ref logit| over a row (bf16: both paths round)
    double worst = 0.0;
    long rows = 0, failures = 0;
};

// Compares row b of the cached logits (B, Vp) with the full forward's last position over `seq`.
static void check_row(FullCheck& fc, const ModelInfer& m, int b, const std::vector<int>& seq, const CudaContext& ctx) {
    const int V = m.config.vocab_size, Vp = m.config.padded_vocab_size, n = (int)seq.size();
    model_reference_forward(fc.ref, seq.data(), n, ctx);
    const std::vector<float> want = device_to_float(fc.ref.logits + (size_t)(n - 1) * Vp, V);
    const std::vector<float> got = device_to_float(m.logits + (size_t)b * Vp, V);
    double diff = 0.0, scale = 1e-30;
    for (int v = 0; v < V; v++) {
        diff = std::max(diff, (double)std::fabs(got[v] - want[v]));
        scale = std::max(scale, (double)std::fabs(want[v]));
    }
    const double rel = diff / scale;
    fc.worst = std::max(fc.worst, rel);
    fc.rows++;
    if (!(rel <= fc.tolerance)) {
        if (fc.failures++ < 5)
            fprintf(stderr, "check-full: sequence %d at %d tokens: max |diff| %.3g of max |logit| %.3g (%.3g > %.1g)\n",
                    b, n, diff, scale, rel, fc.tolerance);
    }
}

// ------------------------------------------------------------------------------------------------
// generation
struct RunOptions {
    GenerateLimits lim;
    int max_seq;
    bool graph;
    FILE* dump;      // the logits of each step (sequence 0), or nullptr
    FullCheck* check;  // or nullptr
    int* host_out;   // pinned (B)
};

// Generates after prompts[0..n) at once (n <= m.B; the other rows idle); sequence b draws from
// rngs[b], which continue where the GPU left them. With `stream` (n = 1) each token is printed as it
// comes, else the completions are returned for the caller to print.
static std::vector<std::vector<int>> generate(ModelInfer& m, const std::vector<const Prompt*>& prompts,
                                              const RunOptions& o, std::vector<Rng>& rngs, const Tokenizer* tok,
                                              bool stream, Timings& tm, const CudaContext& ctx) {
    const int n = (int)prompts.size(), B = m.B, V = m.config.vocab_size;
    int T = 0;
    for (const Prompt* p : prompts) T = std::max(T, (int)p->ids.size());
    std::vector<int> tokens((size_t)B * T, 0), lengths(B, 1), active(B, 0);
    std::vector<uint64_t> rng(B, 0);
    std::vector<std::vector<int>> seqs(n);  // prompt + new tokens, for --check-full
    for (int b = 0; b < n; b++) {
        lengths[b] = (int)prompts[b]->ids.size();
        active[b] = 1;
        rng[b] = rngs[b].state;
        std::copy(prompts[b]->ids.begin(), prompts[b]->ids.end(), tokens.begin() + (size_t)b * T);
        seqs[b] = prompts[b]->ids;
        tm.prefill_tokens += lengths[b];
    }
    double t0 = seconds_now();
    model_infer_prefill(m, tokens.data(), lengths.data(), active.data(), rng.data(), T, ctx);
    tm.prefill_s += seconds_now() - t0;
    if (o.check)
        for (int b = 0; b < n; b++) check_row(*o.check, m, b, seqs[b], ctx);

    std::vector<std::vector<int>> out(n);
    std::vector<char> done(n, 0);
    std::vector<float> row;
    for (;;) {
        if (o.dump && !done[0]) {
            row = device_to_float(m.logits, V);
            fwrite_or_fail(row.data(), sizeof(float), V, o.dump, "--dump-logits");
        }
        t0 = seconds_now();
        if (o.graph) model_infer_step_graph(m, o.lim, ctx);
        else model_infer_step(m, o.lim, ctx);
        cudaCheck(cudaMemcpyAsync(o.host_out, m.step_out, sizeof(int) * B, cudaMemcpyDeviceToHost, ctx.stream));
        cudaCheck(cudaStreamSynchronize(ctx.stream));
        tm.decode_s += seconds_now() - t0;
        tm.decode_steps++;
        bool any = false;
        for (int b = 0; b < n; b++) {
            const int id = o.host_out[b];
            if (id < 0) continue;
            const int k = (int)out[b].size(), at = lengths[b] + k;  // the new token's position
            out[b].push_back(id);
            tm.new_tokens++;
            if (stream && id != o.lim.eot) {
                print_token(tok, id, k == 0);
                fflush(stdout);
            }
            // the rule of the device's book-keeping (sample_and_advance)
            done[b] = id == o.lim.eot || k + 1 == o.lim.max_new || k + 1 == o.lim.force_len || at >= o.max_seq;
            if (!done[b]) {
                any = true;
                seqs[b].push_back(id);
                if (o.check) check_row(*o.check, m, b, seqs[b], ctx);
            }
        }
        if (!any) break;
    }
    if (stream) printf("\n");
    cudaCheck(cudaMemcpy(rng.data(), m.rng, sizeof(uint64_t) * B, cudaMemcpyDeviceToHost));
    for (int b = 0; b < n; b++) rngs[b].state = rng[b];
    for (std::vector<int>& c : out)
        if (!c.empty() && c.back() == o.lim.eot) c.pop_back();
    return out;
}

// ------------------------------------------------------------------------------------------------
// --bench 1: B random prompts of P tokens, N new tokens each (no end-of-text stop); a warm-up
// round, then one timed round: prefill, then N steps enqueued back to back, one wait at the end.
static void bench(ModelInfer& m, const GenConfig& g, const GenerateLimits& lim, const CudaContext& ctx) {
    const int B = m.B, P = g.bench_prompt, N = g.max_new, V = m.config.vocab_size;
    Rng r(g.seed);
    std::vector<int> tokens((size_t)B * P), lengths(B, P), active(B, 1);
    for (int& t : tokens) t = (int)r.below(V);
    std::vector<uint64_t> rng(B);
    for (int b = 0; b < B; b++) rng[b] = Rng::skip(g.seed, (uint64_t)b << 32).state;
    cudaEvent_t ev[3];
    for (cudaEvent_t& e : ev) cudaCheck(cudaEventCreate(&e));
    float prefill_ms = 0, decode_ms = 0;
    for (int round = 0; round < 2; round++) {
        cudaCheck(cudaEventRecord(ev[0], ctx.stream));
        model_infer_prefill(m, tokens.data(), lengths.data(), active.data(), rng.data(), P, ctx);
        cudaCheck(cudaEventRecord(ev[1], ctx.stream));
        for (int i = 0; i < N; i++) {
            if (g.graph) model_infer_step_graph(m, lim, ctx);
            else model_infer_step(m, lim, ctx);
        }
        cudaCheck(cudaEventRecord(ev[2], ctx.stream));
        cudaCheck(cudaEventSynchronize(ev[2]));
        cudaCheck(cudaEventElapsedTime(&prefill_ms, ev[0], ev[1]));
        cudaCheck(cudaEventElapsedTime(&decode_ms, ev[1], ev[2]));
    }
    std::vector<int> produced(B);
    cudaCheck(cudaMemcpy(produced.data(), m.produced, sizeof(int) * B, cudaMemcpyDeviceToHost));
    for (int b = 0; b < B; b++)
        if (produced[b] != N) fail("--bench: sequence %d produced %d tokens, not %d", b, produced[b], N);
    printf("BENCH_GEN B=%d prompt=%d new=%d prefill_ms=%.3f ms_per_token=%.4f tok_s=%.0f graph=%d fused=%d "
           "decode_mma=%d autotune=%d arch=%s precision=%s\n", B, P, N, prefill_ms, decode_ms / N,
           (double)B * N / (decode_ms / 1e3), g.graph, (int)m.plan.fused, (int)m.plan.decode_mma, g.matmul_autotune,
           model_arch_name(m.config), PRECISION_NAME);
    for (cudaEvent_t& e : ev) cudaCheck(cudaEventDestroy(e));
}

// ------------------------------------------------------------------------------------------------
// setup
// The model file of --model (a checkpoint directory's model.bin) or --init's descriptor: its config,
// checked against what the GPU runs before the device starts.
struct ModelSource {
    std::string file;    // "" with --init
    std::string source;  // the file, or "--init DESCRIPTOR", for messages
    ModelConfig c{};
};

static ModelSource open_model(const GenConfig& g) {
    ModelSource m;
    m.file = g.init.empty() ? resolve_model_path(g.model_path) : "";
    m.c = g.init.empty() ? model_read_info(m.file.c_str()).config : model_config_from_descriptor(g.init.c_str());
    m.source = g.init.empty() ? m.file : "--init " + g.init;
    model_infer_check_config(m.c, m.source.c_str());
    return m;
}

// The parameters: the model file's, or --init's fresh ones from --seed.
static std::vector<float> read_params(const ModelSource& src, const GenConfig& g) {
    std::vector<float> params(model_num_params(src.c));
    if (g.init.empty()) model_read_fp32(src.file.c_str(), params.data());
    else model_init_params(params.data(), src.c, g.seed);
    return params;
}

// The KV-cache model for the prompts' batches (or --bench's), with --force-ids; one line on stderr.
static void build_model(ModelInfer& m, const ModelSource& src, const std::vector<float>& params, const GenConfig& g,
                        const std::vector<Prompt>& prompts, int max_seq, const std::vector<int>& force,
                        const CudaContext& ctx) {
    const ModelConfig& c = src.c;
    int B = std::min<int>(g.batch, std::max<int>(1, (int)prompts.size()));
    int Tmax = g.interactive ? max_seq : 1;
    for (const Prompt& p : prompts) Tmax = std::max(Tmax, (int)p.ids.size());
    if (g.bench) {
        B = g.batch;
        Tmax = g.bench_prompt;
    }
    model_infer_build(m, c, params.data(), B, Tmax, max_seq, (int)force.size(), ctx);
    if (!force.empty())
        cudaCheck(cudaMemcpy(m.force, force.data(), sizeof(int) * force.size(), cudaMemcpyHostToDevice));
    const char* step = m.plan.fused ? "fused" : "unfused";
    fprintf(stderr, "model %s: L=%d C=%d NH=%d NKV=%d W=%d V=%d; KV cache %d x %d slots (%.1f MiB), batch %d, %s "
            "decode step; %s, %s, %s\n", src.source.c_str(), c.num_layers, c.channels, c.num_heads, c.num_kv_heads,
            c.window, c.vocab_size, B, m.S,
            2.0 * c.num_layers * B * c.num_kv_heads * m.S * model_head_dim(c) * sizeof(floatX) / 1048576.0, B, step,
            ctx.props.name, PRECISION_NAME, kernel_path_name(ctx));
}

// The prompts, in batches and then (--interactive 1) from stdin, with --check-full and --dump-logits;
// returns the exit status.
static int generate_all(ModelInfer& m, const GenConfig& g, const std::vector<Prompt>& prompts,
                        const PromptReader& reader, bool text_prompts, const Tokenizer* tok, const GenerateLimits& lim,
                        int max_seq, const CudaContext& ctx) {
    std::unique_ptr<FullCheck> check;
    if (g.check_full) {
        check.reset(new FullCheck);
        model_reference_build(check->ref, m.config, max_seq, m.params_memory);
    }
    FILE* dump = g.dump_logits.empty() ? nullptr : fopen_or_fail(g.dump_logits.c_str(), "wb");
    int* host_out = nullptr;
    cudaCheck(cudaMallocHost(&host_out, sizeof(int) * m.B));
    const RunOptions o{lim, max_seq, g.graph != 0, dump, check.get(), host_out};
    Timings tm;
    const int status = run_prompts(g, prompts, m.B, reader, text_prompts, tok,
                [&](const std::vector<const Prompt*>& batch, std::vector<Rng>& rngs, bool stream) {
                    return generate(m, batch, o, rngs, tok, stream, tm, ctx);
                });
    if (dump) fclose_or_fail(dump, g.dump_logits.c_str());
    print_timings(tm);
    if (check) {
        fprintf(stderr, "check-full: %ld rows, worst max|diff|/max|logit| %.3g (tolerance %.1g): %s\n", check->rows,
                check->worst, check->tolerance, check->failures ? "FAIL" : "ok");
        model_reference_free(check->ref);
    }
    cudaCheck(cudaFreeHost(host_out));
    return check && check->failures ? 1 : status;
}

int main(int argc, char** argv) {
    GenConfig g;
#ifdef PRECISION_FP32
    parse_gen_args(argc, argv, g, "generate_fp32", true);
#else
    parse_gen_args(argc, argv, g, "generate", true);
#endif
    const ModelSource src = open_model(g);
    const int V = src.c.vocab_size, max_seq = resolve_max_seq(g, src.c, src.source);
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<BpeEncoder> bpe;
    open_tokenizer(g, V, &tok, &bpe);
    const int eot = g.bench ? -1 : resolve_eot(g, tok.get(), src.c);
    const PromptReader reader(bpe.get(), V, max_seq);
    const std::vector<Prompt> prompts = reader.read_all(g.prompts);
    const std::vector<int> force = read_force_ids(g, V, prompts.size());
    if (g.bench && g.bench_prompt + g.max_new > max_seq)
        fail("--bench: --bench-prompt %d + --max-new %d exceed the context of %d positions", g.bench_prompt, g.max_new,
             max_seq);

    const std::vector<float> params = read_params(src, g);
    CudaContext ctx;
    ctx.init(0);
    ModelInfer m;
    build_model(m, src, params, g, prompts, max_seq, force, ctx);
    const GenerateLimits lim{{g.temperature, g.top_k, g.top_p}, eot, g.max_new, (int)force.size()};
    // --matmul-autotune 1: the warm-up step (plain launches, before any prefill, capture or timing)
    // tunes the step's cuBLASLt matmuls; every later call of the same shape uses the kept algorithm
    MatmulAlgoCache algos;
    if (g.matmul_autotune) {
        algos.tune = true;
        ctx.matmul_algos = &algos;
    }
    model_infer_warmup(m, lim, ctx);
    algos.tune = false;
    const int status = g.bench ? (bench(m, g, lim, ctx), 0)
                               : generate_all(m, g, prompts, reader, bpe != nullptr, tok.get(), lim, max_seq, ctx);
    model_infer_free(m);
    ctx.destroy();
    return status;
}
