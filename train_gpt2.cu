// train_gpt2.cu: the GPU trainer, the program around the GPT-2 model of llmc/model_train.cuh: flags,
// data, the training loop, logging, checkpoints. Mixed precision (bf16 parameters, activations and
// gradients; fp32 master weights and AdamW moments); the same code built with PRECISION_FP32 (make
// builds it as build/train_gpt2cu_fp32) runs in plain fp32, and the tests hold that build to
// PyTorch at fp32 tolerances. Its sections follow train_gpt2_cpu.cpp.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <string>
#include <vector>
#include "llmc/model_train.cuh"
#include "llmc/model_infer.cuh"
#include "llmc/model_dist.cuh"
#include "llmc/model_graph.cuh"
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/hellaswag.h"
#include "llmc/formats.h"
#include "llmc/model_config.h"
#include "llmc/rand.h"
#include "llmc/sampler.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"
#include "llmc/train_config.h"

// ============================================================================ training loop
struct GpuFlags {
    int recompute = 0;         // --recompute 0|1
    int deterministic = 0;     // --deterministic 0|1
    int random_data = 0;       // --random-data 0|1
    int graph = 1;             // --graph 0|1
    int stochastic_rounding = 1;  // --stochastic-rounding 0|1
    float peak_tflops = 0.0f;  // --peak-tflops (0: from the device name)
    int matmul_autotune = 0;   // --matmul-autotune 0|1
};

// bf16 dense peak of the device for MFU, by name; 0 if unknown.
inline float device_peak_tflops(const cudaDeviceProp& p) {
    const std::string name = p.name;
    if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989.0f;
    return 0.0f;
}

// The FP8 settings of the --fp8* flags (llmc/model_fp8.cuh).
static Fp8Settings fp8_settings(const TrainConfig& cfg) {
    Fp8Settings f;
    f.enabled = cfg.fp8 != 0;
    f.scaling = cfg.fp8_scaling == "delayed" ? Fp8Scaling::DELAYED
              : cfg.fp8_scaling == "rowwise" ? Fp8Scaling::ROWWISE : Fp8Scaling::CURRENT;
    f.wgrad_bf16 = cfg.fp8_wgrad == "bf16";
    f.grad = cfg.fp8_grad == "e4m3" ? Fp8Format::E4M3 : Fp8Format::E5M2;
    f.history = cfg.fp8_history;
    f.bf16_layers = cfg.fp8_bf16_layers;
    f.fast_accum = cfg.fp8_fast_accum != 0;
    f.linears = cfg.fp8_linears;
    f.fused = cfg.fp8_fused != 0;
    f.head = cfg.fp8_head != 0;
    return f;
}

