// train_gpt2.cu: the GPU trainer, the program around the model of llmc/model_train.cuh: flags,
// data, the training loop, logging, checkpoints. Mixed precision (bf16 parameters, activations and
// gradients; fp32 master weights and AdamW moments); the same code built with PRECISION_FP32 (make
// builds it as build/train_gpt2cu_fp32) runs in plain fp32, and the tests hold that build to
// PyTorch at fp32 tolerances. --optimizer muon: llmc/muon.cuh. Its sections follow train_gpt2_cpu.cpp.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <memory>
#include <string>
#include <vector>
#include "llmc/model_train.cuh"
#include "llmc/model_infer.cuh"
#include "llmc/model_dist.cuh"
#include "llmc/model_graph.cuh"
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/dist.h"
#include "llmc/hellaswag.h"
#include "llmc/formats.h"
#include "llmc/model_config.h"
#include "llmc/rand.h"
#include "llmc/run_files.h"
#include "llmc/sampler.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"
#include "llmc/train_config.h"

// ============================================================================ flags
struct GpuFlags {
    int recompute = 0;         // --recompute 0|1
    int deterministic = 0;     // --deterministic 0|1
    int random_data = 0;       // --random-data 0|1
    int graph = 1;             // --graph 0|1
    float peak_tflops = 0.0f;  // --peak-tflops (0: from the device name)
    int matmul_autotune = 0;   // --matmul-autotune 0|1
};

// The whole command line: the flags both trainers share, the FP8 flags and the GPU's own.
static void parse_flags(int argc, char** argv, TrainConfig& cfg, GpuFlags& gpu) {
    FlagParser parser("train_gpt2cu", "Trains GPT-2 on one GPU (" PRECISION_NAME " build). Example:\n"
                      "  build/train_gpt2cu --train \"data/tinyshakespeare/*_train.bin\" --val \"data/tinyshakespeare/*_val.bin\" --init d12");
    add_train_flags(parser, cfg);
    add_fp8_flags(parser, cfg);
    parser.add_int("--recompute", &gpu.recompute, {0, 1}, "1 = keep only what the backward cannot cheaply rebuild "
                   "(LayerNorm and GELU outputs are rebuilt in the backward): less memory, a little slower");
    parser.add_int("--deterministic", &gpu.deterministic, {0, 1}, "1 = bit-reproducible runs: the attention backward "
                   "sums dQ in a fixed order (slower) instead of by fp32 atomics");
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
}

// bf16 dense peak of the device for MFU, by name; 0 if unknown.
static float device_peak_tflops(const cudaDeviceProp& p) {
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
    f.head = cfg.fp8_head != 0;
    return f;
}

static void print_fp8_settings(const TrainConfig& cfg) {
    const std::string history = ", history " + std::to_string(cfg.fp8_history) +
                                (cfg.fp8_wgrad == "fp8" ? ", fused casts" : ", separate casts");
    const std::string head = "FP8 (dlogits in " + cfg.fp8_grad + " from the classifier)";
    const std::string bf16_layers = ", first and last " + std::to_string(cfg.fp8_bf16_layers) + " blocks bf16";
    printf("fp8: %s%s%s%sin FP8 (e4m3 x e4m3 forward%s, %s gradients, weight gradient in %s), %s scaling%s; head %s%s\n",
           cfg.fp8_linears & 1 ? "qkv " : "", cfg.fp8_linears & 2 ? "attproj " : "", cfg.fp8_linears & 4 ? "fc " : "",
           cfg.fp8_linears & 8 ? "fcproj " : "", cfg.fp8_fast_accum ? " with fast accumulation" : "",
           cfg.fp8_grad.c_str(), cfg.fp8_wgrad.c_str(), cfg.fp8_scaling.c_str(),
           cfg.fp8_scaling == "delayed" ? history.c_str() : "", cfg.fp8_head ? head.c_str() : "bf16",
           cfg.fp8_bf16_layers ? bf16_layers.c_str() : "");
}

