// train_gpt2_cpu.cpp: the CPU reference trainer, the program around the fp32 model of
// llmc/cpu/model.h: flags, data, the training loop, logging, checkpoints. Semantics are PyTorch's
// (docs/design.md): mean cross-entropy (over the targets the shards' loss mask keeps, each
// micro-batch's own mean, as PyTorch's ignore_index = -100; docs/training.md), gradient accumulation
// over total_batch / (B*T) micro-batches, global-norm clipping, AdamW with decay on matrices and embeddings only (or
// --optimizer muon: torch.optim.Muon on the blocks' matrices, AdamW on the rest), warmup + cosine /
// linear / constant / wsd learning rate. Its sections follow train_gpt2.cu.
//
//   make build/train_gpt2_cpu
//   OMP_NUM_THREADS=2 build/train_gpt2_cpu --train "data/tinyshakespeare/*_train.bin"
//       --val "data/tinyshakespeare/*_val.bin" --tokenizer data/gpt2_tokenizer.bin --init d4 --steps 200
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>
#include "llmc/cpu/data_parallel.h"
#include "llmc/cpu/model.h"
#include "llmc/cpu/model_infer.h"
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
#include "llmc/utils.h"

// ------------------------------------------------------------------------------------------------
// the run: everything it holds, set up by the functions below in main's order
struct CpuRun {
    TrainConfig cfg;
    std::unique_ptr<Comm> comm;
    RunFiles files;  // the checkpoint to resume, the model to load, --out-dir, --log
    Model model;
    DataParallel dp;
    std::unique_ptr<DataLoader> train, val;
    std::unique_ptr<HellaSwagEval> hellaswag;
    std::unique_ptr<Tokenizer> tok;
    int eot = 0;
    DocMasking docs;  // --doc-mask: the training and validation rows' documents
    Rng rng;  // the samples' draws (saved in state.bin)
    ModelInfer sampler;  // one sequence over the positions a sample uses, reading the training parameters in place
    int64_t start_step = 0;
    double train_seconds = 0.0;  // time in training steps, for the elapsed and ETA of the step lines
};

// ------------------------------------------------------------------------------------------------
// the model: a model file (any existing file, or a name ending in .bin: a missing one is an error
// naming it) or a fresh init from a descriptor (dN, gpt2*, llama:...); --kv-heads, --window and
// --max-seq shape a fresh model and must repeat a file's values
static void build_model(CpuRun& r) {
    const TrainConfig& cfg = r.cfg;
    const std::string& init = r.files.init;
    const bool from_file =
        file_exists(init.c_str()) || (init.size() > 4 && init.compare(init.size() - 4, 4, ".bin") == 0);
    ModelConfig config = from_file ? model_read_info(init.c_str()).config : model_config_from_descriptor(init.c_str());
    apply_shape_flags(config, cfg, !from_file, init.c_str());
    check_sample_length(cfg, config);
    model_print_config(config);
    model_build(r.model, config, cfg.B, cfg.T);
    std::vector<float> host(r.model.num_params);
    if (from_file) model_read_fp32(init.c_str(), host.data());
    else model_init_params(host.data(), config, cfg.seed);
    model_set_params(r.model, host.data());
}

// the ranks' shares of the optimizer state (and at ZeRO 2 of the gradients), llmc/cpu/data_parallel.h
static void plan_data_parallel(CpuRun& r) {
    const int zero = r.cfg.dist.zero;
    dp_setup(r.dp, r.model, *r.comm, zero, optimizer_kind(r.cfg));
    if (r.comm->world > 1 || zero > 0)
        printf("data parallel: %d ranks (%s), zero %d: each rank keeps the optimizer state of %lld of %zu parameters\n",
               r.comm->world, r.comm->how.c_str(), zero, (long long)r.dp.plan.opt_count(), r.model.num_params);
    if (!r.dp.muon.empty())
        printf("muon: %zu matrices, each updated whole by one of the %d ranks; rank 0's hold %zu parameters\n",
               r.dp.muon.size(), r.comm->world, r.dp.muon_momentum.size());
    if (zero == 2)
        printf("gradients: %zu floats (shard) + %zu (bucket buffers: outside the layers %zu, one layer bucket %zu); "
               "whole: %zu\n", r.model.grads_memory.size(), r.dp.outside.size() + r.dp.layer.size(),
               r.dp.outside.size(), r.dp.layer.size(), r.model.num_params);
}