int main(int argc, char** argv) {
    TrainConfig cfg;
    GpuFlags gpu;
    FlagParser parser("train_gpt2cu", "Trains GPT-2 on one GPU (" PRECISION_NAME " build). Example:\n"
                      "  build/train_gpt2cu --train \"data/tinyshakespeare/*_train.bin\" --val \"data/tinyshakespeare/*_val.bin\" --init d12");
    add_train_flags(parser, cfg);
    add_fp8_flags(parser, cfg);
    parser.add_int("--recompute", &gpu.recompute, {0, 1}, "1 = keep only what the backward cannot cheaply rebuild "
                   "(LayerNorm and GELU outputs are rebuilt in the backward): less memory, a little slower");
    parser.add_int("--deterministic", &gpu.deterministic, {0, 1}, "1 = bit-reproducible runs: the attention backward "
                   "sums dQ in a fixed order (slower) instead of by fp32 atomics");
    parser.add_int("--stochastic-rounding", &gpu.stochastic_rounding, {0, 1}, "bf16 build: 1 = AdamW writes the "
                   "updated bf16 parameters with stochastic rounding (unbiased), 0 = to nearest (small updates are "
                   "lost; for comparison, docs/numerics.md)");
    parser.add_int("--random-data", &gpu.random_data, {0, 1}, "1 = train on random tokens, no files (benchmarks)");
    parser.add_int("--graph", &gpu.graph, {0, 1}, "1 = after the first step, run each step as one CUDA graph (no launch "
                   "gaps or host waits inside it; the same bits as 0 with --deterministic 1; one GPU: data-parallel runs stay eager)");
    parser.add_int("--matmul-autotune", &gpu.matmul_autotune, {0, 1}, "1 = the first step times up to ~28 of "
                   "cuBLASLt's algorithms for each distinct matmul (bf16 and FP8; a few seconds) and every later step "
                   "runs the fastest, instead of the heuristic's first pick; the choice follows the timings, so two "
                   "runs may round differently (not with --deterministic 1)");
    parser.add_float("--peak-tflops", &gpu.peak_tflops, {0, 1e6}, "bf16 dense peak for MFU (0 = by device name: H100/H200 989)");
    parser.parse(argc, argv);
    if (gpu.random_data && cfg.train_pattern.empty()) cfg.train_pattern = "(random)";  // no files needed
    validate_train_config(cfg);
    if (gpu.matmul_autotune && gpu.deterministic)
        fail("--matmul-autotune 1 picks algorithms by their timings, so runs may round differently: not with "
             "--deterministic 1");
    std::unique_ptr<Comm> comm = dist_init(cfg, &argc, &argv);  // data parallel: llmc/dist.h, llmc/model_dist.cuh
    set_world_size(cfg, comm->world);

    // the model: a checkpoint to resume, a model file, or a fresh init from a descriptor (before the
    // device starts, so a model this trainer cannot run fails at once)
    RunFiles files = dist_open_run_files(cfg, *comm);  // --resume, --out-dir, --log checked and prepared (llmc/checkpoint.h)
    const std::string& resume_dir = files.resume_from;
    RunLog& log = files.log;
    std::string init_path = !resume_dir.empty() ? resume_dir + "/model.bin" : cfg.init;
    const bool from_file = !resume_dir.empty() || file_exists(init_path.c_str());
    ModelConfig config = from_file ? model_read_info(init_path.c_str()).config : model_config_from_descriptor(cfg.init.c_str());
    const std::string source = from_file ? init_path : "--init " + cfg.init;
    apply_shape_flags(config, cfg, !from_file, init_path.c_str());
    model_check_gpu_support(config, source.c_str());
    if (cfg.fp8) {
        ModelFp8 probe;
        probe.set = fp8_settings(cfg);
        model_check_fp8_support(probe, config, cfg.B * cfg.T);
    }
    check_sample_length(cfg, config);

    CudaContext ctx;
    ctx.init(gpu_dp_device(*comm));
    if (cfg.fp8) fp8_check_device(ctx.props);
    printf("device: %s, %d SMs, %.1f GiB; precision %s, attention %s; %s\n", ctx.props.name,
           ctx.props.multiProcessorCount, ctx.props.totalGlobalMem / 1073741824.0, PRECISION_NAME, ATTENTION_NAME,
           kernel_path_name());
    model_print_config(config);
    Model model;
    GpuDataParallel dp = gpu_dp_plan(model, config, *comm, cfg);
    model.fp8.set = fp8_settings(cfg);
    if (cfg.fp8)
        printf("fp8: %s%s%s%sin FP8 (e4m3 x e4m3 forward%s, %s gradients, weight gradient in %s), %s scaling%s; head %s%s\n",
               cfg.fp8_linears & 1 ? "qkv " : "", cfg.fp8_linears & 2 ? "attproj " : "", cfg.fp8_linears & 4 ? "fc " : "",
               cfg.fp8_linears & 8 ? "fcproj " : "", cfg.fp8_fast_accum ? " with fast accumulation" : "", cfg.fp8_grad.c_str(),
               cfg.fp8_wgrad.c_str(), cfg.fp8_scaling.c_str(),
               cfg.fp8_scaling == "delayed" ? (", history " + std::to_string(cfg.fp8_history) +
                                                 (cfg.fp8_fused && cfg.fp8_wgrad == "fp8" ? ", fused casts" : ", separate casts")).c_str()
                                              : "",
               cfg.fp8_head ? ("FP8 (dlogits in " + cfg.fp8_grad + " from the classifier)").c_str() : "bf16",
               cfg.fp8_bf16_layers ? (", first and last " + std::to_string(cfg.fp8_bf16_layers) + " blocks bf16").c_str() : "");
    model_build(model, config, cfg.B, cfg.T, gpu.recompute != 0, ctx);
    gpu_dp_start(dp, model, ctx);
    model.deterministic = gpu.deterministic != 0;
    model.stochastic_rounding = gpu.stochastic_rounding != 0;
    Rng seeds(cfg.seed ^ 0x5EEDull);
    model.sr_seed = seeds.next_u64();
    Rng sample_rng(seeds.next_u64());
    {
        std::vector<float> host(model.num_params);
        if (from_file) model_read_fp32(init_path.c_str(), host.data());
        else model_init_params(host.data(), config, cfg.seed);
        model_set_params(model, host.data());
    }

    // data
    const int B = cfg.B, T = cfg.T, N = B * T, V = config.vocab_size;
    DataLoader* train_loader = nullptr;
    DataLoader* val_loader = nullptr;
    if (!gpu.random_data) {
        const int r = comm->rank, w = comm->world;  // each rank its own windows
        train_loader = new DataLoader(cfg.train_pattern.c_str(), B, T, r, w, V, cfg.seed, true);
        check_data_vocab(*train_loader, cfg.data_vocab, V);  // the data's tokenizer is the model's
        if (!cfg.val_pattern.empty()) {
            val_loader = new DataLoader(cfg.val_pattern.c_str(), B, T, r, w, V, cfg.seed, false);
            check_data_vocab(*val_loader, cfg.data_vocab, V);
        }
    }
    HellaSwagEval* hellaswag = cfg.hellaswag_path.empty() || !comm->primary()  // rank 0 alone scores and samples
                                   ? nullptr : new HellaSwagEval(cfg.hellaswag_path.c_str(), B, T, V, cfg.data_vocab);
    Rng data_rng(cfg.seed ^ 0xDA7Aull ^ ((uint64_t)comm->rank << 32));
    std::vector<int> rand_inputs(N), rand_targets(N);
    Tokenizer* tokenizer = open_model_tokenizer(cfg.tokenizer_path, V);
    const int eot = sampling_eot(tokenizer, V);

    if (!resume_dir.empty()) {
        TrainState st = gpu_dp_load_checkpoint(dp, model, resume_dir);
        if (train_loader) train_loader->load_state(st.loader);
        else data_rng.state = (uint64_t)st.loader[0];
        sample_rng.state = st.rng_state;
        printf("resumed from %s at step %lld\n", resume_dir.c_str(), (long long)st.step);
    }
    const std::string& out_dir = cfg.out_dir;  // open_run_files defaults it to the resumed checkpoint's directory

    int total_steps = cfg.steps;
    if (total_steps < 0) {
        if (!train_loader) fail("--steps: needed with --random-data (there is no epoch to count)");
        total_steps = (int)std::max<int64_t>(1, train_loader->num_windows() / cfg.grad_accum);
    }
    cfg.schedule.total_steps = total_steps;
    check_steps_left(model.step, total_steps, resume_dir);
    const float peak = gpu.peak_tflops > 0 ? gpu.peak_tflops : device_peak_tflops(ctx.props);
    const double tokens_per_step = (double)cfg.total_batch, flops_step = flops_per_token(config, T) * tokens_per_step;
    printf("batch: B=%d T=%d, %d micro-steps, %lld tokens per step; %d steps; peak %.0f TFLOP/s\n", B, T, cfg.grad_accum,
           (long long)cfg.total_batch, total_steps, peak);
    const OptimizerSettings opt_base{0.0f, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.grad_clip};
    const float dloss = 1.0f / ((float)N * cfg.grad_accum * comm->world);

    auto validate = [&](int64_t step) {
        if (!val_loader) return;
        val_loader->reset();
        double sum = 0.0;
        for (int i = comm->rank; i < cfg.val_steps; i += comm->world) {  // batch i is rank i % world's
            val_loader->next_batch();
            model_upload_batch(model, val_loader->inputs(), val_loader->targets(), B, T, false, ctx);
            model_forward(model, B, T, ctx);
            sum += model_loss(model, B, T, dloss, false, ctx);
        }
        const float val = (float)(comm->allreduce_sum(sum) / cfg.val_steps);
        printf("step %lld val_loss %.6f\n", (long long)step, val);
        log.line("step %lld val_loss %.6f\n", (long long)step, val);
    };
    auto score_hellaswag = [&](int64_t step) {
        if (!hellaswag) return;
        const HellaSwagScore s = hellaswag->run([&](const int* inputs, const int* targets, int rows, int seq) {
            model_upload_batch(model, inputs, targets, rows, seq, false, ctx);
            model_forward(model, rows, seq, ctx);
            model_loss(model, rows, seq, dloss, false, ctx);  // waits for the losses in model.host_losses
            return (const float*)model.host_losses;
        });
        const std::string line = hellaswag_log_line(step, s);
        printf("%s\n", line.c_str());
        log.line("%s\n", line.c_str());
    };
    ModelInfer sampler;  // one sequence, the model's whole context: the trainer's samples through the KV cache
    const bool sampling = cfg.sample_every > 0 && comm->primary();
    if (sampling) model_infer_build(sampler, config, nullptr, 1, 1, config.max_seq_len, 1);
    auto sample = [&](int64_t step) {
        // a ZeRO 1/2 all-gather of the updated parameters may still be running: the copy waits for all of it
        if (model.before_layer_forward)
            for (int l = -1; l < config.num_layers; l++) model.before_layer_forward(l);
        std::vector<int> toks =
            model_infer_sample(sampler, model.params_memory, eot, cfg.gen_tokens, cfg.temperature, sample_rng, ctx);
        printf("step %lld sample: ", (long long)step);
        print_sample(tokenizer, toks);
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
    // --graph 1 (llmc/model_graph.cuh): the first step runs eagerly (it loads every kernel), then the
    // step is captured, and each later step is one graph launch; the host stages the next step's
    // batches into the other staging slot while the graph runs. A checkpoint then stores the position
    // of the staged slot's first batch (fetched ahead but not trained on).
    const bool use_graph = gpu.graph && !dp.nccl_on;
    if (gpu.graph && dp.nccl_on) printf("graph: off (the data-parallel step stays eager)\n");
    ModelGraph graph;
    int slot = 0;                       // the staging slot of the next graph step
    bool staged = false;                // slot holds the next step's batches
    int64_t slot_position[2][16] = {};  // data position of each slot's first batch
    auto stage_next_step = [&]() {
        memcpy(slot_position[slot], next_position, sizeof(next_position));
        for (int micro = 0; micro < cfg.grad_accum; micro++) {
            model_graph_stage(graph, model, slot, micro, next_inputs.data(), next_targets.data());
            fetch_batch();
        }
        staged = true;
    };
    auto save = [&]() {
        gpu_dp_save_checkpoint(dp, model, out_dir, staged ? slot_position[slot] : next_position, sample_rng.state);
    };
    float* step_losses = nullptr;  // pinned (grad_accum, N)
    cudaCheck(cudaMallocHost(&step_losses, sizeof(float) * N * cfg.grad_accum));
    fetch_batch();

    // --matmul-autotune 1: the first step (eager, before any capture) tunes each distinct matmul; every
    // later call of the same shape, in the graph too, runs the kept algorithm (llmc/matmul.cuh)
    MatmulAlgoCache algos;
    if (gpu.matmul_autotune) {
        algos.tune = true;
        ctx.matmul_algos = &algos;
    }
    std::vector<double> step_ms;
    double total_ms = 0.0;
    for (int64_t step = model.step; step < total_steps; step++) {
        if (cfg.val_every > 0 && step % cfg.val_every == 0) validate(step);
        if (cfg.hellaswag_every > 0 && step % cfg.hellaswag_every == 0) score_hellaswag(step);
        if (sampling && step > 0 && step % cfg.sample_every == 0) sample(step);
        auto t0 = std::chrono::steady_clock::now();
        OptimizerSettings opt = opt_base;
        opt.lr = lr_at_step(cfg.schedule, (int)step);
        float norm = 0.0f;
        if (staged) {  // a graph step
            model_graph_launch(graph, model, slot, opt, ctx);
            slot ^= 1;
            staged = false;
            if (step + 1 < total_steps) stage_next_step();  // while the GPU runs this step
            cudaCheck(cudaStreamSynchronize(ctx.stream));
            norm = model_update_norm(model);
        } else {
            gpu_dp_zero_grads(dp, model, ctx);
            for (int micro = 0; micro < cfg.grad_accum; micro++) {
                model_upload_batch(model, next_inputs.data(), next_targets.data(), B, T, true, ctx);
                model_forward(model, B, T, ctx);
                model_classifier(model, B, T, dloss, true, step_losses + (size_t)micro * N, ctx);
                gpu_dp_before_backward(dp, micro == 0, micro + 1 == cfg.grad_accum);  // its buckets reduce during it?
                model_backward(model, B, T, ctx);
                fetch_batch();
            }
            gpu_dp_wait_grads(dp, ctx);
            norm = gpu_dp_update(dp, model, opt, ctx);  // returns with the compute stream idle
            algos.tune = false;  // tuned in this first step
            if (use_graph && step + 1 < total_steps) {  // every kernel has run once: capture the step
                if (!graph.exec[0]) {
                    model_graph_build(graph, model, cfg.grad_accum, dloss, cfg.grad_clip, step_losses, ctx);
                    printf("graph: the step captured as one CUDA graph of %zu nodes; steps %lld.. launch it\n",
                           graph.nodes, (long long)(step + 2));
                }
                stage_next_step();
            }
        }
        const double loss = comm->allreduce_sum(mean_of(step_losses, (int64_t)N * cfg.grad_accum)) / comm->world;
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        step_ms.push_back(ms);
        total_ms += ms;
        const double tok_s = tokens_per_step / (ms / 1000.0);
        const double mfu = peak > 0 ? 100.0 * flops_step / (ms / 1000.0) / (peak * 1e12) : 0.0;
        const std::string eta = format_duration((total_ms / step_ms.size()) * (total_steps - step - 1) / 1000.0);
        printf("step %5lld/%d | loss %.6f | norm %.4f | lr %.3e | %.2f ms | %.0f tok/s | MFU %.1f%% | ETA %s\n",
               (long long)(step + 1), total_steps, loss, norm, opt.lr, ms, tok_s, mfu, eta.c_str());
        log.line("step %lld train_loss %.6f lr %.6e grad_norm %.6f ms %.3f tok_s %.1f\n", (long long)(step + 1), loss,
                 opt.lr, norm, ms, tok_s);
        check_step_finite(step + 1, loss, norm, out_dir);
        const bool last = step + 1 == total_steps;
        if (!out_dir.empty() && (last || (cfg.ckpt_every > 0 && (step + 1) % cfg.ckpt_every == 0))) save();
    }
    if (cfg.val_every > 0) validate(total_steps);
    score_hellaswag(total_steps);
    if (sampling) sample(total_steps);
    if (!step_ms.empty()) {
        // median after warm-up: the first steps pay cuBLAS heuristics and allocator first touches
        const size_t warm = std::min<size_t>(step_ms.size() / 2, 3);
        std::vector<double> timed(step_ms.begin() + warm, step_ms.end());
        std::sort(timed.begin(), timed.end());
        const double median = timed[timed.size() / 2];
        const size_t allocated = model.allocated_bytes + dp.allocated_bytes + sampler.allocated_bytes;
        const std::string name = std::string(MODEL_USES_CUDNN ? "ours_cudnn" : "ours") + (cfg.fp8 ? "_fp8" : "");
        printf("BENCH name=%s ms=%.2f tok_s=%.0f peak_gib=%.2f\n", name.c_str(), median,
               tokens_per_step / (median / 1000.0), allocated / 1073741824.0);
    }
    log.close();
    model_graph_free(graph);
    cudaCheck(cudaFreeHost(step_losses));
    delete train_loader;
    delete val_loader;
    delete hellaswag;
    delete tokenizer;
    if (sampling) model_infer_free(sampler);
    gpu_dp_finish(dp);
    model_free(model);
    ctx.destroy();
    comm->finish();
    return 0;
}