// ============================================================================ the run
// Everything one run holds, set up by the functions below in main's order.
struct GpuRun {
    TrainConfig cfg;
    GpuFlags gpu;
    std::unique_ptr<Comm> comm;
    RunFiles files;  // the checkpoint to resume, the model to load, --out-dir, --log
    // the model
    ModelConfig config{};
    bool from_file = false;  // files.init is a model file (else a descriptor)
    CudaContext ctx;
    Model model;
    GpuDataParallel dp;
    MatmulAlgoCache algos;  // --matmul-autotune 1
    // data
    std::unique_ptr<DataLoader> train, val;  // train: none with --random-data
    bool masked = false;  // --train's shards carry a loss mask (docs/formats.md): Model::masked_loss
    std::unique_ptr<HellaSwagEval> hellaswag;
    std::unique_ptr<Tokenizer> tokenizer;
    int eot = 0;
    Rng sample_rng, data_rng;  // data_rng: --random-data's tokens
    // the step
    int total_steps = 0;
    float dloss = 0.0f;          // the loss gradient of one position: 1 / the positions of a step
    float peak = 0.0f;           // TFLOP/s, for MFU
    float* step_losses = nullptr;  // pinned (grad_accum, B*T)
    ModelInfer sampler;          // one sequence, the model's whole context (--sample-every)
    bool sampling = false;
    // The host fetches batch k+1 while the GPU runs batch k and reads the losses once a step, so the
    // GPU waits only at step boundaries. A checkpoint stores the position of the first batch fetched
    // ahead but not trained on (with --graph, the staged slot's), so a resumed run fetches it again.
    std::vector<int> next_inputs, next_targets;  // (B*T)
    std::vector<int> next_mask;      // (B*T) masked: next_targets' loss mask
    std::vector<float> next_dloss;   // (B*T) masked: its per-row loss gradients (loss_mask_dloss)
    // masked: the loss masks (grad_accum, B*T) of a step's micro-batches, for its mean loss: an eager
    // step writes step_masks[slot ^ 1], stage_next_step step_masks[slot]; the step just run is slot ^ 1's
    std::vector<int> step_masks[2];
    int64_t next_position[16] = {};  // data position from which next_inputs/next_targets came
    // --graph 1 (llmc/model_graph.cuh): the first step runs eagerly (it loads every kernel), then is
    // captured; each later step is one graph launch while the host stages the next step's batches
    // into the other staging slot.
    bool use_graph = false;
    ModelGraph graph;
    int slot = 0;                       // the staging slot of the next graph step
    bool staged = false;                // slot holds the next step's batches
    int64_t slot_position[2][16] = {};  // data position of each slot's first batch
    // timing
    std::vector<double> step_ms;
    double total_ms = 0.0;
};

// ============================================================================ the model
// A checkpoint to resume, a model file, or a fresh init from a descriptor: its config is read and
// checked before the device starts, so a model this trainer cannot run fails at once.
static void read_model_config(GpuRun& r) {
    const TrainConfig& cfg = r.cfg;
    const std::string& init = r.files.init;
    r.from_file = !r.files.resume_from.empty() || file_exists(init.c_str());
    r.config = r.from_file ? model_read_info(init.c_str()).config : model_config_from_descriptor(init.c_str());
    const std::string source = r.from_file ? init : "--init " + init;
    apply_shape_flags(r.config, cfg, !r.from_file, init.c_str());
    model_check_gpu_support(r.config, source.c_str());
    if (cfg.fp8) {
        ModelFp8 probe;
        probe.set = fp8_settings(cfg);
        model_check_fp8_support(probe, r.config, cfg.B * cfg.T);
    }
    check_sample_length(cfg, r.config);
}