// ------------------------------------------------------------------------------------------------
// --doc-mask 1: the document token (doc_mask_token) and the position mode
static void plan_doc_masking(CpuRun& r) {
    r.docs.token = doc_mask_token(r.cfg, r.model.config, r.tok ? r.tok->eot_token() : -1);
    r.docs.restart_positions = r.cfg.doc_mask && r.cfg.doc_positions == "restart";
}

// ------------------------------------------------------------------------------------------------
// data: each rank its own windows (llmc/dataloader.h), from the model's tokenizer; rank 0 alone
// scores --hellaswag and samples
static void open_data(CpuRun& r) {
    const TrainConfig& cfg = r.cfg;
    const int V = r.model.config.vocab_size, rank = r.comm->rank, world = r.comm->world;
    r.train.reset(new DataLoader(cfg.train_pattern.c_str(), cfg.B, cfg.T, rank, world, V, cfg.seed, true));
    check_data_vocab(*r.train, cfg.data_vocab, V);
    if (!cfg.val_pattern.empty()) {
        r.val.reset(new DataLoader(cfg.val_pattern.c_str(), cfg.B, cfg.T, rank, world, V, cfg.seed, false));
        check_data_vocab(*r.val, cfg.data_vocab, V);
    }
    if (!cfg.hellaswag_path.empty() && r.comm->primary())
        r.hellaswag.reset(new HellaSwagEval(cfg.hellaswag_path.c_str(), cfg.B, cfg.T, V, cfg.data_vocab));
    r.tok.reset(open_model_tokenizer(cfg.tokenizer_path, V));
    r.eot = sampling_eot(r.tok.get(), V);
    plan_doc_masking(r);
}

// The steps to train (--steps, or one epoch) and the schedule over them; then --resume's state.
static void plan_steps(CpuRun& r) {
    TrainConfig& cfg = r.cfg;
    if (cfg.steps < 0) {
        cfg.steps = (int)(r.train->num_windows() / cfg.grad_accum);
        if (cfg.steps == 0)
            fail("--train %s: %lld batches, fewer than one optimizer step of --total-batch %lld tokens",
                 cfg.train_pattern.c_str(), (long long)r.train->num_windows(), (long long)cfg.total_batch);
    }
    cfg.schedule.total_steps = cfg.steps;
    r.rng = Rng(cfg.seed);
    const std::string& resume_from = r.files.resume_from;
    if (!resume_from.empty()) {
        TrainState s = dp_load_checkpoint(r.model, r.dp, resume_from);
        r.rng.state = s.rng_state;
        r.train->load_state(s.loader);
        printf("resumed from %s at step %lld\n", resume_from.c_str(), (long long)s.step);
    }
    r.start_step = r.model.step;
    check_steps_left(r.start_step, cfg.steps, resume_from);
    printf("batch %d x %d, %d micro-batches per step (%lld tokens), %d steps\n", cfg.B, cfg.T, cfg.grad_accum,
           (long long)cfg.total_batch, cfg.steps);
}

// --optimizer muon: which parameters each optimizer updates (AdamW alone says nothing)
static void print_optimizer(const CpuRun& r) {
    const TrainConfig& cfg = r.cfg;
    if (optimizer_kind(cfg) != OPTIMIZER_MUON) return;
    size_t sizes[NUM_PARAM_TENSORS], muon = 0;
    model_param_sizes(r.model.config, sizes);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        if (model_param_muon(i)) muon += sizes[i];
    printf("optimizer: muon (lr %g, momentum %g, wd %g, %d Newton-Schulz steps, adjust_lr %s) on qkvw, attprojw, "
           "fcw, fcprojw (%zu parameters); adamw (lr %g, wd %g) on the rest (%zu)\n", cfg.muon_lr, cfg.muon_momentum,
           cfg.muon_wd, cfg.muon_ns_steps, cfg.muon_adjust_lr.c_str(), muon, cfg.schedule.lr, cfg.weight_decay,
           r.model.num_params - muon);
}

