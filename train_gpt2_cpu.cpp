// train_gpt2_cpu.cpp: the CPU reference trainer, the program around the fp32 model of
// llmc/cpu/model.h: flags, data, the training loop, logging, checkpoints. Semantics are PyTorch's
// (docs/design.md): mean cross-entropy, gradient accumulation over total_batch / (B*T)
// micro-batches, global-norm clipping, AdamW with decay on matrices and embeddings only,
// warmup + cosine / linear / constant / wsd learning rate. Its sections follow train_gpt2.cu.
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
#include "llmc/sampler.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"
#include "llmc/train_config.h"
#include "llmc/utils.h"

// ------------------------------------------------------------------------------------------------
// training loop
double seconds_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The mean loss of the first `steps` validation batches: over the ranks, batch j is rank j % world's
// (the loaders deal the windows out that way), so any world size sees the same batches.
float validation_loss(Model& m, DataLoader& val, int steps, int B, int T, Comm& comm) {
    val.reset();
    if (steps > val.num_windows() * comm.world) steps = (int)(val.num_windows() * comm.world);
    double sum = 0.0;
    for (int j = comm.rank; j < steps; j += comm.world) {
        val.next_batch();
        model_forward(m, val.inputs(), B, T);
        sum += model_loss(m, val.targets());
    }
    return (float)(comm.allreduce_sum(sum) / steps);
}