// Whether --train's shards carry a loss mask (docs/formats.md), before the device starts. The FP8
// head's gradient scale is fixed by the unmasked dloss, too small for a masked row's larger gradient.
static void plan_loss_mask(GpuRun& r) {
    if (r.gpu.random_data) return;
    const std::string masked = first_masked_shard(r.cfg.train_pattern.c_str());
    r.masked = !masked.empty();
    if (r.masked && r.cfg.fp8_head)
        fail("--fp8-head 1: %s has a loss mask, which the FP8 head's fixed dlogits scale does not cover; "
             "use --fp8-head 0", masked.c_str());
}

// The device, the model's buffers (and the data-parallel plan's share of them), its parameters.
static void build_model(GpuRun& r) {
    const TrainConfig& cfg = r.cfg;
    r.ctx.init(gpu_dp_device(*r.comm));
    if (cfg.fp8) fp8_check_device(r.ctx.props);
    printf("device: %s, %d SMs, %.1f GiB; precision %s, attention llmc/attention.cuh; %s\n", r.ctx.props.name,
           r.ctx.props.multiProcessorCount, r.ctx.props.totalGlobalMem / 1073741824.0, PRECISION_NAME,
           kernel_path_name(r.ctx));
    model_print_config(r.config);
    r.dp = gpu_dp_plan(r.model, r.config, *r.comm, cfg.dist);
    r.model.fp8.set = fp8_settings(cfg);
    r.model.masked_loss = r.masked;
    r.model.optimizer = optimizer_kind(cfg);  // muon: llmc/muon.cuh, its scratch allocated by model_build
    if (cfg.fp8) print_fp8_settings(cfg);
    model_build(r.model, r.config, cfg.B, cfg.T, r.gpu.recompute != 0, r.ctx);
    gpu_dp_start(r.dp, r.model, r.ctx);
    r.model.deterministic = r.gpu.deterministic != 0;
    Rng seeds(cfg.seed ^ 0x5EEDull);
    r.model.sr_seed = seeds.next_u64();
    r.sample_rng = Rng(seeds.next_u64());
    std::vector<float> host(r.model.num_params);
    if (r.from_file) model_read_fp32(r.files.init.c_str(), host.data());
    else model_init_params(host.data(), r.config, cfg.seed);
    model_set_params(r.model, host.data());
}

// ============================================================================ data
// Each rank its own windows of --train and --val; rank 0 alone scores --hellaswag and samples.
// --doc-mask 1: the document token (doc_mask_token) and the position mode
static void plan_doc_masking(GpuRun& r) {
    r.model.doc_token = doc_mask_token(r.cfg, r.model.config, r.tokenizer ? r.tokenizer->eot_token() : -1);
    r.model.doc_restart = r.cfg.doc_mask && r.cfg.doc_positions == "restart";
}

static void open_data(GpuRun& r) {
    const TrainConfig& cfg = r.cfg;
    const int V = r.config.vocab_size, rank = r.comm->rank, world = r.comm->world;
    if (!r.gpu.random_data) {
        r.train.reset(new DataLoader(cfg.train_pattern.c_str(), cfg.B, cfg.T, rank, world, V, cfg.seed, true));
        check_data_vocab(*r.train, cfg.data_vocab, V);  // the data's tokenizer is the model's
        if (!cfg.val_pattern.empty()) {
            r.val.reset(new DataLoader(cfg.val_pattern.c_str(), cfg.B, cfg.T, rank, world, V, cfg.seed, false));
            check_data_vocab(*r.val, cfg.data_vocab, V);
        }
    }
    if (!cfg.hellaswag_path.empty() && r.comm->primary())
        r.hellaswag.reset(new HellaSwagEval(cfg.hellaswag_path.c_str(), cfg.B, cfg.T, V, cfg.data_vocab));
    r.data_rng = Rng(cfg.seed ^ 0xDA7Aull ^ ((uint64_t)rank << 32));
    r.tokenizer.reset(open_model_tokenizer(cfg.tokenizer_path, V));
    plan_doc_masking(r);
    r.eot = sampling_eot(r.tokenizer.get(), V);
}