// ------------------------------------------------------------------------------------------------
// evaluation. "step n" in the output and the log always counts completed optimizer steps: the
// validation loss at step n is measured on the model that step n's train_loss line produced.

// The loss mask of the loader's batch for the model's loss: nullptr (all) for shards without one.
static const int* loss_mask(const DataLoader& d) { return d.has_mask() ? d.mask() : nullptr; }

// The mean loss of the first `steps` validation batches (each batch's masked mean): over the ranks, batch j is rank j % world's
// (the loaders deal the windows out that way), so any world size sees the same batches.
static float validation_loss(Model& m, DataLoader& val, int steps, int B, int T, const DocMasking& docs, Comm& comm) {
    val.reset();
    if (steps > val.num_windows() * comm.world) steps = (int)(val.num_windows() * comm.world);
    double sum = 0.0;
    for (int j = comm.rank; j < steps; j += comm.world) {
        val.next_batch();
        model_forward(m, val.inputs(), B, T, docs);
        sum += model_loss(m, val.targets(), loss_mask(val));
    }
    return (float)(comm.allreduce_sum(sum) / steps);
}

static void validate(CpuRun& r, int64_t step) {
    const float vl = validation_loss(r.model, *r.val, r.cfg.val_steps, r.cfg.B, r.cfg.T, r.docs, *r.comm);
    printf("step %lld val_loss %.6f\n", (long long)step, vl);
    r.files.log.line("step %lld val_loss %.6f\n", (long long)step, vl);
}

static void score_hellaswag(CpuRun& r, int64_t step) {
    const HellaSwagScore s = r.hellaswag->run([&](const int* inputs, const int* targets, int rows, int seq) {
        model_forward(r.model, inputs, rows, seq);
        model_loss(r.model, targets);  // leaves the per-position losses in model.acts.losses
        return r.model.acts.losses.data();
    });
    const std::string line = hellaswag_log_line(step, s);
    printf("%s\n", line.c_str());
    r.files.log.line("%s\n", line.c_str());
}

static bool sampling(const CpuRun& r) { return r.comm->primary() && r.cfg.sample_every > 0; }

static void build_sampler(CpuRun& r) {
    if (sampling(r)) model_infer_build(r.sampler, r.model.config, r.model.params_memory.data(), 1, r.cfg.gen_tokens);
}

static void sample(CpuRun& r) {
    std::vector<int> toks = model_infer_sample(r.sampler, r.eot, r.cfg.gen_tokens, r.cfg.temperature, r.rng);
    printf("sample: ");
    print_sample(r.tok.get(), toks);
}

// Before step `step`: validation, HellaSwag and a sample, each at its interval.
static void evaluate(CpuRun& r, int64_t step) {
    const TrainConfig& cfg = r.cfg;
    if (r.val && cfg.val_every > 0 && step % cfg.val_every == 0) validate(r, step);
    if (r.hellaswag && cfg.hellaswag_every > 0 && step % cfg.hellaswag_every == 0) score_hellaswag(r, step);
    if (sampling(r) && step > 0 && step % cfg.sample_every == 0) sample(r);
}

// ------------------------------------------------------------------------------------------------
// the training step: grad_accum micro-batches of every rank, the gradients reduced, the update.
// Returns the step's mean loss; *norm gets the gradient norm.
static double train_step(CpuRun& r, const OptimizerSettings& opt, float* norm) {
    const TrainConfig& cfg = r.cfg;
    const double parts = (double)cfg.grad_accum * r.comm->world;
    dp_zero_grads(r.model, r.dp);
    double loss = 0.0;
    for (int micro = 0; micro < cfg.grad_accum; micro++) {
        r.train->next_batch();
        model_forward(r.model, r.train->inputs(), cfg.B, cfg.T, r.docs);
        loss += model_loss(r.model, r.train->targets(), loss_mask(*r.train));
        dp_before_backward(r.dp, micro == 0);
        model_backward(r.model, r.train->inputs(), r.train->targets(), 1.0f / ((float)cfg.grad_accum * r.comm->world),
                       loss_mask(*r.train));
    }
    loss = r.comm->allreduce_sum(loss) / parts;
    dp_reduce_grads(r.model, r.dp);
    *norm = dp_update(r.model, r.dp, opt);
    return loss;
}