int main(int argc, char** argv) {
    TrainConfig cfg;
    parse_train_args(argc, argv, cfg, "train_gpt2_cpu",
                     "Trains GPT-2 or a Llama-style model in fp32 on the CPU (the reference for the GPU trainer). Example:\n"
                     "  build/train_gpt2_cpu --train \"data/tinyshakespeare/*_train.bin\" --val \"data/tinyshakespeare/*_val.bin\"\n"
                     "      --tokenizer data/gpt2_tokenizer.bin --init d4 --steps 200 --lr 2e-3 --warmup 20 --sample-every 100");
    // the ranks of a data-parallel run (llmc/dist.h): one process without --dist-init or a launcher
    std::unique_ptr<Comm> comm = dist_init(cfg, &argc, &argv);
    set_world_size(cfg, comm->world);
    // --resume, --out-dir and --log checked and prepared before any work (llmc/checkpoint.h), by
    // rank 0 alone; the others take the checkpoint it found
    RunFiles files = dist_open_run_files(cfg, *comm);
    const std::string& resume_from = files.resume_from;
    RunLog& log = files.log;
    // the model: a model file (any existing file, or a name ending in .bin: a missing one is an
    // error naming it) or a fresh init from a descriptor (dN, gpt2*, llama:...); --kv-heads, --window
    // and --max-seq shape a fresh model and must repeat a file's values
    const std::string& init = cfg.init;
    const bool from_file =
        file_exists(init.c_str()) || (init.size() > 4 && init.compare(init.size() - 4, 4, ".bin") == 0);
    ModelConfig config = from_file ? model_read_info(init.c_str()).config : model_config_from_descriptor(init.c_str());
    apply_shape_flags(config, cfg, !from_file, init.c_str());
    check_sample_length(cfg, config);
    model_print_config(config);
    Model model;
    model_build(model, config, cfg.B, cfg.T);
    {
        std::vector<float> host(model.num_params);
        if (from_file) model_read_fp32(init.c_str(), host.data());
        else model_init_params(host.data(), config, cfg.seed);
        model_set_params(model, host.data());
    }
    const ModelConfig& c = model.config;
    DataParallel dp;
    dp_setup(dp, model, *comm, cfg.zero);
    if (comm->world > 1 || cfg.zero > 0)
        printf("data parallel: %d ranks (%s), zero %d: each rank keeps the optimizer state of %lld of %zu parameters\n",
               comm->world, comm->how.c_str(), cfg.zero, (long long)dp.plan.opt_count(), model.num_params);
    if (cfg.zero == 2)
        printf("gradients: %zu floats (shard) + %zu (bucket buffers: outside the layers %zu, one layer bucket %zu); "
               "whole: %zu\n", model.grads_memory.size(), dp.outside.size() + dp.layer.size(), dp.outside.size(),
               dp.layer.size(), model.num_params);

    // each rank its own windows of the data (llmc/dataloader.h), from the model's tokenizer
    DataLoader train(cfg.train_pattern.c_str(), cfg.B, cfg.T, comm->rank, comm->world, c.vocab_size, cfg.seed, true);
    check_data_vocab(train, cfg.data_vocab, c.vocab_size);
    std::unique_ptr<DataLoader> val;
    if (!cfg.val_pattern.empty()) {
        val.reset(new DataLoader(cfg.val_pattern.c_str(), cfg.B, cfg.T, comm->rank, comm->world, c.vocab_size, cfg.seed,
                                 false));
        check_data_vocab(*val, cfg.data_vocab, c.vocab_size);
    }
    std::unique_ptr<HellaSwagEval> hellaswag;  // rank 0 alone scores and samples
    if (!cfg.hellaswag_path.empty() && comm->primary())
        hellaswag.reset(new HellaSwagEval(cfg.hellaswag_path.c_str(), cfg.B, cfg.T, c.vocab_size, cfg.data_vocab));
    std::unique_ptr<Tokenizer> tok(open_model_tokenizer(cfg.tokenizer_path, c.vocab_size));
    const int eot = sampling_eot(tok.get(), c.vocab_size);
    if (cfg.steps < 0) {
        cfg.steps = (int)(train.num_windows() / cfg.grad_accum);
        if (cfg.steps == 0)
            fail("--train %s: %lld batches, fewer than one optimizer step of --total-batch %lld tokens",
                 cfg.train_pattern.c_str(), (long long)train.num_windows(), (long long)cfg.total_batch);
    }
    cfg.schedule.total_steps = cfg.steps;

    Rng rng(cfg.seed);
    if (!resume_from.empty()) {
        TrainState s = dp_load_checkpoint(model, dp, resume_from);
        rng.state = s.rng_state;
        train.load_state(s.loader);
        printf("resumed from %s at step %lld\n", resume_from.c_str(), (long long)s.step);
    }
    const int64_t start_step = model.step;
    check_steps_left(start_step, cfg.steps, resume_from);
    printf("batch %d x %d, %d micro-batches per step (%lld tokens), %d steps\n", cfg.B, cfg.T, cfg.grad_accum,
           (long long)cfg.total_batch, cfg.steps);

    // "step n" in the output and the log always counts completed optimizer steps: the validation
    // loss at step n is measured on the model that step n's train_loss line produced.
    const OptimizerSettings opt_base{0.0f, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.grad_clip};
    auto validate = [&](int64_t step) {
        float vl = validation_loss(model, *val, cfg.val_steps, cfg.B, cfg.T, *comm);
        printf("step %lld val_loss %.6f\n", (long long)step, vl);
        log.line("step %lld val_loss %.6f\n", (long long)step, vl);
    };
    auto score_hellaswag = [&](int64_t step) {
        const HellaSwagScore s = hellaswag->run([&](const int* inputs, const int* targets, int rows, int seq) {
            model_forward(model, inputs, rows, seq);
            model_loss(model, targets);  // leaves the per-position losses in model.acts.losses
            return model.acts.losses.data();
        });
        const std::string line = hellaswag_log_line(step, s);
        printf("%s\n", line.c_str());
        log.line("%s\n", line.c_str());
    };
    // one sequence over the positions a sample uses, reading the training parameters in place
    ModelInfer sampler;
    if (comm->primary() && cfg.sample_every > 0)
        model_infer_build(sampler, c, model.params_memory.data(), 1, cfg.gen_tokens);
    auto sample = [&]() {
        std::vector<int> toks = model_infer_sample(sampler, eot, cfg.gen_tokens, cfg.temperature, rng);
        printf("sample: ");
        print_sample(tok.get(), toks);
    };
    double train_seconds = 0.0;  // time in training steps, for the elapsed and ETA of the step lines
    for (int64_t step = start_step; step < cfg.steps; step++) {
        const bool last = step + 1 == cfg.steps;
        if (val && cfg.val_every > 0 && step % cfg.val_every == 0) validate(step);
        if (hellaswag && cfg.hellaswag_every > 0 && step % cfg.hellaswag_every == 0) score_hellaswag(step);
        if (comm->primary() && cfg.sample_every > 0 && step > 0 && step % cfg.sample_every == 0) sample();

        const double t0 = seconds_now();
        dp_zero_grads(model, dp);
        double loss = 0.0;
        for (int micro = 0; micro < cfg.grad_accum; micro++) {
            train.next_batch();
            model_forward(model, train.inputs(), cfg.B, cfg.T);
            loss += model_loss(model, train.targets());
            dp_before_backward(dp, micro == 0);
            model_backward(model, train.inputs(), train.targets(), 1.0f / ((float)cfg.grad_accum * comm->world));
        }
        loss = comm->allreduce_sum(loss) / ((double)cfg.grad_accum * comm->world);
        dp_reduce_grads(model, dp);
        OptimizerSettings opt = opt_base;
        opt.lr = lr_at_step(cfg.schedule, (int)step);
        const float norm = dp_update(model, dp, opt);
        const double ms = (seconds_now() - t0) * 1e3;
        const double tok_s = cfg.total_batch / (ms / 1e3);
        train_seconds += ms / 1e3;
        const double eta = train_seconds / (step + 1 - start_step) * (cfg.steps - step - 1);
        printf("step %lld/%d train_loss %.6f norm %.4f lr %.3e ms %.1f tok_s %.0f elapsed %s ETA %s\n",
               (long long)step + 1, cfg.steps, loss, norm, opt.lr, ms, tok_s, format_duration(train_seconds).c_str(),
               format_duration(eta).c_str());
        log.line("step %lld train_loss %.6f lr %.6e ms %.3f tok_s %.1f\n", (long long)step + 1, loss, opt.lr, ms, tok_s);
        check_step_finite(step + 1, loss, norm, cfg.out_dir);
        if (!cfg.out_dir.empty() && ((cfg.ckpt_every > 0 && (step + 1) % cfg.ckpt_every == 0) || last)) {
            int64_t loader_state[16];
            train.save_state(loader_state);
            dp_save_checkpoint(model, dp, cfg.out_dir, loader_state, rng.state);
        }
    }
    if (val && cfg.val_every > 0 && start_step < cfg.steps) validate(cfg.steps);
    if (hellaswag && start_step < cfg.steps) score_hellaswag(cfg.steps);
    if (comm->primary() && cfg.sample_every > 0 && start_step < cfg.steps) sample();
    log.close();
    comm->finish();
    return 0;
}