// --resume: the model's state and the data position of the checkpoint.
static void resume(GpuRun& r) {
    const std::string& dir = r.files.resume_from;
    TrainState st = gpu_dp_load_checkpoint(r.dp, r.model, dir);
    if (r.train) r.train->load_state(st.loader);
    else r.data_rng.state = (uint64_t)st.loader[0];
    r.sample_rng.state = st.rng_state;
    printf("resumed from %s at step %lld\n", dir.c_str(), (long long)st.step);
}

// The steps to train (--steps, or one epoch), the schedule over them, and what every step shares.
static void plan_steps(GpuRun& r) {
    TrainConfig& cfg = r.cfg;
    r.total_steps = cfg.steps;
    if (r.total_steps < 0) {
        if (!r.train) fail("--steps: needed with --random-data (there is no epoch to count)");
        r.total_steps = (int)std::max<int64_t>(1, r.train->num_windows() / cfg.grad_accum);
    }
    cfg.schedule.total_steps = r.total_steps;
    check_steps_left(r.model.step, r.total_steps, r.files.resume_from);
    r.peak = r.gpu.peak_tflops > 0 ? r.gpu.peak_tflops : device_peak_tflops(r.ctx.props);
    printf("batch: B=%d T=%d, %d micro-steps, %lld tokens per step; %d steps; peak %.0f TFLOP/s\n", cfg.B, cfg.T,
           cfg.grad_accum, (long long)cfg.total_batch, r.total_steps, r.peak);
    r.dloss = mean_dloss((int64_t)cfg.B * cfg.T, cfg.grad_accum, r.comm->world);
}

// ============================================================================ evaluation
// The mean loss of --val-steps validation batches (at most the windows of --val), each batch's own
// (masked) mean: batch i is rank i % world's.
static void validate(GpuRun& r, int64_t step) {
    if (!r.val) return;
    const int B = r.cfg.B, T = r.cfg.T;
    const int steps = (int)std::min<int64_t>(r.cfg.val_steps, r.val->num_windows() * r.comm->world);
    r.val->reset();
    double sum = 0.0;
    for (int i = r.comm->rank; i < steps; i += r.comm->world) {
        r.val->next_batch();
        model_upload_batch(r.model, r.val->inputs(), r.val->targets(), B, T, false, r.ctx);
        model_forward(r.model, B, T, r.ctx);
        sum += model_loss(r.model, B, T, r.dloss, false, r.ctx, r.val->has_mask() ? r.val->mask() : nullptr);
    }
    const float val = (float)(r.comm->allreduce_sum(sum) / steps);
    printf("step %lld val_loss %.6f\n", (long long)step, val);
    r.files.log.line("step %lld val_loss %.6f\n", (long long)step, val);
}

static void score_hellaswag(GpuRun& r, int64_t step) {
    if (!r.hellaswag) return;
    const int doc_token = r.model.doc_token;
    r.model.doc_token = -1;  // HellaSwag's rows are one sequence each (as train_gpt2_cpu's)
    const HellaSwagScore s = r.hellaswag->run([&](const int* inputs, const int* targets, int rows, int seq) {
        model_upload_batch(r.model, inputs, targets, rows, seq, false, r.ctx);
        model_forward(r.model, rows, seq, r.ctx);
        model_loss(r.model, rows, seq, r.dloss, false, r.ctx);  // waits for the losses in model.host_losses
        return (const float*)r.model.host_losses;
    });
    r.model.doc_token = doc_token;
    const std::string line = hellaswag_log_line(step, s);
    printf("%s\n", line.c_str());
    r.files.log.line("%s\n", line.c_str());
}

// The trainer's samples run through the KV cache of llmc/model_infer.cuh, one sequence.
static void build_sampler(GpuRun& r) {
    r.sampling = r.cfg.sample_every > 0 && r.comm->primary();
    if (r.sampling) model_infer_build(r.sampler, r.config, nullptr, 1, 1, r.config.max_seq_len, 1, r.ctx);
}