// ------------------------------------------------------------------------------------------------
// logging: the step's line on stdout and in --log
static void log_step(CpuRun& r, int64_t step, float lr, double loss, float norm, double ms) {
    const TrainConfig& cfg = r.cfg;
    const double tok_s = cfg.total_batch / (ms / 1e3);
    r.train_seconds += ms / 1e3;
    const double eta = r.train_seconds / (step + 1 - r.start_step) * (cfg.steps - step - 1);
    printf("step %lld/%d train_loss %.6f norm %.4f lr %.3e ms %.1f tok_s %.0f elapsed %s ETA %s\n",
           (long long)step + 1, cfg.steps, loss, norm, lr, ms, tok_s, format_duration(r.train_seconds).c_str(),
           format_duration(eta).c_str());
    r.files.log.line("step %lld train_loss %.6f lr %.6e ms %.3f tok_s %.1f\n", (long long)step + 1, loss, lr, ms,
                     tok_s);
}

// ------------------------------------------------------------------------------------------------
// checkpoints: the model, the optimizer state, the data position and the sampler's draws
static void save_checkpoint(CpuRun& r) {
    int64_t loader_state[16];
    r.train->save_state(loader_state);
    dp_save_checkpoint(r.model, r.dp, r.files.out_dir, loader_state, r.rng.state);
}

int main(int argc, char** argv) {
    CpuRun r;
    TrainConfig& cfg = r.cfg;
    parse_train_args(argc, argv, cfg, "train_gpt2_cpu",
                     "Trains GPT-2 or a Llama-style model in fp32 on the CPU (the reference for the GPU trainer). Example:\n"
                     "  build/train_gpt2_cpu --train \"data/tinyshakespeare/*_train.bin\" --val \"data/tinyshakespeare/*_val.bin\"\n"
                     "      --tokenizer data/gpt2_tokenizer.bin --init d4 --steps 200 --lr 2e-3 --warmup 20 --sample-every 100");
    r.comm = dist_init(cfg.dist, &argc, &argv);  // data parallel: llmc/dist.h, llmc/cpu/data_parallel.h
    set_world_size(cfg, r.comm->world);
    r.files = dist_open_run_files(run_file_settings(cfg), *r.comm);  // --resume, --out-dir, --log (llmc/run_files.h)
    build_model(r);
    plan_data_parallel(r);
    open_data(r);
    plan_steps(r);
    print_optimizer(r);
    build_sampler(r);
    for (int64_t step = r.start_step; step < cfg.steps; step++) {
        evaluate(r, step);
        const auto t0 = std::chrono::steady_clock::now();
        const OptimizerSettings opt = optimizer_settings_at(cfg, step);
        float norm = 0.0f;
        const double loss = train_step(r, opt, &norm);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        log_step(r, step, opt.lr, loss, norm, ms);
        check_step_finite(step + 1, loss, norm, r.files.out_dir);
        const bool last = step + 1 == cfg.steps;
        if (!r.files.out_dir.empty() && ((cfg.ckpt_every > 0 && (step + 1) % cfg.ckpt_every == 0) || last))
            save_checkpoint(r);
    }
    if (r.val && cfg.val_every > 0 && r.start_step < cfg.steps) validate(r, cfg.steps);
    if (r.hellaswag && r.start_step < cfg.steps) score_hellaswag(r, cfg.steps);
    if (sampling(r) && r.start_step < cfg.steps) sample(r);
    r.files.log.close();
    r.comm->finish();
    return 0;
}