static void sample(GpuRun& r, int64_t step) {
    // a ZeRO 1/2 all-gather of the updated parameters may still be running: the copy waits for all of it
    if (r.model.before_layer_forward)
        for (int l = -1; l < r.config.num_layers; l++) r.model.before_layer_forward(l);
    std::vector<int> toks = model_infer_sample(r.sampler, r.model.params_memory, r.eot, r.cfg.gen_tokens,
                                               r.cfg.temperature, r.sample_rng, r.ctx);
    printf("step %lld sample: ", (long long)step);
    print_sample(r.tokenizer.get(), toks);
}

// Before step `step`: validation, HellaSwag and a sample, each at its interval.
static void evaluate(GpuRun& r, int64_t step) {
    const TrainConfig& cfg = r.cfg;
    if (cfg.val_every > 0 && step % cfg.val_every == 0) validate(r, step);
    if (cfg.hellaswag_every > 0 && step % cfg.hellaswag_every == 0) score_hellaswag(r, step);
    if (r.sampling && step > 0 && step % cfg.sample_every == 0) sample(r, step);
}

// ============================================================================ the training step
// The next micro-batch into next_inputs/next_targets (masked: next_mask, next_dloss), from --train or
// --random-data.
static void fetch_batch(GpuRun& r) {
    const int N = r.cfg.B * r.cfg.T, V = r.config.vocab_size;
    if (r.train) {
        r.train->save_state(r.next_position);
        r.train->next_batch();
        memcpy(r.next_inputs.data(), r.train->inputs(), sizeof(int) * N);
        memcpy(r.next_targets.data(), r.train->targets(), sizeof(int) * N);
        if (!r.masked) return;
        memcpy(r.next_mask.data(), r.train->mask(), sizeof(int) * N);
        loss_mask_dloss(r.next_dloss.data(), r.next_mask.data(), N, r.cfg.grad_accum, r.comm->world);
    } else {
        r.next_position[0] = (int64_t)r.data_rng.state;
        for (int i = 0; i < N; i++) {
            r.next_inputs[i] = (int)r.data_rng.below(V);
            r.next_targets[i] = (int)r.data_rng.below(V);
        }
    }
}

// The buffers of the step loop, and its first batch; --graph 1 only on one GPU.
static void prepare_steps(GpuRun& r) {
    const int N = r.cfg.B * r.cfg.T;
    r.use_graph = r.gpu.graph && !r.dp.nccl_on;
    if (r.gpu.graph && r.dp.nccl_on) printf("graph: off (the data-parallel step stays eager)\n");
    r.next_inputs.resize(N);
    r.next_targets.resize(N);
    if (r.masked) {
        r.next_mask.resize(N);
        r.next_dloss.resize(N);
        for (std::vector<int>& m : r.step_masks) m.resize((size_t)N * r.cfg.grad_accum);
    }
    cudaCheck(cudaMallocHost(&r.step_losses, sizeof(float) * N * r.cfg.grad_accum));
    fetch_batch(r);
    // --matmul-autotune 1: the first step (eager, before any capture) tunes each distinct matmul; every
    // later call of the same shape, in the graph too, runs the kept algorithm (llmc/matmul.cuh)
    if (r.gpu.matmul_autotune) {
        r.algos.tune = true;
        r.ctx.matmul_algos = &r.algos;
    }
}

// masked: next_mask as micro-batch `micro` of step_masks[which]; returns next_dloss (nullptr unmasked).
static const float* keep_mask(GpuRun& r, int which, int micro) {
    if (!r.masked) return nullptr;
    std::copy(r.next_mask.begin(), r.next_mask.end(), r.step_masks[which].begin() + (size_t)micro * r.next_mask.size());
    return r.next_dloss.data();
}

static void stage_next_step(GpuRun& r) {
    memcpy(r.slot_position[r.slot], r.next_position, sizeof(r.next_position));
    for (int micro = 0; micro < r.cfg.grad_accum; micro++) {
        const float* dloss_rows = keep_mask(r, r.slot, micro);
        model_graph_stage(r.graph, r.model, r.slot, micro, r.next_inputs.data(), r.next_targets.data(), dloss_rows);
        fetch_batch(r);
    }
    r.staged = true;
}

// One step as one graph launch; the next step's batches are staged while the GPU runs it.
static float graph_step(GpuRun& r, int64_t step, const OptimizerSettings& opt) {
    model_graph_launch(r.graph, r.model, r.slot, opt, r.ctx);
    r.slot ^= 1;
    r.staged = false;
    if (step + 1 < r.total_steps) stage_next_step(r);
    cudaCheck(cudaStreamSynchronize(r.ctx.stream));
    return model_update_norm(r.model);
}

// One step launched op by op: the micro-batches' forward and backward (the data-parallel buckets
// reducing during the backward), then the update. With --graph 1 the first one is then captured.
static float eager_step(GpuRun& r, int64_t step, const OptimizerSettings& opt) {
    const int B = r.cfg.B, T = r.cfg.T, N = B * T, accum = r.cfg.grad_accum;
    gpu_dp_zero_grads(r.dp, r.model, r.ctx);
    for (int micro = 0; micro < accum; micro++) {
        const float* dloss_rows = keep_mask(r, r.slot ^ 1, micro);
        model_upload_batch(r.model, r.next_inputs.data(), r.next_targets.data(), B, T, true, r.ctx, dloss_rows);
        model_forward(r.model, B, T, r.ctx);
        model_classifier(r.model, B, T, r.dloss, true, r.step_losses + (size_t)micro * N, r.ctx);
        gpu_dp_before_backward(r.dp, micro == 0, micro + 1 == accum);
        model_backward(r.model, B, T, r.ctx);
        fetch_batch(r);
    }
    gpu_dp_wait_grads(r.dp, r.ctx);
    const float norm = gpu_dp_update(r.dp, r.model, opt, r.ctx);  // returns with the compute stream idle
    r.algos.tune = false;  // tuned in this first step
    if (r.use_graph && step + 1 < r.total_steps) {  // every kernel has run once: capture the step
        if (!r.graph.exec[0]) {
            model_graph_build(r.graph, r.model, accum, r.dloss, r.cfg.grad_clip, r.step_losses, r.ctx);
            printf("graph: the step captured as one CUDA graph of %zu nodes; steps %lld.. launch it\n",
                   r.graph.nodes, (long long)(step + 2));
        }
        stage_next_step(r);
    }
    return norm;
}

// ============================================================================ logging
// The step's mean loss over its positions and the ranks (the losses are read once a step); masked:
// the mean of its micro-batches' masked means (train_gpt2_cpu.cpp's).
static double step_loss(GpuRun& r) {
    const int N = r.cfg.B * r.cfg.T, accum = r.cfg.grad_accum;
    double loss = r.masked ? 0.0 : mean_of(r.step_losses, (int64_t)N * accum);
    for (int micro = 0; r.masked && micro < accum; micro++) {
        const size_t at = (size_t)micro * N;
        loss += masked_mean(r.step_losses + at, r.step_masks[r.slot ^ 1].data() + at, N) / accum;
    }
    return r.comm->allreduce_sum(loss) / r.comm->world;
}

// The step's line on stdout and in --log.
static void log_step(GpuRun& r, int64_t step, float lr, double loss, float norm, double ms) {
    const TrainConfig& cfg = r.cfg;
    r.step_ms.push_back(ms);
    r.total_ms += ms;
    const double tokens = (double)cfg.total_batch, flops = flops_per_token(r.config, cfg.T) * tokens;
    const double tok_s = tokens / (ms / 1000.0);
    const double mfu = r.peak > 0 ? 100.0 * flops / (ms / 1000.0) / (r.peak * 1e12) : 0.0;
    const std::string eta = format_duration((r.total_ms / r.step_ms.size()) * (r.total_steps - step - 1) / 1000.0);
    printf("step %5lld/%d | loss %.6f | norm %.4f | lr %.3e | %.2f ms | %.0f tok/s | MFU %.1f%% | ETA %s\n",
           (long long)(step + 1), r.total_steps, loss, norm, lr, ms, tok_s, mfu, eta.c_str());
    r.files.log.line("step %lld train_loss %.6f lr %.6e grad_norm %.6f ms %.3f tok_s %.1f\n", (long long)(step + 1),
                     loss, lr, norm, ms, tok_s);
}

// The BENCH line: the median step after warm-up (the first steps pay cuBLAS heuristics and allocator
// first touches) and the memory the run allocated.
static void print_bench(const GpuRun& r) {
    if (r.step_ms.empty()) return;
    const size_t warm = std::min<size_t>(r.step_ms.size() / 2, 3);
    std::vector<double> timed(r.step_ms.begin() + warm, r.step_ms.end());
    std::sort(timed.begin(), timed.end());
    const double median = timed[timed.size() / 2];
    const size_t allocated = r.model.allocated_bytes + r.dp.allocated_bytes + r.sampler.allocated_bytes;
    const std::string name = std::string("ours") + (r.cfg.fp8 ? "_fp8" : "");
    printf("BENCH name=%s ms=%.2f tok_s=%.0f peak_gib=%.2f\n", name.c_str(), median,
           (double)r.cfg.total_batch / (median / 1000.0), allocated / 1073741824.0);
}

// ============================================================================ checkpoints
static void save_checkpoint(GpuRun& r) {
    gpu_dp_save_checkpoint(r.dp, r.model, r.files.out_dir, r.staged ? r.slot_position[r.slot] : r.next_position,
                           r.sample_rng.state);
}

static void free_run(GpuRun& r) {
    r.files.log.close();
    model_graph_free(r.graph);
    cudaCheck(cudaFreeHost(r.step_losses));
    r.train.reset();
    r.val.reset();
    r.hellaswag.reset();
    r.tokenizer.reset();
    if (r.sampling) model_infer_free(r.sampler);
    gpu_dp_finish(r.dp);
    model_free(r.model);
    r.ctx.destroy();
    r.comm->finish();
}

int main(int argc, char** argv) {
    GpuRun r;
    TrainConfig& cfg = r.cfg;
    parse_flags(argc, argv, cfg, r.gpu);
    r.comm = dist_init(cfg.dist, &argc, &argv);  // data parallel: llmc/dist.h, llmc/model_dist.cuh
    set_world_size(cfg, r.comm->world);
    r.files = dist_open_run_files(run_file_settings(cfg), *r.comm);  // --resume, --out-dir, --log (llmc/run_files.h)
    plan_loss_mask(r);
    read_model_config(r);
    build_model(r);
    open_data(r);
    if (!r.files.resume_from.empty()) resume(r);
    plan_steps(r);
    build_sampler(r);
    prepare_steps(r);
    for (int64_t step = r.model.step; step < r.total_steps; step++) {
        evaluate(r, step);
        const auto t0 = std::chrono::steady_clock::now();
        const OptimizerSettings opt = optimizer_settings_at(cfg, step);
        const float norm = r.staged ? graph_step(r, step, opt) : eager_step(r, step, opt);
        const double loss = step_loss(r);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        log_step(r, step, opt.lr, loss, norm, ms);
        check_step_finite(step + 1, loss, norm, r.files.out_dir);
        const bool last = step + 1 == r.total_steps;
        if (!r.files.out_dir.empty() && (last || (cfg.ckpt_every > 0 && (step + 1) % cfg.ckpt_every == 0)))
            save_checkpoint(r);
    }
    if (cfg.val_every > 0) validate(r, r.total_steps);
    score_hellaswag(r, r.total_steps);
    if (r.sampling) sample(r, r.total_steps);
    print_bench(r);
    free_run(r);
    return 0;
}
